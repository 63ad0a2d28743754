"""API settings: one class, validated when the server starts (never at import).

Values come from CLI flags and ``STREAMREC_API_*`` environment variables (flags win)::

    STREAMREC_API_REDIS_URL=redis://127.0.0.1:6379/0
    STREAMREC_API_TOKEN=...              # or STREAMREC_API_TOKEN_FILE=/run/secrets/api-token
    STREAMREC_API_DATA_ROOTS=/data:/mnt/more-data
    STREAMREC_API_MODEL_ROOTS=/models
    STREAMREC_API_STORE_ENDPOINTS=tcp://store-0.store:5555,tcp://store-1.store:5555
    # or, where the shards are numbered (a StatefulSet: the count follows its replicas)
    STREAMREC_API_STORE_ENDPOINT_TEMPLATE=tcp://store-{shard}.store:5555
    STREAMREC_API_STORE_SHARDS=2

    STREAMREC_API_SAMPLER_ENDPOINTS=tcp://sampler.node:5700   # jobs' sampler.endpoint
    STREAMREC_API_ONLINE_REDIS_URLS=redis://serving-redis:6379/0  # jobs' model.online.redis_url
    STREAMREC_API_DEFAULT_ONLINE_REDIS_URL=redis://serving-redis:6379/0  # ... when they name none
    STREAMREC_API_METRICS_HOSTS=127.0.0.1,0.0.0.0   # jobs' model.runner.metrics_host
    STREAMREC_REDIS_PASSWORD_FILE=/run/secrets/redis-password   # Redis AUTH (all services)

Every endpoint needs the bearer token, reads too (a job's spec names its paths and store
endpoints; ``auth_reads=false`` opens the reads). ``/healthz``, ``/readyz`` and ``/metrics``
stay open: probes and Prometheus hold no token, and /metrics has counts and pass metrics by
job id, no spec, path or endpoint.

A job's ``store.endpoints`` must each be one of ``store_endpoints`` (compared as strings); with
none configured every job keeps its store in-process (any endpoint is refused), so a job
cannot point the trainers at an address the deployment did not name. The same holds for
``sampler.endpoint`` (``sampler_endpoints``; unset, the trainer uses its node-local sampler),
``model.online.redis_url`` (``online_redis_urls``) and ``model.runner.metrics_host``
(``metrics_hosts``, the loopback by default): see ``spec_checks.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from streamrec.api.errors import ApiConfigError
from streamrec.api.spec_checks import LOOPBACK_HOSTS, SpecPolicy
from streamrec.config import StrictConfig
from streamrec.control.redis_io import PASSWORD_FILE_ENV, read_password

ENV_PREFIX = "STREAMREC_API_"
_LIST_FIELDS = ("data_roots", "model_roots")
#: Lists given comma-separated in the environment (a tcp:// or redis:// address holds ':').
_COMMA_FIELDS = ("store_endpoints", "sampler_endpoints", "online_redis_urls", "metrics_hosts")


class Settings(StrictConfig):
    """Everything the API process needs, checked once at start-up.

    Args:
        redis_url: Redis holding all state (``redis://host:port/db``).
        token: the bearer token of every endpoint but the probes and /metrics (constant-time
            compare).
        token_file: file holding the token (a mounted secret); used when ``token`` is unset.
        auth_disabled: explicit opt-out of auth (tests, local demo only).
        auth_reads: require the token on the read endpoints too (the default; false opens
            them: job specs, passes, events and triggers to whoever reaches the port).
        data_roots / model_roots: jobs may only name paths under one of these.
        store_endpoints: the store shard endpoints jobs may name (none: jobs may name none).
        store_endpoint_template / store_shards: adds ``template`` with ``{shard}`` replaced by
            0 .. ``store_shards`` - 1 to ``store_endpoints`` (set both or neither).
        sampler_endpoints: the sampler endpoints a job's ``sampler.endpoint`` may name (none:
            jobs use their trainer's node-local sampler only).
        online_redis_urls: the serving Redis URLs a job's ``model.online.redis_url`` may name.
        default_online_redis_url: the serving Redis of a job that names none: its trainer
            config gets it as ``online.redis_url`` (with ``online.modes`` empty unless the job
            sets them: only the export trigger's mode ``online`` publishes); allowed too.
        metrics_hosts: the addresses a job's ``model.runner.metrics_host`` may bind.
        redis_password_file: the file holding Redis's password (AUTH); None:
            ``$STREAMREC_REDIS_PASSWORD_FILE``, else none (a warning at start-up).
        max_body_bytes: request bodies above this are refused with 413.
        redis_timeout_s: socket timeout for every Redis call (no hangs when Redis is down).
        redis_outage_s: how long a call whose connection is refused keeps retrying (a Redis
            restart is ridden out; past it the request gets 503).
        scheduler_interval_s: how often the scheduler polls donefiles, reports, heartbeats.
        heartbeat_ttl_s: a trainer group whose heartbeat is older than this is dead.
        trainer_stuck_s: a trainer group that beats but has made no progress (its heartbeat's
            ``progress_ts``) for this long while working on a pass is stuck: its pass is
            handed out again (and /workers says ``stuck``).
        lock_ttl_s: lease of the scheduler lock (one scheduling API at a time).
        restart_budget: a job's trainer group may be restarted (killed, evicted, stuck) this
            many times in a row without a pass done before the job fails (a job's
            ``resources.restart_budget`` overrides it).
        restart_backoff_s / restart_backoff_max_s: the wait before a pass is handed out again
            after a restart, doubled per restart in a row, capped.
        scheduler_enabled: run the scheduler thread in this process.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    token: str | None = None
    token_file: Path | None = None
    auth_disabled: bool = False
    auth_reads: bool = True
    data_roots: list[Path] = Field(default_factory=list)
    model_roots: list[Path] = Field(default_factory=list)
    store_endpoints: list[str] = Field(default_factory=list, max_length=1024)
    store_endpoint_template: str | None = None
    store_shards: int | None = Field(None, ge=1, le=1024)
    sampler_endpoints: list[str] = Field(default_factory=list, max_length=1024)
    online_redis_urls: list[str] = Field(default_factory=list, max_length=1024)
    default_online_redis_url: str | None = None
    metrics_hosts: list[str] = Field(default_factory=lambda: list(LOOPBACK_HOSTS), max_length=64)
    redis_password_file: Path | None = None
    max_body_bytes: int = Field(1 << 20, ge=1024)
    redis_timeout_s: float = Field(2.0, gt=0, le=60)
    redis_outage_s: float = Field(5.0, ge=0, le=600)
    scheduler_interval_s: float = Field(0.5, gt=0, le=60)
    heartbeat_ttl_s: float = Field(10.0, gt=0, le=3600)
    trainer_stuck_s: float = Field(120.0, gt=0, le=86400)
    lock_ttl_s: float = Field(3.0, gt=0, le=600)
    restart_budget: int = Field(10, ge=0, le=10_000)
    restart_backoff_s: float = Field(1.0, ge=0, le=3600)
    restart_backoff_max_s: float = Field(60.0, ge=0, le=86400)
    scheduler_enabled: bool = True
    api_id: str = Field(default_factory=lambda: f"api-{os.getpid()}")

    @field_validator("token")
    @classmethod
    def _token_not_blank(cls, v: str | None) -> str | None:
        if v is not None and len(v.strip()) < 8:
            raise ValueError("token must have at least 8 non-blank characters")
        return v

    @field_validator("data_roots", "model_roots")
    @classmethod
    def _absolute(cls, v: list[Path]) -> list[Path]:
        return [p.expanduser().resolve() for p in v]

    @model_validator(mode="after")
    def _numbered_store_endpoints(self) -> Settings:
        template, shards = self.store_endpoint_template, self.store_shards
        if (template is None) != (shards is None):
            raise ValueError("store_endpoint_template and store_shards are set together")
        if template is None or shards is None:
            return self
        if "{shard}" not in template:
            raise ValueError(f"store_endpoint_template {template!r} has no {{shard}}")
        numbered = [template.replace("{shard}", str(k)) for k in range(shards)]
        known = set(self.store_endpoints)
        extra = [e for e in numbered if e not in known]
        object.__setattr__(self, "store_endpoints", [*self.store_endpoints, *extra])
        return self

    @model_validator(mode="after")
    def _default_online_redis_allowed(self) -> Settings:
        url = self.default_online_redis_url
        if url is None:
            return self
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError as exc:
            raise ValueError(f"default_online_redis_url {url!r}: {exc}") from None
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"default_online_redis_url must be a redis:// URL, got {url!r}")
        if password:
            raise ValueError(
                "default_online_redis_url carries a password: the trainers read it from "
                "STREAMREC_ONLINE_REDIS_PASSWORD_FILE"
            )
        if url not in self.online_redis_urls:
            object.__setattr__(self, "online_redis_urls", [*self.online_redis_urls, url])
        return self

    @model_validator(mode="after")
    def _auth_configured(self) -> Settings:
        if self.token is None and self.token_file is not None:
            try:
                text = self.token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"token_file {str(self.token_file)!r}: {exc.strerror}") from None
            if len(text) < 8:
                raise ValueError(f"token_file {str(self.token_file)!r}: token shorter than 8")
            object.__setattr__(self, "token", text)
        if self.token is None and not self.auth_disabled:
            raise ValueError(
                "no API token: set STREAMREC_API_TOKEN or STREAMREC_API_TOKEN_FILE "
                "(or auth_disabled=true for a local test)"
            )
        return self

    @model_validator(mode="after")
    def _redis_password(self) -> Settings:
        if self.redis_password_file is not None:
            try:
                read_password(self.redis_password_file)
            except ValueError as exc:
                raise ValueError(f"redis_password_file: {exc}") from None
        return self

    def redis_password(self) -> str | None:
        """Redis's password from ``redis_password_file`` (None: Redis without AUTH)."""
        return None if self.redis_password_file is None else read_password(self.redis_password_file)

    def insecure(self) -> list[str]:
        """The settings that leave a door open (warned at start-up, ``streamrec_api_insecure``)."""
        out = []
        if self.auth_disabled:
            out.append("auth_disabled")
        if self.redis_password_file is None and not urlsplit(self.redis_url).password:
            out.append("redis_no_password")
        return out

    def policy(self) -> SpecPolicy:
        """What a job may name: these settings' roots, endpoints, URLs and hosts."""
        return SpecPolicy(
            data_roots=self.data_roots,
            model_roots=self.model_roots,
            store_endpoints=self.store_endpoints,
            sampler_endpoints=self.sampler_endpoints,
            online_redis_urls=self.online_redis_urls,
            default_online_redis_url=self.default_online_redis_url,
            metrics_hosts=self.metrics_hosts,
            api_port=self.port,
            redis_url=self.redis_url,
        )

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Builds settings from ``STREAMREC_API_*`` env vars, then ``overrides`` (non-None)."""
        env = os.environ if env is None else env
        data: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name in _LIST_FIELDS:
                data[name] = [p for p in raw.split(os.pathsep) if p]
            elif name in _COMMA_FIELDS:  # tcp://host:port holds the path separator
                data[name] = [e.strip() for e in raw.split(",") if e.strip()]
            else:
                data[name] = raw
        if "redis_password_file" not in data and env.get(PASSWORD_FILE_ENV):
            data["redis_password_file"] = env[PASSWORD_FILE_ENV]
        for k, v in (overrides or {}).items():
            if v is not None:
                data[k] = v
        try:
            return cls.parse(data, source="api settings")
        except ValueError as exc:
            raise ApiConfigError(str(exc)) from exc
