"""`streamrec up` closes the control plane's doors too: Redis asks for a password that is new
every run and in no command line, the API and the trainers are told it and the run's sampler
and roots, and --keep-running keeps restarting what dies after the job."""

from __future__ import annotations

import io
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from streamrec.api.__main__ import build_parser as api_parser
from streamrec.control.redis_io import PASSWORD_FILE_ENV, with_password
from streamrec.launcher import commands
from streamrec.launcher.__main__ import build_parser
from streamrec.launcher.stack import Stack
from streamrec.trainer.agent.cli import build_parser as agent_parser
from streamrec.trainer.agent.cli import job_guard


def flag_values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]


def stack_in(tmp_path: Path, out: io.StringIO | None = None) -> Stack:
    return Stack(build_parser().parse_args(["up", "--run-dir", str(tmp_path / "run")]), out)


def test_trainers_and_api_are_given_the_runs_roots_sampler_and_shards(tmp_path: Path) -> None:
    stack = stack_in(tmp_path)
    trainer = stack.trainer_args("trainers-0")
    assert flag_values(trainer, "--model-root") == [str(stack.run / "models")]
    assert flag_values(trainer, "--data-root") == [str(stack.run / "data")]
    assert flag_values(trainer, "--sampler-endpoint") == [stack.sampler_endpoint]
    # the peer token goes to the run's shards only (streamrec.trainer.agent.job_guard)
    assert stack.store_endpoints
    assert flag_values(trainer, "--store-endpoint") == stack.store_endpoints
    agent = trainer[trainer.index("streamrec.trainer.agent") + 1 :]
    guard = job_guard(agent_parser().parse_args(agent))
    assert guard.enforce and list(guard.store_endpoints) == stack.store_endpoints
    api = commands.api_command(
        1, "redis://x", tmp_path / "t", tmp_path, tmp_path, [], ["ipc:///s.sock"]
    )
    assert flag_values(api, "--sampler-endpoint") == ["ipc:///s.sock"]
    # reads need the token too, whatever the API's default
    served = api_parser().parse_args(api[1:])
    assert served.auth_reads is True and not served.auth_disabled


def test_each_run_gets_a_new_private_redis_password_in_no_command_line(tmp_path: Path) -> None:
    stack = stack_in(tmp_path)
    stack.prepare()
    first = stack.redis_password_file.read_text().strip()
    assert len(first) >= 32
    for f in (stack.redis_password_file, stack.run / "redis.conf"):
        assert f.stat().st_mode & 0o077 == 0, f
    cmd = commands.redis_command(1, stack.run / "redis", stack.run / "redis.conf")
    assert not any(first in arg for arg in cmd)
    stack_in(tmp_path).prepare()
    assert stack.redis_password_file.read_text().strip() != first
    probe = ["sh", "-c", f'echo "${PASSWORD_FILE_ENV}"']
    child = stack.add("probe", probe, restartable=False)
    assert child.proc is not None and child.proc.wait(10) == 0
    assert child.output().strip() == str(stack.redis_password_file)  # every child is told


@pytest.mark.timeout(60)
def test_the_stacks_redis_refuses_a_client_without_the_password(tmp_path: Path) -> None:
    out = io.StringIO()
    stack = stack_in(tmp_path, out)
    stack.prepare()
    try:
        stack.start_redis()  # waits for an authenticated PING
        password = stack.redis_password_file.read_text().strip()
        assert password not in out.getvalue()  # said where it is, never what
        anonymous = redis.Redis.from_url(stack.redis_url, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("job", "rewritten")
        anonymous.close()
        authed = redis.Redis.from_url(with_password(stack.redis_url, stack.redis_password_file))
        assert authed.set("job", "ok") and authed.get("job") == b"ok"
        authed.close()
    finally:
        stack.down()


@pytest.mark.timeout(60)
def test_keep_running_restarts_a_service_that_dies_after_the_job(tmp_path: Path) -> None:
    out = io.StringIO()
    stack = stack_in(tmp_path, out)
    stack.run.mkdir(parents=True)
    (stack.run / "logs").mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    sampler = stack.add("sampler", sleeper, restartable=True)
    first = sampler.pid
    supervisor = threading.Thread(target=stack.supervise, daemon=True)
    supervisor.start()
    try:
        assert sampler.proc is not None
        sampler.proc.kill()
        t0 = time.monotonic()
        while "restarted sampler" not in out.getvalue() and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert sampler.restarts == 1 and sampler.pid != first and sampler.exited() is None
        assert "restarted sampler (restart 1)" in out.getvalue()
    finally:
        stack._stopping = True
        supervisor.join(timeout=10)
        stack.down()
    assert not supervisor.is_alive()
