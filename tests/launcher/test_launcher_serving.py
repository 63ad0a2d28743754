"""`streamrec up` runs a serving Redis of its own for online exports (its own port, directory
and password, new every run), allowed in the API, the default of a job that names none, and
trusted by the trainers; ``--online-redis-url`` names another instead."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import redis
from servers import wait_for
from streamrec.api.__main__ import build_parser as api_parser
from streamrec.api.config import Settings
from streamrec.control.redis_io import ONLINE_PASSWORD_FILE_ENV, with_password
from streamrec.launcher.__main__ import build_parser, check_args
from streamrec.launcher.errors import StackError
from streamrec.launcher.serving import SERVING
from streamrec.launcher.stack import Stack
from streamrec.trainer.agent.cli import build_parser as agent_parser
from streamrec.trainer.agent.cli import job_guard


def stack_in(tmp_path: Path, *flags: str, out: io.StringIO | None = None) -> Stack:
    args = build_parser().parse_args(["up", "--run-dir", str(tmp_path / "run"), *flags])
    check_args(args)
    return Stack(args, out or io.StringIO())


def api_settings(stack: Stack) -> Settings:
    """The settings the stack's serving flags give the API (auth off: no token file here)."""
    parsed = vars(api_parser().parse_args(["serve", *stack.serving.api_args()]))
    overrides = {k: v for k, v in parsed.items() if k in Settings.model_fields and v is not None}
    return Settings.load({**overrides, "auth_disabled": True}, env={})


def test_the_api_and_the_trainers_are_given_the_serving_redis(tmp_path: Path) -> None:
    stack = stack_in(tmp_path)
    url = stack.serving.url
    assert url.startswith("redis://127.0.0.1:") and url != stack.redis_url
    settings = api_settings(stack)
    assert settings.online_redis_urls == [url] and settings.default_online_redis_url == url
    trainer = stack.trainer_args("trainers-0")
    agent = trainer[trainer.index("streamrec.trainer.agent") + 1 :]
    assert list(job_guard(agent_parser().parse_args(agent)).online_redis_urls) == [url]
    assert stack.serving.trainer_env() == {
        ONLINE_PASSWORD_FILE_ENV: str(stack.run / "serving-redis-password")
    }
    stack.run.mkdir(parents=True)
    stack.record()
    state = json.loads((stack.run / "stack.json").read_text())
    assert state["online_redis_url"] == url
    assert state["online_redis_password_file"] == str(stack.run / "serving-redis-password")


@pytest.mark.timeout(60)
def test_its_own_serving_redis_asks_for_a_password_of_its_own(tmp_path: Path) -> None:
    out = io.StringIO()
    stack = stack_in(tmp_path, "--max-restarts", "1", out=out)
    stack.prepare()
    password_file = stack.run / "serving-redis-password"
    password = password_file.read_text().strip()
    assert len(password) >= 32 and password_file.stat().st_mode & 0o077 == 0
    assert password != stack.redis_password_file.read_text().strip()
    try:
        stack.start_serving_redis()  # waits for an authenticated PING
        child = stack.children[SERVING]
        assert not any(password in arg for arg in child.args)  # in its config file only
        assert stack.serving.url in out.getvalue() and password not in out.getvalue()
        anonymous = redis.Redis.from_url(stack.serving.url, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("served:version", "x")
        anonymous.close()
        # the control plane's password does not open it
        other = redis.Redis.from_url(with_password(stack.serving.url, stack.redis_password_file))
        with pytest.raises(redis.AuthenticationError):
            other.ping()
        other.close()
        authed = redis.Redis.from_url(with_password(stack.serving.url, password_file))
        assert authed.set("served:version", "1")
        authed.close()
        # killed, it comes back from its append-only file at the same address
        assert child.proc is not None
        child.proc.kill()
        wait_for(lambda: child.exited() is not None, 10, 0.05, what="serving redis killed")
        stack.check_children()
        assert child.restarts == 1 and "restarted serving-redis" in out.getvalue()
        authed = redis.Redis.from_url(with_password(stack.serving.url, password_file))
        assert authed.get("served:version") == b"1"
        authed.close()
    finally:
        stack.down()


def test_online_redis_url_names_another_and_starts_none(tmp_path: Path) -> None:
    secret = tmp_path / "serving-password"
    secret.write_text("elsewhere-secret\n")
    url = "redis://serving.example:6379/2"
    out = io.StringIO()
    stack = stack_in(
        tmp_path, "--online-redis-url", url, "--online-redis-password-file", str(secret), out=out
    )
    assert not stack.serving.owned and stack.serving.url == url
    assert stack.serving.trainer_env() == {ONLINE_PASSWORD_FILE_ENV: str(secret)}
    assert api_settings(stack).default_online_redis_url == url
    stack.prepare()
    assert not (stack.run / "serving-redis-password").exists()
    stack.start_serving_redis()
    assert SERVING not in stack.children and "not started" in out.getvalue()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--online-redis-url", "redis://:pw@host:6379/0"], "without a password"),
        (["--online-redis-url", "http://host:6379/0"], "must be redis://host:port/db"),
        (["--online-redis-password-file", "/x"], "needs --online-redis-url"),
    ],
)
def test_bad_online_redis_flags_are_refused_by_name(tmp_path: Path, flags, message) -> None:
    with pytest.raises(StackError, match=message):
        stack_in(tmp_path, *flags)
