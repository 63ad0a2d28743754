"""data.schema over real HTTP: a good schema is stored and reaches the trainer config; a bad
one, or a model that cannot take the data, is a 422 naming the field and the value."""

from __future__ import annotations

import json

import pytest
from api_helpers import job_body
from streamrec.control import keys
from streamrec.control.trainer_config import TrainerConfig

#: 13 dense features and 3 one-key sparse features: the generated format's shape, by name.
DENSE = [f"d{i}" for i in range(13)]
MODEL = {"hyper_parameters": {"arch_sparse_feature_size": 4, "arch_mlp_bot": "13-8-4"}}


def schema(**over) -> dict:
    s = {
        "label": "click",
        "dense": list(DENSE),
        "sparse": [
            {"name": "user_id"},
            {"name": "item_id", "pooling": "mean"},
            {"name": "hist", "table": "item_id"},
        ],
    }
    s.update(over)
    return s


def post(client, roots, name: str, sch: dict | None, model: dict | None = None):
    body = job_body(roots, name)
    if sch is not None:
        body["data"]["schema"] = sch
    body["model"] = MODEL if model is None else model
    return client.post("/v1/jobs", json=body)


def errors(resp) -> dict[str, tuple[str, object]]:
    assert resp.status_code == 422, resp.text
    return {".".join(map(str, e["loc"])): (e["msg"], e.get("input")) for e in resp.json()["detail"]}


def test_a_schema_is_stored_and_reaches_the_trainer(client, roots, r):
    resp = post(client, roots, "good", schema())
    assert resp.status_code == 201, resp.text
    job = resp.json()
    cfg = json.loads(r.hget(keys.job(job["id"]), "trainer_config"))
    sch = cfg["runner"]["schema"]
    assert [s["name"] for s in sch["sparse"]] == ["user_id", "item_id", "hist"]
    assert sch["sparse"][1]["pooling"] == "mean" and sch["label"] == "click"
    parsed = TrainerConfig.parse(cfg)
    # the slot count follows the schema (3, not the default 26)
    assert parsed.hyper_parameters.sparse_inputs_slots == 3
    assert parsed.runner.feature_schema is not None
    assert [d.name for d in parsed.runner.feature_schema.dense] == DENSE
    # hist's keys go to item_id's table: two tables for three features
    assert parsed.slot_tables == ["slot_0", "slot_1", "slot_1"]
    assert parsed.table_names == ["slot_0", "slot_1"]


def test_features_of_their_own_dims_and_negatives_by_name_are_created(client, roots, r):
    """A dim other than the job's (projected in the model) and negative sampling naming its
    item-side features: a 201 whose trainer config says so."""
    sch = schema(
        sparse=[
            {"name": "user_id", "dim": 2},
            {"name": "item_id"},
            {"name": "genres", "dim": 8, "pooling": "mean"},
            {"name": "hist", "table": "genres"},
        ]
    )
    body = job_body(roots, "dims")
    body["data"]["schema"] = sch
    body["model"] = {
        **MODEL,
        "negative_sampling": {"reload": False, "item_features": ["item_id", "genres"]},
    }
    body["sampler"] = {"neg_num": 2}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    parsed = TrainerConfig.parse(json.loads(r.hget(keys.job(resp.json()["id"]), "trainer_config")))
    assert parsed.slot_dims == [2, 4, 8, 8]  # hist: genres' table, genres' dim
    ns = parsed.negative_sampling
    assert ns.enabled and ns.sample_size == 3 and ns.item_features == ["item_id", "genres"]


@pytest.mark.parametrize(
    "sch,model,field,value,words",
    [
        # a bottom MLP not taking the 13 dense features: once 201 then a failed pass, now a 422
        (None, {"hyper_parameters": {"arch_mlp_bot": "8-16"}}, "arch_mlp_bot", "8-16", "13 dense"),
        (
            schema(),
            {"hyper_parameters": {"arch_mlp_bot": "12-4", "arch_sparse_feature_size": 4}},
            "arch_mlp_bot",
            "12-4",
            "the 13 dense features (the schema's",
        ),
        (None, {"hyper_parameters": {"arch_sparse_feature_size": 8}}, "arch_mlp_bot", None, "8"),
        (None, {"hyper_parameters": {"arch_mlp_top": "8-2"}}, "arch_mlp_top", "8-2", "be 1"),
        (schema(dense=DENSE[:2]), None, "data.schema.dense", DENSE[:2], "13 dense fields"),
        (
            schema(sparse=[{"name": "a"}, {"name": "b", "table": "a", "dim": 32}]),
            None,
            "data.schema.sparse.1.dim",
            32,
            "a shared table has one dim",
        ),
        (
            schema(sparse=[{"name": "a"}]),
            {**MODEL, "hyper_parameters": {**MODEL["hyper_parameters"], "sparse_inputs_slots": 2}},
            "model.hyper_parameters.sparse_inputs_slots",
            2,
            "1 sparse features",
        ),
        (
            schema(dense=[{"name": d, "log1p": False} for d in DENSE]),
            None,
            "data.schema.dense.0.log1p",
            False,
            "log(x + 1)",
        ),
        (
            schema(),
            {**MODEL, "negative_sampling": {"reload": False, "item_features": ["nope"]}},
            "model.negative_sampling.item_features.0",
            "nope",
            "names no sparse feature of the schema",
        ),
        (
            schema(),
            {**MODEL, "negative_sampling": {"reload": False, "item_slot": 1}},
            "model.negative_sampling.item_slot",
            1,
            "a schema job names its item-side features by name",
        ),
        (
            None,
            {"negative_sampling": {"reload": False, "item_features": ["item_id"]}},
            "model.negative_sampling.item_features",
            ["item_id"],
            "names schema features",
        ),
    ],
)
def test_a_model_that_cannot_take_the_data_is_a_422(client, roots, sch, model, field, value, words):
    errs = errors(post(client, roots, "bad", sch, model))
    where = field if field.startswith(("data.", "model.")) else f"model.hyper_parameters.{field}"
    loc = "body." + where
    assert loc in errs, errs
    msg, got = errs[loc]
    assert words in msg, msg
    if value is not None:
        assert got == value or got == str(value), (got, value)
    assert client.get("/v1/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    "sch,loc,words",
    [
        (schema(sparse=[{"name": "a"}, {"name": "a"}]), "schema", "sparse[1].name 'a'"),
        (schema(label="d0"), "schema", "dense[0].name 'd0' is already the name of label"),
        (schema(sparse=[{"name": "a", "pooling": "max"}]), "schema.sparse.0.pooling", "'sum'"),
        (schema(sparse=[{"name": "a", "table": "nope"}]), "schema", "'nope' names no sparse"),
        (
            schema(
                sparse=[{"name": "a"}, {"name": "b", "table": "a"}, {"name": "c", "table": "b"}]
            ),
            "schema",
            "sparse[2].table 'b': name a feature with a table of its own",
        ),
        (schema(sparse=[{"name": "a", "table": "a"}]), "schema", "names the feature itself"),
        (schema(sparse=[{"name": "a b"}]), "schema.sparse.0.name", "pattern"),
        (schema(sparse=[]), "schema.sparse", "at least 1"),
        (schema(sparse=[{"name": "a", "dim": 0}]), "schema.sparse.0.dim", "greater than"),
        (schema(sparse=[{"name": "a", "weird": 1}]), "schema.sparse.0.weird", "Extra"),
    ],
)
def test_a_bad_schema_is_a_422_naming_the_field(client, roots, sch, loc, words):
    errs = errors(post(client, roots, "bad", sch))
    hits = {k: v for k, v in errs.items() if k.startswith("body.data." + loc)}
    assert hits, errs
    assert any(words in msg for msg, _ in hits.values()), hits


def test_model_may_not_set_the_schema(client, roots):
    errs = errors(post(client, roots, "shadow", None, {"runner": {"schema": schema()}}))
    assert any("data.schema" in msg for msg, _ in errs.values()), errs


def test_parquet_and_slot_need_a_schema_and_the_model_follows_it(client, roots, r):
    body = job_body(roots, "noschema", data_format="parquet")
    errs = errors(client.post("/v1/jobs", json=body))
    assert any("needs data.schema" in msg for msg, _ in errs.values()), errs
    # no dense features (ids only): created, with no bottom MLP (0-d)
    body = job_body(roots, "nodense", data_format="slot")
    body["data"]["schema"] = schema(dense=[])
    body["model"] = {"hyper_parameters": {"arch_sparse_feature_size": 4}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    cfg = TrainerConfig.parse(json.loads(r.hget(keys.job(resp.json()["id"]), "trainer_config")))
    assert cfg.hyper_parameters.arch_mlp_bot == [0, 4]
    # a schema and no arch_mlp_bot: its input is the schema's dense count, its output the dim
    body = job_body(roots, "only-schema", data_format="parquet")
    body["data"]["schema"] = schema(dense=["a", "b", "c"])
    body["model"] = {}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    cfg = TrainerConfig.parse(json.loads(r.hget(keys.job(resp.json()["id"]), "trainer_config")))
    assert cfg.hyper_parameters.arch_mlp_bot == [3, 512, 256, 64, 16]
    # a whole arch_mlp_bot given that does not fit stays a 422 naming the field
    for dense, mlp in (([], "1-4"), ([], "0-8-4"), (["a"], "2-4")):
        body = job_body(roots, "misfit", data_format="slot")
        body["data"]["schema"] = schema(dense=dense)
        body["model"] = {"hyper_parameters": {"arch_sparse_feature_size": 4, "arch_mlp_bot": mlp}}
        errs = errors(client.post("/v1/jobs", json=body))
        assert "body.model.hyper_parameters.arch_mlp_bot" in errs, (dense, mlp, errs)
    # the same schema with two dense features and a bottom MLP that takes them: created
    body = job_body(roots, "good-slot", data_format="slot")
    body["data"]["schema"] = schema(dense=["age", {"name": "price", "log1p": True}])
    body["model"] = {"hyper_parameters": {"arch_sparse_feature_size": 4, "arch_mlp_bot": "2-4"}}
    assert client.post("/v1/jobs", json=body).status_code == 201
