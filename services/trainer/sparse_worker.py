"""Where a batch's store pull and push run: on the training thread, or on one of their own.

The training loop hands each pull and push to an executor and takes its result when it
needs it (the runner's pipeline). On a CPU model with its store in-process the step's gemms
use every core, and a second busy thread only preempts them: there the calls run inline, at
submit, with all the intra-op threads (``InlineExecutor``). A GPU step leaves the host idle,
and a store service's reply is a wait on a socket: there a thread of their own overlaps them
with the step (``runner.sparse_worker``).
"""

from __future__ import annotations

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
