"""Read commands open the store read-only: nothing is written, and a store on read-only media can
be read (issue: trust). The media is a real tmpfs remounted read-only."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app
from hindsight_loop.store.migrations import SchemaError
from hindsight_loop.store.sqlite import SQLiteStore

runner = CliRunner()


def _fill(db: Path) -> tuple[str, str]:
    """A store with a failed run, its reflection and a lesson; returns (task id, lesson id)."""
    with Hindsight(db, background=False, triggers=False) as hs:
        with hs.task("csv_cleaning", goal="clean 销售.csv", tools=["read_csv"]) as task:
            task.record_action(
                "read_csv",
                {"path": "a.csv", "encoding": "utf-8"},
                status="failed",
                error_type="UnicodeDecodeError",
                error_message="'utf-8' codec can't decode byte 0xd6 in position 0",
            )
            task.record_action("read_csv", {"path": "a.csv", "encoding": "gbk"}, output="3 rows")
        reflection = hs.reflect(task.task_id)
        assert reflection.lesson_ids
        return task.task_id, reflection.lesson_ids[0]


def _reads(db: Path, task_id: str, lesson_id: str) -> list[str]:
    outputs = []
    for args in (
        ["tasks"],
        ["replay", task_id],
        ["reflections", task_id],
        ["lessons", "list"],
        ["lessons", "show", lesson_id],
        ["lessons", "review"],
        ["lessons", "export"],
        ["recall", "GBK file", "--task-type", "csv_cleaning", "--tool", "read_csv"],
    ):
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 0, (args, result.output)
        outputs.append(result.output)
    return outputs


@pytest.fixture
def media(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs, made read-only by the test with ``remount,ro``; unmounted afterwards."""
    mnt = tmp_path / "media"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for read-only media: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_store_on_read_only_media_can_be_read(media: Path) -> None:
    db = media / "hs.db"
    task_id, lesson_id = _fill(db)
    before = sorted(os.listdir(media))
    subprocess.run(["mount", "-o", "remount,ro", str(media)], check=True)
    assert not os.access(media, os.W_OK)
    out = _reads(db, task_id, lesson_id)
    assert "销售" in out[0] and "read_csv" in out[1] and lesson_id in out[3]
    assert sorted(os.listdir(media)) == before
    # A write command says what is wrong in one line, no traceback.
    result = runner.invoke(app, ["lessons", "reject", lesson_id, "--db", str(db)])
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_read_commands_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "hs.db"
    task_id, lesson_id = _fill(db)
    data, mtime = db.read_bytes(), db.stat().st_mtime_ns
    _reads(db, task_id, lesson_id)
    assert db.read_bytes() == data and db.stat().st_mtime_ns == mtime
    # SQLite's own WAL index files may appear (any reader of a WAL database makes them, and the
    # write-ahead log stays empty); nothing of Hindsight's is written next to the store.
    assert {p.name for p in tmp_path.iterdir()} <= {"hs.db", "hs.db-wal", "hs.db-shm"}
    wal = tmp_path / "hs.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_read_only_store_sees_what_a_live_writer_commits(tmp_path: Path) -> None:
    db = tmp_path / "hs.db"
    with Hindsight(db, background=False, triggers=False) as writer:
        reader = Hindsight(db, readonly=True)
        try:
            with writer.task("t", goal="first"):
                pass
            writer.flush()
            assert [t.goal for t in reader.tasks()] == ["first"]
            with writer.task("t", goal="second"):
                pass
            writer.flush()
            assert {t.goal for t in reader.tasks()} == {"first", "second"}
        finally:
            reader.close()


def test_read_only_never_creates_upgrades_on_writable_media_and_refuses_foreign_files(
    tmp_path: Path,
) -> None:
    with pytest.raises(FileNotFoundError):
        SQLiteStore(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()

    foreign = tmp_path / "other.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    data = foreign.read_bytes()
    with pytest.raises(SchemaError, match="did not create"):
        SQLiteStore(foreign, readonly=True)
    assert foreign.read_bytes() == data

    old = tmp_path / "old.db"
    store = SQLiteStore(old)
    db = store._db
    db.execute(
        "DELETE FROM _migrations WHERE name = 'm005_job_owners'"
    )  # as an older version left it
    db.execute("ALTER TABLE jobs DROP COLUMN queued_by")
    store.close()
    reader = SQLiteStore(old, readonly=True)  # upgraded once (the file is writable), then read
    try:
        assert reader.pending_jobs() == 0
    finally:
        reader.close()
