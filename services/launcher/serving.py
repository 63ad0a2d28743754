"""The stack's serving Redis: where online exports publish the model (``online.redis_url``).

``streamrec up`` runs a redis-server of its own for it, apart from the control plane's Redis:
its own port, directory (``RUN/serving-redis``) and password (``RUN/serving-redis-password``,
new every run, mode 0600, in ``RUN/serving-redis.conf``, in no command line). Apart because
its readers differ: an online inference service reads the model with this password, which
must not also let it rewrite jobs in the control plane's Redis; and the model's rows, as big
as the tables, stay out of the memory the control plane's state lives in.
``--online-redis-url`` (with ``--online-redis-password-file`` where it asks for one) names
another serving Redis instead; none is started then.

The API allows the URL (``--online-redis-url``) and makes it the serving Redis of a job that
names none (``--default-online-redis-url``); the trainers trust it (``--online-redis-url``)
and read its password from ``$STREAMREC_ONLINE_REDIS_PASSWORD_FILE``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import redis
from streamrec.control import redis_io
from streamrec.control.redis_io import ONLINE_PASSWORD_FILE_ENV
from streamrec.launcher import commands
from streamrec.launcher.errors import StackError
from streamrec.process import free_port

#: The child's name in the stack's output and in ``stack.json``.
SERVING = "serving-redis"


@dataclass(frozen=True)
class ServingRedis:
    """The serving Redis of a run.

    Args:
        url: ``redis://host:port/db`` without a password (what jobs and the allow-lists name).
        password_file: the file holding its password (None: it takes none).
        port: the local port of the one the stack runs (None: ``url`` is another's).
    """

    url: str
    password_file: Path | None
    port: int | None

    @classmethod
    def of_run(
        cls, run: Path, url: str | None = None, password_file: str | None = None
    ) -> ServingRedis:
        """The stack's own on a free port (``url`` None), else the one ``url`` names."""
        if url is not None:
            return cls(url, None if password_file is None else Path(password_file), None)
        port = free_port()
        return cls(f"redis://127.0.0.1:{port}/0", run / "serving-redis-password", port)

    @property
    def owned(self) -> bool:
        """Whether the stack runs it (a child ``serving-redis``)."""
        return self.port is not None

    def prepare(self, run: Path) -> None:
        """Writes a new password and the config of the stack's own (nothing for another's)."""
        if self.port is None or self.password_file is None:
            return
        (run / SERVING).mkdir(parents=True, exist_ok=True)
        self.password_file.unlink(missing_ok=True)
        self.password_file.touch(mode=0o600)
        self.password_file.write_text(secrets.token_hex(24) + "\n")
        commands.redis_config(self.password_file, run / f"{SERVING}.conf")

    def command(self, run: Path) -> list[str]:
        """The stack's own's redis-server (append-only file under ``RUN/serving-redis``)."""
        assert self.port is not None, "not the stack's own serving Redis"
        return commands.redis_command(self.port, run / SERVING, run / f"{SERVING}.conf")

    def ping(self) -> bool:
        """Whether it answers a PING with its password (a StackError naming a bad file)."""
        try:
            url = (
                self.url
                if self.password_file is None
                else redis_io.with_password(self.url, self.password_file)
            )
        except ValueError as exc:
            raise StackError(f"--online-redis-password-file: {exc}") from None
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def __str__(self) -> str:
        """Its line in the stack's output (where the password is, never what)."""
        if self.port is None:
            return f"{self.url}  (--online-redis-url: not started)"
        return f"{self.url}  (online exports; password in {self.password_file})"

    def api_args(self) -> list[str]:
        """The API flags: allowed, and the serving Redis of a job that names none."""
        return ["--online-redis-url", self.url, "--default-online-redis-url", self.url]

    def trainer_args(self) -> list[str]:
        """The trainer agent's flag: a serving Redis a job may publish to."""
        return ["--online-redis-url", self.url]

    def trainer_env(self) -> dict[str, str]:
        """The trainers' environment: where its password is (none: nothing)."""
        if self.password_file is None:
            return {}
        return {ONLINE_PASSWORD_FILE_ENV: str(self.password_file)}

    def state(self) -> dict[str, str | None]:
        """Its entries in ``stack.json``."""
        return {
            "online_redis_url": self.url,
            "online_redis_password_file": None
            if self.password_file is None
            else str(self.password_file),
        }
