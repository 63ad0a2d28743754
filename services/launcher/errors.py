"""The launcher's errors."""

from __future__ import annotations

from streamrec.errors import StreamRecError


class StackError(StreamRecError):
    """The stack could not be brought up or lost a part it cannot restart."""

    code = "stack"
