"""The fixed 64-bit key hash that assigns feature ids to embedding-store shards.

``shard = splitmix64_finalizer(key as uint64) % num_shards``. The finalizer is the one from
SplitMix64 / MurmurHash3's fmix64::

    z = key
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9   (mod 2**64)
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB   (mod 2**64)
    z =  z ^ (z >> 31)

Every client (Python, C++, CUDA) computes exactly this; Python's ``hash()`` is never used
(it is salted per process for str and differs across builds).

A string id (a Parquet string column, a feature name) becomes an int64 key by
:func:`string_keys`: FNV-1a 64 over its UTF-8 bytes, then the finalizer above::

    h = 0xCBF29CE484222325;  for each byte c: h = (h ^ c) * 0x100000001B3   (mod 2**64)
    key = mix64(h) as int64

the same in every process, in training and in the serving export.
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


_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def hash_ranges(data: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """int64 keys of byte strings ``data[starts[i]:starts[i] + lens[i]]`` (the module
    docstring's hash), vectorised over the strings: one numpy pass per byte position.

    Args:
        data: (nbytes,) uint8.
        starts, lens: (n,) int64 each.

    Returns:
        (n,) int64.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    h = np.full(starts.shape, _FNV_OFFSET, dtype=np.uint64)
    padded = data if data.size else np.zeros(1, np.uint8)
    last = padded.size - 1
    with np.errstate(over="ignore"):
        for j in range(int(lens.max(initial=0))):
            active = j < lens
            c = padded[np.minimum(starts + j, last)].astype(np.uint64)
            h = np.where(active, (h ^ c) * _FNV_PRIME, h)
    return mix64(h).view(np.int64)


def string_keys(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 keys of n strings held as Arrow holds them.

    Args:
        data: (nbytes,) uint8, the strings' UTF-8 bytes.
        offsets: (n + 1,) int64, string i is ``data[offsets[i]:offsets[i + 1]]``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    return hash_ranges(data, offsets[:-1], np.diff(offsets))


def string_key(text: str) -> int:
    """:func:`string_keys` of one string (a feature name, a test's id)."""
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return int(string_keys(raw, np.array([0, raw.size]))[0])
