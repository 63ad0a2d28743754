"""The control contract's codecs: work items and every report kind, each field round-tripped,
hostile values refused by name, and records as the code before the typed contract wrote
them (a job created before an upgrade finishes after it)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from streamrec.control import keys, redis_io
from streamrec.control.channel import TrainerChannel
from streamrec.control.codec import ContractError
from streamrec.control.reports import (
    REPORTS,
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
    encode_report,
    report_from_data,
)
from streamrec.control.work import WorkItem
from streamrec.layout import PassSpec

#: One report of every kind, every field set away from its default.
EVERY_REPORT = [
    Started(
        ranks=4,
        threads=8,
        host="node-1",
        group="g-7",
        resumed_from="20190720/2",
        resharded="2 -> 3",
    ),
    Claimed("20190720", 3, ranks=4, attempt=2),
    PassDone(
        "20190720",
        3,
        ranks=4,
        attempt=2,
        record={"predict_auc": 0.71, "samples": 30, "checkpoint": "/m/20190720/3"},
    ),
    PassFailed(
        "20190720",
        3,
        attempt=2,
        error="DataError: bad line",
        error_class=ErrorClass.DATA,
        phase=Phase.SAVE,
        bad_splits=("0000", "0005"),
    ),
    Checkpoint("20190720", 3, path="/m/20190720/3"),
    TriggerDone("t-1", result={"path": "/m/x", "mode": "delta"}),
    TriggerFailed("t-2", error="NotFound: no pass trained", refused=True),
    Stopped(),
    Released("20190720", 3, attempt=2),
    Error(message="the trainer group could not start"),
    Fatal(message="bad trainer config"),
]


def test_every_report_kind_has_a_dataclass_and_a_case_here():
    assert set(REPORTS) == set(ReportKind)
    assert {r.KIND for r in EVERY_REPORT} == set(ReportKind)


@pytest.mark.parametrize("report", EVERY_REPORT, ids=lambda r: r.KIND.value)
def test_every_report_round_trips_every_field(report):
    fields = encode_report(report, 1764270000.5)
    assert fields["type"] == report.KIND.value and fields["ts"] == "1764270000.500"
    back = decode_report(fields)
    assert back == report
    for f in dataclasses.fields(report):
        # every field off its default, so a field the codec dropped would show
        assert getattr(back, f.name) == getattr(report, f.name)
        if f.default is not dataclasses.MISSING:
            assert getattr(report, f.name) != f.default, f"{report.KIND}: {f.name} at default"


def test_a_work_item_round_trips_every_field():
    item = WorkItem(
        "1-0",
        PassSpec("20190720", 3, ("0000", "0005", "0010")),
        attempt=2,
        resume_from="20190720/1",
        after="20190720/2",
        skip=("0005",),
    )
    fields = item.to_fields(1764270000.25)
    assert all(isinstance(v, str) for v in fields.values())
    assert fields["ts"] == "1764270000.250"
    assert WorkItem.from_fields("1-0", fields) == item
    first = WorkItem("", PassSpec("20190720", 1, ("0000",)), 1, None)
    assert WorkItem.from_fields("", first.to_fields(0.0)) == first


# ---- records written by the code before the typed contract, literally --------------------
def test_a_work_entry_of_the_old_scheduler_decodes():
    old = {
        "day": "20190720",
        "pass_id": "2",
        "splits": '["0005", "0010"]',
        "attempt": "3",
        "resume_from": "20190720/1",
        "after": "",
        "skip": "[]",
        "ts": "1764270000.123",
    }
    item = WorkItem.from_fields("5-0", old)
    assert item == WorkItem("5-0", PassSpec("20190720", 2, ("0005", "0010")), 3, "20190720/1")
    # the oldest entries had neither attempt, after nor skip
    bare = {"day": "20190720", "pass_id": "1", "splits": '["0000"]', "resume_from": ""}
    assert WorkItem.from_fields("6-0", bare) == WorkItem(
        "6-0", PassSpec("20190720", 1, ("0000",)), 1, None
    )


OLD_REPORTS = {
    "started": (
        '{"ranks": 2, "threads": 4, "host": "h", "group": "g", "resumed_from": null}',
        Started(2, 4, "h", "g", None),
    ),
    "claimed": (
        '{"day": "20190720", "pass_id": 1, "ranks": 2, "attempt": 1}',
        Claimed("20190720", 1, 2, 1),
    ),
    "pass_done": (
        '{"day": "20190720", "pass_id": 1, "ranks": 2, "attempt": 1, '
        '"record": {"predict_auc": null, "samples": 0}}',
        PassDone("20190720", 1, 2, 1, {"predict_auc": None, "samples": 0}),
    ),
    "pass_failed": (
        '{"day": "20190720", "pass_id": 1, "attempt": 1, "error": "ShardRestarted: gone", '
        '"error_class": "store_lost", "phase": "train", "bad_splits": []}',
        PassFailed("20190720", 1, 1, "ShardRestarted: gone", ErrorClass.STORE_LOST),
    ),
    "checkpoint": (
        '{"day": "20190720", "pass_id": 1, "path": "/m/20190720/1"}',
        Checkpoint("20190720", 1, "/m/20190720/1"),
    ),
    "trigger_done": (
        '{"trigger_id": "t", "result": {"deleted": 3}}',
        TriggerDone("t", {"deleted": 3}),
    ),
    "trigger_failed": (
        '{"trigger_id": "t", "error": "disk full"}',
        TriggerFailed("t", "disk full"),
    ),
    "stopped": ("{}", Stopped()),
    "released": ('{"day": "20190720", "pass_id": 1, "attempt": 1}', Released("20190720", 1, 1)),
    "error": ('{"message": "m"}', Error("m")),
    "fatal": ('{"message": "m"}', Fatal("m")),
}


@pytest.mark.parametrize("kind", sorted(OLD_REPORTS))
def test_a_report_of_the_old_agent_decodes(kind):
    data, expected = OLD_REPORTS[kind]
    assert decode_report({"type": kind, "data": data, "ts": "1764270000.000"}) == expected


def test_a_refused_trigger_of_the_old_agent_is_still_known_as_refused():
    """Before ``refused`` existed a refused command was known by its error's type; a report
    that carries the field is read by the field alone."""
    old = report_from_data("trigger_failed", {"trigger_id": "t", "error": "NotFound: no pass"})
    assert old == TriggerFailed("t", "NotFound: no pass", refused=True)
    new = report_from_data(
        "trigger_failed", {"trigger_id": "t", "error": "NotFound: x", "refused": False}
    )
    assert new.refused is False


def test_reports_of_old_senders_without_optional_fields_take_the_old_defaults():
    assert report_from_data("claimed", {"day": "20190720", "pass_id": 1}) == Claimed(
        "20190720", 1, ranks=1, attempt=None
    )
    failed = report_from_data("pass_failed", {"day": "20190720", "pass_id": 1})
    assert failed.error_class == ErrorClass.TRANSIENT and failed.phase == Phase.TRAIN


# ---- hostile values ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "data", "named"),
    [
        ("claimed", {"pass_id": 1}, "field 'day' is missing"),
        ("claimed", {"day": "20190720", "pass_id": "1"}, "field 'pass_id' must be an integer"),
        ("claimed", {"day": "20190720", "pass_id": True}, "field 'pass_id' must be an integer"),
        ("claimed", {"day": 20190720, "pass_id": 1}, "field 'day' must be a string, got 20190720"),
        (
            "pass_failed",
            {"day": "d", "pass_id": 1, "error_class": "cosmic_ray"},
            "field 'error_class' must be one of 'data', 'store_lost', 'infra', 'transient', "
            "got 'cosmic_ray'",
        ),
        ("pass_failed", {"day": "d", "pass_id": 1, "phase": "lunch"}, "field 'phase'.*'lunch'"),
        ("pass_failed", {"day": "d", "pass_id": 1, "bad_splits": [1]}, "'bad_splits'.*\\[1\\]"),
        ("pass_done", {"day": "d", "pass_id": 1, "record": [1]}, "field 'record' must be an obj"),
        ("started", {"resumed_from": 5}, "field 'resumed_from' must be a string, got 5"),
        ("trigger_failed", {"trigger_id": "t", "refused": "yes"}, "'refused'.*'yes'"),
        ("trigger_done", {"result": {}}, "field 'trigger_id' is missing"),
        ("fatal", ["m"], "report 'fatal': must be an object"),
        ("pass_dnoe", {}, "report field 'type': 'pass_dnoe' is not a valid ReportKind"),
    ],
)
def test_a_hostile_report_is_refused_naming_the_field_and_value(kind, data, named):
    with pytest.raises(ContractError, match=named):
        report_from_data(kind, data)


def test_report_data_that_is_no_json_is_refused_by_name():
    with pytest.raises(ContractError, match="field 'data' must be JSON, got '{nope'"):
        decode_report({"type": "stopped", "data": "{nope"})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"pass_id": "1", "splits": "[]"}, "work item: field 'day' is missing"),
        ({"day": "d", "splits": "[]"}, "work item: field 'pass_id' is missing"),
        ({"day": "d", "pass_id": "one", "splits": "[]"}, "'pass_id' must be an integer.*'one'"),
        ({"day": "d", "pass_id": "1"}, "work item: field 'splits' is missing"),
        ({"day": "d", "pass_id": "1", "splits": "[0]"}, "'splits' must be a JSON list of str"),
        ({"day": "d", "pass_id": "1", "splits": "{"}, "'splits' must be a JSON list.*'{'"),
        ({"day": "d", "pass_id": "1", "splits": "[]", "attempt": "x"}, "'attempt'.*'x'"),
        ({"day": "d", "pass_id": "1", "splits": "[]", "skip": '"0000"'}, "'skip'.*'\"0000\"'"),
    ],
)
def test_a_hostile_work_entry_is_refused_naming_the_field_and_value(fields, named):
    with pytest.raises(ContractError, match=named):
        WorkItem.from_fields("1-0", fields)


# ---- through Redis, as the trainers and the scheduler use them ----------------------------
@pytest.mark.timeout(60)
def test_reports_and_work_items_cross_a_real_redis(redis_server):
    job = "contract-job"
    ch = TrainerChannel(redis_server.url, job, "g1", timeout_s=5)
    try:
        ch.r.xgroup_create(keys.work(job), keys.TRAINER_GROUP, id="0", mkstream=True)
        sent = WorkItem("", PassSpec("20190720", 1, ("0000",)), 2, "20190719/4", "20190719/5")
        redis_io.xadd(ch.r, keys.work(job), sent.to_fields(1.0))
        taken = ch.take_pass(block_ms=2000)
        assert taken is not None and dataclasses.replace(taken, msg_id="") == sent
        for report in EVERY_REPORT:
            ch.send(report)
        ch.report("pass_done", day="20190720", pass_id=1, record={"logloss": float("nan")})
        entries = redis_io.xrange(ch.r, keys.reports(job), "-", "+", 100)
        got = [decode_report(fields) for _, fields in entries]
        assert got[:-1] == EVERY_REPORT
        assert got[-1] == PassDone("20190720", 1, record={"logloss": None})  # JSON has no NaN
        assert json.loads(entries[-1][1]["data"])["record"] == {"logloss": None}
        with pytest.raises(ContractError, match="'pass_id' must be an integer"):
            ch.report("claimed", day="20190720", pass_id="1")  # refused before it is sent
        assert len(redis_io.xrange(ch.r, keys.reports(job), "-", "+", 100)) == len(entries)
    finally:
        ch.close()
