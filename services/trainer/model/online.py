"""Online serving: the trainer's base and delta saves published to Redis (``online`` config).

A save is written to files first (the model directory, as always: the files stay the
record); rank 0 then reads the rows back, each store shard's part into its own partition,
and writes them through the embedding store's ``RedisConverter``: a base replaces a table's
partition atomically, a delta updates it. Only when every table is written is
``{prefix}:version`` bumped (``seq``, ``tag``, ...) and PUBLISHed: a reader that watches it
switches to a model that is there whole. Key layout (see the trainer README)::

    {prefix}:{table}:rows:{K}-of-{N}    hash  feasign (decimal uint64) -> dim float32 LE
    {prefix}:{table}:meta:{K}-of-{N}    hash  dim, tag, base_tag, mode
    {prefix}:{table}:tags:{K}-of-{N}    set   tags applied since the last base
    {prefix}:version                    hash  seq, tag, mode, day, pass_id, tables, rows, unix

K-of-N is the store shard that saved the rows (``keyhash.shard_of(key, N)``; 0-of-1 for an
in-process store). The REST export trigger's mode ``online`` is :func:`export_online`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis
from streamrec.control import redis_io
from streamrec.save_modes import SaveMode
from streamrec.trainer.errors import CheckpointError, ConfigError, OnlinePublishError
from streamrec.trainer.group_outcome import agree
from streamrec.trainer.model.checkpoint_dirs import SPARSE_NAME

MANIFEST = "MANIFEST.json"


def shard_saves(sparse_dir: Path) -> list[tuple[Path, int, int]]:
    """(directory, shard_id, num_shards) of each store save under ``sparse_dir``: the
    directory itself (an in-process store: 0 of 1) or one per shard of the store service,
    as each save's manifest says."""
    dirs = [sparse_dir] if (sparse_dir / MANIFEST).is_file() else sorted(sparse_dir.iterdir())
    out = []
    for d in dirs:
        try:
            extra = json.loads((d / MANIFEST).read_text()).get("extra") or {}
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{d / MANIFEST}: not a store save: {exc}") from exc
        out.append((d, int(extra.get("shard_id", 0)), int(extra.get("num_shards", 1))))
    if not out:
        raise CheckpointError(f"{sparse_dir}: no store save to publish")
    return out


def publish_dir(
    redis_url: str,
    prefix: str,
    directory: Path,
    tables: list[str],
    mode: str,
    tag: str,
    info: dict[str, Any],
) -> dict[str, Any]:
    """Writes the ``mode`` rows saved under ``directory/sparse`` to Redis, then bumps the
    version key; returns the version's fields (``seq`` among them). The serving Redis's
    password comes from ``$STREAMREC_ONLINE_REDIS_PASSWORD_FILE`` (``redis_io.serving_url``);
    a Redis that cannot be reached or refuses is an :class:`OnlinePublishError` naming it."""
    from streamrec.embedding_store import FileConverter, RedisConverter

    try:
        url = redis_io.serving_url(redis_url)
        rows = 0
        conv = None
        for d, shard_id, num_shards in shard_saves(directory / SPARSE_NAME):
            files = FileConverter(d)
            conv = RedisConverter(url, prefix, shard_id, num_shards)
            try:
                for table in tables:
                    keys, values = files.read_rows(table, mode)
                    conv.write_rows(table, keys, values, SaveMode(mode), tag)
                    rows += int(keys.size)
            finally:
                conv.redis.close()
        assert conv is not None
        version = {**info, "tag": tag, "mode": mode, "tables": len(tables), "rows": rows}
        version["unix"] = f"{time.time():.3f}"
        conv = RedisConverter(url, prefix)
        try:
            version["seq"] = conv.publish_version(version)
        finally:
            conv.redis.close()
        return version
    except redis.RedisError as exc:  # one line naming the Redis, not a client traceback
        raise OnlinePublishError(
            f"serving Redis {redis_io.redacted(redis_url)}: {type(exc).__name__}: {exc} "
            f"(the {mode} save is written in {directory}, not published)"
        ) from None


def publish_save(
    trainer: Any, directory: Path, mode: str, day: str, pass_id: int | None
) -> dict[str, Any] | None:
    """Publishes a base or delta save the trainer (an OnlineTrainer) just wrote; rank 0
    writes, every rank learns the outcome (a failure raises on all). None on other ranks."""
    online = trainer.config.online
    if online.redis_url is None:
        raise ConfigError("online.redis_url is not set: nothing to publish to")
    tag = f"{day}/{mode}" if mode == SaveMode.BASE else f"{day}/delta_{pass_id}"
    out, failure = None, None
    if trainer.rank == 0:
        try:
            info = {"day": day, "pass_id": "" if pass_id is None else pass_id}
            out = publish_dir(
                online.redis_url,
                online.prefix,
                directory,
                trainer.config.table_names,
                str(mode),
                tag,
                info,
            )
        except Exception as exc:
            failure = exc
    agree(failure, f"publishing {directory} to the serving Redis")
    return out


def export_online(trainer: Any) -> dict[str, Any]:
    """The REST trigger ``export`` with mode ``online``: a base save of the model as it is
    now (``model_root/DAY/base``), published; later delta saves update it in Redis."""
    if trainer.config.online.redis_url is None:
        raise ConfigError("export mode online needs the job's online.redis_url (the serving Redis)")
    if trainer.last_pass is None:
        raise ConfigError("no pass trained or loaded yet: nothing to publish")
    day, _ = trainer.last_pass
    directory = trainer.save_model(SaveMode.BASE, day)
    if SaveMode.BASE not in trainer.config.online.modes:  # published only when asked
        trainer.last_online = publish_save(trainer, directory, SaveMode.BASE, day, None)
    return {"path": str(directory), "mode": "online", "day": day, "version": trainer.last_online}
