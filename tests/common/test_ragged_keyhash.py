import numpy as np
import pytest
import torch
from streamrec.keyhash import mix64, shard_of
from streamrec.ragged import RaggedTensor


def test_ragged_basics_and_take_rows():
    r = RaggedTensor.from_list([[10, 11], [], [12, 13, 14]])
    assert r.offsets().tolist() == [0, 2, 2, 5]
    assert r.lengths().tolist() == [2, 0, 3]
    assert r.take_rows(torch.tensor([2, 0, 2])).to_list() == [[12, 13, 14], [10, 11], [12, 13, 14]]


@pytest.mark.parametrize(
    "values,offsets",
    [([[1, 2]], [0, 2]), ([1, 2], [1, 2]), ([1, 2], [0, 3]), ([1, 2, 3], [0, 2, 1, 3])],
)
def test_ragged_rejects_bad_shapes(values, offsets):
    with pytest.raises(ValueError, match="RaggedTensor"):
        RaggedTensor(values=values, offsets=offsets)


def test_keyhash_matches_reference_splitmix_finalizer():
    def ref(k):
        z = k & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)

    keys = np.array([0, 1, -1, 2**62, -(2**63), 123456789], dtype=np.int64)
    assert mix64(keys).tolist() == [ref(int(k)) for k in keys]
    shards = shard_of(np.arange(100000, dtype=np.int64), 4)
    assert set(np.unique(shards).tolist()) == {0, 1, 2, 3}
    assert np.abs(np.bincount(shards) - 25000).max() < 1000
