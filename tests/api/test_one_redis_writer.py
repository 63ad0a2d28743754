"""The API calls Redis from its repository modules only (``repo.py`` and the ones it holds,
and ``state.py``'s transaction): the scheduler, the reports, the pool and the gauges call
repository methods, so a key or a hash field is written in one place."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "services" / "api"
REPOSITORY = {"repo.py", "pass_records.py", "work_queue.py", "pool_records.py", "state.py"}
#: redis-py commands and client calls the API uses (a new one here is a new Redis call)
COMMANDS = {
    "close", "delete", "execute", "exists", "hdel", "hget", "hgetall", "hincrby", "hmget",
    "hset", "multi", "pipeline", "ping", "pttl", "register_script", "rpush", "sadd", "scard",
    "smembers", "srem", "transaction", "watch", "xack", "xadd", "xgroup_create",
    "xinfo_groups", "xlen", "xpending_range", "xrange", "xreadgroup", "zadd", "zcard",
    "zmscore", "zrange", "zrem",
}  # fmt: skip


#: streamrec.control.pool's functions that read Redis (its types are fine anywhere)
POOL_READS = {"live_groups", "ended_jobs", "assignments"}


def redis_calls(source: str) -> list[str]:
    """``line: what`` for each Redis call in ``source``: a client's command (on ``r``,
    ``self.r``, a ``pipe``), a ``redis_io`` helper or its import, ``streamrec.control.pool``'s
    reads, a ``.r`` attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if (
                name == "redis_io"
                or (name in {"r", "pipe"} and node.attr in COMMANDS)
                or (name == "pool" and node.attr in POOL_READS)
            ):
                found.append(f"{node.lineno}: {name}.{node.attr}")
            elif node.attr == "r":
                found.append(f"{node.lineno}: .r")
        elif isinstance(node, ast.ImportFrom) and node.module == "streamrec.control":
            found += [f"{node.lineno}: import redis_io" for a in node.names if a.name == "redis_io"]
    return found


def api_modules() -> list[Path]:
    return sorted(API.rglob("*.py"))


def test_only_the_repository_calls_redis():
    outside = {
        str(path.relative_to(API)): calls
        for path in api_modules()
        if path.name not in REPOSITORY and (calls := redis_calls(path.read_text()))
    }
    assert outside == {}


def test_the_check_finds_each_kind_of_call():
    # the repository's own modules are what the check must see, or it passes vacuously
    seen = {path.name: redis_calls(path.read_text()) for path in api_modules()}
    for name in REPOSITORY:
        assert seen[name], name
    planted = "\n".join(
        [
            "from streamrec.control import redis_io",
            "redis_io.hset(self.r, key, {})",
            "self.r.xack(stream, group, msg_id)",
            "pipe.hincrby(key, 'n', 1)",
            "x = repo.r",
            "pool.live_groups(client)",
        ]
    )
    calls = redis_calls(planted)
    assert [c.split(": ")[0] for c in calls].count("2") >= 2, calls
    for line in ("1", "3", "4", "5", "6"):
        assert any(c.startswith(f"{line}: ") for c in calls), (line, calls)
