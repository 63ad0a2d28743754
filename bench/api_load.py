"""Control-plane load: REST requests/s and latency with many clients at once, against one.

A real redis-server (password set) and a real ``streamrec-api`` process on loopback; the
clients are threads of this process, each with its own HTTP connection, for ``--seconds``
each: a mix of ``GET /v1/jobs`` (a page), ``GET /v1/jobs/{id}``, ``GET .../passes`` and
``POST /v1/jobs`` (one in ten). The baseline is one client doing the same in the same run;
the figure is the ratio, and every answer must be 2xx (a 5xx or a transport error is
counted and printed: the load test fails on any).

    .venv/bin/python bench/api_load.py                   # 50 clients vs 1, 10 s each
    .venv/bin/python bench/api_load.py --clients 20 --seconds 5
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from streamrec.process import bin_path, free_port, spawn, stop_process


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} not up within {timeout_s:.0f} s")


def own_model(body: dict) -> dict:
    """``body`` with a model path of its own (the API refuses two live jobs on one)."""
    path = f"{body['checkpoint']['model_save_path']}-{uuid.uuid4().hex[:12]}"
    return {**body, "checkpoint": {**body["checkpoint"], "model_save_path": path}}


def client_loop(url: str, token: str, body: dict, stop: threading.Event, out: list) -> None:
    """One client until ``stop``: (latency seconds, status) per request into ``out``."""
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=h, timeout=30) as c:
        job = c.post("/v1/jobs", json=own_model(body)).json()["id"]
        n = 0
        while not stop.is_set():
            n += 1
            t0 = time.perf_counter()
            try:
                if n % 10 == 0:
                    status = c.post("/v1/jobs", json=own_model(body)).status_code
                elif n % 3 == 0:
                    status = c.get(f"/v1/jobs/{job}/passes").status_code
                elif n % 2 == 0:
                    status = c.get(f"/v1/jobs/{job}").status_code
                else:
                    status = c.get("/v1/jobs", params={"limit": 20}).status_code
            except httpx.TransportError:
                status = 0
            out.append((time.perf_counter() - t0, status))


def run(url: str, token: str, body: dict, clients: int, seconds: float) -> dict:
    stop = threading.Event()
    outs: list[list] = [[] for _ in range(clients)]
    threads = [
        threading.Thread(target=client_loop, args=(url, token, body, stop, outs[i]))
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    results = [r for o in outs for r in o]
    lat = sorted(r[0] for r in results)
    bad = [s for _, s in results if not 200 <= s < 300]
    return {
        "requests": len(results),
        "rps": len(results) / seconds,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
        "errors": len(bad),
        "statuses": sorted(set(bad)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="api-load-"))
    procs = []
    try:
        (tmp / "data").mkdir()
        (tmp / "models").mkdir()
        password, token = secrets.token_hex(16), secrets.token_hex(16)
        (tmp / "redis-password").write_text(password)
        (tmp / "token").write_text(token)
        (tmp / "redis.conf").write_text(f'requirepass {password}\nsave ""\n')
        rport, aport = free_port(), free_port()
        redis_bin = shutil.which("redis-server") or "/usr/bin/redis-server"
        procs.append(
            spawn(
                [redis_bin, str(tmp / "redis.conf"), "--port", str(rport), "--bind", "127.0.0.1"],
                log=tmp / "redis.log",
                die_with_parent=True,
            )
        )
        url = f"http://127.0.0.1:{aport}"
        procs.append(
            spawn(
                [
                    bin_path("streamrec-api"),
                    "serve",
                    "--port",
                    str(aport),
                    "--redis-url",
                    f"redis://127.0.0.1:{rport}/0",
                    "--redis-password-file",
                    str(tmp / "redis-password"),
                    "--token-file",
                    str(tmp / "token"),
                    "--data-root",
                    str(tmp / "data"),
                    "--model-root",
                    str(tmp / "models"),
                    "--log-level",
                    "warning",
                ],
                log=tmp / "api.log",
                die_with_parent=True,
            )
        )
        wait_until(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 60, "API")
        body = {
            "name": "load",
            "data": {
                "train_data_dir": str(tmp / "data" / "load"),
                "start_day": "20190720",
                "end_day": "20190720",
                "split_interval": 60,
                "split_per_pass": 1,
            },
            "checkpoint": {"model_save_path": str(tmp / "models" / "load")},
        }
        one = run(url, token, body, 1, a.seconds)
        many = run(url, token, body, a.clients, a.seconds)
        for name, r in (("1 client", one), (f"{a.clients} clients", many)):
            print(
                f"{name:>11}: {r['rps']:8.0f} req/s  p50 {r['p50_ms']:6.1f} ms  "
                f"p99 {r['p99_ms']:6.1f} ms  errors {r['errors']} {r['statuses'] or ''}"
            )
        print(f"throughput {a.clients} clients / 1 client: {many['rps'] / one['rps']:.2f}x")
        return 1 if one["errors"] or many["errors"] else 0
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout_s=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
