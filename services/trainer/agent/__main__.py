"""``python -m streamrec.trainer.agent`` and ``streamrec-trainer-agent``: a trainer rank under
the control plane (the loop: :mod:`.loop`, the flags: :mod:`.cli`)::

    torchrun --nproc-per-node 2 -m streamrec.trainer.agent \\
        --redis-url redis://127.0.0.1:6379/0 --job-id 3f2a...

Only the entry lives here, above the command line, so that nothing imports it back.
"""

from __future__ import annotations

from streamrec.trainer.agent.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
