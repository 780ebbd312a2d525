"""A real PostgreSQL for the tests: a throwaway cluster started once per test session.

``pg_server`` runs initdb and pg_ctl (PostgreSQL 15, installed by ``scripts/setup-postgres.sh
install``) into a temporary directory on a free port and stops it at the end of the session;
``pg_url`` gives each test a fresh database in it. ``HINDSIGHT_TEST_PG`` (a URL to a server
where databases may be created) uses that server instead. When neither works the tests that need
PostgreSQL are skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("HINDSIGHT_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(args: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The URL of a PostgreSQL server for this session's tests (its maintenance database)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("PostgreSQL tests need psycopg: pip install -e '.[postgres]'")
    given = os.environ.get("HINDSIGHT_TEST_PG")
    if given:
        yield given
        return
    if not (PG_BIN / "initdb").exists():
        pytest.skip(
            f"no PostgreSQL server at {PG_BIN}: run 'bash scripts/setup-postgres.sh install'"
        )
    root = Path(tempfile.mkdtemp(prefix="hindsight-pg-"))
    data = root / "data"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        root.chmod(0o755)
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "initdb"),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "-D",
                    str(data),
                ]
            ),
            check=True,
            capture_output=True,
        )
        # fsync off: a throwaway cluster; nothing here must survive a power loss.
        opts = (
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c fsync=off -c full_page_writes=off"
        )
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(root / "log"),
                    "-w",
                    "-o",
                    opts,
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot start PostgreSQL: {exc} {detail.decode(errors='replace')[-300:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres(
                [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
            ),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database for one test, dropped afterwards."""
    import psycopg

    name = f"hs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    base = pg_server.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
