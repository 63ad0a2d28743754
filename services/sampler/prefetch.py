"""Prefetch: run ``fn`` (e.g. negative sampling) on the next batches while the caller trains.

    for batch in prefetch(pos_batches, neg_sampling_fn, depth=2):
        train_step(batch)          # sampling of the next batches runs meanwhile

This plays the part of RecIS's ``prefetch_transform=True`` dataset option. ``fn`` runs in
one background thread (the sampler client releases the GIL while it waits on the socket, and
the server does the work), results come out in order, and an exception raised by ``fn`` or
by the source is re-raised at the point of the batch that caused it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

_DONE = object()


class Prefetcher(Iterator[T], Generic[S, T]):
    """Iterates ``fn(item)`` for ``item`` in ``source``, computing up to ``depth`` ahead.

    Args:
        source: the input batches.
        fn: the transform, called in a background thread.
        depth: how many results may wait ahead of the consumer (>= 1).
    """

    def __init__(self, source: Iterable[S], fn: Callable[[S], T], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._queue: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=self._run, args=(iter(source), fn), name="streamrec-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: tuple[object, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[S], fn: Callable[[S], T]) -> None:
        try:
            for item in source:
                if self._stop.is_set() or not self._put((fn(item), None)):
                    return
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._put((None, exc))
            return
        self._put((_DONE, None))

    def __iter__(self) -> Prefetcher[S, T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        value, exc = self._queue.get()
        if exc is not None:
            self._finished = True
            raise exc
        if value is _DONE:
            self._finished = True
            raise StopIteration
        return value  # type: ignore[return-value]

    def close(self) -> None:
        """Stops the background thread (it finishes the call in progress)."""
        self._stop.set()
        self._finished = True
        self._thread.join(timeout=30)

    def __enter__(self) -> Prefetcher[S, T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch(source: Iterable[S], fn: Callable[[S], T], depth: int = 2) -> Prefetcher[S, T]:
    """Shorthand for :class:`Prefetcher`."""
    return Prefetcher(source, fn, depth)
