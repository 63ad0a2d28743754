"""REST clients that use a job's API all through a chaos run, as dashboards and operators do:
pollers reading the job, its passes, its events and ``/metrics``, and an operator asking for
an online export every so often. They count every answer by status. A 5xx is a defect the
run reports, but for the two answers HTTP has for "down for a moment": a 503 with
``Retry-After`` (Redis down or frozen: the API says when to ask again) and ``/readyz``'s 503
(the probe saying so). A refused connection while the API is down is no answer at all.

Used by ``tools/chaos.py`` (``--pollers``, ``--export-every``)."""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

#: What a poller reads, in turn (paths under the API's root; ``{job}`` is the job's id).
POLLED = (
    "/v1/jobs/{job}",
    "/v1/jobs/{job}/passes?limit=20",
    "/v1/jobs/{job}/events?limit=20",
    "/v1/jobs/{job}/triggers?limit=20",
    "/metrics",
    "/readyz",
)


@dataclass
class Answers:
    """Every answer the clients got, by status (``unreachable``: no answer at all)."""

    by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    #: (time, request, status, body) of every 5xx but a 503 that says when to ask again
    server_errors: list[tuple[float, str, int, str]] = field(default_factory=list)
    unavailable: int = 0  # 503s with Retry-After, or /readyz's
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, path: str, resp: httpx.Response | None) -> None:
        with self.lock:
            if resp is None:
                self.by_status["unreachable"] += 1
                return
            self.by_status[str(resp.status_code)] += 1
            said_when = "retry-after" in resp.headers or path == "/readyz"
            if resp.status_code == 503 and said_when:
                self.unavailable += 1
            elif resp.status_code >= 500:
                self.server_errors.append(
                    (time.time(), f"{method} {path}", resp.status_code, resp.text[:200])
                )

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def fives(self) -> int:
        return len(self.server_errors)


class RestClients:
    """``pollers`` threads reading the job every ``poll_s`` (jittered) and, when
    ``export_every_s``, one asking for an online export that often; ``stop()`` ends them and
    ``triggers()`` reads back the outcome of every export asked for."""

    def __init__(
        self,
        api_url: str,
        token: str,
        job_id: str,
        pollers: int,
        export_every_s: float = 0.0,
        poll_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.api_url, self.job_id = api_url, job_id
        self.headers = {"Authorization": f"Bearer {token}"}
        self.answers = Answers()
        self.asked: list[str] = []  # trigger ids
        self.export_refused: collections.Counter[str] = collections.Counter()
        self.done = threading.Event()
        self.poll_s = poll_s
        self.started = time.time()
        self.threads = [
            threading.Thread(target=self._poll, args=(random.Random(seed + i),), daemon=True)
            for i in range(pollers)
        ]
        if export_every_s > 0:
            self.threads.append(
                threading.Thread(target=self._export, args=(export_every_s,), daemon=True)
            )

    def start(self) -> RestClients:
        self.started = time.time()
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(timeout=30)

    def _request(self, http: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = http.request(method, path, **kw)
        except httpx.TransportError:
            self.answers.add(method, path, None)
            raise
        self.answers.add(method, path, resp)
        return resp

    def _poll(self, rng: random.Random) -> None:
        with httpx.Client(base_url=self.api_url, headers=self.headers, timeout=30) as http:
            while not self.done.is_set():
                for path in POLLED:
                    with contextlib.suppress(httpx.TransportError):  # counted: unreachable
                        self._request(http, "GET", path.format(job=self.job_id))
                    if self.done.wait(self.poll_s * rng.uniform(0.5, 1.5)):
                        return

    def _export(self, every_s: float) -> None:
        with httpx.Client(base_url=self.api_url, headers=self.headers, timeout=30) as http:
            while not self.done.wait(every_s):
                body = {"kind": "export", "mode": "online"}
                try:
                    resp = self._request(
                        http, "POST", f"/v1/jobs/{self.job_id}/triggers", json=body
                    )
                except httpx.TransportError:
                    self.export_refused["unreachable"] += 1
                    continue
                if resp.status_code == 202:
                    self.asked.append(resp.json()["id"])
                else:
                    self.export_refused[str(resp.status_code)] += 1

    def triggers(self) -> collections.Counter[str]:
        """The outcome of every export asked for, by state (``pending``: not carried out)."""
        out: collections.Counter[str] = collections.Counter()
        with httpx.Client(base_url=self.api_url, headers=self.headers, timeout=30) as http:
            for trigger_id in self.asked:
                resp = http.get(f"/v1/jobs/{self.job_id}/triggers/{trigger_id}")
                out[resp.json()["state"] if resp.status_code == 200 else str(resp.status_code)] += 1
        return out

    def report(self) -> list[str]:
        a = self.answers
        by = ", ".join(f"{k} {v}" for k, v in sorted(a.by_status.items()))
        lines = [
            f"REST clients: {a.total} requests ({by}); 5xx but 503 Retry-After: {a.fives}; "
            f"503 with Retry-After (or /readyz): {a.unavailable}"
        ]
        for ts, what, code, text in a.server_errors[:10]:
            lines.append(f"  ! t+{ts - self.started:.1f}s {what}: {code} {text}")
        if self.asked or self.export_refused:
            outcome = ", ".join(f"{k} {v}" for k, v in sorted(self.triggers().items()))
            refused = ", ".join(f"{k} {v}" for k, v in sorted(self.export_refused.items()))
            lines.append(
                f"online exports asked: {len(self.asked)} accepted ({outcome or 'none'})"
                + (f"; not accepted: {refused}" if refused else "")
            )
        return lines
