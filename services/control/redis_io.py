"""The Redis calls of the control plane, typed as the API's clients see them.

Every Redis client of the API (and the trainers' channel) is made with
``decode_responses=True``, so every reply is ``str``; redis-py types its replies as
``bytes | str`` whatever the client decodes, and types its writes as taking
``dict[bytes | str | int | float | ..., ...]``, which a ``dict[str, str]`` is not (a dict is
invariant). The few calls the API makes say what they return here, once, instead of a cast at
every call site.

Each function takes a client or a pipeline (``redis.client.Pipeline`` is a ``redis.Redis``);
on a pipeline in MULTI mode the reply comes from ``execute()`` and the return value is to be
ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

#: The file holding Redis's password (AUTH), for every client of the control plane: the API,
#: the trainers, ``streamrec up`` (a mounted Secret in Kubernetes). Never printed.
PASSWORD_FILE_ENV = "STREAMREC_REDIS_PASSWORD_FILE"
#: The file holding the serving Redis's password (``online.redis_url``, where the trainers
#: publish models; its readers hold this one, never the control plane's). Unset: none.
ONLINE_PASSWORD_FILE_ENV = "STREAMREC_ONLINE_REDIS_PASSWORD_FILE"

#: A hash, or the fields of a stream entry.
Fields = dict[str, str]
#: A stream entry: (id, fields); the fields are empty for an entry deleted while pending.
Entry = tuple[str, Fields]


def reconnecting(outage_s: float = 30.0) -> Retry:
    """The retry policy of a client that outlives a Redis restart: a call that finds its
    connection broken or refused (Redis restarting from its append-only file, or still
    loading it) is retried with backoff (0.05 s doubling to 1 s, jittered) for about
    ``outage_s`` seconds; a timeout is not retried (a hung Redis fails the call within the
    socket timeout).

    A retried call may have run once already (the connection broke after Redis ran it, before
    the reply): the callers' writes are idempotent or harmless twice (a report applied twice
    is applied once), and :meth:`~streamrec.control.channel.TrainerChannel.take_pass` first takes
    a pass delivered to it whose reply was lost, so such a pass is not stranded.
    """
    backoff = EqualJitterBackoff(cap=1.0, base=0.05)
    return Retry(
        backoff, retries=int(outage_s / 0.75) + 5, supported_errors=(redis.ConnectionError,)
    )


def read_password(path: str | os.PathLike[str]) -> str:
    """The password in the file at ``path`` (surrounding whitespace dropped); ValueError
    naming the file (never the password) when it cannot be read or is empty."""
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"Redis password file {str(path)!r}: {exc.strerror}") from None
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"Redis password file {str(path)!r}: empty, or holds whitespace")
    return text


def with_password(url: str, password_file: str | os.PathLike[str] | None = None) -> str:
    """``url`` carrying the password of ``password_file`` (None: ``$STREAMREC_REDIS_PASSWORD_FILE``)
    as ``redis://:PASSWORD@host:port/db``, so every client made from it (the trainer's
    channel, the pool's; the serving Redis's: :func:`serving_url`) authenticates. A URL that already
    names a password, or no file at all, is returned as it is. Log :func:`redacted` instead.
    """
    path = password_file if password_file is not None else os.environ.get(PASSWORD_FILE_ENV)
    if not path:
        return url
    parts = urlsplit(url)
    if parts.password or parts.scheme not in ("redis", "rediss"):
        return url
    secret = quote(read_password(path), safe="")
    user = quote(parts.username, safe="") if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{secret}@{parts.netloc}"))


def serving_url(url: str) -> str:
    """A serving Redis's ``url`` carrying the password of ``$STREAMREC_ONLINE_REDIS_PASSWORD_FILE``
    (unset: ``url`` as it is; never the control plane's password)."""
    path = os.environ.get(ONLINE_PASSWORD_FILE_ENV)
    return with_password(url, path) if path else url


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: what logs may print."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


#: a hash field's name: a ``str`` or a ``StrEnum`` of field names (``streamrec.control.records``)
Name = TypeVar("Name", bound=str)


def _encodable(fields: Mapping[Name, str]) -> dict[FieldT, EncodableT]:
    return dict(fields.items())


def hgetall(r: redis.Redis, key: str) -> Fields:
    """The hash at ``key``; empty when there is none."""
    return cast(Fields, r.hgetall(key))


def hget(r: redis.Redis, key: str, field: str) -> str | None:
    return cast("str | None", r.hget(key, field))


def hmget(r: redis.Redis, key: str, fields: Sequence[str]) -> list[str | None]:
    """The values of ``fields`` in order, None for a missing one."""
    return cast("list[str | None]", r.hmget(key, list(fields)))


def hset(r: redis.Redis, key: str, fields: Mapping[Name, str]) -> None:
    r.hset(key, mapping=_encodable(fields))


def get(r: redis.Redis, key: str) -> str | None:
    return cast("str | None", r.get(key))


def smembers(r: redis.Redis, key: str) -> set[str]:
    return cast("set[str]", r.smembers(key))


def zrange(r: redis.Redis, key: str, start: int, end: int) -> list[str]:
    """Members of the sorted set by rank, ``end`` included (-1: the last)."""
    return cast("list[str]", r.zrange(key, start, end))


def xadd(r: redis.Redis, stream: str, fields: Mapping[str, str]) -> str:
    """Appends an entry to ``stream``; returns its id."""
    return cast(str, r.xadd(stream, _encodable(fields)))


def xrange(r: redis.Redis, stream: str, start: str, end: str, count: int) -> list[Entry]:
    """At most ``count`` entries of ``stream`` from id ``start`` to ``end`` (``-``, ``+``,
    ``(id`` exclusive), oldest first."""
    return cast("list[Entry]", r.xrange(stream, min=start, max=end, count=count) or [])


def read_group(
    r: redis.Redis,
    group: str,
    consumer: str,
    stream: str,
    last_id: str,
    count: int,
    block_ms: int | None = None,
) -> list[Entry]:
    """XREADGROUP on one stream: its entries after ``last_id`` (``>``: never delivered, ``0``:
    this consumer's pending ones); empty when none came within ``block_ms`` (None: no wait)."""
    reply = r.xreadgroup(group, consumer, {stream: last_id}, count=count, block=block_ms)
    if not reply:
        return []
    # RESP2 (the protocol the API's clients speak): [[stream, [(id, fields), ...]]]
    return cast("list[list[Any]]", reply)[0][1]


def pending_of(
    r: redis.Redis, stream: str, group: str, consumer: str, count: int
) -> list[tuple[str, int]]:
    """At most ``count`` entries of ``stream`` delivered to ``consumer`` of ``group`` and not
    acknowledged, oldest first: (id, milliseconds since their delivery)."""
    rows = r.xpending_range(stream, group, min="-", max="+", count=count, consumername=consumer)
    return [(str(row["message_id"]), int(row["time_since_delivered"])) for row in rows]
