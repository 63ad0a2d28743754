"""``OnlineTrainer``: streaming passes, predict-then-train, checkpoints, warm start.

One pass (as PaddleRec's online training, docs/design-notes.md)::

    files of the pass (rank r takes files r::world)
      -> prefetch thread: read + parse (the compiled parser, whole chunks), cut into batches,
         dedup the keys of every slot into one fused row index (:mod:`.sparse`)
      -> pull worker (one thread, FIFO): one store pull per table -> one (U, dim) leaf
      -> main thread: one gather of every slot, DLRM forward/backward, dense all-reduce,
         optimizer step
      -> pull worker: push sparse gradients + show/click (one store push per table)

    predict phase: every batch with the model as it stood before the pass (create=False:
                   nothing is created or trained) -> predict AUC / logloss
    train phase:   the same batches again, trained -> train AUC / logloss / samples/s

The pull worker runs ``pull(i+1)`` while batch ``i`` computes and ``push(i)`` while batch
``i+1`` computes. Being one FIFO thread, ``pull(i+1)`` always runs after ``push(i-1)`` and
before ``push(i)``: the sparse rows a batch sees are stale by exactly one step, the same in
every run, so a restart from a checkpoint reproduces the parameters of an uninterrupted run.

Every ``checkpoint_per_pass`` passes (by pass id) a checkpoint is written; every
``save_delta_frequency`` passes a delta model; after the last pass of a day: advance_day,
shrink, base model, batch model and a checkpoint (so a restart continues with the next day).
Then, and only then, rank 0 records the pass in ``<model_save_path>/passes.jsonl``: a pass
is recorded once its saves are complete, and a record of a pass after the checkpoint a
group restarts from is dropped when that pass is trained again (the file is the model's
lineage, each pass once).

The group fails or succeeds together: each phase of a pass (predict, train, saves) ends with
every rank learning every rank's outcome (:func:`~.distributed.exchange_outcomes`; inside
training the per-step all-reduce carries a failed flag), and a failure on any rank raises
:class:`~.errors.PassFailed` on all of them, classified ``data`` (a bad split: naming it)
or ``transient``. After a failed pass the model is not the state after any pass
(:attr:`OnlineTrainer.clean` is False) until a checkpoint is loaded.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from streamrec import layout
from streamrec.control import keys
from streamrec.control.trainer_config import TrainerConfig
from streamrec.sampler import Prefetcher
from streamrec.trainer import distributed as ddp
from streamrec.trainer import metrics as m
from streamrec.trainer.batch_rule import auto_batch_size
from streamrec.trainer.data.batches import Batch, ParseStats
from streamrec.trainer.data.negsampling import ItemSide, NegativeSampler, reach_sampler
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.data.run_plan import RunPlan, data_wait_failed, plan_run
from streamrec.trainer.device import config_device
from streamrec.trainer.errors import ConfigError, GroupError, PassFailed
from streamrec.trainer.group_outcome import share_pass_outcome
from streamrec.trainer.model.dlrm import DLRMDense
from streamrec.trainer.model.evaluation import AucAccumulator, collapse_figures
from streamrec.trainer.model.export import build_dense
from streamrec.trainer.model.losses import make_loss
from streamrec.trainer.model.lr_policy import LRPolicyScheduler, make_optimizer
from streamrec.trainer.model.model_owner import check_owner
from streamrec.trainer.model.model_saves import ModelSaves
from streamrec.trainer.model.precision import compute_in, resolve
from streamrec.trainer.model.staging import Staging
from streamrec.trainer.sparse import SparseBatch, SparseTables
from streamrec.trainer.sparse_worker import prefetch_workers, sparse_executor
from streamrec.trainer.store_tables import build_table_options, make_store
from streamrec.trainer.thread_tuner import ThreadTuner

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore

log = logging.getLogger(__name__)


class OnlineTrainer(ModelSaves):
    """DLRM trainer over the streaming layout; the programmatic API of a trainer rank.

    Args:
        config: the job.
        store: an embedding store (a ``SparseStore``: in-process or the shards' client);
            None builds one (:func:`~streamrec.trainer.store_tables.make_store`): the client when
            ``store.endpoints`` is set, else in-process.
        job_id: the job this trainer runs (None: ``store.namespace``, which the control
            plane sets to the job id): a model directory of another job is refused
            (:class:`~.errors.ModelDirTaken`, :mod:`streamrec.trainer.model.model_owner`).

    Example:
        >>> t = OnlineTrainer(TrainerConfig.from_yaml("job.yaml"))
        >>> t.run()          # every pass start_day..end_day, after a warm start
        >>> t.close()
    """

    def __init__(
        self, config: TrainerConfig, store: SparseStore | None = None, job_id: str | None = None
    ) -> None:
        self.config = config
        hp, r = config.hyper_parameters, config.runner
        self.job_id = job_id if job_id is not None else config.store.namespace
        self.model_root = Path(r.model_save_path)
        check_owner(self.model_root, self.job_id)  # before anything is built (a fatal error)
        #: the dense model's device (runner.device); its inputs get there through :attr:`staging`
        self.device = config_device(config)
        self.staging = Staging(self.device)
        _, world = ddp.env_world()
        ddp.apply_resources(config.resources, world)
        # one CPU rank alone: its own step times decide its threads (ranks in lockstep time
        # each other's waits, a GPU step does not run on these threads)
        self.thread_tuner = (
            ThreadTuner()
            if config.resources.threads_per_rank == "auto"
            and world == 1
            and self.device.type == "cpu"
            else None
        )
        if world > 1 and store is None and not config.store.endpoints:
            raise ConfigError(
                f"WORLD_SIZE={world}: ranks must share their sparse parameters; set "
                f"store.endpoints to the embedding-store shards (an in-process store would "
                f"give each rank its own)"
            )
        dc = config.distributed
        self.rank, self.world, self._own_group = ddp.init_from_env(
            dc.backend, dc.timeout_s, self.device
        )
        # a step's collectives wait timeout_s; the outcome of a phase (a save, a load) waits
        # for every rank up to checkpoint_timeout_s
        ddp.set_step_timeout(dc.timeout_s)
        ddp.set_wait_timeout(dc.checkpoint_timeout_s)
        #: What the trainer does now ("idle", "train", "save", "load"): the agent's watchdog
        #: allows a save or load its own, longer, time without progress.
        self.phase = "idle"
        self.label = str(self.rank)
        self.tables = build_table_options(config)
        self._own_store = store is None
        self.store = make_store(config, self.tables) if store is None else store
        threads = r.sparse_threads or (
            min(len(config.table_names), 8) if config.store.endpoints else 1
        )
        self.sparse = SparseTables(
            self.store,
            config.slot_tables,
            hp.arch_sparse_feature_size,
            threads,
            config.pooling,
            config.slot_dims,
        )
        self.dense = build_dense(hp, config.slot_dims, r.feature_schema).to(self.device)
        ddp.broadcast_module(self.dense)
        #: fp32 or bf16 autocast (model.precision), said in every pass's record
        self.precision = resolve(hp.precision, self.device)
        log.info(
            "dense model on %s in %s (%s)", self.device, self.precision.name, self.precision.reason
        )
        self.params = list(self.dense.parameters())
        self.optimizer = make_optimizer(hp.optimizer, hp.learning_rate, self.params)
        self.scheduler = LRPolicyScheduler(
            self.optimizer, hp.lr_num_warmup_steps, hp.lr_decay_start_step, hp.lr_num_decay_steps
        )
        self.loss_fn = make_loss(hp.loss_function, hp.loss_weights, hp.loss_threshold)
        self.data_root = Path(r.train_data_dir)
        self.last_pass: tuple[str, int] | None = None
        #: The last publication to the serving Redis (``online``), for the caller to report.
        self.last_online: dict[str, Any] | None = None
        #: False from the start of a pass until it (and its saves) succeeded: after a failed
        #: pass the parameters are no pass's state, only a checkpoint load makes them one.
        self.clean = True
        self.step = 0
        #: This rank's rows of the last pass read (predicted or trained): the automatic
        #: batch's measure of the stream (batch_rule.py); None before the first.
        self.last_rows: int | None = None
        #: time.monotonic() of the last batch or save done (the agent's watchdog reads it).
        self.progress_at = time.monotonic()
        self.stop_event = threading.Event()
        #: While run() waits for a pass's donefiles: (that pass, polls that found it not ready).
        self.waiting: tuple[layout.PassSpec, int] | None = None
        #: runs each pull and push: inline, or on a thread beside the step (sparse_worker.py)
        self._pool = sparse_executor(
            r.sparse_worker, self.device.type, in_process=not config.store.endpoints
        )
        #: threads a batch's dedup runs on, ahead of the step (sparse_worker.py)
        self.prefetch_workers = prefetch_workers(self.device.type)
        #: The node's sampler, reached at the first pass (:meth:`_reach_sampler`).
        self.negatives: NegativeSampler | None = None
        if config.negative_sampling.enabled:  # its slots or features, before any pass
            ItemSide.of(config.negative_sampling, hp.sparse_inputs_slots, r.feature_schema)
        self.metrics_port: int | None = None
        if r.metrics_port is not None:
            self.metrics_port = m.serve_rank_metrics(r.metrics_port, r.metrics_host, self.rank)

    # -- one pass ---------------------------------------------------------------------------
    def rank_files(self, spec: layout.PassSpec, skip: tuple[str, ...] = ()) -> list[Path]:
        """This rank's share of the pass's files (r::world of the sorted list), without the
        splits in ``skip``."""
        if skip:
            spec = layout.PassSpec(
                spec.day, spec.pass_id, tuple(s for s in spec.splits if s not in skip)
            )
        files = layout.pass_files(self.data_root, spec, self.config.runner.data_donefile)
        return files[self.rank :: self.world]

    def batch_size(self, rows: int | None) -> int:
        """The training batch of a pass of ``rows`` rows on this rank (None: not known):
        ``train_batch_size``, or when it is ``auto`` :func:`~.batch_rule.auto_batch_size`."""
        size = self.config.runner.train_batch_size
        return auto_batch_size(rows) if size == "auto" else size

    def _prefetch(
        self, files: list[Path], stats: ParseStats, batch_size: int
    ) -> Prefetcher[Batch, tuple[Batch, SparseBatch]]:
        """Reads, parses and samples negatives for the batches of ``files`` in a background
        thread, in order, and prepares them (:meth:`_prepare`) on :attr:`prefetch_workers`
        threads, ``prefetch_batches`` ahead of the caller."""
        r, hp = self.config.runner, self.config.hyper_parameters
        batches = iter_batches(
            files,
            r.data_format,
            hp.sparse_inputs_slots,
            batch_size,
            stats,
            r.max_malformed_ratio,
            int(r.read_chunk_mb * (1 << 20)),
            r.feature_schema,
        )
        if self.negatives is not None:  # the sampler's calls one at a time, in order
            batches = map(self.negatives, batches)
        return Prefetcher(batches, self._prepare, r.prefetch_batches, self.prefetch_workers)

    def _prepare(self, batch: Batch) -> tuple[Batch, SparseBatch]:
        """A prefetch worker: the fused dedup of the keys (pure: batches side by side)."""
        return batch, self.sparse.prepare(batch)

    def _pull(self, item: tuple[Batch, SparseBatch], create: bool) -> SparseBatch:
        return self.sparse.pull(item[1], create)

    def _push(self, pulled: SparseBatch, labels: torch.Tensor) -> None:
        scale = self.config.runner.scale_sparse_gradient_with_batch_size
        self.sparse.push(pulled, labels, float(pulled.batch) if scale else 1.0)

    def _logits(self, batch: Batch, pulled: SparseBatch) -> torch.Tensor:
        """The batch's click logits (B,) float32 (the loss takes them: it cannot stall)."""
        ly = self.staging.rows(self.sparse.forward(pulled))
        with compute_in(self.precision, self.device):
            z = self.dense.logits(self.staging.to_device("dense", batch.dense), ly)
        return z.view(-1).float()

    def _probabilities(self, z: torch.Tensor) -> torch.Tensor:
        """Logits -> the click probabilities the metrics take (``loss_threshold``'s clamp
        as :meth:`DLRMDense.forward`)."""
        p = torch.sigmoid(z)
        t = self.dense.loss_threshold
        return p.clamp(t, 1.0 - t) if 0.0 < t < 1.0 else p

    def predict_files(
        self, files: list[Path], acc: AucAccumulator, best: AucAccumulator | None, stats: ParseStats
    ) -> int:
        """Scores files with the current model (no training, no key created); returns this
        rank's sample count."""
        prefetch = self._prefetch(files, stats, self.batch_size(self.last_rows))
        n = 0
        try:
            it = iter(prefetch)
            item = next(it, None)
            fut = self._pool.submit(self._pull, item, False) if item is not None else None
            self.dense.eval()
            with torch.no_grad():
                while item is not None:
                    assert fut is not None
                    batch, pulled = item[0], fut.result()
                    nxt = next(it, None)
                    fut = self._pool.submit(self._pull, nxt, False) if nxt is not None else None
                    p = self._probabilities(self._logits(batch, pulled))
                    acc.add(p.cpu(), batch.labels)
                    self.progress_at = time.monotonic()
                    if best is not None and batch.ptrue is not None:
                        best.add(batch.ptrue, batch.labels)
                    n += len(batch)
                    item = nxt
        finally:
            self.dense.train()
            prefetch.close()
        return n

    def train_files(
        self, files: list[Path], acc: AucAccumulator, stats: ParseStats, batch_size: int
    ) -> int:
        """Trains on files in batches of ``batch_size``; returns this rank's sample count.
        All ranks step together.

        An error in this rank's step (bad data, a store call) is not raised at once: the
        rank joins the next gradient all-reduce with its failed flag, every rank stops in
        that same step, then this rank raises its error and the others :class:`GroupError`.
        """
        prefetch = self._prefetch(files, stats, batch_size)
        in_rank_order = self.config.runner.sparse_push_order == "rank" and self.world > 1
        # in rank order the next batch is pulled after every rank's push: no stale rows
        pipelined = self.config.runner.sparse_pipeline and not in_rank_order
        n = 0
        pushes: list[Future] = []
        failure: Exception | None = None
        peers_failed = 0
        item: tuple[Batch, SparseBatch] | None = None
        fut: Future | None = None
        try:
            it = iter(prefetch)
            try:
                item = next(it, None)
                fut = self._pool.submit(self._pull, item, True) if item is not None else None
            except Exception as exc:
                failure = exc
            while True:
                if item is None and failure is None and self.world == 1:
                    break
                nxt = None
                p = None
                if failure is None:
                    try:
                        pulled = fut.result() if fut is not None else None
                        nxt = next(it, None) if item is not None else None
                        fut = None
                        if nxt is not None and pipelined:
                            fut = self._pool.submit(self._pull, nxt, True)
                        self.optimizer.zero_grad(set_to_none=True)
                        if item is not None:
                            assert pulled is not None
                            batch = item[0]
                            z = self._logits(batch, pulled)
                            labels = batch.labels.to(self.device)
                            loss = self.loss_fn(z.view(-1, 1), labels.view(-1, 1))
                            loss.backward()
                            p = self._probabilities(z.detach())
                    except Exception as exc:
                        failure, item, nxt = exc, None, None
                if self.world > 1:
                    count, peers_failed = ddp.sync_gradients(
                        self.params, item is not None, failure is not None
                    )
                    if peers_failed or count == 0:
                        break
                elif failure is not None:
                    break
                try:
                    self.optimizer.step()
                    self.scheduler.step()
                    self.step += 1
                    self.progress_at = time.monotonic()
                    if self.thread_tuner is not None:
                        self.thread_tuner.step_done()
                    if in_rank_order:
                        mine = (pulled, item[0]) if item is not None else (None, None)
                        self._push_in_rank_order(*mine)
                    if item is not None:
                        assert p is not None and pulled is not None
                        if not in_rank_order:
                            # FIFO after pull(i+1): the next pull never sees this push (module doc)
                            pushes.append(self._pool.submit(self._push, pulled, batch.labels))
                        acc.add(p.detach().cpu(), batch.labels)
                        n += len(batch)
                        if len(pushes) > 4:
                            pushes.pop(0).result()
                    if nxt is not None and not pipelined:  # after push(i): no stale rows
                        fut = self._pool.submit(self._pull, nxt, True)
                except Exception as exc:
                    failure, nxt = exc, None
                item = nxt
            if failure is None and not peers_failed:
                try:
                    for f in pushes:
                        f.result()
                except Exception as exc:
                    failure = exc
        finally:
            prefetch.close()
            if failure is not None or peers_failed:
                # a push still queued must not land after a checkpoint is loaded
                wait([f for f in [*pushes, fut] if f is not None])
        if failure is not None:
            raise failure
        if peers_failed:
            raise GroupError(f"{peers_failed} other rank(s) failed a training step")
        return n

    def _push_in_rank_order(self, pulled: SparseBatch | None, batch: Batch | None) -> None:
        """This step's pushes, rank after rank (``runner.sparse_push_order: rank``): a row
        two ranks update takes rank 0's push, then rank 1's, in every run, so a run and its
        replays after a restart repeat bit for bit. Every rank takes every turn (one step
        all-reduce each, bounded by the step timeout) whether it has a batch or its push
        failed; a failed push is raised after the last turn, and the next step's gradient
        all-reduce stops every rank."""
        failure: Exception | None = None
        for turn in range(self.world):
            if turn == self.rank and pulled is not None and batch is not None:
                try:
                    self._push(pulled, batch.labels)
                except Exception as exc:
                    failure = exc
            ddp.all_reduce_sum(torch.zeros(1))  # the turn passes once its push is applied
        if failure is not None:
            raise failure

    def _together(
        self,
        spec: layout.PassSpec,
        failure: Exception | None,
        files: list[Path],
        phase: str = "train",
    ) -> None:
        """Every rank learns every rank's outcome of a ``phase`` of ``spec``
        (:func:`~.group_outcome.share_pass_outcome`); a failed pass leaves the model unclean."""
        try:
            share_pass_outcome(self.rank, spec, failure, files, phase)
        except PassFailed:
            self.clean = False
            raise

    def _rows_together(
        self, spec: layout.PassSpec, files: list[Path], phase: Callable[[], int]
    ) -> None:
        """Runs a phase of ``spec`` that reads ``files`` (predicting or training); its rows
        become :attr:`last_rows`; then every rank learns every rank's outcome
        (:meth:`_together`)."""
        failure: Exception | None = None
        try:
            self.last_rows = phase()
        except Exception as exc:
            failure = exc
        self._together(spec, failure, files)

    def run_pass(
        self, spec: layout.PassSpec, skip: tuple[str, ...] = (), checkpoint: bool = False
    ) -> dict[str, Any]:
        """Predicts then trains one pass (without the splits in ``skip``); saves what is
        due (a checkpoint too when ``checkpoint``: a run's last pass); records the pass;
        returns its record.

        Raises:
            PassFailed: on every rank alike, when any rank failed the pass.
        """
        r = self.config.runner
        started = time.monotonic()
        # the model's state this pass trains on (its record says so: lineage is checkable)
        last = self.last_pass
        after = "dirty" if not self.clean else None if last is None else keys.pass_key(*last)
        self.clean = False
        files = self.rank_files(spec, skip)
        self._reach_sampler(spec, files)
        pred, best, train = AucAccumulator(), AucAccumulator(), AucAccumulator()
        pstats, tstats = ParseStats(), ParseStats()
        predict_s = 0.0
        if r.predict_before_train:
            self._rows_together(spec, files, lambda: self.predict_files(files, pred, best, pstats))
            predict_s = time.monotonic() - started
        t_train = time.monotonic()
        ns = self.config.negative_sampling
        # the rule counts the stream's rows: a predicted row with negatives is sample_size
        rows = self.last_rows // ns.sample_size if ns.enabled and self.last_rows else self.last_rows
        batch_size = self.batch_size(rows)
        self._rows_together(spec, files, lambda: self.train_files(files, train, tstats, batch_size))
        train_s = time.monotonic() - t_train
        counts = torch.tensor([tstats.lines, tstats.malformed, len(files)], dtype=torch.float64)
        norm = self.dense.dense_norm
        # every rank's normalizer sums of the pass ride on the metrics' one all-reduce
        pending = norm.pending_sums().cpu() if norm is not None else counts[:0]
        flat = torch.cat([pred.state(), best.state(), train.state(), counts, pending])
        ddp.all_reduce_sum(flat)
        size = pred.state().numel()
        pred.load_state(flat[:size])
        best.load_state(flat[size : 2 * size])
        train.load_state(flat[2 * size : 3 * size])
        lines, malformed, nfiles = (int(v) for v in flat[3 * size : 3 * size + 3])
        if norm is not None:
            norm.merge(flat[3 * size + 3 :])
        pr, br, tr = pred.result(), best.result(), train.result()
        seconds = time.monotonic() - started
        record: dict[str, Any] = {
            "day": spec.day,
            "pass_id": spec.pass_id,
            "after": after,
            "splits": list(spec.splits),
            "skipped_splits": list(skip),
            "files": nfiles,
            "lines": lines,
            "samples": tr["samples"],
            "malformed_lines": malformed,
            "predict_auc": pr["auc"],
            "predict_logloss": pr["logloss"],
            "train_auc": tr["auc"],
            "logloss": tr["logloss"],
            "best_auc": br["auc"] if br["samples"] else None,
            "actual_ctr": tr["actual_ctr"],
            "predicted_ctr": tr["predicted_ctr"],
            **collapse_figures(pr, tr, trained=after is not None),
            "seconds": seconds,
            "predict_seconds": predict_s,
            "train_seconds": train_s,
            "samples_per_second": tr["samples"] / train_s if train_s > 0 else None,
            "intra_op_threads": torch.get_num_threads(),
            "precision": self.precision.name,
            "device": str(self.device),
            "lr": self.optimizer.param_groups[0]["lr"],
            "step": self.step,
            "batch_size": batch_size,
            "world_size": self.world,
        }
        self.last_pass = (spec.day, spec.pass_id)
        self.phase = "save"
        failure: Exception | None = None
        try:
            written = self._save_due(spec, checkpoint)
            record["checkpoint"] = str(written) if written is not None else None
            if self.rank == 0:
                self.record_pass(record)
        except Exception as exc:
            failure = exc
        try:
            self._together(spec, failure, files, "save")
        finally:
            self.phase = "idle"
        self.clean = True
        m.observe_pass(
            self.label, record, pstats.malformed + tstats.malformed, r.predict_before_train
        )
        return record

    def _reach_sampler(self, spec: layout.PassSpec, files: list[Path]) -> None:
        """This rank's client of its node's sampler, made in the first pass
        (:func:`~streamrec.trainer.data.negsampling.reach_sampler`): its failure fails the pass."""
        ns = self.config.negative_sampling
        if not ns.enabled or self.negatives is not None:
            return
        self.negatives = reach_sampler(
            ns,
            self.config.hyper_parameters.sparse_inputs_slots,
            self.label,
            self.config.runner.feature_schema,
            lambda failure: self._together(spec, failure, files),
            self.config.distributed.timeout_s,
        )

    def passes_todo(self) -> list[layout.PassSpec]:
        """Every pass of start_day..end_day (to end_split) after the last one done."""
        return plan_run(self.config.runner, self.data_root, self.last_pass).passes

    def run(self, on_pass: Callable[[dict[str, Any]], None] | None = None) -> RunPlan:
        """Warm start, then every remaining pass, waiting for donefiles as configured;
        ``on_pass`` gets each pass's record. The last pass writes a checkpoint (what
        ``export`` and the next run start from). Returns the plan: where the run stopped."""
        r = self.config.runner
        self.warm_start()
        plan = plan_run(r, self.data_root, self.last_pass)
        for n, spec in enumerate(plan.passes, 1):
            waited = time.monotonic()
            self.waiting = (spec, 0)
            ready = layout.wait_for_pass(
                self.data_root,
                spec,
                r.data_donefile,
                r.data_sleep_second,
                r.data_wait_timeout_second,
                self.stop_event,
                not_ready=self._count_poll,
            )
            self.waiting = None
            m.WAIT_SECONDS.labels(self.label).inc(time.monotonic() - waited)
            if self.stop_event.is_set():
                return plan
            if not ready:  # a data error naming the splits missing
                raise data_wait_failed(r, self.data_root, spec, time.monotonic() - waited)
            record = self.run_pass(spec, checkpoint=n == len(plan.passes))
            if on_pass is not None:
                on_pass(record)
        return plan

    def _count_poll(self) -> None:
        assert self.waiting is not None
        self.waiting = (self.waiting[0], self.waiting[1] + 1)

    def close(self) -> None:
        """Stops waiting, releases the store (if built here) and the process group."""
        self.stop_event.set()
        try:
            self._pool.shutdown(wait=True)
            self.sparse.close()
            if self.negatives is not None:
                self.negatives.close()
            if self._own_store:
                self.store.close()
            self.staging.release()
        finally:
            # always: a gloo group left to the interpreter's exit aborts the process
            # (std::terminate, pytorch/pytorch#190489) instead of reporting what failed
            if self._own_group:
                ddp.shutdown()

    def __enter__(self) -> OnlineTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def dense_copy(self) -> DLRMDense:
        """A detached CPU copy of the dense model (export, comparisons)."""
        return copy.deepcopy(self.dense).cpu().eval()
