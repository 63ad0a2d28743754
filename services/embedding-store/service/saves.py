"""The ``save`` and ``load`` ops of one shard: where its part of a save lies, and resharding.

A shard saves under ``path/shard-K-of-N/`` (its own manifest) and loads from there; a save of
M other shards (or one in-process store's ``path/MANIFEST.json``: M = 1) is resharded, this
shard taking the keys that route to it from every part
(:mod:`~streamrec.embedding_store.persistence.reshard`). ``path`` must be absolute and lie
under one of the shard's model roots (``..`` and symlinks resolved first, see
:mod:`streamrec.roots`); ``converter: "redis"`` sends base/delta rows to the serving Redis
(:mod:`~streamrec.embedding_store.persistence.redis_converter`). The wire ops themselves are
:class:`~streamrec.embedding_store.service.handlers.StoreService`'s.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrec.embedding_store.errors import ShardCountMismatch
from streamrec.embedding_store.persistence.manifests import (
    MANIFEST,
    parse_shard_dir_name,
    read_manifest,
    saved_parts,
    shard_dir_name,
)
from streamrec.embedding_store.persistence.reshard import verify_save
from streamrec.embedding_store.service.metrics import StoreMetrics
from streamrec.errors import BadRequest, NotFound, quote
from streamrec.roots import confine, resolve_roots
from streamrec.save_modes import SaveMode, parse_save_mode
from streamrec.wire import Arrays, Meta

if TYPE_CHECKING:
    from streamrec.embedding_store.store import EmbeddingStore


class ShardSaves:
    """Saves and loads of shard K of N, a namespace's store at a time.

    Args:
        shard_id: K, this shard's index.
        num_shards: N, the number of shards.
        metrics: where to record save and load times; None records nothing.
        redis_url: the serving Redis for saves with ``converter: "redis"`` (None: refused).
        redis_prefix: prefix of this store's keys in that Redis.
        model_roots: the directories ``save``/``load`` paths must lie under (none: refused).
    """

    def __init__(
        self,
        shard_id: int,
        num_shards: int,
        metrics: StoreMetrics | None = None,
        redis_url: str | None = None,
        redis_prefix: str = "streamrec:emb",
        model_roots: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.metrics = metrics
        self.dir_name = shard_dir_name(shard_id, num_shards)
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self._redis: Any = None
        self._redis_lock = threading.Lock()
        self.model_roots = resolve_roots(model_roots)

    def _root(self, meta: Meta) -> Path:
        """The request's ``path``, resolved and confined to the model roots."""
        return confine("path", meta.get("path"), self.model_roots)

    def _shard_dir(self, root: Path) -> Path:
        """This shard's directory under ``root``; a symlink there may not lead out either."""
        return confine("path", str(root / self.dir_name), self.model_roots)

    def _converter(self, meta: Meta) -> Any:
        """None (the store's files) or this shard's RedisConverter (``converter: redis``)."""
        name = meta.get("converter")
        if name in (None, "files"):
            return None
        if name != "redis":
            raise BadRequest(f"field 'converter' must be 'files' or 'redis', got {quote(name)}")
        if self.redis_url is None:
            raise BadRequest("field 'converter': 'redis' needs the shard started with --redis-url")
        with self._redis_lock:
            if self._redis is None:
                from streamrec.embedding_store.persistence.redis_converter import RedisConverter

                self._redis = RedisConverter(
                    self.redis_url, self.redis_prefix, self.shard_id, self.num_shards
                )
            return self._redis

    def save(self, ns: str, store: EmbeddingStore, meta: Meta) -> tuple[Path, dict[str, Any]]:
        """``save`` of namespace ``ns``'s ``store``: (this shard's directory, the manifest)."""
        mode = parse_save_mode(meta.get("mode", SaveMode.CHECKPOINT), "mode", BadRequest)
        target = self._shard_dir(self._root(meta))
        converter = self._converter(meta)
        started = time.perf_counter()
        extra = {"shard_id": self.shard_id, "num_shards": self.num_shards, "namespace": ns}
        manifest = store.save(str(target), mode, converter=converter, extra=extra)
        if self.metrics is not None:
            self.metrics.save_seconds.labels(mode.value).observe(time.perf_counter() - started)
        return target, manifest

    def load(self, store: EmbeddingStore, meta: Meta) -> tuple[Meta, Arrays]:
        """``load`` into ``store``: this shard's part of a save of N shards, or its keys
        from a save of another shard count (the reply's ``resharded`` then says "M -> N")."""
        root = self._root(meta)
        target = self._shard_dir(root)
        verify_only = meta.get("verify_only", False)
        if not isinstance(verify_only, bool):
            raise BadRequest(f"field 'verify_only' must be a bool, got {quote(verify_only)}")
        if not target.is_dir() and (root / MANIFEST).is_file():  # one in-process store's save
            if self.num_shards != 1:
                return self._load_resharded(store, root, meta, verify_only)
            target = root  # the whole of a one-shard store
        if not target.is_dir():
            named = (
                {p.name: parse_shard_dir_name(p.name) for p in root.iterdir()}
                if root.is_dir()
                else {}
            )
            found = sorted(name for name, kn in named.items() if kn is not None)
            counts = sorted({kn[1] for kn in named.values() if kn is not None})
            if counts and self.num_shards not in counts:
                return self._load_resharded(store, root, meta, verify_only)
            raise NotFound(
                f"checkpoint {str(root)!r} has no {self.dir_name}/ for this shard "
                f"(found: {found or 'nothing'})"
            )
        converter = self._converter(meta)
        if verify_only:
            manifest = read_manifest(target)  # every listed file and its sha256
        else:  # store.load verifies the files itself: read the manifest once, unverified
            try:
                manifest = json.loads((target / MANIFEST).read_text())
            except (OSError, ValueError):
                manifest = {}  # store.load names what is wrong with it
        saved_by = manifest.get("extra") if isinstance(manifest, dict) else None
        saved_by = saved_by if isinstance(saved_by, dict) else {}
        if (saved_by.get("shard_id"), saved_by.get("num_shards")) not in (
            (None, None),
            (self.shard_id, self.num_shards),
        ):
            raise ShardCountMismatch(
                f"{str(target)!r} was saved by shard {saved_by.get('shard_id')} of "
                f"{saved_by.get('num_shards')}; this is shard {self.shard_id} of {self.num_shards}"
            )
        if verify_only:
            return {"dir": str(target), "mode": manifest.get("mode")}, {}
        started = time.perf_counter()
        store.load(str(target), converter=converter)
        if self.metrics is not None:
            self.metrics.load_seconds.observe(time.perf_counter() - started)
        return {"dir": str(target)}, {}

    def _load_resharded(
        self, store: EmbeddingStore, root: Path, meta: Meta, verify_only: bool
    ) -> tuple[Meta, Arrays]:
        """``load`` of a save made by another number of shards: this shard takes the keys
        that route to it from every part
        (:mod:`~streamrec.embedding_store.persistence.reshard`); the reply's ``resharded``
        says "M -> N"."""
        if meta.get("converter") not in (None, "files"):
            raise ShardCountMismatch(
                f"checkpoint {str(root)!r} is not a save of {self.num_shards} shards: loaded "
                f"into another shard count it is read from its files, not from "
                f"{quote(meta.get('converter'))}"
            )
        for part in saved_parts(root):  # a symlinked part may not lead out either
            confine("path", str(part), self.model_roots)
        if verify_only:
            saved, mode = verify_save(root)
            return {
                "dir": str(root),
                "mode": mode,
                "resharded": f"{saved} -> {self.num_shards}",
            }, {}
        started = time.perf_counter()
        loaded = store.load(str(root), shard=(self.shard_id, self.num_shards))
        if self.metrics is not None:
            self.metrics.load_seconds.observe(time.perf_counter() - started)
        return {"dir": str(root), "resharded": loaded["resharded"]}, {}
