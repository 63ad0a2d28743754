"""What a save or a load needs of a store: :class:`TablesOnTiers`.

Persistence reads and writes a store's tables through this Protocol, not through
:class:`~streamrec.embedding_store.store.EmbeddingStore` itself: the store calls persistence,
so persistence naming the store would close an import circle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from streamrec.embedding_store.deletes import DeletedKeys, DeleteReason
from streamrec.embedding_store.tiers.table_tier import TableTier
from streamrec.store_schema import StoreOptions, TableOptions


class TablesOnTiers(Protocol):
    """A store's tables, each on its tier, with the store's day and options."""

    #: days advanced (a full load sets the saved one)
    day: int
    #: the last base or delta saved or loaded (persistence/versions.py); 0: none
    model_version: int

    @property
    def tables(self) -> dict[str, TableOptions]:
        """Table name -> options, in construction order."""
        ...

    @property
    def options(self) -> StoreOptions:
        """The store's options (its tier and seed go into a save's manifest)."""
        ...

    def tier(self, table: str) -> TableTier:
        """``table``'s tier (its layout: ``dim``, ``width``, ``options``, ``capacity``)."""
        ...

    def exclusive(self, table: str) -> AbstractContextManager[TableTier]:
        """``table``'s tier under the table's write lock (rows exported or imported)."""
        ...

    def deleted_keys(self, table: str) -> DeletedKeys:
        """Keys of ``table`` deleted since the last base or delta save (under
        :meth:`exclusive`)."""
        ...

    def count_deleted(self, table: str, reason: DeleteReason, rows: int) -> None:
        """Counts ``rows`` deleted from ``table`` for ``reason``."""
        ...
