"""``streamrec up --resume``: the stack again on an earlier run's directory, its demo job going
on from its last checkpoint on as many store shards as ``--store-shards`` says now.

What stays from the earlier run (ended by ``streamrec down``, by the job stopped over REST, or
by a launcher that was killed): ``RUN/data`` (the planted stream), ``RUN/models`` (the
checkpoints, ``passes.jsonl``), ``RUN/redis`` (Redis's append-only file: the job, its passes,
events and lineage), the logs, and ``RUN/run.json`` (the job's id, the shards it ran on, the
flags the job and its data were made of: ``job.JOB_FLAGS``, which ``--resume`` takes from
there), and the serving Redis's append-only file: it runs again on its port (the API wrote
its URL into the job). What is new: the tokens and the Redises' passwords (new every run),
the other ports, and the store shards: they come up empty (``RUN/store`` of the ssd tier is
emptied, its rows were the old count's).

The shards are at stable addresses (``commands.store_endpoints``: shard k's depends on k
only), so the job, which lists the M shards it was created with, and the trainers, which
trust the N of this run, agree on the first min(M, N): the agent goes on with the N
(``streamrec.trainer.agent.job_guard.JobGuard.shards_now``) and its warm start loads the
job's last checkpoint resharded M -> N (``streamrec.embedding_store.persistence.reshard``). A
stopped or failed job is started again over REST; a job the earlier stack left running goes
to a group of the pool, as after a group's death; datagen runs again only when splits are
missing (it writes the same bytes: the same seed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from streamrec.errors import RemoteError, ServiceUnavailable
from streamrec.launcher.errors import StackError
from streamrec.launcher.job import JOB_FLAGS, read_run, write_run
from streamrec.launcher.serving import ServingRedis
from streamrec.launcher.stack import Stack
from streamrec.layout import format_day, parse_day, split_names


def job_flags(args: argparse.Namespace, record: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Sets ``args``' :data:`~streamrec.launcher.job.JOB_FLAGS` to the run's; refuses one
    given on the command line (not its default) that differs: the job in Redis keeps its
    spec."""
    for flag, value in record["flags"].items():
        if flag not in JOB_FLAGS:
            continue
        given = getattr(args, flag)
        if given != value and given != defaults.get(flag):
            raise StackError(
                f"--{flag.replace('_', '-')} {given}: the run in {args.run_dir} was made with "
                f"{value}, and --resume goes on with its job as it is (leave the flag out)"
            )
        setattr(args, flag, value)


def missing_splits(args: argparse.Namespace, data: Path) -> int:
    """How many splits of the run's days have no donefile under ``data`` yet."""
    first = parse_day(args.start_day)
    days = [format_day(first + dt.timedelta(days=d)) for d in range(args.days)]
    return sum(
        not (data / day / split / "to.hadoop.done").exists()
        for day in days
        for split in split_names(args.split_interval)
    )


class ResumedStack(Stack):
    """A :class:`~streamrec.launcher.stack.Stack` on an earlier run's directory (see the
    module docstring): the run's data, models and Redis kept, its job followed again.

    Raises:
        StackError: naming ``--resume`` when the directory holds no earlier run, naming
            ``--store-port`` when the shards' addresses are not the run's, and naming a job
            flag given with another value than the run's.
    """

    #: the run's data, models, Redises and logs stay; the shards' ssd rows were the old count's
    WIPED = ("store", "prometheus")

    def __init__(
        self, args: argparse.Namespace, defaults: dict[str, Any], out: TextIO = sys.stdout
    ) -> None:
        run = Path(args.run_dir).resolve()
        record = read_run(run)
        if record is None:
            raise StackError(
                f"--resume: no earlier run in {run} (no readable {run / 'run.json'}): start "
                f"one with `streamrec up --run-dir {args.run_dir}` first"
            )
        job_flags(args, record, defaults)
        super().__init__(args, out)
        self.resumed = record
        before = list(record["store_endpoints"])
        common = min(len(before), len(self.store_endpoints))
        if before[:common] != self.store_endpoints[:common]:
            raise StackError(
                f"--store-port: the run's store shards were at {before}, these would be at "
                f"{self.store_endpoints}: give the run's --store-port (none: ipc sockets)"
            )
        self.serving = self.runs_serving(record)

    def runs_serving(self, record: dict[str, Any]) -> ServingRedis:
        """The serving Redis the run's job publishes to (the API wrote it into the job, and
        the trainers refuse any other): the stack's own again on its port, or the
        ``--online-redis-url`` given again."""
        url, port = record.get("online_redis_url"), record.get("serving_port")
        given = self.args.online_redis_url
        if given is None and port is not None:
            own = str(url or f"redis://127.0.0.1:{port}/0")
            return ServingRedis(own, self.run / "serving-redis-password", int(port))
        if given != url:
            raise StackError(
                f"--online-redis-url {given}: the run's job publishes to {url}"
                + (" (the stack's own: leave the flag out)" if port else ": give it again")
            )
        return self.serving

    @property
    def shards_before(self) -> int:
        return len(self.resumed["store_endpoints"])

    def prepare(self) -> None:
        super().prepare()
        # prepare drops the record of a fresh run's predecessor: this run goes on with it
        before = self.resumed
        write_run(self.run, self.args, before["job_id"], before["store_endpoints"], self.serving)

    def start_datagen(self) -> None:
        missing = missing_splits(self.args, self.run / "data")
        if missing:
            super().start_datagen()  # the same seed: the splits there are written alike
        else:
            self.say(f"  datagen          every split of the run is in {self.run / 'data'}")

    def submit(self) -> None:
        """Follows the run's job again: started over REST when it stopped or failed."""
        assert self.api is not None
        job_id = self.resumed["job_id"]
        try:
            job = self.api.job(job_id)
        except RemoteError as exc:
            if exc.code != "404":
                raise
            raise StackError(
                f"--resume: the run's job {job_id} is not in the run's Redis (deleted?)"
            ) from None
        deadline = time.monotonic() + 60
        while job["state"] == "stopping" and time.monotonic() < deadline:
            time.sleep(0.5)  # its trainers are gone: the API ends the stop
            job = self.api.job(job_id)
        was = job["state"]
        if was in ("created", "stopped", "failed"):
            self.api.action(job_id, "start")
        self.job_id = job_id
        self.record()
        write_run(self.run, self.args, job_id, self.store_endpoints, self.serving)
        m, n = self.shards_before, len(self.store_endpoints)
        self.say(
            f"  job              {job_id} ({job['passes_done']}/{job['passes_total']} passes, "
            f"{was}) goes on from checkpoint {job.get('last_checkpoint') or '-'} on {n} "
            f"shard(s): " + (f"resharded {m} -> {n}" if m != n else "as it was saved")
        )

    def summary(self) -> None:
        super().summary()
        if self.api is None or self.job_id is None:
            return
        try:
            events = self.api.events(self.job_id, limit=1000)["data"]
        except (ServiceUnavailable, RemoteError) as exc:
            self.say(f"no reshard events: {exc}")
            return
        for e in events:
            if e.get("type") == "trainer" and (e.get("data") or {}).get("resharded"):
                self.say(f"resharded {e['data']['resharded']}: {e['message']}")
