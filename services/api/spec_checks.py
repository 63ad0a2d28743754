"""What a job may name, checked whole when it is created (every problem a 422 naming its field).

The trainer config a job implies is validated by the trainer's own models
(:class:`~streamrec.control.trainer_config.TrainerConfig`, in :func:`trainer_config`); this
module adds what only the deployment knows, so a job cannot point the trainers anywhere the
API was not told to allow::

    paths       data.train_data_dir, model.negative_sampling.table_path   under a data root
                checkpoint.model_save_path                                 under a model root;
                                                  not, not in, not over another live job's (409)
                every component at most NAME_MAX bytes (the filesystem's limit)
    endpoints   store.endpoints (each once), sampler.endpoint              allow-listed
    Redis       model.online.redis_url                                     allow-listed, and
                                                                           carries no password
    binds       model.runner.metrics_host                                  allow-listed hosts
    ports       model.runner.metrics_port .. + trainer_ranks - 1           none the stack's
                                                                           (API, Redis, shards)
    tables      store.table_parameters, model.table_parameters             the store's
                                                                           TableOptions rules

A sampler endpoint or a serving Redis the deployment did not name would receive the
data-plane token or the model's rows; a bind on every interface would publish a trainer's
/metrics beyond the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from streamrec.api.errors import ModelPathTaken, Problem, SpecInvalid
from streamrec.api.models import JOB_OWNED, JobCreate
from streamrec.control import feature_schema
from streamrec.control.config_bounds import MAX_PORT
from streamrec.control.trainer_config import TrainerConfig
from streamrec.errors import EndpointRefused, PathRefused, quote
from streamrec.store_schema import TableOptions

#: Longest path component (bytes, UTF-8): Linux's NAME_MAX; a longer one fails every open.
NAME_MAX = 255
#: Hosts a trainer's /metrics may bind without being allowed: the loopback.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
INVALID = SpecInvalid.code
ENDPOINT = EndpointRefused.code

#: Table options the trainer sets itself (one table per slot, dim from the model).
TRAINER_TABLE_FIELDS = ("name", "dim", "embedx_dim")


@dataclass(frozen=True)
class SpecPolicy:
    """What the deployment lets a job name (the API's settings).

    Args:
        data_roots / model_roots: resolved roots; a path outside all of them is refused.
        store_endpoints: store shard endpoints a job may list (empty: none).
        sampler_endpoints: sampler endpoints a job may name (empty: only the node-local
            default, ``sampler.endpoint`` unset).
        online_redis_urls: serving Redis URLs ``model.online.redis_url`` may name.
        default_online_redis_url: the serving Redis of a job that names none
            (:meth:`with_default_online`).
        metrics_hosts: addresses ``model.runner.metrics_host`` may bind.
        api_port / redis_url: the API's own port and Redis (``--port``, ``--redis-url``);
            with the endpoints and URLs above, the ports of the stack that a trainer's
            ``model.runner.metrics_port`` may not take (:meth:`stack_ports`).
    """

    data_roots: Sequence[Path] = ()
    model_roots: Sequence[Path] = ()
    store_endpoints: Sequence[str] = ()
    sampler_endpoints: Sequence[str] = ()
    online_redis_urls: Sequence[str] = ()
    default_online_redis_url: str | None = None
    metrics_hosts: Sequence[str] = field(default_factory=lambda: list(LOOPBACK_HOSTS))
    api_port: int | None = None
    redis_url: str | None = None

    def with_default_online(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Trainer config ``cfg`` with the default serving Redis as ``online.redis_url`` where
        the job names none, and then ``online.modes`` empty unless the job set them: only
        the export trigger's mode ``online`` publishes there, not every base and delta."""
        online = cfg.get("online") or {}
        url = self.default_online_redis_url
        if url is None or not isinstance(online, dict) or online.get("redis_url") is not None:
            return cfg  # (a bad ``model.online`` is the trainer config's 422)
        return {**cfg, "online": {"modes": [], **online, "redis_url": url}}

    def stack_ports(self) -> dict[int, str]:
        """TCP port -> what of the stack listens there, as far as these settings tell."""
        out: dict[int, str] = {}
        if self.api_port:  # 0: a free port, not known here
            out[self.api_port] = "the API (--port)"
        named = [
            (self.redis_url, "the API's Redis (--redis-url)"),
            *((u, "a serving Redis (--online-redis-url)") for u in self.online_redis_urls),
            *((e, "a store shard (--store-endpoint)") for e in self.store_endpoints),
            *((e, "a sampler (--sampler-endpoint)") for e in self.sampler_endpoints),
        ]
        for address, who in named:
            port = tcp_port(address)
            if port is not None:
                out.setdefault(port, who)
        return out


#: The port of a redis:// URL that names none.
REDIS_PORT = 6379


def tcp_port(address: str | None) -> int | None:
    """The TCP port of a ``tcp://`` endpoint or a ``redis://`` URL (6379 when it names
    none); None for ``ipc://``, ``unix://`` and what does not parse."""
    if not address:
        return None
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:
        return None
    if port is None and parts.scheme in ("redis", "rediss") and parts.hostname:
        return REDIS_PORT
    return port


def resolve_under(field_name: str, value: str, roots: Sequence[Path]) -> Path:
    """``value`` resolved (links and ``..``), provided it lies under one of ``roots`` and no
    component is longer than :data:`NAME_MAX` bytes; :class:`SpecInvalid` naming the field."""
    for part in Path(value).parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            raise SpecInvalid(
                [
                    (
                        field_name,
                        f"a path component of {size} bytes is longer than NAME_MAX "
                        f"({NAME_MAX}): {quote(part, 40)}",
                        value,
                    )
                ]
            )
    try:
        path = Path(value).expanduser().resolve()
    except (ValueError, RuntimeError, OSError) as exc:  # NUL byte, symlink loop, bad ~user
        raise SpecInvalid(
            [(field_name, f"cannot be resolved: {type(exc).__name__}", value)]
        ) from None
    for root in roots:
        if path == root or path.is_relative_to(root):
            return path
    where = [str(r) for r in roots]
    message = f"{quote(value)} is outside the allowed roots {where}"
    raise SpecInvalid([(field_name, message, value, PathRefused.code)])


def _allowed(field_name: str, value: str, allowed: Sequence[str], what: str, flag: str) -> Problem:
    where = f"one of {list(allowed)}" if allowed else f"none (no {flag} is configured)"
    return (field_name, f"{quote(value)} is not an allowed {what}: {where}", value, ENDPOINT)


def endpoint_problems(spec: JobCreate, policy: SpecPolicy) -> list[Problem]:
    """Store endpoints listed twice or not allowed; a sampler endpoint not allowed."""
    out: list[Problem] = []
    seen: dict[str, int] = {}
    for i, e in enumerate(spec.store.endpoints):
        name = f"store.endpoints[{i}]"
        if e in seen:
            out.append(
                (name, f"{quote(e)} is listed twice (also endpoints[{seen[e]}])", e, INVALID)
            )
        elif e not in policy.store_endpoints:
            out.append(
                _allowed(name, e, policy.store_endpoints, "store endpoint", "--store-endpoint")
            )
        seen.setdefault(e, i)
    sampler = spec.sampler.endpoint
    if sampler is not None and sampler not in policy.sampler_endpoints:
        out.append(
            _allowed(
                "sampler.endpoint",
                sampler,
                policy.sampler_endpoints,
                "sampler endpoint (unset: the trainer's node-local sampler)",
                "--sampler-endpoint",
            )
        )
    return out


def _section(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    value = cfg.get(name)
    return value if isinstance(value, dict) else {}


def model_problems(spec: JobCreate, policy: SpecPolicy) -> list[Problem]:
    """``model`` fields that reach past the node: the online Redis, a metrics bind."""
    out: list[Problem] = []
    url = _section(spec.model, "online").get("redis_url")
    if isinstance(url, str):
        name = "model.online.redis_url"
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            out.append(
                (
                    name,
                    "carries a password: a job spec is no place for a secret (the trainers "
                    "read it from STREAMREC_REDIS_PASSWORD_FILE)",
                    "redis://...",
                    INVALID,
                )
            )
        elif url not in policy.online_redis_urls:
            out.append(
                _allowed(name, url, policy.online_redis_urls, "serving Redis", "--online-redis-url")
            )
    host = _section(spec.model, "runner").get("metrics_host")
    if isinstance(host, str) and host not in policy.metrics_hosts:
        out.append(
            _allowed(
                "model.runner.metrics_host",
                host,
                policy.metrics_hosts,
                "address for /metrics to bind",
                "--metrics-host",
            )
        )
    port = _section(spec.model, "runner").get("metrics_port")
    if type(port) is int and 0 < port <= MAX_PORT:  # a bad type or range: the trainer's 422
        out += metrics_port_problems(port, spec.resources.trainer_ranks or 1, policy)
    return out


def metrics_port_problems(port: int, ranks: int, policy: SpecPolicy) -> list[Problem]:
    """``model.runner.metrics_port``: local rank r serves /metrics on ``port + r``, so each
    of ``port .. port + ranks - 1`` (``resources.trainer_ranks``, else 1) must be a TCP port
    and none a port of the stack (a rank there fails to bind, or the service does)."""
    name = "model.runner.metrics_port"
    last = port + ranks - 1
    if last > MAX_PORT:
        return [
            (
                name,
                f"local rank {ranks - 1} would serve /metrics on {last} (metrics_port + local "
                f"rank, resources.trainer_ranks {ranks}), past the last TCP port {MAX_PORT}",
                port,
                INVALID,
            )
        ]
    ranks_on = f"{port}" if ranks == 1 else f"{port}..{last} (metrics_port + local rank)"
    return [
        (name, f"/metrics on {ranks_on} would take port {p}, the port of {who}", port, INVALID)
        for p, who in sorted(policy.stack_ports().items())
        if port <= p <= last
    ]


def table_problems(spec: JobCreate) -> list[Problem]:
    """Table parameters checked by name and type with the store's ``TableOptions`` rules
    (each field as the store reads it; unknown names refused), from the torch-free
    :mod:`streamrec.store_schema`: the API never loads the store."""
    out: list[Problem] = []
    sources = (
        ("model.table_parameters", _section(spec.model, "table_parameters")),
        ("store.table_parameters", spec.store.table_parameters),
    )
    if not any(params for _, params in sources):
        return out
    for where, params in sources:
        for key in params:
            if key in TRAINER_TABLE_FIELDS:
                out.append(
                    (
                        f"{where}.{key}",
                        "is set by the trainer (one table per slot, dim = "
                        "model.hyper_parameters.arch_sparse_feature_size)",
                        params[key],
                        INVALID,
                    )
                )
        checked = {k: v for k, v in params.items() if k not in TRAINER_TABLE_FIELDS}
        try:
            TableOptions.model_validate({**checked, "name": "slot_0", "dim": 2})
        except ValidationError as exc:
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                out.append((".".join([where, *loc]), err["msg"], err.get("input"), INVALID))
    return out


def check_spec(spec: JobCreate, policy: SpecPolicy) -> JobCreate:
    """Every check above; one :class:`SpecInvalid` listing all the problems found. Returns a
    copy of ``spec`` with its paths resolved as checked (links and ``..``): the paths are
    resolved once, here, and the job stores what was checked."""
    problems: list[Problem] = []
    resolved: dict[str, str] = {}
    for name, value, roots in (
        ("data.train_data_dir", spec.data.train_data_dir, policy.data_roots),
        ("checkpoint.model_save_path", spec.checkpoint.model_save_path, policy.model_roots),
        (
            "model.negative_sampling.table_path",
            _section(spec.model, "negative_sampling").get("table_path"),
            policy.data_roots,
        ),
    ):
        if not isinstance(value, str):
            continue
        try:
            resolved[name] = str(resolve_under(name, value, roots))
        except SpecInvalid as exc:
            problems.extend(exc.problems())
    problems += endpoint_problems(spec, policy)
    problems += model_problems(spec, policy)
    problems += table_problems(spec)
    if problems:
        raise SpecInvalid(problems)
    out = spec.model_copy(deep=True)
    out.data.train_data_dir = resolved["data.train_data_dir"]
    out.checkpoint.model_save_path = resolved["checkpoint.model_save_path"]
    table_path = resolved.get("model.negative_sampling.table_path")
    if table_path is not None:
        out.model["negative_sampling"]["table_path"] = table_path
    return out


def model_path_clash(path: str, others: Mapping[str, str]) -> ModelPathTaken | None:
    """The conflict of a job's resolved model path with another live job's (``others``: job
    id -> resolved model path), or None: one model path, one job. A path clashes when it is,
    contains or lies inside the other (compared as resolved paths, component by component)."""
    mine = Path(path)
    for other_id, other in sorted(others.items()):
        theirs = Path(other)
        if mine == theirs:
            relation = "is"
        elif mine.is_relative_to(theirs):
            relation = "lies inside"
        elif theirs.is_relative_to(mine):
            relation = "contains"
        else:
            continue
        return ModelPathTaken(path, relation, other_id, other)
    return None


def trainer_config(
    spec: JobCreate, job_id: str | None = None, policy: SpecPolicy | None = None
) -> dict[str, Any]:
    """The trainer config the job implies, validated, so a bad one is a 422 now rather than a
    failed job later; each error names the job field that set the value. On store shards, the
    job's tables live in the namespace ``job_id``: a new job starts from fresh rows, two jobs
    with different tables share the shards, deleting the job frees its rows. A job that names
    no serving Redis gets the ``policy``'s default one (``SpecPolicy.with_default_online``)."""
    cfg = spec.trainer_config()
    if policy is not None:
        cfg = policy.with_default_online(cfg)
    if job_id is not None and spec.store.endpoints:
        cfg["store"]["namespace"] = job_id
    try:
        parsed = TrainerConfig.model_validate(cfg, context={"schema_checks": False})
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            errors.append((job_field(loc), err["msg"], err.get("input")))
        raise SpecInvalid(errors) from None
    # the schema and the model's shapes against the data: a job whose bottom MLP does not
    # take its dense features is refused now, not failed at its first pass
    problems = feature_schema.model_problems(parsed)
    if problems:
        raise SpecInvalid(
            [
                (job_field(re.split(r"[.\[\]]+", path.strip("]"))), msg, v)
                for path, msg, v in problems
            ]
        )
    return cfg


def job_field(loc: list[str]) -> str:
    """The job field (dotted from the body) that set the trainer config field at ``loc``:
    ``["runner", "schema", "sparse", "2", "dim"]`` -> ``data.schema.sparse.2.dim``."""
    owner = JOB_OWNED.get((loc[0], loc[1])) if len(loc) > 1 else None
    if owner is None:
        return ".".join(["model", *loc])
    return ".".join([owner, *loc[2:]]) if owner == "data.schema" else owner
