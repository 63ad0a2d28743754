"""Online serving: the trainer's base and delta saves published to Redis (``online`` config).

A save is written to files first (the model directory, as always: the files stay the
record); rank 0 then reads the rows back, each store shard's part into its own partition,
and writes them through the embedding store's ``RedisConverter``: a base replaces a table's
partition atomically, a delta updates it and deletes the keys the store deleted since the
previous save, and applies only on the version the partition holds (its manifest's
``model_version`` and ``applies_on``: a delta published twice or out of order, or after a
publish that failed, is refused until the next base). Only when every table is written is
``{prefix}:version`` bumped (``seq``, ``tag``, ``model_version``, ...) and PUBLISHed: a
reader that watches it switches to a model that is there whole. Key layout (see the trainer
README)::

    {prefix}:{table}:rows:{K}-of-{N}    hash  feasign (decimal uint64) -> dim float32 LE
    {prefix}:{table}:meta:{K}-of-{N}    hash  dim, tag, base_tag, mode, version
    {prefix}:{table}:tags:{K}-of-{N}    set   tags applied since the last base
    {prefix}:version                    hash  seq, tag, mode, day, pass_id, model_version,
                                              tables, rows, unix

K-of-N is the store shard that saved the rows (``keyhash.shard_of(key, N)``; 0-of-1 for an
in-process store). The REST export trigger's mode ``online`` is :func:`export_online`.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import redis
from streamrec.control import redis_io
from streamrec.save_modes import SaveMode
from streamrec.trainer.errors import (
    CheckpointError,
    ConfigError,
    OnlinePublishError,
    ServingOutOfStep,
)
from streamrec.trainer.group_outcome import agree
from streamrec.trainer.model.checkpoint_dirs import SPARSE_NAME

MANIFEST = "MANIFEST.json"

log = logging.getLogger("streamrec.trainer.online")


def shard_saves(sparse_dir: Path) -> list[tuple[Path, int, int, dict[str, Any]]]:
    """(directory, shard_id, num_shards, manifest) of each store save under ``sparse_dir``:
    the directory itself (an in-process store: 0 of 1) or one per shard of the store
    service, as each save's manifest says."""
    dirs = [sparse_dir] if (sparse_dir / MANIFEST).is_file() else sorted(sparse_dir.iterdir())
    out = []
    for d in dirs:
        try:
            manifest = json.loads((d / MANIFEST).read_text())
            extra = manifest.get("extra") or {}
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{d / MANIFEST}: not a store save: {exc}") from exc
        shard = (int(extra.get("shard_id", 0)), int(extra.get("num_shards", 1)))
        out.append((d, *shard, manifest))
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
    a Redis that cannot be reached or refuses (a delta that does not apply on the version
    served among them) is an :class:`OnlinePublishError` naming it."""
    from streamrec.embedding_store import (
        FileConverter,
        RedisConverter,
        SaveVersion,
        VersionConflict,
    )

    try:
        url = redis_io.serving_url(redis_url)
        rows = 0
        conv = None
        versions: set[int | None] = set()
        for d, shard_id, num_shards, manifest in shard_saves(directory / SPARSE_NAME):
            files = FileConverter(d)
            saved = SaveVersion.of_manifest(manifest)
            versions.add(None if saved is None else saved.number)
            conv = RedisConverter(url, prefix, shard_id, num_shards)
            try:
                for table in tables:
                    keys, values = files.read_rows(table, mode)
                    deleted = files.read_deleted(table, mode) if mode == SaveMode.DELTA else None
                    conv.write_rows(
                        table, keys, values, SaveMode(mode), tag, deleted=deleted, version=saved
                    )
                    rows += int(keys.size)
            finally:
                conv.redis.close()
        assert conv is not None
        version = {**info, "tag": tag, "mode": mode, "tables": len(tables), "rows": rows}
        if len(versions) == 1 and None not in versions:  # shards in step: one version
            version["model_version"] = versions.pop()
        version["unix"] = f"{time.time():.3f}"
        conv = RedisConverter(url, prefix)
        try:
            version["seq"] = conv.publish_version(version)
        finally:
            conv.redis.close()
        return version
    except (redis.RedisError, VersionConflict) as exc:  # one line naming the Redis
        kind = ServingOutOfStep if isinstance(exc, VersionConflict) else OnlinePublishError
        raise kind(
            f"serving Redis {redis_io.redacted(redis_url)}: {type(exc).__name__}: {exc} "
            f"(the {mode} save is written in {directory}, not published)"
        ) from None


def publish_save(
    trainer: Any, directory: Path, mode: str, day: str, pass_id: int | None
) -> dict[str, Any] | None:
    """Publishes a base or delta save the trainer (an OnlineTrainer) just wrote; rank 0
    writes, every rank learns the outcome (a failure raises on all). None on other ranks.

    A delta the serving Redis refuses as out of step (:class:`ServingOutOfStep`: the trainer
    went back to a checkpoint older than what serving holds, or a publish failed half-way)
    does not fail the pass: rank 0 writes a base of the model as it is now
    (``model_root/DAY/base``) and publishes that, bringing serving back in step."""
    online = trainer.config.online
    if online.redis_url is None:
        raise ConfigError("online.redis_url is not set: nothing to publish to")
    tag = f"{day}/{mode}" if mode == SaveMode.BASE else f"{day}/delta_{pass_id}"
    out, failure = None, None
    if trainer.rank == 0:
        try:
            info = {"day": day, "pass_id": "" if pass_id is None else pass_id}
            publish = partial(
                publish_dir, online.redis_url, online.prefix, tables=trainer.config.table_names
            )
            try:
                out = publish(directory=directory, mode=str(mode), tag=tag, info=info)
            except ServingOutOfStep as exc:
                if mode != SaveMode.DELTA:
                    raise
                log.warning("%s; publishing a base of the model as it is now instead", exc)
                base = trainer.write_here(SaveMode.BASE, day, None)
                out = publish(directory=base, mode=str(SaveMode.BASE), tag=f"{day}/base", info=info)
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
