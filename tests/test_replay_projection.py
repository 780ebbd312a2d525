"""Replay from the stored projection gives the chronicle of the full events, on both stores.

Each event's projection (``replay.project``: what the key-node detectors read) is worked out
at write time, by the recorder from the payload it holds, by a store from a row's body, or by a
store copy from the decoded event; replay reads the projections of a whole run and decodes
only the bodies of the steps it shows. These tests hold that path to the full decoding one.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any, get_args

import orjson
import pytest
from test_ingest import ANTHROPIC_RUN, CHINESE_RUN, OPENAI_RUN
from test_replay import T0, Run, assert_consistent, kinds

from hindsight_loop import Hindsight
from hindsight_loop.models import KeyNodeKind, iso
from hindsight_loop.replay import project_body, replay

STATUSES = ("ok", "succeeded", "failed", "error", "errored", " Failed ", "SUCCESS", "timeout")
TOOLS = ("read_csv", "write_csv", "query_db", "poll_job", "翻译")
SAID = (
    "please clean the file",
    "this is not what I asked for",
    "又错了，编码不对",
    "不错了，谢谢",
    "why did you delete the header?",
    "nothing wrong here, go on",
)


def varied_run(rng: random.Random, task_id: str, n: int, *, agents: bool) -> list[dict[str, Any]]:
    """A run as an agent records it: every status spelling, loops, wavering between tools at
    one step, complaints and praise in English and Chinese, odd results, several agents."""
    events: list[dict[str, Any]] = [
        {"type": "task_start", "task_id": task_id, "task_type": "csv", "goal": "清洗 sales.csv"}
    ]
    step = "file_parse"
    for _ in range(n):
        if rng.random() < 0.1:
            step = rng.choice(("file_parse", "写入", 3, None))  # text, Chinese, a number, none
        state: dict[str, Any] = {"current_step": step} if step is not None else {}
        if agents:
            state["agent"] = rng.choice(("planner", "coder", "审稿人"))
            state["role"] = "assistant"
        k = rng.random()
        if k < 0.5:
            tool = rng.choice(TOOLS)
            status = rng.choice(STATUSES)
            # Few distinct arguments, so the same call repeats (loops) and key order varies.
            args = {
                "path": f"/data/{rng.randint(0, 2)}.csv",
                "encoding": rng.choice(("gbk", "utf-8")),
            }
            if rng.random() < 0.5:
                args = dict(reversed(list(args.items())))
            result: dict[str, Any] = {"status": status}
            if status.strip().lower() in ("failed", "error", "errored"):
                if rng.random() < 0.7:
                    result["error_type"] = rng.choice(("UnicodeDecodeError", "超时"))
                result["error_message"] = f"codec can't decode byte 0x{rng.randint(0, 255):02x}"
            elif rng.random() < 0.1:
                result["expected_type"] = "array"
                result["output"] = {"rows": 3}
            else:
                result["output"] = {"rows": rng.randint(0, 9), "preview": "x" * rng.randint(0, 400)}
            event: dict[str, Any] = {
                "type": "action_executed",
                "input": {"tool": tool, "args": args},
            }
            if rng.random() < 0.2:
                event["decision"] = {"chosen_action": tool, "alternatives": rng.sample(TOOLS, 2)}
            event["result"] = result
        elif k < 0.7:
            event = {
                "type": "llm_decision",
                "decision": {
                    "chosen_action": rng.choice(TOOLS),
                    "alternatives": rng.sample(TOOLS, 2) if rng.random() < 0.7 else [],
                    "confidence": 0.5,
                },
            }
        elif k < 0.8:
            event = {"type": "user_input", "input": {"text": rng.choice(SAID)}}
        elif k < 0.9:
            event = {
                "type": "feedback",
                "input": {"text": rng.choice(SAID), "score": rng.choice((-1, 0, 1, None))},
            }
        else:
            event = {"type": "state_change"}
        if state:
            event["agent_state"] = state
        event["task_id"] = task_id
        events.append(event)
    events.append({"type": "task_end", "task_id": task_id, "result": {"status": "failed"}})
    return events


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_path: Any) -> str:
    """The same test against an SQLite file and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_url"))


def stored_rows(store: Any, task_id: str | None = None) -> list[tuple[str, bytes, bytes | None]]:
    """``(type, body, projection)`` of the stored events (of one task, or all)."""
    mark = "%s" if "://" in store.url and not store.url.startswith("sqlite") else "?"
    sql = "SELECT type, body, projection FROM events"
    args: tuple[Any, ...] = ()
    if task_id is not None:
        sql += f" WHERE task_id = {mark}"
        args = (task_id,)
    # SQLite keeps '' for "none", PostgreSQL NULL; rows from before the column, NULL on both.
    return [
        (t, b.encode() if isinstance(b, str) else b, p.encode() if p else None)
        for t, b, p in store._db.execute(sql, args)
    ]


def assert_same_chronicles(store: Any) -> set[str]:
    """Every stored task replays the same from its projections as from its full events (with and
    without compression); returns the kinds of key node seen."""
    seen: set[str] = set()
    for task in store.list_tasks(limit=1000):
        for max_steps in (10_000, 60):
            full = replay(task, store.events(task.task_id), max_steps=max_steps)
            projected = replay(task, store.stored_run(task.task_id), max_steps=max_steps)
            assert projected == full, task.task_id
            assert_consistent(projected)
            seen |= set(kinds(full))
    return seen


def test_a_chronicle_from_the_projection_is_the_chronicle_of_the_full_events(
    store_url: str,
) -> None:
    rng = random.Random(13)
    hs = Hindsight(store_url, background=False, triggers=False)
    try:
        for n, agents in ((40, False), (400, False), (300, True), (1500, False)):
            with hs.task("csv", goal="清洗 sales.csv", recall=False) as task:
                for event in varied_run(rng, task.task_id, n, agents=agents)[1:-1]:
                    assert hs.record(event)
        # A secret in a call's arguments: redaction changes the body, so the recorder stores no
        # projection for it (replay decodes that body) and the secret reaches no column.
        with hs.task("http", goal="fetch the report", recall=False) as task:
            for _ in range(LOOP_TIMES):
                call = {"tool": "http_get", "args": {"url": "/r", "note": "password=hunter2"}}
                failed = {"status": "error"}
                assert hs.record(
                    {
                        "type": "action_executed",
                        "task_id": task.task_id,
                        "input": call,
                        "result": failed,
                    }
                )
            said = {"text": "又错了！"}
            assert hs.record({"type": "user_input", "task_id": task.task_id, "input": said})
        secret_task = task.task_id
        # Runs imported from transcripts go through the same recorder.
        for data, fmt in (
            (OPENAI_RUN, "openai"),
            (CHINESE_RUN, "openai"),
            (ANTHROPIC_RUN, "anthropic"),
        ):
            hs.import_transcript(data, format=fmt, task_type="imported")
        hs.flush()
        store = hs.store
        # A run written straight to the store with timestamps out of the wire format: the
        # store's order is not replay's, so replay decodes and sorts it.
        odd = [
            (f"e{i}", "tsk_odd", i % 3, ts, "action_executed", body)
            for i, (ts, body) in enumerate(
                [
                    (
                        "2024-11-20T14:32:10+08:00",
                        b'{"input":{"tool":"a"},"result":{"status":"failed"}}',
                    ),
                    (
                        "2024-11-20T06:32:09.000Z",
                        b'{"input":{"tool":"b"},"result":{"status":"ok"}}',
                    ),
                    ("2024-11-20T06:32:09Z", b'{"input":{"tool":"a"},"result":{"status":"error"}}'),
                ]
            )
        ]
        store.write_event_batch(odd)

        # What the recorder worked out from the payload is the projection of the stored body.
        rows = stored_rows(store)
        assert len(rows) > 2000
        for etype, body, projection in rows:
            if projection is not None:
                assert projection == project_body(etype, body)
        secret_rows = stored_rows(store, secret_task)
        assert all(b"hunter2" not in body for _, body, _ in secret_rows)
        assert [p is None for t, _, p in secret_rows if t == "action_executed"] == [
            True
        ] * LOOP_TIMES
        # … and the two rows whose timestamps are out of the wire format carry none either.
        assert sum(p is None for _, _, p in rows) == LOOP_TIMES + 2

        kinds_seen = assert_same_chronicles(store)
        assert kinds_seen == set(get_args(KeyNodeKind))  # every detector had its say
        assert hs.replay(secret_task).key_nodes  # the loop and the complaint, read from bodies

        # Rows written before projections existed (NULL) are read from their bodies.
        long_run = store.list_tasks(task_type="csv", limit=10)[0].task_id
        task = store.get_task(long_run)
        assert task is not None
        before = replay(task, store.events(long_run))
        mark = "?" if "://" not in store_url else "%s"
        store._db.execute(
            f"UPDATE events SET projection = NULL WHERE task_id = {mark}", (long_run,)
        )
        assert replay(task, store.stored_run(long_run)) == before
    finally:
        hs.close()


LOOP_TIMES = 5


def test_a_copied_store_carries_the_projections(db_path: Any, pg_url: str) -> None:
    from hindsight_loop.store.transfer import copy_store

    rng = random.Random(21)
    src = Hindsight(db_path, background=False, triggers=False)
    dst = Hindsight(pg_url, background=False, triggers=False)
    try:
        for n in (80, 600):
            with src.task("csv", goal="清洗 sales.csv", recall=False) as task:
                for event in varied_run(rng, task.task_id, n, agents=n == 80)[1:-1]:
                    src.record(event)
        src.flush()
        copy_store(src.store, dst.store)
        rows = stored_rows(dst.store)
        assert rows and all(p is not None and p == project_body(t, b) for t, b, p in rows)
        assert assert_same_chronicles(dst.store)
        for task in src.store.list_tasks():
            assert dst.replay(task.task_id) == src.replay(task.task_id)
    finally:
        src.close()
        dst.close()


def test_the_projection_reads_only_the_bodies_it_shows(db_path: Any) -> None:
    from hindsight_loop.store.sqlite import SQLiteStore

    run = Run("tsk_long")
    run.start()
    for i in range(3000):
        run.call("read_csv", path=f"/data/{i}.csv")
        if i == 1000:
            run.call("read_csv", "failed", path="/data/x.csv")
            run.say("这不是我要的，又错了")
    rows = [
        (e.event_id, e.task_id, e.seq, e.timestamp, e.type, orjson.dumps(e.to_dict()))
        for e in run.events
    ]
    store = SQLiteStore(db_path)
    try:
        store.write_event_batch(rows)
        task = store.get_task("tsk_long")
        assert task is not None
        stored = store.stored_run("tsk_long")
        chronicle = replay(task, stored, max_steps=50)
        assert chronicle == replay(task, store.events("tsk_long"), max_steps=50)
        assert kinds(chronicle) == ["first_failure", "dissatisfaction", "recovery"]
        read = store._db.execute(
            "SELECT event_id FROM events WHERE id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(stored.read_keys),),
        )
        assert len(stored.read_keys) == len(chronicle.steps)  # each body read once
        decoded = {row[0] for row in read}
        assert decoded == {step.event_id for step in chronicle.steps}  # of 3,003 events
    finally:
        store.close()


def test_events_and_steps_built_field_by_field_have_every_field(db_path: Any) -> None:
    """The store's events and replay's steps of tool calls are built by setting their fields
    one by one (cheaper than the dataclasses' keyword ``__init__``): none is left unset, and
    each equals what ``__init__`` makes of the same fields."""
    from dataclasses import fields

    from hindsight_loop.models import Event, Step

    hs = Hindsight(db_path, background=False, triggers=False)
    try:
        rng = random.Random(5)
        for event in varied_run(rng, "tsk_fields", 200, agents=False):
            assert hs.record(event)
        hs.flush()
        events = hs.store.events("tsk_fields")
        steps = hs.replay("tsk_fields", max_steps=1 << 30).steps
        assert len(steps) == len(events) > 200
        assert any(step.type == "action_executed" for step in steps)
        for value, cls in [*((e, Event) for e in events), *((s, Step) for s in steps)]:
            given = {f.name: getattr(value, f.name) for f in fields(cls)}  # raises if unset
            assert value == cls(**given)
    finally:
        hs.close()


def test_a_store_from_before_the_projection_migrates_and_replays_the_same(db_path: Any) -> None:
    import sqlite3

    from hindsight_loop.store.migrations import migrate
    from hindsight_loop.store.sqlite import SQLiteStore

    rng = random.Random(5)
    run = varied_run(rng, "tsk_old", 300, agents=False)
    db = sqlite3.connect(db_path, isolation_level=None)
    migrate(db, upto="m008_lesson_versions")  # the schema before projections
    db.execute(
        "INSERT INTO tasks(task_id, task_type, started_at) VALUES ('tsk_old', 'csv', ?)",
        (iso(T0),),
    )
    for seq, event in enumerate(run):
        body = {k: v for k, v in event.items() if k not in ("type", "task_id")}
        db.execute(
            "INSERT INTO events(event_id, task_id, seq, ts, type, body) VALUES (?, ?, ?, ?, ?, ?)",
            (
                f"e{seq:04d}",
                "tsk_old",
                seq,
                iso(T0 + timedelta(seconds=seq)),
                event["type"],
                orjson.dumps(body).decode(),
            ),
        )
    db.close()
    store = SQLiteStore(db_path)  # upgraded on open
    try:
        task = store.get_task("tsk_old")
        assert task is not None
        full = replay(task, store.events("tsk_old"))
        assert full.key_nodes
        assert replay(task, store.stored_run("tsk_old")) == full
        # New events of the same task carry their projection; old and new replay as one.
        more = varied_run(rng, "tsk_old", 100, agents=False)[1:]
        store.write_event_batch(
            [
                (
                    f"n{seq:04d}",
                    "tsk_old",
                    1000 + seq,
                    iso(T0 + timedelta(seconds=1000 + seq)),
                    event["type"],
                    orjson.dumps({k: v for k, v in event.items() if k not in ("type", "task_id")}),
                )
                for seq, event in enumerate(more)
            ]
        )
        stored = store.stored_run("tsk_old")
        assert sum(p is not None for p in stored._projections) == len(more)
        assert replay(task, stored) == replay(task, store.events("tsk_old"))
    finally:
        store.close()


def test_the_live_watch_reads_the_stored_projection_as_it_reads_the_event() -> None:
    from hindsight_loop.models import Event
    from hindsight_loop.replay import AnomalyWatch, project_json, read_projection

    rng = random.Random(8)
    run = varied_run(rng, "tsk_live", 800, agents=True)[1:-1]
    fed, given = AnomalyWatch(), AnomalyWatch()
    found = 0
    for seq, wire in enumerate(run):
        body = {k: v for k, v in wire.items() if k not in ("type", "task_id")}
        event = Event.from_dict(
            {
                **wire,
                "event_id": f"e{seq}",
                "seq": seq,
                "timestamp": iso(T0 + timedelta(seconds=seq)),
            }
        )
        stored = read_projection(wire["type"], project_json(wire["type"], body))
        assert stored is not None
        nodes = fed.observe(event)
        assert given.observe(event, stored) == nodes
        found += len(nodes)
    assert found > 10
