"""The job spec checked whole at create time, over real HTTP: every nested field the trainer
would refuse or that reaches past the deployment's allow-lists is a 422 naming it, and no
value comes back longer than QUOTE_LIMIT (RELIABILITY.md, "No door left open"). Every number
of the spec, walked from the models, is bounded and strict: past an end, as text or as a bool
it is a 422 naming the field and the value; the READMEs' and the launcher's bodies pass."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Union, get_args, get_origin

import annotated_types as at_
import pytest
from api_helpers import STORE_ENDPOINTS, job_body
from pydantic import BaseModel
from streamrec.api.models import JOB_OWNED, JobCreate
from streamrec.control.trainer_config import TrainerConfig
from streamrec.errors import QUOTE_LIMIT
from streamrec.launcher.__main__ import build_parser
from streamrec.launcher.job import job_spec as launcher_job


def errors(resp) -> list[tuple[str, str, str]]:
    return [(".".join(map(str, e["loc"])), e["msg"], e["type"]) for e in resp.json()["detail"]]


def refused(client, body: dict, loc: str, words: str) -> list[tuple[str, str, str]]:
    """Posts ``body``: a 422 with an error at ``loc`` whose message holds ``words``; nothing
    stored, the API still serving."""
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    found = errors(resp)
    assert any(where == loc and words in msg for where, msg, _ in found), found
    assert client.get("/v1/jobs").json()["count"] == 0
    assert client.get("/healthz").status_code == 200
    return found


@pytest.mark.parametrize(
    "params,loc,words",
    [
        (
            {"embedx_threshold": "abc"},
            "body.store.table_parameters.embedx_threshold",
            "valid number",
        ),
        ({"bogus": 1}, "body.store.table_parameters.bogus", "Extra inputs"),
        ({"dim": 8}, "body.store.table_parameters.dim", "set by the trainer"),
    ],
)
def test_table_parameters_are_checked_by_name_and_type(client, roots, params, loc, words):
    body = job_body(roots, "tables")
    body["store"] = {"table_parameters": params}
    refused(client, body, loc, words)


def test_table_parameters_of_the_model_section_too(client, roots):
    body = job_body(roots, "tables")
    body["model"] = {"table_parameters": {"delta_threshold": [1]}}
    refused(client, body, "body.model.table_parameters.delta_threshold", "valid number")


def test_good_table_parameters_pass(client, roots):
    body = job_body(roots, "tables")
    body["store"] = {"table_parameters": {"embedx_threshold": 5, "delete_threshold": 0.5}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text


def test_the_sampler_table_is_confined_to_the_data_roots(client, roots):
    body = job_body(roots, "shadow")
    body["sampler"] = {"neg_num": 2}
    body["model"] = {"negative_sampling": {"table_path": "/etc/shadow"}}
    found = refused(client, body, "body.model.negative_sampling.table_path", "outside")
    assert "path_refused" in {t for _, _, t in found}, found


def test_a_sampler_table_under_the_data_root_is_stored_resolved(client, roots):
    body = job_body(roots, "table")
    body["sampler"] = {"neg_num": 2}
    table = roots["data"] / "t" / ".." / "items.parquet"
    body["model"] = {"negative_sampling": {"table_path": str(table)}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["spec"]["model"]["negative_sampling"]["table_path"]
    assert stored == str(roots["data"].resolve() / "items.parquet")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_metrics_bind_beyond_the_loopback_is_refused(client, roots, host):
    body = job_body(roots, "bind")
    body["model"] = {"runner": {"metrics_host": host}}
    refused(client, body, "body.model.runner.metrics_host", "not an allowed address")


def test_a_loopback_metrics_bind_passes(client, roots):
    body = job_body(roots, "bind")
    body["model"] = {"runner": {"metrics_host": "127.0.0.1"}}
    assert client.post("/v1/jobs", json=body).status_code == 201


@pytest.mark.parametrize(
    "where",
    [("data", "train_data_dir"), ("checkpoint", "model_save_path")],
)
def test_a_path_component_longer_than_name_max_is_refused(client, roots, where):
    section, key = where
    body = job_body(roots, "long")
    root = roots["data"] if section == "data" else roots["model"]
    body[section][key] = str(root / ("x" * 300))
    refused(client, body, f"body.{section}.{key}", "longer than NAME_MAX (255)")


def test_a_store_endpoint_listed_twice_is_refused(client, roots):
    body = job_body(roots, "twice")
    body["store"] = {"endpoints": ["tcp://127.0.0.1:7701", "tcp://127.0.0.1:7701"]}
    refused(client, body, "body.store.endpoints[1]", "listed twice")


def test_a_sampler_endpoint_not_allowed_is_refused(client, roots):
    body = job_body(roots, "smp")
    body["sampler"] = {"endpoint": "tcp://127.0.0.1:19990", "neg_num": 2}
    body["model"] = {"negative_sampling": {"table_path": str(roots["data"] / "items.parquet")}}
    found = refused(client, body, "body.sampler.endpoint", "not an allowed sampler endpoint")
    assert {t for _, _, t in found} == {"endpoint_refused"}


def test_an_online_redis_not_allowed_is_refused(client, roots):
    body = job_body(roots, "online")
    body["model"] = {"online": {"redis_url": "redis://10.9.9.9:6379/0"}}
    refused(client, body, "body.model.online.redis_url", "not an allowed serving Redis")


def test_an_online_redis_url_with_a_password_is_refused_unechoed(client, roots, redis_server):
    body = job_body(roots, "online")
    host = redis_server.url.split("//", 1)[1]
    body["model"] = {"online": {"redis_url": f"redis://:hunter2secret@{host}"}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert "hunter2secret" not in resp.text
    assert "carries a password" in resp.text


def test_every_problem_is_named_at_once(client, roots):
    body = job_body(roots, "many")
    body["store"] = {"table_parameters": {"bogus": 1}}
    body["model"] = {"runner": {"metrics_host": "0.0.0.0"}}
    body["sampler"] = {"endpoint": "tcp://127.0.0.1:19990", "neg_num": 2}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422
    locs = {loc for loc, _, _ in errors(resp)}
    assert {
        "body.store.table_parameters.bogus",
        "body.model.runner.metrics_host",
        "body.sampler.endpoint",
    } <= locs


def bounded(value) -> None:
    """No string in a response longer than QUOTE_LIMIT plus its quoting and size note."""
    if isinstance(value, str):
        assert len(value) <= QUOTE_LIMIT + 40, value[:300]
    elif isinstance(value, dict):
        for k, v in value.items():
            bounded(k)
            bounded(v)
    elif isinstance(value, list):
        for v in value:
            bounded(v)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b, k: b.update(model={k: 1}),  # an unknown trainer section
        lambda b, k: b.update(model={"runner": {k: 1}}),  # an unknown runner field
        lambda b, k: b.update(store={"table_parameters": {k: 1}}),
        lambda b, k: b.update(model={"online": {"redis_url": "redis://" + k}}),
        lambda b, k: b.update(sampler={"endpoint": "tcp://" + k + ":1", "neg_num": 1}),
    ],
)
def test_a_900_kb_key_comes_back_cut_to_200_characters(client, roots, mutate):
    body = job_body(roots, "huge")
    key = "k" * 900_000
    mutate(body, key)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code in (413, 422), resp.status_code
    assert len(resp.content) < 8_000, len(resp.content)
    bounded(resp.json())


# ---- bounds: every number of the spec has a range and a strict type --------------------

ROOT = Path(__file__).resolve().parents[2]
#: Lists of sizes bounded by ``parse_dims`` (MAX_LAYERS, MAX_LAYER_WIDTH), not per item.
DIMS = {"model.hyper_parameters.arch_mlp_bot", "model.hyper_parameters.arch_mlp_top"}


def at(body: dict, field: str, value: object) -> dict:
    """``body`` with ``value`` at the dotted ``field`` (sections made as needed)."""
    *sections, key = field.split(".")
    node = body
    for s in sections:
        node = node.setdefault(s, {})
    node[key] = value
    return body


def errors_at(resp, field: str) -> list[tuple[str, object]]:
    """(message, input) of each error at ``body.<field>`` or inside it (a list's item)."""
    if resp.status_code != 422:
        return []
    where = "body." + field
    out = []
    for e in resp.json()["detail"]:
        loc = ".".join(map(str, e["loc"]))
        if loc == where or loc.startswith(where + "."):
            out.append((e["msg"], e.get("input")))
    return out


@dataclass
class Number:
    """A numeric field of the spec: its dotted path in a body and its bounds."""

    field: str
    is_list: bool
    lo: float | None = None
    lo_in: bool = True
    hi: float | None = None
    hi_in: bool = True


def number(field: str, is_list: bool, meta: list) -> Number:
    n = Number(field, is_list)
    for m in meta:
        for c in getattr(m, "metadata", [m]):  # Annotated[..., Field(...)] holds a FieldInfo
            if isinstance(c, at_.Ge | at_.Gt):
                n.lo, n.lo_in = (c.ge, True) if isinstance(c, at_.Ge) else (c.gt, False)
            elif isinstance(c, at_.Le | at_.Lt):
                n.hi, n.hi_in = (c.le, True) if isinstance(c, at_.Le) else (c.lt, False)
    return n


def numbers(model: type[BaseModel], prefix: str, owned: bool = False) -> Iterator[Number]:
    """Every int or float field under ``model`` (lists of them too), recursively; ``owned``:
    a trainer section, whose fields the job sets (JOB_OWNED) are left to the job's walk."""
    for name, info in model.model_fields.items():
        if owned and (prefix.split(".")[-2], name) in JOB_OWNED:
            continue
        key = info.alias or name  # data.schema (feature_schema in Python)
        ann = info.annotation
        args = get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,)
        for a in (a for a in args if a is not type(None)):
            meta = list(info.metadata)
            is_list = get_origin(a) is list
            if is_list:
                a = get_args(a)[0]
            if get_origin(a) is Annotated:
                a, *more = get_args(a)
                meta = more if is_list else meta + more
            elif is_list:
                meta = []
            if isinstance(a, type) and issubclass(a, BaseModel):
                # a list of models (data.schema.sparse): its items' numbers, at "[]"
                yield from numbers(a, f"{prefix}{key}{'[]' if is_list else ''}.", owned)
            elif a in (int, float):
                yield number(prefix + key, is_list, meta)


def spec_numbers() -> list[Number]:
    """The whole spec's numbers: the job's sections, then the trainer's (``model``)."""
    found = list(numbers(JobCreate, ""))
    for section, info in TrainerConfig.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found += numbers(info.annotation, f"model.{section}.", owned=True)
    return found


def test_the_walk_finds_every_number_bounded():
    found = spec_numbers()
    fields = {n.field for n in found}
    assert {
        "data.split_interval",
        "resources.restart_backoff_s",
        "model.runner.train_batch_size",
        "model.runner.metrics_port",
        "model.hyper_parameters.loss_weights",
        "model.store.timeout_s",
        "model.negative_sampling.item_slots",
        "data.schema.sparse[].dim",
    } <= fields, sorted(fields)
    assert not {"model.runner.split_interval", "model.resources.trainer_ranks"} & fields
    unbounded = [n.field for n in found if n.field not in DIMS and None in (n.lo, n.hi)]
    assert not unbounded, unbounded


def probes(n: Number) -> list[tuple[object, bool]]:
    """(value, accepted?) around ``n``'s bounds: past each end, as text, as a bool, at each
    inclusive end (a float's integral end sent as a JSON int)."""
    assert n.lo is not None and n.hi is not None
    past_hi = n.hi + 1 if n.hi_in else n.hi
    past_lo = n.lo - 1 if n.lo_in else n.lo
    out: list[tuple[object, bool]] = [(past_hi, False), (past_lo, False), ("1", False)]
    out.append((True, False))
    for end, inclusive in ((n.hi, n.hi_in), (n.lo, n.lo_in)):
        if inclusive:
            out.append((int(end) if end == int(end) else end, True))
    return out


def test_every_number_of_the_spec_is_refused_past_its_bounds_and_as_text(client, roots):
    # a list of models' numbers (data.schema.sparse[].dim) in tests/api/test_schema_spec.py
    numbers_ = [n for n in spec_numbers() if n.field not in DIMS and "[]" not in n.field]
    checked, fields = 0, numbers_
    for i, n in enumerate(fields):
        for j, (value, accepted) in enumerate(probes(n)):
            sent = [value, value] if n.is_list else value
            resp = client.post("/v1/jobs", json=at(job_body(roots, f"n{i}-{j}"), n.field, sent))
            found = errors_at(resp, n.field)
            if accepted:
                assert not found, (n.field, sent, found)
                continue
            assert found, (n.field, sent, resp.status_code, resp.text[:400])
            assert n.is_list or any(v == value for _, v in found), (n.field, sent, found)
            checked += 1
    assert checked == 4 * len(fields) and len(fields) >= 30, (checked, len(fields))


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("model.runner.train_batch_size", 10**12, "less than or equal to 1048576"),
        ("model.runner.read_chunk_mb", 1e9, "less than or equal to 1024"),
        ("model.runner.metrics_port", 70000, "less than or equal to 65535"),
        ("model.runner.metrics_port", -5, "greater than or equal to 0"),
        ("model.hyper_parameters.arch_sparse_feature_size", 10**6, "less than or equal to 4096"),
        ("model.hyper_parameters.sparse_inputs_slots", 10**6, "less than or equal to 1024"),
        ("model.store.timeout_s", 1e9, "less than or equal to 86400"),
        ("model.hyper_parameters.arch_mlp_bot", "13-100000-16", "MAX_LAYER_WIDTH (16384)"),
        ("model.hyper_parameters.arch_mlp_top", "-".join(["8"] * 65), "MAX_LAYERS (64)"),
        ("data.split_interval", "30", "valid integer"),
        ("data.split_interval", True, "valid integer"),
        ("data.split_interval", 30.0, "valid integer"),
        ("model.hyper_parameters.learning_rate", "0.1", "valid number"),
    ],
)
def test_an_absurd_value_is_422_naming_the_field_and_value(client, roots, field, value, words):
    resp = client.post("/v1/jobs", json=at(job_body(roots, "absurd"), field, value))
    found = errors_at(resp, field)
    assert any(words in msg and v == value and type(v) is type(value) for msg, v in found), (
        resp.status_code,
        resp.text[:400],
    )
    assert client.get("/v1/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    "port,ranks,words",
    [
        ("api", None, "the port of the API (--port)"),
        ("redis", None, "the port of the API's Redis (--redis-url)"),
        (7701, None, "the port of a store shard (--store-endpoint)"),
        (7700, 2, "7700..7701 (metrics_port + local rank) would take port 7700"),
        ("api-3", 4, "the port of the API (--port)"),
        (65534, 4, "past the last TCP port 65535"),
    ],
)
def test_a_metrics_port_the_stack_uses_is_refused(
    client, roots, api, redis_server, port, ranks, words
):
    ports = {"api": api.port, "redis": redis_server.port, "api-3": api.port - 3}
    value = ports.get(port, port)
    body = at(job_body(roots, "port"), "model.runner.metrics_port", value)
    if ranks is not None:
        body["resources"] = {"trainer_ranks": ranks}
    found = refused(client, body, "body.model.runner.metrics_port", words)
    assert {t for _, _, t in found} == {"invalid_spec"}, found


@pytest.mark.parametrize("port,ranks", [(0, None), (9200, 2), (65535, 1)])
def test_a_free_metrics_port_passes(client, roots, port, ranks):
    body = at(job_body(roots, "port"), "model.runner.metrics_port", port)
    body["resources"] = {"trainer_ranks": ranks}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text


def test_a_json_int_is_a_float_and_is_stored_as_one(client, roots):
    body = at(job_body(roots, "ints"), "data.data_sleep_second", 2)
    body["resources"] = {"restart_backoff_s": 3}
    body["model"] = {"hyper_parameters": {"learning_rate": 1}, "store": {"timeout_s": 120}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    spec = resp.json()["spec"]
    assert spec["data"]["data_sleep_second"] == 2.0
    assert isinstance(spec["data"]["data_sleep_second"], float)


def readme_job(path: Path, roots: dict[str, Path]) -> dict:
    """The first ``POST /v1/jobs`` body of the REST block of ``path``, its shell variables
    and example paths and endpoints replaced by this test API's roots and allowed ones."""
    text = path.read_text()
    block = text[text.index("curl -s") :]
    block = (
        block.replace("'$DATA'", str(roots["data"]))
        .replace("'$MODELS'", str(roots["model"]))
        .replace("'\"$SHARDS\"'", json.dumps(STORE_ENDPOINTS))
        .replace('"/data/', f'"{roots["data"]}/')
        .replace('"/models/', f'"{roots["model"]}/')
    )
    found = re.search(r"/v1/jobs [^\n]*-d '(\{.*?\})'", block, re.S)
    assert found, f"{path} has no POST /v1/jobs body"
    body = json.loads(found.group(1))
    if body.get("store", {}).get("endpoints"):
        body["store"]["endpoints"] = STORE_ENDPOINTS[: len(body["store"]["endpoints"])]
    return body


@pytest.mark.parametrize("source", ["defaults", "README.md", "services/api/README.md", "launcher"])
def test_the_defaults_the_readmes_and_the_launchers_bodies_pass(client, roots, source):
    if source == "defaults":
        body = job_body(roots, "defaults")
    elif source == "launcher":
        args = build_parser().parse_args(["up"])
        run = roots["data"].parent  # run/data and run/models: the test API's roots
        assert run / "models" == roots["model"]
        body = launcher_job(args, run, STORE_ENDPOINTS[:2])
    else:
        body = readme_job(ROOT / source, roots)
        assert body["name"] == "ctr" and body["model"]["hyper_parameters"], body
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
