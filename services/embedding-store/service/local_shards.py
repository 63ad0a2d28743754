"""N embedding-store shards as processes on this machine, for tests and benchmarks.

Each shard is ``python -m streamrec.embedding_store serve ...`` started with
:func:`streamrec.process.spawn` and stopped with :func:`streamrec.process.stop_process`
(the one way StreamRec starts and stops a child).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from streamrec.auth import read_token, token_file
from streamrec.process import spawn, stop_process
from streamrec.wire import Meta, RpcClient


class LocalShards:
    """Starts ``num_shards`` shard processes on this machine and stops them after.

    Each shard binds ``endpoint`` (default ``tcp://127.0.0.1:*``, a free port chosen by the
    OS; ``{shard}`` in it is replaced by the shard id, e.g. ``ipc:///tmp/x/shard-{shard}``
    for node-local clients) and reports its endpoint on stdout (``READY <endpoint>
    metrics=<port>``). Used by the tests and the benchmarks. The shards get SIGTERM when the
    thread that started them ends (Linux PR_SET_PDEATHSIG), so a killed test run leaves none
    behind: start them from a thread that outlives them (the main thread).

    Args:
        tables: the tables file (YAML/JSON) every shard reads (the default namespace's);
            None: the shards start with none (clients create their namespaces).
        num_shards: N.
        extra_args: more ``serve`` flags for every shard (``--tier ssd ...``).
        start_timeout_s: how long to wait for every shard to be ready.
        metrics: serve each shard's Prometheus metrics on a free port (``metrics_ports``).
        endpoint: the address template every shard binds.
        model_roots: the shards' ``--model-root`` directories; None: the system temporary
            directory (where pytest's ``tmp_path`` lies), as these shards serve tests and
            benchmarks of this machine.
        auth_token_file: the peer token file every shard is started with (and ``ping`` sends);
            None: ``$STREAMREC_AUTH_TOKEN_FILE``, else the per-user file (``streamrec.auth``),
            which an ``EmbeddingStoreClient`` made without one also reads.

    Example:
        >>> with LocalShards("tables.yaml", 2) as shards:
        ...     client = EmbeddingStoreClient(shards.endpoints)
    """

    def __init__(
        self,
        tables: str | Path | None,
        num_shards: int,
        extra_args: list[str] | None = None,
        start_timeout_s: float = 60.0,
        metrics: bool = False,
        endpoint: str = "tcp://127.0.0.1:*",
        model_roots: Sequence[str | Path] | None = None,
        auth_token_file: str | Path | None = None,
    ) -> None:
        self.tables = None if tables is None else str(tables)
        self.endpoint = endpoint
        self.num_shards = num_shards
        self.extra_args = list(extra_args or [])
        self.start_timeout_s = start_timeout_s
        self.metrics = metrics
        roots = [tempfile.gettempdir()] if model_roots is None else model_roots
        self.model_roots = [str(r) for r in roots]
        self.auth_token_file = token_file(auth_token_file)
        self.procs: list[subprocess.Popen | None] = [None] * num_shards
        self.endpoints: list[str] = [""] * num_shards
        self.metrics_ports: list[int | None] = [None] * num_shards
        self._logs: list[IO[str] | None] = [None] * num_shards

    def command(self, shard_id: int) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "streamrec.embedding_store",
            "serve",
            "--shard-id",
            str(shard_id),
            "--num-shards",
            str(self.num_shards),
            "--endpoint",
            self.endpoint.replace("{shard}", str(shard_id)),
            *(() if self.tables is None else ("--tables", self.tables)),
            "--auth-token-file",
            str(self.auth_token_file),
            *(arg for root in self.model_roots for arg in ("--model-root", root)),
            *self.extra_args,
        ]
        if self.metrics:
            cmd += ["--metrics-port", "0"]
        return cmd

    def start(self) -> LocalShards:
        try:
            for k in range(self.num_shards):
                self.start_shard(k, wait=False)
            for k in range(self.num_shards):
                self._wait_ready(k)
        except BaseException:
            self.stop()
            raise
        return self

    def start_shard(self, shard_id: int, wait: bool = True) -> None:
        """(Re)starts shard ``shard_id``; its endpoint may change (a new free port)."""
        log_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in __exit__)
        self._logs[shard_id] = log_file
        self.procs[shard_id] = spawn(
            self.command(shard_id),
            log=log_file,
            env={"PYTHONUNBUFFERED": "1"},
            die_with_parent=True,
            stdout_pipe=True,
        )
        if wait:
            self._wait_ready(shard_id)

    def _wait_ready(self, shard_id: int) -> None:
        proc = self.procs[shard_id]
        assert proc is not None and proc.stdout is not None
        result: dict[str, str] = {}

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                if line.startswith("READY "):
                    result["line"] = line
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if "line" not in result:
            self.stop()
            raise RuntimeError(
                f"shard {shard_id} did not start within "
                f"{self.start_timeout_s}s: {self.stderr(shard_id)[-2000:]}"
            )
        parts = result["line"].split()
        self.endpoints[shard_id] = parts[1]
        for p in parts[2:]:
            if p.startswith("metrics=") and p != "metrics=none":
                self.metrics_ports[shard_id] = int(p.split("=", 1)[1])

    def stderr(self, shard_id: int) -> str:
        f = self._logs[shard_id]
        if f is None:
            return ""
        f.seek(0)
        return f.read()

    def kill(self, shard_id: int) -> None:
        """Kills shard ``shard_id`` hard (SIGKILL), as a crash would."""
        proc = self.procs[shard_id]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop_shard(self, shard_id: int, timeout_s: float = 10.0) -> int | None:
        """Stops one shard with SIGTERM (SIGKILL after ``timeout_s``); returns its exit code."""
        proc = self.procs[shard_id]
        if proc is None:
            return None
        stop_process(proc, timeout_s)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.poll()

    def stop(self) -> None:
        for k in range(self.num_shards):
            self.stop_shard(k)

    def alive(self, shard_id: int) -> bool:
        proc = self.procs[shard_id]
        return proc is not None and proc.poll() is None

    def ping(self, shard_id: int, timeout_s: float = 5.0) -> Meta:
        token = read_token(self.auth_token_file)
        with RpcClient(self.endpoints[shard_id], timeout_s=timeout_s, token=token) as c:
            return c.call("ping")[0]

    def __enter__(self) -> LocalShards:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for f in self._logs:
            if f is not None:
                f.close()
