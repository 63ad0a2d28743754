"""The reader-writer lock of a table: pulls of present keys share it, writers are alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
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

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
            self.epoch += 1
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
