"""Unit tests of pure logic: settings, the transition table, the job -> trainer config
mapping, route templates, the agent's step encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
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


def spec(model: dict | None = None, **sections) -> JobCreate:
    body = {
        "name": "j",
        "data": {
            "train_data_dir": "/d",
            "start_day": "20190720",
            "end_day": "20190721",
            "split_interval": 60,
            "split_per_pass": 4,
            "data_format": "criteo",
        },
        "checkpoint": {"model_save_path": "/m", "checkpoint_per_pass": 2},
        "model": model or {},
        "store": {
            "endpoints": ["tcp://127.0.0.1:5555"],
            "table_parameters": {"embedx_threshold": 5},
        },
        "resources": {"device": "cuda"},
    }
    for name, value in sections.items():
        body[name] = dict(body.get(name) or {}, **value)
    return JobCreate.model_validate(body)


def test_trainer_config_mapping():
    from streamrec.control.trainer_config import TrainerConfig

    cfg = spec(
        {
            "hyper_parameters": {"optimizer": "adam"},
            "runner": {"train_batch_size": 64},
            "table_parameters": {"embedx_threshold": 1, "nonclk_coeff": 0.2},
            "store": {"timeout_s": 5},
        }
    ).trainer_config()
    t = TrainerConfig.parse(cfg)
    r = t.runner
    assert (r.train_data_dir, r.model_save_path, r.data_format) == ("/d", "/m", "criteo")
    assert (r.split_interval, r.split_per_pass, r.checkpoint_per_pass) == (60, 4, 2)
    assert (r.start_day, r.end_day, r.train_batch_size) == ("20190720", "20190721", 64)
    assert t.hyper_parameters.optimizer == "adam"
    assert t.table_parameters == {"embedx_threshold": 5, "nonclk_coeff": 0.2}  # job wins
    assert (t.store.endpoints, t.store.tier, t.store.timeout_s) == (
        ["tcp://127.0.0.1:5555"],
        None,
        5,
    )
    assert t.distributed.backend == "nccl"
    assert (t.resources.trainer_ranks, t.resources.threads_per_rank) == (None, None)
    assert not t.negative_sampling.enabled


def test_sampler_store_and_resources_reach_the_trainer_config():
    from streamrec.control.trainer_config import TrainerConfig

    cfg = spec(
        {"negative_sampling": {"table_path": "/t.parquet", "item_slot": 1}},
        sampler={"endpoint": "ipc:///tmp/s.sock", "neg_num": 4},
        store={"tier": "ssd"},
        resources={"trainer_ranks": 3, "threads_per_rank": 2},
    ).trainer_config()
    t = TrainerConfig.parse(cfg)
    ns = t.negative_sampling
    assert (ns.enabled, ns.sample_size, ns.endpoint) == (True, 5, "ipc:///tmp/s.sock")
    assert (ns.table_path, ns.item_slot) == ("/t.parquet", 1)
    assert t.store.tier == "ssd"
    assert (t.resources.trainer_ranks, t.resources.threads_per_rank) == (3, 2)


@pytest.mark.parametrize(
    "model,match",
    [
        ({"runner": {"split_per_pass": 9}}, "model.runner.split_per_pass is set by the job's data"),
        ({"runner": {"reader_type": "criteo"}}, "set by the job's data.data_format"),
        ({"store": {"endpoints": []}}, "model.store.endpoints is set by the job's store.endpoints"),
        ({"store": {"tier": "host"}}, "model.store.tier is set by the job's store.tier"),
        ({"store": {"generation": 7}}, "model.store.generation is set by the job's trainer group"),
        ({"negative_sampling": {"sample_size": 3}}, "set by the job's sampler.neg_num"),
        ({"negative_sampling": {"enabled": True}}, "set by the job's sampler.neg_num"),
        ({"negative_sampling": {"endpoint": "ipc:///x"}}, "set by the job's sampler.endpoint"),
        ({"resources": {"trainer_ranks": 2}}, "set by the job's resources.trainer_ranks"),
        ({"resources": {"threads_per_rank": 2}}, "set by the job's resources.threads_per_rank"),
        ({"runner": ["x"]}, "model.runner must be a mapping"),
    ],
)
def test_model_may_not_shadow_the_job(model, match):
    with pytest.raises(ValidationError, match=match):
        spec(model)


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
    from streamrec.trainer.agent.steps import Op, Step, decode, encode

    step = Step(Op.PASS, PassSpec("20190720", 7, ("0005", "0010", "2355")), attempt=2)
    header, splits = encode(step)
    assert header.dtype == splits.dtype and str(header.dtype) == "torch.int64"
    back = decode(header, splits)
    assert (back.op, back.spec, back.attempt, back.mode) == (Op.PASS, step.spec, 2, None)
    back = decode(*encode(Step(Op.EXPORT, mode="delta")))
    assert (back.op, back.spec, back.mode) == (Op.EXPORT, None, "delta")


def test_a_report_kind_the_scheduler_does_not_know_is_refused_before_sending():
    from streamrec.control.channel import ReportKind, TrainerChannel

    ch = TrainerChannel("redis://127.0.0.1:1/0", "job", "g1")  # connects on first use only
    try:
        with pytest.raises(ValueError, match="'pass_dnoe' is not a valid ReportKind"):
            ch.report("pass_dnoe", day="20190720", pass_id=1)
    finally:
        ch.close()
    assert {k.value for k in ReportKind} >= {"pass_done", "pass_failed", "fatal"}
