"""The client's calls on the shards' state as a whole: saves, loads, restarts, its namespace.

:class:`ShardsAdmin` is a base of
:class:`~streamrec.embedding_store.service.client.EmbeddingStoreClient` (whose transport,
shard count and namespace it uses, declared below; the client sets them): ``save``/``load``
(every shard its ``path/shard-K-of-N/``, a load checked on every shard before any loads),
``accept_restarts``/``incarnations`` (a shard restarted empty,
:mod:`~streamrec.embedding_store.service.incarnation`) and ``drop_namespace``
(:mod:`~streamrec.embedding_store.service.namespaces`).
"""

from __future__ import annotations

from typing import Any

from streamrec.embedding_store.persistence.manifests import shard_dir_name
from streamrec.embedding_store.service.namespaces import DEFAULT_NAMESPACE
from streamrec.embedding_store.service.shard_link import ShardLink
from streamrec.errors import BadRequest
from streamrec.save_modes import FULL_MODES, SaveMode, parse_save_mode
from streamrec.store_schema import TableOptions
from streamrec.wire import Meta


class ShardsAdmin:
    """Saves, loads, restarts and the namespace of the shards behind one client."""

    # the client's state these calls use (EmbeddingStoreClient.__init__ sets every one)
    namespace: str
    endpoints: list[str]
    num_shards: int
    _link: ShardLink
    #: what create_tables made, made again on load
    _created: list[TableOptions]

    def _create_tables(self) -> None:
        """Makes this client's tables in its namespace on every shard (idempotent)."""
        if self._created:
            tables = [t.model_dump(mode="json") for t in self._created]
            self._link.broadcast("create_tables", {"tables": tables})

    def save(
        self, path: str, mode: SaveMode = SaveMode.CHECKPOINT, converter: str | None = None
    ) -> dict[str, Any]:
        """Every shard saves into ``path/shard-K-of-N/`` with its own manifest.

        Args:
            path: an absolute directory under the shards' ``--model-root`` that they can
                write (a shared volume).
            mode: checkpoint | base | delta | batch.
            converter: where base/delta rows go: None or "files" (in the shard directories),
                "redis" (the shards' serving Redis, ``--redis-url``). A converter object
                cannot travel to the shards.

        Returns:
            {"path", "mode", "num_shards", "shards": [{"dir", "manifest"} per shard]}.
        """
        mode = parse_save_mode(mode, "mode", BadRequest)
        meta = {"path": str(path), "mode": mode.value, **self._converter_meta(converter)}
        metas = self._link.broadcast("save", meta)
        return {"path": str(path), "mode": mode, "num_shards": self.num_shards, "shards": metas}

    def load(self, path: str, converter: str | None = None) -> dict[str, Any]:
        """Every shard loads ``path/shard-K-of-N/``; from a save of another shard count M, the
        keys that route to it from every part (resharding, streaming; files, not Redis).

        Two phases: every shard first checks its directory (manifest, files, checksums, shard
        count) and only when all are good do they load, so a bad checkpoint changes no shard.
        A full save (``checkpoint``/``batch``: every row of its tables) loaded into every
        shard is the recovery from a shard restart: the client then expects the shards'
        current incarnations (:class:`~streamrec.embedding_store.errors.ShardRestarted`).
        Returns {"path", "num_shards", "resharded": "M -> N", or None for a save of N}.
        """
        meta = {"path": str(path), **self._converter_meta(converter)}
        self._create_tables()  # a shard restarted empty holds the namespace again
        checked = self._link.broadcast("load", {**meta, "verify_only": True})
        self._link.broadcast("load", meta, adopt={m.get("mode") for m in checked} <= FULL_MODES)
        resharded = checked[0].get("resharded")  # the same on every shard: "M -> N"
        return {"path": str(path), "num_shards": self.num_shards, "resharded": resharded}

    def accept_restarts(self, incarnations: list[int | None] | None = None) -> list[str]:
        """Goes on with the shards as they are: a restarted (empty) shard is served again.

        For a job with no checkpoint to reload (after one, :meth:`load` does this itself).

        Args:
            incarnations: shard K's incarnation to expect (another client's
                :meth:`incarnations`, e.g. of the rank that loaded the checkpoint); None
                asks every shard now.

        Returns:
            the endpoints of the shards that had restarted.
        """
        if incarnations is not None:
            return self._link.incarnations.adopt(incarnations)
        self._create_tables()  # a shard restarted empty holds the namespace again
        before = self._link.incarnations.known()
        self._link.broadcast("ping", adopt=True)
        after = self._link.incarnations.known()
        return [
            e
            for e, old, new in zip(self.endpoints, before, after, strict=True)
            if old is not None and new is not None and old != new
        ]

    def drop_namespace(self) -> dict[str, int]:
        """Drops this client's namespace on every shard, freeing its rows; returns the rows
        dropped per table (summed over shards). A shard without it drops nothing (a drop is
        idempotent). The client's ops then fail with ``UnknownNamespace``.

        Raises:
            BadRequest: the client uses the default namespace (the shards' ``--tables``).
        """
        if self.namespace == DEFAULT_NAMESPACE:
            raise BadRequest(
                "drop_namespace: this client uses the default namespace (the shards' "
                "--tables), which is not dropped; make the client with namespace=..."
            )
        total: dict[str, int] = {}
        for meta in self._link.broadcast("drop_tables"):
            for name, rows in (meta.get("dropped") or {}).items():
                total[name] = total.get(name, 0) + int(rows)
        return total

    def incarnations(self) -> list[int | None]:
        """Shard K's incarnation this client expects (None: not known yet, or a shard that
        sends none)."""
        return self._link.incarnations.known()

    @staticmethod
    def _converter_meta(converter: Any) -> Meta:
        if converter is None:
            return {}
        if converter not in ("files", "redis"):
            raise BadRequest(
                f"converter must be None, 'files' or 'redis' for the remote store, got "
                f"{converter!r} (converter objects work with the in-process store)"
            )
        return {"converter": converter}

    def shard_dirs(self, path: str) -> list[str]:
        """Where each shard saves under ``path``."""
        return [f"{path}/{shard_dir_name(k, self.num_shards)}" for k in range(self.num_shards)]
