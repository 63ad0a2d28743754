"""Data parallelism over dense parameters with torch.distributed (env:// rendezvous).

Ranks come from the environment torchrun (or a Kubernetes indexed Job) sets: ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``. Backend ``auto`` is nccl when the dense
model runs on a GPU (``runner.device``, :mod:`.device`), gloo otherwise; with nccl the host
tensors of a group (outcome tables, a pass's counts) still go over gloo.

Ranks may hold different numbers of batches in a pass (files are divided ``r::world``), so
every training step all-reduces one flat buffer: the dense gradients followed by a 1 when the
rank had a batch. The summed count tells every rank how many contributed (the gradient is
their mean) and when all are done (count 0), so collectives always match across ranks.

A failure inside one rank must not leave the others waiting in a collective: the step buffer
also carries a "failed" count, and :func:`exchange_outcomes` (one small all-reduce) tells every
rank what every rank's part of a pass or a save came to, so the group fails together, at once.
A collective that still waits (a rank gone silent) gives up after ``distributed.timeout_s``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from streamrec.control.trainer_config import ResourcesConfig
from streamrec.trainer.errors import ConfigError, GroupError


def env_world() -> tuple[int, int]:
    """(rank, world_size) from the environment; (0, 1) when not launched distributed."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as exc:
        raise ConfigError(f"RANK / WORLD_SIZE must be integers: {exc}") from exc


def apply_resources(resources: ResourcesConfig, world: int) -> None:
    """Refuses a group of another size than the job's ``trainer_ranks``; sets this rank's
    torch threads to ``threads_per_rank``."""
    want = resources.trainer_ranks
    if want is not None and want != world:
        raise ConfigError(
            f"resources.trainer_ranks is {want} but this trainer group has {world} rank(s) "
            f"(WORLD_SIZE): start it with {want} ranks, or change resources.trainer_ranks"
        )
    if isinstance(resources.threads_per_rank, int):  # "auto": the runner's ThreadTuner
        torch.set_num_threads(resources.threads_per_rank)


def init_from_env(
    backend: str = "auto", timeout_s: float = 30.0, device: torch.device | None = None
) -> tuple[int, int, bool]:
    """Joins the process group when WORLD_SIZE > 1.

    Returns:
        (rank, world_size, created): ``created`` is True when this call made the group
        (and :func:`shutdown` should end it).
    """
    rank, world = env_world()
    if world <= 1:
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    if backend == "auto":
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    if backend == "nccl" and (device is None or device.type != "cuda"):
        raise ConfigError(
            "distributed.backend 'nccl' needs the dense model on a CUDA GPU; use 'gloo' on CPU"
        )
    # nccl carries CUDA tensors only: the host tensors (outcome tables, a pass's counts) take gloo
    spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
    dist.init_process_group(spec, init_method="env://", timeout=dt.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), True


#: How long a collective inside a training step waits for the other ranks (the job's
#: ``distributed.timeout_s``; a pooled group's own timeout may differ).
_step_timeout = dt.timedelta(seconds=30)


#: How long a rank waits for the others at an outcome exchange (the job's
#: ``distributed.checkpoint_timeout_s``: rank 0 may save or load the store for minutes).
_wait_timeout = dt.timedelta(seconds=1800)
#: Outcome exchanges so far (the same count on every rank: they all make the same calls).
_arrivals = 0


def set_wait_timeout(timeout_s: float) -> None:
    global _wait_timeout
    _wait_timeout = dt.timedelta(seconds=timeout_s)


def _arrive_all() -> None:
    """Returns once every rank has arrived here, however long the slowest takes, up to the
    wait timeout: keys in the group's store (a collective gives up after the group's own,
    short, timeout). Rank 0 deletes the previous arrival's keys (every rank is past it)."""
    global _arrivals
    _arrivals += 1
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    tag = f"streamrec/arrive/{_arrivals}"
    store.set(f"{tag}/{rank}", "1")
    names = [f"{tag}/{r}" for r in range(world)]
    # polled, not one blocking wait: a SIGTERM (torchrun stopping the group after a rank
    # died, which never arrives) is handled between polls instead of after the whole wait
    deadline = time.monotonic() + _wait_timeout.total_seconds()
    pause = 0.005
    while not store.check(names):
        if time.monotonic() > deadline:
            raise GroupError(
                f"the other ranks did not reach the end of the phase within "
                f"{_wait_timeout.total_seconds():.0f} s (distributed.checkpoint_timeout_s)"
            )
        time.sleep(pause)
        pause = min(0.2, pause * 2)
    if rank == 0 and _arrivals > 1:
        for r in range(world):
            store.delete_key(f"streamrec/arrive/{_arrivals - 1}/{r}")


def set_step_timeout(timeout_s: float) -> None:
    global _step_timeout
    _step_timeout = dt.timedelta(seconds=timeout_s)


def _step_all_reduce(t: torch.Tensor) -> None:
    """``all_reduce`` of a step: raises after the step timeout (a rank gone silent)."""
    dist.all_reduce(t, async_op=True).wait(timeout=_step_timeout)


#: How long :func:`shutdown` waits for the other ranks before tearing the group down.
SHUTDOWN_BARRIER_S = 10.0


def shutdown() -> None:
    """Ends the process group, every rank together where they can: a rank that tears gloo
    down while a peer still holds its connections can abort at exit (std::terminate, seen
    under load in the two-rank tests after both ranks had finished their work). A peer gone
    or late costs at most SHUTDOWN_BARRIER_S, then the group is torn down anyway."""
    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1 and dist.get_backend() == "gloo":
        # a peer that died or left first: nothing to wait for
        with contextlib.suppress(RuntimeError):
            dist.monitored_barrier(timeout=dt.timedelta(seconds=SHUTDOWN_BARRIER_S))
    dist.destroy_process_group()


def active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Every parameter and buffer of ``module`` from rank ``src`` (identical start)."""
    if not active():
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src)


def sync_gradients(
    params: list[torch.nn.Parameter], has_batch: bool, failed: bool = False
) -> tuple[int, int]:
    """Averages gradients over the ranks that had a batch; returns (ranks with a batch,
    ranks that failed).

    A rank without a batch passes ``has_batch=False``; its gradients are set to the mean of
    the others so its optimizer takes the same step. A rank whose step raised passes
    ``failed=True`` (and no batch): every rank sees the failed count in the same step and
    stops (the gradients are then left as they were). Count 0: no rank had a batch.
    """
    device = params[0].device
    grads = [p.grad if (has_batch and p.grad is not None) else torch.zeros_like(p) for p in params]
    flags = torch.tensor([1.0 if has_batch else 0.0, 1.0 if failed else 0.0], device=device)
    flat = torch.cat([g.reshape(-1) for g in grads] + [flags])
    _step_all_reduce(flat)
    count, nfailed = (int(round(float(v))) for v in flat[-2:])
    if count == 0 or nfailed:
        return count, nfailed
    flat = flat[:-2] / count
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    return count, 0


#: Bytes of each rank's message carried by exchange_outcomes (a longer one is cut).
OUTCOME_MESSAGE_BYTES = 512


@dataclass(frozen=True)
class RankOutcome:
    """What one rank's part of a group step came to: ``code`` 0 is success (the meaning of
    other codes and of ``marks`` is the caller's), ``message`` a bounded description."""

    rank: int
    code: int
    marks: tuple[int, ...]
    message: str


def exchange_outcomes(code: int, marks: list[int], message: str = "") -> list[RankOutcome]:
    """Every rank's outcome, on every rank (one all-reduce of a ``(world, 2 + k + 512)``
    int64 table in which each rank fills its own row; no pickling).

    Every rank must call it at the same point with the same ``len(marks)``.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if active() else (0, 1)
    raw = message.encode("utf-8", "replace")[:OUTCOME_MESSAGE_BYTES]
    width = 2 + len(marks) + OUTCOME_MESSAGE_BYTES
    table = torch.zeros((world, width), dtype=torch.int64)
    table[rank, 0] = code
    table[rank, 1] = len(raw)
    if marks:
        table[rank, 2 : 2 + len(marks)] = torch.tensor(marks, dtype=torch.int64)
    if raw:
        table[rank, 2 + len(marks) : 2 + len(marks) + len(raw)] = torch.tensor(
            list(raw), dtype=torch.int64
        )
    if world > 1:
        _arrive_all()  # a save may run for minutes: every rank here before the collective
        dist.all_reduce(table)
    out = []
    for r, row in enumerate(table.tolist()):
        n = row[1]
        text = bytes(row[2 + len(marks) : 2 + len(marks) + n]).decode("utf-8", "replace")
        out.append(RankOutcome(r, row[0], tuple(row[2 : 2 + len(marks)]), text))
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place) when distributed; the tensor itself otherwise."""
    if active():
        _step_all_reduce(t)
    return t


def barrier() -> None:
    if active():
        dist.barrier()
