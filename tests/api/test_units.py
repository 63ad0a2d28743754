"""Unit tests of pure logic: settings, the transition table, the job -> trainer config
mapping, route templates, the agent's step encoding, the stack's flag checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from streamrec.api.config import Settings
from streamrec.api.errors import ApiConfigError
from streamrec.api.models import JobCreate
from streamrec.api.state import TRANSITIONS, JobState, next_state


def test_settings_from_env_and_overrides(tmp_path: Path):
    secret = tmp_path / "token"
    secret.write_text("  s3cret-token-value \n")
    env = {
        "STREAMREC_API_TOKEN_FILE": str(secret),
        "STREAMREC_API_DATA_ROOTS": f"{tmp_path}/a:{tmp_path}/b",
        "STREAMREC_API_AUTH_READS": "true",
        "STREAMREC_API_PORT": "9000",
    }
    s = Settings.load({"port": 9100, "redis_url": None}, env=env)
    assert s.token == "s3cret-token-value" and s.auth_reads and s.port == 9100
    assert s.data_roots == [tmp_path / "a", tmp_path / "b"]


@pytest.mark.parametrize(
    "env,match",
    [
        ({}, "no API token"),
        ({"STREAMREC_API_TOKEN": "short"}, "token"),
        ({"STREAMREC_API_TOKEN_FILE": "/nonexistent/token"}, "token_file"),
        ({"STREAMREC_API_TOKEN": "long-enough-token", "STREAMREC_API_PORT": "70000"}, "port"),
        ({"STREAMREC_API_AUTH_DISABLED": "true", "STREAMREC_API_SURPRISE": "1"}, None),
        (
            {"STREAMREC_API_AUTH_DISABLED": "true", "STREAMREC_API_REDIS_TIMEOUT_S": "0"},
            "redis_timeout_s",
        ),
    ],
)
def test_bad_settings_name_the_field(env, match):
    if match is None:  # unknown env vars are not fields: ignored, not an error
        assert Settings.load(env=env).auth_disabled
        return
    with pytest.raises(ApiConfigError, match=match):
        Settings.load(env=env)


def test_transition_table_is_closed():
    targets = {t for t in TRANSITIONS.values() if t is not None}
    assert targets <= set(JobState)
    # every state but created can be reached, every state can be left or deleted
    assert targets == set(JobState) - {JobState.CREATED}
    for state in JobState:
        assert any(s == state for s, _ in TRANSITIONS), state
    with pytest.raises(KeyError):
        next_state(JobState.SUCCEEDED, "start")
    assert next_state(JobState.FAILED, "start") == JobState.RUNNING


def spec(**model) -> JobCreate:
    return JobCreate.model_validate(
        {
            "name": "j",
            "data": {
                "data_root": "/d",
                "start_day": "20190720",
                "end_day": "20190721",
                "split_interval": 60,
                "split_per_pass": 4,
                "format": "criteo",
            },
            "checkpoint": {"model_save_path": "/m", "checkpoint_per_pass": 2},
            "model": model,
            "store": {
                "endpoints": ["tcp://127.0.0.1:5555"],
                "table_parameters": {"embedx_threshold": 5},
            },
            "resources": {"device": "cuda"},
        }
    )


def test_trainer_config_mapping():
    from streamrec.trainer.config import TrainerConfig

    cfg = spec(
        hyper_parameters={"optimizer": "adam"},
        runner={"train_batch_size": 64},
        table_parameters={"embedx_threshold": 1, "nonclk_coeff": 0.2},
    ).trainer_config()
    t = TrainerConfig.parse(cfg)
    r = t.runner
    assert (r.train_data_dir, r.model_save_path, r.data_format) == ("/d", "/m", "criteo")
    assert (r.split_interval, r.split_per_pass, r.checkpoint_per_pass) == (60, 4, 2)
    assert (r.start_day, r.end_day, r.train_batch_size) == ("20190720", "20190721", 64)
    assert t.hyper_parameters.optimizer == "adam"
    assert t.table_parameters == {"embedx_threshold": 5, "nonclk_coeff": 0.2}  # job wins
    assert t.store.addresses == ["tcp://127.0.0.1:5555"]
    assert t.distributed.backend == "nccl"


def test_model_runner_may_not_shadow_the_job():
    with pytest.raises(ValueError, match="model.runner.split_per_pass"):
        spec(runner={"split_per_pass": 9})


def test_route_template_adds_the_prefix():
    from types import SimpleNamespace

    from streamrec.api.app import route_template

    def req(path: str, template: str | None):
        route = SimpleNamespace(path=template) if template else None
        return SimpleNamespace(scope={"route": route}, url=SimpleNamespace(path=path))

    assert (
        route_template(req("/v1/jobs/abc/passes", "/jobs/{job_id}/passes"))
        == "/v1/jobs/{job_id}/passes"
    )
    assert route_template(req("/v1/jobs/abc", "/v1/jobs/{job_id}")) == "/v1/jobs/{job_id}"
    assert route_template(req("/healthz", "/healthz")) == "/healthz"
    assert route_template(req("/nope", None)) == "<unmatched>"


def test_agent_step_roundtrip():
    from streamrec.layout import PassSpec
    from streamrec.trainer.agent import EXPORT, PASS, Step, decode, encode

    step = Step(PASS, PassSpec("20190720", 7, ("0005", "0010", "2355")), attempt=2)
    header, splits = encode(step)
    assert header.dtype == splits.dtype and str(header.dtype) == "torch.int64"
    back = decode(header, splits)
    assert (back.op, back.spec, back.attempt, back.mode) == (PASS, step.spec, 2, None)
    back = decode(*encode(Step(EXPORT, mode="delta")))
    assert (back.op, back.spec, back.mode) == (EXPORT, None, "delta")


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--trainers", "0"], "--trainers"),
        (["--split-interval", "7"], "--split-interval"),
        (["--start-day", "2019-07-20"], "--start-day"),
        (["--api-port", "70000"], "--api-port"),
        (["--rate", "-1"], "--rate"),
    ],
)
def test_stack_flags_checked(flags, match):
    from streamrec.api.stack import StackError, build_parser, check_args

    args = build_parser().parse_args(["up", *flags])
    with pytest.raises(StackError, match=match):
        check_args(args)
    check_args(build_parser().parse_args(["up"]))  # the defaults are valid


def test_stack_summary_rows():
    from streamrec.api.stack import pass_row, summary_row

    p = {
        "day": "20190720",
        "pass_id": 3,
        "samples": 1000,
        "predict_auc": 0.7,
        "train_auc": 0.72,
        "best_auc": 0.875,
        "logloss": 0.5,
        "seconds": 1.25,
    }
    assert pass_row(p).split() == [
        "20190720",
        "3",
        "1000",
        "0.7000",
        "0.7200",
        "0.8750",
        "0.5000",
        "1.2",
    ]
    assert summary_row(p).split()[-1] == "0.800"
    assert summary_row(dict(p, predict_auc=None)).split()[-1] == "-"


def test_stack_refuses_a_running_stack(tmp_path: Path):
    import json
    import os

    from streamrec.api.stack import Stack, StackError, build_parser

    run = tmp_path / "run"
    run.mkdir()
    (run / "stack.json").write_text(json.dumps({"supervisor_pid": os.getpid()}))
    args: argparse.Namespace = build_parser().parse_args(["up", "--run-dir", str(run)])
    with pytest.raises(StackError, match="already runs"):
        Stack(args).prepare()
