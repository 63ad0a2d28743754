"""``make demo`` (for now): the node-local sampler end to end, in well under a minute.

Starts a sampler server through the first client (as a trainer would), loads a negative
table, runs RecIS's ``neg_sampling_fn`` (verbatim, only the imports changed) in a prefetch
pipeline beside a small training loop, checks the guarantees on what came back, replaces the
table while a second client samples, and stops the server it started.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from streamrec.ragged import RaggedTensor
from streamrec.sampler import LocalRpcDataSampler, prefetch
from streamrec.sampler.client import stop_server
from streamrec.sampler.config import MISSING_ITEM_ID

ITEMS = 200_000
CATEGORIES = 100
BATCH = 1024
BATCHES = 20
sample_size = 6  # 1 positive + 5 negatives, as in the seed
sample_tag, dedup_tag, weight_tag, skey_name = "cate_id", "item_id", "weight", "skey"


def seed_neg_sampling_fn(
    neg_sampler: LocalRpcDataSampler, sample_tag: str, dedup_tag: str, sample_size: int
) -> Callable[[Any], Any]:
    """RecIS's ``neg_sampling_fn``, verbatim (the seed's example), over ``neg_sampler``: only
    its imports changed. The demo runs it, and a test checks what it returns."""

    def neg_sampling_fn(batch):
        sample_tag_ragged_tensor = batch[0][sample_tag]
        dedup_tag_ragged_tensor = batch[0][dedup_tag]
        sample_cnts = sample_size - torch.ones_like(dedup_tag_ragged_tensor.values())
        neg_sample_ids = neg_sampler.sample_ids(
            dedup_tag_ragged_tensor=dedup_tag_ragged_tensor,
            sample_cnts=sample_cnts,
            sample_tag_ragged_tensor=sample_tag_ragged_tensor,
        )
        pos_ids = neg_sampler.valid_sample_ids(
            dedup_tag_ragged_tensor.values(), default_value=MISSING_ITEM_ID
        )
        pos_neg_ids = neg_sampler.combine_vector_with_sample_counts(
            pos_ids, sample_cnts, neg_sample_ids
        )
        output_sample_table = neg_sampler.pack_feature(pos_neg_ids, default_value=MISSING_ITEM_ID)
        combined_batch = neg_sampler.combine(batch, output_sample_table, sample_cnts)
        return combined_batch

    return neg_sampling_fn


def make_table(seed: int, id_offset: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ids = id_offset + rng.permutation(ITEMS).astype(np.int64) * 7919 + 1
    cats = rng.integers(0, CATEGORIES, ITEMS)
    ones = torch.ones(ITEMS, dtype=torch.int64)
    return {
        dedup_tag: RaggedTensor.from_lengths(torch.from_numpy(ids), ones),
        sample_tag: RaggedTensor.from_lengths(torch.from_numpy(cats), ones),
        weight_tag: torch.from_numpy((rng.pareto(1.5, ITEMS) + 0.01).astype(np.float32)),
        skey_name: [""] * ITEMS,
        "price": torch.from_numpy(rng.random(ITEMS).astype(np.float32)),
    }


def positive_batches(table: dict, count: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = table[dedup_tag].values().numpy()
    cats = table[sample_tag].values().numpy()
    ones = torch.ones(BATCH, dtype=torch.int64)
    for _ in range(count):
        rows = rng.integers(0, ITEMS, BATCH)
        yield [
            {
                dedup_tag: RaggedTensor.from_lengths(torch.from_numpy(ids[rows]), ones),
                sample_tag: RaggedTensor.from_lengths(torch.from_numpy(cats[rows]), ones),
                "user_id": RaggedTensor.from_lengths(
                    torch.from_numpy(rng.integers(0, 10**6, BATCH)), ones
                ),
            }
        ]


def main() -> int:
    directory = tempfile.mkdtemp(prefix="streamrec-demo-", dir="/tmp")
    endpoint = f"ipc://{directory}/sampler.sock"
    print(f"[1/5] first client starts the node-local sampler server at {endpoint}")
    t0 = time.perf_counter()
    neg_sampler = LocalRpcDataSampler(
        sample_tag, dedup_tag, weight_tag, skey_name, endpoint=endpoint
    )
    print(f"      server pid {neg_sampler.server_pid} answered in {time.perf_counter() - t0:.1f}s")
    try:
        return run(neg_sampler, endpoint)
    finally:
        pid = neg_sampler.server_pid
        if pid is not None:  # the server said which process it is
            stop_server(pid)
        neg_sampler.close()
        shutil.rmtree(directory, ignore_errors=True)
        print("      sampler server stopped")


def run(neg_sampler: LocalRpcDataSampler, endpoint: str) -> int:
    table = make_table(seed=0)
    t0 = time.perf_counter()
    info = neg_sampler.reload(table)
    print(
        f"[2/5] reload: {info['rows']:,} items in {info['categories']} categories "
        f"(Pareto weights) in {time.perf_counter() - t0:.2f}s"
    )

    neg_sampling_fn = seed_neg_sampling_fn(neg_sampler, sample_tag, dedup_tag, sample_size)

    print(
        f"[3/5] {BATCHES} batches of {BATCH} positives x {sample_size - 1} negatives through "
        f"neg_sampling_fn, prefetched while a model trains"
    )
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = table[weight_tag].numpy()
    same_category = conflicts = rows = 0
    neg_ids: list[np.ndarray] = []
    neg_cats: list[np.ndarray] = []
    t0 = time.perf_counter()
    for step, combined in enumerate(
        prefetch(positive_batches(table, BATCHES, 1), neg_sampling_fn, depth=2)
    ):
        f = combined[0]
        label = f["label"]
        x = torch.stack([f["price"], (f["user_id"].values() % 97).float() / 97], dim=1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        grid = f[dedup_tag].values().reshape(BATCH, sample_size)
        cats = f[sample_tag].values().reshape(BATCH, sample_size)
        same_category += int((cats[:, 1:] == cats[:, :1]).sum())
        conflicts += int((grid[:, 1:] == grid[:, :1]).sum())
        neg_ids.append(grid[:, 1:].reshape(-1).numpy())
        neg_cats.append(cats[:, 1:].reshape(-1).numpy())
        rows += len(label)
        if step % 5 == 4:
            print(f"      step {step + 1:3d}: {len(label):,} rows, loss {loss.item():.3f}")
    secs = time.perf_counter() - t0
    negatives = BATCHES * BATCH * (sample_size - 1)
    print(
        f"      {rows:,} rows ({negatives:,} negatives) in {secs:.2f}s; negatives in the "
        f"positive's category: {same_category}/{negatives}; own-id conflicts: {conflicts}"
    )

    # Frequencies follow the weights: the heaviest items, drawn vs expected.
    drawn = np.concatenate(neg_ids)
    drawn_cats = np.bincount(np.concatenate(neg_cats), minlength=CATEGORIES)
    ids = table[dedup_tag].values().numpy()
    table_cats = table[sample_tag].values().numpy()
    cat_weight = np.bincount(table_cats, weights=weights, minlength=CATEGORIES)
    for r in np.argsort(weights)[-3:][::-1]:
        c = table_cats[r]
        expected = drawn_cats[c] * weights[r] / cat_weight[c]
        print(
            f"      item {ids[r]} (category {c}, weight {weights[r]:.0f}): drawn "
            f"{int((drawn == ids[r]).sum())} times, expected {expected:.0f}"
        )
    print(
        "[4/5] a second client (another trainer rank) shares the server; table replaced meanwhile"
    )
    other = LocalRpcDataSampler(sample_tag, dedup_tag, weight_tag, skey_name, endpoint=endpoint)
    seen: dict[str, int] = {"old": 0, "new": 0, "mixed": 0}
    stop = threading.Event()

    def keep_sampling() -> None:
        batch = next(positive_batches(table, 1, 2))[0]
        while not stop.is_set():
            got = other.sample_ids(batch[dedup_tag], 20, batch[sample_tag]).numpy()
            new = got >= 10**12
            seen["new" if new.all() else "old" if not new.any() else "mixed"] += 1

    worker = threading.Thread(target=keep_sampling)
    worker.start()
    time.sleep(0.3)
    info = neg_sampler.reload(make_table(seed=0, id_offset=10**12))
    time.sleep(0.3)
    stop.set()
    worker.join()
    other.close()
    print(
        f"      same server pid {other.server_pid}; generation {info['generation']}; responses "
        f"from the old table {seen['old']}, the new {seen['new']}, mixed {seen['mixed']}"
    )

    stats = neg_sampler.stats()
    print(
        f"[5/5] summary: {stats['rows']:,}-row table, {negatives / secs / 1e6:.2f} M negatives/s "
        f"through the whole neg_sampling_fn (4 requests per batch) beside training"
    )
    ok = same_category == negatives and conflicts == 0 and seen["mixed"] == 0
    print("      all guarantees held" if ok else "      GUARANTEE VIOLATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
