"""Disk errors of saves and loads as the error codes a client can act on, and the back-off
of saves after a full disk.

A path comes from a peer, so most ``OSError`` s of a save or load are the caller's mistake
or the disk's state, not a bug of the shard: a name too long or a file where a directory
is needed is ``bad_request`` / ``exists``; a full disk (or quota) is ``no_space`` with the
path and the bytes left. numpy reports a short write as ``OSError: N requested and M
written`` without an errno, so a failed write is also checked against the free space.

After ``no_space`` a shard refuses a save to the same filesystem at once for a back-off that
doubles with each failure (``BACKOFF_FIRST_S`` to ``BACKOFF_MAX_S``), unless space was freed
meanwhile: a trainer retrying in a loop does not rewrite gigabytes into a full disk
(:func:`with_disk_errors`, one :class:`NoSpaceBackoff` per shard).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from streamrec.dirs import free_bytes
from streamrec.embedding_store.errors import NoSpace, PathExists
from streamrec.errors import BadRequest, StreamRecError, quote
from streamrec.wire import Arrays, Handler, Meta

#: errnos that mean the disk (or the user's quota) is full
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: errnos that mean the path itself cannot be used as named (the caller's choice)
BAD_PATH = {errno.ENAMETOOLONG, errno.EISDIR, errno.ELOOP, errno.EINVAL}
#: errnos that mean something else already holds a name the path needs as a directory
TAKEN = {errno.EEXIST, errno.ENOTDIR}
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0


def _device(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            return os.stat(p).st_dev
        except OSError:
            continue
    return None


def _short_write(exc: OSError) -> bool:
    return exc.errno is None and "requested and" in str(exc) and "written" in str(exc)


def disk_error(exc: OSError, path: Path, action: str = "save") -> StreamRecError | OSError:
    """The error to raise for ``exc`` met while ``action`` touched ``path``: a
    :class:`StreamRecError` with a code, or ``exc`` itself when it is none of these."""
    where = quote(str(exc.filename if exc.filename else path))
    if exc.errno in NO_SPACE or _short_write(exc):
        free = free_bytes(path)
        left = "unknown" if free is None else f"{free} bytes"
        return NoSpace(
            f"{action} to {quote(str(path))}: no space left on its filesystem ({left} free; "
            f"{exc.strerror or exc}); nothing of this {action} was kept"
        )
    if exc.errno in TAKEN:
        return PathExists(
            f"{action} to {quote(str(path))}: a file where a directory is needed ({where}: "
            f"{exc.strerror})"
        )
    if exc.errno in BAD_PATH:
        return BadRequest(f"field 'path': {where}: {exc.strerror} ({action})")
    return exc


def with_disk_errors(op: str, handler: Handler, backoff: NoSpaceBackoff | None = None) -> Handler:
    """``handler`` with the ``OSError`` s it lets through mapped by :func:`disk_error`; a
    ``save`` also checked against, and recorded in, ``backoff``."""
    saves = backoff if op == "save" else None

    def handle(meta: Meta, arrays: Arrays) -> tuple[Meta, Arrays]:
        path = meta.get("path")
        where = Path(path) if saves is not None and isinstance(path, str) and path else None
        if saves is not None and where is not None:
            saves.check(where)
        try:
            reply = handler(meta, arrays)
        except OSError as exc:
            mapped = disk_error(exc, Path(os.fsdecode(exc.filename or ".")), op)
            if saves is not None and where is not None and isinstance(mapped, NoSpace):
                saves.failed(where)
            if mapped is exc:
                raise
            raise mapped from exc
        if saves is not None and where is not None:
            saves.succeeded(where)
        return reply

    return handle


@dataclass
class _Failure:
    until: float
    backoff_s: float
    free: int | None


class NoSpaceBackoff:
    """The filesystems a save found full, and until when saves to them are refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[int, _Failure] = {}

    def check(self, path: Path) -> None:
        """Raises :class:`NoSpace` if a save to ``path``'s filesystem failed for space
        within its back-off and no space was freed since."""
        dev = _device(path)
        with self._lock:
            failure = self._failed.get(dev) if dev is not None else None
        if failure is None:
            return
        wait = failure.until - time.monotonic()
        free = free_bytes(path)
        if wait <= 0 or (free is not None and failure.free is not None and free > failure.free):
            return
        raise NoSpace(
            f"save to {quote(str(path))} refused: the last save to this filesystem ran out of "
            f"space ({'unknown' if free is None else free} bytes free); retry in {wait:.1f}s "
            f"or after freeing space"
        )

    def failed(self, path: Path) -> None:
        """Records a save to ``path`` that ran out of space: the back-off doubles."""
        dev = _device(path)
        if dev is None:
            return
        with self._lock:
            last = self._failed.get(dev)
            backoff = BACKOFF_FIRST_S if last is None else min(2 * last.backoff_s, BACKOFF_MAX_S)
            self._failed[dev] = _Failure(time.monotonic() + backoff, backoff, free_bytes(path))

    def succeeded(self, path: Path) -> None:
        dev = _device(path)
        if dev is not None:
            with self._lock:
                self._failed.pop(dev, None)


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Fills ``view`` from ``fd`` at ``offset`` (``preadv`` until full: a read may return
    less); returns the bytes read, fewer than ``len(view)`` only where the file ends."""
    got = 0
    while got < len(view):
        r = os.preadv(fd, [view[got:]], offset + got)
        if r <= 0:
            break
        got += r
    return got
