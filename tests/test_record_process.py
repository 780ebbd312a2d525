"""The writer process: real subprocesses, real SIGKILLs, a real SQLite file; nothing accepted lost.

The agent's side of each SIGKILL test is a child Python process (so the test can kill it): it
records, says how far it got on stdout, and waits to be killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from hindsight_loop import Hindsight, HindsightWarning

SECRET = "sk-live0123456789abcdefABCDEF"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it is gone but for its exit status)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def _rows(db: Path) -> list[tuple[str, str, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT event_id, type, body FROM events ORDER BY id").fetchall()
    finally:
        con.close()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)


def test_records_through_a_writer_process_and_close_reaps_it(tmp_path: Path) -> None:
    hs = Hindsight(tmp_path / "h.db", writer="process", background=False)
    assert hs.recorder.pid is None  # started on the first event, not by Hindsight()
    args = {"path": "/data/a.csv", "api_key": SECRET, "note": f"token={SECRET}"}
    with hs.task("parse", goal="load", recall=False) as task:
        task.record_action("read_csv", args, output={"rows": 3})
        args["path"] = "/changed/after/the/call"  # serialized at the call: cannot reach it
        for i in range(200):
            task.record_action("read_csv", {"i": i}, output="x" * 2000)
    assert hs.flush() is True
    pid = hs.recorder.pid
    assert pid is not None and pid != os.getpid() and _alive(pid)
    hs.close()
    _wait_gone(pid, timeout=5)  # reaped by close(): no zombie either

    rows = _rows(tmp_path / "h.db")
    assert len(rows) == 203
    assert len({r[0] for r in rows}) == 203
    first = orjson.loads(rows[1][2])
    assert first["input"]["args"]["path"] == "/data/a.csv"
    assert first["input"]["args"]["api_key"] == "[REDACTED]"
    raw = (tmp_path / "h.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("h.db*")
    )
    assert SECRET.encode() not in raw  # redacted before anything reached the disk
    long = orjson.loads(rows[5][2])["result"]["output"]
    assert len(long) < 600 and "cut" in long  # cut in the writer process
    assert hs.stats["written"] == 203 and hs.stats["lost"] == 0


def test_a_slow_stream_of_lines_is_written_a_few_transactions_at_a_time(tmp_path: Path) -> None:
    """The writer looks at the ring every millisecond; what it finds waits a few more for company
    before one transaction writes it (a commit costs the same pages whatever it holds), unless
    a flush asks first. A machine slower than this one makes the groups larger, never smaller."""
    hs = Hindsight(tmp_path / "h.db", writer="process", background=False)
    with hs.task("parse", goal="load", recall=False) as task:
        task.record_action("warm_up", {})
        assert hs.flush() is True
        before = hs.stats["batches"]
        for i in range(100):  # one line every ~0.2 ms: ~5 a poll, ~25 in COMMIT_DELAY
            task.record_action("read_csv", {"i": i}, output="x" * 500)
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
        assert hs.flush() is True
        grouped = hs.stats["batches"] - before
    hs.close()
    assert hs.stats["written"] == 103 and hs.stats["lost"] == 0
    # One a poll would be ~20 transactions; a few a COMMIT_DELAY (5 ms) of 20 ms, ~4-5.
    assert 1 <= grouped <= 10, grouped
    assert len(_rows(tmp_path / "h.db")) == 103


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: float


def test_the_writer_process_stores_what_the_writer_thread_stores(tmp_path: Path) -> None:
    """Odd values take the agent-side conversion path (orjson refuses them as they are) or go
    through orjson and the writer's sanitizer: either way the bodies match the thread's."""
    payloads = [
        {"plain": "text", "n": 3, "f": 1.5, "none": None, "list": [1, "a", {"b": True}]},
        {1: "int key", Color.RED: "enum key", "set": {3, 1, 2}, "big": 2**70},
        {"when": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "point": Point(x=1, y=2.5)},
        {"color": Color.RED, "tuple": (1, 2), "bytes": b"abc", "password": "hunter2"},
        {"deep": {"a": {"b": {"c": {"d": {"e": [1, 2, {"f": "g"}]}}}}}},
        {"long": "word " * 400 + f"api_key={SECRET}", "zh": "密码：abc123secret 文件"},
        {"tokens": ["a"] * 30, "max_tokens": 512, "Authorization": "Bearer abcdefghijkl"},
    ]
    bodies = {}
    for mode in ("thread", "process"):
        db = tmp_path / f"{mode}.db"
        hs = Hindsight(db, writer=mode, background=False)  # type: ignore[arg-type]
        with pytest.warns(HindsightWarning) if mode == "process" else _no_check():
            with hs.task("t", recall=False) as task:
                for p in payloads:
                    task.record_action("tool", p, output={"ok": True}, step="s")
                    task.state(current_step="s", context_count=2)
            assert hs.flush() is True
        hs.close()
        bodies[mode] = [(r[1], r[2]) for r in _rows(db)]
    assert bodies["process"] == bodies["thread"]
    assert SECRET not in str(bodies["process"]) and "hunter2" not in str(bodies["process"])


class _no_check:
    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore", HindsightWarning)

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


def test_live_triggers_run_in_the_writer_process_and_wake_the_agent(tmp_path: Path) -> None:
    """Two failed tool calls in a row queue a local review, from the writer process as from
    the writer thread, and the end of a failed task a full one."""
    jobs = {}
    for mode in ("thread", "process"):
        hs = Hindsight(tmp_path / f"{mode}.db", writer=mode, background=False)  # type: ignore[arg-type]
        with hs.task("etl", goal="load", recall=False) as task:
            for _ in range(2):
                task.record_action(
                    "read_csv",
                    {"path": "/x.csv"},
                    status="failed",
                    error_type="EncodingError",
                    error_message="codec can't decode byte 0xed",
                )
            task.fail("could not read")
        assert hs.flush() is True
        deadline = time.monotonic() + 10
        while hs.pending_jobs() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the trigger's jobs are queued after the batch is written
        kinds = hs.store._db.execute("SELECT kind FROM jobs ORDER BY kind").fetchall()
        jobs[mode] = [k[0] for k in kinds]
        # The writer process queues them as the agent's own: drain() waits for the jobs it
        # owns, and returned at once (no lesson yet) when they were the writer's.
        assert hs.store.pending_jobs(mine=True) == len(kinds)
        hs.close()
    assert "local" in jobs["thread"] and "full" in jobs["thread"]
    assert jobs["process"] == jobs["thread"]


_AGENT = """
import os, sys, time
from hindsight_loop import Hindsight

db, n, flush = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "flush"
hs = Hindsight(db, writer="process", background=False)
task = hs.task("agent", goal="be killed", recall=False).__enter__()
for i in range(n):
    task.record_action("step", {"i": i, "text": "x" * 300}, output={"ok": i})
if flush:
    assert hs.flush()
else:
    # Not flushed: wait only until every line is written to the pipe (handed over).
    while hs.recorder.handed_over < n + 1:
        time.sleep(0.001)
print(hs.recorder.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("flush", ["flush", "handed-over"])
def test_sigkill_of_the_agent_loses_nothing_it_handed_over(tmp_path: Path, flush: str) -> None:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(_AGENT))
    db = tmp_path / "k.db"
    n = 20_000
    agent = subprocess.Popen(
        [sys.executable, str(script), str(db), str(n), flush],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = agent.stdout.readline() if agent.stdout else ""
        writer_pid = int(line)
        assert _alive(writer_pid)
        agent.kill()  # SIGKILL: no atexit, no close(), no flush
        agent.wait(timeout=10)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if agent.stdout:
            agent.stdout.close()
    # The writer reads its pipe to the end, writes everything, and exits by itself.
    _wait_gone(writer_pid, timeout=60)
    rows = _rows(db)
    assert len(rows) == n + 1
    assert len({r[0] for r in rows}) == n + 1
    seen = sorted(orjson.loads(r[2])["input"]["args"]["i"] for r in rows[1:])
    assert seen == list(range(n))


def test_a_killed_writer_is_restarted_and_given_what_it_had_not_written(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    hs = Hindsight(db, writer="process", background=False)
    with (
        pytest.warns(HindsightWarning, match="writer process ended"),
        hs.task("t", recall=False) as task,
    ):
        task.record_action("a", {"i": -1})
        assert hs.flush()
        first = hs.recorder.pid
        assert first is not None
        for i in range(30_000):
            task.record_action("a", {"i": i, "pad": "y" * 200})
            if i == 15_000:
                _kill(first)  # mid-stream: lines in the pipe and unacknowledged
        assert hs.flush() is True
    second = hs.recorder.pid
    assert second is not None and second != first
    assert hs.recorder.mode == "process"
    hs.close()
    rows = _rows(db)
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == 30_003  # none lost, none stored twice
    assert hs.stats["lost"] == 0


def test_the_stats_count_what_every_writer_wrote_though_no_flush_asked(tmp_path: Path) -> None:
    """The writers' counters are read from the ring: a restarted writer's are added to the
    dead one's, and events made durable before anyone flushed are counted all the same."""
    hs = Hindsight(tmp_path / "s.db", writer="process", background=False, triggers=False)
    with (
        pytest.warns(HindsightWarning, match="writer process ended"),
        hs.task("t", recall=False) as task,
    ):
        task.record_action("a", {"i": -1})
        assert hs.flush()
        assert hs.stats["written"] == 2  # the task's start and the call
        first = hs.recorder.pid
        assert first is not None
        _kill(first)
        for i in range(200):
            task.record_action("a", {"i": i})
        deadline = time.monotonic() + 60
        while hs.recorder.pending and time.monotonic() < deadline:
            time.sleep(0.01)  # a restarted writer makes them durable; nobody asks
        assert hs.recorder.pending == 0
        assert hs.recorder.pid not in (None, first)
        assert hs.stats["written"] == 202
        assert hs.flush() is True
    hs.close()
    assert hs.stats["written"] == len(_rows(tmp_path / "s.db")) == 203
    assert hs.stats["lost"] == hs.stats["dead_lettered"] == 0


def _kill_the_writer_while_it_queues_reviews(
    hs: Hindsight, db: Path, task_id: str | None = None
) -> str:
    """Record a task (of this id, else a new one), then SIGKILL the writer process once it has
    committed the task's events and is queueing its review (a job insert made to take
    seconds); the id of the task."""
    con = sqlite3.connect(db, timeout=60)  # the writer after it may be queueing, slowly
    con.executescript(
        """CREATE TRIGGER slow_jobs BEFORE INSERT ON jobs BEGIN
             SELECT count(*) FROM (WITH RECURSIVE c(x) AS
               (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000000) SELECT x FROM c);
           END;"""
    )
    rows = len(_rows(db))
    with hs.task("api", tools=["fetch"], recall=False, task_id=task_id) as task:
        for i in range(12):
            task.record_action("fetch", {"i": i})
    hs.flush(timeout=0.1)  # the writer commits now, then queues the review
    deadline = time.monotonic() + 30
    while len(_rows(db)) < rows + 14:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.2)  # past the commit, well inside the job insert (seconds)
    pid = hs.recorder.pid
    assert pid is not None
    _kill(pid)
    con.execute("DROP TRIGGER slow_jobs")
    con.commit()
    con.close()
    return task.task_id


def _jobs(db: Path) -> list[tuple[str, str, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT task_id, kind, trigger FROM jobs").fetchall()
    finally:
        con.close()


def test_a_writer_killed_while_it_queues_reviews_has_counted_what_it_wrote_and_its_reviews_come(
    tmp_path: Path,
) -> None:
    """The counters reach the ring as soon as the events are committed: the reviews queued
    after them may wait on a busy store, and a restarted writer does not count again what
    the dead one stored. It queues the reviews the dead one did not (before, they were lost:
    it skips the stored lines, so its triggers never saw the task end), and only once."""
    db = tmp_path / "k.db"
    hs = Hindsight(db, writer="process", background=False)
    with pytest.warns(HindsightWarning, match="writer process ended"):
        task_id = _kill_the_writer_while_it_queues_reviews(hs, db)
        assert hs.flush(timeout=30) is True
    hs.close()
    assert hs.stats["written"] == len(_rows(db)) == 14
    assert _jobs(db) == [(task_id, "full", "task_end")]


def test_a_task_id_run_again_gets_its_own_review_from_a_writer_taking_over(
    tmp_path: Path,
) -> None:
    """A caller may run a task id twice (``hs.task(task_id=...)``, a retried job). The review
    queued for its first run is not the second's: a writer taking over from one killed while it
    queued the second run's review took it for done, and the second run was never reviewed."""
    db = tmp_path / "r.db"
    hs = Hindsight(db, writer="process", background=False)
    with hs.task("api", tools=["fetch"], recall=False, task_id="job-42") as task:
        for i in range(12):
            task.record_action("fetch", {"i": i})
    assert hs.flush(timeout=30) is True
    assert _jobs(db) == [("job-42", "full", "task_end")]
    with pytest.warns(HindsightWarning, match="writer process ended"):
        _kill_the_writer_while_it_queues_reviews(hs, db, task_id="job-42")
        assert hs.flush(timeout=30) is True
    hs.close()
    assert _jobs(db) == [("job-42", "full", "task_end")] * 2


def test_past_its_restarts_the_in_process_writer_queues_the_reviews_a_dead_one_did_not(
    tmp_path: Path,
) -> None:
    """The same death past the writer's restarts: the agent writes in process from then on,
    skipping the lines the dead writer stored, and queued none of their reviews."""
    from hindsight_loop.writer import MAX_RESTARTS

    db = tmp_path / "b.db"
    hs = Hindsight(db, writer="process", background=False)
    with pytest.warns(HindsightWarning, match="writer process ended"):
        for k in range(MAX_RESTARTS):  # earlier deaths, with nothing of a task end in flight
            hs.record({"task_id": f"w{k}", "type": "task_start", "task_type": "x"})
            assert hs.flush(timeout=30) is True
            pid = hs.recorder.pid
            assert pid is not None
            _kill(pid)
        task_id = _kill_the_writer_while_it_queues_reviews(hs, db)
        assert hs.flush(timeout=30) is True
    assert hs.recorder.mode == "thread"
    hs.close()
    assert [job for job in _jobs(db) if job[0] == task_id] == [(task_id, "full", "task_end")]


@pytest.mark.parametrize("after", ["restart", "fall back"])
def test_reviews_the_store_refused_are_queued_though_the_writer_keeping_them_dies(
    tmp_path: Path, after: str
) -> None:
    """A review the store refused to queue (busy past its timeout, a full disk) waits in the
    writer for its next batch's queueing; the task's events are durable already, so no writer
    taking over is handed them again. The writer killed before that next batch took the
    review with it: now the writer after it (or, past the restarts, the agent's process)
    queues it, once."""
    from hindsight_loop.writer import MAX_RESTARTS

    db = tmp_path / "u.db"
    hs = Hindsight(db, writer="process", background=False)
    with pytest.warns(HindsightWarning, match="writer process ended"):
        for k in range(MAX_RESTARTS if after == "fall back" else 0):
            hs.record({"task_id": f"w{k}", "type": "task_start", "task_type": "x"})
            assert hs.flush(timeout=30) is True
            pid = hs.recorder.pid
            assert pid is not None
            _kill(pid)
        hs.record({"task_id": "warm", "type": "task_start", "task_type": "x"})
        assert hs.flush(timeout=30) is True
        con = sqlite3.connect(db, timeout=60)
        con.executescript(
            """CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs BEGIN
                 SELECT RAISE(ABORT, 'the store refuses reviews');
               END;"""
        )
        with hs.task("api", tools=["fetch"], recall=False) as task:
            for i in range(12):
                task.record_action("fetch", {"i": i})
        # Durable, so the review's queueing was tried (and refused) by now.
        assert hs.flush(timeout=30) is True
        con.execute("DROP TRIGGER refuse_jobs")
        con.commit()
        con.close()
        assert _jobs(db) == []
        pid = hs.recorder.pid
        assert pid is not None
        _kill(pid)
        deadline = time.monotonic() + 30
        while hs.recorder.pid == pid or (after == "restart" and hs.recorder.pid is None):
            assert time.monotonic() < deadline, "no writer took over"
            time.sleep(0.01)
        assert hs.flush(timeout=30) is True
    assert hs.recorder.mode == ("thread" if after == "fall back" else "process")
    hs.close()
    assert _jobs(db) == [(task.task_id, "full", "task_end")]


def test_a_restarted_writer_stores_an_event_whose_id_a_stored_one_had(tmp_path: Path) -> None:
    """A caller may give two events of a task one id (a retried call with new content): both
    are stored. A writer taking over from a dead one took the second for one the dead writer
    had stored, and skipped it: neither stored nor dead-lettered nor counted lost. It now
    knows the stored lines by id and seq."""
    db = tmp_path / "d.db"
    hs = Hindsight(db, writer="process", background=False, triggers=False)
    call = {"task_id": "t", "type": "action_executed", "event_id": "evt_call_1"}
    hs.record({"task_id": "t", "type": "task_start", "task_type": "x", "goal": "g"})
    hs.record({**call, "result": {"status": "failed"}})
    assert hs.flush()
    first = hs.recorder.pid
    assert first is not None
    os.kill(first, signal.SIGSTOP)  # what comes now waits, unread, for the next writer
    hs.record({**call, "result": {"status": "succeeded"}})
    hs.record({"task_id": "t", "type": "task_end", "result": {"status": "succeeded"}})
    with pytest.warns(HindsightWarning, match="writer process ended"):
        _kill(first)
        assert hs.flush(timeout=30) is True
    hs.close()
    rows = _rows(db)
    assert [r[1] for r in rows] == ["task_start", "action_executed", "action_executed", "task_end"]
    assert [orjson.loads(r[2])["result"]["status"] for r in rows if r[0] == "evt_call_1"] == [
        "failed",
        "succeeded",
    ]
    assert hs.stats["lost"] == hs.stats["dead_lettered"] == 0


def test_past_its_restarts_the_writer_falls_back_in_process(tmp_path: Path) -> None:
    from hindsight_loop.writer import MAX_RESTARTS

    db = tmp_path / "f.db"
    hs = Hindsight(db, writer="process", background=False)
    n = 0
    with pytest.warns(HindsightWarning) as caught, hs.task("t", recall=False) as task:
        for _ in range(MAX_RESTARTS + 1):
            for _ in range(2000):
                task.record_action("a", {"i": n})
                n += 1
            assert hs.flush() is True
            pid = hs.recorder.pid
            assert pid is not None
            _kill(pid)
            for _ in range(2000):
                task.record_action("a", {"i": n})
                n += 1
        assert hs.flush() is True
    said = [str(w.message) for w in caught]
    assert sum("restarted it" in m for m in said) == MAX_RESTARTS
    assert any("in the agent's process from now on" in m for m in said)
    assert hs.recorder.mode == "thread"
    hs.close()
    rows = _rows(db)
    assert len(rows) == len({r[0] for r in rows}) == n + 2


def test_where_no_process_can_start_it_writes_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    db = tmp_path / "n.db"
    hs = Hindsight(db, writer="process", background=False)
    with (
        pytest.warns(HindsightWarning, match="could not be started"),
        hs.task("t", recall=False) as task,
    ):
        for i in range(100):
            task.record_action("a", {"i": i, "password": "pw"})
        assert hs.flush() is True
    assert hs.recorder.mode == "thread"
    hs.close()
    rows = _rows(db)
    assert len(rows) == 102
    assert all(
        "pw" not in orjson.loads(r[2]).get("input", {}).get("args", {}).values() for r in rows
    )


def test_writer_policy_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hindsight_loop.record import Recorder
    from hindsight_loop.writer import ProcessRecorder

    monkeypatch.setenv("HINDSIGHT_WRITER", "process")
    with Hindsight(tmp_path / "a.db", background=False) as hs:
        assert isinstance(hs.recorder, ProcessRecorder)
    monkeypatch.setenv("HINDSIGHT_WRITER", "thread")
    with Hindsight(tmp_path / "b.db", background=False) as hs:
        assert type(hs.recorder) is Recorder
    monkeypatch.delenv("HINDSIGHT_WRITER")
    with Hindsight(tmp_path / "d.db", background=False) as hs:  # the default, here
        assert isinstance(hs.recorder, ProcessRecorder)
    with pytest.raises(ValueError, match="'thread' or 'process'"):
        Hindsight(tmp_path / "c.db", writer="proc")  # type: ignore[arg-type]
    assert not (tmp_path / "c.db").exists()  # refused before a store file is made


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
@pytest.mark.parametrize(
    ("setting", "policy"),
    [
        (None, "SCHED_BATCH"),
        ("other", "SCHED_OTHER"),
        ("idle", "SCHED_IDLE"),
        ("fifo", "SCHED_OTHER"),
    ],
)
def test_the_writer_process_is_scheduled_as_batch_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, policy: str
) -> None:
    """Its wake-ups must not preempt an agent's thread (``writer._schedule_as_batch``): every
    thread of it (the committer too) runs as batch work, the agent's own policy untouched;
    ``HINDSIGHT_WRITER_SCHED`` picks another, and a policy it does not offer keeps the default."""
    if setting is None:
        monkeypatch.delenv("HINDSIGHT_WRITER_SCHED", raising=False)
    else:
        monkeypatch.setenv("HINDSIGHT_WRITER_SCHED", setting)
    agents = os.sched_getscheduler(0)
    # The default policy is the one the writer inherits from the agent (SCHED_OTHER here).
    expected = agents if policy == "SCHED_OTHER" else getattr(os, policy)
    with Hindsight(tmp_path / "h.db", writer="process", background=False) as hs:
        with hs.task("parse", goal="load", recall=False) as task:
            task.record_action("read_csv", {"path": "/data/a.csv"}, output={"rows": 3})
        assert hs.flush() is True
        pid = hs.recorder.pid  # type: ignore[attr-defined]
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        assert len(threads) >= 2  # the main thread and the committer
        assert {os.sched_getscheduler(t) for t in threads} == {expected}
    assert os.sched_getscheduler(0) == agents  # the agent's is its own business
    assert len(_rows(tmp_path / "h.db")) == 3


def _writer_cpus_seen(tmp_path: Path, agent: set[int]) -> list[set[int]]:
    """The CPUs each thread of the writer may run on, the agent's thread pinned to ``agent``."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, agent)  # this thread's, which the recorder's threads inherit
    try:
        with Hindsight(tmp_path / "h.db", writer="process", background=False) as hs:
            with hs.task("parse", goal="load", recall=False) as task:
                task.record_action("read_csv", {"path": "/data/a.csv"}, output={"rows": 3})
            assert hs.flush() is True
            pid = hs.recorder.pid  # type: ignore[attr-defined]
            seen = [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]
    finally:
        os.sched_setaffinity(0, mine)
    assert len(seen) >= 2  # the main thread and the committer
    assert len(_rows(tmp_path / "h.db")) == 3
    return seen


def _unpinned() -> bool:
    """Whether this process may run on every CPU online (a test runner may be pinned)."""
    if not hasattr(os, "sched_getaffinity"):
        return False
    from hindsight_loop.writer import _cpus_in

    return os.sched_getaffinity(0) == _cpus_in("online")


@pytest.mark.skipif(
    not _unpinned() or len(os.sched_getaffinity(0)) < 2,
    reason="CPU affinity, two CPUs to choose from, and a test process not pinned",
)
@pytest.mark.parametrize("setting", [None, "inherit", "first other", "not cpus"])
def test_a_pinned_agents_writer_runs_on_the_cpus_it_is_not_pinned_to(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: str | None,
) -> None:
    """On the agent's own CPUs the writer took the turns of its threads (+32-54 µs a step in
    ``bench/agent_step.py --pin-agent 0`` on two cores, +5 apart): it runs on the others
    (``writer._writer_cpus``); ``HINDSIGHT_WRITER_CPUS`` says ``inherit`` or a list instead, and
    what is not a list is said in the log and read as unset."""
    allowed = sorted(os.sched_getaffinity(0))
    agent, others = {allowed[0]}, set(allowed[1:])
    env = {None: None, "inherit": "inherit", "first other": str(allowed[1]), "not cpus": "two"}
    if env[setting] is None:
        monkeypatch.delenv("HINDSIGHT_WRITER_CPUS", raising=False)
    else:
        monkeypatch.setenv("HINDSIGHT_WRITER_CPUS", env[setting])
    seen = _writer_cpus_seen(tmp_path, agent)
    if setting == "inherit":
        assert seen == [agent] * len(seen)
    elif setting == "first other":
        assert seen == [{allowed[1]}] * len(seen)
    else:
        assert seen == [others] * len(seen)
    assert ("not a list of CPUs" in caplog.text) == (setting == "not cpus")


@pytest.mark.skipif(
    not _unpinned() or len(os.sched_getaffinity(0)) < 2,
    reason="CPU affinity, two CPUs to choose from, and a test process not pinned",
)
def test_the_writer_keeps_off_the_main_threads_cpus_whichever_thread_records_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``taskset`` pins a process's main thread (and what it starts later): a thread started
    before, or one the agent pinned apart, must not decide where the writer goes."""
    import threading

    monkeypatch.delenv("HINDSIGHT_WRITER_CPUS", raising=False)
    allowed = sorted(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    go, done = threading.Event(), threading.Event()
    hs = Hindsight(tmp_path / "h.db", writer="process", background=False)

    def first_event() -> None:  # started before the main thread is pinned: free to run anywhere
        go.wait()
        with hs.task("parse", goal="load", recall=False) as task:
            task.record_action("read_csv", {"path": "/data/a.csv"}, output={"rows": 3})
        done.set()

    worker = threading.Thread(target=first_event)
    worker.start()
    os.sched_setaffinity(0, {allowed[0]})
    try:
        go.set()
        assert done.wait(10)
        assert hs.flush() is True
        pid = hs.recorder.pid  # type: ignore[attr-defined]
        seen = [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]
    finally:
        os.sched_setaffinity(0, mine)
        worker.join()
        hs.close()
    assert seen == [set(allowed[1:])] * len(seen)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity")
def test_cpus_the_writer_cannot_run_on_are_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list it asked for that the kernel refuses (no such CPU online): a warning the agent
    sees, and the writer runs where it may; nothing is lost."""
    monkeypatch.setenv("HINDSIGHT_WRITER_CPUS", "8000")
    with pytest.warns(HindsightWarning, match="cannot run on CPU"):
        seen = _writer_cpus_seen(tmp_path, os.sched_getaffinity(0))
    assert seen == [os.sched_getaffinity(0)] * len(seen)


@pytest.mark.skipif(not _unpinned(), reason="CPU affinity, a test process not pinned")
def test_an_unpinned_agents_writer_keeps_its_cpus(tmp_path: Path) -> None:
    """Nothing to keep apart: the writer may run wherever the agent may."""
    agent = os.sched_getaffinity(0)
    seen = _writer_cpus_seen(tmp_path, agent)
    assert seen == [agent] * len(seen)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
def test_while_a_flush_waits_the_writer_runs_under_the_default_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch thread's wake-up waits for the running thread's turn: on a busy machine each of
    a flush's wake-ups did (``writer._Urgency``). Seen from outside while flushes wait (the
    last commit and its answer: milliseconds), then batch work again once each is answered."""
    import threading

    monkeypatch.delenv("HINDSIGHT_WRITER_SCHED", raising=False)
    with (
        Hindsight(tmp_path / "h.db", writer="process", background=False) as hs,
        hs.task("parse", goal="load", recall=False) as task,
    ):
        task.record_action("read_csv", {"i": -1}, output="x")
        assert hs.flush() is True
        pid = hs.recorder.pid  # type: ignore[attr-defined]
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        seen: set[int] = set()
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                for t in threads:
                    seen.add(os.sched_getscheduler(t))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for burst in range(5):
                for i in range(2000):
                    task.record_action("read_csv", {"i": i, "burst": burst}, output="y" * 800)
                assert hs.flush() is True
        finally:
            done.set()
            watcher.join()
        after = {os.sched_getscheduler(t) for t in threads}
    assert os.SCHED_OTHER in seen and os.SCHED_BATCH in seen
    assert after == {os.SCHED_BATCH}
    assert len(_rows(tmp_path / "h.db")) == 2 + 10_001


def test_refused_and_after_close_events_reach_the_dead_letter(tmp_path: Path) -> None:
    hs = Hindsight(tmp_path / "d.db", writer="process", background=False)
    with pytest.warns(HindsightWarning):
        assert hs.record({"type": "no_such_type", "task_id": "t", "password": "pw1"}) is False
        with hs.task("t", recall=False) as task:
            task.record_action("a", {"i": 1})
        hs.close()
        task.record_action("late", {"secret": "pw2"})
    dead = hs.recorder.dead_letter.read_text()
    assert "no_such_type" in dead and "recorded after close" in dead
    assert "pw1" not in dead and "pw2" not in dead
    assert len(_rows(tmp_path / "d.db")) == 3


def test_lines_longer_than_a_read_are_stored_as_the_writer_thread_stores_them(
    tmp_path: Path,
) -> None:
    """The writer process reads the pipe a piece at a time (``READ_PIECE``): events several
    pieces long, and the pipe's cuts anywhere in a line, give the thread writer's bodies."""
    from hindsight_loop.writer import READ_PIECE

    big = {"rows": [{"k": i, "v": f"值{i}", "ok": i % 3 == 0} for i in range(3 * READ_PIECE // 20)]}
    assert len(orjson.dumps(big)) > 2 * READ_PIECE
    bodies = {}
    for mode in ("thread", "process"):
        db = tmp_path / f"{mode}.db"
        hs = Hindsight(db, writer=mode, background=False)  # type: ignore[arg-type]
        with hs.task("t", recall=False) as task:
            for i in range(3000):
                task.record_action("read", {"i": i, "q": "文件 " * (i % 50)}, output=i)
                if i % 500 == 7:
                    task.record_action("dump", {"i": i}, output=big)
        assert hs.flush() is True
        hs.close()
        bodies[mode] = [(r[1], r[2]) for r in _rows(db)]
    assert len(bodies["process"]) == 3000 + 6 + 2
    assert bodies["process"] == bodies["thread"]


def test_an_unreadable_line_between_events_is_dead_lettered_and_counted_once(
    tmp_path: Path,
) -> None:
    """The writer process fed by hand through its pipe: events, a line it cannot read, more
    events, the pipe cut mid-line between writes. Every event is stored in order, the line
    is dead-lettered, and the acknowledgements (how many of the first lines sent are handled)
    only rise, the last counting every line once."""
    from hindsight_loop.writer import event_id_for

    db, session = tmp_path / "w.db", "evt_handfed"
    Hindsight(db, background=False).close()  # the schema
    config = {
        "db": str(db),
        "dead_letter": str(tmp_path / "dead.jsonl"),
        "fallback_dir": str(tmp_path),
        "max_text": 500,
        "review_min_events": 10,
        "live": True,
        "session": session,
    }
    start = {"task_type": "t", "goal": "g", "tools": [], "scope": "global"}
    lines = [orjson.dumps(("tsk_h", 1, None, time.time_ns(), "task_start", None, start))]
    for own in range(2, 2002):
        payload = {"input": {"tool": "a", "args": {"i": own}}, "result": {"status": "ok"}}
        lines.append(
            orjson.dumps(("tsk_h", own, None, time.time_ns(), "action_executed", None, payload))
        )
        if own == 1000:
            lines.append(b'["tsk_h", 1000, "not a line the agent writes"')
    data = b"\n".join(lines) + b"\n"
    writer = subprocess.Popen(
        [sys.executable, "-m", "hindsight_loop.writer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
    )
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(orjson.dumps(config) + b"\n")
    for i in range(0, len(data), 7777):  # cuts fall inside lines
        writer.stdin.write(data[i : i + 7777])
        writer.stdin.flush()
    writer.stdin.close()
    said = [orjson.loads(line) for line in writer.stdout]
    writer.stdout.close()
    assert writer.wait(timeout=60) == 0
    counts = [m["done"] for m in said if "done" in m]
    assert counts == sorted(counts) and counts[-1] == len(lines) == 2002
    rows = _rows(db)
    assert [r[0] for r in rows] == [event_id_for(session, own) for own in range(1, 2002)]
    dead = (tmp_path / "dead.jsonl").read_text()
    assert "unreadable recorder line" in dead and "not a line the agent writes" in dead


def test_agent_threads_lines_and_pages_of_every_size_arrive_in_order(tmp_path: Path) -> None:
    """The agent's threads copy lines into the writer's ring (``ring.SIZE``), round and round:
    four threads recording at once, lines of a few bytes to a large part of the ring, some
    too long for it (they go through a spool file), flushes between bursts, a writer killed
    mid-run (a new one reads again from what was durable): every event stored once, each
    thread's in the order it recorded them, with the bodies the thread writer stores."""
    import threading

    from hindsight_loop.ring import SIZE

    sizes = [0, 10, 900, 20_000, 200_000, SIZE // 10]
    bodies: dict[str, list[tuple[str, str]]] = {}
    for mode in ("thread", "process"):
        db = tmp_path / f"{mode}.db"
        hs = Hindsight(db, writer=mode, background=False, triggers=False)  # type: ignore[arg-type]
        tasks = [hs.task(f"t{k}", recall=False).__enter__() for k in range(4)]

        def run(k: int, hs: Hindsight = hs, tasks: list = tasks) -> None:  # type: ignore[type-arg]
            for i in range(1500):
                size = sizes[(i * (k + 1)) % len(sizes)] if i % 13 == 0 else 40 + i % 300
                if i % 250 == 249:
                    size = SIZE // 8 + 1 + k  # spooled
                tasks[k].record_action("put", {"k": k, "i": i}, output="数" * (size // 3))
                if i % 400 == 399:
                    assert hs.flush(timeout=60) is True

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        if mode == "process":
            deadline = time.monotonic() + 30
            while hs.recorder.pid is None and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.01)
            time.sleep(0.2)
            _kill(hs.recorder.pid)  # type: ignore[attr-defined]
        for t in threads:
            t.join()
        for task in tasks:
            task.__exit__(None, None, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            assert hs.flush(timeout=120) is True
        hs.close()
        if mode == "process":
            spool = hs.recorder.spool_dir  # type: ignore[attr-defined]
            assert not list(spool.glob(f"{hs.recorder.session}-*"))  # type: ignore[attr-defined]
        rows = _rows(db)
        by_task: dict[str, list[tuple[str, str]]] = {}
        for _id, etype, body in rows:
            if etype == "action_executed":
                args = orjson.loads(body)["input"]["args"]
                by_task.setdefault(str(args["k"]), []).append((etype, body))
        for k in range(4):
            seen = [orjson.loads(b)["input"]["args"]["i"] for _t, b in by_task[str(k)]]
            assert seen == list(range(1500)), (mode, k)
        bodies[mode] = sorted(b for k in sorted(by_task) for b in by_task[k])
    assert bodies["process"] == bodies["thread"]


def test_overloaded_agent_side_spills_the_oldest_lines_and_loses_nothing(tmp_path: Path) -> None:
    """The writer process stopped (SIGSTOP): the pipe fills, lines wait in the agent's pages
    up to ``queue_bound``, then the oldest are spilled to the dead letter within
    ``block_seconds``. Once it runs again, every event is stored or dead-lettered, never both,
    and the call never raised."""
    db = tmp_path / "o.db"
    hs = Hindsight(db, writer="process", background=False, triggers=False, queue_bound=500)
    hs.recorder.block_seconds = 0.05
    try:
        hs.record({"type": "task_start", "task_id": "tsk_o", "task_type": "t"})
        assert hs.flush(timeout=60) is True
        pid = hs.recorder.pid  # type: ignore[attr-defined]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", HindsightWarning)
                for i in range(40_000):
                    hs.record(
                        {
                            "type": "user_input",
                            "task_id": "tsk_o",
                            "input": {"i": i, "t": "x" * 200, "s": "password: SpillSecret7"},
                        }
                    )
                assert hs.recorder.backlog <= 500 + 1
                assert hs.recorder.stats["spilled"] > 0
        finally:
            os.kill(pid, signal.SIGCONT)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            assert hs.flush(timeout=120) is True
        order = [
            orjson.loads(body)["input"]["i"]
            for _id, etype, body in _rows(db)
            if etype == "user_input"
        ]
        assert order == sorted(order)  # what a spill left of a page went on first, in order
        stored = set(order)
        spilled = {
            orjson.loads(x)["input"]["i"]
            for x in hs.recorder.dead_letter.read_bytes().splitlines()
            if orjson.loads(x).get("type") == "user_input"
        }
        assert stored | spilled == set(range(40_000))
        assert not stored & spilled
        assert len(spilled) == hs.recorder.stats["spilled"]
        assert b"SpillSecret7" not in hs.recorder.dead_letter.read_bytes()  # redacted there too
        # The oldest waiting were spilled: every spilled event is older than the last stored.
        assert max(spilled) < max(stored)
    finally:
        hs.close()


def test_the_writer_process_imports_only_what_it_writes_with() -> None:
    """``python -m hindsight_loop.writer`` imports the package first: its public names load on
    first use, so the writer starts without the facade, curation or numpy; every public name
    still resolves, for ``from hindsight_loop import *`` too."""
    code = textwrap.dedent(
        """
        import sys
        import hindsight_loop.writer, hindsight_loop.triggers, hindsight_loop.store
        heavy = sorted(m for m in ("numpy", "hindsight_loop.worker", "hindsight_loop.lessons",
                                   "hindsight_loop.hindsight") if m in sys.modules)
        assert not heavy, heavy
        import hindsight_loop
        from hindsight_loop import *
        names = {n: getattr(hindsight_loop, n) for n in hindsight_loop.__all__}
        assert names["Hindsight"].__module__ == "hindsight_loop.hindsight"
        assert issubclass(names["HindsightWarning"], Warning)
        assert set(hindsight_loop.__all__) <= set(dir(hindsight_loop))
        try:
            hindsight_loop.NoSuchName
        except AttributeError as exc:
            assert "NoSuchName" in str(exc)
        else:
            raise AssertionError("no AttributeError")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("executable", "frozen", "kind"),
    [("/usr/bin/uwsgi", False, "thread"), ("/opt/app/app", True, "thread"), ("", False, "thread")],
)
def test_a_program_embedding_python_records_with_the_writer_thread(
    executable: str, frozen: bool, kind: str
) -> None:
    """Where ``sys.executable`` is not a Python (uwsgi, a frozen app) a writer process would
    start another copy of the program: by default those record with the writer thread, and
    record as well as any."""
    code = textwrap.dedent(
        f"""
        import os, sys, tempfile
        sys.executable = {executable!r}
        if {frozen!r}:
            sys.frozen = True
        from hindsight_loop import Hindsight
        from hindsight_loop.components import writer_kind
        assert writer_kind(None) == {kind!r}, writer_kind(None)
        db = os.path.join(tempfile.mkdtemp(), "e.db")
        with Hindsight(db, background=False) as hs:
            assert type(hs.recorder).__name__ == "Recorder"
            hs.record({{"type": "task_start", "task_id": "tsk_e", "task_type": "t"}})
            assert hs.flush() is True
            assert hs.store.event_count("tsk_e") == 1
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "HINDSIGHT_WRITER"}
    env["PYTHONPATH"] = str(Path(__file__).parents[1] / "src")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


_FORKS = """
import os, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() with threads running
from hindsight_loop import Hindsight

hs = Hindsight(sys.argv[1], writer="process", background=False)
with hs.task("parent", recall=False) as task:
    task.user_input("before the fork")
assert hs.flush()
parent_writer = hs.recorder.pid
pid = os.fork()
if pid == 0:  # the child records too, then stays alive (a pool's worker)
    with hs.task("child", recall=False) as task:
        task.user_input("in the child")
    ok = hs.flush(timeout=60)
    print("child", ok, hs.recorder.pid != parent_writer, flush=True)
    time.sleep(60)
    os._exit(0)
idle = os.fork()
if idle == 0:  # a child that records nothing (a pool worker): no sender thread, a quick close
    import threading
    senders = [t for t in threading.enumerate() if t.name == "hindsight-sender"]
    t0 = time.monotonic()
    ok = hs.flush()
    hs.close()
    print("idle", ok, len(senders), round(time.monotonic() - t0) == 0, flush=True)
    os._exit(0)
os.waitpid(idle, 0)
print(sys.stdin.readline().strip(), flush=True)  # the child has flushed: the test says go on
t0 = time.monotonic()
hs.close()
print("closed %.1f" % (time.monotonic() - t0), flush=True)
os.kill(pid, 9)
os.waitpid(pid, 0)
"""


def test_a_forked_child_neither_holds_the_parents_writer_nor_shares_its_events(
    tmp_path: Path,
) -> None:
    """A child forked from the agent kept its copy of the writer's pipe: the parent's close()
    waited until the child exited (then, past EXIT_WAIT, killed the writer). The child now
    lets go of it, and records through a writer process of its own, its event ids its own."""
    script = tmp_path / "forks.py"
    script.write_text(_FORKS)
    db = tmp_path / "fork.db"
    agent = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdin is not None and agent.stdout is not None
    try:
        said = sorted(agent.stdout.readline().split() for _ in range(2))  # either child first
        assert said == [["child", "True", "True"], ["idle", "True", "0", "True"]]
        agent.stdin.write("go\n")
        agent.stdin.flush()
        assert agent.stdout.readline().strip() == "go"
        closed = float(agent.stdout.readline().split()[1])
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        agent.stdin.close()
        agent.stdout.close()
    assert closed < 30  # not waiting for the child (it sleeps 60 s)
    rows = _rows(db)
    texts = sorted(orjson.loads(r[2]).get("input", {}).get("text", "") for r in rows)
    assert texts == ["", "", "", "", "before the fork", "in the child"]
    assert len({r[0] for r in rows}) == len(rows) == 6


_WORKERS = """
import os, sys, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() with threads running
from hindsight_loop import Hindsight

hs = Hindsight(sys.argv[1], writer=sys.argv[2], background=False)
with hs.task("parent", recall=False) as task:
    task.user_input("before the forks")
assert hs.flush()
for w in range(3):  # workers forked one after another, as a pre-forking server does
    pid = os.fork()
    if pid == 0:
        with hs.task(f"worker {w}", recall=False) as task:
            gate = threading.Barrier(8)

            def say(k):
                gate.wait()  # the child's first events, from eight threads at once
                task.user_input(f"worker {w} thread {k}")

            threads = [threading.Thread(target=say, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        ok = hs.flush(timeout=60)
        hs.close()
        os._exit(0 if ok else 3)
    assert os.waitpid(pid, 0)[1] == 0
idle = os.fork()
if idle == 0:  # closed before it recorded anything: what comes after is after close
    hs.close()
    with hs.task("too late", recall=False) as task:
        task.user_input("after close")
    started = getattr(hs.recorder, "pid", None) is not None or threading.active_count() > 1
    os._exit(4 if started else 0)
assert os.waitpid(idle, 0)[1] == 0
hs.close()
"""


_FORK_STATS = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
from hindsight_loop import Hindsight

hs = Hindsight(sys.argv[1], writer="process", background=False, triggers=False)
with hs.task("parent", recall=False) as task:
    task.user_input("before the fork")
hs.record({"type": "nope", "task_id": "x"})  # refused: dead-lettered in this process
assert hs.flush()
parent = hs.stats
pid = os.fork()
if pid == 0:
    at_start = hs.stats
    with hs.task("child", recall=False) as task:
        task.user_input("in the child")
    ok = hs.flush()
    print(json.dumps([at_start, hs.stats, ok]), flush=True)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
print(json.dumps([parent, hs.stats]), flush=True)
hs.close()
"""


def test_a_forked_childs_stats_are_its_own(tmp_path: Path) -> None:
    script = tmp_path / "fork_stats.py"
    script.write_text(_FORK_STATS)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "f.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    child, parent = (orjson.loads(line) for line in done.stdout.splitlines())
    zero = dict.fromkeys(child[0], 0)
    assert child[0] == zero  # nothing the parent counted
    assert (child[1]["written"], child[1]["dead_lettered"], child[2]) == (3, 0, True)
    assert parent[0] == parent[1]  # the child's counts are not the parent's
    assert (parent[1]["written"], parent[1]["dead_lettered"]) == (3, 1)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_forked_workers_record_runs_of_their_own(tmp_path: Path, writer: str) -> None:
    """Workers forked one after another had their parent's id prefix and counter: their tasks
    and events took the same ids, and their runs became one task. Each now has its own, its
    eight threads' first events all stored; a child closed before it recorded starts no
    writer afterwards. With the writer thread, whose threads stay in the parent, a child's
    events waited in a queue no thread read: its flush() said False and they were lost."""
    script = tmp_path / "workers.py"
    script.write_text(_WORKERS)
    db = tmp_path / "workers.db"
    done = subprocess.run(
        [sys.executable, str(script), str(db), writer],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    con = sqlite3.connect(db)
    try:
        goals = sorted(g for (g,) in con.execute("SELECT task_type FROM tasks"))
        rows = con.execute("SELECT event_id, type FROM events").fetchall()
    finally:
        con.close()
    assert goals == ["parent", "worker 0", "worker 1", "worker 2"]
    assert len(rows) == 3 + 3 * 10  # start, input, end; each worker: start, 8 inputs, end
    assert len({event_id for event_id, _ in rows}) == len(rows)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_relative_path_is_the_file_opened_even_after_the_agent_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    """The writer process starts on the first event, in the agent's working directory of that
    moment: it opened (and created) another file for a relative path once the agent had moved,
    and reported those events durable there. The writer thread's connection, opened lazily
    too, wrote to an empty file there and dead-lettered every event."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    hs = Hindsight("h.db", writer=writer, background=False, triggers=False)  # type: ignore[arg-type]
    try:
        monkeypatch.chdir(tmp_path / "elsewhere")
        with hs.task("t", recall=False) as task:
            task.user_input("where am I")
        assert hs.flush() is True
    finally:
        hs.close()
    assert not (tmp_path / "elsewhere" / "h.db").exists()
    assert [r[1] for r in _rows(tmp_path / "here" / "h.db")] == [
        "task_start",
        "user_input",
        "task_end",
    ]
    assert hs.recorder.dead_letter.parent == tmp_path / "here"


def test_a_restarted_writer_still_reviews_a_recovery_it_did_not_see_fail(tmp_path: Path) -> None:
    """A task that recovered from a failed tool call is reviewed when it ends (a short one
    too). What the triggers knew of a running task lived in the writer process that died: the
    writer started in its place saw only the recovery and queued no review. It reads what it
    did not see from the store."""
    hs = Hindsight(tmp_path / "t.db", writer="process", background=False)
    try:
        with (
            pytest.warns(HindsightWarning, match="writer process ended"),
            hs.task("etl", recall=False) as task,
        ):
            task.record_action("read_csv", {"path": "/x.csv"}, status="failed", error_type="E")
            assert hs.flush() is True
            first = hs.recorder.pid
            assert first is not None
            _kill(first)
            task.record_action("read_csv", {"path": "/x.csv", "encoding": "gbk"})
            assert hs.flush() is True
        assert hs.flush() is True
        assert hs.recorder.pid not in (None, first)
        jobs = hs.store._db.execute("SELECT kind, trigger FROM jobs").fetchall()  # type: ignore[attr-defined]
        assert jobs == [("full", "task_end")]
    finally:
        hs.close()


def _switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_no_thread_of_the_agent_wakes_while_it_records_nothing_and_a_bell_wakes_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's lines go into the ring from its own thread: no thread of its process polls
    (each of Hindsight's threads there sleeps until the writer says something or the ring
    overflows). The writer polls the ring while lines come, then sleeps; the next event
    rings it awake (and clears the flag itself), and is stored without a flush: the writer's
    sleep is made longer than the test waits, so nothing else can wake it in time."""
    import threading

    from hindsight_loop.ring import ASLEEP

    monkeypatch.setenv("HINDSIGHT_WRITER_DEEP_SLEEP", "600")
    hs = Hindsight(tmp_path / "b.db", writer="process", background=False, triggers=False)
    try:
        with hs.task("t", recall=False) as task:
            for i in range(500):
                task.record_action("a", {"i": i})
            assert hs.flush() is True
            recorder: Any = hs.recorder
            words = recorder._words
            deadline = time.monotonic() + 30
            while not words[ASLEEP]:  # idle a few hundred milliseconds: it sleeps
                assert time.monotonic() < deadline, "the writer never slept"
                time.sleep(0.01)
            ours = [
                t
                for t in threading.enumerate()
                if t.name.startswith("hindsight") and t.native_id is not None
            ]
            assert ours, "no thread of Hindsight's to watch"
            before = {t.name: _switches(t.native_id) for t in ours if t.native_id}
            time.sleep(0.3)
            after = {t.name: _switches(t.native_id) for t in ours if t.native_id}
            assert after == before
            task.record_action("a", {"i": "rung"})
            assert words[ASLEEP] == 0  # the call rang and cleared it
            deadline = time.monotonic() + 30
            while hs.recorder.pending:
                assert time.monotonic() < deadline, "the bell did not wake the writer"
                time.sleep(0.005)
    finally:
        hs.close()
    bodies = [orjson.loads(r[2]) for r in _rows(tmp_path / "b.db") if r[1] == "action_executed"]
    assert bodies[-1]["input"]["args"]["i"] == "rung" and len(bodies) == 501


def test_an_event_too_long_for_the_ring_waits_in_a_private_file_and_is_stored_redacted(
    tmp_path: Path,
) -> None:
    """A line longer than the ring's eighth goes through a spool file. It holds the event
    before redaction, so it lives in memory (``/dev/shm``) in a directory and a file of this
    user's alone, and goes once the event is durable; the store has it redacted."""
    from hindsight_loop.ring import SIZE

    db = tmp_path / "s.db"
    hs = Hindsight(db, writer="process", background=False, triggers=False)
    try:
        hs.record({"type": "task_start", "task_id": "tsk_s", "task_type": "t"})
        assert hs.flush(timeout=60) is True
        pid = hs.recorder.pid  # type: ignore[attr-defined]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # the file stays until the writer reads and stores it
        try:
            text = "password: SpoolSecret9 " + "y" * (SIZE // 8)
            hs.record({"type": "user_input", "task_id": "tsk_s", "input": {"text": text}})
            spool = hs.recorder.spool_dir  # type: ignore[attr-defined]
            files = list(spool.glob(f"{hs.recorder.session}-*"))  # type: ignore[attr-defined]
            assert len(files) == 1
            if Path("/dev/shm").is_dir():
                assert spool.parent == Path("/dev/shm")
            assert spool.stat().st_mode & 0o077 == 0 and files[0].stat().st_mode & 0o077 == 0
            assert b"SpoolSecret9" in files[0].read_bytes()  # not yet redacted: hence private
        finally:
            os.kill(pid, signal.SIGCONT)
        assert hs.flush(timeout=60) is True
        assert not files[0].exists()
    finally:
        hs.close()
    body = next(r[2] for r in _rows(db) if r[1] == "user_input")
    assert "SpoolSecret9" not in body and "password" in body


_ORPHAN = textwrap.dedent(
    """
    import os, signal, sys
    from hindsight_loop import Hindsight
    from hindsight_loop.ring import SIZE
    hs = Hindsight(sys.argv[1], writer="process", background=False, triggers=False)
    hs.record({"type": "task_start", "task_id": "tsk_o", "task_type": "t"})
    assert hs.flush(timeout=60)
    writer = hs.recorder.pid
    os.kill(writer, signal.SIGSTOP)  # it will never read the spool file
    text = "password: OrphanSecret7 " + "z" * (SIZE // 8)
    hs.record({"type": "user_input", "task_id": "tsk_o", "input": {"text": text}})
    print(hs.recorder.spool_dir, hs.recorder.session, writer, flush=True)
    os.kill(writer, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)  # both gone, the file not read
    """
)


def test_what_a_dead_agent_and_writer_left_in_a_spool_file_goes_when_the_next_recorder_starts(
    tmp_path: Path,
) -> None:
    """A spool file holds an event not yet redacted. When agent and writer both die before the
    writer read it, nothing of theirs will: the next recorder to start removes it, and leaves
    the files of a session whose agent or writer still lives."""
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN, str(tmp_path / "o.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    where, session, writer = done.stdout.split()
    _wait_gone(int(writer))
    spool = Path(where)
    orphans = list(spool.glob(f"{session}-*.line"))
    assert len(orphans) == 1 and b"OrphanSecret7" in orphans[0].read_bytes()
    assert (spool / f"{session}.lock").exists()

    # A live session with a file of its own: its writer is stopped, so the file waits.
    from hindsight_loop.ring import SIZE

    live = Hindsight(tmp_path / "l.db", writer="process", background=False, triggers=False)
    try:
        live.record({"type": "task_start", "task_id": "tsk_l", "task_type": "t"})
        assert live.flush(timeout=60) is True
        pid = live.recorder.pid  # type: ignore[attr-defined]
        # Its start swept already: the dead session's file and lock are gone.
        assert not orphans[0].exists() and not (spool / f"{session}.lock").exists()
        os.kill(pid, signal.SIGSTOP)
        try:
            text = "q" * (SIZE // 8 + 10)
            live.record({"type": "user_input", "task_id": "tsk_l", "input": {"text": text}})
            mine = list(spool.glob(f"{live.recorder.session}-*.line"))  # type: ignore[attr-defined]
            assert len(mine) == 1
            other = Hindsight(tmp_path / "n.db", writer="process", background=False)
            other.record({"type": "task_start", "task_id": "tsk_n", "task_type": "t"})
            assert other.flush(timeout=60) is True
            other.close()
            assert mine[0].exists()  # held by a live agent: not swept
        finally:
            os.kill(pid, signal.SIGCONT)
        assert live.flush(timeout=60) is True
    finally:
        live.close()
    assert not list(spool.glob(f"{live.recorder.session}*"))  # type: ignore[attr-defined]
    assert [r[1] for r in _rows(tmp_path / "l.db")] == ["task_start", "user_input"]


def test_an_event_too_long_for_the_ring_with_nowhere_to_spool_is_written_in_process(
    tmp_path: Path,
) -> None:
    """No private directory for spool files (the one in /dev/shm is open to others, the one
    beside the dead letter cannot be made): the long event goes to the in-process writer,
    with a warning, and is stored like the others."""
    from hindsight_loop.ring import SIZE

    shm = Path("/dev/shm") / f"hindsight-{os.getuid()}"
    mode = shm.stat().st_mode & 0o777 if shm.is_dir() else None
    db = tmp_path / "n.db"
    Path(f"{db}.deadletter.jsonl.spool").write_text("not a directory")
    hs = Hindsight(db, writer="process", background=False, triggers=False)
    try:
        if mode is not None:
            shm.chmod(0o755)  # no longer this user's alone: not used
        hs.record({"type": "task_start", "task_id": "tsk_n", "task_type": "t"})
        assert hs.flush(timeout=60) is True
        text = "password: NowhereSecret3 " + "w" * (SIZE // 8)
        with pytest.warns(HindsightWarning, match="could not be spooled"):
            hs.record({"type": "user_input", "task_id": "tsk_n", "input": {"text": text}})
        hs.record({"type": "user_input", "task_id": "tsk_n", "input": {"text": "after"}})
        assert hs.flush(timeout=60) is True
        assert hs.recorder.mode == "process"  # type: ignore[attr-defined]
    finally:
        if mode is not None:
            shm.chmod(mode)
        hs.close()
    rows = _rows(db)
    assert sorted(r[1] for r in rows) == ["task_start", "user_input", "user_input"]
    body = next(r[2] for r in rows if "NowhereSecret3" in r[2] or "password" in r[2])
    assert "NowhereSecret3" not in body  # redacted by the in-process writer
    assert hs.stats["lost"] == 0


def _ring_rss_kib() -> int:
    """Resident KiB of this process's mappings of a ring (its memfd's name in smaps)."""
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split()[0]:  # a mapping's header line
            inside = "hindsight-ring" in line
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_the_ring_is_faulted_in_off_the_agents_thread(tmp_path: Path) -> None:
    import resource
    import threading

    from hindsight_loop.ring import Ring

    def faults_writing_every_page(ring: Ring) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for at in range(0, ring.size, 4096):
            ring.data[at : at + 8] = b"12345678"
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    cold, warm = Ring.create(), Ring.create()
    try:
        assert warm.populate() is True
        assert faults_writing_every_page(cold) >= cold.size // 4096 // 2  # a fault a page
        assert faults_writing_every_page(warm) < 16
    finally:
        cold.close()
        warm.close()

    # The recorder has its ring populated by the thread that starts the writer, on the first
    # event: the whole ring is resident though one line is in it.
    hs = Hindsight(tmp_path / "h.db", writer="process", background=False)
    try:
        with hs.task("parse", goal="load", recall=False) as task:
            task.record_action("read_csv", {"path": "a.csv"}, output={"rows": 3})
        assert hs.flush() is True
        deadline = time.monotonic() + 10
        while any(t.name == "hindsight-start" for t in threading.enumerate()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _ring_rss_kib() >= hs.recorder._size // 1024
    finally:
        hs.close()


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_ids_with_a_lone_surrogate_are_kept_and_later_flushes_return(
    tmp_path: Path, writer: str
) -> None:
    """The wire check lets any text be an id; orjson refuses a lone surrogate. With the writer
    process ``hs.record`` raised into the agent, and the seq it had taken, never handed over,
    kept every later ``flush()`` and ``close()`` waiting for good. Now the id's text is
    replaced where it cannot be stored (and warned about), or the event dead-lettered."""
    hs = Hindsight(tmp_path / "s.db", writer=writer, background=False, triggers=False)  # type: ignore[arg-type]
    try:
        hs.record({"task_id": "t1", "type": "task_start", "task_type": "x", "goal": "g"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            assert hs.record({"task_id": "t1", "type": "state_change", "event_id": "e\ud800"})
            assert hs.record({"task_id": "t\udc80", "type": "state_change"})
            assert hs.flush(timeout=30)
        stored, dead = hs.stats["written"], hs.stats["dead_lettered"]
    finally:
        hs.close()
    assert stored + dead == 3
    assert len(_rows(tmp_path / "s.db")) == stored


def _dead_lettered(db: Path, fallback: Path) -> int:
    files = [Path(f"{db}.deadletter.jsonl"), *fallback.glob("*.jsonl")]
    return sum(len(f.read_bytes().splitlines()) for f in files if f.exists())


def test_what_another_thread_records_while_close_runs_is_stored_or_dead_lettered(
    tmp_path: Path,
) -> None:
    """A thread recording 100 KB events while the main thread closes: lines put in the ring
    after close()'s flush, or left waiting for room in it, were neither written nor
    dead-lettered (half of 100,000 accepted events in the adversarial run), and a flush()
    after close() never returned. Now close() hands them to the in-process writer."""
    db, fallback = tmp_path / "c.db", tmp_path / "fallback"
    hs = Hindsight(db, writer="process", fallback_dir=fallback, background=False, triggers=False)
    accepted = 0
    stop = threading.Event()
    blob = "x" * 100_000

    def record() -> None:
        nonlocal accepted
        while not stop.is_set():
            hs.record({"task_id": "t", "type": "state_change", "context": {"blob": blob}})
            accepted += 1

    thread = threading.Thread(target=record)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        thread.start()
        time.sleep(1.0)
        hs.close()
        stop.set()
        thread.join()
        assert hs.flush(timeout=30)
    assert hs.stats["lost"] == 0
    assert len(_rows(db)) + _dead_lettered(db, fallback) == accepted


def _record_fast(
    db: Path, fallback: Path, size: int, n: int, measure: Callable[[Hindsight], int]
) -> int:
    """Record ``n`` events of ``size`` bytes with the writer process as fast as the agent can,
    then flush and close; the most ``measure`` read after each."""
    hs = Hindsight(db, writer="process", fallback_dir=fallback, background=False, triggers=False)
    blob = "y" * size
    most = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            for _ in range(n):
                hs.record({"task_id": "t", "type": "state_change", "context": {"blob": blob}})
                most = max(most, measure(hs))
            assert hs.flush(timeout=120)
    finally:
        hs.close()
    return most


def test_lines_waiting_for_room_in_the_ring_are_bounded_in_bytes(tmp_path: Path) -> None:
    """Lines wait for room in the ring up to ``queue_bound`` lines: 50,000 lines of 500 KB
    held 3 GB after two seconds (the adversarial run). Past ``MAX_WAITING_BYTES`` the agent
    now waits for the writer, then spills, as past ``queue_bound``."""
    from hindsight_loop.writer import MAX_WAITING_BYTES

    db, fallback = tmp_path / "m.db", tmp_path / "fallback"
    # 200 MB, far faster than the writer reads it.
    most = _record_fast(db, fallback, 500_000, 400, lambda hs: hs.recorder.backlog)
    assert 0 < most * 500_000 <= MAX_WAITING_BYTES + 600_000
    assert len(_rows(db)) + _dead_lettered(db, fallback) == 400


def test_lines_waiting_for_room_in_the_ring_hold_the_memory_they_count(tmp_path: Path) -> None:
    """The bound on waiting lines counts their length; orjson's bytes keep the buffer they were
    written in (8 KB for a 1 KB line), so 50,000 lines held 390 MB where the bound said 54 MiB
    (the adversarial run, the writer process stopped). Each waits as a copy of its size."""
    import tracemalloc

    hs = Hindsight(tmp_path / "o.db", writer="process", background=False, triggers=False)
    blob = "y" * 1000
    try:
        hs.record({"task_id": "t", "type": "task_start", "task_type": "x"})
        assert hs.flush(timeout=30)
        pid = hs.recorder.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # a writer held up (a stalled disk): lines wait
        try:
            recorder: Any = hs.recorder
            while recorder._waiting == 0:  # the ring full first (8 MiB)
                hs.record({"task_id": "t", "type": "state_change", "context": {"blob": blob}})
            tracemalloc.start()
            try:
                before, waiting = tracemalloc.get_traced_memory()[0], recorder._waiting_bytes
                for _ in range(5_000):
                    hs.record({"task_id": "t", "type": "state_change", "context": {"blob": blob}})
                grown = tracemalloc.get_traced_memory()[0] - before
                waited = recorder._waiting_bytes - waiting
            finally:
                tracemalloc.stop()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert waited >= 5_000 * 1_000
        assert grown < 1.5 * waited, (grown, waited)  # 8x before
        assert hs.flush(timeout=120)
    finally:
        hs.close()
    assert hs.stats["lost"] == 0


def test_spool_files_waiting_for_the_writer_are_bounded_in_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines too long for the ring wait in spool files, in ``/dev/shm`` (memory): 2 MB events
    held 3 GB there within seconds, as nothing bounded them. Past ``MAX_SPOOLED_BYTES`` the
    agent now waits for the writer, then spills the line to the dead letter."""
    from hindsight_loop import writer

    monkeypatch.setattr(writer, "MAX_SPOOLED_BYTES", 8 << 20)
    db, fallback = tmp_path / "s.db", tmp_path / "fallback"

    def spooled(hs: Hindsight) -> int:
        mine = hs.recorder.spool_dir.glob(f"{hs.recorder.session}-*.line")  # type: ignore[attr-defined]
        return sum(p.stat().st_size for p in mine if p.exists())

    most = _record_fast(db, fallback, 2_000_000, 40, spooled)
    assert 2_000_000 < most <= (8 << 20) + 2_100_000
    assert len(_rows(db)) + _dead_lettered(db, fallback) == 40


_FORKS_BESIDE_RECORDING = """
import os, sys, threading, time, warnings
warnings.simplefilter("ignore")
from hindsight_loop import Hindsight

hs = Hindsight(sys.argv[1], writer="thread", background=False, triggers=False)
stop = threading.Event()

def record(k):
    while not stop.is_set():
        hs.record({"task_id": f"p{k}", "type": "state_change"})

threads = [threading.Thread(target=record, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
time.sleep(0.2)
failed = 0
for c in range(10):
    pid = os.fork()
    if pid == 0:
        for i in range(50):
            hs.record({"task_id": f"c{c}", "type": "state_change"})
        ok = hs.flush(timeout=20)
        hs.close()
        os._exit(0 if ok else 3)
    deadline = time.monotonic() + 30
    while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.02)
    if not done[0]:  # hung: SQLite's mutexes held by a parent's thread at the fork
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    failed += not done[0] or done[1] != 0
stop.set()
for t in threads:
    t.join()
assert hs.flush(timeout=60)
hs.close()
print(failed)
"""


def test_children_forked_beside_recording_threads_write_with_the_writer_thread(
    tmp_path: Path,
) -> None:
    """A fork while the writer thread's committer is inside SQLite copies SQLite's held mutexes
    into the child, where nothing lets go of them: the child's first write hung (13 of 20
    forks). A fork now waits for the committer to finish its store call."""
    script = tmp_path / "forks.py"
    script.write_text(_FORKS_BESIDE_RECORDING)
    db = tmp_path / "forks.db"
    done = subprocess.run(
        [sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]
    con = sqlite3.connect(db)
    try:
        children = con.execute("SELECT count(*) FROM events WHERE task_id LIKE 'c%'").fetchone()
    finally:
        con.close()
    assert children == (10 * 50,)


def test_after_a_fall_back_the_in_process_queue_bounds_the_agent(tmp_path: Path) -> None:
    """Past its restarts the writer falls back in-process; every line then went to the
    in-process writer's queue, which nothing bounded (227,415 lines for a queue_bound of 1,000
    in the adversarial run, 5 GB). ``queue_bound`` bounds it now, as with the writer thread."""
    from hindsight_loop.writer import MAX_RESTARTS

    db = tmp_path / "f.db"
    hs = Hindsight(db, writer="process", background=False, triggers=False, queue_bound=1000)
    most = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            for _ in range(MAX_RESTARTS + 1):
                hs.record({"task_id": "t", "type": "state_change"})
                assert hs.flush(timeout=30)
                pid = hs.recorder.pid
                assert pid is not None
                _kill(pid)
            while hs.recorder.mode != "thread":
                hs.record({"task_id": "t", "type": "state_change"})
                time.sleep(0.01)
            for _ in range(50_000):
                hs.record({"task_id": "t", "type": "state_change", "context": {"x": "y" * 100}})
                most = max(most, hs.recorder._local.backlog)
            assert hs.flush(timeout=60)
    finally:
        hs.close()
    assert most <= 1000


_POOL = """
import multiprocessing, sys, warnings
warnings.simplefilter("ignore")
from hindsight_loop import Hindsight

hs = Hindsight(sys.argv[1], writer="thread", background=False, triggers=False)
hs.record({"task_id": "p", "type": "state_change"})
assert hs.flush(timeout=30)

def work(n):
    for i in range(20):  # no flush: the worker ends as a Pool's do, with os._exit
        hs.record({"task_id": f"w{n}", "type": "state_change"})

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(work, range(40))
        pool.close()
        pool.join()
    assert hs.flush(timeout=30)
    hs.close()
"""


def test_pool_workers_forked_with_the_writer_thread_write_what_they_did_not_flush(
    tmp_path: Path,
) -> None:
    """A multiprocessing worker ends with os._exit: no atexit hook runs, and its daemon writer
    threads died with what they held (740 of 801 events lost). A forked child's recorder now
    flushes in threading's exit hooks, which a worker runs."""
    script = tmp_path / "pool.py"
    script.write_text(_POOL)
    db = tmp_path / "pool.db"
    done = subprocess.run(
        [sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert len(_rows(db)) == 1 + 40 * 20


def test_a_flush_after_an_event_recorded_after_close_says_true(tmp_path: Path) -> None:
    """With the writer thread, an event recorded after close() is dead-lettered, yet the next
    flush() said False: its seq was never counted as handled."""
    hs = Hindsight(tmp_path / "a.db", writer="thread", background=False, triggers=False)
    hs.record({"task_id": "t", "type": "state_change"})
    hs.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        hs.record({"task_id": "t", "type": "state_change"})
    assert hs.flush(timeout=10) is True
    assert (hs.stats["written"], hs.stats["dead_lettered"]) == (1, 1)


def test_a_datetime_whose_time_zone_raises_is_kept_as_a_marker_and_the_agent_lives(
    tmp_path: Path,
) -> None:
    """orjson, which serializes each event on the agent's thread, crashed the agent's process
    (SIGSEGV) on a datetime whose tzinfo raises (a zone refusing an ambiguous local time).
    Datetimes now go through the recorder's own conversion: the same text as orjson's for the
    usual ones, a marker for that one, as the writer thread keeps. Run in a child process: on
    the old code it took the test run down with it."""
    db = tmp_path / "tz.db"
    code = textwrap.dedent(
        f"""
        import datetime, warnings
        from hindsight_loop import Hindsight

        class Strict(datetime.tzinfo):
            def utcoffset(self, dt):
                raise ValueError("ambiguous local time")

            def dst(self, dt):
                return None

        warnings.simplefilter("ignore")
        hs = Hindsight({str(db)!r}, writer="process", background=False, triggers=False)
        utc = datetime.timezone.utc
        with hs.task("calendar", recall=False) as task:
            task.record_action("schedule", {{"when": datetime.datetime(2024, 11, 3, 1, 30, tzinfo=Strict())}})
            task.record_action("schedule", {{"when": datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=utc),
                                             "day": datetime.date(2024, 1, 2), "at": datetime.time(9, 30)}})
        assert hs.flush(timeout=30)
        assert hs.recorder.mode == "process"
        hs.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    args = [
        orjson.loads(body)["input"]["args"]
        for _, etype, body in _rows(db)
        if etype == "action_executed"
    ]
    assert args[0]["when"].startswith("datetime.datetime(2024, 11, 3, 1, 30, tzinfo=")
    assert args[1] == {
        "when": "2024-01-02T03:04:05.123456+00:00",
        "day": "2024-01-02",
        "at": "09:30:00",
    }


def _dead_lettered_ids(db: Path) -> set[str]:
    path = Path(f"{db}.deadletter.jsonl")
    if not path.exists():
        return set()
    return {orjson.loads(line).get("event_id") for line in path.read_bytes().splitlines()}


class _Interrupt(BaseException):
    """What a signal handler raises into the agent (as Ctrl-C raises KeyboardInterrupt)."""


@contextlib.contextmanager
def _interrupts(when: Callable[[], bool]) -> Iterator[Callable[[], None]]:
    """SIGUSR1 raises ``_Interrupt`` in the main thread when ``when()`` says; yields a call
    that sends one."""

    def handler(signum: int, frame: Any) -> None:
        if when():
            raise _Interrupt

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        yield lambda: os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_an_interrupt_while_a_record_call_waits_for_room_leaves_flush_true(
    tmp_path: Path, writer: str
) -> None:
    """Ctrl-C (or a SIGTERM handler's exit) reaching the agent while a record call waits under
    overload: the call had taken a seq and never handed its event over, so every later
    flush() said False and close() (and the exit) waited for good. The interrupted event is
    now either handed over or forgone, and what was accepted is all stored."""
    db = tmp_path / "i.db"
    hs = Hindsight(db, writer=writer, background=False, triggers=False, queue_bound=200)
    hs.recorder.block_seconds = 30.0  # the interrupt comes while it waits
    hs.record({"task_id": "t", "type": "task_start", "task_type": "x"})
    assert hs.flush(timeout=30)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # the writer is held up: the agent fills its bound
    accepted = 0
    pad = "p" * 4000
    with _interrupts(lambda: True) as interrupt:
        timer = threading.Timer(1.0, interrupt)
        timer.start()
        try:
            with pytest.raises(_Interrupt):
                for i in range(10**6):
                    event = {"task_id": "t", "type": "state_change", "event_id": f"e{i}"}
                    hs.record({**event, "context": {"pad": pad}})
                    accepted += 1
        finally:
            timer.cancel()
            holder.execute("COMMIT")
            holder.close()
    try:
        assert accepted > 200
        assert hs.flush(timeout=60) is True
    finally:
        hs.close()
    ids = {row[0] for row in _rows(db)}
    assert {f"e{i}" for i in range(accepted)} <= ids | _dead_lettered_ids(db)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_interrupts_anywhere_in_record_calls_leave_flush_true(tmp_path: Path, writer: str) -> None:
    """Signals every 0.2 ms, each raising into the agent while it is inside a record call: in
    each run before, a few of the thousands of interrupts came between a call taking its seq
    and handing its event over, and flush() waited for good."""
    hs = Hindsight(tmp_path / "h.db", writer=writer, background=False, triggers=False)
    inside = False
    stop = threading.Event()
    interrupted = recorded = 0
    with _interrupts(lambda: inside) as interrupt:

        def hammer() -> None:
            while not stop.is_set():
                interrupt()
                time.sleep(0.0002)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                try:
                    inside = True
                    hs.record({"task_id": "t", "type": "state_change", "context": {"i": 1}})
                    inside = False
                    recorded += 1
                except _Interrupt:
                    inside = False
                    interrupted += 1
        finally:
            inside = False
            stop.set()
            thread.join()
    try:
        assert interrupted > 100 and recorded > 1000
        assert hs.flush(timeout=30) is True
        assert recorded <= hs.stats["written"] <= recorded + interrupted
    finally:
        hs.close()


def test_close_stops_a_writer_process_that_is_held_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer process stopped (SIGSTOP, a hung disk) is alive but makes nothing durable:
    close(), and the exit that calls it, waited for it for good. Past ``CLOSE_STALL`` seconds
    with nothing made durable, close() kills it and writes the rest in process."""
    from hindsight_loop import record

    monkeypatch.setattr(record, "CLOSE_STALL", 2.0)
    db = tmp_path / "s.db"
    hs = Hindsight(db, writer="process", background=False, triggers=False)
    hs.record({"task_id": "t", "type": "task_start", "task_type": "x"})
    assert hs.flush(timeout=30)
    pid = hs.recorder.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(100):
            hs.record({"task_id": "t", "type": "state_change", "context": {"i": i}})
        assert hs.flush(timeout=0.5) is False
        started = time.monotonic()
        with pytest.warns(HindsightWarning, match="made nothing durable"):
            hs.close()
        assert time.monotonic() - started < 30
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert not _alive(pid)
    assert len(_rows(db)) == 101


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_hindsight_dropped_without_close_lets_go_of_its_writer_and_loses_nothing(
    tmp_path: Path, writer: str
) -> None:
    """Each Hindsight dropped without close() (a server making one per request) kept its writer
    process, its threads and its files until the exit: its review worker's thread held it
    through closures over ``self``, and the writer's threads held the recorder. Dropped, it is
    closed in the background now, and what it recorded before is stored."""
    import gc
    import weakref

    parts: list[weakref.ref[Any]] = []
    pids: list[int] = []
    for i in range(5):
        hs = Hindsight(tmp_path / f"h{i}.db", writer=writer)  # type: ignore[arg-type]
        with hs.task("t", recall=False, task_id=f"tsk_{i}") as task:
            task.record_action("read_csv", {"i": 0}, output="ok")
            if writer == "process":
                deadline = time.monotonic() + 30
                while hs.recorder.pid is None:  # started on the first event, no flush asked
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                pids.append(hs.recorder.pid)
            for j in range(1, 50):
                task.record_action("read_csv", {"i": j}, output="ok")
        parts += [weakref.ref(hs.recorder), weakref.ref(hs.worker), weakref.ref(hs.store)]
        del hs, task  # no close(), no flush()
    gc.collect()
    deadline = time.monotonic() + 60
    while any(ref() is not None for ref in parts):
        assert time.monotonic() < deadline, "a dropped Hindsight's parts are still alive"
        time.sleep(0.05)
        gc.collect()
    for pid in pids:
        _wait_gone(pid, timeout=5)
    for i in range(5):
        con = sqlite3.connect(tmp_path / f"h{i}.db")
        try:
            [(n,)] = con.execute("SELECT count(*) FROM events").fetchall()
        finally:
            con.close()
        assert n == 52  # the start, 50 calls and the end


def test_a_hindsight_dropped_just_before_the_exit_has_what_it_recorded_stored(
    tmp_path: Path,
) -> None:
    """The exit waits for the close of an object dropped just before it (its closer is a
    daemon thread, whose flush would otherwise die with the interpreter)."""
    script = textwrap.dedent(
        """
        import gc, sys
        from hindsight_loop import Hindsight
        for i, writer in enumerate(["process", "thread"]):
            hs = Hindsight(f"{sys.argv[1]}/h{i}.db", writer=writer, background=False)
            with hs.task("t", recall=False) as task:
                for j in range(2000):
                    task.user_input(str(j))
            del hs, task
            gc.collect()
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    for i in range(2):
        con = sqlite3.connect(tmp_path / f"h{i}.db")
        try:
            assert con.execute("SELECT count(*) FROM events").fetchone() == (2002,)
        finally:
            con.close()
