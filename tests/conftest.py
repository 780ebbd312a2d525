"""Shared fixtures: every test gets real SQLite files in its own temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
