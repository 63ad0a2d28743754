"""A console script's ``main`` run inside the test process.

For the many bad-argument cases of a CLI: a process each costs seconds of imports (torch) for
a check that starts nothing. Each CLI keeps at least one case through its installed process.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable, Sequence


def run_main(
    main: Callable[[list[str]], object], argv: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` as its console script runs it: the exit code (a return value or
    ``SystemExit``, a message code printed to stderr with 1 as the script does), stdout and
    stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = main(list(argv))
            code = result if isinstance(result, int) else 0
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=err)
                code = 1
            else:
                code = exc.code or 0
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())
