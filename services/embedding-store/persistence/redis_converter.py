"""Redis as the online serving key-value store for base/delta models (PaddleRec's converter).

Serving looks a feature up by key and gets its row. Per table (and per shard of the store
that wrote it) the rows live in one Redis hash; key names come from :meth:`RedisConverter.key`
only::

    {prefix}:{table}:rows:{K}-of-{N}    hash   field = key as decimal uint64 (the feasign)
                                               value = dim float32, little-endian (4*dim bytes)
    {prefix}:{table}:meta:{K}-of-{N}    hash   dim, tag (last applied), base_tag, mode,
                                               version (the model_version it holds)
    {prefix}:{table}:tags:{K}-of-{N}    set    tags applied since (and with) the last base

- ``base`` replaces the partition atomically: rows go into a staging hash (with a TTL, so a
  crash leaves no garbage for long), then one MULTI/EXEC renames it over the live hash and
  updates the meta. A reader sees the old base or the new one, never a mix. A base is
  whole, so it is taken whatever version the partition holds (after a trainer restarted
  from an older checkpoint, its next base is what brings serving back in step).
- ``delta`` updates rows on top and deletes the keys it carries as deleted (HSETs, HDELs and
  the meta in one MULTI/EXEC, so a reader never sees half a delta). A versioned delta
  (:class:`~streamrec.embedding_store.persistence.versions.SaveVersion`) is checked in the
  same transaction (WATCH on the meta key): unless its ``applies_on`` is the version the
  partition holds (0 before any versioned save) it is refused with both versions named
  (:class:`~streamrec.embedding_store.errors.VersionConflict`): a delta written twice, out
  of order, or after a publish that failed half-way (serving then waits for the next base).
  :meth:`served_model_version` reads the partition's version.
- :meth:`read_rows` returns exactly what serving reads (every row of every partition): the
  last base with every delta written after it, whichever of their tags is asked for (Redis
  keeps only the current state); a tag never written since the last base is NotFound.
  :meth:`lookup` is the serving read for given keys.

One key per prefix says which model is served, for readers to watch (poll ``seq`` or
SUBSCRIBE to the channel of the same name); the trainer bumps it after every table of a
base or delta is written (:meth:`RedisConverter.publish_version`; :meth:`served_version`
reads it)::

    {prefix}:version                    hash   seq (1, 2, ...), tag, mode, day, pass_id,
                                               model_version, tables, rows, unix; PUBLISHed
                                               as JSON too

``checkpoint`` and ``batch`` saves are not serving models; they are refused here (use the
file converter). The store calls :meth:`write_rows` once per table per save.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import numpy as np
from redis.exceptions import WatchError
from streamrec.embedding_store.errors import InvalidInput, VersionConflict
from streamrec.embedding_store.persistence.converters import Converter, check_deleted
from streamrec.embedding_store.persistence.versions import APPLIES_ON, MODEL_VERSION, SaveVersion
from streamrec.errors import BadRequest, NotFound
from streamrec.keyhash import shard_of
from streamrec.save_modes import SERVING_MODES, SaveMode, parse_save_mode

#: A staging hash left behind by a crash during a base write expires after this long.
STAGING_TTL_S = 24 * 3600


def _encode_fields(keys: np.ndarray) -> list[str]:
    """(n,) int64 -> decimal uint64 strings (the feasign's bit pattern)."""
    return keys.view(np.uint64).astype(str).tolist()


def _decode_fields(fields: list[bytes]) -> np.ndarray:
    """Decimal uint64 byte strings -> (n,) int64 (bit pattern kept)."""
    if not fields:
        return np.zeros(0, dtype=np.int64)
    return np.array(fields).astype(np.uint64).view(np.int64)


def _encode_rows(values: np.ndarray) -> list[bytes]:
    """(n, dim) float32 -> one little-endian byte string per row, without a Python loop."""
    v = np.ascontiguousarray(values, dtype="<f4")
    # numpy types tolist() of any array loosely; a void element converts to bytes
    return cast(list[bytes], v.view(np.dtype((np.void, 4 * v.shape[1]))).ravel().tolist())


def _decode_rows(blobs: list[bytes], dim: int, what: str) -> np.ndarray:
    data = b"".join(blobs)
    if len(data) != 4 * dim * len(blobs):
        raise BadRequest(
            f"{what}: rows in Redis are not {dim} float32 each "
            f"({len(data)} bytes for {len(blobs)} rows)"
        )
    return np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(len(blobs), dim)


class RedisConverter(Converter):
    """Writes base/delta rows into Redis hashes and reads them back as serving does.

    Args:
        redis: a ``redis://host:port/db`` URL or a ``redis.Redis`` client.
        prefix: prefix of every key this converter touches.
        shard_id: K, the shard of the store whose rows this converter writes.
        num_shards: N; readers find a key's partition with ``keyhash.shard_of(key, N)``.
        chunk_rows: rows per HSET command (bounds the size of one command).
    """

    def __init__(
        self,
        redis: Any,
        prefix: str = "streamrec:emb",
        shard_id: int = 0,
        num_shards: int = 1,
        chunk_rows: int = 20_000,
    ) -> None:
        if isinstance(redis, str):
            import redis as redis_lib

            redis = redis_lib.Redis.from_url(redis)
        if not prefix or not isinstance(prefix, str):
            raise BadRequest(f"prefix must be a non-empty string, got {prefix!r}")
        if not (
            isinstance(num_shards, int)
            and num_shards >= 1
            and isinstance(shard_id, int)
            and 0 <= shard_id < num_shards
        ):
            raise BadRequest(
                f"shard_id must be in [0, num_shards), got shard_id={shard_id!r} "
                f"num_shards={num_shards!r}"
            )
        if chunk_rows < 1:
            raise BadRequest(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.redis = redis
        self.prefix = prefix
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.chunk_rows = chunk_rows

    def key(self, table: str, kind: str, shard_id: int | None = None) -> str:
        """The Redis key of ``kind`` (rows | meta | tags | staging) of ``table``'s partition."""
        k = self.shard_id if shard_id is None else shard_id
        return f"{self.prefix}:{table}:{kind}:{k}-of-{self.num_shards}"

    # -- converter ---------------------------------------------------------------------

    def write_rows(
        self,
        table: str,
        keys: np.ndarray,
        values: np.ndarray,
        mode: SaveMode,
        tag: str,
        deleted: np.ndarray | None = None,
        version: SaveVersion | None = None,
    ) -> None:
        """Publishes rows for serving.

        Args:
            table: table name.
            keys: (n,) int64 (unique).
            values: (n, dim) float32.
            mode: base (replace the partition atomically) or delta (update on top).
            tag: names the model, e.g. "20190720/base" or "20190720/delta_3".
            deleted: a delta's keys (d,) int64 to delete (HDEL, in the delta's transaction).
            version: the save's version, kept in the meta; a delta is refused unless it
                applies on the partition's (None: unversioned, not checked).

        Raises:
            VersionConflict: a delta that does not apply on the partition's version.
        """
        mode = parse_save_mode(mode, "mode", InvalidInput)
        if mode not in SERVING_MODES:
            raise InvalidInput(
                f"mode: RedisConverter serves {list(SERVING_MODES)} models, got "
                f"{mode.value!r} (save checkpoints and batch models to files)"
            )
        if not isinstance(table, str) or not table:
            raise InvalidInput(f"table must be a non-empty string, got {table!r}")
        keys = np.asarray(keys)
        values = np.asarray(values)
        if keys.dtype != np.int64 or keys.ndim != 1:
            raise InvalidInput(f"keys: must be (n,) int64, got {keys.shape} {keys.dtype}")
        if values.dtype != np.float32 or values.ndim != 2 or values.shape[0] != keys.shape[0]:
            raise InvalidInput(
                f"values: must be ({keys.shape[0]}, dim) float32, got {values.shape} {values.dtype}"
            )
        if not np.isfinite(values).all():
            raise InvalidInput(f"values of table {table!r}: hold NaN or Inf; nothing was written")
        if np.unique(keys).size != keys.size:
            raise InvalidInput(f"keys of table {table!r}: duplicates; each key once per write")
        gone = _encode_fields(
            check_deleted(table, mode, None if deleted is None else np.asarray(deleted), keys)
        )
        dim = int(values.shape[1])
        meta_key = self.key(table, "meta")
        old_dim = self.redis.hget(meta_key, "dim")
        if mode == SaveMode.DELTA and old_dim is not None and int(old_dim) != dim:
            raise InvalidInput(
                f"values of table {table!r}: dim {dim} differs from the served "
                f"dim {int(old_dim)}; write a new base first"
            )
        fields = _encode_fields(keys)
        rows = _encode_rows(values) if keys.size else []
        live = self.key(table, "rows")
        meta: dict[str, str | int] = {"dim": dim, "tag": tag, "mode": mode}
        if version is not None:
            meta["version"] = version.number
        if mode == SaveMode.BASE:
            meta["base_tag"] = tag
            staging = f"{self.key(table, 'staging')}:{uuid.uuid4().hex}"
            try:
                self._hset_chunks(staging, fields, rows, transaction=False, ttl=STAGING_TTL_S)
                with self.redis.pipeline(transaction=True) as p:
                    if fields:
                        p.rename(staging, live)
                        p.persist(live)
                    else:
                        p.delete(live)
                    p.delete(meta_key, self.key(table, "tags"))
                    p.hset(meta_key, mapping=meta)
                    p.sadd(self.key(table, "tags"), tag)
                    p.execute()
            finally:
                self.redis.delete(staging)
        else:
            self._write_delta(table, fields, rows, gone, meta, version)

    def _write_delta(
        self,
        table: str,
        fields: list[str],
        rows: list[bytes],
        gone: list[str],
        meta: dict[str, str | int],
        version: SaveVersion | None,
    ) -> None:
        """A delta's HSETs, HDELs and meta in one MULTI/EXEC; a versioned one only if the
        partition still holds the version it applies on (WATCH on the meta key: a writer
        that changed it meanwhile makes the check run again)."""
        meta_key, live = self.key(table, "meta"), self.key(table, "rows")
        with self.redis.pipeline(transaction=True) as p:
            while True:
                try:
                    if version is not None:
                        p.watch(meta_key)
                        self._check_applies(table, version, p.hget(meta_key, "version"))
                        p.multi()
                    self._queue_rows(p, live, fields, rows)
                    for i in range(0, len(gone), self.chunk_rows):
                        p.hdel(live, *gone[i : i + self.chunk_rows])
                    p.hset(meta_key, mapping=meta)
                    p.sadd(self.key(table, "tags"), str(meta["tag"]))
                    p.execute()
                    return
                except WatchError:
                    continue

    def _check_applies(self, table: str, version: SaveVersion, held: bytes | None) -> None:
        """Raises VersionConflict unless the delta ``version`` applies on ``held``, the
        partition's version (None: none versioned yet, 0)."""
        served = 0 if held is None else int(held)
        if version.applies_on == served:
            return
        why = "already applied" if version.number <= served else "out of order (one is missing)"
        raise VersionConflict(
            f"table {table!r} partition {self.shard_id}-of-{self.num_shards} under prefix "
            f"{self.prefix!r}: delta {MODEL_VERSION}={version.number} has {APPLIES_ON}="
            f"{version.applies_on}, the partition serves {MODEL_VERSION}={served}: {why}; "
            f"nothing was written (publish a base to bring serving in step)"
        )

    def _hset_chunks(
        self, key: str, fields: list[str], rows: list[bytes], transaction: bool, ttl: int | None
    ) -> None:
        with self.redis.pipeline(transaction=transaction) as p:
            self._queue_rows(p, key, fields, rows, ttl)
            p.execute()

    def _queue_rows(
        self,
        p: Any,
        key: str,
        fields: list[str],
        rows: list[bytes],
        ttl: int | None = None,
    ) -> None:
        """Queues on ``p`` the HSETs of ``rows`` under ``fields`` into hash ``key``,
        ``chunk_rows`` at a time (the first followed by an EXPIRE ``ttl`` when given)."""
        for i in range(0, len(fields), self.chunk_rows):
            p.hset(
                key,
                mapping=dict(
                    zip(
                        fields[i : i + self.chunk_rows],
                        rows[i : i + self.chunk_rows],
                        strict=True,
                    )
                ),
            )
            if ttl is not None and i == 0:
                p.expire(key, ttl)

    def read_rows(self, table: str, tag: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every row serving reads for ``table``, over all partitions (deconverter).

        Args:
            tag: if given, must have been written to every partition since its last base
                (the result is the current state all the same); None skips the check.

        Returns:
            keys (n,) int64 (sorted) and values (n, dim) float32.

        Raises:
            NotFound: nothing served for ``table``, or ``tag`` was not written since the base.
        """
        keys_parts, value_parts, dim = [], [], None
        for k in range(self.num_shards):
            meta = self.redis.hgetall(self.key(table, "meta", k))
            if not meta:
                continue
            if tag is not None and not self.redis.sismember(self.key(table, "tags", k), tag):
                raise NotFound(
                    f"table {table!r} partition {k}-of-{self.num_shards}: tag {tag!r} was not "
                    f"written since its last base (served: "
                    f"{meta[b'tag'].decode()!r}; Redis keeps only the current state)"
                )
            d = int(meta[b"dim"])
            if dim is not None and d != dim:
                raise BadRequest(f"table {table!r}: partitions disagree on dim ({dim} vs {d})")
            dim = d
            fields, blobs = [], []
            for f, v in self.redis.hscan_iter(self.key(table, "rows", k), count=10_000):
                fields.append(f)
                blobs.append(v)
            keys_parts.append(_decode_fields(fields))
            value_parts.append(_decode_rows(blobs, d, f"table {table!r}"))
        if dim is None:
            raise NotFound(f"table {table!r}: nothing served under prefix {self.prefix!r}")
        keys = np.concatenate(keys_parts)
        values = np.concatenate(value_parts)
        order = np.argsort(keys, kind="stable")
        return keys[order], values[order]

    def version_key(self) -> str:
        """The key (hash, and channel) that names the model served under this prefix."""
        return f"{self.prefix}:version"

    def publish_version(self, info: dict[str, str | int]) -> int:
        """Records that a model is fully written (``info``: tag, mode, day, pass_id,
        tables, rows, unix) and tells subscribers; returns its ``seq`` (1, 2, ...)."""
        key = self.version_key()
        with self.redis.pipeline(transaction=True) as p:
            p.hincrby(key, "seq", 1)
            p.hset(key, mapping={k: str(v) for k, v in info.items()})
            seq = int(p.execute()[0])
        self.redis.publish(key, json.dumps({**info, "seq": seq}))
        return seq

    def served_version(self) -> dict[str, str] | None:
        """The version hash (None before any model was published under this prefix)."""
        raw = self.redis.hgetall(self.version_key())
        return {k.decode(): v.decode() for k, v in raw.items()} if raw else None

    # -- serving -----------------------------------------------------------------------

    def lookup(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The serving read: rows of ``keys`` (n,) int64 from their partitions.

        Returns:
            values (n, dim) float32 (zeros for keys not served) and found (n,) bool.
        """
        keys = np.asarray(keys, dtype=np.int64)
        dims = [self.redis.hget(self.key(table, "meta", k), "dim") for k in range(self.num_shards)]
        known = [int(d) for d in dims if d is not None]
        if not known:
            raise NotFound(f"table {table!r}: nothing served under prefix {self.prefix!r}")
        dim = known[0]
        values = np.zeros((keys.size, dim), dtype=np.float32)
        found = np.zeros(keys.size, dtype=bool)
        part = (
            shard_of(keys, self.num_shards)
            if self.num_shards > 1
            else np.zeros(keys.size, dtype=np.int64)
        )
        for k in range(self.num_shards):
            idx = np.flatnonzero(part == k)
            if idx.size == 0:
                continue
            blobs = self.redis.hmget(self.key(table, "rows", k), _encode_fields(keys[idx]))
            hit = np.array([b is not None for b in blobs], dtype=bool)
            if hit.any():
                values[idx[hit]] = _decode_rows(
                    [b for b in blobs if b is not None], dim, f"table {table!r}"
                )
            found[idx] = hit
        return values, found

    def served_tag(self, table: str) -> str | None:
        """The tag last applied to this converter's partition of ``table`` (None if none)."""
        tag = self.redis.hget(self.key(table, "meta"), "tag")
        return None if tag is None else tag.decode()

    def served_model_version(self, table: str) -> int | None:
        """The ``model_version`` this converter's partition of ``table`` holds: 0 for rows
        written unversioned, None when nothing is served."""
        meta = self.redis.hmget(self.key(table, "meta"), ["dim", "version"])
        if meta[0] is None:
            return None
        return 0 if meta[1] is None else int(meta[1])
