"""OneEmbedding-style multi-table lookup and EmbeddingBag-style pooling, over ``pull``.

Both use only a store's public ``tables`` and ``pull``, so they read the same whether the
rows are in-process or remote; :class:`~streamrec.embedding_store.store.EmbeddingStore`
offers them as its ``lookup`` and ``pull_bags`` methods.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from streamrec.embedding_store.dedup import unique_keys
from streamrec.embedding_store.errors import InvalidInput
from streamrec.embedding_store.validation import as_keys
from streamrec.store_schema import TableOptions


class PullingStore(Protocol):
    """What a lookup needs of a store."""

    @property
    def tables(self) -> dict[str, TableOptions]: ...

    def pull(self, table: str, keys: Any, create: bool = True) -> torch.Tensor: ...


def lookup(
    store: PullingStore, ids: Any, table_ids: Any | None = None, create: bool = True
) -> torch.Tensor:
    """Multi-table lookup (OneEmbedding's); the tables involved must share one dim.

    Args:
        store: where the rows are.
        ids: (batch, num_tables) int64, column j looked up in the j-th table (construction
            order); or (n,) int64 with ``table_ids``.
        table_ids: (n,) integer table index per id, or None.
        create: as in ``pull``.

    Returns:
        (batch, num_tables, dim) float32, or (n, dim) with ``table_ids``.
    """
    tables = store.tables
    names = list(tables)
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids.view(np.int64) if ids.dtype == np.uint64 else ids)
    if not isinstance(ids, torch.Tensor):
        raise InvalidInput(f"ids must be a tensor or ndarray, got {type(ids).__name__}")
    if table_ids is None:
        if ids.dim() != 2 or ids.shape[1] > len(names):
            raise InvalidInput(
                f"ids must be (batch, num_tables <= {len(names)}), got {tuple(ids.shape)}"
            )
        used = names[: ids.shape[1]]
        _same_dim(tables, used)
        cols = [store.pull(t, ids[:, j].contiguous(), create) for j, t in enumerate(used)]
        dim = tables[used[0]].checked_dim()
        return torch.stack(cols, 1) if cols else torch.zeros(ids.shape[0], 0, dim)
    keys = as_keys(ids, "ids")
    tids = as_keys(table_ids, "table_ids")
    if tids.numel() != keys.numel():
        raise InvalidInput(f"table_ids must match ids in length {keys.numel()}, got {tids.numel()}")
    if keys.numel() and (int(tids.min()) < 0 or int(tids.max()) >= len(names)):
        raise InvalidInput(
            f"table_ids must be in [0, {len(names)}), got {int(tids.min())}..{int(tids.max())}"
        )
    present = [int(t) for t in torch.unique(tids)]
    _same_dim(tables, [names[t] for t in present] or names[:1])
    out = torch.zeros(keys.numel(), tables[names[present[0] if present else 0]].checked_dim())
    for t in present:
        sel = (tids == t).nonzero().squeeze(1)
        out[sel] = store.pull(names[t], keys[sel], create)
    return out


def _same_dim(tables: dict[str, TableOptions], names: list[str]) -> None:
    dims = {tables[n].checked_dim() for n in names}
    if len(dims) > 1:
        raise InvalidInput(f"tables {names} differ in dim {sorted(dims)}; lookup needs one dim")


def pull_bags(
    store: PullingStore,
    table: str,
    keys: Any,
    offsets: Any,
    pooling: str = "sum",
    create: bool = True,
) -> torch.Tensor:
    """Pooled bags (DLRM's EmbeddingBag), no autograd.

    Args:
        store: where the rows are.
        table: table name.
        keys: (nnz,) int64, the bags' keys concatenated.
        offsets: (bags + 1,) int64, bag i = keys[offsets[i]:offsets[i + 1]].
        pooling: "sum" or "mean" (an empty bag pools to zeros).
        create: as in ``pull``.

    Returns:
        (bags, dim) float32.
    """
    if pooling not in ("sum", "mean"):
        raise InvalidInput(f"pooling must be 'sum' or 'mean', got {pooling!r}")
    keys = as_keys(keys)
    offsets = as_keys(offsets, "offsets")
    if (
        offsets.numel() < 1
        or int(offsets[0]) != 0
        or int(offsets[-1]) != keys.numel()
        or bool((offsets[1:] < offsets[:-1]).any())
    ):
        raise InvalidInput(
            f"offsets must rise from 0 to len(keys)={keys.numel()}, got {offsets.tolist()[:8]}"
        )
    uniq, inverse = unique_keys(keys)
    weights = store.pull(table, uniq, create)
    return F.embedding_bag(inverse, weights, offsets, mode=pooling, include_last_offset=True)
