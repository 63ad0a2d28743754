"""Chaos on a real `streamrec up --keep-running` stack: kill -9 or freeze (SIGSTOP, then
SIGCONT seconds later) of every kind of service at seeded random moments while a job runs
over REST, alone or two faults within a second, then the verdict of :mod:`chaos_checks`.

Shared by ``tests/e2e/test_chaos.py`` (bounded, a kill of each kind),
``tests/e2e/test_chaos_freeze.py`` (a freeze of each kind and a double fault; both through
:func:`run_and_judge`) and ``tools/chaos.py`` (as long as asked). The stack's demo job is
stopped and deleted at once (its model path, ``RUN/models``, would hold every other job's);
the chaos job is the demo's spec with its own model path and ``checkpoint_per_pass``; the
no-fault job, the same spec again, runs after it on the same data (same seed) for the steps
each pass adds and the AUC.

Kinds and what a fault of each takes down (pids from ``RUN/stack.json``)::

    trainer-rank    one rank of the job's torchrun group (torchrun restarts the group)
    trainer-group   the torchrun process and all its ranks (the launcher restarts it)
    store           one store shard (the launcher stops the groups, restarts the shard
                    empty, starts the groups: the job goes back to its last checkpoint)
    redis, api, sampler   that process (restarted at the same address)

A freeze stops the same processes with SIGSTOP and continues them after its thaw delay (a
timer; the run's end continues any still frozen): no socket closes and no process exits, the
peers must notice the silence by their heartbeats and timeouts, and the thawed process must
not write into what the rest did meanwhile.

Moments: a random delay in the interval after the previous fault (or its recovery), then for
a share of the faults the instant the next ``pass_done`` report of a pass no checkpoint holds
lands on the job's report stream in Redis (the window where a group that dies has trained
passes the last checkpoint lacks). A double fault is a second fault of another kind within a
second of the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from chaos_checks import agreement, kept_records, mean_predict_auc, read_records, same_model
from servers import wait_for
from stack_helpers import STREAMREC, Output, child_pids, start_stack, stderr_log, trainer_rank
from streamrec.control import keys, redis_io
from streamrec.process import descendants, pid_alive, stop_process

#: Every kind of service a chaos run faults.
KINDS = ("trainer-rank", "trainer-group", "store", "redis", "api", "sampler")
TRAINER_KINDS = ("trainer-rank", "trainer-group")
TERMINAL = ("succeeded", "failed", "stopped")


#: How a fault takes its victims down.
HOWS = ("kill", "freeze")


@dataclass
class Fault:
    """One fault: what, which pids, how (kill -9, or a freeze thawed ``thaw_s`` later), when
    (wall clock) and at which moment."""

    kind: str
    victim: str
    pids: list[int]
    at: float
    moment: str
    how: str = "kill"
    thaw_s: float = 0.0

    def describe(self) -> str:
        what = "kill -9" if self.how == "kill" else f"freeze {self.thaw_s:.0f}s"
        return f"{what} {self.victim} (pids {self.pids}) after {self.moment}"


class Stack:
    """A `streamrec up --keep-running` in ``run`` and a REST client that rides out the API's
    and Redis's deaths (a read is retried until its deadline)."""

    def __init__(self, run: Path, proc: subprocess.Popen, out: Output) -> None:
        self.run = run
        self.proc = proc
        self.out = out
        self.state = json.loads((run / "stack.json").read_text())
        self.shards = len(self.state["store_endpoints"])
        self.ranks = 2  # the demo job's (drop_demo reads it)
        token = (run / "api-token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.state["api_url"],
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    @classmethod
    def up(
        cls, run: Path, *flags: str, split_interval: int, samples: int, rate: float = 0
    ) -> Stack:
        """Starts the stack (one trainer group; ``rate`` splits land a second, 0: all at
        once) and waits for its demo job to be submitted."""
        proc = start_stack(
            run,
            "--keep-running",
            "--samples-per-split",
            str(samples),
            "--trainer-groups",
            "1",
            *flags,
            split_interval=split_interval,
            rate=rate,
        )
        out = Output(proc, stderr_log(run))
        try:
            out.wait_for("  job  ", timeout=180)  # stack.json names it from then on
            return cls(run, proc, out)
        except BaseException:
            stop_process(proc, timeout_s=60)
            raise

    def down(self) -> None:
        self.http.close()
        subprocess.run(
            [STREAMREC, "down", "--run-dir", str(self.run)], capture_output=True, timeout=120
        )
        stop_process(self.proc, timeout_s=60)

    def detail(self) -> str:
        logs = self.run / "logs"
        tail = [
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted(logs.glob("trainers-*.log"))
        ]
        return "output:\n" + "\n".join(self.out.lines[-40:]) + "\n" + "\n".join(tail)

    # ---- REST --------------------------------------------------------------------------
    def call(self, method: str, path: str, timeout: float = 90, **kw: Any) -> Any:
        """``/v1/jobs{path}``; a refused connection or a 5xx is retried until ``timeout``."""

        def once() -> Any:
            try:
                resp = self.http.request(method, f"/v1/jobs{path}", **kw)
            except httpx.TransportError:
                return None
            if resp.status_code >= 500:
                return None
            assert resp.status_code < 400, (method, path, resp.status_code, resp.text)
            return [resp.json() if resp.content else None]

        return wait_for(once, timeout, 0.2, what=f"{method} {path}", detail=self.detail)[0]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"/{job_id}")

    def passes(self, job_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.call("GET", f"/{job_id}/passes", params={"offset": len(out), "limit": 1000})
            out += page["data"]
            if not page["data"] or len(out) >= page["count"]:
                return out

    def events(self, job_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"after": after} if after else {})}
            page = self.call("GET", f"/{job_id}/events", params=params)
            out += page["data"]
            after = page["next"]
            if after is None:
                return out

    def wait_state(self, job_id: str, timeout: float, *states: str) -> dict[str, Any]:
        return wait_for(
            lambda: (j := self.job(job_id))["state"] in (states or TERMINAL) and j,
            timeout,
            0.5,
            what=f"job {job_id} in {states or TERMINAL}",
            detail=self.detail,
        )

    def drop_demo(self) -> dict[str, Any]:
        """Stops and deletes the demo job `streamrec up` submitted; returns its spec."""
        demo = self.state["job_id"]
        spec = self.job(demo)["spec"]
        self.ranks = int(spec["resources"]["trainer_ranks"])
        self.call("POST", f"/{demo}/stop")
        self.wait_state(demo, 120)
        # the launcher follows the job until it sees it end: only then may it be gone
        self.out.wait_for("services stay up", timeout=120)
        self.call("DELETE", f"/{demo}")
        return spec

    def submit(
        self,
        template: dict[str, Any],
        name: str,
        checkpoint_per_pass: int,
        checkpoint: dict[str, Any] | None = None,
        **data: Any,
    ) -> str:
        """Creates and starts ``template`` as ``name``, its model under ``RUN/models/name``
        (``data``: fields of its ``data`` section replaced, e.g. ``end_split``;
        ``checkpoint``: of its ``checkpoint`` section, e.g. ``save_delta_frequency``)."""
        spec = json.loads(json.dumps(template))
        spec["name"] = name
        spec["data"].update(data)
        spec["checkpoint"].update(checkpoint or {})
        spec["checkpoint"]["model_save_path"] = f"{self.state['model_root']}/{name}"
        spec["checkpoint"]["checkpoint_per_pass"] = checkpoint_per_pass
        job_id = self.call("POST", "", json=spec)["id"]
        self.call("POST", f"/{job_id}/start")
        return job_id

    def model_path(self, job: dict[str, Any]) -> Path:
        return Path(job["spec"]["checkpoint"]["model_save_path"])

    # ---- Redis: the instant a report lands -----------------------------------------------
    def redis(self) -> redis.Redis:
        url = redis_io.with_password(self.state["redis_url"], self.state["redis_password_file"])
        return redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=2, socket_connect_timeout=1
        )


def next_pass_done(
    r: redis.Redis, job_id: str, wanted: Callable[[int], bool], until: Callable[[], bool]
) -> str | None:
    """Blocks until a ``pass_done`` report of a pass with ``wanted(pass_id)`` lands on the
    job's report stream (read without a consumer group: the API's reading is untouched);
    returns its ``day/pass_id``, or None once ``until()`` (Redis down: retried)."""
    stream, last = keys.reports(job_id), "$"
    while not until():
        try:
            reply = r.xread({stream: last}, count=100, block=500)
        except redis.RedisError:
            time.sleep(0.2)  # Redis restarting (its append-only file keeps the ids)
            continue
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                if fields.get("type") != "pass_done":
                    continue
                data = json.loads(fields.get("data") or "{}")
                if wanted(int(data.get("pass_id", 0))):
                    return keys.pass_key(str(data["day"]), int(data["pass_id"]))
    return None


# ---- kills --------------------------------------------------------------------------------
def victims(stack: Stack, kind: str, index: int) -> tuple[str, list[int]] | None:
    """The processes a fault of ``kind`` takes down now (None: not up, e.g. restarting);
    ``index`` picks the rank or the shard."""
    try:
        pids = child_pids(stack.run)
    except (OSError, ValueError):  # stack.json being rewritten
        return None
    group = stack.state["trainer_groups"][0]
    if kind == "trainer-rank":
        if not pid_alive(pids.get(group)):
            return None
        try:
            return f"{group} rank {index}", [trainer_rank(pids[group], index)]
        except AssertionError:  # torchrun between two attempts
            return None
    if kind == "trainer-group":
        pid = pids.get(group)
        below = descendants(pid) if pid_alive(pid) else []
        return (f"{group} (torchrun + {len(below)})", [pid, *below]) if below else None
    name = f"store-{index}" if kind == "store" else kind
    pid = pids.get(name)
    return (name, [pid]) if pid_alive(pid) else None


class Thaws:
    """The freezes' pending SIGCONTs (timers); :meth:`all_now` continues what is still frozen."""

    def __init__(self) -> None:
        self._timers: list[tuple[threading.Timer, list[int]]] = []

    def later(self, pids: list[int], after_s: float) -> None:
        timer = threading.Timer(after_s, _signal_all, (pids, signal.SIGCONT))
        timer.daemon = True
        timer.start()
        self._timers.append((timer, pids))

    def all_now(self) -> None:
        for timer, pids in self._timers:
            timer.cancel()
            _signal_all(pids, signal.SIGCONT)
        self._timers.clear()


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:  # torchrun first: it must not act on the ranks it sees stop or die
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def inject(stack: Stack, shot: Shot, rng: random.Random, moment: str, thaws: Thaws) -> Fault:
    """The fault of ``shot`` (waiting, at most a minute, for a victim to be up)."""
    index = rng.randrange(stack.ranks if shot.kind == "trainer-rank" else stack.shards)
    found = wait_for(
        lambda: victims(stack, shot.kind, index), 60, 0.1, what=f"a {shot.kind} to fault"
    )
    name, pids = found
    at = time.time()
    if shot.how == "kill":
        _signal_all(pids, signal.SIGKILL)
    else:
        _signal_all(pids, signal.SIGSTOP)
        thaws.later(pids, shot.thaw_s)
    return Fault(shot.kind, name, pids, at, moment, shot.how, shot.thaw_s)


@dataclass
class Shot:
    """A planned fault: its kind, the delay before it, whether it waits for a ``pass_done``,
    how, and for a double fault the second one (its delay under a second)."""

    kind: str
    delay: float
    on_done: bool
    how: str = "kill"
    thaw_s: float = 0.0
    partner: Shot | None = None


@dataclass
class Schedule:
    """What to fault when: every kind of ``kinds`` once per way of ``first`` (shuffled), then
    ``doubles_first`` double faults, then at random.

    Args:
        seed: the random source of the kinds, victims, moments and delays.
        kinds: the kinds to fault (each of KINDS).
        interval: (min, max) seconds from the previous fault (or its recovery, with
            ``wait_recovery``) to the next.
        pass_done_share: the share of faults made, after that, at the next ``pass_done``
            report (at least one trainer kill is, when a trainer kind is in ``kinds``).
        wait_recovery: the next fault only once a pass handed out after this one is done.
        freeze_share: the share of the random faults that are freezes (the rest kills).
        freeze_s: (min, max) seconds a freeze lasts.
        double_share: the share of the random faults followed, within a second, by a second
            fault of another kind.
        first: the ways (of HOWS) every kind is faulted once, in order, before the random ones.
        doubles_first: double faults right after those.
    """

    seed: int
    kinds: tuple[str, ...] = KINDS
    interval: tuple[float, float] = (2.0, 6.0)
    pass_done_share: float = 0.4
    wait_recovery: bool = False
    freeze_share: float = 0.0
    freeze_s: tuple[float, float] = (5.0, 60.0)
    double_share: float = 0.0
    first: tuple[str, ...] = ("kill",)
    doubles_first: int = 0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds must be some of {KINDS}, got {list(self.kinds)}")
        for name, (lo, hi) in (("interval", self.interval), ("freeze_s", self.freeze_s)):
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be 0 <= min <= max, got {(lo, hi)}")
        for name in ("pass_done_share", "freeze_share", "double_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if any(how not in HOWS for how in self.first):
            raise ValueError(f"first must be ways of {HOWS}, got {list(self.first)}")
        if self.doubles_first and len(self.kinds) < 2:
            raise ValueError(f"a double fault needs two kinds, got {list(self.kinds)}")

    def _shot(self, rng: random.Random, kind: str, how: str, on_done: bool) -> Shot:
        thaw = round(rng.uniform(*self.freeze_s), 1) if how == "freeze" else 0.0
        return Shot(kind, round(rng.uniform(*self.interval), 2), on_done, how, thaw)

    def _double(self, rng: random.Random, shot: Shot) -> Shot:
        other = rng.choice([k for k in self.kinds if k != shot.kind])
        how = "freeze" if rng.random() < self.freeze_share else "kill"
        partner = self._shot(rng, other, how, False)
        partner.delay = round(rng.uniform(0.0, 1.0), 2)
        shot.partner = partner
        return shot

    def plan(self, rng: random.Random) -> Iterator[Shot]:
        """The shots, for ever."""
        first: list[tuple[str, str]] = []
        for how in self.first:
            round_ = list(self.kinds)
            rng.shuffle(round_)
            first += [(kind, how) for kind in round_]
        trainers = [i for i, (k, h) in enumerate(first) if k in TRAINER_KINDS and h == "kill"]
        forced = rng.choice(trainers) if trainers else None
        n = 0
        while True:
            on_done = n == forced or rng.random() < self.pass_done_share
            if n < len(first):
                yield self._shot(rng, *first[n], on_done)
            else:
                kind = rng.choice(self.kinds)
                how = "freeze" if rng.random() < self.freeze_share else "kill"
                shot = self._shot(rng, kind, how, on_done)
                doubles = n < len(first) + self.doubles_first
                if doubles or rng.random() < self.double_share:
                    shot = self._double(rng, shot)
                yield shot
            n += 1


def done_after(stack: Stack, job_id: str, t: float) -> float | None:
    """When the first pass handed out after ``t`` finished (None: none yet)."""
    ends = [
        p["finished_at"]
        for p in stack.passes(job_id)
        if p["state"] == "done" and (p.get("queued_at") or 0) > t
    ]
    return min(ends) if ends else None


def run_chaos(
    stack: Stack,
    job_id: str,
    schedule: Schedule,
    seconds: float,
    min_faults: int = 0,
    say: Callable[[str], None] = print,
) -> list[Fault]:
    """Faults by ``schedule`` while the job runs, for ``seconds`` (at least ``min_faults``
    shots are tried before that ends it); returns the faults. Nothing is left frozen."""
    rng = random.Random(schedule.seed)
    cpp = int(stack.job(job_id)["spec"]["checkpoint"].get("checkpoint_per_pass") or 1)
    r = stack.redis()
    t0 = time.time()
    faults: list[Fault] = []
    shots = 0
    thaws = Thaws()
    state = {"ended": False, "checked": 0.0}

    def ended() -> bool:
        if not state["ended"] and time.monotonic() - state["checked"] > 1:
            state["checked"] = time.monotonic()
            state["ended"] = stack.job(job_id)["state"] in TERMINAL
        return bool(state["ended"])

    def over() -> bool:
        return ended() or (shots >= min_faults and time.time() - t0 > seconds)

    def fire(shot: Shot, moment: str) -> Fault:
        f = inject(stack, shot, rng, moment, thaws)
        faults.append(f)
        say(f"  t+{f.at - t0:6.1f}s {f.describe()}")
        return f

    try:
        for shot in schedule.plan(rng):
            at = time.monotonic() + shot.delay
            wait_for(lambda at=at: time.monotonic() >= at or over(), shot.delay + 120, 0.05)
            if over():
                break
            moment = f"{shot.delay:.1f}s"
            if shot.on_done:
                # then a pass_done of a pass no checkpoint holds (pass_id % cpp != 0)
                got = next_pass_done(r, job_id, lambda pid: pid % cpp != 0, over)
                if got is None:
                    break
                moment += f", at pass_done {got}"
            f = fire(shot, moment)
            if shot.partner is not None:
                time.sleep(shot.partner.delay)
                fire(shot.partner, f"{shot.partner.delay:.2f}s after {f.kind}")
            shots += 1
            if schedule.wait_recovery:  # a pass handed out after the last thaw, done
                since = max(x.at + x.thaw_s for x in faults[-(2 if shot.partner else 1) :])
                wait_for(
                    lambda since=since: done_after(stack, job_id, since) or ended(),
                    240 + since - time.time(),
                    0.3,
                    what=f"a pass done after the {f.describe()}",
                    detail=stack.detail,
                )
    finally:
        thaws.all_now()
        r.close()
    return faults


# ---- the suite's run ---------------------------------------------------------------------
#: The suite's chaos job checkpoints every 3 passes (tests/e2e/test_chaos*.py).
SUITE_CHECKPOINT_PER_PASS = 3


def with_push_order(template: dict[str, Any], order: str) -> dict[str, Any]:
    """``template`` (a job spec) with its trainer's ``runner.sparse_push_order`` set:
    ``rank`` makes the model repeat bit for bit, faults and all."""
    spec = json.loads(json.dumps(template))
    model = spec.setdefault("model", {})
    model["runner"] = {**(model.get("runner") or {}), "sparse_push_order": order}
    return spec


def run_and_judge(
    tmp_path: Path, schedule: Schedule, min_faults: int, split_interval: int
) -> list[Fault]:
    """The suite's chaos run: the chaos job (``checkpoint_per_pass`` 3, a pass per
    ``split_interval`` minutes of a day) under ``schedule`` on a fresh stack, then the no-fault
    job over the same data and the verdict of :mod:`chaos_checks` (asserted); returns the
    faults made."""
    stack = Stack.up(
        tmp_path / "run",
        "--trainers",
        "2",
        "--store-shards",
        "2",
        "--max-restarts",
        "50",
        "--timeout-s",
        "600",
        split_interval=split_interval,
        samples=300,
    )
    try:
        template = with_push_order(stack.drop_demo(), "rank")
        job_id = stack.submit(template, "chaos", SUITE_CHECKPOINT_PER_PASS)
        wait_for(lambda: done_after(stack, job_id, 0), 90, 0.3, what="a first pass done")
        t0 = stack.job(job_id)["created_at"]
        faults = run_chaos(stack, job_id, schedule, seconds=0, min_faults=min_faults)
        job = stack.wait_state(job_id, 150)
        passes, events = stack.passes(job_id), stack.events(job_id)
        for line in summary(faults, job, events, t0):
            print(line)
        # the same data without faults: the steps each pass adds, the AUC
        base_id = stack.submit(template, "nofault", SUITE_CHECKPOINT_PER_PASS)
        base = stack.wait_state(base_id, 120)
        assert base["state"] == "succeeded", base
        baseline = kept_records(read_records(stack.model_path(base)))
        verdict = agreement(job, passes, events, stack.model_path(job), baseline)
        for line in verdict.report(every_row=True):
            print(line)
        chaos_auc, base_auc = mean_predict_auc(passes), mean_predict_auc(stack.passes(base_id))
        print(f"mean predict AUC: chaos {chaos_auc}, no faults {base_auc}")
        # in rank push order the recoveries must leave the no-fault model, bit for bit
        match = same_model(stack.model_path(job), stack.model_path(base))
        print(match.line())
        assert job["state"] == "succeeded", job
        assert verdict.ok, "\n".join(verdict.report())
        assert match.first_difference is None and match.equal == match.compared > 0, match.line()
        return faults
    finally:
        stack.down()


# ---- what the events say ------------------------------------------------------------------
def pass_events(
    events: list[dict[str, Any]],
) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """(hand-outs, dones): (ts, day/pass_id) of the job's pass events, oldest first."""
    handed, done = [], []
    for e in events:
        if e["type"] != "pass" or "pass" not in (e.get("data") or {}):
            continue
        item = (float(e["ts"]), str(e["data"]["pass"]))
        if "attempt" in e["data"] or " handed out" in e["message"]:
            handed.append(item)
        elif e["message"].endswith(" done") or " done:" in e["message"]:
            done.append(item)
    return handed, done


def recovery_s(kill_at: float, events: list[dict[str, Any]]) -> float | None:
    """A fault's start -> the end of the first pass handed out after it (a whole pass
    included)."""
    handed, done = pass_events(events)
    for ts, key in done:
        if ts <= kill_at:
            continue
        last_handout = max((h for h, k in handed if k == key and h <= ts), default=0.0)
        if last_handout > kill_at:
            return ts - kill_at
    return None


def longest_gap(events: list[dict[str, Any]], start: float) -> tuple[float, float]:
    """(seconds, start of it): the longest time from ``start`` without a pass done."""
    _, done = pass_events(events)
    times = [start, *sorted(ts for ts, _ in done if ts >= start)]
    gaps = [(b - a, a) for a, b in zip(times, times[1:], strict=False)]
    return max(gaps, default=(0.0, start))


def summary(
    faults: list[Fault],
    job: dict[str, Any],
    events: list[dict[str, Any]],
    t0: float,
) -> list[str]:
    """Faults and recoveries (from the fault's start) per kind and way, the double faults, the
    longest gap without a pass done, the rollbacks."""
    end = max((f.at for f in faults), default=t0)
    doubles = sum(1 for a, b in zip(faults, faults[1:], strict=False) if 0 <= b.at - a.at < 1.0)
    lines = [f"faults: {len(faults)} in {end - t0:.0f}s ({doubles} within a second of another)"]
    for kind in KINDS:
        for how in HOWS:
            mine = [f for f in faults if f.kind == kind and f.how == how]
            if not mine:
                continue
            rec = [recovery_s(f.at, events) for f in mine]
            got = [s for s in rec if s is not None]
            figures = (
                f"recovery min {min(got):.1f}s median {statistics.median(got):.1f}s "
                f"max {max(got):.1f}s"
                if got
                else "no recovery seen"
            )
            lost = len(rec) - len(got)
            at_done = sum("pass_done" in f.moment for f in mine)
            lines.append(
                f"  {kind:<14} {how:<6} {len(mine):>3} ({at_done} at pass_done)  {figures}"
                + (f"  ({lost} without a pass done after)" if lost else "")
            )
    gap, at = longest_gap(events, t0)
    lines.append(f"longest gap without a pass done: {gap:.1f}s (from t+{at - t0:.1f}s)")
    rolled = [e for e in events if e["type"] == "rollback"]
    lines.append(
        f"job {job['id']}: {job['state']}, {job['passes_done']}/{job['passes_total']} passes "
        f"done, restarts_total {job.get('restarts_total')}, {len(rolled)} rollback(s) of "
        f"{sum(len(e['data'].get('rolled_back') or []) for e in rolled)} pass(es)"
    )
    return lines
