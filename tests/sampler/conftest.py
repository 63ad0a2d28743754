"""Fixtures: a real sampler server process on a private ipc socket, stopped after the test."""

import shutil
import tempfile

import pytest
from sampler_workers import start_server
from streamrec.sampler.client import stop_server


@pytest.fixture
def short_dir():
    """A short private directory (ipc socket paths are limited to ~100 characters)."""
    path = tempfile.mkdtemp(prefix="srs-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(short_dir):
    srv = start_server(short_dir)
    yield srv
    stop_server(srv.proc.pid)
    srv.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def module_server():
    """One server for a file whose tests each reload their own table and leave it serving
    (a start costs seconds of imports)."""
    path = tempfile.mkdtemp(prefix="srs-", dir="/tmp")
    srv = start_server(path)
    yield srv
    stop_server(srv.proc.pid)
    srv.proc.wait(timeout=10)
    shutil.rmtree(path, ignore_errors=True)
