"""The reader-writer lock of a table: pulls of present keys share it, writers are alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class RWLock:
    """Readers share, a writer is alone; waiting writers go before new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        #: writers admitted so far; a reader that sees the same value under write() knows
        #: nothing was written in between (only its own write() counted)
        self.epoch = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
            self.epoch += 1

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()


@contextmanager
def all_locked(locks: Sequence[RWLock], write: bool) -> Iterator[None]:
    """Every one of ``locks`` (distinct, in the caller's fixed order, so that two holders of
    several cannot each wait for one the other holds), shared or exclusive. Plain calls, not
    one context manager a lock: a trainer's block takes 26 of them twice a step."""
    taken: list[RWLock] = []
    try:
        for lock in locks:
            lock.acquire_write() if write else lock.acquire_read()
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release_write() if write else lock.release_read()
