"""Recording: the hot path, the writer, sanitizing, redaction, dead letters, durability."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest

from hindsight_loop import Hindsight, HindsightWarning, TaskRun
from hindsight_loop.models import EVENT_BODY_FIELDS, wire_event_problem
from hindsight_loop.record import redact


def _events(hs: Hindsight, task_id: str):
    hs.flush()
    return hs.store.events(task_id)


def test_task_block_records_start_steps_and_end(hs: Hindsight) -> None:
    with hs.task("csv_cleaning", goal="clean sales.csv", tools=["read_csv"], recall=False) as task:
        task.user_input("please clean it")
        task.decision("read_csv", alternatives=["read_excel"], confidence=0.7, step="parse")
        task.state(current_step="parse", context_count=3)
        with task.action("read_csv", {"path": "sales.csv"}, step="parse") as call:
            call.result({"rows": 10})
        task.feedback("thanks", score=1)
    events = _events(hs, task.task_id)
    assert [e.type for e in events] == [
        "task_start",
        "user_input",
        "llm_decision",
        "state_change",
        "action_executed",
        "feedback",
        "task_end",
    ]
    action = events[4]
    assert action.input == {"tool": "read_csv", "args": {"path": "sales.csv"}}
    assert action.result["status"] == "succeeded"
    assert action.result["output"] == {"rows": 10}
    assert action.agent_state == {"current_step": "parse"}
    stored = hs.store.get_task(task.task_id)
    assert stored is not None
    assert stored.status == "succeeded"
    assert stored.tools == ["read_csv"]
    assert stored.event_count == 7


def test_exception_in_action_is_recorded_and_reraised(hs: Hindsight) -> None:
    with (
        pytest.raises(ValueError, match="boom"),
        hs.task("t", recall=False) as task,
        task.action("parse", {"x": 1}),
    ):
        raise ValueError("boom")
    events = _events(hs, task.task_id)
    action = next(e for e in events if e.type == "action_executed")
    assert action.result["status"] == "failed"
    assert action.result["error_type"] == "ValueError"
    assert action.result["error_message"] == "boom"
    assert events[-1].type == "task_end"
    assert events[-1].result["status"] == "failed"
    assert hs.store.get_task(task.task_id).status == "failed"


def test_explicit_fail_marks_task_failed(hs: Hindsight) -> None:
    with hs.task("t", recall=False) as task:
        task.fail("wrong output", expected=3)
    assert _events(hs, task.task_id)[-1].result == {
        "status": "failed",
        "error_message": "wrong output",
        "expected": 3,
    }


def test_tool_decorator_sync_and_async(hs: Hindsight) -> None:
    @hs.tool
    def add(a: int, b: int = 2) -> int:
        return a + b

    @hs.tool
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        if "bad" in url:
            raise ConnectionError("refused")
        return "ok"

    assert add(1) == 3  # outside a task: plain call, nothing recorded
    with hs.task("t", recall=False) as task:
        assert add(1, b=5) == 6
        assert asyncio.run(fetch("http://good")) == "ok"
        with pytest.raises(ConnectionError):
            asyncio.run(fetch("http://bad"))
    actions = [e for e in _events(hs, task.task_id) if e.type == "action_executed"]
    assert [(a.input["tool"], a.input["args"]) for a in actions] == [
        ("add", {"a": 1, "b": 5}),
        ("fetch", {"url": "http://good"}),
        ("fetch", {"url": "http://bad"}),
    ]
    assert actions[0].result["output"] == 6
    assert actions[2].result["error_type"] == "ConnectionError"


def test_tools_run_in_threads_are_the_tasks_when_the_context_goes_with_them(hs: Hindsight) -> None:
    """What the README says of threads: ``asyncio.to_thread`` carries the task's context, an
    executor does with ``contextvars.copy_context().run``, and without it the call is not the
    task's (it runs as it is)."""
    import contextvars

    @hs.tool
    def lookup(key: str) -> str:
        return key.upper()

    async def agent() -> list[str]:
        loop = asyncio.get_running_loop()
        return [
            await asyncio.to_thread(lookup, "a"),
            await loop.run_in_executor(None, contextvars.copy_context().run, lookup, "b"),
            await loop.run_in_executor(None, lookup, "c"),  # no context: not recorded
        ]

    with hs.task("t", recall=False) as task:
        assert asyncio.run(agent()) == ["A", "B", "C"]
    actions = [e for e in _events(hs, task.task_id) if e.type == "action_executed"]
    assert [a.input["args"] for a in actions] == [{"key": "a"}, {"key": "b"}]


def test_caller_timestamps_order_the_replay(hs: Hindsight) -> None:
    tid = "tsk_clock"
    hs.record(
        {
            "type": "task_start",
            "task_id": tid,
            "timestamp": "2024-11-20T14:32:00Z",
            "task_type": "t",
        }
    )
    # Sent out of order, as from two processes with their own clocks.
    hs.record(
        {
            "type": "user_input",
            "task_id": tid,
            "seq": 2,
            "timestamp": "2024-11-20T14:32:10.500Z",
            "input": {"text": "second"},
        }
    )
    hs.record(
        {
            "type": "user_input",
            "task_id": tid,
            "seq": 1,
            "timestamp": "2024-11-20T14:32:10.500Z",
            "input": {"text": "first"},
        }
    )
    hs.record(
        {
            "type": "user_input",
            "task_id": tid,
            "seq": 9,
            "timestamp": "2024-11-20T14:32:05+00:00",
            "input": {"text": "zeroth"},
        }
    )
    texts = [e.input["text"] for e in _events(hs, tid) if e.type == "user_input"]
    assert texts == ["zeroth", "first", "second"]


def test_long_text_is_cut_and_secrets_redacted(db_path: Path) -> None:
    hs = Hindsight(db_path, background=False, max_text=100)
    try:
        with (
            hs.task("t", recall=False) as task,
            task.action(
                "call_api",
                {
                    "query": "x" * 10_000_000,
                    "api_key": "abc123secretvalue",
                    "headers": {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig"},
                    "note": "use sk-proj-abcdefghijklmnopqrstuvwxyz0123 for OpenAI",
                    "dsn": "postgres://admin:hunter2@db.internal/app",
                    "password": "hunter2",
                },
            ),
        ):
            pass
        action = next(e for e in _events(hs, task.task_id) if e.type == "action_executed")
        args = action.input["args"]
        assert len(args["query"]) < 200 and args["query"].startswith("x" * 100)
        raw = orjson.dumps(action.to_dict()).decode()
        for secret in (
            "abc123secretvalue",
            "eyJhbGciOiJIUzI1NiJ9",
            "sk-proj-abcdefghij",
            "hunter2",
        ):
            assert secret not in raw
        assert args["api_key"] == "[REDACTED]"
        assert args["password"] == "[REDACTED]"
    finally:
        hs.close()


def test_redact_leaves_clean_events_alone() -> None:
    blob = orjson.dumps({"tool": "read_csv", "args": {"path": "/data/tokens.csv"}})
    assert redact(blob) == blob


def test_bad_values_are_stored_with_warnings_never_raised(hs: Hindsight) -> None:
    class Weird:
        def __repr__(self) -> str:
            return "<Weird>"

    bad_utf8 = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with (
            hs.task("t", recall=False) as task,
            task.action(
                "tool",
                {
                    "obj": Weird(),
                    "nan": math.nan,
                    "inf": -math.inf,
                    "text": bad_utf8,
                    "bytes": b"\x00\xff",
                    "set": {1},
                    3: "int key",
                },
            ),
        ):
            pass
        hs.flush()
    action = next(e for e in hs.store.events(task.task_id) if e.type == "action_executed")
    args = action.input["args"]
    assert args["obj"] == "<Weird>"
    assert args["nan"] is None and args["inf"] is None
    assert "\ufffd" in args["text"]
    assert args["3"] == "int key"
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, HindsightWarning))
    assert "stored as null" in messages
    assert "not JSON" in messages
    assert "invalid UTF-8" in messages


def test_warnings_as_errors_never_reach_the_agent(hs: Hindsight) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hs.record({"type": "nope", "task_id": "x"}) is False
        assert hs.record("not an event") is False  # type: ignore[arg-type]
        with hs.task("t", recall=False) as task, task.action("tool", {"obj": object()}):
            pass
        hs.flush()
    assert any(e.type == "action_executed" for e in hs.store.events(task.task_id))


def test_refused_events_are_kept_in_the_dead_letter_file(hs: Hindsight) -> None:
    with pytest.warns(HindsightWarning, match="unknown event type"):
        assert hs.record({"type": "bogus", "task_id": "t1"}) is False
    with pytest.warns(HindsightWarning, match="task_id"):
        assert hs.record({"type": "user_input"}) is False
    with pytest.warns(HindsightWarning, match="must be an object"):
        assert hs.record({"type": "user_input", "task_id": "t1", "input": "text"}) is False
    lines = hs.recorder.dead_letter.read_bytes().splitlines()
    assert len(lines) == 3
    assert orjson.loads(lines[0])["refused"] == {"type": "bogus", "task_id": "t1"}


def test_an_event_type_that_is_not_text_is_refused_not_raised(
    hs: Hindsight, tmp_path: Path
) -> None:
    """A list or a dict cannot be looked up among the event types, and an object's repr may
    raise: the check raised into ``hs.record``, and an import stopped at the line."""

    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    with pytest.warns(HindsightWarning, match="unknown event type of type list"):
        assert hs.record({"type": ["user_input"], "task_id": "t1"}) is False
    with pytest.warns(HindsightWarning, match="unknown event type of type dict"):
        assert hs.record({"type": {}, "task_id": "t1"}) is False
    with pytest.warns(HindsightWarning, match="unknown event type of type BadRepr"):
        assert hs.record({"type": BadRepr(), "task_id": "t1"}) is False
    lines = tmp_path / "events.jsonl"
    lines.write_text(
        '{"type": "task_start", "task_id": "t2", "task_type": "x"}\n'
        '{"type": ["user_input"], "task_id": "t2"}\n'
        '{"type": "user_input", "task_id": "t2", "input": {"text": "after"}}\n'
    )
    report = hs.import_file(lines, format="wire")
    assert report.accepted == 2
    assert len(report.problems) == 1 and "line 2" in report.problems[0]
    hs.flush()
    assert [e.input["text"] for e in hs.store.events("t2") if e.type == "user_input"] == ["after"]


def test_unknown_task_id_is_kept_and_reported(hs: Hindsight) -> None:
    with pytest.warns(HindsightWarning, match="unknown task"):
        assert hs.record({"type": "user_input", "task_id": "tsk_ghost", "input": {"text": "hi"}})
        hs.flush()
    task = hs.store.get_task("tsk_ghost")
    assert task is not None and task.task_type == "unknown"
    assert [e.input["text"] for e in hs.store.events("tsk_ghost")] == ["hi"]


def test_store_failure_goes_to_dead_letter(db_path: Path) -> None:
    hs = Hindsight(db_path, background=False, triggers=False)
    try:
        with hs.task("t", recall=False) as task:
            task.user_input("kept")
        hs.flush()
        # Make the store refuse writes: a trigger that aborts every insert into events.
        hs.store._db.execute(  # type: ignore[attr-defined]
            "CREATE TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        with pytest.warns(HindsightWarning, match="dead"):
            hs.record({"type": "user_input", "task_id": task.task_id, "input": {"text": "refused"}})
            hs.flush()
        lines = [orjson.loads(x) for x in hs.recorder.dead_letter.read_bytes().splitlines()]
        assert lines[-1]["input"] == {"text": "refused"}
        assert "disk says no" in lines[-1]["_dead_letter_reason"]
        assert hs.recorder.stats["dead_lettered"] == 1
    finally:
        hs.close()


def _compute(n: int) -> int:
    """Pure-Python work between two events, as an agent's own code does."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def test_a_cpu_busy_agent_waits_for_the_writer_so_the_backlog_stays_bounded(
    db_path: Path,
) -> None:
    """An agent's thread that computes between events wants the GIL all the time, and so does
    the writer thread preparing its batches: left alone, the writer fell behind until the queue
    was full (queue_bound, 50,000, plus two batches in flight). The agent's thread now waits for
    a batch being prepared once a batch's worth waits to be durable. Counted, not timed: the
    most events ever accepted and not yet durable, and that every one is stored."""
    from hindsight_loop.record import BATCH_SIZE

    hs = Hindsight(db_path, background=False, triggers=False, writer="thread")
    rec = hs.recorder
    args = {"path": "/data/raw/sales_2024.csv", "columns": [f"col{i}" for i in range(40)]}
    output = {"rows": [{"id": i, "name": f"row {i}", "ok": i % 3 == 0} for i in range(20)]}
    n = 60_000
    peak = 0
    try:
        with hs.task("busy", goal="compute", recall=False) as task:
            for i in range(n):
                _compute(400)
                task.record_action("read_csv", args, output=output, step=f"s{i % 50}")
                peak = max(peak, rec.pending)
        assert hs.flush()
        assert hs.store.event_count(task.task_id) == n + 2  # with task_start and task_end
    finally:
        hs.close()
    assert peak <= 3 * BATCH_SIZE, peak


def test_overload_spills_to_dead_letter_and_loses_nothing(db_path: Path) -> None:
    # The thread writer's queue (a writer process's ring holds these; its own test is in
    # test_record_process).
    hs = Hindsight(db_path, background=False, triggers=False, queue_bound=50, writer="thread")
    try:
        hs.recorder.block_seconds = 0.0  # never wait: spill at once
        # Hold the writer back: an exclusive lock from another connection.
        import sqlite3

        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.record({"type": "task_start", "task_id": "tsk_o", "task_type": "t"})
            for i in range(500):
                hs.record({"type": "user_input", "task_id": "tsk_o", "input": {"i": i}})
            assert hs.recorder.backlog <= 50
            other.execute("ROLLBACK")
            other.close()
            hs.flush()
        stored = {e.input["i"] for e in hs.store.events("tsk_o") if e.type == "user_input"}
        spilled = {
            orjson.loads(x)["input"]["i"]
            for x in hs.recorder.dead_letter.read_bytes().splitlines()
            if orjson.loads(x).get("type") == "user_input"
        }
        assert hs.recorder.stats["spilled"] > 0
        assert stored | spilled == set(range(500))
        assert not stored & spilled
    finally:
        hs.close()


def test_import_jsonl_creates_tasks_and_reports_bad_lines(hs: Hindsight, tmp_path: Path) -> None:
    lines = [
        {
            "type": "task_start",
            "task_id": "tsk_a",
            "task_type": "weather",
            "goal": "天气",
            "tools": ["get_weather"],
            "timestamp": "2024-11-20T14:32:00Z",
        },
        {
            "type": "action_executed",
            "task_id": "tsk_a",
            "timestamp": "2024-11-20T14:32:01Z",
            "input": {"tool": "get_weather", "args": {"city": "北京"}},
            "result": {"status": "succeeded"},
        },
        {
            "type": "task_end",
            "task_id": "tsk_a",
            "timestamp": "2024-11-20T14:32:02Z",
            "result": {"status": "succeeded"},
        },
        {"type": "task_start", "task_id": "tsk_b", "task_type": "flight"},
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b"\n".join(orjson.dumps(x) for x in lines) + b"\n{broken\n" + b'{"type": "x"}\n'
    )
    accepted, problems = hs.import_jsonl(path)
    assert accepted == 4
    assert len(problems) == 2 and problems[0].startswith("line 5")
    task = hs.store.get_task("tsk_a")
    assert task is not None
    assert (task.task_type, task.goal, task.status, task.event_count) == (
        "weather",
        "天气",
        "succeeded",
        3,
    )
    assert hs.store.get_task("tsk_b").status == "running"


_KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from hindsight_loop import Hindsight
    hs = Hindsight(sys.argv[1], background=False)
    with hs.task("t", recall=False, task_id="tsk_kill") as task:
        for i in range(int(sys.argv[2])):
            task.record_action("tool", {"i": i}, output="x" * 200)
    hs.flush()
    print("flushed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_right_after_flush_loses_nothing(db_path: Path) -> None:
    n = 20_000
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, str(db_path), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "flushed" in proc.stdout
    hs = Hindsight(db_path, background=False)
    try:
        events = hs.store.events("tsk_kill")
        assert len(events) == n + 2
        assert sorted(e.input["args"]["i"] for e in events if e.type == "action_executed") == list(
            range(n)
        )
    finally:
        hs.close()


def test_close_at_exit_flushes(db_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from hindsight_loop import Hindsight
        hs = Hindsight(sys.argv[1], background=False)
        with hs.task("t", recall=False, task_id="tsk_exit") as task:
            for i in range(1000):
                task.user_input(str(i))
        # no flush, no close: the process just ends
        """
    )
    subprocess.run([sys.executable, "-c", script, str(db_path)], check=True, timeout=60)
    hs = Hindsight(db_path, background=False)
    try:
        assert hs.store.event_count("tsk_exit") == 1002
    finally:
        hs.close()


def test_recording_from_many_threads(hs: Hindsight) -> None:
    import threading

    with hs.task("t", recall=False) as task:

        def work(k: int) -> None:
            for i in range(2000):
                task.record_action("tool", {"k": k, "i": i})

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert hs.flush()
    assert hs.store.event_count(task.task_id) == 8002


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_events_survive_reopen(db_path: Path) -> None:
    with Hindsight(db_path, background=False) as hs, hs.task("t", recall=False) as task:
        task.user_input("persist me")
    with Hindsight(db_path, background=False) as hs2:
        assert [e.type for e in hs2.store.events(task.task_id)] == [
            "task_start",
            "user_input",
            "task_end",
        ]


def test_procedural_tools_can_be_skipped(db_path: Path) -> None:
    with Hindsight(db_path, background=False, skip_tools=["poll_status"]) as hs:
        with hs.task("t", recall=False) as task:
            for _ in range(5):
                with task.action("poll_status", {"job": 1}):
                    pass
                task.record_action("poll_status", {"job": 1})
            task.record_action("download", {"job": 1})
        hs.flush()
        assert [e.action for e in hs.store.events(task.task_id) if e.type == "action_executed"] == [
            "download"
        ]


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ({"db.password": "hunter2"}, "hunter2"),
        ({"password2": "hunter2"}, "hunter2"),
        ({"API Key": "hunter2key"}, "hunter2key"),
        ({"pin_password": 918273}, "918273"),
        ({"tokens": ["tok_aaaaaaaa", "tok_bbbbbbbb"]}, "tok_a"),
        ({"code": 'connect(password="hunter2")'}, "hunter2"),
        ({"note": "password: hunter2"}, "hunter2"),
        ({"headers": "X-Api-Key: hunter2key"}, "hunter2key"),
        ({"repr": "User(name='a', password='hunter2')"}, "hunter2"),
        ({"text": "我的密码是 hunter2"}, "hunter2"),
        ({"text": "密码：hunter2"}, "hunter2"),
        (
            {"pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----"},
            "MIIabc",
        ),
        ({"url": "https://x.io/cb?token=hunter2&next=1"}, "hunter2"),
    ],
)
def test_secret_shapes_are_redacted(hs: Hindsight, value: dict, secret: str) -> None:
    with hs.task("t", recall=False) as task:
        task.record_action("tool", value)
    raw = orjson.dumps([e.to_dict() for e in _events(hs, task.task_id)]).decode()
    assert secret not in raw
    assert "REDACTED" in raw


def test_clean_text_is_left_alone(hs: Hindsight) -> None:
    args = {"path": "/data/tokens.csv", "text": "Reset your password in settings", "k": "keyboard"}
    with hs.task("t", recall=False) as task:
        task.record_action("tool", args)
    action = next(e for e in _events(hs, task.task_id) if e.type == "action_executed")
    assert action.input["args"] == args


def test_huge_integers_and_seq_never_kill_the_writer(hs: Hindsight) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        with hs.task("t", recall=False) as task:
            task.record_action("tool", {"rows": 2**70})
            hs.record(
                {
                    "type": "user_input",
                    "task_id": task.task_id,
                    "seq": 2**70,
                    "input": {"text": "after"},
                }
            )
        assert hs.flush(timeout=10)
    events = hs.store.events(task.task_id)
    action = next(e for e in events if e.type == "action_executed")
    assert action.input["args"]["rows"] == str(2**70)
    assert [e.input["text"] for e in events if e.type == "user_input"] == ["after"]


def test_a_reused_dict_does_not_rewrite_earlier_events(hs: Hindsight) -> None:
    with hs.task("t", recall=False, task_id="tsk_reuse") as task:
        args = {"encoding": "utf-8"}
        with task.action("read_csv", args):
            pass
        args["encoding"] = "gbk"
        event = {"type": "user_input", "task_id": "tsk_reuse", "input": {"text": "one"}}
        hs.record(event)
        event["input"] = {"text": "two"}
        hs.record(event)
    events = _events(hs, "tsk_reuse")
    assert next(e for e in events if e.type == "action_executed").input["args"] == {
        "encoding": "utf-8"
    }
    assert [e.input["text"] for e in events if e.type == "user_input"] == ["one", "two"]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_reused_event_dict_is_recorded_as_it_was_with_either_writer(
    db_path: Path, writer: Literal["thread", "process"]
) -> None:
    """``hs.record`` hands the usual event straight to the recorder's ``emit``; the writer thread
    reads it later, so it must get a copy: refilling the dict must not rewrite what was recorded."""
    with Hindsight(db_path, background=False, writer=writer) as hs:
        with hs.task("t", recall=False, task_id="tsk_reuse"):
            event = {"type": "user_input", "task_id": "tsk_reuse", "input": {"text": "one"}}
            assert hs.record(event)
            event["input"] = {"text": "two"}
            assert hs.record(event)
            event["type"] = "feedback"
            assert hs.record(event)
        hs.flush()
        events = _events(hs, "tsk_reuse")
    assert [(e.type, e.input["text"]) for e in events if e.input] == [
        ("user_input", "one"),
        ("user_input", "two"),
        ("feedback", "two"),
    ]


def test_record_accepts_exactly_what_the_wire_check_accepts(hs: Hindsight) -> None:
    """``hs.record`` judges the usual event itself, in fewer steps than ``wire_event_problem``:
    over events that differ from a good one in each field the check looks at, it accepts exactly
    what the check accepts, refuses the rest into the dead letter, and stores what it accepted."""

    class Text(str):
        pass

    good = {"type": "user_input", "task_id": "tsk_verdict", "input": {"text": "hi"}}
    odd_values = [{}, None, [], "text", 0, OrderedDict(a=1), Text("x")]
    variants: list[Any] = [good, OrderedDict(good), list(good.items()), "not an event"]
    variants += [{**good, name: v} for name in EVENT_BODY_FIELDS for v in odd_values]
    variants += [{**good, "type": v} for v in (Text("user_input"), "nope", None, ["user_input"])]
    variants += [{**good, "task_id": v} for v in ("", None, Text("tsk_verdict"), 5)]
    variants += [{k: v for k, v in good.items() if k != key} for key in ("type", "task_id")]
    variants += [{**good, "event_id": v} for v in ("evt_verdict", 5, None)]
    variants += [{**good, "seq": v} for v in (10_000, True, 2**70, "1", None)]
    variants += [{**good, "timestamp": v} for v in ("2024-11-20T14:32:10Z", 1.7e9, None)]
    expected = [wire_event_problem(v) is None for v in variants]
    assert 0 < sum(expected) < len(variants)
    with hs.task("t", recall=False, task_id="tsk_verdict"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdicts = [hs.record(v) for v in variants]
    assert verdicts == expected
    assert hs.flush(timeout=30)
    assert len(hs.store.events("tsk_verdict")) == 2 + sum(expected)
    assert len(hs.recorder.dead_letter.read_bytes().splitlines()) == len(variants) - sum(expected)


def test_events_after_close_are_kept_in_the_dead_letter(db_path: Path) -> None:
    hs = Hindsight(db_path, background=False)
    hs.close()
    with pytest.warns(HindsightWarning, match="after close"):
        hs.record({"type": "user_input", "task_id": "t", "input": {"text": "late"}})
    [line] = hs.recorder.dead_letter.read_bytes().splitlines()
    assert orjson.loads(line)["input"] == {"text": "late"}


def test_epoch_milliseconds_are_read_as_such(hs: Hindsight) -> None:
    hs.record(
        {"type": "task_start", "task_id": "tsk_ms", "task_type": "t", "timestamp": 1732084333000}
    )
    [event] = _events(hs, "tsk_ms")
    assert event.timestamp == "2024-11-20T06:32:13.000Z"


@pytest.mark.parametrize("db", [":memory:", "sqlite:///:memory:", "sqlite://:memory:"])
def test_in_memory_store_is_refused_with_the_fix(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="hindsight.db"):
        Hindsight(db)
    assert list(tmp_path.iterdir()) == []  # no file named after it either


def test_a_task_past_its_local_reviews_is_not_watched_but_still_reviewed_at_its_end(
    db_path: Path,
) -> None:
    from hindsight_loop.triggers import MAX_LOCAL_REVIEWS

    # The live rules' state is read directly: they run in this process with the writer thread.
    with Hindsight(db_path, background=False, writer="thread") as hs:
        with hs.task("api", tools=["fetch"]) as task:
            for i in range(MAX_LOCAL_REVIEWS + 3):  # more failure streaks than local reviews
                for _ in range(2):
                    task.record_action("fetch", {"i": i}, status="failed", error_type="Timeout")
                task.record_action("fetch", {"i": i})
            hs.flush()
            run = hs.triggers._running[task.task_id]
            watched = len(run.positions)
            for i in range(500):
                task.record_action("fetch", {"n": i})
            hs.flush()
            # Nothing more could be queued for it: the rules stopped reading its events.
            assert len(run.positions) == watched
            task.fail("gave up")
        hs.flush()
        kinds = [(j["kind"], j["trigger"]) for j in hs.store.jobs() if j["task_id"] == task.task_id]
        assert kinds.count(("local", "consecutive_failures")) == MAX_LOCAL_REVIEWS
        assert ("full", "task_end") in kinds


def _refuse_jobs(con: sqlite3.Connection, refuse: bool = True) -> None:
    """The store itself refuses: a trigger of SQLite's aborts every job insert while asked."""
    if refuse:
        con.executescript(
            """CREATE TABLE IF NOT EXISTS refuse(n INTEGER); INSERT INTO refuse VALUES (1);
               CREATE TRIGGER IF NOT EXISTS no_jobs BEFORE INSERT ON jobs
               WHEN (SELECT max(n) FROM refuse) > 0
               BEGIN SELECT RAISE(ABORT, 'no jobs today'); END;"""
        )
    else:
        con.execute("UPDATE refuse SET n = 0")
        con.commit()


def _failing_task(hs: Hindsight) -> TaskRun:
    """A task whose calls keep failing: a local review and a full one at its end."""
    with hs.task("api", tools=["fetch"], recall=False) as task:
        for i in range(12):
            task.record_action("fetch", {"i": i}, status="failed", error_type="Timeout")
    return task


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_reviews_the_store_refused_to_queue_are_queued_with_the_next_batch(
    db_path: Path, writer: str
) -> None:
    """A task's end is read once: a review its batch could not queue (the store refused the
    transaction) is queued with the next batch's, not lost."""
    con = sqlite3.connect(db_path)
    with Hindsight(db_path, background=False, writer=writer) as hs:  # type: ignore[arg-type]
        _refuse_jobs(con)
        first = _failing_task(hs)
        assert hs.flush()
        assert [j for j in hs.store.jobs() if j["task_id"] == first.task_id] == []
        _refuse_jobs(con, False)
        with hs.task("api", tools=["fetch"], recall=False) as second:
            for i in range(12):
                second.record_action("fetch", {"i": i})
        assert hs.flush()
        queued = {(j["task_id"], j["kind"]) for j in hs.store.jobs()}
        assert (first.task_id, "full") in queued
        assert (first.task_id, "local") in queued
        assert (second.task_id, "full") in queued
    con.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_reviews_the_store_refused_in_the_last_batch_are_queued_as_the_writer_stops(
    db_path: Path, writer: str
) -> None:
    con = sqlite3.connect(db_path)
    hs = Hindsight(db_path, background=False, writer=writer)  # type: ignore[arg-type]
    _refuse_jobs(con)
    task = _failing_task(hs)
    assert hs.flush()
    _refuse_jobs(con, False)
    hs.close()  # no later batch came: the writer tries once more as it stops
    kinds = {k for (k,) in con.execute("SELECT kind FROM jobs WHERE task_id=?", (task.task_id,))}
    con.close()
    assert kinds == {"local", "full"}


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_feedback_after_the_end_is_reviewed_where_it_stands_in_the_run(
    db_path: Path, writer: str
) -> None:
    """A complaint recorded after the task ended asks for a local review of a window around
    it, in run positions (the live rules had dropped the task at its end: the position is
    read from the store), and the rules keep nothing of the ended task afterwards."""
    with Hindsight(db_path, background=False, writer=writer) as hs:  # type: ignore[arg-type]
        with hs.task("api", tools=["fetch"], recall=False) as task:
            for i in range(20):
                task.record_action("fetch", {"i": i})
        hs.flush()
        hs.record(
            {
                "type": "feedback",
                "task_id": task.task_id,
                "input": {"text": "that's wrong, again?", "score": -1},
            }
        )
        assert hs.flush()
        [(window,)] = hs.store._db.execute(  # type: ignore[attr-defined]
            "SELECT window FROM jobs WHERE kind='local' AND task_id=?", (task.task_id,)
        ).fetchall()
        window = orjson.loads(window)
        assert window[0] <= 22 <= window[1]  # task_start, 20 calls, task_end, then the feedback
        if writer == "thread":
            assert task.task_id not in hs.triggers._running


def test_the_live_rules_read_the_event_its_row_and_payload_make() -> None:
    """``triggers.watched_event`` sets the ``Event``'s fields one by one: it equals the
    ``Event(...)`` of the same row and payload, every field set (one added to ``Event`` and
    left unset there fails this)."""
    import dataclasses

    from hindsight_loop.models import Event
    from hindsight_loop.triggers import watched_event

    row = ("evt_1", "tsk_1", 3, "2026-01-02T03:04:05.000Z", "action_executed", b"{}", None)
    data = {
        "input": {"tool": "fetch", "args": {"q": "订单"}},
        "result": {"status": "failed", "error_type": "Timeout"},
        "agent_state": {"current_step": "load"},
    }
    made = watched_event(row, data)
    assert made == Event(
        event_id="evt_1",
        task_id="tsk_1",
        seq=3,
        timestamp="2026-01-02T03:04:05.000Z",
        type="action_executed",
        agent_state=data["agent_state"],
        input=data["input"],
        result=data["result"],
    )
    assert all(hasattr(made, f.name) for f in dataclasses.fields(Event))


def test_wire_events_keep_their_own_seq_time_and_id_or_get_the_recorders(hs: Hindsight) -> None:
    with hs.task("t", recall=False, task_id="tsk_wire") as task:
        given = {
            "type": "user_input",
            "task_id": "tsk_wire",
            "event_id": "evt_given",
            "seq": 77,
            "timestamp": "2024-11-20T14:32:10.882Z",
            "input": {"text": "mine"},
        }
        assert hs.record(given)
        assert hs.record({"type": "user_input", "task_id": "tsk_wire", "input": {"text": "yours"}})
        assert given["seq"] == 77 and "input" in given and len(given) == 6  # left as it was
    hs.flush()
    by_text = {e.input["text"]: e for e in _events(hs, task.task_id) if e.type == "user_input"}
    mine, yours = by_text["mine"], by_text["yours"]
    assert (mine.event_id, mine.seq, mine.timestamp) == ("evt_given", 77, given["timestamp"])
    assert yours.event_id.startswith("evt_") and yours.seq not in (77, None)
    assert yours.timestamp.startswith(str(datetime.now(UTC).year))
    raw = orjson.dumps([e.to_dict() for e in _events(hs, task.task_id)]).decode()
    assert "object at 0x" not in raw  # the recorder's own keys never reach the body


def _opens(fd: str, path: Path) -> bool:
    """Whether this process's descriptor ``fd`` is ``path`` (the database or its WAL)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    except OSError:  # closed since it was listed
        return False


def test_close_stops_waiting_for_a_writer_thread_held_up_and_dead_letters_the_rest(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the database (``BEGIN EXCLUSIVE``): the writer thread's store call
    waits. close(), and the exit that calls it, waited as long as that call did (for good, on
    a lock never let go or a hung disk). Past ``CLOSE_STALL`` seconds with nothing made
    durable, close() stops waiting: what is not durable goes to the dead letter, and a warning
    says how many and where."""
    from hindsight_loop import record

    monkeypatch.setattr(record, "CLOSE_STALL", 1.0)
    hs = Hindsight(db_path, writer="thread", background=False, triggers=False)
    hs.record({"task_id": "t", "type": "task_start", "task_type": "x"})
    assert hs.flush(timeout=30)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            f"con = sqlite3.connect({str(db_path)!r}, isolation_level=None)\n"
            "con.execute('BEGIN EXCLUSIVE')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for i in range(100):
            hs.record({"task_id": "t", "type": "state_change", "context": {"i": i}})
        assert hs.flush(timeout=0.5) is False
        started = time.monotonic()
        with pytest.warns(HindsightWarning) as caught:
            hs.close()
        took = time.monotonic() - started
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    assert took < 15  # the store's busy timeout alone is 30 s
    # The lock let go, the call close() gave up on returns: the store closes (before, it was
    # left open for good under that call, its connections and files with it).
    hs.recorder._committer.join(timeout=30)
    assert not hs.recorder._committer.is_alive()
    assert hs.store._closed  # type: ignore[attr-defined]
    assert not [fd for fd in os.listdir("/proc/self/fd") if _opens(fd, db_path)]
    said = [str(w.message) for w in caught if "stopped waiting" in str(w.message)]
    assert len(said) == 1 and "the 100 events" in said[0], [str(w.message) for w in caught]
    assert str(hs.recorder.dead_letter) in said[0]
    kept = [orjson.loads(x) for x in hs.recorder.dead_letter.read_bytes().splitlines()]
    assert sorted(e["context"]["i"] for e in kept) == list(range(100))
    assert all("made nothing durable" in e["_dead_letter_reason"] for e in kept)
