"""Closing, draining and opening stores: nothing crashes, nothing is left running, nothing foreign
is touched (issue 12)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.models import Chronicle, Reflection, new_id
from hindsight_loop.store.migrations import SchemaError
from hindsight_loop.store.sqlite import SQLiteStore


class SlowReflector:
    """A reflector that takes ``seconds`` per review and says when one started."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.finished = 0

    def reflect(self, chronicle: Chronicle, *, kind="full", window=None) -> Reflection:
        self.started.set()
        time.sleep(self.seconds)
        self.finished += 1
        return Reflection(reflection_id=new_id("ref"), task_id=chronicle.task.task_id)


def _failed_tasks(hs: Hindsight, n: int) -> None:
    for i in range(n):
        with hs.task("t", goal=f"run {i}", recall=False) as task:
            task.record_action("tool", {"i": i}, status="failed", error_type="E", error_message="x")


def test_close_waits_for_the_review_in_flight_then_stops(tmp_path: Path) -> None:
    reflector = SlowReflector(1.0)
    hs = Hindsight(tmp_path / "h.db", reflector=reflector)
    _failed_tasks(hs, 5)
    hs.flush()
    assert reflector.started.wait(10)
    hs.close()  # must not close the store under the running review (it crashed the process)
    assert reflector.finished == 1  # the job in flight finished; no new one was taken
    store = SQLiteStore(tmp_path / "h.db")
    statuses = [j["status"] for j in store.jobs()]
    store.close()
    assert "running" not in statuses  # nothing left for a lease to take back
    assert statuses.count("done") == 1 and statuses.count("pending") == 4


def test_drain_waits_only_for_this_processes_jobs(tmp_path: Path) -> None:
    other = SQLiteStore(tmp_path / "h.db")
    other.enqueue_job("tsk_elsewhere", kind="full")
    mine = SQLiteStore(tmp_path / "h.db")
    assert mine.pending_jobs(mine=True) == 0  # another process's queue is not ours to wait for
    mine.enqueue_job("tsk_here", kind="full")
    assert mine.pending_jobs(mine=True) == 1
    assert other.pending_jobs(mine=True) == 1
    assert mine.pending_jobs() == 2
    other.close()
    mine.close()


def test_a_foreign_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users(name) VALUES ('ada')")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(SchemaError, match="did not create"):
        Hindsight(path)
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()


def test_a_store_from_a_newer_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO _migrations(name, applied_at) VALUES ('m999_future', 'x')")
    db.commit()
    db.close()
    with pytest.raises(SchemaError, match="newer Hindsight.*pip install -U"):
        SQLiteStore(path)


def test_a_child_forked_while_the_agent_reindexes_and_curates_recalls_and_learns(
    tmp_path: Path,
) -> None:
    """A fork while a thread of the agent held the recall index's lock (a rebuild after the
    book changed) or the curator's (a lesson being curated) left that lock held in the child
    for good: its first recall waited forever (1 of 40 children beside an agent at work). The
    child now makes locks of its own."""
    import os
    import signal

    from hindsight_loop.models import Features, LessonDraft

    hs = Hindsight(tmp_path / "f.db", background=False)
    try:
        hs.add_lesson(
            LessonDraft(
                task_type="api",
                advice="Retry fetch after a timeout.",
                features=Features(tools=["fetch"]),
            )
        )
        assert hs.recall(task_type="api", tools=["fetch"], query="fetch a page")
        held, done = threading.Event(), threading.Event()

        def busy() -> None:  # a rebuild and a curation under way in another thread
            with hs.recall_cache._lock, hs.curator._lock:
                held.set()
                done.wait()

        thread = threading.Thread(target=busy)
        thread.start()
        held.wait()
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                code = 1
                try:
                    signal.alarm(20)  # a child waiting for good is killed by its alarm
                    found = hs.recall(task_type="api", tools=["fetch"], query="fetch a page")
                    hs.add_lesson(LessonDraft(task_type="api", advice="Log the page fetched."))
                    code = 0 if found else 2
                finally:
                    os._exit(code)
            assert os.waitpid(pid, 0)[1] == 0
        finally:
            done.set()
            thread.join()
    finally:
        hs.close()
