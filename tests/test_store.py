"""The store protocol on both backends (SQLite and PostgreSQL): migrations from a blank database
and from the first schema, lessons, reflections, the review queue and its leases."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from hindsight_loop.models import Lesson, Reflection, Task, TaskScores, iso, utcnow
from hindsight_loop.store import open_store
from hindsight_loop.store.migrations import MIGRATIONS, applied, migrate
from hindsight_loop.store.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_path: Path) -> str:
    """The same test against an SQLite file and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(db_path)
    return request.getfixturevalue("pg_url")


def test_blank_database_gets_every_migration(store_url: str) -> None:
    store = open_store(store_url)
    try:
        assert store.meta()["migrations"] == [name for name, _ in MIGRATIONS]
    finally:
        store.close()


def test_upgrade_from_the_first_schema_keeps_data(db_path: Path) -> None:
    db = sqlite3.connect(db_path, isolation_level=None)
    migrate(db, upto=MIGRATIONS[0][0])
    assert applied(db) == [MIGRATIONS[0][0]]
    db.execute(
        "INSERT INTO tasks(task_id, task_type, started_at) VALUES ('tsk_old', 'legacy', ?)",
        (iso(utcnow()),),
    )
    db.close()
    store = SQLiteStore(db_path)
    try:
        assert store.meta()["migrations"] == [name for name, _ in MIGRATIONS]
        assert store.get_task("tsk_old").task_type == "legacy"
        assert store.enqueue_job("tsk_old") > 0
    finally:
        store.close()


def test_open_store_urls(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    store.close()
    assert (tmp_path / "a.db").exists()
    try:
        open_store("mysql://x")
    except ValueError as exc:
        assert "sqlite:///" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


def test_lessons_roundtrip_and_book_version(store_url: str) -> None:
    store = open_store(store_url)
    try:
        v0 = store.book_version()
        lesson = Lesson(
            lesson_id="les_1",
            task_type="csv",
            advice="You should read GBK files as gbk.",
            valid_until=iso(utcnow()),
        )
        store.save_lesson(lesson, embedding=b"\x00" * 8, embed_model="hash")
        assert store.book_version() == v0 + 1
        assert store.get_lesson("les_1") == lesson
        store.bump_hits(["les_1", "les_1"])
        assert store.get_lesson("les_1").hit_count == 1
        assert store.book_version() == v0 + 1  # hits do not invalidate recall's index
        assert store.lesson_embeddings() == {"les_1": ("hash", b"\x00" * 8)}
    finally:
        store.close()


def test_review_queue_claims_each_job_once(store_url: str) -> None:
    a, b = open_store(store_url), open_store(store_url)
    try:
        a.upsert_task(Task(task_id="tsk_1", task_type="t"))
        ids = [
            a.enqueue_job("tsk_1", kind="local", trigger="loop", window=[2, 5]) for _ in range(3)
        ]
        claimed = [a.claim_job(), b.claim_job(), a.claim_job(), b.claim_job()]
        assert sorted(j.job_id for j in claimed if j) == ids
        assert claimed[-1] is None
        assert claimed[0].window == [2, 5]
        assert a.pending_jobs() == 3  # running counts as pending until finished
        for j in claimed[:3]:
            a.finish_job(j.job_id, status="done")
        assert a.pending_jobs() == 0
    finally:
        a.close()
        b.close()


def test_jobs_queued_together_are_claimed_in_their_order(store_url: str) -> None:
    """The live rules queue a batch's reviews in one transaction (``enqueue_jobs``)."""
    store = open_store(store_url)
    try:
        store.upsert_task(Task(task_id="tsk_1", task_type="t"))
        store.enqueue_jobs([])  # nothing to queue: no transaction either
        store.enqueue_jobs(
            [
                {"task_id": "tsk_1", "kind": "local", "trigger": "loop", "window": [2, 5]},
                {"task_id": "tsk_1"},
                {"task_id": "tsk_1", "kind": "outcome", "use_llm": False},
            ]
        )
        claimed = [store.claim_job() for _ in range(4)]
        assert claimed[-1] is None
        assert [(j.kind, j.trigger, j.window, j.use_llm) for j in claimed if j] == [
            ("local", "loop", [2, 5], True),
            ("full", "task_end", None, True),
            ("outcome", "task_end", None, False),
        ]
        assert store.pending_jobs(mine=True) == 3
        # What a writer taking over from a dead one reads: every job queued, whatever its
        # status now (a review done already is not queued again).
        done = claimed[1]
        assert done is not None
        store.finish_job(done.job_id, status="done")
        assert store.queued_job_kinds("tsk_1", trigger="task_end") == {"full", "outcome"}
        assert store.queued_job_kinds("tsk_1", trigger="loop") == {"local"}
        assert store.queued_job_kinds("tsk_2", trigger="task_end") == set()
        # Since a time: a task id run again asks only for the reviews of its latest run.
        assert store.queued_job_kinds(
            "tsk_1", trigger="task_end", since="2000-01-01T00:00:00.000Z"
        ) == {"full", "outcome"}
        assert (
            store.queued_job_kinds("tsk_1", trigger="task_end", since="2999-01-01T00:00:00.000Z")
            == set()
        )
    finally:
        store.close()


def test_the_reviews_of_one_task_are_found_through_an_index(tmp_path: Path) -> None:
    """A writer taking over asks for each stored task end which reviews it has: a scan of every
    job per task held a flush 24 s beside a million old jobs."""
    SQLiteStore(tmp_path / "j.db").close()
    con = sqlite3.connect(tmp_path / "j.db")
    try:
        plan = con.execute(
            "EXPLAIN QUERY PLAN SELECT DISTINCT kind FROM jobs WHERE task_id=? AND trigger=? "
            "AND created_at >= ?",
            ("t", "task_end", "2026-01-01T00:00:00.000Z"),
        ).fetchall()
    finally:
        con.close()
    assert "USING INDEX jobs_by_task" in " ".join(str(row[-1]) for row in plan)


def test_reflections_roundtrip(store_url: str) -> None:
    store = open_store(store_url)
    try:
        r = Reflection(
            reflection_id="ref_1",
            task_id="tsk_1",
            status="suspect",
            raw_text="not json",
            model="m",
            latency_ms=12.5,
            tokens_in=10,
            tokens_out=3,
            created_at=iso(utcnow()),
        )
        store.save_reflection(r)
        assert store.reflections("tsk_1") == [r]
    finally:
        store.close()


def test_a_review_left_running_by_a_dead_worker_is_taken_back(store_url: str) -> None:
    dead, alive = open_store(store_url), open_store(store_url)
    try:
        dead.upsert_task(Task(task_id="tsk_1", task_type="t"))
        job_id = dead.enqueue_job("tsk_1")
        assert dead.claim_job().job_id == job_id  # ...and then its process dies
        assert alive.pending_jobs(mine=True) == 0  # not ours to wait for
        assert alive.claim_job() is None  # still within its lease
        taken = alive.claim_job(lease=0.0)
        assert taken is not None and taken.job_id == job_id and taken.attempts == 2
        assert alive.pending_jobs(mine=True) == 1
    finally:
        dead.close()
        alive.close()


def test_a_reflection_round_trips_through_its_wire_form_and_the_store(store_url: str) -> None:
    from hindsight_loop.models import Features, LessonDraft, Reflection, Structured

    reflection = Reflection(
        reflection_id="ref_1",
        task_id="tsk_1",
        status="ok",
        parsed={"root_cause": "wrong encoding"},
        lessons=[
            LessonDraft(
                task_type="csv",
                advice="You should try gbk first.",
                features=Features(tools=["read_csv"], error_type="UnicodeDecodeError"),
                structured=Structured(
                    when={"tool": "read_csv"},
                    prefer={"tool": "read_csv", "args": {"encoding": "gbk"}},
                ),
            )
        ],
        lesson_ids=["les_1"],
        created_at="2024-01-01T00:00:00.000Z",
    )
    assert Reflection.from_dict(reflection.to_dict()) == reflection
    store = open_store(store_url)
    store.save_reflection(reflection)
    assert store.reflections("tsk_1") == [reflection]
    store.close()


def _row(event_id: str, task_id: str, seq: int, ts: str, etype: str, body: dict) -> tuple:
    import orjson

    return (event_id, task_id, seq, ts, etype, orjson.dumps(body))


def test_a_new_task_is_adopted_after_batches_of_known_ones(store_url: str) -> None:
    """The writer remembers which tasks are stored (it skips looking them up): a task it has
    not seen is still adopted and reported, and a batch that failed teaches it nothing."""
    store = open_store(store_url)
    try:
        start = {"task_type": "csv", "goal": "g"}
        t = "2025-01-01T00:00:0{}.000Z"
        assert (
            store.write_event_batch([_row("a0", "tsk_a", 0, t.format(0), "task_start", start)])
            == []
        )
        assert (
            store.write_event_batch([_row("a1", "tsk_a", 1, t.format(1), "user_input", {})]) == []
        )
        bad = ("b1", "tsk_b", 1, t.format(2), "user_input", None)  # no body: refused
        with pytest.raises(Exception):  # noqa: B017, PT011 - each store refuses it its own way
            store.write_event_batch([_row("b0", "tsk_b", 0, t.format(2), "user_input", {}), bad])  # type: ignore[list-item]
        assert store.get_task("tsk_b") is None
        unknown = store.write_event_batch(
            [
                _row("a2", "tsk_a", 2, t.format(3), "user_input", {}),
                _row("b2", "tsk_b", 2, t.format(4), "user_input", {}),
            ]
        )
        assert unknown == ["tsk_b"]
        assert store.get_task("tsk_b").task_type == "unknown"
        assert (
            store.write_event_batch([_row("b3", "tsk_b", 3, t.format(5), "user_input", {})]) == []
        )
        assert store.event_ids("tsk_b") == {"b2", "b3"}
        assert store.event_keys("tsk_b") == {("b2", 2), ("b3", 3)}
    finally:
        store.close()


def test_event_batches_create_close_and_adopt_tasks(store_url: str) -> None:
    store = open_store(store_url)
    try:
        start = {"task_type": "csv", "goal": "清洗导出", "tools": ["read_csv"], "scope": "global"}
        call = {"input": {"tool": "read_csv", "args": {"page": 10}}, "result": {"status": "ok"}}
        unknown = store.write_event_batch(
            [
                _row("e1", "tsk_a", 0, "2025-01-01T00:00:00.000Z", "task_start", start),
                # same timestamp, later seq, written first: read back in (timestamp, seq) order
                _row("e3", "tsk_a", 2, "2025-01-01T00:00:01.000Z", "action_executed", call),
                _row("e2", "tsk_a", 1, "2025-01-01T00:00:01.000Z", "action_executed", call),
                _row("x1", "tsk_orphan", 0, "2025-01-01T00:00:05.000Z", "user_input", {}),
            ]
        )
        assert unknown == ["tsk_orphan"]
        assert (
            store.write_event_batch(
                [_row("x2", "tsk_orphan", 1, "2025-01-01T00:00:06.000Z", "user_input", {})]
            )
            == []
        )  # adopted once, not reported again
        store.write_event_batch(
            [
                _row(
                    "e4",
                    "tsk_a",
                    3,
                    "2025-01-01T00:00:02.000Z",
                    "task_end",
                    {"result": {"status": "failed"}},
                )
            ]
        )
        assert [e.event_id for e in store.events("tsk_a")] == ["e1", "e2", "e3", "e4"]
        assert store.events("tsk_a")[1].input == {"tool": "read_csv", "args": {"page": 10}}
        task = store.get_task("tsk_a")
        assert (task.goal, task.status, task.event_count) == ("清洗导出", "failed", 4)
        assert store.get_task("tsk_orphan").task_type == "unknown"
        assert store.event_ids("tsk_orphan") == {"x1", "x2"}
        assert store.event_count() == 6
        assert [t.task_id for t in store.list_tasks()] == ["tsk_orphan", "tsk_a"]
        assert [t.task_id for t in store.list_tasks(status="failed")] == ["tsk_a"]
        assert store.runs_with("csv", '"page":10', besides="tsk_b") == 1
        assert store.runs_with("csv", '"page":1', besides="tsk_b") == 0
        assert store.runs_with("csv", '"page":10', besides="tsk_a") == 0
    finally:
        store.close()


def test_what_a_task_counted_is_kept_beside_it_through_its_starts_and_ends(
    store_url: str,
) -> None:
    """The verdicts a task's run counted (``TaskScores``) round-trip, and neither the writer's
    task_start / task_end nor ``upsert_task`` touches them."""
    store = open_store(store_url)
    try:
        start = {"task_type": "csv", "injected_lesson_ids": ["les_a", "les_b"]}
        end = {"result": {"status": "succeeded"}}
        ts = "2025-01-01T00:00:00.000Z"
        store.write_event_batch([_row("s1", "tsk_k", 0, ts, "task_start", start)])
        assert store.task_scores("tsk_k") is None
        scores = TaskScores(run=ts, verdicts={"les_a": True, "les_b": False}, rated=["les_b"])
        store.save_task_scores("tsk_k", scores)
        assert store.task_scores("tsk_k") == scores
        store.write_event_batch([_row("e1", "tsk_k", 1, ts, "task_end", end)])
        store.write_event_batch([_row("e2", "tsk_k", 2, ts, "task_end", end)])
        task = store.get_task("tsk_k")
        store.upsert_task(task)
        assert store.task_scores("tsk_k") == scores
        assert task.injected_lesson_ids == ["les_a", "les_b"]
        # The same id started again: the row says which run it is now, the scores which run
        # they counted (the worker tells them apart).
        later = "2025-01-02T00:00:00.000Z"
        store.write_event_batch([_row("s2", "tsk_k", 0, later, "task_start", start)])
        assert store.get_task("tsk_k").started_at == later
        assert store.task_scores("tsk_k") == scores
        assert store.task_scores("tsk_none") is None
    finally:
        store.close()


def test_tasks_that_start_and_end_in_one_batch_are_stored_as_they_ended(store_url: str) -> None:
    """The writer applies a batch's task starts and ends together: each task gets its own
    fields, its last end in the batch decides, and an injected lesson counts a hit."""
    store = open_store(store_url)
    try:
        store.save_lesson(Lesson(lesson_id="les_hit", task_type="csv", advice="You should."))
        t = "2025-01-01T00:00:{:02d}.000Z"
        rows = []
        for i in range(30):
            tid = f"tsk_{i}"
            start = {"task_type": f"type{i % 3}", "goal": f"目标 {i}", "tools": [f"tool{i}"]}
            if i == 7:
                start["injected_lesson_ids"] = ["les_hit"]
            rows.append(_row(f"s{i}", tid, 0, t.format(i), "task_start", start))
            rows.append(_row(f"u{i}", tid, 1, t.format(i), "user_input", {"input": {"i": i}}))
            status = "failed" if i % 2 else "succeeded"
            rows.append(
                _row(f"e{i}", tid, 2, t.format(i + 1), "task_end", {"result": {"status": status}})
            )
        # Ended twice (a wrapper and the agent both said so): the later end is the one kept.
        rows.append(
            _row("e0b", "tsk_0", 3, t.format(40), "task_end", {"result": {"status": "failed"}})
        )
        assert store.write_event_batch(rows) == []
        tasks = {task.task_id: task for task in store.list_tasks(limit=100)}
        assert len(tasks) == 30
        for i in (1, 2, 7, 29):
            task = tasks[f"tsk_{i}"]
            assert (task.task_type, task.goal, task.tools) == (
                f"type{i % 3}",
                f"目标 {i}",
                [f"tool{i}"],
            )
            assert task.status == ("failed" if i % 2 else "succeeded")
            assert task.outcome == {"status": "failed" if i % 2 else "succeeded"}
            assert (task.started_at, task.ended_at) == (t.format(i), t.format(i + 1))
            assert task.event_count == 3
        assert tasks["tsk_7"].injected_lesson_ids == ["les_hit"]
        assert (tasks["tsk_0"].status, tasks["tsk_0"].ended_at) == ("failed", t.format(40))
        assert store.get_lesson("les_hit").hit_count == 1
    finally:
        store.close()


def test_tasks_read_together_are_the_tasks_read_one_by_one(store_url: str) -> None:
    """``get_tasks`` (the event writer reads a batch's ended tasks in one statement) gives, by
    id, what ``get_task`` gives for each: an id asked twice once, one not stored left out."""
    store = open_store(store_url)
    try:
        t = "2025-01-01T00:00:0{}.000Z"
        rows = []
        for i in range(3):
            start = {"task_type": "csv", "goal": f"goal {i}", "injected_lesson_ids": [f"les_{i}"]}
            rows.append(_row(f"s{i}", f"tsk_{i}", 0, t.format(i), "task_start", start))
        rows += [
            _row("a", "tsk_1", 1, t.format(4), "user_input", {"input": {"text": "x"}}),
            _row("e", "tsk_1", 2, t.format(5), "task_end", {"result": {"status": "failed"}}),
        ]
        store.write_event_batch(rows)
        asked = ["tsk_2", "tsk_0", "tsk_missing", "tsk_2", "tsk_1"]
        tasks = store.get_tasks(asked)
        assert tasks == {f"tsk_{i}": store.get_task(f"tsk_{i}") for i in (2, 0, 1)}
        assert (tasks["tsk_1"].status, tasks["tsk_1"].event_count) == ("failed", 3)
        assert tasks["tsk_0"].injected_lesson_ids == ["les_0"]
        assert store.get_tasks([]) == {}
    finally:
        store.close()


def test_tasks_with_a_nul_character_are_read_together_too(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "nul.db")
    try:
        for task_id in ("tsk\x00a", "tsk_b"):
            store.upsert_task(Task(task_id=task_id, task_type="t"))
        assert set(store.get_tasks(["tsk\x00a", "tsk_b", "tsk"])) == {"tsk\x00a", "tsk_b"}
    finally:
        store.close()


def test_reviews_queued_together_take_one_statement(tmp_path: Path) -> None:
    """The event writer's committer queues a batch's reviews with one statement, not BEGIN,
    an insert each and COMMIT (it waits for the GIL after each); NUL-holding ids too."""
    store = SQLiteStore(tmp_path / "jobs.db")
    try:
        store.upsert_task(Task(task_id="tsk_1", task_type="t"))
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        store.enqueue_jobs(
            [
                {"task_id": "tsk_1", "kind": "local", "trigger": "loop", "window": [2, 5]},
                {"task_id": "tsk_1", "kind": "outcome", "use_llm": False},
                {"task_id": "tsk_1"},
            ]
        )
        store._db.set_trace_callback(None)
        assert len(statements) == 1
        store.enqueue_jobs([{"task_id": "tsk\x00n", "kind": "full"}])
        claimed = [store.claim_job() for _ in range(5)]
        assert [(j.task_id, j.kind, j.trigger, j.window, j.use_llm) for j in claimed if j] == [
            ("tsk_1", "local", "loop", [2, 5], True),
            ("tsk_1", "outcome", "task_end", None, False),
            ("tsk_1", "full", "task_end", None, True),
            ("tsk\x00n", "full", "task_end", None, True),
        ]
        assert claimed[-1] is None
        assert store.pending_jobs(mine=True) == 4
    finally:
        store.close()


def test_text_with_a_nul_character_is_stored_whole(tmp_path: Path) -> None:
    """A batch is written as one JSON list SQLite reads with ``->>``, which ends a text at its
    first NUL character: ids and task fields holding one are stored whole all the same."""
    store = SQLiteStore(tmp_path / "nul.db")
    try:
        t = "2025-01-01T00:00:0{}.000Z"
        start = {"task_type": "csv\x00type", "goal": "clean\x00 the file 目标", "intent": "i\x00j"}
        rows = [
            _row("e\x00a", "tsk\x00a", 0, t.format(0), "task_start", start),
            _row("e\x00b", "tsk\x00a", 1, t.format(1), "user_input", {"input": {"t": "x\x00y"}}),
            _row("e\x00c", "tsk\x00b", 0, t.format(2), "task_start", {"task_type": "other"}),
            _row("e\x00d", "tsk\x00a", 2, t.format(3), "task_end", {"result": {"status": "ok"}}),
        ]
        assert store.write_event_batch(rows) == []
        task = store.get_task("tsk\x00a")
        assert (task.task_type, task.goal, task.intent) == (
            "csv\x00type",
            "clean\x00 the file 目标",
            "i\x00j",
        )
        assert (task.status, task.event_count) == ("succeeded", 3)
        assert store.get_task("tsk\x00b").task_type == "other"
        assert store.event_ids("tsk\x00a") == {"e\x00a", "e\x00b", "e\x00d"}
        assert store.events("tsk\x00a")[1].input == {"t": "x\x00y"}
    finally:
        store.close()


def test_a_failed_transaction_writes_nothing(store_url: str) -> None:
    store = open_store(store_url)
    try:
        lesson = Lesson(lesson_id="les_1", task_type="csv", advice="You should use gbk.")
        try:
            with store.transaction():
                store.save_lesson(lesson)
                raise RuntimeError("curation failed midway")
        except RuntimeError:
            pass
        assert store.get_lesson("les_1") is None
        with store.transaction():
            store.save_lesson(lesson)
        assert store.get_lesson("les_1") == lesson
    finally:
        store.close()


def test_lessons_since_a_version_are_those_saved_after_it(store_url: str) -> None:
    store = open_store(store_url)
    try:
        until = iso(utcnow())
        for i in range(3):
            store.save_lesson(
                Lesson(lesson_id=f"les_{i}", task_type="csv", advice="a", valid_until=until)
            )
        held = store.book_version()
        assert store.lessons_since(held) == (held, [])
        changed = Lesson(lesson_id="les_1", task_type="csv", advice="edited", valid_until=until)
        with store.transaction():  # one transaction: on PostgreSQL the version moves once
            store.save_lesson(changed)
            store.save_lesson(
                Lesson(lesson_id="les_new", task_type="csv", advice="b", valid_until=until)
            )
        version, saved = store.lessons_since(held)
        assert version == store.book_version() > held
        assert [x.lesson_id for x in saved] == ["les_1", "les_new"]
        assert saved[0].advice == "edited"
        assert store.lessons_since(version) == (version, [])
        assert [x.lesson_id for x in store.lessons_since(0)[1]] == [
            "les_0",
            "les_1",
            "les_2",
            "les_new",
        ]
    finally:
        store.close()


def test_postgres_upgrade_fills_the_recall_columns_of_existing_lessons(pg_url: str) -> None:
    import orjson
    import psycopg

    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.store import pg_migrations

    with psycopg.connect(pg_url, autocommit=True) as db:
        pg_migrations.migrate(db, upto="m005_job_owners")
        embedder = HashEmbedder()
        for i, advice in enumerate(["You should read GBK files as gbk.", "你应该先检查编码。"]):
            lesson = Lesson(
                lesson_id=f"les_{i}", task_type="CSV", advice=advice, valid_until=iso(utcnow())
            )
            db.execute(
                "INSERT INTO lessons(lesson_id, task_type, status, scope, updated_at, body, "
                "embedding, embed_model) VALUES (%s, %s, 'active', 'global', %s, %s, %s, %s)",
                (
                    lesson.lesson_id,
                    lesson.task_type,
                    iso(utcnow()),
                    orjson.dumps(lesson.to_dict()).decode(),
                    embedder.embed([advice])[0].tobytes(),
                    embedder.name,
                ),
            )
    store = open_store(pg_url)
    try:
        assert store.meta()["migrations"] == [name for name, _ in MIGRATIONS]
        assert store.recall_stats()[0] == 2  # type: ignore[attr-defined]
        assert store.term_frequencies(["gbk", "编码", "nowhere"]) == {"gbk": 1, "编码": 1}  # type: ignore[attr-defined]
        row = store._db.execute(  # type: ignore[attr-defined]
            "SELECT task_key, vector_dims(vec) FROM lessons WHERE lesson_id='les_0'"
        ).fetchone()
        assert row == ("csv", embedder.dim)
        indexes = store._db.execute("SELECT indexname FROM pg_indexes").fetchall()  # type: ignore[attr-defined]
        assert (f"lessons_hnsw_{embedder.dim}",) in indexes
    finally:
        store.close()


def test_a_forked_child_neither_uses_nor_closes_its_parents_connections(store_url: str) -> None:
    """A child forked from a process that had used its store read through its copy of the
    parent's connection (SQLite's locks then are the parent's; a PostgreSQL connection shares
    its socket with the parent), and its close() closed that copy: for PostgreSQL, that ended
    the parent's connection, whose next query failed. The child now connects anew and leaves
    the copies alone."""
    store = open_store(store_url)
    try:
        store.write_event_batch(
            [_row("e1", "tsk_f", 0, "2025-01-01T00:00:00.000Z", "task_start", {"task_type": "t"})]
        )
        assert store.event_count("tsk_f") == 1  # this thread's connection is open
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                code = 0 if store.event_count("tsk_f") == 1 else 2
                store.close()
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        assert store.event_count("tsk_f") == 1  # the parent's connection still works
    finally:
        store.close()


def test_children_forked_beside_threads_using_the_store_read_it(tmp_path: Path) -> None:
    """A fork while another thread was inside SQLite (a reflection worker saving lessons, a
    recall) copied SQLite's held global mutexes into the child, whose first store call then
    hung on a connection of its own: 4-5 of 150 children beside two threads writing. A fork
    now waits for the store calls under way (``store.STORE_CALLS``)."""
    store = open_store(str(tmp_path / "f.db"))
    stop = threading.Event()

    def busy(n: int) -> None:
        while not stop.is_set():
            store.upsert_task(Task(task_id=f"tsk_{n}", task_type="t", goal="g" * 300))
            store.list_tasks(limit=50)

    threads = [threading.Thread(target=busy, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    hung = 0
    try:
        for _ in range(60):
            time.sleep(0.003)
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                signal.alarm(10)  # a hung child is killed by its alarm
                try:
                    child = open_store(str(tmp_path / "f.db"))
                    for _ in range(20):
                        child.list_tasks(limit=5)
                finally:
                    os._exit(0)
            hung += os.WIFSIGNALED(os.waitpid(pid, 0)[1])
    finally:
        stop.set()
        for t in threads:
            t.join()
        store.close()
    assert hung == 0


def test_a_call_waiting_on_another_process_holds_up_one_fork_at_most(tmp_path: Path) -> None:
    """A thread waiting out SQLite's busy timeout on another process's lock is inside a store
    call for up to 30 s. A fork waits ``STORE_CALLS.WAIT`` for it, then goes ahead; before,
    each of a pool's forks waited 5 s for the same call, and so did each fork of the child,
    which kept the waiting thread's count. Now the forks after the first do not wait for it."""
    from hindsight_loop.store import STORE_CALLS

    path = str(tmp_path / "w.db")
    store = open_store(path)
    store.enqueue_job("tsk_x")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write (a CLI import)
    waiting = threading.Thread(target=store.enqueue_job, args=("tsk_y",))
    waiting.start()
    time.sleep(0.3)  # in its busy timeout now
    took = []
    try:
        for _ in range(3):
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                code = 1
                try:
                    start = time.monotonic()
                    grandchild = os.fork()
                    if grandchild == 0:
                        os._exit(0)
                    os.waitpid(grandchild, 0)
                    code = 0 if time.monotonic() - start < STORE_CALLS.WAIT / 2 else 3
                finally:
                    os._exit(code)
            took.append(time.monotonic() - start)
            assert os.waitpid(pid, 0)[1] == 0  # the child's own fork did not wait
    finally:
        holder.execute("COMMIT")
        waiting.join()
        holder.close()
        store.close()
    assert took[0] >= STORE_CALLS.WAIT * 0.9
    assert max(took[1:]) < STORE_CALLS.WAIT / 2


def test_the_connections_of_threads_that_ended_are_closed(store_url: str) -> None:
    """Each thread has a connection of its own; one whose thread ended was kept open until
    the store closed: 10,000 short-lived threads each making one call held 10,000 files (or
    PostgreSQL sessions) open. A new connection now closes those of threads that ended."""
    store = open_store(store_url)
    try:
        store.upsert_task(Task(task_id="tsk_t", task_type="t"))
        for _ in range(30):
            t = threading.Thread(target=store.get_task, args=("tsk_t",))
            t.start()
            t.join()
        assert len(store._conns) <= 2  # type: ignore[attr-defined]  # this thread's, the last one's
        assert store.get_task("tsk_t") is not None  # this thread's connection still works
    finally:
        store.close()


def test_the_curator_reads_the_lessons_recall_serves_beside_a_draft(store_url: str) -> None:
    """Not the whole book (read for every draft, it grew with every task type the book holds):
    the draft's task type in every stored spelling, and the lessons of any task type; one
    spelling saved since by another store object (a worker process) is read too."""
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.lessons import parse_import_line
    from hindsight_loop.models import LessonDraft
    from hindsight_loop.worker import Curator

    store, other = open_store(store_url), open_store(store_url)
    try:
        curator = Curator(store, lambda: HashEmbedder())
        for i, task_type in enumerate(["quotes", "Quotes ", "*", "any", "csv", "quotes_v2"]):
            store.save_lesson(Lesson(lesson_id=f"les_{i}", task_type=task_type, advice="a"))
        draft = LessonDraft(task_type="QUOTES", advice="Retry fetch_quote after a timeout.")
        assert {x.lesson_id for x in curator._book(draft)} == {"les_0", "les_1", "les_2", "les_3"}
        assert len(curator._book(LessonDraft(task_type="*", advice="a"))) == 6  # the whole book
        line = {"task_type": " quotes", "tools": ["fetch_quote"], "advice": draft.advice}
        other.save_lesson(dataclasses.replace(parse_import_line(line), lesson_id="les_new"))
        assert "les_new" in {x.lesson_id for x in curator._book(draft)}
        never = LessonDraft(task_type="QUOTES", advice="Never retry fetch_quote after a timeout.")
        change = curator.add(never)
        assert change.action == "conflict" and "les_new" in {x.lesson_id for x in change.others}
    finally:
        store.close()
        other.close()


def test_the_main_threads_connection_serves_the_exit_hooks(tmp_path: Path) -> None:
    """At the interpreter's exit threading counts the main thread as ended before the atexit
    hooks run; a connection opened by another thread then closed the main thread's, and
    close() writing the last events at exit failed ("Cannot operate on a closed database")."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import atexit, threading
        from hindsight_loop.store.sqlite import SQLiteStore

        store = SQLiteStore({str(tmp_path / "x.db")!r})

        def at_exit():
            store.event_count()  # the main thread's connection
            other = threading.Thread(target=store.event_count)  # one of its own
            other.start()
            other.join()
            print("count", store.event_count())

        atexit.register(at_exit)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "count 0" in done.stdout, done.stderr[-2000:]
