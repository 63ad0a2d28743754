"""atheris target: valid frames with extreme values for every op of a store shard and of the
sampler, answered in-process by the servers' own request path (:meth:`RpcServer.handle`:
decode, handler, error mapping).

fuzz_wire.py fuzzes the decoder with malformed frames; this target builds frames the decoder
accepts (right dtypes, shapes matching buffers) whose *values* are extreme: counts near
2**63 or negative, sums that wrap int64, lengths that do not match each other, huge dims and
ids, NaN and Inf, paths too long or outside the root. An error reply is fine as long as its
code names the caller's mistake; ``internal`` (a handler bug), an undecodable reply, or a
dead process is a crash.

    .venv/bin/python tests/fuzz/fuzz_handlers.py -max_total_time=30 -rss_limit_mb=2048
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import atheris
import numpy as np

with atheris.instrument_imports(
    include=[
        "streamrec.wire",
        "streamrec.sampler.server",
        "streamrec.sampler.table",
        "streamrec.sampler.columns",
        "streamrec.embedding_store.service.handlers",
        "streamrec.embedding_store.service.saves",
        "streamrec.embedding_store.persistence.save_load",
        "streamrec.embedding_store.persistence.manifests",
        "streamrec.embedding_store.disk",
    ]
):
    from streamrec import wire
    from streamrec.embedding_store.service.config import ShardConfig
    from streamrec.embedding_store.service.handlers import OPS
    from streamrec.embedding_store.service.server import Shard
    from streamrec.errors import BadRequest
    from streamrec.keyhash import shard_of
    from streamrec.sampler.config import ServerConfig
    from streamrec.sampler.server import SamplerServer

#: Integers a peer may send where a count, size, id or offset is expected.
EXTREME = [
    0,
    1,
    2,
    -1,
    7,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
    -(2**62),
    2**64 - 1,  # msgpack's largest: a meta int beyond int64
]
INT_DTYPES = [np.int8, np.int32, np.int64, np.uint32, np.uint64]
FLOATS = [0.0, 1.0, -1.0, 1e38, -1e38, float("nan"), float("inf"), -float("inf"), 5e-324]
TAGS = {"sample_tag": "cat", "dedup_tag": "item", "weight_tag": "w", "skey_name": "skey"}
TABLES = ["user", "item", "nope", ""]
SAMPLER_OPS = ["sample_ids", "valid_sample_ids", "pack_feature", "reload", "ping", "stats"]
STORE_OPS = [
    *("pull", "push", "pull_many", "push_many", "size", "save", "load", "shrink"),
    *("advance_day", "stats", "tables", "ping", "create_tables", "drop_tables"),
]
#: Most entries of an array (and rows of a table) one input builds: keeps runs fast and small.
MAX_N = 48


def _int(fdp: atheris.FuzzedDataProvider) -> int:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return EXTREME[fdp.ConsumeIntInRange(0, len(EXTREME) - 1)]
    if kind == 1:
        return fdp.ConsumeInt(8)
    return fdp.ConsumeIntInRange(0, 64)


def _ints(fdp: atheris.FuzzedDataProvider, n: int, dtype: type = np.int64) -> np.ndarray:
    """``n`` extreme integers as ``dtype`` (wrapped to it, as a peer's C code would)."""
    info = np.iinfo(dtype)
    span = int(info.max) - int(info.min) + 1
    values = [(_int(fdp) - int(info.min)) % span + int(info.min) for _ in range(n)]
    return np.array(values, dtype=dtype)


def _floats(fdp: atheris.FuzzedDataProvider, n: int) -> np.ndarray:
    if fdp.ConsumeBool():
        return np.ones(n, np.float32)
    return np.array(
        [FLOATS[fdp.ConsumeIntInRange(0, len(FLOATS) - 1)] for _ in range(n)], np.float32
    )


def _n(fdp: atheris.FuzzedDataProvider, like: int | None = None) -> int:
    """A length: usually ``like`` (matching its partner array), sometimes not."""
    if like is not None and fdp.ConsumeIntInRange(0, 3):
        return like
    return fdp.ConsumeIntInRange(0, MAX_N)


def _meta_value(fdp: atheris.FuzzedDataProvider) -> object:
    kind = fdp.ConsumeIntInRange(0, 5)
    return [True, False, _int(fdp), fdp.ConsumeUnicodeNoSurrogates(6), None, 1.5][kind]


class Target:
    """One shard (shard 0 of 2, so ownership is checked) and one sampler, in-process."""

    def __init__(self) -> None:
        # under $TMPDIR (test_fuzz.py points it at the test's tmp_path): libFuzzer ends the
        # process without Python's atexit, so the directory may outlive the run
        self.dir = Path(tempfile.mkdtemp(prefix="fuzz-handlers-"))
        atexit.register(shutil.rmtree, self.dir, True)
        self.root = self.dir / "models"
        self.root.mkdir()
        config = ShardConfig(
            shard_id=0,
            num_shards=2,
            endpoint="tcp://127.0.0.1:*",
            tables=[
                {"name": "user", "embedx_dim": 3, "embedx_threshold": 0},
                {"name": "item", "embedx_dim": 2},
            ],
            model_roots=[str(self.root)],
            capacity=1 << 16,
            insecure_no_auth=True,
        )
        self.shard = Shard(config)  # the RpcServer is built, never started: handle() only
        self.sampler = SamplerServer(  # its own endpoint is never bound: start() is not called
            ServerConfig(
                max_negatives=1 << 16,
                seed=1,
                insecure_no_auth=True,
            )
        )
        self.sampler_rpc = wire.RpcServer("tcp://127.0.0.1:*", self.sampler.handlers, token=None)
        # every op is fuzzed: one added to a service without a case here fails at once
        assert sorted(STORE_OPS) == sorted(OPS), sorted(set(OPS) ^ set(STORE_OPS))
        assert sorted(SAMPLER_OPS) == sorted(self.sampler.handlers)
        self.good_table()

    def good_table(self) -> None:
        j = np.arange(40, dtype=np.int64)
        spec = [["item", "dense"], ["cat", "dense"], ["w", "dense"], ["skey", "dense"]]
        arrays = {"0.v": j * 100, "1.v": j % 5, "2.v": np.ones(40, np.float32), "3.v": j}
        self.ask(self.sampler_rpc, "reload", {"tags": TAGS, "columns": spec}, arrays)

    @staticmethod
    def ask(server: wire.RpcServer, op: str, meta: dict, arrays: dict) -> None:
        try:
            frames = wire.encode({"op": op, "id": 1}, meta, arrays)
        except BadRequest:
            return  # the client side refuses it (an int beyond 64 bits): nothing is sent
        reply = wire.decode(server.handle(frames))
        if not reply.header.get("ok"):
            error = reply.header["error"]
            assert error["code"] != "internal", (op, meta, arrays, error)

    # ---- the sampler --------------------------------------------------------------------

    def sampler_op(self, fdp: atheris.FuzzedDataProvider) -> None:
        op = SAMPLER_OPS[fdp.ConsumeIntInRange(0, len(SAMPLER_OPS) - 1)]
        meta: dict = {}
        arrays: dict = {}
        if op == "sample_ids":
            b = _n(fdp)
            arrays["dedup"] = _ints(fdp, b) if fdp.ConsumeBool() else np.arange(b) * 100
            dtype = INT_DTYPES[fdp.ConsumeIntInRange(0, len(INT_DTYPES) - 1)]
            arrays["cnts"] = _ints(fdp, _n(fdp, b), dtype)
            if fdp.ConsumeBool():
                arrays["categories"] = _ints(fdp, _n(fdp, b))
            for flag in ("put_back", "avoid_conflict", "avoid_conflict_with_all_dedup_tags"):
                if fdp.ConsumeBool():
                    meta[flag] = fdp.ConsumeBool() if fdp.ConsumeIntInRange(0, 7) else 3
            if fdp.ConsumeBool():
                meta["missing_id"] = _int(fdp)
            if fdp.ConsumeIntInRange(0, 3) == 0:
                meta["tags"] = TAGS
        elif op in ("valid_sample_ids", "pack_feature"):
            arrays["ids"] = _ints(fdp, _n(fdp))
            if op == "pack_feature" and fdp.ConsumeBool():
                meta["default_value"] = _int(fdp) if fdp.ConsumeIntInRange(0, 7) else 2**64
        elif op == "reload":
            n = _n(fdp)
            meta = {"tags": TAGS, "columns": [["item", "dense"], ["cat", "dense"], ["w", "dense"]]}
            arrays = {"0.v": _ints(fdp, n), "1.v": _ints(fdp, _n(fdp, n)), "2.v": _floats(fdp, n)}
            kind = ["dense", "ragged", "str"][fdp.ConsumeIntInRange(0, 2)]
            meta["columns"].append(["skey", kind])
            values = _ints(fdp, _n(fdp, n), np.uint8 if kind == "str" else np.int64)
            arrays["3.v"] = values
            if kind != "dense" or fdp.ConsumeIntInRange(0, 7) == 0:
                arrays["3.o"] = _ints(fdp, _n(fdp, n + 1))
        self.ask(self.sampler_rpc, op, meta, arrays)
        if op == "reload":
            self.good_table()  # sampling goes on against a table that has rows

    # ---- the store ----------------------------------------------------------------------

    def _keys(self, fdp: atheris.FuzzedDataProvider, n: int) -> np.ndarray:
        keys = _ints(fdp, n)
        if fdp.ConsumeIntInRange(0, 3):  # mostly keys this shard owns, so the op runs
            keys = keys[shard_of(keys, 2) == 0] if len(keys) else keys
        return keys

    def store_op(self, fdp: atheris.FuzzedDataProvider) -> None:
        op = STORE_OPS[fdp.ConsumeIntInRange(0, len(STORE_OPS) - 1)]
        meta: dict = {}
        arrays: dict = {}
        dims = {"user": 4, "item": 3}  # pulled width: embed_w + embedx_dim
        if op in ("pull", "push", "size"):
            table = TABLES[fdp.ConsumeIntInRange(0, len(TABLES) - 1)]
            meta["table"] = table
            keys = self._keys(fdp, _n(fdp))
            arrays["keys"] = keys
            if op == "pull" and fdp.ConsumeBool():
                meta["create"] = _meta_value(fdp)
            if op == "push":
                n, dim = _n(fdp, len(keys)), dims.get(table, 3)
                if fdp.ConsumeIntInRange(0, 3) == 0:
                    dim = _int(fdp) % 7
                arrays["grads"] = _floats(fdp, n * dim).reshape(n, dim)
                for name in ("shows", "clicks"):
                    if fdp.ConsumeBool():
                        arrays[name] = _floats(fdp, _n(fdp, len(keys)))
        elif op in ("pull_many", "push_many"):
            names = [
                TABLES[fdp.ConsumeIntInRange(0, 2)] for _ in range(fdp.ConsumeIntInRange(0, 3))
            ]
            meta["tables"] = names
            keys = self._keys(fdp, _n(fdp))
            arrays["keys"] = keys
            counts = _ints(fdp, _n(fdp, len(names)))
            if fdp.ConsumeBool() and len(names):  # counts that add up, the rest extreme
                counts = np.zeros(len(names), np.int64)
                counts[-1] = len(keys)
            arrays["counts"] = counts
            if op == "push_many":
                total = sum(
                    int(c) * dims.get(t, 3) for c, t in zip(counts, names, strict=False) if c > 0
                )
                size = _n(fdp, min(total, 4 * MAX_N * MAX_N))
                arrays["grads"] = _floats(fdp, size)
                for name in ("shows", "clicks"):
                    if fdp.ConsumeBool():
                        arrays[name] = _floats(fdp, _n(fdp, len(keys)))
        elif op in ("save", "load"):
            kind = fdp.ConsumeIntInRange(0, 4)
            meta["path"] = [
                str(self.root / "ck"),
                str(self.root / ("x" * 300)),
                "/etc/ck",
                str(self.root / "a" / ".." / ".." / "out"),
                fdp.ConsumeUnicodeNoSurrogates(12),
            ][kind]
            if fdp.ConsumeBool():
                meta["mode"] = ["checkpoint", "base", "delta", "batch", "x"][
                    fdp.ConsumeIntInRange(0, 4)
                ]
            if fdp.ConsumeIntInRange(0, 3) == 0:
                meta["converter"] = _meta_value(fdp)
            if op == "load" and fdp.ConsumeBool():
                meta["verify_only"] = _meta_value(fdp)
        elif op == "create_tables":
            meta["namespace"] = fdp.ConsumeUnicodeNoSurrogates(8)
            meta["tables"] = [
                {
                    "name": fdp.ConsumeUnicodeNoSurrogates(6),
                    "embedx_dim": _int(fdp),
                    "embedx_threshold": _int(fdp) if fdp.ConsumeBool() else 0,
                }
                for _ in range(fdp.ConsumeIntInRange(0, 2))
            ]
        elif op == "drop_tables":
            meta["namespace"] = fdp.ConsumeUnicodeNoSurrogates(8)
        if op not in ("ping", "create_tables", "drop_tables") and fdp.ConsumeIntInRange(0, 7) == 0:
            meta["namespace"] = fdp.ConsumeUnicodeNoSurrogates(8)
        if fdp.ConsumeIntInRange(0, 15) == 0:
            meta["expect_incarnation"] = _int(fdp)
        self.ask(self.shard.server, op, meta, arrays)


TARGET: Target | None = None


def test_one_input(data: bytes) -> None:
    assert TARGET is not None
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        TARGET.sampler_op(fdp)
    else:
        TARGET.store_op(fdp)


def main() -> None:
    global TARGET
    TARGET = Target()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
