"""``SparseTables``: every slot's embedding rows for a batch as one tensor, one op per step.

The store (a :class:`~streamrec.embedding_store.SparseStore`: in-process or the shards'
client) is called once per batch for every table, with every table's keys and rows as one
block (``pull_rows``/``push_rows``: one request per shard with the service); everything
around those calls is fused over the tables, so a batch costs a fixed number of torch ops
whatever the number of slots. For ``S`` slots of a batch of ``B`` samples::

    prepare (prefetch thread, pure):  per slot the unique keys u_t and the inverse, all
        inverses shifted into one row space: index (nnz,) over U = sum(u_t) rows
    pull (sparse worker):  one pull_rows of S tables -> weights (U, dim), one leaf with
        requires_grad
    forward (main thread):  one gather (one id per bag) or one embedding_bag (ragged)
        -> (B, S, dim)
    push (sparse worker):  shows/clicks of all slots with one bincount/index_add, then one
        push_many of the S tables' row slices (contiguous views, no copies)

    slot 0 keys [7, 3, 7]    u_0 = 2  rows 0..1     index [0, 1, 0,
    slot 1 keys [5, 5, 9]    u_1 = 2  rows 2..3            2, 2, 3]   (table-major)

The gradients are those of ``embedding_bag(mode="sum")`` per table: the summed gradient of
each unique key, as :class:`streamrec.embedding_store.StoreEmbeddingBags` computes them.

A batch of a schema's list features (``Batch.bags``: S ragged features, any number of keys
a bag) takes the same path with table-major bag offsets; a ``mean`` feature's values weigh
1 / their bag's length (``per_sample_weights``), so a key's gradient is the sum over its bags
of each bag's gradient divided by that bag's length; an empty bag pools to zeros. A batch of
one key a slot keeps the (S, B) gather: ``mean`` and ``sum`` are one there.

Tables of several dims (a schema's per-feature ``dim``): a store block holds tables of one
width, so the slots are grouped by dim (a shared table's slots in one group: a table has
one dim), each group is a ``SparseTables`` of its own, and a batch is one block per dim
(``SparseBatch.parts``): one pull and one push a dim, and :meth:`SparseTables.forward`
gives S tensors (B, d_k) in slot order, which ``DLRMDense`` projects to its dim::

    dims [16, 4, 16, 4]  ->  group 16: slots 0, 2     group 4: slots 1, 3
    forward: [(B, 16), (B, 4), (B, 16), (B, 4)]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from streamrec.ragged import RaggedTensor
from streamrec.trainer import _C
from streamrec.trainer.data.batches import Batch
from streamrec.trainer.errors import ModelShapeError

if TYPE_CHECKING:
    from streamrec.embedding_store import SparseStore


class _Gather(torch.autograd.Function):
    """rows = weights[index]; backward: the output's gradient summed into the rows.

    On the CPU the sum is :func:`streamrec.trainer._C.add_rows` (feature by feature, the
    gradient read where it lies); elsewhere one ``index_add_``. ``F.embedding``'s CPU
    backward sorts the indices first, about twice as slow on a batch of setup b (26 x 2,048
    ids over ~45,000 rows), with the same sums.
    """

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """weights (U, d); index (B, S), a transposed view of an (S, B) tensor."""
        ctx.save_for_backward(index)
        ctx.rows = weights.shape[0]
        return weights.index_select(0, index.reshape(-1)).view(*index.shape, weights.shape[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        dim = grad.shape[-1]
        out = torch.zeros(ctx.rows, dim, dtype=grad.dtype, device=grad.device)
        by_feature = index.t()  # (S, B)
        if grad.device.type == "cpu" and grad.dtype == torch.float32 and by_feature.is_contiguous():
            _C.add_rows(out, by_feature, grad if grad.stride(-1) == 1 else grad.contiguous())
            return out, None
        return out.index_add_(0, index.reshape(-1), grad.reshape(-1, dim)), None


@dataclass
class SparseBatch:
    """A batch's sparse side, fused over its ``S`` tables.

    Attributes:
        keys: T tensors (u_t,) int64, the unique keys of each table (first occurrence order);
            T = S unless slots share a table (its keys deduplicated over them).
        bounds: T + 1 ints; table t owns rows ``bounds[t]:bounds[t + 1]`` of ``weights``.
        index: (S, B) int64 row of each sample's key when every bag holds one key
            (``offsets`` None), else (nnz,) int64 table-major.
        offsets: None (one key per bag), or (S * B + 1,) int64 bag offsets, table-major.
        value_rows: None, or (nnz,) int64 the sample of each value (ragged case).
        batch: B.
        value_weights: None (every bag summed), or (nnz,) float32 each value's weight in
            its bag: 1 in a ``sum`` feature, 1 / bag length in a ``mean`` one.
        weights: (U, dim) float32 leaf with ``requires_grad`` once pulled, else None.
        flat_keys: (U,) int64, ``keys`` end to end (``keys`` are views of it when the
            batch was prepared here), or None until pulled.
        parts: None, or with tables of several dims one batch a dim (the fields above then
            empty: ``keys`` [], ``bounds`` [0]), in the order of ``SparseTables.by_dim``.
    """

    keys: list[torch.Tensor]
    bounds: list[int]
    index: torch.Tensor
    offsets: torch.Tensor | None
    value_rows: torch.Tensor | None
    batch: int
    value_weights: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    flat_keys: torch.Tensor | None = None
    parts: list[SparseBatch] | None = None

    @property
    def counts(self) -> list[int]:
        """Keys per table (T,)."""
        return [b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]


class SparseTables:
    """The sparse slots of a DLRM over an embedding store, fused over tables.

    Args:
        store: the embedding store, in-process or the shards' client.
        tables: table names, one per slot, in slot order; slots naming one table share its
            rows (a key of both is pulled once, its gradients over both summed).
        dim: the rows' width (every slot's, unless ``dims`` says otherwise).
        threads: not used: every ``SparseStore`` takes a batch's tables in one call.
        pooling: per slot ``sum`` or ``mean`` (None: all ``sum``); the two differ only in a
            bag of more than one key (a ragged batch's), where ``mean`` weighs each key by
            1 / the bag's length, so its gradient is divided by it too.
        dims: per slot its table's width (None: all ``dim``); of several widths, the
            slots are grouped by width (:attr:`by_dim`) and :meth:`forward` gives S tensors
            (B, dims[k]).

    Example:
        >>> sp = SparseTables(store, ["t0", "t1"], dim=16)
        >>> sb = sp.pull(sp.prepare(batch), create=True)     # worker thread
        >>> ly = sp.forward(sb)                              # (B, 2, 16), differentiable
        >>> loss(dense(batch.dense, ly)).backward(); sp.push(sb, batch.labels)
    """

    def __init__(
        self,
        store: SparseStore,
        tables: list[str],
        dim: int,
        threads: int = 1,
        pooling: Sequence[str] | None = None,
        dims: Sequence[int] | None = None,
    ) -> None:
        from streamrec.embedding_store import unique_groups

        if not tables:
            raise ModelShapeError("SparseTables needs at least one table")
        #: the table of each slot; slots naming one table share its rows (a schema's table:)
        self.slot_tables = list(tables)
        pooling = ["sum"] * len(tables) if pooling is None else list(pooling)
        if len(pooling) != len(tables) or not set(pooling) <= {"sum", "mean"}:
            raise ModelShapeError(
                f"pooling must be 'sum' or 'mean' for each of {len(tables)} tables, got {pooling}"
            )
        self.mean = torch.tensor([p == "mean" for p in pooling])
        self.store = store
        #: the distinct tables, in the order of their first slot (what the store is called with)
        self.tables = list(dict.fromkeys(tables))
        #: per table, its slots in order
        self.groups = [[k for k, t in enumerate(tables) if t == name] for name in self.tables]
        self.dim = int(dim)
        # an in-process store whose rows live on a GPU hands them over there (no host copy)
        self.device: torch.device | None = store.resident_device()
        self._unique_groups = unique_groups
        #: the slots table after table (each table's slots together: one dedup group)
        self._group_order = [k for slots in self.groups for k in slots]
        self._slot_order = all(slots == [k] for k, slots in enumerate(self.groups))
        #: tables of several dims: per dim (first slot's order) its slots and their tables
        self.by_dim: list[tuple[list[int], SparseTables]] | None = None
        if dims is not None:
            self._group_dims(store, [int(d) for d in dims], threads, pooling)

    def _group_dims(
        self, store: SparseStore, dims: list[int], threads: int, pooling: list[str]
    ) -> None:
        """Sets :attr:`dim` (one width) or :attr:`by_dim` (several) from each slot's ``dims``."""
        tables = self.slot_tables
        if len(dims) != len(tables) or min(dims) < 1:
            raise ModelShapeError(f"dims must be {len(tables)} widths >= 1, got {dims}")
        for name, slots in zip(self.tables, self.groups, strict=True):
            if len({dims[k] for k in slots}) > 1:
                raise ModelShapeError(
                    f"table {name!r} has one dim, its slots {slots} say {[dims[k] for k in slots]}"
                )
        widths = list(dict.fromkeys(dims))
        if len(widths) == 1:
            self.dim = widths[0]
            return
        self.by_dim = []
        for d in widths:
            slots = [k for k, w in enumerate(dims) if w == d]
            part = SparseTables(
                store, [tables[k] for k in slots], d, threads, [pooling[k] for k in slots]
            )
            self.by_dim.append((slots, part))

    def close(self) -> None:
        """Nothing held (kept for the runner's teardown)."""

    def prepare(self, batch: Batch) -> SparseBatch:
        """Dedup per table and the fused row index (pure: safe on the prefetch thread).

        Args:
            batch: keys (B, S) int64, present (B, S) bool or None; or S ragged ``bags``.
        """
        b, s = len(batch), batch.num_features
        if s != len(self.slot_tables):
            raise ModelShapeError(
                f"batch has {s} sparse slots, expected {len(self.slot_tables)} "
                f"(one per slot's table {self.slot_tables})"
            )
        if self.by_dim is not None:
            parts = [t.prepare(_slots_of(batch, slots)) for slots, t in self.by_dim]
            empty = torch.zeros(0, dtype=torch.int64)
            return SparseBatch([], [0], empty, None, None, b, parts=parts)
        if batch.bags is not None:
            return self._prepare_bags(batch.bags, b)
        cols = batch.keys.t().contiguous()
        mask = None if batch.present is None else batch.present.t().contiguous()
        keys, bounds, index = self._dedup(
            [cols[t] if mask is None else cols[t][mask[t]] for t in range(s)],
            cols.view(-1) if mask is None else None,
        )
        if mask is None:
            return SparseBatch(
                _split(keys, bounds), bounds, index.view(s, b), None, None, b, flat_keys=keys
            )
        offsets = torch.zeros(s * b + 1, dtype=torch.int64)
        torch.cumsum(mask.view(-1).to(torch.int64), 0, out=offsets[1:])
        value_rows = torch.arange(b).expand(s, b)[mask]
        return SparseBatch(
            _split(keys, bounds), bounds, index, offsets, value_rows, b, flat_keys=keys
        )

    def _prepare_bags(self, bags: list[RaggedTensor], b: int) -> SparseBatch:
        """:meth:`prepare` of S ragged features (any number of keys a bag): per table the
        unique keys and the inverse, then the table-major bag offsets of all S * B bags."""
        s = len(bags)
        keys, bounds, index = self._dedup([f.values() for f in bags])
        offsets = [torch.zeros(1, dtype=torch.int64)]
        nnz = 0
        for f in bags:
            offsets.append(f.offsets()[1:] + nnz)
            nnz += int(f.values().numel())
        flat_offsets = torch.cat(offsets)
        lengths = flat_offsets.diff()  # (S * B,) keys a bag
        value_rows = torch.repeat_interleave(torch.arange(b).repeat(s), lengths)
        value_weights = None
        if bool(self.mean.any()):
            per_bag = torch.where(
                self.mean.repeat_interleave(b),
                1.0 / lengths.clamp(min=1).to(torch.float32),
                torch.ones(s * b),
            )
            value_weights = torch.repeat_interleave(per_bag, lengths)
        return SparseBatch(
            _split(keys, bounds),
            bounds,
            index,
            flat_offsets,
            value_rows,
            b,
            value_weights,
            flat_keys=keys,
        )

    def _dedup(
        self, values: list[torch.Tensor], flat: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """Per table the unique keys of all its slots' ``values`` ((n_k,) int64 each, slot
        order), in one C++ call (a shared table: one dedup over its slots, so a key has one
        row).

        Args:
            flat: ``values`` laid end to end when the caller has them so (no copy).

        Returns:
            keys: (U,) int64, each table's distinct keys, table after table; bounds: T + 1
            ints, table ``i`` owns rows ``bounds[i]:bounds[i + 1]``; index: (sum n_k,) int64,
            each value's row, slot after slot.
        """
        sizes = [int(v.numel()) for v in values]
        if self._slot_order:  # every table one slot, in slot order: the groups are the slots
            grouped = flat if flat is not None else torch.cat(values)
            keys, index, distinct = self._unique_groups(grouped, sizes)
        else:
            grouped = torch.cat([values[k] for k in self._group_order])
            group_sizes = [sum(sizes[k] for k in slots) for slots in self.groups]
            keys, inverse, distinct = self._unique_groups(grouped, group_sizes)
            pieces = inverse.split([sizes[k] for k in self._group_order])
            by_slot = dict(zip(self._group_order, pieces, strict=True))
            index = torch.cat([by_slot[k] for k in range(len(values))])
        return keys, list(itertools.accumulate(distinct, initial=0)), index

    def pull(self, sb: SparseBatch, create: bool) -> SparseBatch:
        """Pulls every table's rows into ``sb.weights`` (U, dim) float32 leaf; returns sb.

        create: create absent keys (training), or read them as zeros (prediction).
        """
        if sb.parts is not None:
            assert self.by_dim is not None, "prepared by these tables"
            for (_, t), part in zip(self.by_dim, sb.parts, strict=True):
                t.pull(part, create)
            return sb
        if sb.flat_keys is None:
            sb.flat_keys = torch.cat(sb.keys)
        weights = self.store.pull_rows(self.tables, sb.flat_keys, sb.counts, create=create)
        sb.weights = weights.detach().requires_grad_(True)
        return sb

    def forward(self, sb: SparseBatch) -> torch.Tensor | list[torch.Tensor]:
        """Pooled embeddings (B, S, dim) float32, differentiable w.r.t. ``sb.weights``, on
        the weights' device (a GPU when the store's rows live there); with tables of
        several dims S tensors (B, dims[k]) in slot order."""
        if sb.parts is not None:
            assert self.by_dim is not None, "prepared by these tables"
            out: list[torch.Tensor] = [sb.index] * len(self.slot_tables)  # each set below
            for (slots, t), part in zip(self.by_dim, sb.parts, strict=True):
                pooled = t.forward(part)
                assert isinstance(pooled, torch.Tensor), "a part has one dim"
                for j, k in enumerate(slots):
                    out[k] = pooled[:, j]
            return out
        assert sb.weights is not None, "pull before forward"
        device = sb.weights.device
        index = sb.index.to(device, non_blocking=True)  # no-op on the CPU
        if sb.offsets is None:
            return _Gather.apply(sb.weights, index.t())
        s = len(self.slot_tables)
        offsets = sb.offsets.to(device, non_blocking=True)
        weights = None
        if sb.value_weights is not None:
            weights = sb.value_weights.to(device, sb.weights.dtype, non_blocking=True)
        pooled = F.embedding_bag(
            index,
            sb.weights,
            offsets,
            mode="sum",
            per_sample_weights=weights,
            include_last_offset=True,
        )
        return pooled.view(s, sb.batch, self.dim).transpose(0, 1)

    def push(self, sb: SparseBatch, labels: torch.Tensor, grad_scale: float = 1.0) -> None:
        """Pushes each table's summed gradients (after backward), shows and clicks.

        Args:
            sb: the pulled batch the forward used.
            labels: (B,) click labels, any real dtype.
            grad_scale: multiplies the gradients (PaddleRec's batch-size scaling).
        """
        if sb.parts is not None:
            assert self.by_dim is not None, "prepared by these tables"
            for (_, t), part in zip(self.by_dim, sb.parts, strict=True):
                t.push(part, labels, grad_scale)
            return
        assert sb.weights is not None, "pull before push"
        u = sb.bounds[-1]
        if u == 0:
            return
        labels = labels.detach().to("cpu", torch.float32).reshape(-1)
        if labels.numel() != sb.batch:
            raise ModelShapeError(f"labels: expected {sb.batch} values, got {labels.numel()}")
        grad = sb.weights.grad
        grad = torch.zeros_like(sb.weights) if grad is None else grad.detach()
        if grad_scale != 1.0:
            grad = grad.mul(grad_scale)
        index = sb.index.reshape(-1)
        if sb.value_rows is None:
            value_labels = labels.expand(len(self.slot_tables), sb.batch).reshape(-1)
        else:
            value_labels = labels[sb.value_rows]
        shows = torch.bincount(index, minlength=u).to(torch.float32)
        clicks = torch.zeros(u).index_add_(0, index, value_labels)
        assert sb.flat_keys is not None, "pulled by pull_rows"
        self.store.push_rows(self.tables, sb.flat_keys, sb.counts, grad, shows, clicks)
        sb.weights.grad = None


def _split(keys: torch.Tensor, bounds: list[int]) -> list[torch.Tensor]:
    """Each table's keys: views of the tables' keys laid end to end."""
    return list(keys.split([b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))


def _slots_of(batch: Batch, slots: list[int]) -> Batch:
    """The batch with only the sparse features ``slots`` (dense and labels shared)."""
    if batch.bags is not None:
        return Batch(batch.dense, batch.labels, batch.keys, bags=[batch.bags[k] for k in slots])
    cols = torch.tensor(slots, dtype=torch.int64)
    present = None if batch.present is None else batch.present.index_select(1, cols)
    return Batch(batch.dense, batch.labels, batch.keys.index_select(1, cols), present)
