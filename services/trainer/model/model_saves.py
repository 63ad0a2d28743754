"""A trainer's model on disk: checkpoints, exports, warm start and the model's lineage.

:class:`ModelSaves` is the half of :class:`~streamrec.trainer.runner.OnlineTrainer` that
saves and loads: the saves due after a pass (checkpoint every ``checkpoint_per_pass``,
delta, the day's base and batch models), exports, loading exactly the checkpoint the control
plane names, and ``passes.jsonl`` (:mod:`.pass_log`: each pass once, in training order).
Every save and load ends with every rank agreeing on its outcome (a failure on one rank
raises on all).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.save_modes import SaveMode
from streamrec.trainer import distributed as ddp
from streamrec.trainer import faults
from streamrec.trainer import metrics as m
from streamrec.trainer.errors import CheckpointError, ConfigError
from streamrec.trainer.group_outcome import agree
from streamrec.trainer.model import checkpoint_dirs as ckpt
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.lr_policy import LRPolicyScheduler
from streamrec.trainer.model.model_owner import claim
from streamrec.trainer.model.pass_log import PASSES_FILE, write_lines

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore

log = logging.getLogger("streamrec.trainer.runner")

#: What save_model writes (a checkpoint is save_checkpoint's).
EXPORT_MODES = frozenset(SaveMode) - {SaveMode.CHECKPOINT}


class ModelSaves:
    """Saves and loads of an :class:`~streamrec.trainer.runner.OnlineTrainer` (which sets these
    fields)."""

    config: TrainerConfig
    #: The job whose model this is (None: unchecked, :mod:`.model_owner`).
    job_id: str | None
    rank: int
    world: int
    label: str
    model_root: Path
    data_root: Path
    store: SparseStore
    dense: DLRMDense
    optimizer: torch.optim.Optimizer
    scheduler: LRPolicyScheduler
    clean: bool
    step: int
    last_pass: tuple[str, int] | None
    last_online: dict[str, Any] | None
    #: "M -> N" when the last checkpoint loaded was saved by M store shards, loaded into N
    resharded: str | None = None
    progress_at: float
    phase: str

    def record_pass(self, record: dict[str, Any]) -> None:
        """Appends ``record`` to passes.jsonl, dropping any record of this pass or a later
        one (trained before a restart from an earlier checkpoint): each pass once, in
        training order. Written via a temporary file, so a failure leaves the old file."""
        self.model_root.mkdir(parents=True, exist_ok=True)
        claim(self.model_root, self.job_id)
        path = self.model_root / PASSES_FILE
        here = (record["day"], record["pass_id"])
        kept = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    old = json.loads(line)
                    if (old["day"], old["pass_id"]) >= here:
                        continue
                except (ValueError, KeyError, TypeError):
                    pass  # not ours to judge: keep it
                kept.append(line)
        write_lines(path, [*kept, json.dumps(record)])
        faults.after_pass_log()

    def _save_due(self, spec: layout.PassSpec, checkpoint: bool = False) -> Path | None:
        """The saves due after ``spec`` (a checkpoint when ``checkpoint``); returns the
        checkpoint written (None: none due)."""
        r = self.config.runner
        last_of_day = spec.is_last_of_day(r.split_interval, r.split_per_pass)
        if (
            r.save_delta_frequency
            and spec.pass_id % r.save_delta_frequency == 0
            and (not last_of_day)
        ):
            self.save_model(SaveMode.DELTA, spec.day, spec.pass_id)
        if last_of_day and r.save_base_at_day_end:
            self._rank0_store(self.store.advance_day)
            self.shrink()
            self.save_model(SaveMode.BASE, spec.day)
            self.save_model(SaveMode.BATCH, spec.day)
            return self.save_checkpoint(spec.day, spec.pass_id)
        # the pass that ends the span (end_day's end_split) is one too: a job driven by the
        # control plane ends there, and export and the next run start from its checkpoint
        at_end = spec.day == r.end_day and spec.splits[-1:] == (r.end_split,)
        if (
            checkpoint
            or at_end
            or (r.checkpoint_per_pass and spec.pass_id % r.checkpoint_per_pass == 0)
        ):
            return self.save_checkpoint(spec.day, spec.pass_id)
        return None

    # -- saving and loading -----------------------------------------------------------------
    def _rank0_store(self, fn: Any, *args: Any) -> Any:
        """Runs a store admin call once (rank 0; the ranks share the store), ranks in step;
        a failure raises on every rank (:meth:`_agree`)."""
        ddp.barrier()
        out, failure = None, None
        if self.rank == 0:
            try:
                out = fn(*args)
            except Exception as exc:
                failure = exc
        agree(failure, getattr(fn, "__name__", "store call"))
        return out

    def dense_state(self) -> dict[str, Any]:
        return ckpt.dense_state(
            self.dense,
            self.optimizer,
            self.scheduler,
            self.last_pass,
            self.step,
            self.config.hyper_parameters.model_dump(mode="json"),
        )

    def _write(self, mode: str, day: str, pass_id: int | None) -> Path:
        """A save of ``mode`` (dense + store, manifest last); rank 0 writes, ranks in step."""
        started = time.monotonic()
        mode = SaveMode(mode)  # a str naming one is taken too
        directory = ckpt.model_dir(self.model_root, mode, day, pass_id)
        ddp.barrier()
        self.progress_at = time.monotonic()  # a save is one long step: its start is progress
        failure = None
        if self.rank == 0:
            try:
                self.write_here(mode, day, pass_id)
            except Exception as exc:
                failure = exc
        agree(failure, f"{mode} save to {directory}")
        self.progress_at = time.monotonic()
        m.SAVE_SECONDS.labels(self.label, mode.value).observe(time.monotonic() - started)
        return directory

    def write_here(self, mode: SaveMode, day: str, pass_id: int | None) -> Path:
        """Rank 0's part of a save (dense + store, manifest last), no collective: what
        :meth:`_write` runs on rank 0, and a base written on rank 0 alone when serving
        refused a delta (``online.publish_save``)."""
        directory = ckpt.model_dir(self.model_root, mode, day, pass_id)
        info = {
            "day": day,
            "pass_id": pass_id,
            "step": self.step,
            "world_size": self.world,
            "tables": self.config.table_names,
            "job_id": self.job_id,
        }
        claim(self.model_root, self.job_id)
        ckpt.write_model(directory, self.dense_state(), self.store, mode, info)
        return directory

    def save_checkpoint(self, day: str, pass_id: int) -> Path:
        """Full checkpoint after pass ``pass_id`` of ``day`` (dense + store, manifest last)."""
        return self._write(SaveMode.CHECKPOINT, day, pass_id)

    def save_model(self, mode: str, day: str, pass_id: int | None = None) -> Path:
        """``base`` / ``batch`` (end of day) or ``delta`` (after ``pass_id``) model."""
        if mode not in EXPORT_MODES:
            raise ConfigError(f"mode must be one of {sorted(EXPORT_MODES)}, got {mode!r}")
        directory = self._write(mode, day, pass_id if mode == SaveMode.DELTA else None)
        if mode in self.config.online.modes and self.config.online.redis_url:
            from streamrec.trainer.model.online import publish_save

            self.last_online = publish_save(self, directory, mode, day, pass_id)
        return directory

    def shrink(self) -> dict[str, Any]:
        """The store's shrink (decay show/click, delete stale rows); deleted rows per table."""
        out = self._rank0_store(self.store.shrink)
        return dict(out or {})

    def warm_start(self) -> tuple[str, int] | None:
        """Loads the newest complete checkpoint; returns its (day, pass_id) or None.

        For a trainer on its own; a group driven by the control plane loads the checkpoint
        the API names instead (:meth:`load_checkpoint`)."""
        found = layout.newest_checkpoint(self.model_root)
        if found is None:
            return None
        return self.load_checkpoint(found[0], found[1])

    def load_checkpoint(self, day: str, pass_id: int) -> tuple[str, int]:
        """Loads exactly the checkpoint after pass ``pass_id`` of ``day`` (every rank its
        dense part, rank 0 the store's); CheckpointError on every rank when it is missing,
        incomplete or corrupt on any."""
        directory = layout.checkpoint_dir(self.model_root, day, pass_id)
        self.clean = False  # until both parts are in
        self.phase = "load"
        try:
            return self._load_checkpoint(directory, day, pass_id)
        finally:
            self.phase = "idle"

    def _load_checkpoint(self, directory: Path, day: str, pass_id: int) -> tuple[str, int]:
        failure: Exception | None = None
        try:
            manifest, state = ckpt.read_checkpoint(directory)
            step = ckpt.restore_dense(state, self.dense, self.optimizer, self.scheduler, directory)
        except Exception as exc:
            failure = exc
        self._agree_checkpoint(failure, directory)
        self.resharded = None
        if self.rank == 0:
            try:
                self.resharded = ckpt.load_sparse(self.store, directory)
            except Exception as exc:
                failure = exc
        self._agree_checkpoint(failure, directory)
        self.accept_store_restarts(ask=False)  # rank 0's client took them in the load
        self.step = step
        self.clean = True
        self.progress_at = time.monotonic()
        self.last_pass = (day, pass_id)
        log.info(
            "warm start from %s (step %d, manifest %s%s)",
            directory,
            self.step,
            manifest.get("mode"),
            f", store shards resharded {self.resharded}" if self.resharded else "",
        )
        return self.last_pass

    def accept_store_restarts(self, ask: bool = True) -> list[str]:
        """Every rank's store client expects the shard incarnations rank 0's holds (asked of
        the shards first when ``ask``), so shards restarted empty are served again instead
        of failing every pass with ``ShardRestarted``: after rank 0 loaded a checkpoint into
        every shard, or when there is none to go back to. Returns the restarted shards'
        endpoints (rank 0). The in-process store has no shards: nothing to do."""
        store = self.store
        if not store.incarnations():  # no shards (the same on every rank)
            return []
        restarted: list[str] = []
        failure: Exception | None = None
        if self.rank == 0 and ask:
            try:
                restarted = store.accept_restarts()
            except Exception as exc:
                failure = exc
        if ask:  # the same on every rank
            agree(failure, "accepting the store's shards as they are")
        if restarted:
            log.warning("store shards %s restarted empty: going on with them", restarted)
        if ddp.active():  # rank 0's ids to every rank (a sum: the others send zeros)
            ids = [0 if i is None else i - (1 << 64) * (i >> 63) for i in store.incarnations()]
            shared = torch.tensor(ids if self.rank == 0 else [0] * len(ids), dtype=torch.int64)
            ddp.all_reduce_sum(shared)
            if self.rank != 0:
                store.accept_restarts([(int(v) % (1 << 64)) or None for v in shared.tolist()])
        return restarted

    def _agree_checkpoint(self, failure: Exception | None, directory: Path) -> None:
        try:
            agree(failure, f"loading checkpoint {directory}")
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"cannot load checkpoint {directory}: {exc}") from exc

    def export_serving(self, out_dir: str | Path) -> Path:
        """Dense part int8-quantized + the store's base rows, for :mod:`.export`'s predict."""
        from streamrec.trainer.model.export import export_serving

        return export_serving(self, Path(out_dir))

    # -- the whole job ----------------------------------------------------------------------
