"""The trainer agent: each rank's loop when the control plane (streamrec.api) drives the job.

Run one per rank under torchrun (the entry: :mod:`streamrec.trainer.agent`, its flags:
:mod:`.cli`)::

    torchrun --nproc-per-node 2 -m streamrec.trainer.agent \\
        --redis-url redis://127.0.0.1:6379/0 --job-id 3f2a...

Every rank reads the job's trainer config from Redis (computed and validated by the API when
the job was created; validated again here with :class:`TrainerConfig`), builds its
:class:`OnlineTrainer` (joining torch.distributed when ``WORLD_SIZE > 1``, checking the job's
``resources.trainer_ranks`` against it and the shards' tier against ``store.tier``) and
warm-starts. A job this group cannot run is reported ``fatal`` (the API fails it, with the
message). Then, step by step::

    rank 0                                   every rank
    ------                                   ----------
    commands (checkpoint/export/shrink/stop)
    or the next pass from the work stream  ->  broadcast as int64 tensors  ->  run it
    report the outcome, XACK the pass (a command: XACK once carried out)

Only rank 0 talks to Redis for work (``TrainerChannel``: take, ack, report, heartbeat); the
step reaches the other ranks as two int64 tensors (a header and the split names as HHMM
integers), never pickled. Rank 0 renews the group's heartbeat from a thread, with the
group's progress (last step, last pass, when it last moved); when the group dies the
control plane hands the pass in flight out again, from the last checkpoint, to the next
group.

Lineage: a group loads exactly the checkpoint the API names (the job's ``last_checkpoint``
at start, a work item's ``resume_from`` when its model is not the state after the item's
``after`` pass), never "the newest on disk", and trains a pass only on the state after its
``after`` pass: any other model lacks passes the job counts done, so the pass fails
``store_lost`` untrained and the API rewinds the job to its checkpoint. The ``started``
report's ``resumed_from`` tells the API where a (re)started group stands, and a pass is
reported done before its checkpoint, so the job's last checkpoint never names a pass the API
has not counted. A pass fails on every rank together
(:class:`~streamrec.trainer.errors.PassFailed`, classified ``data`` or ``transient``); rank 0
reports it and the group takes the next step. Every rank runs a :class:`Watchdog`: a rank
that made no progress for ``--stuck-timeout-s`` while working exits (code 4), so its
supervisor restarts the group.

The API hands a pass out once all its splits have landed, so a group idles while the job
waits for data; rank 0 keeps the job's ``runner.data_wait_timeout_second`` there
(:class:`~streamrec.trainer.data.run_plan.DataWait`): once the job's next pass has waited longer
(counted while the job runs), it reports ``fatal`` naming the pass, the splits missing and
the donefile, and the API fails the job (the group is free for another).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from streamrec.control import keys, reports
from streamrec.control.channel import (
    TERMINAL_STATES,
    CommandType,
    TrainerChannel,
    WorkItem,
)
from streamrec.control.states import JobState
from streamrec.control.trainer_config import OnlineMode, TrainerConfig
from streamrec.errors import BadRequest, NotFound, StreamRecError
from streamrec.trainer import distributed as ddp
from streamrec.trainer import faults
from streamrec.trainer.agent.job_guard import JobGuard
from streamrec.trainer.agent.liveness import TERMINATING, Heartbeat, Watchdog
from streamrec.trainer.agent.steps import COMMAND_OPS, Op, SpecialLoad, Step, broadcast_step
from streamrec.trainer.data.run_plan import DataWait
from streamrec.trainer.device import config_device
from streamrec.trainer.errors import BadSplits, LineageLost, PassFailed, error_class
from streamrec.trainer.model.pass_log import PASSES_FILE, mark_rolled_back

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore
    from streamrec.trainer.runner import OnlineTrainer

log = logging.getLogger("streamrec.trainer.agent")


class Agent:
    """One rank's side of a control-plane driven job.

    Args:
        redis_url / job_id: where the job lives.
        heartbeat_ttl_s: the group counts as dead this long after rank 0's last beat.
        poll_ms: how long rank 0 waits on the work stream per step.
        store: passed to OnlineTrainer (None: built from the job's store endpoints).
        stuck_timeout_s: the watchdog's limit on working without progress (None: no
            watchdog).
        metrics_port: overrides the job's ``runner.metrics_port`` (local rank r serves
            /metrics on this port + r; 0: a free port); None: the job's.
        metrics_host: overrides the job's ``runner.metrics_host``; None: the job's.
        serve_metrics: False when the process already serves /metrics (a pooled group's
            rank serves it for its whole life, not per job).
        group: the pooled group's name (None: a group pinned to this job).
        still_assigned: rank 0 of a pooled group: whether the pool still gives it this job.
        generation: a pooled group's assignment generation (only grows), sent with every
            store request: a shard refuses it once a newer group wrote there, so a group that
            froze and lost its job cannot write into the new group's rows (None: not fenced).
    """

    def __init__(
        self,
        redis_url: str,
        job_id: str,
        heartbeat_ttl_s: float = 10.0,
        poll_ms: int = 500,
        store: SparseStore | None = None,
        stuck_timeout_s: float | None = 300.0,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        serve_metrics: bool = True,
        group: str | None = None,
        guard: JobGuard | None = None,
        still_assigned: Callable[[], bool] | None = None,
        generation: int | None = None,
    ) -> None:
        self.rank, self.world = ddp.env_world()
        self.generation = generation
        #: rank 0 of a pooled group: whether the control plane still gives it this job (a
        #: group back from a restart after its job went to another must not train it too)
        self.still_assigned = still_assigned
        #: this trainer's own limits on a job read from Redis (job_guard.py)
        self.guard = guard or JobGuard()
        #: runner fields this process sets over the job's (where its /metrics is: a
        #: property of the node it runs on, not of the job)
        self.runner_overrides: dict[str, Any] = {
            k: v
            for k, v in (("metrics_port", metrics_port), ("metrics_host", metrics_host))
            if v is not None
        }
        if not serve_metrics:
            self.runner_overrides["metrics_port"] = None
        self.group = group
        self.job_id = job_id
        self.poll_ms = poll_ms
        consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.channel = TrainerChannel(redis_url, job_id, consumer, heartbeat_ttl_s)
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.store = store
        self.pending: deque[Step] = deque()
        #: rank 0: the work item taken and not yet acknowledged (released on SIGTERM)
        self.holding: WorkItem | None = None
        #: whether this agent made the process group (a pinned group; a pooled one has its own)
        self._own_group = False
        self.trainer: OnlineTrainer | None = None
        #: rank 0: how long the job's next pass has waited to land (made by ``start``)
        self.data_wait: DataWait | None = None
        self.heart: Heartbeat | None = None
        #: time.monotonic() since when this rank works on a step (None: idle).
        self.busy_since: float | None = None
        self.last_progress = time.monotonic()
        self.watchdog = (
            Watchdog(stuck_timeout_s, lambda: self.busy_since, self._progress_at, self._stuck_limit)
            if stuck_timeout_s
            else None
        )

    # ---- set-up ------------------------------------------------------------------------
    def config(self) -> TrainerConfig:
        """The job's trainer config (every rank reads it; only rank 0 takes work)."""
        config = self.channel.trainer_config(self.runner_overrides)
        shards = self.guard.shards_now(config.store.endpoints, _shard_count)
        if shards is not None:
            log.warning(
                "the job lists %d store shard(s), the store now runs %d: the job goes on with "
                "them (its checkpoint resharded %d -> %d)",
                *(len(config.store.endpoints), len(shards)) * 2,
            )
            store = config.store.model_copy(update={"endpoints": shards})
            config = config.model_copy(update={"store": store})
        self.guard.check(config)  # Redis is not trusted more than a REST body
        # the assignment's generation, never the job's (a job naming one would fence its
        # own groups out): set here only, None for a pinned group
        store = config.store.model_copy(update={"generation": self.generation})
        return config.model_copy(update={"store": store})

    def start(self) -> None:
        from streamrec.trainer.runner import OnlineTrainer  # lazy: the model stack, slow to load

        try:
            config = self.config()
            device = config_device(config)  # runner.device cuda without a GPU: fatal
        except StreamRecError as exc:
            self._fatal(exc)
            raise
        # the group outlives the job's trainer (a fresh start replaces the trainer)
        _, _, self._own_group = ddp.init_from_env(
            config.distributed.backend, config.distributed.timeout_s, device
        )
        self.job_config = config
        self.data_wait = DataWait(config.runner, config.runner.train_data_dir)
        if self.rank == 0:  # beat from the start: warm start may take a while
            self.heart = Heartbeat(
                self.channel,
                self.heartbeat_ttl_s,
                self.progress,
                ranks=self.world,
                host=socket.gethostname(),
                group=self.group,
            )
            self.heart.start()
        try:
            self.trainer = OnlineTrainer(config, store=self.store, job_id=self.job_id)
        except BadRequest as exc:  # wrong world size or tier, tables the shards refuse
            self._fatal(exc)
            raise
        except StreamRecError as exc:  # e.g. a shard not up: worth an event, then a retry
            if self.rank == 0:
                self.channel.send(
                    reports.Error(message=f"the trainer group could not start: {exc}")
                )
            raise
        if self.watchdog is not None:
            self.watchdog.start()
        try:
            resumed = self.resume()
        except BadRequest as exc:  # a checkpoint of another model shape: no group can run it
            self._fatal(exc)
            raise
        if self.rank == 0:
            self.channel.send(
                reports.Started(
                    ranks=self.world,
                    threads=torch.get_num_threads(),
                    host=socket.gethostname(),
                    group=self.group,
                    resumed_from=layout_key(resumed),
                    resharded=self.job_trainer.resharded if resumed else None,
                )
            )

    def resume(self) -> tuple[str, int] | None:
        """Loads the checkpoint the API names as the job's last (none: a fresh model)."""
        named = self.channel.job().get("last_checkpoint") if self.rank == 0 else None
        found = parse_key(named)
        load = torch.tensor(
            [int(found[0]) if found else 0, found[1] if found else 0], dtype=torch.int64
        )
        if ddp.active():
            dist.broadcast(load, 0)
        if not int(load[0]):
            self.start_fresh(replace_trainer=False)
            return None
        found_key = (f"{int(load[0]):08d}", int(load[1]))
        loaded = self.job_trainer.load_checkpoint(*found_key)
        self.mark_rolled_back(found_key)
        return loaded

    def start_fresh(self, replace_trainer: bool = True) -> None:
        """Every rank: the job from its very start (no checkpoint to go back to): the job's
        rows in the store dropped (its own namespace only: rows left by a group that died
        would otherwise be trained on again) and the trainer made anew (a fresh dense model,
        store clients that create the job's tables again) when ``replace_trainer`` or rows
        were dropped; every pass on record rolled back."""
        from streamrec.trainer.runner import OnlineTrainer  # lazy: the model stack, slow to load

        own_rows = bool(self.job_config.store.namespace) and self.store is None
        if own_rows and self.rank == 0:
            from streamrec.embedding_store import EmbeddingStoreClient  # lazy: C++ extension

            client = self.job_trainer.store  # the job's own client (no store was given)
            assert isinstance(client, EmbeddingStoreClient)
            dropped = client.drop_namespace()
            log.info("fresh start: the job's rows dropped from the store (%s)", dropped)
        ddp.barrier()
        if replace_trainer or own_rows:
            self.job_trainer.close()
            # /metrics stays where the first trainer served it
            runner = self.job_config.runner.model_copy(update={"metrics_port": None})
            self.trainer = OnlineTrainer(
                self.job_config.model_copy(update={"runner": runner}),
                store=self.store,
                job_id=self.job_id,
            )
        self.mark_rolled_back(None)

    def mark_rolled_back(self, after: tuple[str, int] | None) -> None:
        """Rank 0: ``passes.jsonl`` marks the passes after ``after`` (all: None) rolled back,
        as the API marks their records: the model the job goes on from lacks them."""
        if self.rank == 0:
            rolled = mark_rolled_back(self.job_trainer.model_root / PASSES_FILE, after)
            if rolled:
                log.info("passes.jsonl: %s rolled back", ", ".join(rolled))

    @property
    def job_trainer(self) -> OnlineTrainer:
        """The trainer of the job this agent runs (made by ``open_job``)."""
        assert self.trainer is not None, "no job opened yet"
        return self.trainer

    def _stuck_limit(self) -> float:
        """The watchdog's limit now: the job's checkpoint timeout while the trainer saves or
        loads a checkpoint (minutes of store I/O without a step), else --stuck-timeout-s."""
        assert self.watchdog is not None
        t = self.trainer
        if t is not None and t.phase in ("save", "load"):
            return max(self.watchdog.timeout_s, t.config.distributed.checkpoint_timeout_s)
        return self.watchdog.timeout_s

    def _progress_at(self) -> float:
        t = self.trainer
        return max(self.last_progress, t.progress_at if t is not None else 0.0)

    def progress(self) -> dict[str, Any]:
        """What the heartbeat says of the group's progress (wall-clock ``progress_ts``)."""
        t = self.trainer
        quiet = time.monotonic() - self._progress_at()
        return {
            "step": t.step if t is not None else 0,
            "last_pass": layout_key(t.last_pass) if t is not None else None,
            "busy": self.busy_since is not None,
            "progress_ts": time.time() - quiet,
        }

    def _fatal(self, exc: Exception) -> None:
        """Rank 0 tells the control plane this group cannot run the job (it fails the job)."""
        log.error("job %s cannot run here: %s", self.job_id, exc)
        if self.rank == 0:
            self.channel.send(reports.Fatal(message=str(exc)))

    # ---- rank 0: what next --------------------------------------------------------------
    def next_step(self) -> Step:
        if self.still_assigned is not None and not self.still_assigned():
            log.warning("job %s was given to another group: this group stops it", self.job_id)
            return Step(Op.EXIT)
        for cmd in self.channel.take_commands():
            try:
                op = COMMAND_OPS[CommandType(cmd.type)]
            except ValueError:
                log.warning("unknown command %r ignored", cmd.type)
                self.channel.ack_command(cmd)
                continue
            self.pending.append(Step(op, mode=cmd.mode, command=cmd))
        if self.pending:
            return self.pending.popleft()
        try:
            state = self.channel.state()
        except NotFound:
            return Step(Op.EXIT)
        if state in TERMINAL_STATES:
            return Step(Op.EXIT)
        item = self.channel.take_pass(block_ms=self.poll_ms)
        if item is None:
            self.check_data_wait(state)
            return Step(Op.IDLE)
        self.holding = item
        return Step(
            Op.PASS, item.spec, item.attempt, load=self.load_for(item), skip=item.skip, item=item
        )

    def check_data_wait(self, state: str) -> None:
        """Rank 0, idle in job state ``state``: once the job's next pass has waited for its
        donefiles longer than ``runner.data_wait_timeout_second`` (counted while the job
        runs), reports ``fatal`` naming the pass, the splits missing and the donefile: the API
        fails the job, and the next step finds it so. A split that has not landed is not bad
        data a retry or ``on_bad_split: skip`` could pass: the job ends, saying what to land
        (``start`` waits again, from the last checkpoint)."""
        assert self.data_wait is not None, "start() makes it"
        try:
            self.data_wait.check(self.job_trainer.last_pass, state == JobState.RUNNING)
        except BadSplits as exc:
            log.error("job %s: %s", self.job_id, exc)
            self.channel.send(reports.Fatal(message=str(exc)))

    def load_for(self, item: WorkItem) -> tuple[str, int] | SpecialLoad | None:
        """The checkpoint to load before ``item``: none when this group's model is the
        state after ``item.after``; else the one the API names (``resume_from``, or the
        job's last checkpoint), but only when it *is* the state after ``item.after``.

        Any other model lacks passes the job counts done (a group back from a restart at an
        older checkpoint than the last pass done, a kill between a pass's report and the
        next): ``LOST``, so the pass fails ``store_lost`` before training and the API
        rewinds the job to its checkpoint. Training on would drop those passes from the
        model while REST calls them done."""
        t = self.job_trainer
        here = layout_key(t.last_pass) if t.clean else "dirty"
        if here == item.after:
            return None
        named = item.resume_from or self.channel.job().get("last_checkpoint") or None
        if named is None and item.after is None:
            log.warning(
                "pass %s/%s: the model is at %s and there is no checkpoint to go back to: "
                "the job starts afresh",
                item.spec.day,
                item.spec.pass_id,
                here,
            )
            return SpecialLoad.FRESH
        if named != item.after:
            log.warning(
                "pass %s/%s: the model is at %s, not after %s, and no checkpoint holds %s: "
                "the job goes back to %s",
                item.spec.day,
                item.spec.pass_id,
                here,
                item.after,
                item.after,
                named or "its start",
            )
            return SpecialLoad.LOST
        return parse_key(named)

    # ---- every rank: do it --------------------------------------------------------------
    def run(self) -> int:
        """The loop; returns when the job is finished, stopped or deleted."""
        try:
            self.start()
            while True:
                step = broadcast_step(self.next_step() if self.rank == 0 else None, self.rank)
                if step.op in (Op.EXIT, Op.STOP):
                    if step.op == Op.STOP and self.rank == 0:
                        self.channel.send(reports.Stopped())
                        if step.command is not None:
                            self.channel.ack_command(step.command)
                    return 0
                if step.op == Op.IDLE:
                    continue
                self.busy_since = time.monotonic()
                try:
                    if step.op == Op.PASS:
                        self.do_pass(step)
                    else:
                        self.do_command(step)
                finally:
                    self.busy_since = None
                    self.last_progress = time.monotonic()
        finally:
            self.close()

    def do_pass(self, step: Step) -> None:
        t = self.job_trainer
        spec = step.spec
        assert spec is not None
        if self.rank == 0:
            self.channel.send(
                reports.Claimed(spec.day, spec.pass_id, ranks=self.world, attempt=step.attempt)
            )
        try:
            if step.load == SpecialLoad.LOST:
                raise LineageLost(
                    f"the model lacks the passes before {spec.day}/{spec.pass_id} that the job "
                    "counts done, and no checkpoint holds them"
                )
            if step.load == SpecialLoad.FRESH:
                self.start_fresh()
                t = self.job_trainer
            elif isinstance(step.load, tuple):
                t.load_checkpoint(*step.load)  # exactly the one the API names
                self.mark_rolled_back(step.load)
            record = t.run_pass(spec, step.skip)
        except (StreamRecError, OSError, ValueError) as exc:
            log.exception("pass %s/%s failed", spec.day, spec.pass_id)
            if self.rank == 0:
                failed = exc if isinstance(exc, PassFailed) else None
                self.channel.send(
                    reports.PassFailed(
                        spec.day,
                        spec.pass_id,
                        attempt=step.attempt,
                        error=f"{type(exc).__name__}: {exc}",
                        error_class=error_class(exc),
                        phase=failed.phase if failed else reports.Phase.TRAIN,
                        bad_splits=failed.bad_splits if failed else (),
                    )
                )
                assert step.item is not None
                self.channel.ack_pass(step.item)
                self.holding = None
            return
        if self.rank == 0:
            # done first, then its checkpoint: the job's last checkpoint never names a pass
            # the API has not counted done (a kill between the two leaves the job at its
            # previous checkpoint, and the restarted group's resumed_from rewinds it)
            self.channel.send(
                reports.PassDone(
                    spec.day, spec.pass_id, ranks=self.world, attempt=step.attempt, record=record
                )
            )
            faults.after_pass_done()
            if record.get("checkpoint"):  # written by this pass, complete
                self.channel.send(
                    reports.Checkpoint(spec.day, spec.pass_id, path=str(record["checkpoint"]))
                )
            assert step.item is not None
            self.channel.ack_pass(step.item)
            self.holding = None

    def do_command(self, step: Step) -> None:
        t = self.job_trainer
        cmd = step.command
        try:
            if t.last_pass is None:
                raise NotFound("no pass trained or loaded yet: nothing to save or shrink")
            if not t.clean:  # a checkpoint of it would name a pass it is not the state after
                raise NotFound(
                    "the last pass failed: the model is no pass's state until the pass is "
                    "trained again from its checkpoint; nothing to save or shrink"
                )
            day, pass_id = t.last_pass
            if step.op == Op.CHECKPOINT:
                path = t.save_checkpoint(day, pass_id)
                result: dict[str, Any] = {"path": str(path), "day": day, "pass_id": pass_id}
            elif step.op == Op.EXPORT and step.mode == OnlineMode.ONLINE:
                from streamrec.trainer.model.online import export_online  # lazy: serving Redis

                result = export_online(t)  # a base, published to the serving Redis
            elif step.op == Op.EXPORT:
                assert step.mode is not None  # an export step carries its mode
                path = t.save_model(step.mode, day, pass_id)  # pass_id: a delta's
                result = {"path": str(path), "mode": step.mode, "day": day}
            else:
                result = {"deleted": t.shrink()}
        except (StreamRecError, OSError, ValueError) as exc:
            if self.rank == 0 and cmd is not None:
                if cmd.trigger_id:
                    self.channel.send(
                        reports.TriggerFailed(
                            cmd.trigger_id,
                            error=f"{type(exc).__name__}: {exc}",
                            refused=isinstance(exc, NotFound),  # no model to save or shrink
                        )
                    )
                self.channel.ack_command(cmd)
            return
        if self.rank == 0:
            if step.op == Op.CHECKPOINT:
                self.channel.send(reports.Checkpoint(day, pass_id, path=result["path"]))
            if cmd is not None:
                if cmd.trigger_id:
                    self.channel.send(reports.TriggerDone(cmd.trigger_id, result=result))
                self.channel.ack_command(cmd)

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.holding is not None and TERMINATING.is_set():  # SIGTERM mid-pass: give it back
            item, self.holding = self.holding, None
            try:
                self.channel.send(
                    reports.Released(item.spec.day, item.spec.pass_id, attempt=item.attempt)
                )
                self.channel.ack_pass(item)
            except Exception as exc:  # Redis gone: the heartbeat's expiry requeues it
                log.warning("could not release pass %s: %s", item.spec.pass_id, exc)
        if self.heart is not None:
            self.heart.stop()
            try:
                self.channel.clear_heartbeat()
            except Exception as exc:  # Redis gone: the TTL ends the heartbeat anyway
                log.warning("could not clear the heartbeat: %s", exc)
        if self.trainer is not None:
            self.trainer.close()
        if self._own_group:
            ddp.shutdown()
        self.channel.close()


def _shard_count(endpoint: str) -> int | None:
    """The shard count the store shard at ``endpoint`` says (None: it did not answer)."""
    from streamrec.embedding_store import shard_count  # lazy: the C++ extension

    try:
        return shard_count(endpoint)
    except StreamRecError as exc:
        log.warning("store shard %s did not say its shard count: %s", endpoint, exc)
        return None


def layout_key(found: tuple[str, int] | None) -> str | None:
    """("20190720", 3) -> ``"20190720/3"`` (:func:`streamrec.control.keys.pass_key`); None
    -> None."""
    return None if found is None else keys.pass_key(*found)


def parse_key(key: str | None) -> tuple[str, int] | None:
    """``"20190720/3"`` -> ("20190720", 3); None or "" -> None."""
    return keys.parse_pass_key(key) if key else None
