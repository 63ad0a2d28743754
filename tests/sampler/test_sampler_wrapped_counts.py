"""Counts whose sum wraps int64 on a real sampler process: refused with ``bad_request``
naming the field, never a crash or ``internal``, and the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampler_workers import TAGS, small_table
from streamrec.errors import RemoteError
from streamrec.sampler import LocalRpcDataSampler
from streamrec.wire import RpcClient

WRAPPING = [
    (np.array([2**62] * 4, np.int64), "sample_cnts[0] = 4611686018427387904"),  # sums to 0
    (np.array([2**63 - 1, 2], np.int64), "sample_cnts[0] = 9223372036854775807"),
    (np.array([2**64 - 1, 1], np.uint64), "sample_cnts[0] = 18446744073709551615"),
    (np.array([1, -(2**63)], np.int64), "sample_cnts[1] = -9223372036854775808"),
]


@pytest.mark.parametrize("put_back", [False, True])
def test_wrapped_counts_are_bad_requests_and_the_server_keeps_serving(module_server, put_back):
    good = LocalRpcDataSampler(*TAGS, endpoint=module_server.endpoint, auto_start=False)
    good.reload(small_table())
    with RpcClient(module_server.endpoint, timeout_s=30) as raw:
        for cnts, message in WRAPPING:
            dedup = np.arange(len(cnts), dtype=np.int64) * 100
            with pytest.raises(RemoteError) as err:
                raw.call("sample_ids", {"put_back": put_back}, {"dedup": dedup, "cnts": cnts})
            assert err.value.code == "bad_request", str(err.value)
            assert message in str(err.value)
    assert module_server.proc.poll() is None, "the sampler died"
    ids = good.sample_ids(torch.tensor([0, 100]), 3, torch.tensor([0, 1]))
    assert ids.numel() == 6
    good.close()


def test_ragged_offsets_that_wrap_are_refused(module_server):
    """Offsets whose int64 differences wrap (``np.diff`` saw them rising) are refused by
    ``reload``; the table in place stays."""
    good = LocalRpcDataSampler(*TAGS, endpoint=module_server.endpoint, auto_start=False)
    good.reload(small_table())
    j = np.arange(6, dtype=np.int64)
    offsets = np.array([0, 2**62, 2**63 - 1, -(2**63), -(2**62), 0, 3], np.int64)
    meta = {
        "tags": {"sample_tag": "cat", "dedup_tag": "item", "weight_tag": "w", "skey_name": "skey"},
        "columns": [["item", "dense"], ["cat", "dense"], ["w", "dense"], ["skey", "ragged"]],
    }
    arrays = {"0.v": j * 100, "1.v": j % 5, "2.v": np.ones(6, np.float32), "3.v": j[:3]}
    with RpcClient(module_server.endpoint, timeout_s=30) as raw:
        with pytest.raises(RemoteError) as err:
            raw.call("reload", meta, {**arrays, "3.o": offsets})
    assert err.value.code == "bad_table" and "offsets must rise" in str(err.value)
    assert good.stats()["rows"] == 50  # the good table stays
    good.close()


def test_a_64_bit_missing_id_keeps_its_bits_and_a_non_int_is_refused(module_server):
    """``missing_id`` (the id of an unfilled slot) is an int64 or a uint64 feasign: a uint64
    beyond int64 fills the slot with its bit pattern (it raised ``internal``: OverflowError,
    found by the handlers' fuzz target); anything but an int is a bad request (msgpack
    carries no wider int)."""
    good = LocalRpcDataSampler(*TAGS, endpoint=module_server.endpoint, auto_start=False)
    good.reload(small_table())
    ask = {"dedup": np.array([0], np.int64), "cnts": np.array([2], np.int64)}
    unknown = {**ask, "categories": np.array([99], np.int64)}  # no such category: unfilled
    with RpcClient(module_server.endpoint, timeout_s=30) as raw:
        _, out = raw.call("sample_ids", {"missing_id": 2**64 - 2}, unknown)
        assert out["ids"].astype(np.uint64).tolist() == [2**64 - 2] * 2
        for bad in ("7", 1.5, True):
            with pytest.raises(RemoteError) as err:
                raw.call("sample_ids", {"missing_id": bad}, ask)
            assert err.value.code == "bad_request" and "'missing_id'" in str(err.value)
    assert module_server.proc.poll() is None, "the sampler died"
    good.close()
