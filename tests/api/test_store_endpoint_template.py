"""The API's allowed store endpoints from a numbered template (a StatefulSet's shards)."""

from __future__ import annotations

import pytest
from streamrec.api.config import Settings
from streamrec.api.errors import ApiConfigError

TEMPLATE = "tcp://embedding-store-{shard}.embedding-store:5555"


def load(**env: str) -> Settings:
    return Settings.load(
        {"auth_disabled": True}, env={f"STREAMREC_API_{k}": v for k, v in env.items()}
    )


def test_template_and_count_give_shards_zero_to_n_minus_one() -> None:
    settings = load(STORE_ENDPOINT_TEMPLATE=TEMPLATE, STORE_SHARDS="3")
    assert settings.store_endpoints == [TEMPLATE.replace("{shard}", str(k)) for k in range(3)]


def test_template_adds_to_a_listed_endpoint_once() -> None:
    first = TEMPLATE.replace("{shard}", "0")
    settings = load(
        STORE_ENDPOINTS=f"{first},tcp://other:1", STORE_ENDPOINT_TEMPLATE=TEMPLATE, STORE_SHARDS="2"
    )
    assert settings.store_endpoints == [first, "tcp://other:1", TEMPLATE.replace("{shard}", "1")]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"STORE_ENDPOINT_TEMPLATE": TEMPLATE}, "store_shards"),
        ({"STORE_SHARDS": "2"}, "store_endpoint_template"),
        (
            {"STORE_ENDPOINT_TEMPLATE": "tcp://store-0:5555", "STORE_SHARDS": "2"},
            "tcp://store-0:5555",
        ),
        ({"STORE_ENDPOINT_TEMPLATE": TEMPLATE, "STORE_SHARDS": "0"}, "store_shards"),
    ],
)
def test_half_a_template_or_no_placeholder_is_refused_by_name(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(ApiConfigError, match=says):
        load(**env)
