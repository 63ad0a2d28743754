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
"""

from __future__ import annotations

import os
from typing import Any

import torch
from streamrec.ragged import RaggedTensor
from streamrec.trainer import metrics as m
from streamrec.trainer.data import Batch
from streamrec.trainer.errors import ConfigError

#: How long a pass waits for its node's sampler to be back after it died (the launcher, the
#: DaemonSet or this node's auto-start brings it back in seconds).
RECONNECT_TIMEOUT_S = 60.0


class NegativeSampler:
    """Callable ``Batch -> Batch`` adding ``sample_size - 1`` negatives per positive.

    Args:
        config: the job's ``negative_sampling`` section (:class:`NegativeSamplingConfig`).
        num_slots: S, the batch's sparse slots.
        load: load ``table_path`` into the sampler now (local rank 0 of each node); every
            rank names it for a sampler that restarts (the first to find it empty loads it).
        rank: this rank's ``rank`` label of the metrics.

    The sampler's address: ``endpoint``, else ``$STREAMREC_SAMPLER_ENDPOINT`` (the stack's or
    the node's DaemonSet: whoever runs it restarts it), else the per-user socket, where a
    sampler is started when none answers (``auto_start``).
    """

    def __init__(self, config: Any, num_slots: int, load: bool = False, rank: str = "0") -> None:
        from streamrec.sampler import ENDPOINT_ENV, MISSING_ITEM_ID, LocalRpcDataSampler

        self.cfg = config
        #: Item id of a positive missing from the negative table.
        self.default_value: int = (
            MISSING_ITEM_ID if config.default_value is None else config.default_value
        )
        self.check_slots(config, num_slots)
        self.item_col = f"slot_{config.item_slot}"
        self.cat_col = (
            f"slot_{config.category_slot}" if config.category_slot is not None else "category"
        )
        self.item_slots = sorted(
            {
                config.item_slot,
                *(config.item_slots or []),
                *([config.category_slot] if config.category_slot is not None else []),
            }
        )
        self.sampler = LocalRpcDataSampler(
            self.cat_col,
            self.item_col,
            config.weight_tag,
            config.skey_name,
            put_back=config.put_back,
            endpoint=config.endpoint,
            # a sampler back within this is ridden out mid-pass; the control plane calls a
            # group without progress for trainer_stuck_s (120 s) stuck
            reconnect_timeout_s=RECONNECT_TIMEOUT_S,
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
            keep = batch.labels > 0.5
            batch = Batch(
                batch.dense[keep],
                batch.labels[keep],
                batch.keys[keep],
                None if batch.present is None else batch.present[keep],
                None,
            )
        n, s = batch.keys.shape
        if n == 0:
            return batch
        feats: dict[str, Any] = {f"slot_{j}": batch.keys[:, j] for j in range(s)}
        feats["dense"] = batch.dense
        if batch.present is not None:
            feats["present"] = batch.present
        cnts = torch.full((n,), self.cfg.sample_size - 1, dtype=torch.int64)
        items = batch.keys[:, self.cfg.item_slot]
        cats = batch.keys[:, self.cfg.category_slot] if self.cfg.category_slot is not None else None
        neg = self.sampler.sample_ids(items, cnts, cats)
        pos_ids = self.sampler.valid_sample_ids(items, self.default_value)
        ids = self.sampler.combine_vector_with_sample_counts(pos_ids, cnts, neg)
        table = self.sampler.pack_feature(ids, self.default_value)
        if self.sampler.recoveries != self._recoveries:  # a sampler restart ridden out
            self._recoveries = self.sampler.recoveries
            m.SAMPLER_RECOVERIES.labels(self.rank).inc()
            m.SAMPLER_RECOVERY_SECONDS.labels(self.rank).observe(self.sampler.last_recovery_s)
        item_cols = {f"slot_{k}": _flat(table[f"slot_{k}"], f"slot_{k}") for k in self.item_slots}
        out = self.sampler.combine([feats], item_cols, cnts)[0]
        keys = torch.stack([out[f"slot_{j}"].to(torch.int64) for j in range(s)], dim=1)
        present = out.get("present")
        if present is not None:
            present = present.clone()
            present[:, self.item_slots] = True
        return Batch(out["dense"], out[self.sampler.label_name], keys.contiguous(), present, None)

    def close(self) -> None:
        self.sampler.close()


def _flat(col: Any, name: str) -> torch.Tensor:
    """A one-value-per-row column of the negative table as (k,) int64."""
    if isinstance(col, RaggedTensor):
        if not bool((col.lengths() == 1).all()):
            raise ConfigError(f"negative table column {name!r} must hold one id per row")
        return col.values().to(torch.int64)
    return torch.as_tensor(col).to(torch.int64)
