"""Pure logic of the client side: prefetch, combine helpers, table conversion."""

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch
from streamrec.errors import BadRequest
from streamrec.ragged import RaggedTensor
from streamrec.sampler import LocalRpcDataSampler, prefetch
from streamrec.sampler.columns import decode_columns, encode_columns, to_columns
from streamrec.sampler.errors import BadTable

combine_vec = LocalRpcDataSampler.combine_vector_with_sample_counts


def test_combine_vector_with_sample_counts_seed_example_and_ragged_counts():
    out = combine_vec(torch.tensor([1, 2, 3]), 2, torch.arange(5, 11))
    assert out.tolist() == [1, 5, 6, 2, 7, 8, 3, 9, 10]
    out = combine_vec(torch.tensor([1, 2, 3]), torch.tensor([0, 3, 1]), torch.tensor([7, 8, 9, 4]))
    assert out.tolist() == [1, 2, 7, 8, 9, 3, 4]
    with pytest.raises(BadRequest, match="sampled has 3 ids but sample_cnts sum to 4"):
        combine_vec(torch.tensor([1, 2]), 2, torch.tensor([1, 2, 3]))
    with pytest.raises(BadRequest, match="sample_cnts has 1 entries but there are 2"):
        combine_vec(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([1, 2]))


def test_combine_repeats_user_side_and_builds_labels():
    sampler = LocalRpcDataSampler.__new__(LocalRpcDataSampler)  # combine needs no server
    sampler.dedup_tag, sampler.label_name = "item", "label"
    batch = (
        {
            "item": RaggedTensor.from_list([[10], [20]]),
            "user": RaggedTensor.from_list([[1, 2], [3]]),
            "age": torch.tensor([30.0, 40.0]),
        },
        "extra",
    )
    packed = {"item": torch.tensor([10, 11, 20, 21, 22]), "price": torch.arange(5.0)}
    out = sampler.combine(batch, packed, torch.tensor([1, 2]))
    assert isinstance(out, tuple) and out[1] == "extra"
    f = out[0]
    assert f["user"].to_list() == [[1, 2], [1, 2], [3], [3], [3]]
    assert f["age"].tolist() == [30.0, 30.0, 40.0, 40.0, 40.0]
    assert f["item"].tolist() == [10, 11, 20, 21, 22]
    assert f["label"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    with pytest.raises(BadRequest, match="'item' has 5 rows; positives \\+ negatives = 4"):
        sampler.combine(batch, packed, torch.tensor([1, 1]))
    with pytest.raises(BadRequest, match="'age' has shape \\(3,\\)"):
        sampler.combine([{**batch[0], "age": torch.zeros(3)}], packed, torch.tensor([1, 2]))


def test_prefetch_keeps_order_and_overlaps_with_the_consumer():
    # While the consumer holds batch i, fn must already be working on batch i + 1: the
    # consumer waits for that to happen (it would time out if fn ran only on demand).
    started = [threading.Event() for _ in range(8)]

    def fn(x):
        started[x].set()
        return x * 10

    out = []
    for y in prefetch(range(8), fn, depth=2):
        i = y // 10
        if i + 1 < 8:
            assert started[i + 1].wait(10), f"batch {i + 1} was not prepared during batch {i}"
        out.append(y)
    assert out == [x * 10 for x in range(8)]


def test_prefetch_reraises_errors_at_their_batch_and_close_stops():
    def fn(x):
        if x == 3:
            raise ValueError("bad batch 3")
        return x

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for y in prefetch(range(10), fn):
            got.append(y)
    assert got == [0, 1, 2]
    p = prefetch(iter(range(10**9)), lambda x: x, depth=1)
    assert next(p) == 0
    p.close()
    assert not p._thread.is_alive()
    with pytest.raises(ValueError, match="depth"):
        prefetch(range(3), lambda x: x, depth=0)


def test_to_columns_kinds_and_wire_round_trip():
    cols = to_columns(
        [
            {"a": torch.tensor([1, 2]), "s": ["x", "é"], "r": RaggedTensor.from_list([[1], []])},
            {"a": np.array([3]), "s": np.array(["yz"]), "r": RaggedTensor.from_list([[4, 5]])},
        ]
    )
    assert cols["a"].kind == "dense" and cols["a"].values.tolist() == [1, 2, 3]
    assert cols["s"].kind == "str" and bytes(cols["s"].values).decode() == "xéyz"
    assert cols["s"].offsets.tolist() == [0, 1, 3, 5]
    assert cols["r"].offsets.tolist() == [0, 1, 1, 3]
    spec, arrays = encode_columns(cols)
    back = decode_columns(spec, arrays)
    assert all(np.array_equal(back[k].values, cols[k].values) for k in cols)
    with pytest.raises(BadTable, match="columns .* differ"):
        to_columns([{"a": [1]}, {"b": [1]}])
    with pytest.raises(BadTable, match="dtype complex128 is not supported"):
        to_columns({"a": np.array([1j])})
    with pytest.raises(BadTable, match="column 'b': dtype torch.bfloat16 is not supported"):
        to_columns({"b": torch.ones(2, dtype=torch.bfloat16)})
    with pytest.raises(BadTable, match="offsets must rise"):
        decode_columns([["a", "ragged"]], {"0.v": np.arange(3), "0.o": np.array([0, 5])})
    with pytest.raises(BadTable, match="1 null values"):
        from streamrec.sampler.columns import _arrow_to_column

        _arrow_to_column("n", pa.array([1, None]))


def test_endpoint_resolution(monkeypatch):
    from streamrec.sampler.config import ENDPOINT_ENV, default_endpoint

    monkeypatch.setenv(ENDPOINT_ENV, "tcp://127.0.0.1:5999")
    assert default_endpoint() == "tcp://127.0.0.1:5999"
    monkeypatch.setenv(ENDPOINT_ENV, "http://x")
    with pytest.raises(BadRequest, match="STREAMREC_SAMPLER_ENDPOINT: expected ipc://PATH"):
        default_endpoint()
    monkeypatch.delenv(ENDPOINT_ENV)
    assert default_endpoint().startswith("ipc://") and default_endpoint().endswith("sampler.sock")
    with pytest.raises(BadRequest, match="sample_tag must be a non-empty column name"):
        LocalRpcDataSampler("", "item", "w", "skey")
