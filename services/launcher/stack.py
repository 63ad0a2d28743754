"""``Stack``: brings every service up in a run directory, drives the demo job, supervises the
children until the job ends, and tears them down.

A child that exits is reported and restarted at the same address (port, ipc path, data
directory), at most ``--max-restarts`` times each (datagen, which lands the data once, is not):

* the API, the sampler and the trainer groups keep no state of their own (the API's is in
  Redis, the trainers' in the checkpoints): they are started again; a trainer group is the
  control plane's pool member ``trainers-<k>`` (``--trainer-groups``): it waits for the jobs
  the API gives it, and torchrun restarts it as a whole when one of its ranks dies;
* Redis comes back from its append-only file; the API and the trainers reconnect;
* a store shard comes back empty: the trainer groups are stopped *before* the shard is
  restarted (so no checkpoint can be written holding an empty shard), then started again;
  its warm start loads the job's last checkpoint (the one the API names) into every shard,
  and the API hands the pass in flight out again from that checkpoint (the new group's
  heartbeat replaces the old one's).

With ``--keep-running`` the supervision goes on after the job ends, until ``streamrec down``.
Redis requires a password, new every run (``RUN/redis-password``, mode 0600, in
``RUN/redis.conf`` for redis-server: in no command line); every child is told the file
(``$STREAMREC_REDIS_PASSWORD_FILE``). The trainers check a job's paths, sampler and store
shards against the run's roots, sampler and shards (``commands.trainer_limits``), and the
API asks for its token on reads too (``--auth-reads``; the launcher's client sends it).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import redis
from streamrec.api.client import ApiClient
from streamrec.auth import TOKEN_FILE_ENV, read_token, write_token_file
from streamrec.control import redis_io
from streamrec.control.redis_io import PASSWORD_FILE_ENV
from streamrec.launcher import commands, prometheus
from streamrec.launcher.children import Child
from streamrec.launcher.errors import StackError
from streamrec.launcher.job import RUN_FILE, job_spec, tables_config, write_run
from streamrec.launcher.report import follow_job, say_summary
from streamrec.launcher.serving import SERVING, ServingRedis
from streamrec.launcher.state import read_state, remove_state, write_state
from streamrec.process import free_port, pid_alive
from streamrec.wire import RpcClient

#: Children that end by themselves when their work is done: an exit code 0 is not a death.
FINITE = ("datagen",)


def free_port_run(n: int, attempts: int = 50) -> int:
    """The first of ``n`` consecutive TCP ports on 127.0.0.1 free at the time of the call
    (the trainer ranks serve /metrics on base + rank)."""
    for _ in range(attempts):
        base = free_port()
        if base + n > 65536:
            continue
        try:
            for port in range(base + 1, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise StackError(f"no {n} consecutive free ports found for the trainers' /metrics")


def _reported_ready(shard: Child) -> bool:
    """Whether a store shard printed ``READY <endpoint>`` (it serves from then on); a restarted
    shard's predecessor's line does not count."""
    return "READY" in shard.output()


class Stack:
    """Brings the stack up in ``args.run_dir``, drives the demo job, tears it all down.

    Args:
        args: the parsed and checked ``streamrec up`` flags.
        out: where the progress and the pass table go.
    """

    def __init__(self, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
        self.args = args
        self.out = out
        self.run = Path(args.run_dir).resolve()
        self.logs = self.run / "logs"
        self.children: dict[str, Child] = {}
        self.redis_port = args.redis_port or free_port()
        self.api_port = args.api_port or free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.store_endpoints = commands.store_endpoints(
            self.run, args.store_port, args.store_shards
        )
        self.sampler_endpoint = f"ipc://{self.run / 'sampler.sock'}"
        # every service serves /metrics: the API on its own port, the others on these
        self.store_metrics_ports = [free_port() for _ in range(args.store_shards)]
        self.sampler_metrics_port = free_port()
        self.trainer_metrics_ports = [free_port_run(args.trainers) for _ in self.groups]
        self.prometheus_port = free_port() if args.prometheus else None
        # the data plane's peer token (streamrec.auth): every child gets it (env and flags)
        self.peer_token_file = self.run / "peer-token"
        # Redis's password (AUTH), new every run: every child reads it from this file
        self.redis_password_file = self.run / "redis-password"
        # where online exports publish (streamrec.launcher.serving): its own Redis by default
        self.serving = ServingRedis.of_run(
            self.run, args.online_redis_url, args.online_redis_password_file
        )
        self.token = ""
        self.api: ApiClient | None = None
        self.job_id: str | None = None
        self._stopping = False

    WIPED: tuple[str, ...] = ("data", "models", "redis", "logs", "store", "prometheus", SERVING)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    @property
    def prometheus_url(self) -> str | None:
        return None if self.prometheus_port is None else f"http://127.0.0.1:{self.prometheus_port}"

    def metrics_targets(self) -> dict[str, list[str]]:
        """``host:port`` of every /metrics of the stack, by Prometheus job name."""
        local = "127.0.0.1:{}".format
        return {
            prometheus.API_JOB: [local(self.api_port)],
            prometheus.STORE_JOB: [local(p) for p in self.store_metrics_ports],
            prometheus.SAMPLER_JOB: [local(self.sampler_metrics_port)],
            prometheus.TRAINER_JOB: [
                local(port + r)
                for port in self.trainer_metrics_ports
                for r in range(self.args.trainers)
            ],
        }

    def record(self) -> None:
        """Writes the run state ``streamrec down`` reads (and where to scrape the stack)."""
        write_state(
            self.run,
            {
                "supervisor_pid": os.getpid(),
                "redis_url": self.redis_url,
                "api_url": self.api_url,
                "token_file": str(self.run / "api-token"),
                "peer_token_file": str(self.peer_token_file),
                "redis_password_file": str(self.redis_password_file),
                "sampler_endpoint": self.sampler_endpoint,
                "store_endpoints": self.store_endpoints,
                "data_root": str(self.run / "data"),
                "model_root": str(self.run / "models"),
                "trainer_groups": self.groups,
                "job_id": self.job_id,
                "metrics": self.metrics_targets(),
                "prometheus_url": self.prometheus_url,
                **self.serving.state(),
                "children": {
                    n: {"pid": c.pid, "cmd": Path(c.args[0]).name}
                    for n, c in self.children.items()
                    if c.pid
                },
            },
        )

    # ---- bring-up ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Refuses a run directory whose stack still runs; otherwise empties its ``WIPED``
        parts, writes new tokens and Redis's password, and the shards' tables file."""
        existing = read_state(self.run)
        if existing and pid_alive(existing.get("supervisor_pid")):
            raise StackError(
                f"a stack already runs in {self.run} (pid "
                f"{existing['supervisor_pid']}): `streamrec down --run-dir "
                f"{self.run}` first"
            )
        for sub in self.WIPED:
            shutil.rmtree(self.run / sub, ignore_errors=True)
        for sub in ("data", "models", "redis", "logs", "store"):
            (self.run / sub).mkdir(parents=True, exist_ok=True)
        (self.run / "sampler.sock").unlink(missing_ok=True)
        (self.run / RUN_FILE).unlink(missing_ok=True)  # an earlier run's: its job is gone
        self.token = secrets.token_urlsafe(24)
        token_file = self.run / "api-token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        self.peer_token_file.unlink(missing_ok=True)  # a new token for every run
        write_token_file(self.peer_token_file)
        self.redis_password_file.unlink(missing_ok=True)
        self.redis_password_file.touch(mode=0o600)
        self.redis_password_file.write_text(secrets.token_hex(24) + "\n")
        commands.redis_config(self.redis_password_file, self.run / "redis.conf")
        self.serving.prepare(self.run)
        tables = tables_config(self.args.slots, self.args.embedding_dim)
        (self.run / "tables.json").write_text(json.dumps(tables, indent=1))

    def add(
        self, name: str, args: list[str], restartable: bool, env: dict[str, str] | None = None
    ) -> Child:
        env = {
            TOKEN_FILE_ENV: str(self.peer_token_file),
            PASSWORD_FILE_ENV: str(self.redis_password_file),
            **(env or {}),
        }
        child = Child(name, args, self.logs / f"{name}.log", restartable, env)
        child.start()
        self.children[name] = child
        self.record()
        return child

    def wait_until(
        self, what: str, ready: Callable[[], Any], child: Child, timeout_s: float = 60
    ) -> None:
        """Polls ``ready`` until it returns true; raises when ``child`` exits first or after
        ``timeout_s``, with the end of its log."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if ready():
                    return
            except Exception:  # not up yet: keep polling until the deadline
                pass
            rc = child.exited()
            if rc is not None:
                raise StackError(f"{what} exited with code {rc} while starting:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise StackError(f"{what} not ready after {timeout_s:.0f}s:\n{child.tail()}")
            time.sleep(0.1)

    def start_redis(self) -> None:
        child = self.add(
            "redis",
            commands.redis_command(self.redis_port, self.run / "redis", self.run / "redis.conf"),
            restartable=True,
        )
        self.wait_redis(child)
        self.say(
            f"  redis            {self.redis_url}  (appendonly, {self.run / 'redis'}; password "
            f"in {self.redis_password_file})"
        )

    def start_serving_redis(self) -> None:
        """The serving Redis of online exports, the stack's own unless ``--online-redis-url``."""
        if self.serving.owned:
            self.wait_redis(self.add(SERVING, self.serving.command(self.run), restartable=True))
        self.say(f"  serving redis    {self.serving}")

    def wait_redis(self, child: Child) -> None:
        """Until Redis (or the serving one) answers a PING (after loading its append-only file
        on a restart)."""
        if child.name == SERVING:
            return self.wait_until("serving redis-server", self.serving.ping, child, 30)
        client = redis.Redis.from_url(
            redis_io.with_password(self.redis_url, self.redis_password_file),
            socket_timeout=1,
            socket_connect_timeout=1,
        )
        try:
            self.wait_until("redis-server", client.ping, child, 30)
        finally:
            client.close()

    def start_store(self) -> None:
        n = len(self.store_endpoints)
        for k, endpoint in enumerate(self.store_endpoints):
            self.add(
                f"store-{k}",
                commands.store_command(
                    k,
                    n,
                    endpoint,
                    self.run / "tables.json",
                    self.run / "models",
                    self.peer_token_file,
                    metrics_port=self.store_metrics_ports[k],
                    tier=self.args.store_tier,
                    persistent_path=self.run / "store",
                    cache_budget_mb=self.args.cache_budget_mb or 1.0,
                ),
                restartable=True,
                env={"OMP_NUM_THREADS": "1"},
            )
        for k in range(n):
            child = self.children[f"store-{k}"]
            self.wait_until(f"store shard {k}", partial(_reported_ready, child), child, 60)
        self.say(
            f"  embedding-store  {n} shard(s), {self.args.store_tier} tier: "
            f"{', '.join(self.store_endpoints)}"
        )

    def start_sampler(self) -> None:
        child = self.add(
            "sampler",
            commands.sampler_command(
                self.sampler_endpoint, self.peer_token_file, self.sampler_metrics_port
            ),
            restartable=True,
        )

        def ping() -> bool:
            token = read_token(self.peer_token_file)
            with RpcClient(self.sampler_endpoint, timeout_s=1.0, token=token) as c:
                c.call("ping")
            return True

        self.wait_until("sampler", ping, child, 60)
        self.say(f"  sampler          {self.sampler_endpoint}")

    def start_api(self) -> None:
        child = self.add(
            "api",
            commands.api_command(
                self.api_port,
                self.redis_url,
                self.run / "api-token",
                self.run / "data",
                self.run / "models",
                self.store_endpoints,
                [self.sampler_endpoint],
            )
            + self.serving.api_args(),
            restartable=True,
        )
        self.api = ApiClient(self.api_url, self.token)
        self.wait_until("api", self.api.ready, child, 60)
        self.say(f"  api              {self.api_url}/docs  (token in {self.run / 'api-token'})")

    def start_prometheus(self) -> None:
        """Prometheus scraping every /metrics of the stack, with the alert rules."""
        assert self.prometheus_port is not None
        directory = self.run / "prometheus"
        command = commands.prometheus_command(
            prometheus.write_files(directory, self.metrics_targets()),
            directory / "data",
            self.prometheus_port,
        )
        child = self.add("prometheus", command, restartable=True)
        ready = f"{self.prometheus_url}/-/ready"
        self.wait_until(
            "prometheus",
            lambda: urllib.request.urlopen(ready, timeout=1).status == 200,
            child,
            60,
        )
        self.say(
            f"  prometheus       {self.prometheus_url}  (scrapes every /metrics each "
            f"{prometheus.INTERVAL}; rules {directory / prometheus.RULES_FILE})"
        )

    def start_datagen(self) -> None:
        a = self.args
        self.add(
            "datagen",
            commands.datagen_command(
                self.run / "data",
                start_day=a.start_day,
                days=a.days,
                split_interval=a.split_interval,
                samples_per_split=a.samples_per_split,
                slots=a.slots,
                files_per_split=a.trainers,
                rate=a.rate,
                seed=a.seed,
            ),
            restartable=False,
        )
        self.say(
            f"  datagen          {a.days} day(s) x {1440 // a.split_interval} splits x "
            f"{a.samples_per_split} samples -> {self.run / 'data'}"
            + (f" at {a.rate} splits/s" if a.rate else "")
        )

    def submit(self) -> None:
        assert self.api is not None
        spec = job_spec(self.args, self.run, self.store_endpoints)
        job = self.api.create_job(spec)
        self.job_id = job["id"]
        self.api.action(job["id"], "start")
        self.record()
        write_run(self.run, self.args, job["id"], self.store_endpoints, self.serving)
        self.say(
            f"  job              {job['id']} ({job['passes_total']} passes) started: "
            f"POST {self.api_url}/v1/jobs/{job['id']}/start"
        )

    @property
    def groups(self) -> list[str]:
        """The trainer groups' names (their children's names too)."""
        return [f"trainers-{k}" for k in range(self.args.trainer_groups)]

    def trainer_args(self, group: str) -> list[str]:
        port = self.trainer_metrics_ports[self.groups.index(group)]
        limits = commands.trainer_limits(
            self.run / "models", self.run / "data", [self.sampler_endpoint], self.store_endpoints
        )
        limits += self.serving.trainer_args()  # the serving Redis a job may publish to
        return commands.trainer_command(
            self.args.trainers, self.redis_url, group, port, limits=limits
        )

    def start_trainers(self) -> None:
        """The trainer pool: each group registers with the API and waits for a job."""
        from streamrec.sampler import ENDPOINT_ENV  # here: `streamrec down` needs no torch

        # negatives from the stack's sampler, never a per-user socket another process may hold
        own = {ENDPOINT_ENV: self.sampler_endpoint, **self.serving.trainer_env()}
        for group in self.groups:
            env = {**commands.TRAINER_GROUP_ENV, **own}
            self.add(group, self.trainer_args(group), restartable=True, env=env)
        self.say(
            f"  trainers         {len(self.groups)} group(s) of {self.args.trainers} rank(s) in "
            f"the pool (torchrun, gloo): {', '.join(self.groups)}"
        )

    def up(self) -> int:
        """Brings everything up, follows the job to its end and prints the summary. Returns
        the exit code of ``streamrec up``: 0 when the job succeeded, 1 when it did not, 3 on
        timeout, 130 when asked to stop."""
        a = self.args
        self.say(f"streamrec up: run directory {self.run}")
        self.prepare()
        self.start_redis()
        self.start_serving_redis()
        self.start_store()
        self.start_sampler()
        self.start_api()
        for job, hosts in self.metrics_targets().items():
            self.say(f"  /metrics         {job}: {', '.join(hosts)}")
        if self.prometheus_port is not None:
            self.start_prometheus()
        self.start_datagen()
        self.start_trainers()
        self.submit()
        rc = self.follow(a.timeout_s)
        self.summary()
        if a.keep_running and not self._stopping:
            self.say(f"services stay up (--keep-running): `streamrec down --run-dir {self.run}`")
            self.supervise()
        return rc

    def supervise(self) -> None:
        """Until ``streamrec down`` (SIGTERM): restarts a service that exits, as during the
        job (a sampler or shard that crashed after it is back for the next job)."""
        while not self._stopping:
            try:
                self.check_children()
            except StackError as exc:  # out of restarts: said once, the others stay up
                self.say(f"! {exc}")
                for child in self.children.values():
                    if child.exited() is not None:
                        child.done = True
            time.sleep(0.5)

    # ---- supervision -------------------------------------------------------------------
    def check_children(self) -> None:
        """Reports children that exited; restarts the ones that are safe to restart."""
        for name, child in list(self.children.items()):
            rc = child.exited()
            if rc is None or child.done:
                continue
            if rc == 0 and name in FINITE:
                child.done = True
                if name == "datagen":
                    self.say("  datagen finished: every split has landed")
                continue
            self.say(
                f"! {name} exited with code {rc}; last lines of {child.log}:\n"
                + "\n".join("    " + line for line in child.tail(8).splitlines())
            )
            if not child.restartable or child.restarts >= self.args.max_restarts:
                raise StackError(
                    f"{name} died (code {rc}) and is "
                    + (
                        "not safe to restart"
                        if not child.restartable
                        else f"out of restarts ({self.args.max_restarts})"
                    )
                )
            child.restarts += 1
            t0 = time.monotonic()
            self.restart(name, child)
            self.record()
            self.say(
                f"  restarted {name} (restart {child.restarts}) in {time.monotonic() - t0:.1f}s"
            )

    def restart(self, name: str, child: Child) -> None:
        """Starts ``child`` again at the same address (see the module docstring)."""
        if name in ("redis", SERVING):
            child.start()
            self.wait_redis(child)  # the append-only file is loaded before PING answers
        elif name.startswith("store-"):
            groups = [self.children[g] for g in self.groups if g in self.children]
            for group in groups:  # first: a group still running could checkpoint the empty shard
                group.stop()
            child.start()
            self.wait_until(f"store {name}", partial(_reported_ready, child), child, 60)
            for group in groups:
                group.start()
            self.say(
                f"  restarted the trainer groups after {name}: their jobs go on from the last "
                f"checkpoint, loaded into every shard"
            )
        else:
            child.start()

    def follow(self, timeout_s: float) -> int:
        """Prints a row per finished pass until the job ends (:func:`report.follow_job`);
        0 when it succeeded, 1 when it did not, 3 on timeout, 130 when asked to stop."""
        assert self.api is not None and self.job_id is not None
        return follow_job(
            self.api,
            self.job_id,
            timeout_s,
            say=self.say,
            check=self.check_children,
            stopping=lambda: self._stopping,
        )

    def summary(self) -> None:
        if self.api is not None and self.job_id is not None:
            say_summary(self.api, self.job_id, self.run, self.logs, self.say)

    # ---- tear-down ---------------------------------------------------------------------
    def down(self) -> None:
        """Stops the children, the trainers first and Redis last."""
        order = [
            *self.groups,
            "prometheus",
            "datagen",
            "api",
            "sampler",
            *[n for n in self.children if n.startswith("store-")],
            SERVING,
            "redis",
        ]
        for name in order:
            child = self.children.get(name)
            if child is not None:
                child.stop()
        if self.api is not None:
            self.api.close()
        remove_state(self.run)

    def request_stop(self, signum: int, _frame: Any) -> None:
        """The SIGTERM / SIGINT handler: ``up`` ends at its next check and tears down."""
        self._stopping = True
