"""Shared fixtures: every test gets real SQLite files in its own temporary folder."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hindsight_loop import Hindsight


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "hindsight.db"


@pytest.fixture
def hs(db_path: Path) -> Iterator[Hindsight]:
    """A facade on a fresh file, reviews run by drain() in the test's own thread."""
    h = Hindsight(db_path, background=False)
    yield h
    h.close()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Collect after every test, so a resource a test leaves open (an event loop, a socket) is
    reported against that test rather than whichever test the collector happens to run in."""
    yield
    import gc

    gc.collect()


@pytest.fixture
def http_process() -> Iterator[Any]:
    """Start a command serving HTTP and wait until it listens; stopped with SIGTERM (what a
    service manager sends) at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        command: str, args: list[str], port: int, *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([command, *args], stderr=subprocess.PIPE, env=env)
        procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return proc
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nothing listening on port {port}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()


# PostgreSQL fixtures (pg_server, pg_url): a throwaway cluster started once per session.
from pg import pg_server, pg_url  # noqa: E402, F401
