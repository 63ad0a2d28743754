"""No open doors, the shared parts: the peer token, bounded quoting, path roots, and the data
listing that does not follow symlinks out of the data root."""

from __future__ import annotations

import os
import threading

import pytest
from streamrec import layout
from streamrec.auth import (
    MIN_TOKEN_CHARS,
    TOKEN_FILE_ENV,
    load_token,
    read_token,
    token_file,
    token_matches,
    write_token_file,
)
from streamrec.errors import BadRequest, PathRefused, RemoteError, quote
from streamrec.roots import confine, resolve_roots
from streamrec.wire import MAX_ERROR_CHARS, RpcClient, RpcServer
from unauthenticated import raw_call

TOKEN = "a-test-token-of-32-characters-xx"


# ---- quote ---------------------------------------------------------------------------------


def test_quote_keeps_short_values_and_bounds_long_ones():
    assert quote("abc") == "'abc'"
    assert quote("x" * 1000, limit=5) == "'xxxxx'... (1000 chars)"
    assert quote(b"\x00" * 300, limit=2) == "b'\\x00\\x00'... (300 bytes)"
    huge = list(range(1_000_000))
    assert len(quote(huge)) <= 220
    assert len(quote({"k": "v" * 10_000})) <= 220


# ---- token files ---------------------------------------------------------------------------


def test_token_file_is_written_once_private_and_read_back(tmp_path):
    path = write_token_file(tmp_path / "sub" / "token")
    token = read_token(path)
    assert len(token) >= MIN_TOKEN_CHARS
    assert path.stat().st_mode & 0o077 == 0
    assert read_token(write_token_file(path)) == token  # a second writer keeps the first token
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temporary file left


def test_racing_writers_agree_on_one_token(tmp_path):
    path = tmp_path / "token"
    tokens: list[str] = []

    def write() -> None:
        tokens.append(read_token(write_token_file(path)))

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(tokens) == 8 and len(set(tokens)) == 1


@pytest.mark.parametrize(
    "content,match",
    [
        (b"short\n", "at least 16"),
        (b"\xff" * 20, "not ASCII"),
        (b"x" * 5000, "larger than"),
    ],
)
def test_bad_token_files_are_refused_by_name(tmp_path, content, match):
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(BadRequest, match=match):
        read_token(path)
    with pytest.raises(BadRequest, match="cannot read"):
        read_token(tmp_path / "missing")


def test_token_file_order_explicit_then_env_then_per_user(tmp_path, monkeypatch):
    explicit = tmp_path / "explicit"
    explicit.write_text(TOKEN)
    env = tmp_path / "env"
    env.write_text("b" * 20)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(env))
    assert token_file(explicit) == explicit
    assert load_token() == "b" * 20
    monkeypatch.delenv(TOKEN_FILE_ENV)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert token_file() == tmp_path / "xdg" / "streamrec" / "auth-token"
    assert len(load_token()) >= MIN_TOKEN_CHARS


def test_token_matches_only_the_same_string():
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN, TOKEN[:-1] + "y")
    assert not token_matches(TOKEN, None)
    assert not token_matches(TOKEN, 12345)
    assert not token_matches(TOKEN, "\udcff")  # a lone surrogate does not crash the check


# ---- the token on the wire -----------------------------------------------------------------


@pytest.fixture
def guarded_server():
    """An RpcServer over a real socket that needs TOKEN; ``echo`` returns its meta."""
    server = RpcServer(
        "tcp://127.0.0.1:*", {"echo": lambda meta, arrays: (meta, {})}, token=TOKEN
    ).start()
    yield server
    server.stop()


def test_requests_without_or_with_a_wrong_token_are_refused(guarded_server):
    endpoint = guarded_server.endpoint
    for header in (
        {"op": "echo", "id": 1},  # no token at all
        {"op": "echo", "id": 2, "auth": "wrong-token-of-the-same-size-xxx"},
        {"op": "echo", "id": 3, "auth": 7},
        {"op": "x" * 100_000, "id": 4},  # nor does an unknown op get the op list
    ):
        reply = raw_call(endpoint, header, TOKEN)
        assert reply["ok"] is False and reply["error"]["code"] == "unauthorized", reply
        assert "auth token" in reply["error"]["message"]
        assert "echo" not in reply["error"]["message"]
    with RpcClient(endpoint, timeout_s=5, token="wrong-token-of-the-same-size-xxx") as bad:
        with pytest.raises(RemoteError) as err:
            bad.call("echo", {"a": 1})
        assert err.value.code == "unauthorized"
    with RpcClient(endpoint, timeout_s=5, token=TOKEN) as good:  # and it keeps serving
        assert good.call("echo", {"a": 1})[0] == {"a": 1}


def test_a_huge_op_name_is_quoted_bounded(guarded_server):
    reply = raw_call(
        guarded_server.endpoint, {"op": "x" * 5_000_000, "id": 1, "auth": TOKEN}, TOKEN
    )
    assert reply["error"]["code"] == "unknown_op"
    message = reply["error"]["message"]
    assert len(message) < 400 and "(5000000 chars)" in message and "known ops: echo" in message


def test_error_replies_are_capped(guarded_server):
    def loud(meta, arrays):
        raise ValueError("y" * 100_000)

    guarded_server.handlers["loud"] = loud
    with RpcClient(guarded_server.endpoint, timeout_s=5, token=TOKEN) as c:
        with pytest.raises(RemoteError) as err:
            c.call("loud")
    assert len(err.value.remote_message) < MAX_ERROR_CHARS + 100
    assert "message cut" in err.value.remote_message


# ---- roots ---------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "models"
    (root / "day").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link-out").symlink_to(outside)
    (root / "link-in").symlink_to(root / "day")
    return root, outside


def test_confine_accepts_paths_under_a_root(tree):
    root, _ = tree
    roots = resolve_roots([root])
    assert confine("path", str(root / "day" / "1"), roots) == root / "day" / "1"
    assert confine("path", str(root / "link-in" / "1"), roots) == root / "day" / "1"
    assert confine("path", str(root), roots) == root


@pytest.mark.parametrize(
    "value,match",
    [
        ("{root}/../outside/x", "outside the allowed roots"),
        ("{root}/link-out/x", "outside the allowed roots"),
        ("/etc/passwd", "outside the allowed roots"),
        ("relative/path", "must be an absolute path"),
    ],
)
def test_confine_refuses_escapes(tree, value, match):
    root, _ = tree
    with pytest.raises(PathRefused, match=match) as err:
        confine("path", value.format(root=root), resolve_roots([root]))
    assert "field 'path'" in str(err.value)


def test_confine_refuses_bad_values_and_everything_without_roots(tree):
    root, _ = tree
    for bad in ("", None, 5, "a\0b"):
        with pytest.raises(BadRequest, match="field 'path'"):
            confine("path", bad, resolve_roots([root]))
    with pytest.raises(PathRefused, match="no --model-root"):
        confine("path", str(root / "day"), [])
    with pytest.raises(PathRefused) as err:
        confine("path", "/" + "a" * 100_000, resolve_roots([root]))
    assert len(str(err.value)) < 600


# ---- the data listing ----------------------------------------------------------------------


def test_pass_files_skip_symlinks_out_of_the_data_root(tmp_path):
    data = tmp_path / "data"
    split = data / "20190720" / "0000"
    split.mkdir(parents=True)
    (split / "part-0").write_text("1\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root\n")
    (split / "part-1").symlink_to(secret / "passwd")  # a file link out
    (split / "part-2").symlink_to(split / "part-0")  # a link that stays inside
    (data / "20190720" / "0006").symlink_to(secret)  # a split directory link out
    spec = layout.PassSpec("20190720", 1, ("0000", "0006"))
    skipped: list = []
    files = layout.pass_files(data, spec, "DONE", skipped=skipped)
    assert [p.name for p in files] == ["part-0", "part-2"]
    assert sorted(skipped) == [split / "part-1", data / "20190720" / "0006"]
    assert os.path.exists(secret / "passwd")  # listed nowhere, untouched
