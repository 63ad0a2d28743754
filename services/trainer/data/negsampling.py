"""Negative sampling through the node-local sampler (RecIS's ``neg_sampling_fn``, see
docs/design-notes.md).

Each batch of positives is expanded, in the prefetch thread, to positives + sampled
negatives before it reaches the store and the model::

    positives (n rows)                     item id in slot `item_slot`, category in
                                           `category_slot` (optional)
    neg  = sampler.sample_ids(items, cnts = sample_size - 1, categories)
    ids  = combine_vector_with_sample_counts(valid_sample_ids(items), cnts, neg)
    rows = pack_feature(ids)               item-side slots from the negative table
    out  = combine(batch, rows, cnts)      user-side slots and dense features repeated,
                                           label 1 for positives, 0 for negatives

The negative table (Parquet) names its columns after the slots: the item id column is
``slot_<item_slot>`` (the sampler's dedup_tag), the category column ``slot_<category_slot>``
(sample_tag), plus ``weight`` and ``skey`` (RecIS's deprecated string column) and any other
item-side ``slot_<k>`` listed in ``item_slots``.

A schema job names its item-side features instead (``item_features``, the item id first,
``category_feature``), and the table's columns are those features' names::

    schema sparse [user_id, item_id, genres]     item_features [item_id, genres]
    table columns  item_id (one int64 id a row), genres (a list of ids, any length),
                   category (or category_feature's column), weight, skey

Its batches are ragged (``Batch.bags``): every feature is a RaggedTensor, user-side ones
repeated row by row, item-side ones packed from the table (a list column stays a list; a
one-id column is a bag of one) and combined with the positives, which take their own
item's row too (RecIS's ``combine``). A positive's item bag holds one id, or none (the
item is then ``default_value``'s, as an id missing from the table); several is a
:class:`DataError`. Ids in the table are int64: hash string ids with
``streamrec.keyhash.string_keys``, as the trainer hashes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from streamrec.ragged import RaggedTensor
from streamrec.trainer import metrics as m
from streamrec.trainer.data.batches import Batch
from streamrec.trainer.errors import ConfigError, DataError, PassFailed

if TYPE_CHECKING:
    from streamrec.control.feature_schema import FeatureSchema

#: The longest a pass waits for its node's sampler to be back after it died (the launcher,
#: the DaemonSet or this node's auto-start brings it back in seconds).
RECONNECT_TIMEOUT_S = 60.0
#: The share of the group's collective timeout (``distributed.timeout_s``) a rank may spend
#: waiting for its sampler: the other ranks wait for it in the step's all-reduce, so a
#: longer wait would time their collective out and fail the pass as a lost peer, not a lost
#: sampler (see :func:`sampler_wait_s`).
SAMPLER_WAIT_SHARE = 0.8


def sampler_wait_s(collective_timeout_s: float) -> float:
    """How long a rank waits for its sampler to come back: ``RECONNECT_TIMEOUT_S``, within
    ``SAMPLER_WAIT_SHARE`` of the collective timeout. A sampler back within it is ridden out
    (the pass goes on, no failure counted); one that is not fails the pass as an
    infrastructure failure naming the sampler, before the others' collective gives up."""
    return min(RECONNECT_TIMEOUT_S, SAMPLER_WAIT_SHARE * collective_timeout_s)


#: The batch's own columns beside the features: no feature name starts with ``#``.
DENSE, PRESENT, LABEL = "#dense", "#present", "#label"


@dataclass(frozen=True)
class ItemSide:
    """Which slots a negative replaces, and the table column of every slot.

    Attributes:
        columns: S names, slot k's column (``slot_<k>``, or a schema feature's name).
        item: the item id's slot (the sampler's dedup_tag).
        category: the category's slot (sample_tag), or None (the table's ``category``).
        slots: every item-side slot, sorted (item, category and the others).
    """

    columns: list[str]
    item: int
    category: int | None
    slots: list[int]

    @classmethod
    def of(cls, config: Any, num_slots: int, schema: FeatureSchema | None) -> ItemSide:
        """Slots by number (no schema, checked against ``num_slots``) or features by name
        (``item_features``, ``category_feature``: checked where the job is read)."""
        if schema is None:
            NegativeSampler.check_slots(config, num_slots)
            columns = [f"slot_{k}" for k in range(num_slots)]
            item, category, more = config.item_slot, config.category_slot, config.item_slots
        else:
            columns = [f.name for f in schema.sparse]
            index = {name: k for k, name in enumerate(columns)}
            names = config.item_features or columns[:1]
            for name in [*names, config.category_feature or columns[0]]:
                if name not in index:
                    raise ConfigError(
                        f"negative_sampling: {name!r} names no sparse feature of the schema "
                        f"({columns})"
                    )
            item, more = index[names[0]], [index[n] for n in names[1:]]
            category = None if config.category_feature is None else index[config.category_feature]
        slots = sorted({item, *more, *([category] if category is not None else [])})
        return cls(columns, item, category, slots)


class NegativeSampler:
    """Callable ``Batch -> Batch`` adding ``sample_size - 1`` negatives per positive.

    Args:
        config: the job's ``negative_sampling`` section (:class:`NegativeSamplingConfig`).
        num_slots: S, the batch's sparse slots.
        schema: the job's feature schema: item-side features by name, ragged batches;
            None: slots by number (``slot_<k>``).
        load: load ``table_path`` into the sampler now (local rank 0 of each node); every
            rank names it for a sampler that restarts (the first to find it empty loads it).
        rank: this rank's ``rank`` label of the metrics.
        reconnect_timeout_s: how long a call waits for a sampler that died to be back
            (:func:`sampler_wait_s` of the group's collective timeout).

    The sampler's address: ``endpoint``, else ``$STREAMREC_SAMPLER_ENDPOINT`` (the stack's or
    the node's DaemonSet: whoever runs it restarts it), else the per-user socket, where a
    sampler is started when none answers (``auto_start``).
    """

    def __init__(
        self,
        config: Any,
        num_slots: int,
        load: bool = False,
        rank: str = "0",
        schema: FeatureSchema | None = None,
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
    ) -> None:
        from streamrec.sampler import ENDPOINT_ENV, MISSING_ITEM_ID, LocalRpcDataSampler

        self.cfg = config
        #: Item id of a positive missing from the negative table.
        self.default_value: int = (
            MISSING_ITEM_ID if config.default_value is None else config.default_value
        )
        self.side = ItemSide.of(config, num_slots, schema)
        cols, cat = self.side.columns, self.side.category
        self.item_col = cols[self.side.item]
        self.cat_col = cols[cat] if cat is not None else "category"
        self.item_slots = self.side.slots
        self.sampler = LocalRpcDataSampler(
            self.cat_col,
            self.item_col,
            config.weight_tag,
            config.skey_name,
            put_back=config.put_back,
            label_name=LABEL,
            endpoint=config.endpoint,
            # a sampler back within this is ridden out mid-pass; the control plane calls a
            # group without progress for trainer_stuck_s (120 s) stuck
            reconnect_timeout_s=reconnect_timeout_s,
            # a server is started only at this node's own default address: one at an address
            # the job chose would serve (and outlive) whoever named it, and one at the
            # deployment's address ($STREAMREC_SAMPLER_ENDPOINT) is its to start
            auto_start=config.auto_start
            and config.endpoint is None
            and not os.environ.get(ENDPOINT_ENV),
        )
        self.rank = rank
        self._recoveries = 0
        if config.table_path and config.reload:
            if load:
                self.sampler.reload(config.table_path)
            else:
                self.sampler.keep_table(config.table_path)

    @staticmethod
    def check_slots(config: Any, num_slots: int) -> None:
        """Raises ConfigError naming a slot of ``config`` outside the batch's ``num_slots``."""
        for k in [config.item_slot, *(config.item_slots or [])] + (
            [config.category_slot] if config.category_slot is not None else []
        ):
            if not 0 <= k < num_slots:
                raise ConfigError(f"negative_sampling: slot {k} is not in 0..{num_slots - 1}")

    def __call__(self, batch: Batch) -> Batch:
        if self.cfg.positives_only:
            batch = _rows(batch, torch.nonzero(batch.labels > 0.5).view(-1))
        n = len(batch)
        if n == 0:
            return batch
        cols, side = self.side.columns, self.side
        feats: dict[str, Any] = {DENSE: batch.dense}
        if batch.bags is None:
            feats.update({c: batch.keys[:, j] for j, c in enumerate(cols)})
            if batch.present is not None:
                feats[PRESENT] = batch.present
            items = batch.keys[:, side.item]
            cats = None if side.category is None else batch.keys[:, side.category]
        else:
            feats.update(zip(cols, batch.bags, strict=True))
            items = self._one_id(batch.bags[side.item], cols[side.item])
            cats = (
                None
                if side.category is None
                else self._one_id(batch.bags[side.category], cols[side.category])
            )
        cnts = torch.full((n,), self.cfg.sample_size - 1, dtype=torch.int64)
        neg = self.sampler.sample_ids(items, cnts, cats)
        pos_ids = self.sampler.valid_sample_ids(items, self.default_value)
        ids = self.sampler.combine_vector_with_sample_counts(pos_ids, cnts, neg)
        table = self.sampler.pack_feature(ids, self.default_value)
        if self.sampler.recoveries != self._recoveries:  # a sampler restart ridden out
            self._recoveries = self.sampler.recoveries
            m.SAMPLER_RECOVERIES.labels(self.rank).inc()
            m.SAMPLER_RECOVERY_SECONDS.labels(self.rank).observe(self.sampler.last_recovery_s)
        for k in side.slots:
            if cols[k] not in table:
                raise ConfigError(
                    f"the negative table has no column {cols[k]!r} (item-side feature); it "
                    f"has {sorted(table)}"
                )
        if batch.bags is not None:
            packed = {cols[k]: _ragged(table[cols[k]], cols[k]) for k in side.slots}
            out = self.sampler.combine([feats], packed, cnts)[0]
            bags = [out[c] for c in cols]
            total = len(out[LABEL])
            none = torch.zeros(total, 0, dtype=torch.int64)
            return Batch(out[DENSE], out[LABEL], none, bags=bags)
        item_cols = {cols[k]: _flat(table[cols[k]], cols[k]) for k in side.slots}
        out = self.sampler.combine([feats], item_cols, cnts)[0]
        keys = torch.stack([out[c].to(torch.int64) for c in cols], dim=1)
        present = out.get(PRESENT)
        if present is not None:
            present = present.clone()
            present[:, side.slots] = True
        return Batch(out[DENSE], out[LABEL], keys.contiguous(), present, None)

    def _one_id(self, bags: RaggedTensor, name: str) -> torch.Tensor:
        """(n,) int64: each row's one id, ``default_value`` for an empty row."""
        lengths = bags.lengths()
        if bool((lengths > 1).any()):
            row = int(torch.nonzero(lengths > 1)[0])
            raise DataError(
                f"negative_sampling: feature {name!r} is the item id or category, one id a "
                f"row, but row {row} holds {int(lengths[row])}: {bags.row(row).tolist()}"
            )
        out = torch.full((len(bags),), self.default_value, dtype=torch.int64)
        out[lengths == 1] = bags.values().to(torch.int64)
        return out

    def close(self) -> None:
        self.sampler.close()


def _flat(col: Any, name: str) -> torch.Tensor:
    """A one-value-per-row column of the negative table as (k,) int64."""
    if isinstance(col, RaggedTensor):
        if not bool((col.lengths() == 1).all()):
            raise ConfigError(f"negative table column {name!r} must hold one id per row")
        return col.values().to(torch.int64)
    return torch.as_tensor(col).to(torch.int64)


def _ragged(col: Any, name: str) -> RaggedTensor:
    """A column of the negative table as a ragged feature: a list column as it is, a
    one-value column one id a row; int64 ids."""
    if isinstance(col, RaggedTensor):
        if col.dtype == torch.uint8:
            raise ConfigError(
                f"negative table column {name!r} holds strings: write int64 ids (string "
                f"ids hashed by streamrec.keyhash.string_keys, as the trainer hashes them)"
            )
        return RaggedTensor(col.values().to(torch.int64), col.offsets())
    values = torch.as_tensor(col).to(torch.int64)
    return RaggedTensor(values, torch.arange(values.numel() + 1, dtype=torch.int64))


def _rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The batch's ``rows`` ((k,) int64), ptrue dropped (negatives have none)."""
    return Batch(
        batch.dense[rows],
        batch.labels[rows],
        batch.keys[rows],
        None if batch.present is None else batch.present[rows],
        None,
        None if batch.bags is None else [f.take_rows(rows) for f in batch.bags],
    )


def reach_sampler(
    config: Any,
    num_slots: int,
    rank: str,
    schema: FeatureSchema | None,
    together: Callable[[Exception | None], None],
    collective_timeout_s: float,
) -> NegativeSampler:
    """Every rank's client of its node's sampler: local rank 0 of each node loads the table
    (``config.reload``), then the others connect. ``together(failure)`` exchanges every
    rank's outcome of a turn and raises :class:`~streamrec.trainer.errors.PassFailed` on all
    of them alike. Made in a pass, not at start: a sampler that is not there or refuses the
    token fails the pass as infrastructure (a restart with backoff and budget, then the job
    fails naming it), never a group start retried for ever. A failure on any rank leaves
    every rank without a client. A sampler that dies later is waited for
    :func:`sampler_wait_s` of ``collective_timeout_s``."""
    loader = config.reload and int(os.environ.get("LOCAL_RANK", "0")) == 0
    sampler: NegativeSampler | None = None
    try:
        for loaders_turn in (True, False):  # the table is in before the others sample
            failure: Exception | None = None
            if loader == loaders_turn:
                try:
                    wait_s = sampler_wait_s(collective_timeout_s)
                    sampler = NegativeSampler(config, num_slots, loader, rank, schema, wait_s)
                except Exception as exc:
                    failure = exc
            together(failure)
    except PassFailed:
        if sampler is not None:
            sampler.close()
        raise
    assert sampler is not None  # every rank made one in its turn, or together raised
    return sampler
