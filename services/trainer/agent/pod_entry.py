"""A trainer pod's entrypoint in Kubernetes: checks the pod's place in its group, then becomes
torchrun (``exec``: torchrun is the container's process, SIGTERM reaches it)::

    python3 -m streamrec.trainer.agent.pod_entry --nnodes $(WORLD_SIZE) ... \\
        -m streamrec.trainer.agent ...

A group of ``WORLD_SIZE`` pods is pods 0 .. WORLD_SIZE - 1 of the trainer StatefulSet
(``GROUP_POD_INDEX``: the pod's ordinal). A pod whose ordinal is not below ``WORLD_SIZE``
would wait in the rendezvous for a place that never comes, with nothing said: the trap of an
overlay that sets the StatefulSet's ``replicas:`` where ``components/counts`` does not copy
them into ``WORLD_SIZE``. Such a pod exits at once (code 2) saying so. Where every pod is a
group of its own (``components/single-rank-groups``), ``GROUP_POD_INDEX`` is 0.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence

#: The pod's place in its group (the StatefulSet ordinal; 0 where each pod is a group).
INDEX_ENV = "GROUP_POD_INDEX"
#: The group's pods (torchrun --nnodes), the StatefulSet's replicas by components/counts.
SIZE_ENV = "WORLD_SIZE"
#: The program this entrypoint becomes.
TORCHRUN = "torchrun"


def _count(env: Mapping[str, str], name: str, least: int) -> int:
    raw = env.get(name)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        value = None
    if value is None or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {raw!r}")
    return value


def ordinal_problem(env: Mapping[str, str]) -> str | None:
    """Why this pod cannot join its group (None: it can), from ``GROUP_POD_INDEX`` and
    ``WORLD_SIZE`` of ``env``."""
    try:
        index = _count(env, INDEX_ENV, 0)
        size = _count(env, SIZE_ENV, 1)
    except ValueError as exc:
        return str(exc)
    if index < size:
        return None
    pod = env.get("HOSTNAME", f"trainer-{index}")
    return (
        f"trainer pod {pod}: its ordinal {index} is not below WORLD_SIZE {size}, so it has no "
        f"place in the group of {size} and would wait in the rendezvous forever. The trainer "
        f"StatefulSet's replicas were changed where components/counts does not copy them into "
        f"WORLD_SIZE: list deploy/k8s/components/counts in the components of the kustomization "
        f'that sets `replicas:` (deploy/k8s/README.md, "Sizes")'
    )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Exits 2 with :func:`ordinal_problem`'s message, else execs torchrun with ``argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    problem = ordinal_problem(os.environ if env is None else env)
    if problem is not None:
        print(f"streamrec.trainer.agent.pod_entry: {problem}", file=sys.stderr, flush=True)
        return 2
    program = shutil.which(TORCHRUN) or TORCHRUN
    os.execvp(program, [TORCHRUN, *args])
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main())
