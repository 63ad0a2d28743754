"""The feature schema: the one description of a job's data, by feature names, not positions.

In a job file it is ``runner.schema`` (in a REST job ``data.schema``)::

    runner:
      data_format: slot             # parquet | slot | criteo | generated
      schema:
        label: click                # the 0/1 column
        dense: [age, price]         # floats, as they come: normalized online (below)
        sparse:
          - {name: user_id}                     # a table of its own, the job's dim
          - {name: genres, pooling: mean}       # sum (default) or mean over the bag
          - {name: hist, table: user_id}        # user_id's table: one row a key for both
          - {name: city, dim: 4}                # a 4-wide table, projected to the job's dim

Dense features are fed raw: each is read as a float (null or NaN: missing), then
standardized online by the model with running statistics saved with it
(``streamrec.trainer.model.dense_norm``: PaddleRec's ``data_norm``), clipped to +-8 deviations; a
missing value becomes 0. ``{name: age, log1p: true}`` takes ``log(max(x, 0) + 1)`` first,
``normalize: false`` skips the standardization of that feature.

Each sparse feature is an embedding table pooled ``sum`` or ``mean`` over its bag of keys
(an empty bag pools to zeros). ``criteo`` and ``generated`` are presets of the schema:
their lines are positional, so the schema names their columns in order (the label, 13
dense ``I1..I13`` with ``log1p`` always applied, one key per sparse column ``C1..CS``); a
job without a schema is that preset (``sparse_inputs_slots`` sparse features).

A feature's ``dim`` is its table's width (None: ``arch_sparse_feature_size``, the job's
dim). The DLRM interaction takes one dim for every vector, so a feature of another dim is
pooled at its own and then projected to the job's by a learned linear map (no bias) of
the dense model (``DLRMDense``'s ``proj``): trained by the dense optimizer, checkpointed
and exported with it; a feature at the job's dim has no projection (a job whose features
are all at its dim is the model it always was).

Checked by :func:`model_problems` when a job with a schema is read (``TrainerConfig``), and
by the API at create for every job, so a bad job is a 422 naming the field, never a failed
pass (a job without a schema read by the trainer alone keeps ``ModelShapeError`` at start):

- names unique over the label, dense and sparse features; pooling ``sum`` or ``mean``;
  ``table:`` names a feature with a table of its own; a shared table has one dim (a
  feature sharing a table sets no ``dim`` or its table's);
- the bottom MLP's input (``arch_mlp_bot``'s first size) = the number of dense features,
  its output = ``arch_sparse_feature_size``, the top MLP ends in 1 (a job that does not set
  ``arch_mlp_bot`` gets the default's hidden sizes between the two: ``TrainerConfig``); a
  schema without dense features has no bottom MLP (``arch_mlp_bot`` ``0-d``, a learned
  vector in its place);
- ``negative_sampling`` names its item-side features by name (``item_features``, the
  item id first, and ``category_feature``: features of the schema, see
  ``NegativeSamplingConfig``), not by slot (``item_slot`` and the like: a job without a
  schema's, refused in one with a schema, and the names refused without one);
- refused by name: ``log1p: false`` with ``criteo``/``generated`` (they always take it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator
from streamrec.config import StrictConfig

if TYPE_CHECKING:
    from streamrec.control.trainer_config import TrainerConfig

#: Sparse features: a store table each, and the dot interaction grows with their square.
MAX_SLOTS = 1024
#: Dense features a line may hold (a bottom MLP input of at most this width).
MAX_DENSE = 16384
#: Embedding dim: the store's ``TableOptions.dim`` bound.
MAX_EMBEDDING_DIM = 4096
#: A feature name: a Parquet column, a slot-text token's name (no ``:`` or space).
FEATURE_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
#: Dense features of the positional presets (Criteo's I1..I13).
PRESET_DENSE = 13
#: Sparse columns of a Criteo line (C1..C26).
CRITEO_SPARSE = 26
Pooling = Literal["sum", "mean"]


class DenseFeature(StrictConfig):
    """A float feature (null or NaN: missing), transformed as read, then standardized online
    by the model (``streamrec.trainer.model.dense_norm``).

    Attributes:
        name: the column (or slot-text name).
        log1p: True: ``log(max(x, 0) + 1)``; False or None (the default): x as it is
            (standardized by the normalizer: measured on real data sets, a log before it
            lost AUC, BENCHMARKS.md "Quality on real data sets"); criteo/generated always
            take ``log1p``.
        normalize: standardize the feature by running statistics kept with the model (a
            missing value becomes 0, the mean); False: the value as it is (a missing one 0).
    """

    name: str = Field(pattern=FEATURE_NAME)
    log1p: bool | None = None
    normalize: bool = True


class SparseFeature(StrictConfig):
    """A feature of int64 ids (one or many a sample), pooled into one embedding.

    Attributes:
        name: the column (or slot-text name).
        dim: the table's dim; None: ``arch_sparse_feature_size``. Another dim is projected
            to ``arch_sparse_feature_size`` before the interaction (a learned linear map).
        pooling: ``sum`` or ``mean`` of the bag's rows; an empty bag pools to zeros.
        table: another feature whose table this one shares (its keys go to that table: a
            key of both has one row, its gradients over both summed); that feature must
            have a table of its own.
    """

    name: str = Field(pattern=FEATURE_NAME)
    dim: int | None = Field(None, ge=1, le=MAX_EMBEDDING_DIM, strict=True)
    pooling: Pooling = "sum"
    table: str | None = Field(None, pattern=FEATURE_NAME)


class FeatureSchema(StrictConfig):
    """The label, the dense features and the sparse features of a job's data, by name."""

    label: str = Field("label", pattern=FEATURE_NAME)
    dense: list[DenseFeature] = Field(default_factory=list, max_length=MAX_DENSE)
    sparse: list[SparseFeature] = Field(min_length=1, max_length=MAX_SLOTS)

    @field_validator("dense", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        """``[age, {name: price, log1p: true}]``: a bare name is ``{name: ...}``."""
        if isinstance(v, list | tuple):
            return [{"name": d} if isinstance(d, str) else d for d in v]
        return v

    @model_validator(mode="after")
    def _unique(self) -> FeatureSchema:
        seen: dict[str, str] = {self.label: "label"}
        where = [(f"dense[{i}]", d.name) for i, d in enumerate(self.dense)]
        where += [(f"sparse[{i}]", s.name) for i, s in enumerate(self.sparse)]
        for path, name in where:
            if name in seen:
                raise ValueError(f"{path}.name {name!r} is already the name of {seen[name]}")
            seen[name] = path
        sparse = {s.name: s for s in self.sparse}
        for i, s in enumerate(self.sparse):
            if s.table is None:
                continue
            owner = sparse.get(s.table)
            if owner is None:
                raise ValueError(
                    f"sparse[{i}].table {s.table!r} names no sparse feature of the schema "
                    f"(they are {sorted(sparse)})"
                )
            if owner.table is not None or owner is s:
                raise ValueError(
                    f"sparse[{i}].table {s.table!r}: name a feature with a table of its own "
                    f"(that one shares {owner.table!r}'s)"
                    if owner is not s
                    else f"sparse[{i}].table {s.table!r} names the feature itself"
                )
            if s.dim is not None and owner.dim is not None and s.dim != owner.dim:
                raise ValueError(
                    f"sparse[{i}].dim {s.dim}: a shared table has one dim, {s.table!r} has "
                    f"{owner.dim}"
                )
        return self

    def normalized(self) -> list[bool]:
        """Per dense feature, whether the model standardizes it online."""
        return [d.normalize for d in self.dense]

    def slot_tables(self) -> list[int]:
        """Per sparse feature, the index of the feature whose table it uses (its own, or
        the one its ``table:`` names)."""
        index = {s.name: i for i, s in enumerate(self.sparse)}
        return [index[s.table] if s.table is not None else i for i, s in enumerate(self.sparse)]

    def slot_dims(self, job_dim: int) -> list[int]:
        """Per sparse feature, its table's dim: the ``dim`` of the feature owning the table,
        else ``job_dim`` (``arch_sparse_feature_size``)."""
        owners = self.slot_tables()
        return [self.sparse[o].dim or job_dim for o in owners]

    @classmethod
    def preset(cls, data_format: str, num_sparse: int) -> FeatureSchema:
        """The schema a ``criteo``/``generated`` job without one reads: label, I1..I13 with
        log1p, C1..C{num_sparse} of one key each."""
        del data_format  # both presets name their columns alike
        return cls(
            label="label",
            dense=[DenseFeature(name=f"I{i}", log1p=True) for i in range(1, PRESET_DENSE + 1)],
            sparse=[SparseFeature(name=f"C{i}") for i in range(1, num_sparse + 1)],
        )


#: (field path in the trainer config, message, the value) of one problem.
Problem = tuple[str, str, Any]


def schema_problems(config: TrainerConfig) -> list[Problem]:
    """What a job's schema asks that its model or format cannot give (empty: none); for a
    job without ``runner.schema``, only :func:`sampling_problems`. :func:`model_problems`
    adds the model's shapes."""
    schema = config.runner.feature_schema
    if schema is None:
        return sampling_problems(config)
    hp, fmt = config.hyper_parameters, config.runner.data_format
    out: list[Problem] = []
    where = "runner.schema"
    if fmt in ("criteo", "generated"):
        if len(schema.dense) != PRESET_DENSE:
            out.append(
                (
                    f"{where}.dense",
                    f"data_format {fmt!r} lines hold {PRESET_DENSE} dense fields (I1..I13, "
                    f"by position), the schema names {len(schema.dense)}",
                    [d.name for d in schema.dense],
                )
            )
        if fmt == "criteo" and len(schema.sparse) != CRITEO_SPARSE:
            out.append(
                (
                    f"{where}.sparse",
                    f"data_format 'criteo' lines hold {CRITEO_SPARSE} sparse fields (C1..C26, "
                    f"by position), the schema names {len(schema.sparse)}",
                    [s.name for s in schema.sparse],
                )
            )
        for i, d in enumerate(schema.dense):
            if d.log1p is False:
                out.append(
                    (
                        f"{where}.dense[{i}].log1p",
                        f"data_format {fmt!r} always takes log(x + 1) of its dense fields "
                        f"(feature {d.name!r})",
                        False,
                    )
                )
    if "sparse_inputs_slots" in hp.model_fields_set and hp.sparse_inputs_slots != len(
        schema.sparse
    ):
        out.append(
            (
                "hyper_parameters.sparse_inputs_slots",
                f"the schema names {len(schema.sparse)} sparse features; leave "
                f"sparse_inputs_slots out (it follows the schema) or set it to that",
                hp.sparse_inputs_slots,
            )
        )
    dims = schema.slot_dims(hp.arch_sparse_feature_size)
    for i, s in enumerate(schema.sparse):
        if s.table is not None and s.dim is not None and s.dim != dims[i]:
            out.append(
                (
                    f"{where}.sparse[{i}].dim",
                    f"feature {s.name!r} shares {s.table!r}'s table, whose dim is {dims[i]} "
                    f"(a shared table has one dim: leave dim out or set it to {dims[i]})",
                    s.dim,
                )
            )
    return out + sampling_problems(config)


def sampling_problems(config: TrainerConfig) -> list[Problem]:
    """``negative_sampling``'s item side against the job: features by name in a schema job
    (each a sparse feature of the schema), slots by number in a job without one."""
    ns, schema = config.negative_sampling, config.runner.feature_schema
    where = "negative_sampling"
    if schema is None:
        return [
            (
                f"{where}.{name}",
                "names schema features; a job without runner.schema names its item-side "
                "slots (item_slot, item_slots, category_slot)",
                value,
            )
            for name, value in (
                ("item_features", ns.item_features),
                ("category_feature", ns.category_feature),
            )
            if value
        ]
    out: list[Problem] = [
        (
            f"{where}.{name}",
            "a schema job names its item-side features by name: negative_sampling."
            "item_features (the item id first) and category_feature",
            value,
        )
        # by value, not by fields set: a whole config dumped and read back names them all
        for name, value in (
            ("item_slot", ns.item_slot),
            ("item_slots", ns.item_slots),
            ("category_slot", ns.category_slot),
        )
        if value not in (0, [], None)
    ]
    names = [s.name for s in schema.sparse]
    named = [(f"item_features[{i}]", n) for i, n in enumerate(ns.item_features)]
    if ns.category_feature is not None:
        named.append(("category_feature", ns.category_feature))
    for path, name in named:
        if name not in names:
            out.append(
                (f"{where}.{path}", f"names no sparse feature of the schema ({names})", name)
            )
    if len(set(ns.item_features)) != len(ns.item_features):
        out.append((f"{where}.item_features", "names a feature twice", ns.item_features))
    return out


def dense_count(config: TrainerConfig) -> int:
    """Dense features of a job's lines: its schema's, else the presets' 13."""
    schema = config.runner.feature_schema
    return PRESET_DENSE if schema is None else len(schema.dense)


def model_problems(config: TrainerConfig) -> list[Problem]:
    """:func:`schema_problems` plus the DLRM's shapes against the data: the bottom MLP's
    input = the dense features, its output = ``arch_sparse_feature_size``, the top MLP's
    last size 1 (what ``DLRMDense`` raises ``ModelShapeError`` for at the first pass)."""
    hp = config.hyper_parameters
    out = schema_problems(config)
    dense = dense_count(config)
    source = "the schema's dense features" if config.runner.feature_schema else "I1..I13"
    if dense == 0 and hp.arch_mlp_bot[0] == 0 and len(hp.arch_mlp_bot) != 2:
        out.append(
            (
                "hyper_parameters.arch_mlp_bot",
                f"without dense features there is no bottom MLP (a learned vector of "
                f"arch_sparse_feature_size takes its place): leave arch_mlp_bot out or set "
                f"it to 0-{hp.arch_sparse_feature_size}",
                "-".join(map(str, hp.arch_mlp_bot)),
            )
        )
    if hp.arch_mlp_bot[0] != dense:
        out.append(
            (
                "hyper_parameters.arch_mlp_bot",
                f"its first size is the bottom MLP's input: the {dense} dense features "
                f"({source}) of data_format {config.runner.data_format!r}",
                "-".join(map(str, hp.arch_mlp_bot)),
            )
        )
    if hp.arch_mlp_bot[-1] != hp.arch_sparse_feature_size:
        out.append(
            (
                "hyper_parameters.arch_mlp_bot",
                f"its last size is the bottom MLP's output, which the interaction takes "
                f"beside the embeddings: arch_sparse_feature_size "
                f"{hp.arch_sparse_feature_size}",
                "-".join(map(str, hp.arch_mlp_bot)),
            )
        )
    if hp.arch_mlp_top[-1] != 1:
        out.append(
            (
                "hyper_parameters.arch_mlp_top",
                "its last size must be 1 (one click probability)",
                "-".join(map(str, hp.arch_mlp_top)),
            )
        )
    return out
