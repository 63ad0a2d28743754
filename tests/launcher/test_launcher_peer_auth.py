"""The launcher closes the doors it opens: one fresh peer token per run, given to every child,
the shards confined to the run's model root, the API to the run's store endpoints."""

from __future__ import annotations

from pathlib import Path

from streamrec.auth import TOKEN_FILE_ENV, read_token
from streamrec.launcher import commands
from streamrec.launcher.__main__ import build_parser
from streamrec.launcher.stack import Stack


def flag_values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]


def test_commands_carry_roots_token_and_endpoints(tmp_path: Path) -> None:
    token = tmp_path / "peer-token"
    store = commands.store_command(
        0, 2, "tcp://127.0.0.1:1", tmp_path / "t.json", tmp_path / "models", token
    )
    assert flag_values(store, "--model-root") == [str(tmp_path / "models")]
    assert flag_values(store, "--auth-token-file") == [str(token)]
    assert "--insecure-no-auth" not in store
    sampler = commands.sampler_command("ipc:///x.sock", token)
    assert flag_values(sampler, "--auth-token-file") == [str(token)]
    api = commands.api_command(
        1, "redis://x", tmp_path / "api-token", tmp_path, tmp_path, ["tcp://a:1", "tcp://b:2"]
    )
    assert flag_values(api, "--store-endpoint") == ["tcp://a:1", "tcp://b:2"]


def test_each_run_gets_a_new_private_peer_token(tmp_path: Path) -> None:
    args = build_parser().parse_args(["up", "--run-dir", str(tmp_path / "run")])
    stack = Stack(args)
    stack.prepare()
    first = read_token(stack.peer_token_file)
    assert stack.peer_token_file.stat().st_mode & 0o077 == 0
    Stack(args).prepare()
    assert read_token(stack.peer_token_file) != first
    probe = ["sh", "-c", f'echo "${TOKEN_FILE_ENV}"']
    child = stack.add("probe", probe, restartable=False, env={"OMP_NUM_THREADS": "1"})
    assert child.proc is not None and child.proc.wait(10) == 0
    assert child.output().strip() == str(stack.peer_token_file)  # every child gets it
