"""Where a batch's host work runs: its store pull and push on the training thread or on one
of their own, its preparation (the keys' dedup) on one thread or a pool sized to the machine.

The training loop hands each pull and push to an executor and takes its result when it
needs it (the runner's pipeline). On a CPU model with its store in-process the step's gemms
use every core, and a second busy thread only preempts them: there the calls run inline, at
submit, with all the intra-op threads (``InlineExecutor``). A GPU step leaves the host idle,
and a store service's reply is a wait on a socket: there a thread of their own overlaps them
with the step (``runner.sparse_worker``).

The batches are read and parsed on one thread and prepared ahead of the step by the sampler's
``Prefetcher``: on that thread for a CPU model (its cores are the gemms'), on
:func:`prefetch_workers` threads for a GPU one, whose host cores are otherwise idle::

    reader (read, parse, negatives; in order) -> prepare (dedup) x workers -> training loop
    sparse worker: pull(i + 1), push(i), beside the training loop's step i
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each call at submit, on the caller's thread; its future is already done."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # raised where the loop takes the result, as a thread's
            done.set_exception(exc)
        return done


def runs_inline(setting: str, device_type: str, in_process: bool) -> bool:
    """Whether ``runner.sparse_worker`` puts the calls on the training thread."""
    if setting == "auto":
        return device_type == "cpu" and in_process
    return setting == "inline"


def sparse_executor(setting: str, device_type: str, in_process: bool) -> Executor:
    """The executor of a trainer's pulls and pushes (see the module doc)."""
    if runs_inline(setting, device_type, in_process):
        return InlineExecutor()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-sparse")


#: The most threads a rank prepares its batches on. The reader before them (read and parse,
#: one thread, in order) takes about as long a batch as the prepare (setup b, one thread:
#: 0.8-1.0 ms against 0.6-0.8, bench/host_pipeline.py): past a few workers they wait on it.
MAX_PREFETCH_WORKERS = 4
#: Threads of a GPU rank that stay busy beside the prefetch workers: the training loop and
#: the sparse worker (pull and push).
BUSY_THREADS = 2


def host_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def prefetch_workers(
    device_type: str, cores: int | None = None, local_ranks: int | None = None
) -> int:
    """Threads a rank prepares its batches on (the ``Prefetcher``'s workers).

    1 for a model on the CPU: its gemms use every core, and more busy threads only preempt
    them. For a GPU model, the rank's share of the host's cores (``cores`` over the node's
    ranks) less :data:`BUSY_THREADS`, at least 1, at most :data:`MAX_PREFETCH_WORKERS`.

    Args:
        device_type: where the dense model runs (``cpu``, ``cuda``).
        cores: the host's cores (None: :func:`host_cores`).
        local_ranks: the ranks on this node (None: ``LOCAL_WORLD_SIZE``, else 1).
    """
    if device_type == "cpu":
        return 1
    cores = host_cores() if cores is None else cores
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    share = cores // max(local_ranks, 1)
    return max(1, min(MAX_PREFETCH_WORKERS, share - BUSY_THREADS))
