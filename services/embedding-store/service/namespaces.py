"""A shard's namespaces: each job's tables apart from every other job's (jobs share no state).

A shard holds its tables in namespaces, one in-process
:class:`~streamrec.embedding_store.EmbeddingStore` each, so two jobs on the same shards never
see each other's rows, may give one table name other dims, and a new job starts from fresh
rows (the control plane names a job's namespace after the job)::

    ""         the default namespace: the tables of ``--tables`` (may be none)
    "job-17"   made by create_tables {namespace: "job-17", tables: [...]}, gone with
               drop_tables {namespace: "job-17"} (its rows freed)

Every data op names its namespace in its meta (absent or ``""``: the default one). A name
the shard does not hold is answered at once with
:class:`~streamrec.embedding_store.errors.UnknownNamespace`: the namespace was dropped, or
the shard restarted empty (then the client sees it on its next op, not after a timeout).

``create_tables`` is idempotent: a table the namespace holds with the same options is left as
it is (rows kept), a new name is added, a name held with other options is refused
(:class:`~streamrec.embedding_store.errors.TableConflict`, naming the table and both dims).
Names match :data:`NAMESPACE_PATTERN`; a shard holds at most ``max_namespaces`` besides the
default one, and a namespace at most :data:`MAX_TABLES` tables.

What a drop means for serving: a namespace is a job's training state, and dropping it ends
that state; it deletes none of what the job published. Its saves stay on disk and its
serving Redis keeps answering with the last base and deltas written (the job's model, as
it was), until someone writes a new base under that prefix or clears it. The drop carries
no deletes to serving (there is no store left to save a delta from; a namespace made again
under the name starts at ``model_version`` 0, so its deltas are refused by a Redis that
serves the old job until it publishes a base). The rows it frees are counted as deleted,
reason ``namespace_drop`` (:meth:`Namespaces.dropped_rows`, summed over the dropped
namespaces per table: job ids come and go, a series each would grow without bound).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamrec.embedding_store.errors import TableConflict, UnknownNamespace
from streamrec.errors import BadRequest, quote
from streamrec.store_schema import NAMESPACE_PATTERN, TableOptions

if TYPE_CHECKING:
    from streamrec.embedding_store.store import EmbeddingStore

_NAMESPACE = re.compile(NAMESPACE_PATTERN)
#: The namespace of ``--tables`` and of requests that name none.
DEFAULT_NAMESPACE = ""
#: Namespaces a shard holds besides the default one, unless configured otherwise.
MAX_NAMESPACES = 64
#: Tables one namespace may hold.
MAX_TABLES = 1024
#: Request meta field naming the namespace.
FIELD = "namespace"

#: Makes the store of a new namespace: (namespace, its first tables) -> store.
StoreFactory = Callable[[str, list[TableOptions]], "EmbeddingStore"]


def check_namespace(value: object, field: str = FIELD) -> str:
    """``value`` as a namespace name: None or ``""`` is the default namespace.

    Raises:
        BadRequest: not a string matching :data:`NAMESPACE_PATTERN`, naming field and value.
    """
    if value is None or value == DEFAULT_NAMESPACE:
        return DEFAULT_NAMESPACE
    if not isinstance(value, str) or not _NAMESPACE.match(value):
        raise BadRequest(
            f"field {field!r} must be a namespace name matching {NAMESPACE_PATTERN} (or "
            f"absent for the default one), got {quote(value)}"
        )
    return value


def parse_tables(value: object, field: str = "tables") -> list[TableOptions]:
    """The table option dicts of a ``create_tables`` request, validated.

    Raises:
        BadRequest: not a list of 1 to :data:`MAX_TABLES` option dicts, an invalid one, or a
            name repeated; the message names the field, the index and the value.
    """
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TABLES:
        got = f"a list of {len(value)}" if isinstance(value, list) else quote(value)
        raise BadRequest(
            f"field {field!r} must be a list of 1 to {MAX_TABLES} table option dicts, got {got}"
        )
    tables = []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise BadRequest(f"field '{field}'[{i}] must be a table option dict, got {quote(t)}")
        tables.append(TableOptions.parse(t, source=f"field '{field}'[{i}]"))
    names = [t.name for t in tables]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadRequest(f"field {field!r}: table names repeat: {dup}")
    return tables


def _conflict(namespace: str, held: TableOptions, asked: TableOptions) -> str | None:
    """Why ``asked`` cannot join ``namespace`` where ``held`` has its name; None when equal."""
    mine, theirs = held.model_dump(mode="json"), asked.model_dump(mode="json")
    if mine == theirs:
        return None
    fields = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    return (
        f"namespace {namespace!r} holds table {held.name!r} with dim {held.dim}; asked for dim "
        f"{asked.dim} (options that differ: {', '.join(fields)}): drop the namespace or use "
        f"another one"
    )


class Namespaces:
    """The namespaces of one shard: name -> its own store. Thread-safe; looking one up is a
    dict read, so it costs the hot path nothing.

    Args:
        default: the default namespace's store (the ``--tables``; it may hold none).
        make: builds the store of a new namespace.
        max_namespaces: namespaces held at once besides the default one.
    """

    def __init__(
        self, default: EmbeddingStore, make: StoreFactory, max_namespaces: int = MAX_NAMESPACES
    ):
        self._stores: dict[str, EmbeddingStore] = {DEFAULT_NAMESPACE: default}
        self._make = make
        self.max_namespaces = max_namespaces
        self._lock = threading.Lock()  # serialises create and drop
        #: rows freed by drops, per table name, over every namespace dropped
        self._dropped_rows: dict[str, int] = {}

    @property
    def default(self) -> EmbeddingStore:
        return self._stores[DEFAULT_NAMESPACE]

    def names(self) -> list[str]:
        """Namespaces held, the default one first."""
        return list(self._stores)

    def get(self, namespace: str) -> EmbeddingStore:
        """The store of ``namespace`` (checked with :func:`check_namespace` already).

        Raises:
            UnknownNamespace: the shard holds no such namespace.
        """
        store = self._stores.get(namespace)
        if store is None:
            held = [n for n in self._stores if n != DEFAULT_NAMESPACE]
            raise UnknownNamespace(
                f"unknown namespace {namespace!r}: this shard holds "
                f"{held[:20] if held else 'none'} besides the default one (dropped, or the "
                f"shard restarted empty: create its tables again and reload a checkpoint)"
            )
        return store

    def of(self, meta: dict[str, Any]) -> tuple[str, EmbeddingStore]:
        """(namespace, store) of a request's ``namespace`` field."""
        namespace = check_namespace(meta.get(FIELD))
        return namespace, self.get(namespace)

    def create(self, namespace: str, tables: Sequence[TableOptions]) -> list[str]:
        """Makes ``tables`` in ``namespace`` (made first if new); returns the names it made
        (those held with the same options are left as they are).

        Raises:
            TableConflict: a table held with other options (nothing is made).
            BadRequest: a new namespace beyond ``max_namespaces``, or more than
                :data:`MAX_TABLES` tables.
        """
        with self._lock:
            store = self._stores.get(namespace)
            held = store.tables if store is not None else {}
            for t in tables:
                if t.name in held:
                    why = _conflict(namespace, held[t.name], t)
                    if why is not None:
                        raise TableConflict(why)
            new = [t for t in tables if t.name not in held]
            if len(held) + len(new) > MAX_TABLES:
                raise BadRequest(
                    f"field 'tables': namespace {namespace!r} would hold "
                    f"{len(held) + len(new)} tables, at most {MAX_TABLES}"
                )
            if store is None:
                if len(self._stores) - 1 >= self.max_namespaces:
                    raise BadRequest(
                        f"field 'namespace': {namespace!r} would be namespace "
                        f"{len(self._stores)} of this shard, which holds at most "
                        f"{self.max_namespaces} (drop finished jobs' namespaces)"
                    )
                self._stores = {**self._stores, namespace: self._make(namespace, new)}
            elif new:
                store.add_tables(new)
            return [t.name for t in new]

    def drop(self, namespace: str) -> dict[str, int] | None:
        """Drops ``namespace`` and frees its rows; returns its tables' rows on this shard, or
        None when it held no such namespace (a drop is idempotent).

        Raises:
            BadRequest: the default namespace (the shard's ``--tables``) is not dropped.
        """
        if namespace == DEFAULT_NAMESPACE:
            raise BadRequest(
                "field 'namespace': the default namespace holds the shard's --tables and "
                "cannot be dropped; name a job's namespace"
            )
        with self._lock:
            store = self._stores.get(namespace)
            if store is None:
                return None
            self._stores = {n: s for n, s in self._stores.items() if n != namespace}
        rows = {name: int(store.size(name)) for name in store.tables}
        store.close()  # waits for calls in flight on its tables; later ones: unknown
        with self._lock:
            for name, n in rows.items():
                self._dropped_rows[name] = self._dropped_rows.get(name, 0) + n
        return rows

    def dropped_rows(self) -> dict[str, int]:
        """Rows freed by namespace drops since the shard started, per table name (summed over
        every namespace dropped): the ``namespace_drop`` deletes of the metrics."""
        with self._lock:
            return dict(self._dropped_rows)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Namespace -> its store's ``stats()`` (what the metrics read at scrape time)."""
        out = {}
        for namespace, store in list(self._stores.items()):
            try:
                out[namespace] = store.stats()
            except Exception:  # dropped meanwhile (closed): it holds nothing any more
                continue
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Namespace -> {"tables": {table: rows}, "rows": total}: who holds what here."""
        return {
            namespace: {
                "tables": {t: int(s["rows"]) for t, s in stats["tables"].items()},
                "rows": int(stats["rows"]),
            }
            for namespace, stats in self.stats().items()
        }

    def close(self) -> None:
        """Closes every namespace's store."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()
