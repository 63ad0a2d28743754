"""The trainer's hookup of store namespaces: ``store.namespace`` in the trainer config (the
store's name rule) and ``make_store`` making the job's tables in that namespace of real shard
processes."""

from __future__ import annotations

import pytest
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import LocalShards
from streamrec.errors import BadRequest
from streamrec.trainer.store_tables import build_table_options, make_store


@pytest.fixture(scope="module")
def shards():
    with LocalShards(None, 2) as running:
        yield running


def test_trainer_config_namespace_uses_the_store_pattern(shards):
    """A bad name refused by field; the trainer's store is the job's own."""
    with pytest.raises(BadRequest, match="store.namespace"):
        TrainerConfig.parse({"store": {"endpoints": shards.endpoints, "namespace": "a b"}})
    config = TrainerConfig.parse({"store": {"endpoints": shards.endpoints, "namespace": "job-j"}})
    store = make_store(config, build_table_options(config))
    try:
        assert store.namespace == "job-j"
        assert set(store.stats()["total"]["namespaces"]["job-j"]["tables"]) == set(store.tables)
    finally:
        store.drop_namespace()
        store.close()


def test_two_jobs_on_one_set_of_shards_get_their_own_tables(shards):
    """Jobs with other slot dims on the same shards (the default namespace would refuse
    the second: its dims differ from the first's)."""
    stores = []
    try:
        for job, dim in (("job-1", 8), ("job-2", 16)):
            config = TrainerConfig.parse(
                {
                    "store": {"endpoints": shards.endpoints, "namespace": job},
                    "hyper_parameters": {"arch_sparse_feature_size": dim},
                }
            )
            stores.append(make_store(config, build_table_options(config)))
        assert {t.dim for t in stores[0].tables.values()} == {8}
        assert {t.dim for t in stores[1].tables.values()} == {16}
    finally:
        for store in stores:
            store.drop_namespace()
            store.close()
