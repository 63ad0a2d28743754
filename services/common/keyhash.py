"""The fixed 64-bit key hash that assigns feature ids to embedding-store shards.

``shard = splitmix64_finalizer(key as uint64) % num_shards``. The finalizer is the one from
SplitMix64 / MurmurHash3's fmix64::

    z = key
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9   (mod 2**64)
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB   (mod 2**64)
    z =  z ^ (z >> 31)

Every client (Python, C++, CUDA) computes exactly this; Python's ``hash()`` is never used
(it is salted per process for str and differs across builds).
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(keys: np.ndarray) -> np.ndarray:
    """Mixes keys: (n,) int64 or uint64 -> (n,) uint64."""
    z = (
        np.asarray(keys).view(np.uint64)
        if np.asarray(keys).dtype == np.int64
        else (np.asarray(keys, dtype=np.uint64))
    )
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def shard_of(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard index per key: (n,) int64 keys -> (n,) int64 in [0, num_shards)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    return (mix64(keys) % np.uint64(num_shards)).astype(np.int64)
