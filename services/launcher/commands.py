"""The command line of each service the stack runs, from the addresses the stack chose.

Console scripts come from this environment (:func:`streamrec.process.bin_path`); redis-server
from PATH, else the Debian package's path.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from streamrec.launcher.prometheus import prometheus_binary
from streamrec.process import bin_path


def redis_config(password_file: Path, config_file: Path) -> Path:
    """Writes ``config_file`` (mode 0600) holding ``requirepass`` with the password of
    ``password_file``: redis-server reads it from there, so the password is in no command
    line (``ps`` shows every process's)."""
    password = password_file.read_text().strip()
    config_file.touch(mode=0o600)
    config_file.chmod(0o600)
    config_file.write_text(f"requirepass {password}\n")
    return config_file


def redis_command(port: int, directory: Path, config_file: Path | None = None) -> list[str]:
    """redis-server on 127.0.0.1:``port`` with an append-only file under ``directory``; with
    ``config_file`` (:func:`redis_config`) clients must authenticate."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    return [
        server,
        *([] if config_file is None else [str(config_file)]),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]


def store_endpoints(run: Path, base_port: int, shards: int) -> list[str]:
    """The shards' addresses: shard k on ``base_port`` + k, or (0) on ``ipc://RUN/store-k.sock``.
    Shard k's depends on k only, so a job and the trainers agree on the first ones whatever
    the count (``streamrec up --resume --store-shards N``: ``streamrec.launcher.resume``)."""
    if base_port:
        return [f"tcp://127.0.0.1:{base_port + k}" for k in range(shards)]
    return [f"ipc://{run / f'store-{k}.sock'}" for k in range(shards)]


#: Rows per table of the ssd tier (its file is sparse: the bound costs no disk).
SSD_CAPACITY = 1 << 20


def store_command(
    shard: int,
    num_shards: int,
    endpoint: str,
    tables: Path,
    model_root: Path,
    auth_token_file: Path,
    metrics_port: int | None = None,
    tier: str = "host",
    persistent_path: Path | None = None,
    cache_budget_mb: float = 1.0,
) -> list[str]:
    """Embedding-store shard ``shard`` of ``num_shards`` on ``endpoint``, saving and loading
    under ``model_root`` only, serving peers holding the token of ``auth_token_file``, its
    /metrics on ``metrics_port`` (None: none); prints ``READY``. ``tier`` ``ssd`` keeps the
    rows in files under ``persistent_path`` behind a RAM cache of ``cache_budget_mb`` MiB per
    table."""
    tier_args = ["--tier", tier]
    if tier == "ssd":
        if persistent_path is None:
            raise ValueError("tier 'ssd' needs a persistent_path")
        tier_args += [
            "--persistent-path",
            str(persistent_path),
            "--cache-budget-mb",
            str(cache_budget_mb),
            "--capacity",
            str(SSD_CAPACITY),
        ]
    metrics = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    return [
        bin_path("streamrec-embedding-store"),
        "serve",
        "--shard-id",
        str(shard),
        "--num-shards",
        str(num_shards),
        "--endpoint",
        endpoint,
        "--tables",
        str(tables),
        "--workers",
        "2",
        "--num-threads",
        "1",
        "--model-root",
        str(model_root),
        "--auth-token-file",
        str(auth_token_file),
        *tier_args,
        *metrics,
    ]


def sampler_command(
    endpoint: str, auth_token_file: Path, metrics_port: int | None = None
) -> list[str]:
    """The node's sampler on ``endpoint``, serving peers holding ``auth_token_file``'s token,
    its /metrics on ``metrics_port`` (None: none)."""
    return [
        bin_path("streamrec-sampler"),
        "serve",
        "--endpoint",
        endpoint,
        "--workers",
        "1",
        "--auth-token-file",
        str(auth_token_file),
        *([] if metrics_port is None else ["--metrics-port", str(metrics_port)]),
    ]


def api_command(
    port: int,
    redis_url: str,
    token_file: Path,
    data_root: Path,
    model_root: Path,
    store_endpoints: list[str],
    sampler_endpoints: Sequence[str] = (),
) -> list[str]:
    """The control plane, allowed to read jobs' data under ``data_root`` only, to write
    models under ``model_root`` only, and to give jobs the ``store_endpoints`` and the
    ``sampler_endpoints`` only (Redis's password: ``$STREAMREC_REDIS_PASSWORD_FILE``); every
    request but its probes and /metrics needs ``token_file``'s token, reads too."""
    return [
        bin_path("streamrec-api"),
        "serve",
        "--port",
        str(port),
        "--redis-url",
        redis_url,
        "--token-file",
        str(token_file),
        "--auth-reads",  # the default: said here so that no default can open the reads
        "--data-root",
        str(data_root),
        "--model-root",
        str(model_root),
        *(arg for e in store_endpoints for arg in ("--store-endpoint", e)),
        *(arg for e in sampler_endpoints for arg in ("--sampler-endpoint", e)),
        "--log-level",
        "warning",
    ]


def datagen_command(
    out: Path,
    start_day: str,
    days: int,
    split_interval: int,
    samples_per_split: int,
    slots: int,
    files_per_split: int,
    rate: float,
    seed: int,
) -> list[str]:
    """The planted stream under ``out``: one file per trainer rank per split, ``rate``
    splits landing per second (0: as fast as they are generated)."""
    return [
        bin_path("streamrec-datagen"),
        "--out",
        str(out),
        "--start-day",
        start_day,
        "--days",
        str(days),
        "--split-interval",
        str(split_interval),
        "--samples-per-split",
        str(samples_per_split),
        "--slots",
        str(slots),
        "--files-per-split",
        str(files_per_split),
        "--rate",
        str(rate),
        "--seed",
        str(seed),
    ]


def prometheus_command(config: Path, data: Path, port: int) -> list[str]:
    """Prometheus on 127.0.0.1:``port`` with ``config``, its TSDB under ``data``."""
    return [
        prometheus_binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


#: The environment of a trainer group's torchrun. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``:
#: the ranks meet in a store of their own each attempt, not in the agent's, which outlives
#: a restart and hands the new ranks the dead ones' gloo addresses (pytorch/pytorch#135712:
#: "connectFullMesh ... Connection refused" after a rank is killed).
TRAINER_GROUP_ENV = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def trainer_command(
    ranks: int,
    redis_url: str,
    group_name: str,
    metrics_port: int | None = None,
    max_restarts: int = 10,
    limits: Sequence[str] = (),
) -> list[str]:
    """A trainer group of ``ranks`` processes in the control plane's pool, named
    ``group_name``: torchrun's elastic agent (``--standalone``: c10d rendezvous on a free
    local port) restarts the whole group, up to ``max_restarts`` times, when a rank dies;
    rank r serves /metrics on ``metrics_port`` + r (None: none). ``limits``: the trainer's
    own checks of a job (:func:`trainer_limits`)."""
    return [
        bin_path("torchrun"),
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "--max-restarts",
        str(max_restarts),
        "--rdzv-conf",
        "timeout=600",  # the group's rendezvous (a restart waits for every rank this long)
        "-m",
        "streamrec.trainer.agent",
        "--redis-url",
        redis_url,
        "--group-name",
        group_name,
        "--heartbeat-ttl-s",
        "10",
        "--poll-ms",
        "300",
        "--log-level",
        "WARNING",
        *([] if metrics_port is None else ["--metrics-port", str(metrics_port)]),
        *limits,
    ]


def trainer_limits(
    model_root: Path,
    data_root: Path,
    sampler_endpoints: Sequence[str],
    store_endpoints: Sequence[str] = (),
) -> list[str]:
    """The agent flags that confine a job read from Redis: its paths under the run's roots,
    its sampler one of ``sampler_endpoints``, its store shards among ``store_endpoints``
    (streamrec.trainer.job_guard: the peer token goes to no other address)."""
    return [
        "--model-root",
        str(model_root),
        "--data-root",
        str(data_root),
        *(arg for e in sampler_endpoints for arg in ("--sampler-endpoint", e)),
        *(arg for e in store_endpoints for arg in ("--store-endpoint", e)),
    ]
