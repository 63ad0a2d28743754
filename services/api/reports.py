"""The trainers' reports, applied to the job's Redis state: pass outcomes, checkpoints,
trigger outcomes, group start and stop, errors.

Each tick the scheduler reads the job's report stream with consumer group ``api`` (first
this consumer's pending entries, left by a crash, then new ones), applies each and XACKs it.
Applying is idempotent (a pass already done stays done) and a report about an earlier
attempt of a pass handed out again is ignored (a ``stale_report`` event). A malformed report
is an event, never an exception out of the scheduler.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streamrec.api.errors import ApiError
from streamrec.api.lineage import job_plan
from streamrec.api.metrics import ApiMetrics
from streamrec.api.models import stored_spec
from streamrec.api.pass_records import RequeueCause, Restart
from streamrec.api.repo import Repo
from streamrec.api.state import JobAction, JobState, PassState, TriggerState
from streamrec.control import keys
from streamrec.control.channel import CommandType
from streamrec.control.codec import encode
from streamrec.control.records import PASS_METRICS, JobRecord, TriggerRecord, pass_figures
from streamrec.control.reports import (
    Checkpoint,
    Claimed,
    Error,
    ErrorClass,
    Fatal,
    PassDone,
    PassFailed,
    Phase,
    Released,
    ReportKind,
    Started,
    Stopped,
    TriggerDone,
    TriggerFailed,
    decode_report,
)


class Requeuer(Protocol):
    """The scheduler's ``requeue``: the pass in flight back from the last checkpoint."""

    def __call__(
        self,
        job_id: str,
        job: JobRecord,
        reason: str,
        cause: RequeueCause,
        skip: Sequence[str] = (),
    ) -> None: ...


class ReportApplier:
    """Applies one job's reports at a time.

    Args:
        repo: the API's Redis repository.
        metrics: where pass, checkpoint and trigger outcomes are counted.
        requeue: the scheduler's ``requeue(job_id, job, reason, cause, skip=)`` (a failed
            pass goes back from the last checkpoint, or fails the job).
        ack_work: acknowledges the pass in flight on the job's work stream.
        restart: the scheduler's ``_restart(job, n)``: the ``n``-th infrastructure restart
            in a row of the job's group and its backoff.
        restart_budget: the scheduler's ``_restart_budget(job)``: the restarts in a row the
            job may have.
    """

    def __init__(
        self,
        repo: Repo,
        metrics: ApiMetrics,
        requeue: Requeuer,
        ack_work: Callable[[str], None],
        restart: Callable[[JobRecord, int], Restart],
        restart_budget: Callable[[JobRecord], int],
    ) -> None:
        self.repo = repo
        self.passes = repo.passes
        self.work = repo.work
        self.metrics = metrics
        self._requeue = requeue
        self._ack_work = ack_work
        self._restart = restart
        self._restart_budget = restart_budget
        #: ``_on_<kind>`` for every report kind (streamrec.control.channel.ReportKind).
        self._handlers: dict[ReportKind, Callable[[str, Any], None]] = {
            kind: getattr(self, f"_on_{kind.value}") for kind in ReportKind
        }

    def apply(self, job_id: str, max_batches: int = 10) -> int:
        """Applies the trainers' reports (own pending first, then new); returns how many."""
        n = 0
        for start in ("0", ">"):
            for _ in range(max_batches):
                msgs = self.work.reports(job_id, start, 100)
                if not msgs:
                    break
                for msg_id, fields in msgs:
                    if fields:
                        self._apply_one(job_id, msg_id, fields)
                    self.work.ack_report(job_id, msg_id)
                    n += 1
                if start == "0":
                    break  # pending ones are re-read only once per tick
        return n

    def _apply_one(self, job_id: str, msg_id: str, fields: dict[str, str]) -> None:
        kind = fields.get("type", "")
        try:
            report = decode_report(fields)
            self._handlers[report.KIND](job_id, report)
        except (ValueError, KeyError, TypeError) as exc:
            self.repo.append_event(
                job_id,
                "bad_report",
                f"report {msg_id} ({kind!r}) ignored: {exc}",
                {"id": msg_id},
            )
            if kind == ReportKind.PASS_FAILED.value:
                self._retry_unreadable_failure(job_id, fields)
        except ApiError as exc:  # e.g. a transition no longer allowed: record it, go on
            self.repo.append_event(
                job_id,
                "bad_report",
                f"report {msg_id} ({kind!r}) not applied: {exc}",
                {"id": msg_id},
            )

    def _retry_unreadable_failure(self, job_id: str, fields: dict[str, str]) -> None:
        """A ``pass_failed`` this API cannot read in full (an error class it does not know,
        from a newer trainer, say) still names a pass its group has given up: retried as a
        transient failure, not left in flight until the group is declared stuck."""
        try:
            data = json.loads(fields.get("data") or "{}")
            attempt = data.get("attempt")
            report = PassFailed(
                day=str(data["day"]),
                pass_id=int(data["pass_id"]),
                attempt=None if attempt is None else int(attempt),
                error=f"(unreadable report) {str(data.get('error', ''))[:400]}",
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not even the pass it names: the stuck-group check recovers the job
        self._on_pass_failed(job_id, report)

    def _event(self, job_id: str, kind: str, message: str, data: dict[str, Any]) -> None:
        self.repo.append_event(job_id, kind, message, data)

    def _on_started(self, job_id: str, report: Started) -> None:
        """A group is up for the job, its model at ``resumed_from``: the passes done after
        that are not in the model the job goes on from (a group restarted after a kill
        between a pass's report and its checkpoint): rolled back and trained again. That
        is an infrastructure restart (the metric, the budget), even when nothing else saw
        it (no pass in flight)."""
        message = f"trainer group up: {report.ranks} rank(s)"
        if report.resharded:
            message += f"; checkpoint {report.resumed_from} resharded {report.resharded} shards"
        self._event(job_id, "trainer", message, encode(report))
        resumed = report.resumed_from
        if resumed:
            keys.parse_pass_key(resumed)  # a malformed key is a bad report
        job = self.repo.job_record(job_id)
        if not job.spec:
            return
        why = f"a trainer group started from {resumed or 'a fresh model'}"
        rolled, restart = self.passes.rewind_to_group(
            job_id,
            job_plan(stored_spec(job.spec)),
            resumed,
            why,
            lambda n: self._restart(job, n),
        )
        if rolled:
            self.metrics.passes_requeued.labels(job_id).inc(len(rolled))
        if restart is None:
            return
        self.metrics.group_restarts.labels(job_id).inc()
        budget = self._restart_budget(job)
        if restart.n > budget:
            msg = (
                f"{why}; restart budget spent ({restart.n} restarts in a row, "
                f"resources.restart_budget {budget})"
            )
            self.repo.set_error(job_id, msg)
            self.repo.change_state(job_id, JobAction.FAIL, reason=msg)

    def _stale(self, job_id: str, report: Claimed | PassDone | PassFailed | Released) -> bool:
        """A report about an earlier attempt of a pass that was handed out again."""
        if report.attempt is None:
            return False
        current, retired = self.passes.attempts(job_id, report.day, report.pass_id)
        if report.attempt == current and report.attempt > retired:
            return False
        self._event(
            job_id,
            "stale_report",
            f"report for attempt {report.attempt} of "
            f"{keys.pass_key(report.day, report.pass_id)} ignored (attempt {current} is current)",
            encode(report),
        )
        return True

    def _on_claimed(self, job_id: str, report: Claimed) -> None:
        pk = keys.pass_key(report.day, report.pass_id)
        if (
            self._stale(job_id, report)
            or self.passes.state(job_id, report.day, report.pass_id) != PassState.QUEUED.value
        ):
            return
        self.passes.mark_running(job_id, report.day, report.pass_id, report.ranks)
        self._event(job_id, "pass", f"pass {pk} started on {report.ranks} rank(s)", {"pass": pk})

    def _on_pass_done(self, job_id: str, report: PassDone) -> None:
        pk = keys.pass_key(report.day, report.pass_id)
        current = self.passes.state(job_id, report.day, report.pass_id)
        if current is None or current == PassState.DONE.value or self._stale(job_id, report):
            return
        record = report.record
        figures = pass_figures(record)
        job = self.repo.job_record(job_id)
        shown = ", ".join(
            f"{k}={record[k]:.4f}"
            for k in ("predict_auc", "train_auc", "logloss")
            if isinstance(record.get(k), int | float)
        )
        collapsed = record.get("predictions_collapsed")
        self.passes.mark_done(
            job_id,
            report.day,
            report.pass_id,
            figures,
            report.ranks,
            in_flight=job.in_flight == pk,
            event=(
                f"pass {pk} done" + (f": {shown}" if shown else ""),
                {"pass": pk, **{k: record.get(k) for k in PASS_METRICS}},
            ),
            more_events=[collapse_event(pk, record)] if collapsed is True else [],
        )
        if isinstance(collapsed, bool):  # a trainer from before the flag sends none
            self.metrics.pass_predictions_collapsed.labels(job_id).set(int(collapsed))
        self._ack_work(job_id)
        self.metrics.passes_done.labels(job_id).inc()
        for kind in ("predict", "train", "best"):
            v = record.get(f"{kind}_auc")
            if isinstance(v, int | float):
                self.metrics.pass_auc.labels(job_id, kind).set(v)
        for kind, name in (("predict", "predict_logloss"), ("train", "logloss")):
            if isinstance(record.get(name), int | float):
                self.metrics.pass_logloss.labels(job_id, kind).set(record[name])
        for kind in ("predicted", "actual"):
            if isinstance(record.get(f"{kind}_ctr"), int | float):
                self.metrics.pass_ctr.labels(job_id, kind).set(record[f"{kind}_ctr"])
        if isinstance(record.get("seconds"), int | float):
            self.metrics.pass_seconds.labels(job_id).observe(record["seconds"])
        if isinstance(record.get("samples"), int) and record["samples"] >= 0:
            self.metrics.pass_samples.labels(job_id).inc(record["samples"])
        if record.get("samples") == 0:  # done, yet nothing trained: no AUC, no update
            self.metrics.empty_passes.labels(job_id).inc()
            self._event(
                job_id,
                "empty_pass",
                f"pass {pk} had 0 samples: its splits held no usable line (no AUC, the model "
                f"unchanged)",
                {"pass": pk},
            )

    def _on_pass_failed(self, job_id: str, report: PassFailed) -> None:
        pk = keys.pass_key(report.day, report.pass_id)
        job = self.repo.job_record(job_id)
        if job.in_flight != pk or self._stale(job_id, report):
            return
        error = f"trainer error: {report.error[:500]}"
        if report.phase == Phase.SAVE:
            self.metrics.checkpoint_failures.labels(job_id).inc()
        if report.error_class == ErrorClass.STORE_LOST:  # the store's fault, not the pass's
            self._requeue(
                job_id,
                job,
                f"a store shard lost the job's rows (restarted empty): the job goes back to "
                f"{job.last_checkpoint or 'its start'}: {error}",
                RequeueCause.REWIND,
            )
            return
        if report.error_class == ErrorClass.INFRA:  # a shard or the sampler unreachable
            self._requeue(job_id, job, error, RequeueCause.RESTART)
            return
        if report.error_class == ErrorClass.TRANSIENT:  # retried from the last checkpoint
            self._requeue(job_id, job, error, RequeueCause.PASS_FAILED)
            return
        policy = stored_spec(job.spec).data.on_bad_split
        bad = list(report.bad_splits[:64])
        if policy == "skip" and bad:
            reason = f"bad data, skipped: {error}"
            self._requeue(job_id, job, reason, RequeueCause.SKIP_SPLITS, skip=bad)
        else:  # a retry cannot pass
            reason = f"bad data (on_bad_split: {policy}): {error}"
            self._requeue(job_id, job, reason, RequeueCause.BAD_DATA)

    def _on_checkpoint(self, job_id: str, report: Checkpoint) -> None:
        pk = keys.pass_key(report.day, report.pass_id)
        self.repo.set_last_checkpoint(job_id, pk)
        self.metrics.checkpoints.labels(job_id).inc()
        self.metrics.last_checkpoint.labels(job_id).set(time.time())
        self._event(
            job_id,
            "checkpoint",
            f"checkpoint {pk} at {report.path}",
            {"pass": pk, "path": report.path},
        )

    def _finish_trigger(self, job_id: str, report: TriggerDone | TriggerFailed) -> None:
        tid = report.trigger_id
        trigger = self.repo.trigger_record(job_id, tid)
        if trigger is None or trigger.kind is None:
            raise ValueError(f"unknown trigger {tid!r}")
        kind = trigger.kind
        if isinstance(report, TriggerDone):
            state = TriggerState.DONE
            outcome = {"result": json.dumps(report.result)}
        else:
            state, outcome = TriggerState.FAILED, {"error": report.error[:2000]}
        fields = TriggerRecord.patch(state=state, finished_at=time.time(), **outcome)
        self.repo.finish_trigger(job_id, tid, fields)
        self.metrics.triggers.labels(kind.value, state.value).inc()
        # a trigger refused for want of a model (before the first pass, after a failed one)
        # is no failed save: it must not page as one
        failed_save = isinstance(report, TriggerFailed) and not report.refused
        if kind == CommandType.CHECKPOINT and failed_save:
            self.metrics.checkpoint_failures.labels(job_id).inc()
        self._event(
            job_id,
            "trigger",
            f"trigger {tid} ({kind.value}) {state.value}",
            {"trigger_id": tid, **{k: v for k, v in fields.items() if k != "state"}},
        )

    def _on_trigger_done(self, job_id: str, report: TriggerDone) -> None:
        self._finish_trigger(job_id, report)

    def _on_trigger_failed(self, job_id: str, report: TriggerFailed) -> None:
        self._finish_trigger(job_id, report)

    def _on_stopped(self, job_id: str, report: Stopped) -> None:
        if self.repo.job_state(job_id) == JobState.STOPPING.value:
            self.repo.change_state(job_id, JobAction.TRAINERS_STOPPED, reason="trainers stopped")

    def _on_released(self, job_id: str, report: Released) -> None:
        """A group told to end (SIGTERM) gave its pass back: handed out again, no failure of
        the pass, a restart of the group."""
        pk = keys.pass_key(report.day, report.pass_id)
        job = self.repo.job_record(job_id)
        if job.in_flight != pk or self._stale(job_id, report):
            return
        # SIGTERM: an evicted or deleted pod, or torchrun stopping the ranks that survived
        # one that died; an infrastructure restart either way (budget, backoff), found at once
        reason = "released by a trainer group that was stopped"
        self._requeue(job_id, job, reason, RequeueCause.RESTART)

    def _on_error(self, job_id: str, report: Error) -> None:
        self._event(job_id, "failure", f"trainer error: {report.message[:2000]}", encode(report))

    def _on_fatal(self, job_id: str, report: Fatal) -> None:
        """A trainer cannot run this job at all (e.g. its config is invalid): fail it."""
        msg = report.message[:2000]
        self.repo.set_error(job_id, msg)
        self.repo.change_state(job_id, JobAction.FAIL, reason=msg)


#: The pass record's collapse figures (the trainer's ``evaluation.collapse_figures``), kept
#: in a ``predictions_collapsed`` event.
COLLAPSE_FIGURES = (
    "predictions_collapsed",
    "train_collapsed",
    "train_top_share",
    "train_auc",
    "predict_collapsed",
    "predict_top_share",
    "predict_auc",
    "predicted_ctr",
    "actual_ctr",
)


def collapse_event(pk: str, record: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The ``predictions_collapsed`` event of pass ``pk`` (kind, message, data): each phase
    whose predictions collapsed with its share of rows at one probability and its AUC."""

    def number(v: Any, spec: str) -> str:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        return format(v, spec) if ok else "n/a"

    phases = [
        f"{phase}: {number(record.get(f'{phase}_top_share'), '.1%')} of rows at one "
        f"probability, AUC {number(record.get(f'{phase}_auc'), '.4f')}"
        for phase in ("train", "predict")
        if record.get(f"{phase}_collapsed") is True
    ]
    message = (
        f"pass {pk}: the model's predictions collapsed ({'; '.join(phases) or 'n/a'}); "
        f"predicted CTR {number(record.get('predicted_ctr'), '.4f')} against "
        f"{number(record.get('actual_ctr'), '.4f')} actual: the model ranks nothing"
    )
    data = {k: record.get(k) for k in COLLAPSE_FIGURES}
    return "predictions_collapsed", message, {"pass": pk, **data}
