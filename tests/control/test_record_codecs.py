"""The record codecs: a pass record (``PassRecord``), a job's hash (``JobRecord``), a
trigger (``TriggerRecord``) and a command (``Command``), each field round-tripped, hashes and
entries as the code before the codecs wrote them read back the same (a job started before an
upgrade goes on after it), the API's writes byte for byte what that code wrote, and hostile
values refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import redis
from streamrec.api.models import JobCreate, TriggerCreate
from streamrec.api.pass_records import PassRecords
from streamrec.api.public import pass_public
from streamrec.api.repo import Repo
from streamrec.api.state import JobAction
from streamrec.control import keys, redis_io
from streamrec.control.channel import TrainerChannel
from streamrec.control.codec import ContractError
from streamrec.control.commands import Command, CommandType
from streamrec.control.records import (
    PASS_METRICS,
    JobField,
    JobRecord,
    PassField,
    PassRecord,
    TriggerRecord,
    pass_figures,
)
from streamrec.control.states import JobState, PassState, TriggerState
from streamrec.control.work import WorkItem
from streamrec.layout import PassSpec

#: A pass record with every field away from its empty value.
EVERY_PASS = PassRecord(
    day="20190720",
    pass_id=3,
    splits=("0000", "0005"),
    state=PassState.DONE,
    attempts=2,
    retired=1,
    failures=1,
    skipped_splits=("0005",),
    resume_from="20190720/2",
    queued_at=1764270000.125,
    started_at=1764270001.5,
    finished_at=1764270013.75,
    rolled_back_at=1764270020.25,
    ranks=2,
    error="trainer error: boom",
    predict_auc=0.7512,
    train_auc=0.76,
    logloss=0.45,
    best_auc=0.7512,
    samples=1000,
    malformed_lines=4,
    seconds=12.5,
    predict_top_share=0.004,
    predict_collapsed=False,
    train_top_share=1.0,
    train_collapsed=True,
    predictions_collapsed=True,
    batch_size=64,
)
#: Its hash: the string forms the API wrote before the codec (times 3 decimals, figures repr).
EVERY_PASS_FIELDS = {
    "day": "20190720",
    "pass_id": "3",
    "splits": '["0000", "0005"]',
    "state": "done",
    "attempts": "2",
    "retired": "1",
    "failures": "1",
    "skipped_splits": '["0005"]',
    "resume_from": "20190720/2",
    "queued_at": "1764270000.125",
    "started_at": "1764270001.500",
    "finished_at": "1764270013.750",
    "rolled_back_at": "1764270020.250",
    "ranks": "2",
    "error": "trainer error: boom",
    "predict_auc": "0.7512",
    "train_auc": "0.76",
    "logloss": "0.45",
    "best_auc": "0.7512",
    "samples": "1000",
    "malformed_lines": "4",
    "seconds": "12.5",
    "predict_top_share": "0.004",
    "predict_collapsed": "false",
    "train_top_share": "1.0",
    "train_collapsed": "true",
    "predictions_collapsed": "true",
    "batch_size": "64",
}
EVERY_JOB = JobRecord(
    id="0123456789abcdef",
    name="ctr",
    spec='{"name": "ctr"}',
    trainer_config='{"online": {}}',
    state=JobState.RUNNING,
    created_at=1764270000.125,
    updated_at=1764270001.5,
    started_at=1764270001.5,
    passes_total=48,
    passes_done=7,
    cursor=8,
    in_flight="20190720/8",
    last_checkpoint="20190720/6",
    error="pass 20190720/5: bad data",
    waiting_for="20190720/0800",
    trainers="assigned",
    group="g1",
    last_group="g0",
    restarts=2,
    restarts_total=5,
    not_before=1764270030.0,
)
EVERY_JOB_FIELDS = {
    "id": "0123456789abcdef",
    "name": "ctr",
    "spec": '{"name": "ctr"}',
    "trainer_config": '{"online": {}}',
    "state": "running",
    "created_at": "1764270000.125",
    "updated_at": "1764270001.500",
    "started_at": "1764270001.500",
    "passes_total": "48",
    "passes_done": "7",
    "cursor": "8",
    "in_flight": "20190720/8",
    "last_checkpoint": "20190720/6",
    "error": "pass 20190720/5: bad data",
    "waiting_for": "20190720/0800",
    "trainers": "assigned",
    "group": "g1",
    "last_group": "g0",
    "restarts": "2",
    "restarts_total": "5",
    "not_before": "1764270030.000",
}


def _every_field_set(record: object) -> None:
    empty = type(record)()
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        assert getattr(record, f.name) != getattr(empty, f.name), f.name


def test_the_records_hold_every_field_name_and_only_those():
    assert [f.name for f in dataclasses.fields(PassRecord)] == [f.value for f in PassField]
    assert [f.name for f in dataclasses.fields(JobRecord)] == [f.value for f in JobField]
    _every_field_set(EVERY_PASS)
    _every_field_set(EVERY_JOB)


@pytest.mark.parametrize(
    ("record", "fields"),
    [(EVERY_PASS, EVERY_PASS_FIELDS), (EVERY_JOB, EVERY_JOB_FIELDS)],
    ids=["pass", "job"],
)
def test_every_field_round_trips_in_the_string_forms_of_before(record, fields):
    assert record.to_fields() == fields
    assert type(record).from_fields(fields) == record
    empty = type(record)()
    assert type(record).from_fields(empty.to_fields()) == empty  # None as "" and back


def test_patch_writes_only_the_fields_it_is_given():
    assert PassRecord.patch(state=PassState.RUNNING, started_at=1764270001.5, ranks=2) == {
        "state": "running",
        "started_at": "1764270001.500",
        "ranks": "2",
    }
    assert JobRecord.patch(in_flight=None, cursor=3, restarts=0) == {
        "in_flight": "",
        "cursor": "3",
        "restarts": "0",
    }
    # figures as a JSON report carries them: an int for a float, a count as 12.0
    assert PassRecord.patch(seconds=12, samples=1000.0, logloss=0.5) == {
        "seconds": "12",
        "samples": "1000",
        "logloss": "0.5",
    }


# ---- records as the code before the codecs wrote them -----------------------------------
#: A pass handed out, taken, done (hand_out, mark_running, mark_done of the old repository).
OLD_DONE_PASS = {
    "day": "20190720",
    "pass_id": "3",
    "splits": '["0000", "0005"]',
    "state": "done",
    "attempts": "1",
    "failures": "0",
    "skipped_splits": "[]",
    "resume_from": "",
    "queued_at": "1764270000.123",
    "started_at": "1764270001.456",
    "ranks": "2",
    "predict_auc": "0.7512",
    "logloss": "0.45",
    "samples": "1000.0",  # a count the old agent sent as a float: repr'd
    "seconds": "12",
    "error": "",
    "finished_at": "1764270013.789",
}
#: The oldest records: written before retired, failures and skipped_splits existed.
OLDEST_QUEUED_PASS = {
    "day": "20190720",
    "pass_id": "0",
    "splits": '["0000"]',
    "state": "queued",
    "attempts": "1",
    "resume_from": "",
    "queued_at": "1764270000.123",
}


def test_a_pass_record_of_the_old_repository_reads_and_shows_as_before():
    rec = PassRecord.from_fields(OLD_DONE_PASS)
    assert (rec.state, rec.attempts, rec.retired, rec.failures) == (PassState.DONE, 1, 0, 0)
    assert (rec.samples, rec.seconds, rec.train_auc, rec.resume_from) == (1000, 12.0, None, None)
    assert pass_public(rec).model_dump() == {
        "day": "20190720",
        "pass_id": 3,
        "splits": ["0000", "0005"],
        "state": PassState.DONE,
        "attempts": 1,
        "failures": 0,
        "resume_from": None,
        "skipped_splits": [],
        "predict_auc": 0.7512,
        "train_auc": None,
        "logloss": 0.45,
        "best_auc": None,
        "samples": 1000,
        "malformed_lines": None,
        "seconds": 12.0,
        "predict_top_share": None,
        "predict_collapsed": None,
        "train_top_share": None,
        "train_collapsed": None,
        "predictions_collapsed": None,
        "batch_size": None,
        "ranks": 2,
        "queued_at": 1764270000.123,
        "started_at": 1764270001.456,
        "finished_at": 1764270013.789,
        "error": None,
    }
    oldest = PassRecord.from_fields(OLDEST_QUEUED_PASS)
    assert (oldest.retired, oldest.failures, oldest.skipped_splits) == (0, 0, ())
    assert oldest.pass_id == 0 and oldest.ranks is None


#: A job's hash as the old create wrote it (no started_at, pool, restart or wait fields yet).
OLD_CREATED_JOB = {
    "id": "0123456789abcdef",
    "name": "ctr",
    "spec": '{"name": "ctr"}',
    "trainer_config": '{"online": {}}',
    "state": "created",
    "created_at": "1764270000.123",
    "updated_at": "1764270000.123",
    "passes_total": "48",
    "passes_done": "0",
    "cursor": "0",
    "in_flight": "",
    "last_checkpoint": "",
    "error": "",
}


def test_a_job_hash_of_the_old_create_reads_with_empty_values():
    rec = JobRecord.from_fields(OLD_CREATED_JOB)
    assert rec == JobRecord(
        id="0123456789abcdef",
        name="ctr",
        spec='{"name": "ctr"}',
        trainer_config='{"online": {}}',
        state=JobState.CREATED,
        created_at=1764270000.123,
        updated_at=1764270000.123,
        passes_total=48,
    )
    # written back, the fields the old create wrote are the bytes it wrote
    assert {k: rec.to_fields()[k] for k in OLD_CREATED_JOB} == OLD_CREATED_JOB
    # a job stored before the API kept its trainer config: the field reads ""
    without = {k: v for k, v in OLD_CREATED_JOB.items() if k != "trainer_config"}
    assert JobRecord.from_fields(without).trainer_config == ""


# ---- hostile values ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "fields", "named"),
    [
        (
            PassRecord,
            {"attempts": "two"},
            "pass record: field 'attempts' must be an integer, got 'two'",
        ),
        (PassRecord, {"pass_id": "3.5"}, "'pass_id' must be an integer.*'3.5'"),
        (PassRecord, {"failures": "1e400"}, "'failures' must be an integer.*'1e400'"),
        (PassRecord, {"splits": "[0]"}, "'splits' must be a JSON list of strings.*'\\[0\\]'"),
        (PassRecord, {"skipped_splits": "{"}, "'skipped_splits' must be a JSON list.*'{'"),
        (PassRecord, {"state": "exploded"}, "'state' must be one of 'queued'.*'exploded'"),
        (PassRecord, {"predict_auc": "high"}, "'predict_auc' must be a number.*'high'"),
        (PassRecord, {"logloss": "nan"}, "'logloss' must be a finite number.*'nan'"),
        (PassRecord, {"queued_at": "yesterday"}, "'queued_at' must be a number.*'yesterday'"),
        (
            PassRecord,
            {"train_collapsed": "True"},
            "'train_collapsed' must be true or false.*'True'",
        ),
        (PassRecord, {"predictions_collapsed": "1"}, "'predictions_collapsed' must be true or"),
        (PassRecord, {"batch_size": "auto"}, "'batch_size' must be an integer.*'auto'"),
        (JobRecord, {"state": "sleeping"}, "job record: field 'state' must be one of.*'sleeping'"),
        (JobRecord, {"passes_done": "many"}, "'passes_done' must be an integer.*'many'"),
        (JobRecord, {"not_before": "soon"}, "'not_before' must be a number.*'soon'"),
    ],
)
def test_a_hostile_record_is_refused_naming_the_field_and_value(cls, fields, named):
    with pytest.raises(ContractError, match=named):
        cls.from_fields(fields)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"samples": "12"}, "'samples' must be an integer.*'12'"),
        ({"samples": 12.5}, "'samples' must be an integer.*12.5"),
        ({"ranks": True}, "'ranks' must be an integer.*True"),
        ({"state": "exploded"}, "'state' must be one of.*'exploded'"),
        ({"predict_auc": float("nan")}, "'predict_auc' must be a finite number"),
        ({"splits": ("0000", 5)}, "'splits' must be a list of strings"),
        ({"predictions_collapsed": 1}, "'predictions_collapsed' must be true or false.*1"),
        ({"train_top_share": True}, "'train_top_share' must be a number.*True"),
        ({"batch_size": True}, "'batch_size' must be an integer.*True"),
    ],
)
def test_a_hostile_update_is_refused_naming_the_field_and_value(values, named):
    with pytest.raises(ContractError, match=named):
        PassRecord.patch(**values)


def test_a_reports_figures_are_kept_by_their_fields_kind():
    """A trainer's pass record: each figure of PASS_METRICS of its field's kind is kept (a
    flag true or false, another figure a number), the rest (another kind, None, a record's
    other keys) left out; what is kept patches the record."""
    record = {
        "samples": 1500,
        "seconds": 0.5,
        "train_top_share": 1.0,
        "train_collapsed": True,
        "predict_collapsed": False,
        "predictions_collapsed": 1,  # no flag: left out
        "predict_top_share": None,
        "batch_size": 64,
        "logloss": True,  # no number: left out
        "predicted_ctr": 0.3,  # no field of the record
    }
    figures = pass_figures(record)
    assert figures == {
        PassField.SAMPLES: 1500,
        PassField.SECONDS: 0.5,
        PassField.TRAIN_TOP_SHARE: 1.0,
        PassField.TRAIN_COLLAPSED: True,
        PassField.PREDICT_COLLAPSED: False,
        PassField.BATCH_SIZE: 64,
    }
    assert set(figures) <= set(PASS_METRICS)
    assert PassRecord.patch(**{k.value: v for k, v in figures.items()})["predict_collapsed"] == (
        "false"
    )


def test_an_update_naming_no_field_is_a_bug_not_a_write():
    with pytest.raises(TypeError, match="nope"):
        PassRecord.patch(nope=1)


# ---- triggers -----------------------------------------------------------------------------
def test_a_trigger_round_trips_in_the_string_forms_of_before():
    # a finished export as the API before the record wrote it: at create, then its outcome
    fields = {
        "id": "5f0c9d2e41aa",
        "kind": "export",
        "mode": "delta",
        "state": "done",
        "created_at": "1764270000.123",
        "finished_at": "1764270009.500",
        "result": '{"path": "/models/20190720/delta-3"}',
    }
    rec = TriggerRecord.from_fields(fields)
    assert rec == TriggerRecord(
        id="5f0c9d2e41aa",
        kind=CommandType.EXPORT,
        mode="delta",
        state=TriggerState.DONE,
        created_at=1764270000.123,
        finished_at=1764270009.5,
        result='{"path": "/models/20190720/delta-3"}',
    )
    assert rec.to_fields() == dict(fields, error="")
    # a checkpoint, pending: no mode ("" as written), no outcome yet
    pending = TriggerRecord.from_fields(
        {"id": "t1", "kind": "checkpoint", "mode": "", "state": "pending", "created_at": "5"}
    )
    assert (pending.mode, pending.finished_at, pending.result) == (None, None, None)
    with pytest.raises(ContractError, match="trigger record: field 'kind' must be one of"):
        TriggerRecord.from_fields({"id": "t1", "kind": "reindex"})


# ---- commands -----------------------------------------------------------------------------
def test_a_command_round_trips_every_field():
    sent = Command(CommandType.EXPORT, "delta", "5f0c9d2e41aa", 1764270000.125, "7-0")
    fields = sent.to_fields()
    assert fields == {
        "type": "export",
        "mode": "delta",
        "trigger_id": "5f0c9d2e41aa",
        "ts": "1764270000.125",
    }
    assert Command.from_fields("7-0", fields) == sent


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # the old API's stop: type and ts only
        ({"type": "stop", "ts": "1764270000.123"}, Command("stop", None, None, 1764270000.123)),
        (
            {"type": "checkpoint", "mode": "", "trigger_id": "t1", "ts": "1764270000.123"},
            Command("checkpoint", None, "t1", 1764270000.123),
        ),
        # a type this trainer does not know is kept as sent, for the agent to log
        ({"type": "reindex", "ts": "5"}, Command("reindex", None, None, 5.0)),
        ({"mode": "base"}, Command("", "base", None, 0.0)),
    ],
)
def test_a_command_of_the_old_api_decodes(fields, expected):
    assert Command.from_fields("3-0", fields) == dataclasses.replace(expected, msg_id="3-0")


@pytest.mark.parametrize("ts", ["soon", "inf", "nan"])
def test_a_hostile_command_time_is_refused_naming_the_field_and_value(ts):
    with pytest.raises(ContractError, match=f"command: field 'ts' must be a .*'{ts}'"):
        Command.from_fields("3-0", {"type": "stop", "ts": ts})


# ---- through Redis, as the API and the trainers use them --------------------------------
def _running_job(r: redis.Redis, job_id: str, started_at: float, root: Path) -> None:
    """A running job's hash (written by its codec), its state index and streams."""
    data = {"train_data_dir": str(root / "data"), "start_day": "20190720", "end_day": "20190720"}
    spec = JobCreate.model_validate(
        {"name": job_id, "data": data, "checkpoint": {"model_save_path": str(root / "model")}}
    )
    job = dataclasses.replace(
        EVERY_JOB, id=job_id, spec=spec.model_dump_json(), in_flight=None, started_at=started_at
    )
    redis_io.hset(r, keys.job(job_id), job.to_fields())
    r.sadd(keys.jobs_in_state(JobState.RUNNING.value), job_id)
    r.xgroup_create(keys.commands(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)
    r.xgroup_create(keys.work(job_id), keys.TRAINER_GROUP, id="0", mkstream=True)


@pytest.mark.timeout(60)
def test_commands_the_api_writes_are_the_commands_the_trainers_read(redis_server, tmp_path):
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    job = "record-codecs-cmd"
    _running_job(r, job, 1000.0, tmp_path)
    # issued before the job's last start: dropped unread
    redis_io.xadd(r, keys.commands(job), Command(CommandType.STOP, ts=999.0).to_fields())
    ch = TrainerChannel(redis_server.url, job, "g1", timeout_s=5)
    try:
        repo = Repo(r)
        trigger = repo.create_trigger(job, TriggerCreate(kind="export", mode="delta"))
        repo.act(job, JobAction.STOP)
        taken = ch.take_commands()
        assert [(c.type, c.mode, c.trigger_id) for c in taken] == [
            ("export", "delta", trigger.id),
            ("stop", None, None),
        ]
        assert all(c.ts > 1000.0 and c.msg_id for c in taken)
        entries = redis_io.xrange(r, keys.commands(job), "-", "+", 10)
        assert [Command.from_fields(i, f) for i, f in entries][1:] == taken
        assert entries[-1][1] == {
            "type": "stop",
            "mode": "",
            "trigger_id": "",
            "ts": f"{taken[-1].ts:.3f}",
        }
        assert repo.job_record(job).state == JobState.STOPPING
        # the trigger's hash: the fields the API wrote before its record, no others
        assert r.hgetall(keys.trigger(job, trigger.id)) == {
            "id": trigger.id,
            "kind": "export",
            "mode": "delta",
            "state": "pending",
            "created_at": f"{taken[0].ts:.3f}",
        }
    finally:
        ch.close()
        r.close()


@pytest.mark.timeout(60)
def test_the_repository_writes_pass_records_as_the_old_code_did(redis_server, tmp_path):
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    job = "record-codecs-pass"
    _running_job(r, job, 1000.0, tmp_path)
    passes = PassRecords(r)
    try:
        item = WorkItem("", PassSpec("20190720", 3, ("0000", "0005")), 2, "20190720/2")
        passes.hand_out(job, 2, item, failures=1)
        rec = keys.pass_record(job, "20190720", 3)
        written = redis_io.hgetall(r, rec)
        queued_at = written.pop("queued_at")
        assert written == {  # the old hand_out's fields, in its forms
            "day": "20190720",
            "pass_id": "3",
            "splits": '["0000", "0005"]',
            "state": "queued",
            "attempts": "2",
            "failures": "1",
            "skipped_splits": "[]",
            "resume_from": "20190720/2",
        }
        assert f"{float(queued_at):.3f}" == queued_at
        job_fields = redis_io.hgetall(r, keys.job(job))
        assert (job_fields["in_flight"], job_fields["cursor"]) == ("20190720/3", "3")
        assert passes.counts(job, "20190720", 3).attempts == 2
        passes.mark_running(job, "20190720", 3, ranks=2)
        figures = {PassField.PREDICT_AUC: 0.75, PassField.SAMPLES: 1000, PassField.SECONDS: 12}
        passes.mark_done(job, "20190720", 3, figures, 2, in_flight=True, event=("done", {}))
        done = redis_io.hgetall(r, rec)
        assert (done["state"], done["ranks"], done["error"]) == ("done", "2", "")
        assert (done["predict_auc"], done["samples"], done["seconds"]) == ("0.75", "1000", "12")
        after = redis_io.hgetall(r, keys.job(job))
        assert (after["in_flight"], after["restarts"], after["passes_done"]) == ("", "0", "8")
        shown = Repo(r).get_pass(job, "20190720", 3)
        assert (shown.state, shown.samples, shown.ranks) == (PassState.DONE, 1000, 2)
        # a bad figure is refused by name before anything is written
        with pytest.raises(ContractError, match="'samples' must be an integer"):
            passes.mark_done(job, "20190720", 3, {PassField.SAMPLES: "many"}, 2, False, ("x", {}))
        assert redis_io.hgetall(r, rec) == done
        assert json.loads(done["splits"]) == ["0000", "0005"]
    finally:
        r.close()
