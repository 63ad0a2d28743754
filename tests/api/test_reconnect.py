"""The trainers' channel outlives a Redis restart (kill -9, then the same port and the same
append-only file): a call made while Redis is down waits for it and goes through, what was
written before the kill is still there, and a pass whose delivery was lost with the
connection is taken again (and only that: a pass held, or a predecessor's, is not)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from servers import RedisServer, free_port
from streamrec.control import keys, redis_io
from streamrec.control.channel import ReportKind, TrainerChannel

JOB = "j-reconnect"


@pytest.fixture
def aof_redis(tmp_path: Path):
    server = RedisServer(free_port(), tmp_path / "redis")
    server.dir.mkdir()
    server.start(appendonly=True)
    yield server
    server.stop()


def kill_hard(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    server.proc = None


def test_a_report_made_while_redis_restarts_waits_and_lands(aof_redis: RedisServer) -> None:
    channel = TrainerChannel(aof_redis.url, JOB, "group-a", timeout_s=5)
    try:
        channel.report(ReportKind.ERROR, message="before the kill")
        kill_hard(aof_redis)
        with pytest.raises(redis.ConnectionError):  # down: a plain client fails at once
            redis.Redis(port=aof_redis.port, socket_connect_timeout=0.5, retry=None).ping()
        waited: list[float] = []

        def report() -> None:
            t0 = time.monotonic()
            channel.report(ReportKind.ERROR, message="during the outage")
            waited.append(time.monotonic() - t0)

        reporter = threading.Thread(target=report)
        reporter.start()
        time.sleep(2.0)  # the outage (started here: a child dies with the thread that made it)
        aof_redis.start(appendonly=True)
        reporter.join(timeout=30)
        assert not reporter.is_alive() and waited, "the report did not go through"
        assert waited[0] >= 1.9, waited  # it waited for the restart instead of failing
        entries = redis_io.xrange(channel.r, keys.reports(JOB), "-", "+", 10)
        messages = [json.loads(f["data"])["message"] for _, f in entries]
        assert messages == ["before the kill", "during the outage"]  # the AOF kept the first
    finally:
        channel.close()


def test_a_pass_delivered_with_a_lost_reply_is_taken_again(aof_redis: RedisServer) -> None:
    r = aof_redis.client()
    work = keys.work(JOB)
    r.xgroup_create(work, keys.TRAINER_GROUP, id="0", mkstream=True)
    redis_io.xadd(
        r, work, {"day": "20190720", "pass_id": "3", "splits": '["0000"]', "attempt": "1"}
    )
    # a predecessor of the same name took one and died: not this group's to take
    assert redis_io.read_group(r, keys.TRAINER_GROUP, "group-a", work, ">", 1)
    time.sleep(0.01)  # delivered strictly before the channel below is made
    channel = TrainerChannel(aof_redis.url, JOB, "group-a", timeout_s=5)
    try:
        assert channel.take_pass(block_ms=10) is None
        redis_io.xadd(
            r, work, {"day": "20190720", "pass_id": "4", "splits": '["0600"]', "attempt": "1"}
        )
        # this channel's XREADGROUP ran, its reply never arrived: pending for it, unseen
        assert redis_io.read_group(r, keys.TRAINER_GROUP, "group-a", work, ">", 1)
        item = channel.take_pass(block_ms=10)
        assert item is not None and (item.spec.day, item.spec.pass_id) == ("20190720", 4)
        channel.ack_pass(item)
        assert channel.take_pass(block_ms=10) is None  # taken once, then acknowledged
        redis_io.xadd(
            r, work, {"day": "20190720", "pass_id": "5", "splits": '["1200"]', "attempt": "1"}
        )
        item = channel.take_pass(block_ms=1000)
        assert item is not None and item.spec.pass_id == 5
        # held (taken, not yet acknowledged): pending, but not handed back a second time
        assert channel.take_pass(block_ms=10) is None
    finally:
        channel.close()
        r.close()
