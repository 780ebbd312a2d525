"""The event writer's own checkpoints (SQLite): run after a batch is acknowledged rather than in
the COMMIT a flush waits for, stopped by a flush, and never so often stopped that the WAL grows
without end."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import orjson
import pytest

from hindsight_loop import Hindsight
from hindsight_loop.store.sqlite import CHECKPOINT_CAP, CHECKPOINT_PAGES, SQLiteStore

PAGE = 4096


def _fill(store: SQLiteStore, megabytes: float, *, task: str = "tsk_ck") -> int:
    """Events of ~4 KB each, in batches of 50, on this thread's connection; how many."""
    body = {"input": {"tool": "read_csv", "args": {"blob": "x" * 4000}}}
    rows = []
    n = int(megabytes * 1e6 / 4100)
    ts = "2025-01-01T00:00:00.000Z"
    start = ("s", task, 0, ts, "task_start", orjson.dumps({"task_type": "csv", "goal": "g"}))
    store.write_event_batch([start])
    for i in range(1, n + 1):
        rows.append((f"e{i}", task, i, ts, "action_executed", orjson.dumps(body)))
        if len(rows) == 50:
            store.write_event_batch(rows)
            rows = []
    if rows:
        store.write_event_batch(rows)
    return n + 1


def _wal_frames(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames copied into the database) as another connection sees them,
    after a PASSIVE checkpoint of its own: the frames the writer left behind."""
    db = sqlite3.connect(path)
    try:
        _busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return frames, copied
    finally:
        db.close()


def _checkpoint_a_flusher_keeps_stopping(store: SQLiteStore) -> bool:
    """``checkpoint()`` in a thread of its own while this one stops it every half millisecond
    (a flush after another): what it returned."""
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(store.checkpoint()))
    worker.start()
    while worker.is_alive():
        store.stop_checkpoint()
        worker.join(0.0005)
    assert len(results) == 1
    return results[0]


def test_a_deferred_checkpoint_waits_for_the_writer_and_copies_everything(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    try:
        store.defer_checkpoints()
        n = _fill(store, 6)
        # Past 1,000 pages and SQLite checkpointed nothing itself: the WAL holds them all.
        assert (db_path.parent / f"{db_path.name}-wal").stat().st_size > 5e6
        assert store.checkpoint_due(idle=True)
        assert not store.checkpoint_due(idle=False)  # a batch waits: it goes first
        assert store.checkpoint()
        assert not store.checkpoint_due(idle=True)
        frames, copied = _wal_frames(db_path)
        assert frames == copied
        assert store.event_count() == n
    finally:
        store.close()


def test_a_flush_stops_a_checkpoint_and_the_next_one_finishes_its_work(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    try:
        store.defer_checkpoints()
        n = _fill(store, 8)  # ~2,700 pages: a checkpoint a flush may stop
        assert _checkpoint_a_flusher_keeps_stopping(store) is False
        # Nothing copied counts: the writer's count of pages still says a checkpoint is due.
        assert store.checkpoint_due(idle=True)
        assert store.checkpoint()
        frames, copied = _wal_frames(db_path)
        assert frames == copied > 0
        assert store.event_count() == n
        store.stop_checkpoint()  # none under way: nothing to stop, and the next write runs
        assert _fill(store, 0.01, task="tsk_after") > 1
    finally:
        store.close()


def test_past_the_cap_a_flush_waits_for_the_checkpoint(db_path: Path) -> None:
    """Flushes come often (every task's end): were each to stop the checkpoint, the WAL would
    grow as long as the agent runs."""
    store = SQLiteStore(db_path)
    try:
        store.defer_checkpoints()
        _fill(store, CHECKPOINT_CAP * CHECKPOINT_PAGES * PAGE * 0.8 / 1e6)
        assert store.checkpoint_due(idle=False)  # due even with a batch waiting
        assert _checkpoint_a_flusher_keeps_stopping(store) is True
    finally:
        store.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_the_recorder_checkpoints_itself_and_the_wal_stays_bounded(
    tmp_path: Path, writer: str
) -> None:
    """~24 MB of events through a real recorder, flushed now and then as an agent would: every
    event stored, and the WAL no larger than the cap's worth of pages (without checkpoints it
    would hold all 24 MB)."""
    db = tmp_path / "hs.db"
    hs = Hindsight(db, background=False, writer=writer)
    try:
        args = {f"part{j}": "y" * 400 for j in range(10)}  # each under the recorder's cut
        with hs.task("csv", goal="fill", recall=False) as task:
            for i in range(6000):
                task.record_action("read_csv", args, output={"rows": i})
                if i % 500 == 499:
                    assert hs.flush()
        assert hs.flush()
        assert hs.store.event_count() == 6002
        wal = tmp_path / "hs.db-wal"
        assert wal.stat().st_size <= (CHECKPOINT_CAP + 1) * CHECKPOINT_PAGES * PAGE
    finally:
        hs.close()
