"""``streamrec up`` / ``streamrec down``: the whole stack on one machine, from one command.

``streamrec up`` starts, as local processes in a run directory (logs under ``RUN/logs``)::

    redis-server        append-only file under RUN/redis, free local port
    embedding-store     --store-shards shards (streamrec-embedding-store serve)
    sampler             streamrec-sampler serve on an ipc socket
    streamrec-api       the control plane (token in RUN/api-token)
    streamrec-datagen   a planted stream under RUN/data (optionally paced: --rate)
    trainers            torchrun --nproc-per-node --trainers -m streamrec.trainer.agent

then submits the job over REST, starts it, prints one row per finished pass (AUC before and
after training against the best AUC the planted truth allows), and ends with a summary.
A child that exits is reported; the API and the trainers are restarted (their state is in
Redis and the checkpoints), the sampler too; Redis and store shards are not (their state
would be lost), so their loss ends the run. ``--keep-running`` leaves the services up after
the summary until ``streamrec down`` (or Ctrl-C).

    streamrec up --days 2 --split-interval 120 --samples-per-split 10000   # the defaults
    streamrec down
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import redis
from streamrec.api.client import ApiClient
from streamrec.errors import RemoteError, ServiceUnavailable, StreamRecError
from streamrec.layout import format_day, parse_day

STATE_FILE = "stack.json"
#: Table options of the demo (written to the shards' tables file and given to the trainers,
#: so both sides agree): plain tables trained from the start with AdaGrad.
TABLE_PARAMETERS: dict[str, Any] = {
    "embedx_threshold": 0,
    "initializer": {"type": "uniform", "low": -0.05, "high": 0.05},
    "embed_sgd_param": {
        "name": "SparseAdaGradSGDRule",
        "learning_rate": 0.05,
        "initial_g2sum": 3.0,
    },
    "embedx_sgd_param": {
        "name": "SparseAdaGradSGDRule",
        "learning_rate": 0.05,
        "initial_g2sum": 3.0,
    },
}
FINAL_STATES = ("succeeded", "failed", "stopped")


class StackError(StreamRecError):
    """The stack could not be brought up or lost a part it cannot restart."""

    code = "stack"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bin_path(name: str) -> str:
    """A console script of this environment (beside the running Python), else from PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} not found beside {sys.executable} nor on PATH")
    return found


@dataclass
class Child:
    """A child process of the stack, in its own session, logging to ``log``."""

    name: str
    args: list[str]
    log: Path
    restartable: bool
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the child's process group, then SIGKILL to it and its descendants
        (torchrun puts each rank in a session of its own)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        below = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        for pid in below:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Stack:
    """Brings the stack up in ``args.run_dir``, drives the demo job, tears it all down."""

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
        self.store_endpoints = [
            f"tcp://127.0.0.1:{(args.store_port + k) if args.store_port else free_port()}"
            for k in range(args.store_shards)
        ]
        self.sampler_endpoint = f"ipc://{self.run / 'sampler.sock'}"
        self.token = ""
        self.api: ApiClient | None = None
        self.job_id: str | None = None
        self._stopping = False

    # ---- output ------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # ---- state file --------------------------------------------------------------------
    def write_state(self) -> None:
        state = {
            "supervisor_pid": os.getpid(),
            "redis_url": self.redis_url,
            "api_url": self.api_url,
            "token_file": str(self.run / "api-token"),
            "job_id": self.job_id,
            "children": {
                n: {"pid": c.pid, "cmd": Path(c.args[0]).name}
                for n, c in self.children.items()
                if c.pid
            },
        }
        tmp = self.run / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.run / STATE_FILE)

    # ---- bring-up ----------------------------------------------------------------------
    def prepare(self) -> None:
        existing = read_state(self.run)
        if existing and pid_alive(existing.get("supervisor_pid")):
            raise StackError(
                f"a stack already runs in {self.run} (pid "
                f"{existing['supervisor_pid']}): `streamrec down --run-dir "
                f"{self.run}` first"
            )
        for sub in ("data", "models", "redis", "logs", "store"):
            shutil.rmtree(self.run / sub, ignore_errors=True)
        for sub in ("data", "models", "redis", "logs", "store"):
            (self.run / sub).mkdir(parents=True)
        (self.run / "sampler.sock").unlink(missing_ok=True)
        self.token = secrets.token_urlsafe(24)
        token_file = self.run / "api-token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        tables = [
            {"name": f"slot_{i}", "dim": self.args.embedding_dim, **TABLE_PARAMETERS}
            for i in range(self.args.slots)
        ]
        (self.run / "tables.json").write_text(json.dumps({"tables": tables}, indent=1))

    def add(
        self, name: str, args: list[str], restartable: bool, env: dict[str, str] | None = None
    ) -> Child:
        child = Child(name, args, self.logs / f"{name}.log", restartable, env or {})
        child.start()
        self.children[name] = child
        self.write_state()
        return child

    def wait_until(self, what: str, ready: Any, child: Child, timeout_s: float = 60) -> None:
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
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        child = self.add(
            "redis",
            [
                server,
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.run / "redis"),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
            ],
            restartable=False,
        )
        client = redis.Redis.from_url(self.redis_url, socket_timeout=1, socket_connect_timeout=1)
        self.wait_until("redis-server", client.ping, child, 30)
        client.close()
        self.say(f"  redis            {self.redis_url}  (appendonly, {self.run / 'redis'})")

    def start_store(self) -> None:
        n = len(self.store_endpoints)
        for k, endpoint in enumerate(self.store_endpoints):
            self.add(
                f"store-{k}",
                [
                    bin_path("streamrec-embedding-store"),
                    "serve",
                    "--shard-id",
                    str(k),
                    "--num-shards",
                    str(n),
                    "--endpoint",
                    endpoint,
                    "--tables",
                    str(self.run / "tables.json"),
                    "--workers",
                    "2",
                    "--num-threads",
                    "1",
                ],
                restartable=False,
                env={"OMP_NUM_THREADS": "1"},
            )
        for k in range(n):
            child = self.children[f"store-{k}"]
            self.wait_until(f"store shard {k}", lambda c=child: "READY" in c.tail(50), child, 60)
        self.say(f"  embedding-store  {n} shard(s): {', '.join(self.store_endpoints)}")

    def start_sampler(self) -> None:
        from streamrec.wire import RpcClient

        child = self.add(
            "sampler",
            [
                bin_path("streamrec-sampler"),
                "serve",
                "--endpoint",
                self.sampler_endpoint,
                "--workers",
                "1",
            ],
            restartable=True,
        )

        def ping() -> bool:
            with RpcClient(self.sampler_endpoint, timeout_s=1.0) as c:
                c.call("ping")
            return True

        self.wait_until("sampler", ping, child, 60)
        self.say(f"  sampler          {self.sampler_endpoint}")

    def start_api(self) -> None:
        child = self.add(
            "api",
            [
                bin_path("streamrec-api"),
                "serve",
                "--port",
                str(self.api_port),
                "--redis-url",
                self.redis_url,
                "--token-file",
                str(self.run / "api-token"),
                "--data-root",
                str(self.run / "data"),
                "--model-root",
                str(self.run / "models"),
                "--log-level",
                "warning",
            ],
            restartable=True,
        )
        self.api = ApiClient(self.api_url, self.token)
        self.wait_until("api", self.api.ready, child, 60)
        self.say(f"  api              {self.api_url}/docs  (token in {self.run / 'api-token'})")

    def start_datagen(self) -> None:
        a = self.args
        self.add(
            "datagen",
            [
                bin_path("streamrec-datagen"),
                "--out",
                str(self.run / "data"),
                "--start-day",
                a.start_day,
                "--days",
                str(a.days),
                "--split-interval",
                str(a.split_interval),
                "--samples-per-split",
                str(a.samples_per_split),
                "--slots",
                str(a.slots),
                "--files-per-split",
                str(a.trainers),
                "--rate",
                str(a.rate),
                "--seed",
                str(a.seed),
            ],
            restartable=False,
        )
        self.say(
            f"  datagen          {a.days} day(s) x {1440 // a.split_interval} splits x "
            f"{a.samples_per_split} samples -> {self.run / 'data'}"
            + (f" at {a.rate} splits/s" if a.rate else "")
        )

    def job_spec(self) -> dict[str, Any]:
        a = self.args
        end_day = format_day(parse_day(a.start_day) + dt.timedelta(days=a.days - 1))
        return {
            "name": "demo",
            "data": {
                "data_root": str(self.run / "data"),
                "start_day": a.start_day,
                "end_day": end_day,
                "split_interval": a.split_interval,
                "split_per_pass": a.split_per_pass,
                "data_donefile": "to.hadoop.done",
                "data_sleep_second": 0.2,
                "format": "streamrec",
            },
            "checkpoint": {
                "model_save_path": str(self.run / "models"),
                "checkpoint_per_pass": 1,
                "save_delta_frequency": 0,
                "save_base_at_day_end": True,
            },
            "model": {
                "runner": {"train_batch_size": a.batch_size},
                "hyper_parameters": {
                    "sparse_inputs_slots": a.slots,
                    "arch_sparse_feature_size": a.embedding_dim,
                    "arch_mlp_bot": f"13-32-{a.embedding_dim}",
                    "arch_mlp_top": "32-1",
                    "optimizer": "adagrad",
                    "learning_rate": 0.05,
                },
                "store": {"timeout_s": 120},
                "distributed": {"backend": "gloo", "timeout_s": 300},
            },
            "sampler": {"endpoint": self.sampler_endpoint, "neg_num": 0},
            "store": {
                "endpoints": self.store_endpoints,
                "tier": "host",
                "table_parameters": TABLE_PARAMETERS,
            },
            "resources": {"trainer_ranks": a.trainers, "device": "cpu"},
        }

    def submit(self) -> None:
        assert self.api is not None
        job = self.api.create_job(self.job_spec())
        self.job_id = job["id"]
        self.api.action(job["id"], "start")
        self.write_state()
        self.say(
            f"  job              {job['id']} ({job['passes_total']} passes) started: "
            f"POST {self.api_url}/v1/jobs/{job['id']}/start"
        )

    def trainer_args(self) -> list[str]:
        assert self.job_id is not None
        return [
            bin_path("torchrun"),
            "--nproc-per-node",
            str(self.args.trainers),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "streamrec.trainer.agent",
            "--redis-url",
            self.redis_url,
            "--job-id",
            self.job_id,
            "--heartbeat-ttl-s",
            "10",
            "--poll-ms",
            "300",
            "--log-level",
            "WARNING",
        ]

    def start_trainers(self) -> None:
        self.add("trainers", self.trainer_args(), restartable=True, env={"OMP_NUM_THREADS": "1"})
        self.say(f"  trainers         {self.args.trainers} rank(s) (torchrun, gloo)")

    def up(self) -> int:
        a = self.args
        self.say(f"streamrec up: run directory {self.run}")
        self.prepare()
        self.start_redis()
        self.start_store()
        self.start_sampler()
        self.start_api()
        self.start_datagen()
        self.submit()
        self.start_trainers()
        rc = self.follow(a.timeout_s)
        self.summary()
        if a.keep_running and not self._stopping:
            self.say(f"services stay up (--keep-running): `streamrec down --run-dir {self.run}`")
            while not self._stopping:
                time.sleep(0.5)
        return rc

    # ---- supervision -------------------------------------------------------------------
    def check_children(self) -> None:
        """Reports children that exited; restarts the ones that are safe to restart."""
        for name, child in list(self.children.items()):
            rc = child.exited()
            if rc is None or child.done:
                continue
            if rc == 0 and name in ("datagen", "trainers"):
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
            if name == "trainers":
                child.args = self.trainer_args()  # a fresh rendezvous port
            child.start()
            self.write_state()
            self.say(f"  restarted {name} (restart {child.restarts})")

    def follow(self, timeout_s: float) -> int:
        """Prints a row per finished pass until the job ends; 0 when it succeeded."""
        assert self.api is not None and self.job_id is not None
        self.say("")
        self.say(PASS_HEADER)
        shown: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while not self._stopping:
            self.check_children()
            try:
                job = self.api.job(self.job_id)
                passes = self.api.passes(self.job_id)
            except (ServiceUnavailable, RemoteError) as exc:
                if str(exc) != last_error:
                    self.say(f"  (api: {exc})")
                    last_error = str(exc)
                time.sleep(1)
                continue
            for p in passes:
                key = (p["day"], p["pass_id"])
                if p["state"] == "done" and key not in shown:
                    shown.add(key)
                    self.say(pass_row(p) + f"   [{job['passes_done']}/{job['passes_total']}]")
            if job["state"] in FINAL_STATES:
                self.say(
                    f"job {self.job_id} {job['state']}"
                    + (f": {job['error']}" if job.get("error") else "")
                )
                return 0 if job["state"] == "succeeded" else 1
            if time.monotonic() > deadline:
                self.say(
                    f"! timeout: job still {job['state']} after {timeout_s:.0f}s "
                    f"({job['passes_done']}/{job['passes_total']} passes)"
                )
                return 3
            time.sleep(0.5)
        return 130

    def summary(self) -> None:
        if self.api is None or self.job_id is None:
            return
        try:
            passes = [p for p in self.api.passes(self.job_id) if p["state"] == "done"]
        except (ServiceUnavailable, RemoteError) as exc:
            self.say(f"no summary: {exc}")
            return
        self.say("")
        self.say("summary: AUC per pass against the best AUC the planted truth allows")
        self.say(SUMMARY_HEADER)
        for p in passes:
            self.say(summary_row(p))
        pred = [p["predict_auc"] for p in passes if p.get("predict_auc") is not None]
        best = [p["best_auc"] for p in passes if p.get("best_auc") is not None]
        if pred and best:
            mp, mb = sum(pred) / len(pred), sum(best) / len(best)
            self.say(
                f"mean predict AUC {mp:.4f} vs best {mb:.4f}: {mp / mb:.3f} of the best "
                f"possible over {len(pred)} passes"
            )
        if len(pred) >= 2:
            self.say(f"first pass predict AUC {pred[0]:.4f} -> last {pred[-1]:.4f}")
        self.say(f"models under {self.run / 'models'}, logs under {self.logs}")

    # ---- tear-down ---------------------------------------------------------------------
    def down(self) -> None:
        """Stops the children, the trainers first and Redis last."""
        order = [
            "trainers",
            "datagen",
            "api",
            "sampler",
            *[n for n in self.children if n.startswith("store-")],
            "redis",
        ]
        for name in order:
            child = self.children.get(name)
            if child is not None:
                child.stop()
        if self.api is not None:
            self.api.close()
        with contextlib.suppress(OSError):
            (self.run / STATE_FILE).unlink()

    def request_stop(self, signum: int, _frame: Any) -> None:
        self._stopping = True


PASS_HEADER = (
    f"{'day':>8} {'pass':>4} {'samples':>8} {'predictAUC':>10} {'trainAUC':>9} "
    f"{'bestAUC':>8} {'logloss':>8} {'seconds':>7}"
)
SUMMARY_HEADER = (
    f"{'day':>8} {'pass':>4} {'predictAUC':>10} {'trainAUC':>9} {'bestAUC':>8} {'pred/best':>9}"
)


def _f(v: Any, width: int, digits: int = 4) -> str:
    return f"{v:>{width}.{digits}f}" if isinstance(v, int | float) else f"{'-':>{width}}"


def pass_row(p: dict[str, Any]) -> str:
    return (
        f"{p['day']:>8} {p['pass_id']:>4} {p.get('samples') or 0:>8} "
        f"{_f(p.get('predict_auc'), 10)} {_f(p.get('train_auc'), 9)} "
        f"{_f(p.get('best_auc'), 8)} {_f(p.get('logloss'), 8)} "
        f"{_f(p.get('seconds'), 7, 1)}"
    )


def summary_row(p: dict[str, Any]) -> str:
    ratio = None
    if p.get("predict_auc") is not None and p.get("best_auc"):
        ratio = p["predict_auc"] / p["best_auc"]
    return (
        f"{p['day']:>8} {p['pass_id']:>4} {_f(p.get('predict_auc'), 10)} "
        f"{_f(p.get('train_auc'), 9)} {_f(p.get('best_auc'), 8)} {_f(ratio, 9, 3)}"
    )


def read_state(run: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: Any) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def stack_down(run: Path, out: TextIO = sys.stdout, timeout_s: float = 60) -> int:
    """Stops the stack recorded in ``run``: its supervisor first, then any child it left."""
    state = read_state(run)
    if state is None:
        print(f"no stack recorded in {run}", file=out)
        return 0
    sup = state.get("supervisor_pid")
    if pid_alive(sup) and "streamrec" in _cmdline(sup):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
    for name, info in (state.get("children") or {}).items():
        pid = info.get("pid")
        # only a process that is still the one recorded (its command matches), never a reused pid
        if pid_alive(pid) and info.get("cmd", "\0") in _cmdline(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            print(f"stopped {name} (pid {pid})", file=out)
    with contextlib.suppress(OSError):
        (run / STATE_FILE).unlink()
    print(f"stack in {run} is down", file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrec", description="StreamRec on one machine")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the stack, run the demo job, print the summary")
    up.add_argument("--run-dir", default=".run/streamrec", help="state, data, models, logs")
    up.add_argument("--redis-port", type=int, default=0, help="0: a free port")
    up.add_argument("--api-port", type=int, default=0, help="0: a free port")
    up.add_argument(
        "--store-port",
        type=int,
        default=0,
        help="first store shard port (shard k: +k); 0: free ports",
    )
    up.add_argument("--store-shards", type=int, default=2)
    up.add_argument("--trainers", type=int, default=2, help="trainer ranks (torchrun)")
    up.add_argument("--start-day", default="20190720")
    up.add_argument("--days", type=int, default=2)
    up.add_argument("--split-interval", type=int, default=120, help="minutes per split")
    up.add_argument("--split-per-pass", type=int, default=1)
    up.add_argument("--samples-per-split", type=int, default=10000)
    up.add_argument("--slots", type=int, default=8, help="sparse features (tables)")
    up.add_argument("--embedding-dim", type=int, default=8)
    up.add_argument("--batch-size", type=int, default=256)
    up.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="splits landing per second (0: as fast as they are generated)",
    )
    up.add_argument("--seed", type=int, default=7)
    up.add_argument("--timeout-s", type=float, default=600, help="give up after this long")
    up.add_argument("--max-restarts", type=int, default=2, help="per restartable child")
    up.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the services up after the summary, until `streamrec down`",
    )
    down = sub.add_parser("down", help="stop a stack started by `streamrec up`")
    down.add_argument("--run-dir", default=".run/streamrec")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Refuses bad sizes with the flag and the value."""
    for flag in (
        "store_shards",
        "trainers",
        "days",
        "split_per_pass",
        "samples_per_split",
        "slots",
        "embedding_dim",
        "batch_size",
    ):
        v = getattr(args, flag)
        if v < 1:
            raise StackError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
    for flag in ("redis_port", "api_port", "store_port"):
        v = getattr(args, flag)
        if not 0 <= v <= 65535:
            raise StackError(f"--{flag.replace('_', '-')} must be a port (0: free), got {v}")
    try:
        parse_day(args.start_day)
    except ValueError as exc:
        raise StackError(f"--start-day: {exc}") from None
    if not (0 < args.split_interval <= 1440 and 1440 % args.split_interval == 0):
        raise StackError(f"--split-interval must divide 1440, got {args.split_interval}")
    if args.rate < 0 or args.timeout_s <= 0:
        raise StackError(
            f"--rate must be >= 0 and --timeout-s > 0, got {args.rate}, {args.timeout_s}"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "down":
        return stack_down(Path(args.run_dir).resolve())
    try:
        check_args(args)
    except StackError as exc:
        print(f"streamrec up: {exc}", file=sys.stderr)
        return 2
    stack = Stack(args)
    signal.signal(signal.SIGTERM, stack.request_stop)
    signal.signal(signal.SIGINT, stack.request_stop)
    try:
        return stack.up()
    except StreamRecError as exc:
        print(f"streamrec up: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.say("stopping the stack ...")
        stack.down()
