"""Every device table of a step in one launch per op (``device_block.py``), on the CPU build of
the kernels (device "cpu", everywhere) and on a GPU where there is one.

The block ops against the same store's tables one call at a time, bit for bit: pulls (rows
created, read-only pulls of absent keys), pushes (repeated keys, a table listed twice, an empty
part, shows and clicks given or defaulted, expansion), under every optimizer rule. The counts
(``CudaOps.counts``): a step's launches do not grow with its table count and it never waits
for the device (``no_syncs`` raises at any sync). Errors found on the device (a NaN push, a
full table) are raised at the table's next call that synchronises, naming it. The dedup of
every part at once (``unique_tables``) against the CPU core's ``unique_groups``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, unique_groups
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput, NonFiniteGradient
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL
from streamrec.store_schema import TableOptions

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
RULES = [
    "SparseNaiveSGDRule",
    "SparseAdaGradSGDRule",
    "StdAdaGradSGDRule",
    "SparseAdamSGDRule",
    "TorchAdaGradSGDRule",
]
DIM = 8


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stores(device: str, names: list[str], **kw: Any) -> tuple[EmbeddingStore, EmbeddingStore]:
    """Two stores of the same tables and seed on the device tier: one for the block ops, one
    for the same calls a table at a time."""
    opts = [TableOptions(name=n, dim=DIM, embedx_threshold=1.5, **kw) for n in names]
    made = tuple(EmbeddingStore(opts, seed=5, tier="device", device=device) for _ in range(2))
    return made  # type: ignore[return-value]


def ops_of(store: EmbeddingStore, table: str) -> cuda_ext.CudaOps:
    return store.tier(table)._ops  # type: ignore[attr-defined,no-any-return]


def block_keys(counts: list[int], pool: int, g: torch.Generator) -> torch.Tensor:
    """Keys of a block, drawn from ``pool`` distinct keys (repeats within and across parts)."""
    spread = torch.randint(-(2**62), 2**62, (pool,), generator=g)
    return spread[torch.randint(0, pool, (sum(counts),), generator=g)]


COUNTERS = ("rows", "rows_created", "rows_expanded", "pull_keys", "push_keys")


def same_tables(
    block: EmbeddingStore, single: EmbeddingStore, counters: tuple[str, ...] = COUNTERS
) -> None:
    """Every table of both stores holds the same keys and the same rows, bit for bit (by key:
    new row ids come from an atomic counter), and the same counters."""
    for name in single.tables:
        bk, br = block.tier(name).export(SELECT_ALL)
        sk, sr = single.tier(name).export(SELECT_ALL)
        bo, so = torch.argsort(bk), torch.argsort(sk)
        assert torch.equal(bk[bo], sk[so]), name
        assert torch.equal(br[bo], sr[so]), name
        bs, ss = block.stats()["tables"][name], single.stats()["tables"][name]
        for counter in counters:
            assert bs[counter] == ss[counter], (name, counter)


def on_host(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


@pytest.mark.parametrize("rule", RULES)
def test_block_ops_equal_the_tables_one_at_a_time_bit_for_bit(device: str, rule: str) -> None:
    names = ["user", "item", "ctx"]
    sgd = {"name": rule, "weight_bounds": (-0.4, 0.4)}
    block, single = stores(device, names, embed_sgd_param=sgd, embedx_sgd_param=sgd)
    g = torch.Generator().manual_seed(11)
    # "user" twice (its parts apply in order), "ctx" with an empty part, keys repeating in a
    # part and across the two "user" parts, new keys every step (rows created by the pull)
    tables = ["user", "item", "user", "ctx"]
    ops = ops_of(block, "user")
    for step, counts in enumerate([[70, 40, 30, 0], [90, 0, 50, 20], [60, 50, 25, 35]]):
        keys = block_keys(counts, 120, g)
        with ops.no_syncs("a block pull"):  # the block ops, not a table at a time
            pulled = block.pull_rows(tables, keys, counts)
        pulled = on_host(pulled)
        parts = keys.split(counts)
        one_at_a_time = torch.cat([single.pull(t, k) for t, k in zip(tables, parts, strict=True)])
        assert torch.equal(pulled, one_at_a_time), step
        n = keys.numel()
        grads = torch.randn((n, DIM), generator=g) * 0.3
        shows = (torch.rand(n, generator=g) * 2).round()
        clicks = shows * torch.rand(n, generator=g).round()
        given = step != 1  # step 1: shows and clicks defaulted (1 and 0 per key)
        with ops.no_syncs("a block push"):
            block.push_rows(
                tables, keys, counts, grads, shows if given else None, clicks if given else None
            )
        for t, k, gr, s, c in zip(
            tables, parts, grads.split(counts), shows.split(counts), clicks.split(counts),
            strict=True,
        ):  # fmt: skip
            if k.numel():
                single.push(t, k, gr, s if given else None, c if given else None)
    # keys never pulled: the push creates them first, as push does
    counts = [6, 3, 0, 2]
    keys = block_keys(counts, 1000, g)
    grads = torch.randn((keys.numel(), DIM), generator=g)
    block.push_rows(tables, keys, counts, grads)
    for t, k, gr in zip(tables, keys.split(counts), grads.split(counts), strict=True):
        if k.numel():
            single.push(t, k, gr)
    # a read-only pull: absent keys read as zeros, nothing created
    fresh = torch.tensor([2**40 + 1, 2**40 + 2, 2**40 + 1])
    known = keys[:2]
    read = on_host(block.pull_rows(["item", "user"], torch.cat([fresh, known]), [3, 2], False))
    assert torch.equal(read[:3], torch.zeros(3, DIM))
    assert torch.equal(read[3:], single.pull("user", known, create=False))
    single.pull("item", fresh, create=False)  # the same counts in both stores
    same_tables(block, single)


def test_block_growth_past_the_initial_rows_without_a_sync(device: str) -> None:
    """Rows reserved ahead: blocks of new keys grow the tables (chunks, a larger index) and
    never wait; the rows still equal a table at a time's."""
    names = ["a", "b"]
    block, single = stores(device, names)  # MIN_ROWS rows to start with
    ops = ops_of(block, "a")
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        counts = [1500, 900]
        keys = torch.randint(-(2**62), 2**62, (sum(counts),), generator=g)
        with ops.no_syncs("a block step"):
            block.pull_rows(names, keys, counts)
            block.push_rows(names, keys, counts, torch.ones(keys.numel(), DIM))
        for t, k in zip(names, keys.split(counts), strict=True):
            single.pull(t, k)
            single.push(t, k, torch.ones(k.numel(), DIM))
    assert block.size("a") == 6000 and block.size("b") == 3600
    same_tables(block, single)


def test_two_threads_run_blocks_of_their_own_tables_at_once(device: str) -> None:
    """The store's one DeviceBlocks serves two threads' blocks over disjoint tables (its
    descriptors, upload buffers and size readings shared): each table ends as if alone."""
    names = ["a0", "a1", "b0", "b1"]
    block, single = stores(device, names)
    groups = (["a0", "a1"], ["b0", "b1"])
    work = []
    for group_index, group in enumerate(groups):
        g = torch.Generator().manual_seed(group_index)
        steps = []
        for _ in range(6):
            counts = [int(c) for c in torch.randint(0, 300, (2,), generator=g)]
            keys = block_keys(counts, 500, g)
            steps.append((group, keys, counts, torch.randn((keys.numel(), DIM), generator=g)))
        work.append(steps)

    def run(steps: list[tuple[list[str], torch.Tensor, list[int], torch.Tensor]]) -> None:
        for group, keys, counts, grads in steps:
            block.pull_rows(group, keys, counts)
            block.push_rows(group, keys, counts, grads)

    threads = [threading.Thread(target=run, args=(steps,)) for steps in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for steps in work:
        for group, keys, counts, grads in steps:
            for t, k, gr in zip(group, keys.split(counts), grads.split(counts), strict=True):
                single.pull(t, k)
                if k.numel():
                    single.push(t, k, gr)
    same_tables(block, single)


def step_counts(store: EmbeddingStore, names: list[str], steps: int) -> list[cuda_ext.OpCounts]:
    """Each step's launches, syncs and copies (a pull and a push of every table's block); a
    sync inside a step raises."""
    ops = ops_of(store, names[0])
    g = torch.Generator().manual_seed(len(names))
    counts = [48] * len(names)
    out = []
    for _ in range(steps):
        keys = block_keys(counts, 400, g)
        grads = torch.randn((keys.numel(), DIM), generator=g)
        before = ops.counts()
        with ops.no_syncs("a training step"):
            store.pull_rows(names, keys, counts)
            store.push_rows(names, keys, counts, grads)
        out.append(ops.counts() - before)
    return out


def test_a_steps_launches_do_not_grow_with_the_table_count_and_it_never_syncs(
    device: str,
) -> None:
    per_count = {}
    for tables in (1, 4, 26):
        names = [f"t{i}" for i in range(tables)]
        opts = [TableOptions(name=n, dim=DIM, init_capacity=8192) for n in names]
        store = EmbeddingStore(opts, tier="device", device=device)
        counted = step_counts(store, names, 3)
        assert all(c.syncs == 0 for c in counted), counted
        assert len({c.launches for c in counted}) == 1, counted  # the same every step
        per_count[tables] = counted[-1].launches
        # the counts see what a table at a time costs: launches and syncs per table
        ops, before = ops_of(store, names[0]), ops_of(store, names[0]).counts()
        for name in names:
            store.pull(name, torch.arange(48))
        one_at_a_time = ops.counts() - before
        assert one_at_a_time.launches >= 3 * tables and one_at_a_time.syncs >= 2 * tables
    # pull: find_or_insert (2) + gather (1) + sizes (1); push: flag memset + check (2) +
    # find_or_insert (2) + update (keys, sort, two sums, steps: 5) + sizes (1)
    assert per_count == {1: 14, 4: 14, 26: 14}


def test_no_syncs_refuses_a_sync_by_name() -> None:
    store = EmbeddingStore([TableOptions(name="t", dim=DIM)], tier="device", device="cpu")
    ops = ops_of(store, "t")
    with (
        ops.no_syncs("a training step"),
        pytest.raises(cuda_ext.HostSync, match="inside a training step"),
    ):
        store.pull("t", torch.arange(4))  # a table at a time reads its misses back


def test_a_nan_push_writes_nothing_and_is_raised_at_the_next_sync_naming_the_table(
    device: str,
) -> None:
    names = ["good", "bad"]
    block, single = stores(device, names)
    keys, counts = torch.arange(10), [6, 4]
    block.pull_rows(names, keys, counts)
    single.pull_many(names, keys.split(counts))
    grads = torch.ones(10, DIM)
    grads[8, 3] = float("nan")  # in "bad"'s part
    ops = ops_of(block, "good")
    with ops.no_syncs("a training step"):
        block.push_rows(names, torch.cat([keys[:9], torch.tensor([99])]), counts, grads)
    assert block.size("good") == 6  # settled: nothing to report there
    with pytest.raises(NonFiniteGradient, match="table 'bad': a block push's grads held NaN"):
        block.size("bad")
    assert block.size("bad") == 4  # reported once; 99 was not created
    no_push_keys = tuple(c for c in COUNTERS if c != "push_keys")  # the block counted its keys
    same_tables(block, single, no_push_keys)  # nothing written to either table
    clicks = torch.zeros(10)
    clicks[0] = -1.0  # in "good"'s part
    block.push_rows(names, keys, counts, torch.ones(10, DIM), None, clicks)
    with pytest.raises(InvalidInput, match="table 'good': a block push's shows and clicks"):
        block.stats()
    same_tables(block, single, no_push_keys)


def test_a_full_table_is_raised_at_the_next_sync_naming_the_table(device: str) -> None:
    opts = [TableOptions(name=n, dim=DIM) for n in ("small", "big")]
    store = EmbeddingStore(opts, tier="device", device=device, capacity=50)
    ops = ops_of(store, "small")
    with ops.no_syncs("a training step"):
        out = store.pull_rows(["small", "big"], torch.arange(100), [80, 20])
    # the keys past the capacity have no row: they read as zeros
    assert int((on_host(out)[:80] != 0).any(dim=1).sum()) == 50
    with pytest.raises(CapacityExceeded, match="table 'small': a block pull or push reached"):
        store.size("small")
    assert store.size("small") == 50 and store.size("big") == 20
    # the 50 created stay; the others are still absent
    rows = store.pull("small", torch.arange(100), create=False)
    assert int((rows != 0).any(dim=1).sum()) == 50
    assert torch.equal(
        rows[(rows != 0).any(dim=1)], on_host(out)[:80][(on_host(out)[:80] != 0).any(dim=1)]
    )


def test_a_table_settles_once_after_a_block_and_then_reads_nothing_more(device: str) -> None:
    store = EmbeddingStore([TableOptions(name="t", dim=DIM)], tier="device", device=device)
    ops = ops_of(store, "t")
    store.pull_rows(["t"], torch.arange(5), [5])
    before = ops.counts()
    assert store.size("t") == 5
    assert (ops.counts() - before).syncs == 1  # the settle's one read
    before = ops.counts()
    assert store.size("t") == 5
    assert ops.counts() - before == cuda_ext.OpCounts()


# ---- the ops themselves ----
@pytest.fixture(scope="module", params=DEVICES)
def ops(request: pytest.FixtureRequest) -> cuda_ext.CudaOps:
    return cuda_ext.load_cpu() if request.param == "cpu" else cuda_ext.load(request.param)


@pytest.mark.parametrize(
    "counts",
    [[0], [1], [500, 0, 300, 1, 0], [0, 0, 7], [2000]],
    ids=["empty", "one", "mixed", "leading-empty", "one-part"],
)
def test_unique_tables_equals_the_cpu_cores_unique_groups(
    ops: cuda_ext.CudaOps, counts: list[int]
) -> None:
    g = torch.Generator().manual_seed(sum(counts))
    pool = torch.randint(-(2**63), 2**63 - 1, (64,), generator=g)
    keys = pool[torch.randint(0, 64, (sum(counts),), generator=g)]  # the same keys in parts
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int64)
    distinct, inverse, per_part, total = ops.unique_tables(
        keys.to(ops.device), offsets.to(ops.device)
    )
    want, want_inverse, want_counts = unique_groups(keys, counts)
    u = int(total.cpu())
    assert torch.equal(distinct[:u].cpu(), want)
    assert torch.equal(inverse.cpu(), want_inverse)
    assert per_part.cpu().tolist() == list(want_counts)


def test_update_sums_a_group_the_same_wherever_it_lies(ops: cuda_ext.CudaOps) -> None:
    """A hot row's repeats summed in pieces counted from the group's start: the rows come out
    the same bits whatever precedes the group (absent positions sort first), so a block gives
    each table what its own call gives."""
    from streamrec.embedding_store.tiers.table_tier import table_params

    opts = TableOptions(name="t", dim=DIM, embedx_threshold=0)
    p = cuda_ext.TableParams.of(table_params(opts, seed=1))
    # a sum whose association shows: +1e20 and -1e20 cancel only when summed before the ones
    grads = torch.ones((300, DIM))
    grads[0], grads[1] = 1e20, -1e20
    results = []
    for absent in (0, 1, 17, 63, 64, 100):
        data = torch.zeros((2, p.stride), device=ops.device)
        row_keys = torch.tensor([5, 6], device=ops.device)
        rows = torch.cat([torch.full((absent,), -1), torch.zeros(300, dtype=torch.int64)])
        padded = torch.cat([torch.zeros(absent, DIM), grads])
        n = rows.numel()
        ops.update(
            data, row_keys, rows.to(ops.device), padded.to(ops.device),
            torch.ones(n, device=ops.device), torch.zeros(n, device=ops.device), p,
        )  # fmt: skip
        results.append(data[0].cpu())
    for r in results[1:]:
        assert torch.equal(r, results[0])


@needs_gpu
def test_a_block_step_on_a_gpu_makes_no_sync_torch_sees() -> None:  # pragma: no cover - GPU
    """torch's own sync detector over a step (pinned staging, the sizes' copy back)."""
    names = [f"t{i}" for i in range(8)]
    opts = [TableOptions(name=n, dim=DIM, init_capacity=1 << 16) for n in names]
    store = EmbeddingStore(opts, tier="device", device="cuda")
    counts = [256] * len(names)
    g = torch.Generator().manual_seed(0)
    keys = block_keys(counts, 4000, g)
    store.pull_rows(names, keys, counts)  # warm: descriptors, pinned buffers
    grads = torch.randn((keys.numel(), DIM), device="cuda")
    store.push_rows(names, keys, counts, grads)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            out = store.pull_rows(names, keys, counts)
            store.push_rows(names, keys, counts, grads)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.device.type == "cuda"
    assert all(store.size(n) > 0 for n in names)
