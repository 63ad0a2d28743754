"""The sampler service: a real server process, real ZeroMQ sockets, real client processes.

Table used throughout: item ``j`` has id ``j * 100 + j % 5`` (so ``id % 100`` is its
category and ``id // 100`` its index) and weight ``j % 7`` (every 7th item has weight 0).
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sampler_workers  # tests/sampler helper module, run in child processes
import torch
import zmq
from in_process import run_main
from sampler_workers import start_server
from scipy import stats
from streamrec import wire
from streamrec.auth import load_token
from streamrec.errors import BadRequest, RemoteError, ServiceUnavailable
from streamrec.handshake import set_credentials
from streamrec.ragged import RaggedTensor
from streamrec.sampler import LocalRpcDataSampler, prefetch
from streamrec.sampler import __main__ as sampler_main
from streamrec.sampler.client import stop_server
from streamrec.sampler.demo import seed_neg_sampling_fn
from streamrec.sampler.errors import BadTable, NoTable, SamplerUnavailable, TagMismatch

TAGS = sampler_workers.TAGS
N_ITEMS = 1000


def table(n=N_ITEMS, id_offset=0):
    j = np.arange(n)
    return {
        "item": torch.from_numpy(id_offset + j * 100 + j % 5),
        "cat": RaggedTensor.from_lengths(torch.from_numpy(j % 5), torch.ones(n, dtype=torch.int64)),
        "w": torch.from_numpy((j % 7).astype(np.float32)),
        "skey": [""] * n,
        "price": torch.from_numpy(j.astype(np.float64) / 10),
    }


def client(srv, **kw):
    return LocalRpcDataSampler(*TAGS, endpoint=srv.endpoint, auto_start=False, **kw)


def spawn():
    return multiprocessing.get_context("spawn")


def test_two_client_processes_draw_with_frequencies_proportional_to_weight(server):
    with client(server) as s:
        s.reload(table())
    category, pos_id = 2, 7 * 100 + 2  # item 7 has weight 0, so no own-id exclusion effect
    with spawn().Pool(2) as pool:
        results = pool.starmap(
            sampler_workers.draw_counts, [(server.endpoint, 10, category, pos_id, N_ITEMS)] * 2
        )
    counts = results[0][0] + results[1][0]
    assert counts.sum() == 2 * 10 * 500 * 20
    for _, cats, own in results:
        assert cats == [category] and own == 0
    j = np.arange(N_ITEMS)
    weights = np.where(j % 5 == category, (j % 7).astype(float), 0.0)
    assert counts[weights == 0].sum() == 0  # other categories and weight-0 items never drawn
    expected = weights[weights > 0] / weights.sum() * counts.sum()
    assert stats.chisquare(counts[weights > 0], expected).pvalue > 1e-4


def test_category_dedup_and_put_back_guarantees(server):
    with client(server) as s:
        s.reload(table())
        j = torch.arange(200)
        pos, cats = j * 100 + j % 5, j % 5
        ids = s.sample_ids(pos, 30, cats).reshape(200, 30)
        assert ((ids % 100) == cats[:, None]).all()
        assert not (ids == pos[:, None]).any()
        ids = s.sample_ids(pos, 30, cats, avoid_conflict_with_all_dedup_tags=True)
        assert not np.isin(ids.numpy(), pos.numpy()).any()
        cnts = torch.tensor([0, 5, 1, 40] * 50)
        ids = s.sample_ids(
            RaggedTensor.from_lengths(pos, torch.ones(200, dtype=torch.int64)), cnts, cats
        )
        assert ids.numel() == int(cnts.sum()) and ids.dtype == torch.int64
    with client(server, put_back=False) as s:
        ids = s.sample_ids(pos, 100, cats).reshape(200, 100).numpy()
        for row in ids:
            assert len(np.unique(row)) == 100
        assert ((ids % 100) == cats.numpy()[:, None]).all()
        # Category 0 has 200 items, 171 of them with weight > 0 (id 0 itself has weight 0).
        big = s.sample_ids(torch.tensor([0]), 200, torch.tensor([0])).numpy()
        assert len(np.unique(big[big != -1])) == 171 and (big == -1).sum() == 29


def test_reload_under_load_sees_old_or_new_table_never_a_mix(server):
    with client(server) as s:
        s.reload(table())
        ctx = spawn()
        stop, results = ctx.Event(), ctx.Queue()
        started = [ctx.Event() for _ in range(2)]
        procs = [
            ctx.Process(
                target=sampler_workers.sample_until_stopped,
                args=(server.endpoint, started[i], stop, results),
            )
            for i in range(2)
        ]
        for p in procs:
            p.start()
        try:
            for ev in started:
                assert ev.wait(60)
            for k in range(8):
                info = s.reload(table(id_offset=1_000_000 if k % 2 == 0 else 0))
                assert info["rows"] == N_ITEMS
                time.sleep(0.15)
        finally:
            stop.set()
            counts = [results.get(timeout=60) for _ in procs]
            for p in procs:
                p.join(timeout=30)
    pure_a = sum(c[0] for c in counts)
    pure_b = sum(c[1] for c in counts)
    mixed = sum(c[2] for c in counts)
    assert mixed == 0
    assert pure_a > 0 and pure_b > 0


def test_bad_requests_get_clear_errors_and_the_table_is_kept(short_dir):
    server = start_server(short_dir, "--max-message-bytes", str(4 << 20))
    try:
        check_bad_requests(server)
    finally:
        stop_server(server.proc.pid)
        server.proc.wait(timeout=10)


def check_bad_requests(server):
    with client(server) as s:
        s.reload(table())
        generation = s.ping()["generation"]
        bad_tables = [
            (
                {**table(), "w": torch.tensor([float("nan")] + [1.0] * (N_ITEMS - 1))},
                "row 0 has nan",
            ),
            ({**table(), "w": -torch.ones(N_ITEMS)}, "row 0 has -1.0"),
            ({**table(), "item": torch.zeros(N_ITEMS, dtype=torch.int64)}, "id 0 appears"),
            (
                {k: v for k, v in table().items() if k != "cat"},
                "sample_tag column 'cat' is missing",
            ),
            ({**table(), "item": torch.arange(N_ITEMS, dtype=torch.float32)}, "must be integers"),
        ]
        for bad, message in bad_tables:
            with pytest.raises(BadTable, match=message):
                s.reload(bad)
        with pytest.raises(BadRequest, match="sample_cnts has 3 entries but there are 2"):
            s.sample_ids(torch.tensor([0, 100]), torch.tensor([1, 2, 3]), torch.tensor([0, 1]))
        with pytest.raises(BadRequest, match="integer ids, got dtype float32"):
            s.sample_ids(torch.tensor([0.5]), 3, torch.tensor([0]))
        with pytest.raises(BadTable, match="table: expected a dict"):
            s.reload(42)
    with LocalRpcDataSampler(
        "cat", "item", "weight", "skey", endpoint=server.endpoint, auto_start=False
    ) as other:
        with pytest.raises(TagMismatch, match="weight_tag"):
            other.sample_ids(torch.tensor([0]), 1, torch.tensor([0]))

    # The same checks hold server-side for a client that skips the client library.
    raw = wire.RpcClient(server.endpoint, timeout_s=10)
    cases = [
        (
            "sample_ids",
            {},
            {"dedup": np.zeros(2, np.float32), "cnts": np.ones(2, np.int64)},
            "'dedup' must hold integers, got dtype float32",
        ),
        (
            "sample_ids",
            {},
            {"dedup": np.zeros((2, 2), np.int64), "cnts": np.ones(2, np.int64)},
            "'dedup' must be 1-D, got shape [2, 2]",
        ),
        (
            "sample_ids",
            {},
            {"dedup": np.zeros(2, np.int64), "cnts": np.ones(3, np.int64)},
            "sample_cnts has 3 entries",
        ),
        (
            "sample_ids",
            {},
            {"dedup": np.zeros(2, np.int64), "cnts": np.array([1, -4])},
            "sample_cnts[1] = -4",
        ),
        (
            "sample_ids",
            {},
            {"dedup": np.zeros(1, np.int64), "cnts": np.array([10**9])},
            "above the server's cap",
        ),
        (
            "sample_ids",
            {"put_back": "yes"},
            {"dedup": np.zeros(1, np.int64), "cnts": np.ones(1, np.int64)},
            "'put_back'",
        ),
        ("sample_ids", {}, {"cnts": np.ones(1, np.int64)}, "array 'dedup' is missing"),
        (
            "reload",
            {
                "tags": dict(
                    zip(["sample_tag", "dedup_tag", "weight_tag", "skey_name"], TAGS, strict=True)
                ),
                "columns": [["item", "dense"], ["nope", "weird"]],
            },
            {"0.v": np.arange(3)},
            "columns[1]",
        ),
        ("reload", {"tags": "x"}, {}, "meta field 'tags'"),
        (
            "pack_feature",
            {"default_value": "x"},
            {"ids": np.zeros(1, np.int64)},
            "'default_value' must be an int",
        ),
        ("frobnicate", {}, {}, "unknown op 'frobnicate'"),
    ]
    for op, meta, arrays, message in cases:
        with pytest.raises(RemoteError) as info:
            raw.call(op, meta, arrays)
        assert message in str(info.value), (op, str(info.value))

    # Malformed frames on a raw socket, then an oversized frame that cuts that peer off.
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    set_credentials(sock, load_token())  # past the handshake, no token in the header
    sock.connect(server.endpoint)
    try:
        sock.send_multipart([b"\xc1not msgpack"])
        assert "not valid msgpack" in wire.decode(sock.recv_multipart()).header["error"]["message"]
        head = msgpack.packb(
            {
                "v": 1,
                "op": "sample_ids",
                "id": 1,
                "auth": load_token(),
                "arrays": [["dedup", "<i8", [4]]],
            }
        )
        sock.send_multipart([head, b"\0" * 3])
        assert "needs 32 bytes" in wire.decode(sock.recv_multipart()).header["error"]["message"]
    finally:
        sock.close(linger=0)
    with wire.RpcClient(server.endpoint, timeout_s=2, max_message_bytes=1 << 30) as big:
        # above the server's 4 MiB cap: dropped unread, the connection cut (told at once)
        with pytest.raises(ServiceUnavailable, match="dropped"):
            big.call(
                "sample_ids",
                {},
                {"dedup": np.zeros(1 << 20, np.int64), "cnts": np.zeros(1 << 20, np.int64)},
            )

    with client(server) as s:
        assert s.ping()["generation"] == generation  # nothing replaced the good table
        ids = s.sample_ids(torch.tensor([0]), 50, torch.tensor([0]))
        assert ((ids % 100) == 0).all() and (ids < 1_000_000).all()
    raw.close()


def test_no_table_yet_is_a_clear_error(server):
    with client(server) as s:
        with pytest.raises(NoTable, match="call reload"):
            s.sample_ids(torch.tensor([1]), 2, torch.tensor([0]))


def test_server_death_gives_a_clear_error_and_a_new_client_restarts_it(short_dir):
    """Without recovery (``reconnect_timeout_s=0``; test_sampler_restart.py has it on)."""
    endpoint = f"ipc://{short_dir}/auto.sock"
    first = LocalRpcDataSampler(*TAGS, endpoint=endpoint, timeout_s=30, reconnect_timeout_s=0)
    pid = first.server_pid
    try:
        first.reload(table(100))
        assert first.sample_ids(torch.tensor([0]), 5, torch.tensor([0])).numel() == 5
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(SamplerUnavailable, match="died.*; create a new LocalRpcDataSampler"):
            first.sample_ids(torch.tensor([0]), 5, torch.tensor([0]))
        assert time.monotonic() - started < 10  # noticed long before the 30 s timeout
        second = LocalRpcDataSampler(*TAGS, endpoint=endpoint)
        assert second.server_pid != pid
        with pytest.raises(NoTable):
            second.sample_ids(torch.tensor([0]), 5, torch.tensor([0]))
        second.reload(table(100))
        assert second.sample_ids(torch.tensor([0]), 5, torch.tensor([0])).numel() == 5
        stop_server(second.server_pid)
        second.close()
    finally:
        first.close()
        stop_server(pid)


def test_racing_clients_start_exactly_one_server(short_dir):
    endpoint = f"ipc://{short_dir}/race.sock"
    ctx = spawn()
    barrier = ctx.Manager().Barrier(3)
    with ctx.Pool(3) as pool:
        pids = pool.starmap(sampler_workers.construct_client, [(endpoint, barrier)] * 3)
    try:
        assert len(set(pids)) == 1
        # Exactly one server process serves this endpoint.
        servers = [
            p for p in os.listdir("/proc") if p.isdigit() and endpoint.encode() in _cmdline(p)
        ]
        assert servers == [str(pids[0])]
    finally:
        stop_server(pids[0])


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_metrics_are_exposed(server):
    with client(server) as s:
        s.reload(table())
        s.sample_ids(torch.tensor([0, 100]), 10, torch.tensor([0, 1]))
        with pytest.raises(BadTable):
            s.reload({"item": [1]})
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    values = {}
    for line in body.splitlines():
        if line.startswith("streamrec_sampler_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values['streamrec_sampler_requests_total{op="sample_ids"}'] == 1
    assert values['streamrec_sampler_requests_total{op="reload"}'] == 2
    assert values['streamrec_sampler_errors_total{code="bad_table",op="reload"}'] == 1
    assert values["streamrec_sampler_negatives_sampled_total"] == 20
    assert values["streamrec_sampler_table_rows"] == N_ITEMS
    assert values["streamrec_sampler_table_categories"] == 5
    assert values["streamrec_sampler_reloads_total"] == 1
    assert values["streamrec_sampler_reload_seconds_count"] == 1
    assert values['streamrec_sampler_request_seconds_count{op="sample_ids"}'] == 1


def test_parquet_reload_pack_feature_and_valid_ids(server, tmp_path):
    path = tmp_path / "neg.parquet"
    pq.write_table(
        pa.table(
            {
                "item": pa.array([10, 20, 30], pa.int64()),
                "cat": pa.array([[1], [1], [2]], pa.list_(pa.int64())),
                "w": pa.array([1.0, 2.0, 3.0], pa.float64()),
                "skey": pa.array(["", "b", "cé"]),
                "tags": pa.array([[5, 6], [], [7]], pa.list_(pa.int32())),
            }
        ),
        path,
    )
    with client(server) as s:
        info = s.reload(str(path))
        assert info["rows"] == 3 and info["categories"] == 2
        assert s.valid_sample_ids(torch.tensor([10, 99, 30]), 7).tolist() == [10, 7, 30]
        packed = s.pack_feature(torch.tensor([30, 99, 10]), default_value=20)
        assert packed["item"].tolist() == [30, 20, 10]
        assert packed["cat"].to_list() == [[2], [1], [1]]
        assert packed["w"].tolist() == [3.0, 2.0, 1.0]
        assert packed["tags"].to_list() == [[7], [], [5, 6]]
        assert packed["tags"].dtype == torch.int32
        skey = packed["skey"]
        assert [bytes(skey.row(i).numpy()).decode() for i in range(3)] == ["cé", "b", ""]
        with pytest.raises(BadTable, match="cannot read as Parquet"):
            s.reload(str(tmp_path / "missing.parquet"))


def test_seed_example_runs_with_only_the_imports_changed(server):
    """The seed's neg_sampling_fn, verbatim, in the prefetch pipeline."""
    sample_tag, dedup_tag, weight_tag, skey_name = TAGS
    sample_size = 5
    neg_sampler = LocalRpcDataSampler(
        sample_tag, dedup_tag, weight_tag, skey_name, endpoint=server.endpoint
    )
    neg_sampler.reload(table())

    neg_sampling_fn = seed_neg_sampling_fn(neg_sampler, sample_tag, dedup_tag, sample_size)

    def batches():
        rng = np.random.default_rng(0)
        for _ in range(6):
            j = rng.integers(0, N_ITEMS, 32)
            ones = torch.ones(32, dtype=torch.int64)
            yield [
                {
                    dedup_tag: RaggedTensor.from_lengths(torch.from_numpy(j * 100 + j % 5), ones),
                    sample_tag: RaggedTensor.from_lengths(torch.from_numpy(j % 5), ones),
                    "user_id": RaggedTensor.from_lengths(torch.arange(32) + 9000, ones),
                },
                {"request": "kept"},
            ]

    seen = 0
    for combined in prefetch(batches(), neg_sampling_fn, depth=2):
        features = combined[0]
        assert combined[1] == {"request": "kept"}
        items = features[dedup_tag].numpy()
        assert items.shape == (32 * sample_size,)
        label = features["label"].reshape(32, sample_size)
        assert (label[:, 0] == 1).all() and (label[:, 1:] == 0).all()
        grid = items.reshape(32, sample_size)
        assert ((grid % 100) == (grid[:, :1] % 100)).all()  # negatives share the category
        assert not (grid[:, 1:] == grid[:, :1]).any()
        users = features["user_id"].values().reshape(32, sample_size)
        assert (users == users[:, :1]).all()  # user side repeated for the negatives
        assert features["price"].shape == (32 * sample_size,)
        seen += 1
    assert seen == 6
    neg_sampler.close()


def test_cli_ping_and_bad_flags(server):
    env = dict(os.environ, STREAMREC_SAMPLER_ENDPOINT=server.endpoint)
    out = subprocess.run(
        [sys.executable, "-m", "streamrec.sampler", "ping"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and f'"pid": {server.proc.pid}' in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "streamrec.sampler", "serve", "--endpoint", server.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "another sampler server" in out.stderr
    # a bad flag is refused before anything starts: through main() in this process
    out = run_main(
        sampler_main.main, ["serve", "--workers", "0", "--endpoint", "ipc:///tmp/x.sock"]
    )
    assert out.returncode == 2 and "workers" in out.stderr and "got 0" in out.stderr


def test_tcp_endpoint_with_auto_start():
    from sampler_workers import free_port
    from streamrec.sampler.config import lock_base

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    s = LocalRpcDataSampler(*TAGS, endpoint=endpoint)
    try:
        s.reload(table(50))
        ids = s.sample_ids(torch.tensor([0, 101]), 4, torch.tensor([0, 1]))
        assert ids.shape == (8,) and ((ids[:4] % 100) == 0).all() and ((ids[4:] % 100) == 1).all()
    finally:
        stop_server(s.server_pid)
        s.close()
        for suffix in (".lock", ".start", ".log"):
            Path(f"{lock_base(endpoint)}{suffix}").unlink(missing_ok=True)
