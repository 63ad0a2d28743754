"""The trainer config's ``hyper_parameters`` section: the DLRM model and dense optimizer
(reference DLRM names)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from streamrec.config import StrictConfig
from streamrec.control.config_bounds import (
    MAX_BATCH,
    MAX_LAYER_WIDTH,
    MAX_LAYERS,
    MAX_LEARNING_RATE,
    MAX_LOSS_WEIGHT,
    MAX_SEED,
    MAX_STEPS,
)
from streamrec.control.feature_schema import MAX_EMBEDDING_DIM, MAX_SLOTS


def parse_dims(value: Any, field: str, min_len: int = 2) -> list[int]:
    """'13-512-256' or [13, 512, 256] -> [13, 512, 256] (the reference's dash format)."""
    if isinstance(value, str):
        parts = value.strip().split("-")
        try:
            dims = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{field} must look like '13-512-256', got {value!r}") from None
    elif isinstance(value, list | tuple):
        dims = list(value)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise ValueError(f"{field} must be a list of integers, got {value!r}")
    else:
        raise ValueError(f"{field} must be a dash string or a list, got {value!r}")
    # arch_mlp_bot's input may be 0: a model without dense features (no bottom MLP)
    first = 0 if field == "arch_mlp_bot" else 1
    if len(dims) < min_len or any(d < 1 for d in dims[1:]) or (dims and dims[0] < first):
        raise ValueError(f"{field} needs >= {min_len} positive sizes, got {value!r}")
    if len(dims) > MAX_LAYERS or max(dims) > MAX_LAYER_WIDTH:
        raise ValueError(
            f"{field} may have at most MAX_LAYERS ({MAX_LAYERS}) sizes of at most "
            f"MAX_LAYER_WIDTH ({MAX_LAYER_WIDTH}) each, got {value!r}"
        )
    return dims


class ModelConfig(StrictConfig):
    """The DLRM model and dense optimizer (reference DLRM names)."""

    arch_sparse_feature_size: int = Field(16, ge=1, le=MAX_EMBEDDING_DIM, strict=True)
    arch_mlp_bot: list[int] = Field(default_factory=lambda: [13, 512, 256, 64, 16])
    #: Top MLP after its input, which is fitted to the interaction (as the reference does).
    arch_mlp_top: list[int] = Field(default_factory=lambda: [512, 256, 1])
    arch_interaction_op: Literal["dot", "cat"] = "dot"
    arch_interaction_itself: bool = False
    #: Number of sparse features (embedding tables): 26 for Criteo (PaddleRec's name).
    sparse_inputs_slots: int = Field(26, ge=1, le=MAX_SLOTS, strict=True)
    loss_function: Literal["mse", "bce", "wbce"] = "bce"
    #: wbce weights for label 0 and 1, the reference's '1.0-1.0' format.
    loss_weights: list[Annotated[float, Field(ge=0, le=MAX_LOSS_WEIGHT, strict=True)]] = Field(
        default_factory=lambda: [1.0, 1.0]
    )
    loss_threshold: float = Field(0.0, ge=0, lt=1, strict=True)
    #: The online dense normalizer's window: the values a feature's running statistics
    #: hold at most (its decay, as PaddleRec's data_norm's summary_decay_rate; 1e7 values
    #: weigh about the last 1e7 samples). streamrec.trainer.dense_norm.
    dense_norm_window: int = Field(10_000_000, ge=1, le=MAX_STEPS, strict=True)
    #: The dense optimizer and rate. Adagrad, not the reference's sgd: with the default
    #: tables sgd trails the reference model trained by torch's Adagrad. 0.01, not more: a
    #: larger rate loses predict AUC on a real stream laid out a day a pass, while 0.01 still
    #: leads torch's Adagrad on the planted stream. Figures: BENCHMARKS.md, the trainer's
    #: defaults on a real stream.
    optimizer: Literal["sgd", "adagrad", "adam"] = "adagrad"
    learning_rate: float = Field(0.01, gt=0, le=MAX_LEARNING_RATE, strict=True)
    lr_num_warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    lr_decay_start_step: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    lr_num_decay_steps: int = Field(0, ge=0, le=MAX_STEPS, strict=True)
    #: The reference's mini_batch_size; an alias of runner.train_batch_size.
    mini_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, strict=True)
    numpy_rand_seed: int = Field(123, ge=0, le=MAX_SEED, strict=True)
    #: The dense model's arithmetic: "bf16" runs the MLPs and the interaction under bf16
    #: autocast (fp32 weights and optimizer state), "fp32" as the reference, "auto" bf16 only
    #: where the hardware runs it fast (a CPU with AMX or AVX512-BF16, a GPU of compute
    #: capability 8.0+; streamrec.trainer.precision). The pass log says which ran.
    precision: Literal["auto", "fp32", "bf16"] = "auto"

    @field_validator("arch_mlp_bot", "arch_mlp_top", mode="before")
    @classmethod
    def _dims(cls, v: Any, info: Any) -> list[int]:
        return parse_dims(v, info.field_name, 2 if info.field_name == "arch_mlp_bot" else 1)

    @field_validator("loss_weights", mode="before")
    @classmethod
    def _weights(cls, v: Any) -> list[float]:
        if isinstance(v, str):
            try:
                v = [float(p) for p in v.split("-")]
            except ValueError:
                raise ValueError(f"loss_weights must look like '1.0-1.0', got {v!r}") from None
        if not (isinstance(v, list | tuple) and len(v) == 2):
            raise ValueError(f"loss_weights needs 2 values (label 0, label 1), got {v!r}")
        return list(v)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.lr_num_decay_steps > 0 and self.lr_decay_start_step < self.lr_num_warmup_steps:
            raise ValueError(
                f"lr_decay_start_step {self.lr_decay_start_step} is before the end of warmup "
                f"(lr_num_warmup_steps {self.lr_num_warmup_steps}): warmup must finish first"
            )
        return self

    @property
    def dense_dim(self) -> int:
        return self.arch_mlp_bot[0]
