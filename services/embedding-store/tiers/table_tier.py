"""The storage-tier interface of one table (OneEmbedding's store options).

Implementations (every one of them implements all of :class:`TableTier`; the store, the
saves and the GPU cache call nothing else and branch on no concrete tier):
:class:`~streamrec.embedding_store.tiers.host_table.HostTable` (rows in RAM),
:class:`~streamrec.embedding_store.tiers.ssd_table.SsdTable` (rows in a file, a bounded RAM
cache in front), :class:`~streamrec.embedding_store.tiers.device_table.DeviceTable` (every row
in GPU memory) and :class:`~streamrec.embedding_store.tiers.cached_table.CachedTable` (a host or
ssd table's hot rows cached on a GPU).

Tiers are not thread-safe; :class:`~streamrec.embedding_store.store.EmbeddingStore` locks
each table (readers share, writers are exclusive).

Row layout (see ``csrc/shared/row_layout.h``)::

    [show, click, unseen_days, flags, embed_w, embedx_w (dim-1), embed_state, embedx_state]

with the payload after the four header words held as 16-bit values two per word in a table
of ``dtype`` fp16 or bf16 (:mod:`~streamrec.embedding_store.tiers.row_codec`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.tiers import row_codec
from streamrec.store_schema import ROW_DTYPES, TableOptions

#: Save selections (csrc select_rows modes).
SELECT_ALL, SELECT_BASE, SELECT_DELTA = 0, 1, 2
#: a hash index is rebuilt larger before more than this share of its slots is taken
MAX_LOAD = 0.75
#: rows (and index room) a table starts with at least
MIN_ROWS = 1024


def index_slots(rows: int) -> int:
    """Slots of a hash index meant to hold ``rows`` keys: the power of two above twice
    ``rows`` (an index at most half full probes little)."""
    at_least = int(rows / 0.5) + 1
    return 1 << max(at_least - 1, 1).bit_length()


#: The float knobs of TableOptions that TableParams carries as they are (the C++ and CUDA
#: cores read them by these names).
TABLE_SCALARS: tuple[str, ...] = (
    "nonclk_coeff",
    "click_coeff",
    "embedx_threshold",
    "show_click_decay_rate",
    "delete_threshold",
    "delete_after_unseen_days",
    "base_threshold",
    "delta_threshold",
    "delta_keep_days",
)


def table_params(options: TableOptions, seed: int = 0) -> _C.TableParams:
    """The C++ parameters of a table; initializer seed = f(store seed, table name)."""
    p = _C.TableParams()
    p.dim = options.dim
    for part, sgd in (("embed", options.embed_sgd_param), ("embedx", options.embedx_sgd_param)):
        rule = _C.RuleParams()
        rule.kind = sgd.kind
        rule.learning_rate = sgd.learning_rate
        rule.initial_g2sum = sgd.initial_g2sum
        rule.lower_bound, rule.upper_bound = sgd.weight_bounds
        rule.beta1, rule.beta2, rule.epsilon = sgd.beta1, sgd.beta2, sgd.epsilon
        setattr(p, f"{part}_rule", rule)
        init = _C.InitParams()
        ini = options.initializer
        if ini is None:
            init.kind, init.a, init.b = 1, -sgd.initial_range, sgd.initial_range
        elif ini.type == "uniform":
            init.kind, init.a, init.b = 1, ini.low, ini.high
        elif ini.type == "normal":
            init.kind, init.a, init.b = 2, ini.mean, ini.std
        else:
            init.kind, init.a, init.b = 0, 0.0, 0.0
        setattr(p, f"{part}_init", init)
    for name in TABLE_SCALARS:
        setattr(p, name, float(getattr(options, name)))
    digest = hashlib.blake2b(options.name.encode(), digest_size=8).digest()
    p.seed = (int.from_bytes(digest, "little") ^ (seed * 0x9E3779B97F4A7C15)) % 2**64
    p.dtype = ROW_DTYPES[options.dtype]
    p.finalize()
    return p


def admission_mask(
    options: TableOptions,
    rng: torch.Generator,
    n: int,
    shows: torch.Tensor | None,
    clicks: torch.Tensor | None,
) -> torch.Tensor | None:
    """Admission mask (n,) bool of ``n`` absent keys, or None when all are admitted (no
    admission rule). shows, clicks: (n,) float32 of a push, None for a pull (which creates
    nothing under an admission score)."""
    o = options
    if o.admission_score is not None:
        if shows is None or clicks is None:
            return torch.zeros(n, dtype=torch.bool)  # pulls never create
        score = o.nonclk_coeff * (shows - clicks) + o.click_coeff * clicks
        p = (score / o.admission_score).clamp(0.0, 1.0)
    elif o.admission_probability < 1.0:
        p = torch.full((n,), o.admission_probability)
    else:
        return None
    return torch.rand(n, generator=rng) < p


class TableTier(ABC):
    """One table's rows on one storage tier.

    Keys are (n,) int64 contiguous tensors, already validated by the store. Weights are
    (n, dim) float32; full rows (n, width) float32 in the layout above.
    """

    #: Whether :meth:`read` may run in several threads at once (under a shared lock).
    concurrent_reads: bool = False
    #: The tier's name in ``stats()["rows_by_tier"]``: ``"host"``, ``"ssd"`` or ``"device"``.
    kind: str = ""
    #: Most rows the table may hold (None: unbounded); a load of more is refused up front.
    capacity: int | None = None
    #: Tables whose tiers name the same group (and device) run a block of tables in one call
    #: per op: ``"host"`` (one C++ gather and update, ``host_table.read_block``/``push_block``),
    #: ``"device"`` (one launch per op, ``device_block.DeviceBlocks``); None: a table at a time.
    block_group: str | None = None
    #: Whether a full save and load go a chunk at a time (:meth:`export_chunks`, the load
    #: streaming) rather than the whole table at once: tables larger than RAM (the ssd tier).
    streams_rows: bool = False
    #: Where :meth:`pull_resident` returns the weights (the CPU for tiers in host memory).
    resident_device: torch.device = torch.device("cpu")
    #: Where :meth:`push` takes its float inputs as they are, checked there (None: host memory).
    push_device: torch.device | None = None

    def __init__(self, options: TableOptions, seed: int = 0) -> None:
        self.options = options
        self.params = table_params(options, seed)
        self.dim = options.checked_dim()
        self.width = int(self.params.width)
        #: values after a row's four header words: dim weights, then the optimizer state
        self.payload = int(self.params.payload)
        self.counters = {
            "rows_created": 0,
            "rows_expanded": 0,
            "rows_deleted": 0,
            "rows_refused": 0,
            "cache_hits": 0,
            "cache_misses": 0,
        }

    def read(self, keys: torch.Tensor, create: bool = False) -> tuple[torch.Tensor | None, object]:
        """(weights (n, dim), None) if answerable without writing anything (all keys present
        in RAM), else (None, hint): the caller retries with ``pull(keys, create, hint)`` under
        an exclusive lock, and the hint saves that call the work already done. create: what
        that retry will pass."""
        return None, None

    @abstractmethod
    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        """Weights (n, dim) float32; creates absent keys when ``create`` (subject to
        admission), else reads them as zeros."""

    def pull_resident(self, keys: torch.Tensor, create: bool) -> torch.Tensor:
        """:meth:`pull`, the weights (n, dim) float32 left on :attr:`resident_device`."""
        return self.pull(keys, create)

    @abstractmethod
    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        """Fused update. keys: (n,) int64; grads: (n, dim); shows, clicks: (n,). A tier that
        does not sum repeated keys itself returns False when keys repeat, having written
        nothing (the caller sums them and pushes again); the host tier sums in C++."""

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-key statistics (see EmbeddingStore.inspect)."""

    def weights_of(self, full: torch.Tensor) -> torch.Tensor:
        """The weights (m, dim) float32 of full rows (m, width) float32 of this table (an
        export's, a checkpoint's): decoded where the table's dtype is compact."""
        return row_codec.weights(full, self.options.dtype, self.dim)

    def _stats_of(self, rows: torch.Tensor, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """Statistics from full rows (n, width) of which rows >= 0 are present."""
        present = rows >= 0
        full = torch.where(present[:, None], full, torch.zeros(()))
        show, click = full[:, _C.SHOW], full[:, _C.CLICK]
        o = self.options
        return {
            "present": present,
            "show": show.clone(),
            "click": click.clone(),
            "unseen_days": full[:, _C.UNSEEN].clone(),
            "score": o.nonclk_coeff * (show - click) + o.click_coeff * click,
            "expanded": (full[:, _C.FLAGS].to(torch.int64) & _C.FLAG_EXPANDED) != 0,
        }

    @abstractmethod
    def advance_day(self) -> None: ...

    @abstractmethod
    def shrink(self) -> torch.Tensor:
        """Decays show/click, deletes rows (see TableOptions); returns the keys deleted,
        (d,) int64 on the CPU (what the store records for the next delta)."""

    @abstractmethod
    def erase(self, keys: torch.Tensor) -> torch.Tensor:
        """Deletes the rows of ``keys`` (n,) int64 unique (absent ones ignored); returns the
        keys whose rows were deleted, (d,) int64 on the CPU."""

    @abstractmethod
    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (m,) int64 and full rows (m, width) that a save selection takes."""

    def export_chunks(self, select: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`export` in chunks (keys (b,) int64, rows (b, width) float32); one chunk
        unless the tier :attr:`streams_rows`."""
        yield self.export(select)

    @abstractmethod
    def full_rows(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Full rows (m, width) float32 on the CPU and present (m,) bool of ``keys`` (m,)
        int64 unique, created first when ``create`` (admission applies); absent rows read as
        zeros. What a cache in front of the table reads."""

    def write_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Sets the full rows (m, width) of ``keys`` (m,) int64 unique, all present: a cache
        in front of the table writing back."""
        self.import_rows(keys, rows)

    def rows_per_call(self) -> int:
        """Most keys one :meth:`full_rows` or :meth:`write_rows` call should take (the ssd
        tier: what its RAM cache holds at once); unbounded by default."""
        return 1 << 62

    @abstractmethod
    def clear_dirty(self) -> None:
        """Marks every row saved (the base/delta changed-since flag)."""

    @abstractmethod
    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Sets full rows (insert or assign). keys: (m,) int64 unique; rows: (m, width)."""

    @abstractmethod
    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Sets the weights of keys (base/delta load), creating absent rows (fresh state);
        rows with a nonzero embedx part count as expanded. values: (m, dim) float32."""

    @abstractmethod
    def mark_dirty(self, keys: torch.Tensor) -> None:
        """Sets the changed-since-save flag of present keys (undoes a failed base/delta)."""

    @abstractmethod
    def reset(self) -> None:
        """Removes every row."""

    @abstractmethod
    def bytes_used(self) -> dict[str, int]:
        """Bytes allocated per tier, e.g. ``{"host": ..., "ssd": ...}``."""

    def stats(self) -> dict[str, Any]:
        return {"rows": self.size(), "bytes": self.bytes_used(), **self.counters}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases files and memory."""
