"""The wire protocol against a real RpcServer over real ZeroMQ sockets."""

import contextlib
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq
from streamrec import wire
from streamrec.errors import BadRequest, RemoteError, RpcTimeout, ServiceUnavailable
from streamrec.handshake import FAILED_EVENTS, connection_events, set_credentials


def echo(meta, arrays):
    return {"seen": meta}, {k: v * 2 for k, v in arrays.items()}


def boom(meta, arrays):
    raise RuntimeError("exploded")


@pytest.fixture
def server():
    srv = wire.RpcServer(
        "tcp://127.0.0.1:*", {"echo": echo, "boom": boom}, workers=2, max_message_bytes=1 << 20
    ).start()
    yield srv
    srv.stop()


def test_round_trip_arrays_and_meta(server):
    with wire.RpcClient(server.endpoint, timeout_s=5) as client:
        keys = np.arange(10, dtype=np.int64)
        meta, arrays = client.call(
            "echo", {"a": 1, "b": "x"}, {"keys": keys, "w": np.ones((2, 3), np.float32)}
        )
        assert meta == {"seen": {"a": 1, "b": "x"}}
        np.testing.assert_array_equal(arrays["keys"], keys * 2)
        assert arrays["w"].shape == (2, 3) and arrays["w"].dtype == np.float32


def test_errors_are_structured_and_server_keeps_serving(server):
    with wire.RpcClient(server.endpoint, timeout_s=5) as client:
        with pytest.raises(RemoteError) as info:
            client.call("nope")
        assert info.value.code == "unknown_op" and "nope" in str(info.value)
        with pytest.raises(RemoteError) as info:
            client.call("boom")
        assert info.value.code == "internal" and "exploded" in str(info.value)
        assert client.call("echo", {"x": 1})[0] == {"seen": {"x": 1}}


def test_malformed_and_oversized_frames_refused(server):
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    set_credentials(raw, "any-password")  # the server runs without a token: any passes
    raw.connect(server.endpoint)
    try:
        raw.send_multipart([b"\xc1garbage"])
        reply = wire.decode(raw.recv_multipart())
        assert reply.header["ok"] is False and "msgpack" in reply.header["error"]["message"]
        head = msgpack.packb({"v": 1, "op": "echo", "id": 3, "arrays": [["k", "<i8", [4]]]})
        raw.send_multipart([head, b"\0" * 8])  # 8 bytes where 32 are described
        reply = wire.decode(raw.recv_multipart())
        assert "needs 32 bytes" in reply.header["error"]["message"]
        head = msgpack.packb({"v": 1, "op": "echo", "id": 4, "arrays": [["k", "|O", [1]]]})
        raw.send_multipart([head, b"\0" * 8])
        reply = wire.decode(raw.recv_multipart())
        assert "not allowed" in reply.header["error"]["message"]
    finally:
        raw.close(linger=0)
    # Client-side cap: refused before anything is sent.
    with wire.RpcClient(server.endpoint, timeout_s=5, max_message_bytes=1 << 10) as small:
        with pytest.raises(BadRequest, match="exceeds the cap"):
            small.send("echo", None, {"big": np.zeros(1 << 12, np.uint8)})
    # A peer that sends more than the server's cap is cut off (told at once: the connection
    # dropped with its request in flight); others keep being served.
    with wire.RpcClient(server.endpoint, timeout_s=5, max_message_bytes=1 << 22) as big:
        with pytest.raises(ServiceUnavailable, match="dropped"):
            big.call("echo", None, {"big": np.zeros(1 << 21, np.uint8)})
    with wire.RpcClient(server.endpoint, timeout_s=5) as client:
        assert client.call("echo", {"y": 2})[0] == {"seen": {"y": 2}}


def test_object_arrays_never_sent():
    with pytest.raises(BadRequest, match="cannot cross the wire"):
        wire.encode({"op": "x"}, None, {"o": np.array([object()])})


def test_timeout_when_no_server():
    with wire.RpcClient("tcp://127.0.0.1:1", timeout_s=0.2) as client:
        with pytest.raises(RpcTimeout, match="no reply"):
            client.call("echo")


def test_replies_in_any_order_reach_their_receive():
    """Two requests in flight to a server with two workers: the first is slow, so its reply
    comes second; each receive still gets its own reply (and an error stays with its id)."""
    import threading

    first_started = threading.Event()

    def slow(meta, arrays):
        first_started.set()
        time.sleep(0.3)
        return {"who": "slow"}, {}

    def fast(meta, arrays):
        first_started.wait(5)
        return {"who": "fast"}, {}

    srv = wire.RpcServer(
        "tcp://127.0.0.1:*", {"slow": slow, "fast": fast, "boom": boom}, workers=2
    ).start()
    try:
        with wire.RpcClient(srv.endpoint, timeout_s=5) as client:
            a, b = client.send("slow"), client.send("fast")
            assert client.receive(a)[0] == {"who": "slow"}  # the fast reply came first, kept
            assert client.receive(b)[0] == {"who": "fast"}
            first_started.clear()
            a, b = client.send("slow"), client.send("boom")
            with pytest.raises(RemoteError, match="exploded"):
                client.receive(b)
            assert client.receive(a)[0] == {"who": "slow"}
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "shape,buffer",
    [
        ([False], b""),  # a bool is not a dimension (numpy raised TypeError)
        ([0, 2**62], b""),  # empty, but too large for numpy (ValueError)
        ([2**32, 2**32], b""),  # wrapped to 0 bytes in int64 arithmetic
        ([1] * 33, b"\0" * 8),  # more dimensions than MAX_DIMS
        ([2**64 - 1], b"\0" * 8),
    ],
)
def test_shapes_found_by_the_fuzzer_are_refused(shape, buffer):
    """Crashes tests/fuzz/fuzz_wire.py found: each is a BadRequest now, nothing else."""
    head = msgpack.packb({"v": 1, "op": "echo", "id": 1, "arrays": [["k", "<i8", shape]]})
    with pytest.raises(BadRequest, match="bad shape"):
        wire.decode([head, buffer])


TOKEN = "the-peer-token-of-this-test-0123"


def test_no_message_of_a_peer_without_the_token_is_read():
    """The token is checked in the handshake: a peer without PLAIN credentials, or with a
    wrong token, gets no message to a handler (nor a reply); an RpcClient with a wrong token
    is told ``unauthorized`` at once instead of timing out."""
    calls = []
    srv = wire.RpcServer(
        "tcp://127.0.0.1:*", {"echo": lambda m, a: calls.append(m) or (m, {})}, token=TOKEN
    ).start()
    ctx = zmq.Context.instance()
    try:
        for password in (None, "wrong-token-of-the-same-size-xx"):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if password is not None:
                set_credentials(sock, password)
            monitor = sock.get_monitor_socket(FAILED_EVENTS)
            sock.connect(srv.endpoint)
            head = {"op": "echo", "id": 1, "auth": TOKEN}  # the header's token is not enough
            # not blocking: once the refused handshake has dropped the connection, a DEALER
            # has no peer to queue for, and a blocking send would wait for ever
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(wire.encode(head, {"x": 1}, None), flags=zmq.NOBLOCK)
            assert monitor.poll(10_000), "the handshake was not refused"
            assert connection_events(monitor)[0] >= 1
            assert not sock.poll(200)
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
        started = time.monotonic()
        with wire.RpcClient(srv.endpoint, timeout_s=20, token="x" * 32) as bad:
            with pytest.raises(RemoteError) as err:
                bad.call("echo", {"x": 2})
        assert err.value.code == "unauthorized" and "handshake" in str(err.value)
        assert time.monotonic() - started < 10  # told, not timed out
        with wire.RpcClient(srv.endpoint, timeout_s=5, token=TOKEN) as good:
            assert good.call("echo", {"x": 3})[0] == {"x": 3}
        assert calls == [{"x": 3}]
    finally:
        srv.stop()


def test_a_client_refused_while_idle_is_told_not_blocked():
    """A client whose handshake was refused before its first request: the refusal dropped
    the connection, and a DEALER without one blocks a send for ever (seen in 6 of 10 raw
    sockets here); the client's send waits at most its timeout for a connection, and a
    refusal seen while idle is reported at once (it was after the whole timeout)."""
    srv = wire.RpcServer("tcp://127.0.0.1:*", {"echo": echo}, token=TOKEN).start()
    try:
        for _ in range(5):
            with wire.RpcClient(srv.endpoint, timeout_s=20, token="w" * 32) as bad:
                time.sleep(0.3)  # the handshake refused, the connection gone
                started = time.monotonic()
                with pytest.raises(RemoteError) as err:
                    bad.call("echo", {"x": 1})
                assert err.value.code == "unauthorized"
                assert time.monotonic() - started < 10  # told, not timed out
    finally:
        srv.stop()


def test_a_wrong_header_token_is_refused_before_the_body_is_decoded():
    """Past the handshake, a header without the token is answered ``unauthorized`` whatever
    its buffers hold: they are not decoded (a bad descriptor is not even reported)."""
    srv = wire.RpcServer("tcp://127.0.0.1:*", {"echo": echo}, token=TOKEN).start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    set_credentials(sock, TOKEN)
    sock.connect(srv.endpoint)
    try:
        head = msgpack.packb({"v": 1, "op": "echo", "id": 1, "arrays": [["k", "<i8", [4]]]})
        sock.send_multipart([head, b"\0" * 3])  # 3 bytes where 32 are described
        assert sock.poll(10_000)
        reply = wire.decode(sock.recv_multipart())
        assert reply.header["error"]["code"] == "unauthorized"
        big = msgpack.packb({"v": 1, "op": "echo", "id": 2, "auth": "y" * (17 << 20)})
        sock.send_multipart([big])
        assert sock.poll(10_000)
        reply = wire.decode(sock.recv_multipart())
        assert reply.header["error"]["code"] == "bad_request"
        assert "header frame of" in reply.header["error"]["message"]
    finally:
        sock.close(linger=0)
        srv.stop()


SLOW_SERVER = """
import sys, time
from streamrec import wire
srv = wire.RpcServer(
    "tcp://127.0.0.1:*", {"slow": lambda m, a: (time.sleep(60), (m, {}))[1]}, token=sys.argv[1]
).start()
print(srv.endpoint, flush=True)
time.sleep(120)
"""


def test_a_server_that_dies_with_a_request_in_flight_is_seen_at_once() -> None:
    """The server process is killed while it works on a request: the client raises
    ``ServiceUnavailable`` as the connection drops, long before its 60 s timeout (a store
    shard restarted empty is then told apart at the next request)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SERVER, TOKEN], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        with wire.RpcClient(endpoint, timeout_s=60, token=TOKEN) as client:
            request = client.send("slow", {"x": 1})
            time.sleep(0.5)  # the request is in the server's hands
            proc.kill()
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable, match="dropped with 1 request"):
                client.receive(request)
            assert time.monotonic() - started < 10
    finally:
        proc.kill()
        proc.wait(timeout=10)
