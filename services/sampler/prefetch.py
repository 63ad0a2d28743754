"""Prefetch: run ``fn`` (e.g. negative sampling) on the next batches while the caller trains.

    for batch in prefetch(pos_batches, neg_sampling_fn, depth=2):
        train_step(batch)          # sampling of the next batches runs meanwhile

This plays the part of RecIS's ``prefetch_transform=True`` dataset option. One background
thread reads ``source`` in order; ``fn`` runs on that thread (``workers=1``: the sampler
client releases the GIL while it waits on the socket, and the server does the work) or on a
pool of ``workers`` threads, several batches at once (a transform that releases the GIL, such
as the trainer's key dedup). Results come out in source order either way, and an exception
raised by ``fn`` or by the source is re-raised at the point of the batch that caused it::

    source --(reader thread, in order)--> fn(item) on the reader or a worker
           --> queue of depth results, finished or in progress --> consumer, in order
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

#: the reader's last entry: the source is exhausted
_DONE: Future = Future()
_DONE.set_result(None)


class Prefetcher(Iterator[T], Generic[S, T]):
    """Iterates ``fn(item)`` for ``item`` in ``source``, computing up to ``depth`` ahead.

    Args:
        source: the input batches, read on one background thread, in order.
        fn: the transform; with ``workers`` > 1 it runs on several items at once and must be
            thread-safe.
        depth: how many results may wait ahead of the consumer (>= 1), finished or in
            progress (the reader holds one more while the queue is full).
        workers: threads ``fn`` runs on (>= 1); 1: the reader's own, as one thread would.

    Example:
        >>> with Prefetcher(batches, dedup, depth=4, workers=3) as p:
        ...     for prepared in p:        # in the order of ``batches``
        ...         step(prepared)
    """

    def __init__(
        self, source: Iterable[S], fn: Callable[[S], T], depth: int = 2, workers: int = 1
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._queue: queue.Queue[Future[T]] = queue.Queue(depth)
        self._stop = threading.Event()
        self._finished = False
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="streamrec-prefetch-fn")
            if workers > 1
            else None
        )
        self._thread = threading.Thread(
            target=self._run, args=(iter(source), fn), name="streamrec-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: Future[T]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _call(self, fn: Callable[[S], T], item: S) -> Future[T]:
        """``fn(item)`` on a worker, or here and now (its future already done)."""
        if self._pool is not None:
            return self._pool.submit(fn, item)
        done: Future[T] = Future()
        try:
            done.set_result(fn(item))
        except BaseException as exc:  # handed to the consumer, re-raised there
            done.set_exception(exc)
        return done

    def _run(self, source: Iterator[S], fn: Callable[[S], T]) -> None:
        try:
            for item in source:
                if self._stop.is_set():
                    return
                result = self._call(fn, item)
                if not self._put(result):
                    result.cancel()
                    return
                if result.done() and result.exception() is not None:
                    return  # the consumer stops there: nothing after it is read
        except BaseException as exc:  # handed to the consumer, re-raised there
            failed: Future[T] = Future()
            failed.set_exception(exc)
            self._put(failed)
            return
        self._put(_DONE)

    def __iter__(self) -> Prefetcher[S, T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        result = self._queue.get()
        if result is _DONE:
            self._finished = True
            raise StopIteration
        try:
            return result.result()
        except BaseException:
            self._finished = True
            raise

    def close(self) -> None:
        """Stops the background threads (they finish the calls in progress)."""
        self._stop.set()
        self._finished = True
        self._thread.join(timeout=30)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher[S, T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch(
    source: Iterable[S], fn: Callable[[S], T], depth: int = 2, workers: int = 1
) -> Prefetcher[S, T]:
    """Shorthand for :class:`Prefetcher`."""
    return Prefetcher(source, fn, depth, workers)
