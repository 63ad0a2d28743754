"""``runner.data_wait_timeout_second``: a pass whose donefiles do not land in time fails as
bad data naming the pass, the splits missing and the donefile, whether the trainer runs on
its own (``OnlineTrainer.run``) or under the control plane (the agent, idle while the API
waits for the pass to land: the job fails, its trainer group freed)."""

from __future__ import annotations

import threading
import time

import pytest
from agent_helpers import SMALL_MODEL, datagen, small_job, started_job
from servers import wait_for
from streamrec import layout
from streamrec.control.reports import ErrorClass
from streamrec.datagen.planted import StreamParams, generate
from streamrec.trainer.data.run_plan import DataWait
from streamrec.trainer.errors import BadSplits, error_class
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import SLOTS, small_config

NO_SAVES = {"checkpoint_per_pass": 0, "save_base_at_day_end": False}


def test_a_pass_not_landed_in_time_fails_as_bad_data_naming_the_missing_split(tmp_path):
    data = tmp_path / "data"
    # one pass of both splits of the day; only the first lands
    generate(data, "20190720", 1, 720, 200, params=StreamParams(slots=SLOTS, seed=5), max_splits=1)
    cfg = small_config(
        data,
        tmp_path / "m",
        end_day="20190720",
        split_per_pass=2,
        data_wait_timeout_second=0.3,
        data_sleep_second=30,  # a poll's sleep does not outlast the timeout
        **NO_SAVES,
    )
    t0 = time.monotonic()
    with OnlineTrainer(cfg) as t, pytest.raises(BadSplits) as raised:
        t.run()
    assert time.monotonic() - t0 < 20
    exc = raised.value
    assert error_class(exc) == ErrorClass.DATA and exc.bad_splits == ("1200",)
    assert str(exc).startswith(
        f"pass 20190720/1: split(s) 20190720/1200 have no donefile 'to.hadoop.done' under "
        f"{data} after "
    )
    assert "(data_wait_timeout_second=0.3)" in str(exc)
    assert "0000" not in str(exc)  # the split that landed is not named


def test_data_wait_counts_the_time_one_pass_is_not_ready(tmp_path):
    data = tmp_path / "data"
    cfg = small_config(data, tmp_path / "m", end_day="20190720", data_wait_timeout_second=10)
    now = [100.0]
    wait = DataWait(cfg.runner, data, clock=lambda: now[0])
    wait.check(None)  # pass 1 (split 0000) not there: the clock starts
    now[0] += 10
    wait.check(None)  # 10 s: not longer than the timeout
    wait.check(None, waiting=False)  # the job paused: it starts afresh
    now[0] += 10.5
    wait.check(None)
    now[0] += 10.5
    with pytest.raises(BadSplits, match=r"pass 20190720/1: split\(s\) 20190720/0000 have no"):
        wait.check(None)
    wait.check(None)  # reported once: the clock starts afresh
    layout_split = data / "20190720" / "1200"
    layout_split.mkdir(parents=True)
    (layout_split / "to.hadoop.done").touch()
    now[0] += 60
    wait.check(("20190720", 1))  # the next pass (1200) is ready: no wait
    assert wait.since is None
    untimed = small_config(data, tmp_path / "m", end_day="20190720")
    never = DataWait(untimed.runner, data, clock=lambda: now[0])
    never.check(None)
    now[0] += 1e9
    never.check(None)  # no data_wait_timeout_second: waits for ever
    assert layout.missing_splits(data, never.next_pass(None), "to.hadoop.done") == ["0000"]  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_job_whose_next_pass_does_not_land_fails_and_frees_its_group(
    client, roots, redis_server, tmp_path
):
    """The job's model.runner.data_wait_timeout_second, stored by the API, is kept by the
    agent (in this process, the real trainer) while the API waits for pass 2 to land."""
    from streamrec.trainer.agent.loop import Agent  # lazy: the model stack

    data, model = roots["data"] / "late", roots["model"] / "late"
    datagen(data, max_splits=1)  # pass 1 of 2 landed
    body = small_job("late", data, model)
    body["model"] = {**SMALL_MODEL, "runner": {**SMALL_MODEL["runner"]}}
    body["model"]["runner"]["data_wait_timeout_second"] = 2
    job_id = started_job(client, body)
    agent = Agent(redis_server.url, job_id, 3.0, 200, stuck_timeout_s=None, serve_metrics=False)
    exit_code: list[int] = []
    runner = threading.Thread(target=lambda: exit_code.append(agent.run()), daemon=True)
    runner.start()
    try:
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
            timeout=120,
            interval=0.2,
            what="the job failed for its data",
        )
    finally:
        if runner.is_alive() and client.get(f"/v1/jobs/{job_id}").json()["state"] == "running":
            client.post(f"/v1/jobs/{job_id}/stop")  # the agent leaves a stopped job
        runner.join(timeout=60)
    assert exit_code == [0] and not runner.is_alive()  # the group left the failed job
    assert job["passes_done"] == 1
    assert job["error"].startswith(
        f"pass 20190720/2: split(s) 20190720/1200 have no donefile 'to.hadoop.done' under {data} "
        "after "
    ), job["error"]
    assert "(data_wait_timeout_second=2)" in job["error"]
