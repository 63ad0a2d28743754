"""The embedding store's schema: table and store options, with the knob names of PaddleRec
and OneEmbedding, and the name rule of a namespace. Torch-free: the store reads its tables
with it, the API checks a job's table parameters and the trainer config its
``store.namespace`` with the same definitions, without loading the store.

A row of a table holds ``dim = 1 + embedx_dim`` weights: column 0 is the 1-dim *embed* part,
trained by ``embed_sgd_param``; columns 1.. are the *embedx* part, trained by
``embedx_sgd_param``, read as zeros and not trained until the row's score reaches
``embedx_threshold`` (then initialised and trained; ``embedx_threshold = 0`` gives a plain
embedding table). Score = ``nonclk_coeff * (show - click) + click_coeff * click`` (the
parameter server's formula; PaddleRec's text has ``click - show``, a typo: docs/design-notes.md).

Example:
    >>> t = TableOptions(name="user", embedx_dim=8, embedx_threshold=0,
    ...                  embedx_sgd_param=SgdRuleParam(name="adagrad", learning_rate=0.05))
    >>> t.dim
    9
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from streamrec.config import StrictConfig

#: Rule names as PaddleRec spells them, and the short aliases accepted on input.
RULE_NAMES = (
    "SparseNaiveSGDRule",
    "SparseAdaGradSGDRule",
    "StdAdaGradSGDRule",
    "SparseAdamSGDRule",
    "TorchAdaGradSGDRule",
)
RULE_ALIASES = {
    "naive": "SparseNaiveSGDRule",
    "sgd": "SparseNaiveSGDRule",
    "adagrad": "SparseAdaGradSGDRule",
    "std_adagrad": "StdAdaGradSGDRule",
    "adam": "SparseAdamSGDRule",
    "torch_adagrad": "TorchAdaGradSGDRule",
}
#: Rule name -> kind number of the C++ ops (csrc/cpu/table_params.h RuleKind).
RULE_KINDS = {name: i for i, name in enumerate(RULE_NAMES)}

TIERS = ("host", "ssd", "device")
#: A table's row dtype (TableOptions.dtype) and its number in the C++ and CUDA cores
#: (csrc/shared/row_layout.h RowDtype).
RowDtype = Literal["fp32", "fp16", "bf16"]
ROW_DTYPES: dict[str, int] = {"fp32": 0, "fp16": 1, "bf16": 2}
#: What a store namespace may be called (a job's tables live in the namespace of its id;
#: the trainer config's ``store.namespace``).
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class SgdRuleParam(StrictConfig):
    """A sparse optimizer rule and its parameters (PaddleRec's ``embed_sgd_param``).

    Rules (gradients are applied as given, summed over duplicate keys of a push):

    - ``SparseNaiveSGDRule``: ``w -= learning_rate * g``.
    - ``SparseAdaGradSGDRule``: one ``g2sum`` per part;
      ``w -= learning_rate * sqrt(initial_g2sum / (initial_g2sum + g2sum)) * g``, then
      ``g2sum += mean(g ** 2)``.
    - ``StdAdaGradSGDRule``: the same with one ``g2sum`` per weight.
    - ``SparseAdamSGDRule``: Adam with bias correction (``beta1``, ``beta2``, ``epsilon``).
    - ``TorchAdaGradSGDRule``: ``torch.optim.Adagrad``'s step, one ``g2sum`` per weight
      from 0: ``g2sum += g ** 2``, then ``w -= learning_rate * g / (sqrt(g2sum) + epsilon)``
      (the accumulator takes the gradient before the step, so a key's first step is
      ``learning_rate`` whatever the gradient's scale).

    Every rule clips the weights to ``weight_bounds`` after the step.
    """

    name: str = "SparseAdaGradSGDRule"
    learning_rate: float = Field(0.05, ge=0.0)
    initial_g2sum: float = Field(3.0, gt=0.0)
    #: Weights start uniform in [-initial_range, initial_range] unless the table names an
    #: initializer.
    initial_range: float = Field(1e-4, ge=0.0)
    weight_bounds: tuple[float, float] = (-10.0, 10.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    epsilon: float = Field(1e-8, gt=0.0)

    @field_validator("name", mode="before")
    @classmethod
    def _canonical_name(cls, v: object) -> object:
        if isinstance(v, str):
            v = RULE_ALIASES.get(v.lower(), v)
            if v not in RULE_NAMES:
                raise ValueError(
                    f"unknown rule {v!r}; expected one of {', '.join(RULE_NAMES)} "
                    f"or {', '.join(RULE_ALIASES)}"
                )
        return v

    @field_validator("weight_bounds")
    @classmethod
    def _ordered_bounds(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError(f"weight_bounds must be [lo, hi] with lo < hi, got {list(v)}")
        return v

    @property
    def kind(self) -> int:
        return RULE_KINDS[self.name]


class UniformInitializer(StrictConfig):
    """Weights uniform in ``[low, high)`` (OneEmbedding's ``make_uniform_initializer``)."""

    type: Literal["uniform"] = "uniform"
    low: float = -0.05
    high: float = 0.05

    @model_validator(mode="after")
    def _ordered(self) -> UniformInitializer:
        if not self.low <= self.high:
            raise ValueError(f"uniform initializer needs low <= high, got {self.low}, {self.high}")
        return self


class NormalInitializer(StrictConfig):
    """Weights normal with ``mean`` and ``std`` (OneEmbedding's ``make_normal_initializer``)."""

    type: Literal["normal"] = "normal"
    mean: float = 0.0
    std: float = Field(0.01, ge=0.0)


class ZerosInitializer(StrictConfig):
    """Weights start at zero."""

    type: Literal["zeros"] = "zeros"


Initializer = Annotated[
    UniformInitializer | NormalInitializer | ZerosInitializer, Field(discriminator="type")
]


class TableOptions(StrictConfig):
    """One sparse table (PaddleRec's table/accessor parameters plus OneEmbedding's initializer).

    Give ``dim`` or ``embedx_dim`` (or both, consistent): ``dim = 1 + embedx_dim``.
    ``initializer`` applies to every column; when absent, each part starts uniform in
    ``[-initial_range, initial_range]`` of its own sgd param (PaddleRec). Initial values are a
    deterministic function of (store seed, table name, key, column).
    """

    name: str
    dim: int | None = Field(None, ge=1, le=4096)
    embedx_dim: int | None = Field(None, ge=0, le=4095)
    initializer: Initializer | None = None
    embedx_threshold: float = 10.0
    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0
    base_threshold: float = 1.5
    delta_threshold: float = 0.25
    delta_keep_days: float = 16.0
    show_click_decay_rate: float = Field(0.98, ge=0.0, le=1.0)
    delete_threshold: float = 0.8
    delete_after_unseen_days: float = 30.0
    embed_sgd_param: SgdRuleParam = Field(default_factory=SgdRuleParam)
    embedx_sgd_param: SgdRuleParam = Field(default_factory=SgdRuleParam)
    #: Probability that a key absent from the table is admitted when first pulled or pushed
    #: (PaddleRec's ProbabilityEntry); refused keys read as zeros and their pushes are dropped
    #: until a later attempt admits them. 1.0 admits every key.
    admission_probability: float = Field(1.0, gt=0.0, le=1.0)
    #: Admission by score: when set, pulls create nothing and a push admits an absent key
    #: with probability min(1, score / admission_score), the score of the show/click it
    #: carries (so clicked keys get in first); refused keys read as zeros. None: off.
    admission_score: float | None = Field(None, gt=0.0)
    #: How the rows hold their weights and optimizer state: ``fp32``, or ``fp16`` / ``bf16``
    #: (16-bit values, two per 32-bit word: about half the bytes a row, in RAM, in the ssd
    #: tier's file and cache). A push steps a compact row in float32 and rounds the result
    #: stochastically (unbiased: many small updates are not lost); pulls, exports and
    #: predict see float32. Every tier (host, ssd, device and the GPU cache) stores every
    #: dtype.
    #: fp16 and bf16 hold the state of the naive and AdaGrad rules; SparseAdamSGDRule's is
    #: refused (its beta powers and second moment need float32).
    dtype: RowDtype = "fp32"
    #: Rows allocated and mapped when the table is made (HierarchicalKV's init_capacity):
    #: a table expected to hold about this many rows then never copies itself to grow nor
    #: faults fresh pages while creating rows (first writes to fresh memory cost ~2 s/GiB on
    #: small VMs). It still grows past it. 0: start small and double as needed.
    init_capacity: int = Field(0, ge=0, le=2**40)

    @field_validator("name")
    @classmethod
    def _file_safe_name(cls, v: str) -> str:
        if not _TABLE_NAME.match(v):
            raise ValueError(
                f"table name must match {_TABLE_NAME.pattern} (it names files), got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _derive_dims(self) -> TableOptions:
        if self.dim is None:
            if self.embedx_dim is None:
                raise ValueError(f"table {self.name!r}: give dim or embedx_dim")
            object.__setattr__(self, "dim", 1 + self.embedx_dim)
        elif self.embedx_dim is None:
            object.__setattr__(self, "embedx_dim", self.dim - 1)
        elif self.dim != 1 + self.embedx_dim:
            raise ValueError(
                f"table {self.name!r}: dim must be 1 + embedx_dim, got dim={self.dim}, "
                f"embedx_dim={self.embedx_dim}"
            )
        return self

    @model_validator(mode="after")
    def _dtype_fits_rules(self) -> TableOptions:
        # Adam's state does not survive 16 bits: its bias-correction powers start at beta1,
        # beta2 (0.999 is 1.0 in bf16: no step at all) and its second moment (1 - beta2) g^2
        # underflows fp16 for small gradients while the first moment does not (m / sqrt(v)
        # explodes).
        adam = [
            part
            for part, sgd in (("embed", self.embed_sgd_param), ("embedx", self.embedx_sgd_param))
            if sgd.name == "SparseAdamSGDRule"
        ]
        if self.dtype != "fp32" and adam:
            raise ValueError(
                f"table {self.name!r}: dtype {self.dtype!r} cannot hold SparseAdamSGDRule's "
                f"state ({', '.join(adam)}_sgd_param: its beta powers and second moment need "
                "float32); use dtype 'fp32' or an AdaGrad rule"
            )
        return self

    def checked_dim(self) -> int:
        """``dim`` as an int: validation derives it from ``embedx_dim`` when not given, so only
        an unvalidated instance (``model_construct``) lacks it."""
        if self.dim is None:
            raise ValueError(f"table {self.name!r} has no dim: build it with TableOptions(...)")
        return self.dim

    def score(self, show: float, click: float) -> float:
        """``nonclk_coeff * (show - click) + click_coeff * click``."""
        return self.nonclk_coeff * (show - click) + self.click_coeff * click


#: a device a store option may name: a CUDA device, or the CPU (the CPU build of the kernels)
DEVICE_PATTERN = r"^(cuda(:\d+)?|cpu)$"


def check_tier_options(options: object) -> None:
    """Raises ValueError naming what the ``ssd`` tier lacks, or a GPU cache asked of the
    ``device`` tier (``options`` has the tier fields)."""
    tier = getattr(options, "tier", None)
    if tier == "device" and getattr(options, "gpu_cache_budget_mb", None) is not None:
        raise ValueError(
            "gpu_cache_budget_mb caches rows of tier 'host' or 'ssd' in GPU memory; tier "
            "'device' keeps every row there already"
        )
    if tier == "ssd":
        missing = [
            f
            for f in ("persistent_path", "cache_budget_mb", "capacity")
            if getattr(options, f) is None
        ]
        if missing:
            raise ValueError(f"tier 'ssd' needs {', '.join(missing)}")


class StoreOptions(StrictConfig):
    """Where and how a store keeps its rows (OneEmbedding's store options).

    ``host``: rows in RAM. ``ssd``: rows in files under ``persistent_path`` with a RAM cache of
    at most ``cache_budget_mb`` MiB per table; ``capacity`` bounds the rows of each table
    (required for ssd, optional for host). ``device``: every row in GPU memory (the CUDA
    extension). ``gpu_cache_budget_mb`` (host and ssd): the hot rows of each table also in a
    write-back cache of that many MiB on ``gpu_cache_device``
    (:mod:`~streamrec.embedding_store.tiers.cached_table`).
    """

    tier: Literal["host", "ssd", "device"] = "host"
    persistent_path: str | None = None
    cache_budget_mb: float | None = Field(None, gt=0.0)
    #: GPU cache of hot rows per table of tier host or ssd, MiB (None: no GPU cache)
    gpu_cache_budget_mb: float | None = Field(None, gt=0.0)
    #: where that cache lives: a CUDA device; "cpu" runs the same cache in RAM (tests)
    gpu_cache_device: str = Field("cuda", pattern=DEVICE_PATTERN)
    #: where tier device keeps its rows (None: the current CUDA device); "cpu" runs it on the
    #: CPU build of the kernels (tests)
    device: str | None = Field(None, pattern=DEVICE_PATTERN)
    capacity: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0, lt=2**63)
    num_threads: int | None = Field(None, ge=1, le=1024)

    @model_validator(mode="after")
    def _ssd_needs_path(self) -> StoreOptions:
        check_tier_options(self)
        if self.device is not None and self.tier != "device":
            raise ValueError(
                f"device {self.device!r} places the rows of tier 'device', not of tier "
                f"{self.tier!r} (a GPU cache's: gpu_cache_device)"
            )
        return self
