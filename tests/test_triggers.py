"""The triggers: the reviews a written batch asks for, and what they read of the store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hindsight_loop.record import Recorder
from hindsight_loop.store.sqlite import SQLiteStore
from hindsight_loop.triggers import Triggers


class _CountedReads:
    """The store, with its reads of tasks counted."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.reads: list[tuple[str, list[str]]] = []

    def get_task(self, task_id: str) -> Any:
        self.reads.append(("get_task", [task_id]))
        return self.store.get_task(task_id)

    def get_tasks(self, task_ids: list[str]) -> Any:
        self.reads.append(("get_tasks", list(task_ids)))
        return self.store.get_tasks(task_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _call(task_id: str, i: int, status: str = "succeeded") -> tuple[str, str, dict[str, Any]]:
    result: dict[str, Any] = {"status": status}
    if status == "failed":
        result["error_type"] = "Timeout"
    return (
        task_id,
        "action_executed",
        {"input": {"tool": "fetch", "args": {"i": i}}, "result": result},
    )


def _stored(
    store: SQLiteStore,
    tmp_path: Path,
    steps: list[tuple[str, str, dict[str, Any]]],
    payloads: list[Any] | None = None,
) -> list[Any]:
    """``steps`` (task id, type, payload) as the recorder prepares them, written to ``store``;
    the rows, and in ``payloads`` what the recorder hands the live rules."""
    now = time.time_ns()
    items = [
        (task_id, n, now + n, etype, payload, f"evt_{n}")
        for n, (task_id, etype, payload) in enumerate(steps)
    ]
    recorder = Recorder(store.write_event_batch, dead_letter=tmp_path / "dead.jsonl", start=False)
    rows, bad = recorder._prepare(items, payloads)
    assert not bad
    assert store.write_event_batch(rows) == []
    return rows


def test_a_batch_reads_its_ended_tasks_at_once_and_queues_their_reviews_where_they_ended(
    tmp_path: Path,
) -> None:
    """Short tasks end by the dozen in a batch: their tasks are read in one statement after
    the batch is written (one read per task end held the writer's committer each time), and
    each end's reviews keep their place among the live rules' local reviews, in run order."""
    store = SQLiteStore(tmp_path / "t.db")
    try:
        start = {"task_type": "api", "goal": "g", "tools": ["fetch"], "injected_lesson_ids": []}
        injected = {**start, "injected_lesson_ids": ["les_1"]}
        steps: list[tuple[str, str, dict[str, Any]]] = [
            ("tsk_a", "task_start", start),
            _call("tsk_a", 0, "failed"),
            _call("tsk_a", 1, "failed"),  # two failures in a row: a local review of tsk_a
            ("tsk_b", "task_start", injected),
            _call("tsk_b", 0, "failed"),  # a failed call: a full review at its end
            ("tsk_b", "task_end", {"result": {"status": "succeeded"}}),
            ("tsk_c", "task_start", start),
            ("tsk_c", "task_end", {"result": {"status": "succeeded"}}),  # too short: none
            ("tsk_a", "task_end", {"result": {"status": "failed"}}),
            ("tsk_d", "task_start", start),
            _call("tsk_d", 0, "failed"),
            _call("tsk_d", 1, "failed"),
            ("tsk_d", "task_end", {"result": {"status": "failed"}}),
        ]
        payloads: list[Any] = []
        rows = _stored(store, tmp_path, steps, payloads)
        counted = _CountedReads(store)
        woken: list[int] = []
        triggers = Triggers(
            counted,  # type: ignore[arg-type]
            review_min_events=10,
            live=True,
            wake=lambda: woken.append(1),
        )
        triggers.on_batch(rows, payloads)
        assert counted.reads == [("get_tasks", ["tsk_b", "tsk_c", "tsk_a", "tsk_d"])]
        queued = [(j["task_id"], j["kind"], j["trigger"]) for j in reversed(store.jobs())]
        assert queued == [
            ("tsk_a", "local", "consecutive_failures"),
            ("tsk_b", "outcome", "task_end"),
            ("tsk_b", "full", "task_end"),
            ("tsk_a", "full", "task_end"),
            ("tsk_d", "local", "consecutive_failures"),
            ("tsk_d", "full", "task_end"),
        ]
        assert woken == [1]
        assert triggers._running == {}
    finally:
        store.close()


def test_reviews_a_dead_writer_kept_are_queued_once_and_kept_while_the_store_refuses(
    tmp_path: Path,
) -> None:
    """``requeue``: the reviews a writer that died had kept for a later try (the store refused
    them) are queued by the one taking over; an end review the dead one queued after all (it
    died before it said so) is not queued twice. While the store still refuses, they are kept
    for this writer's next batch, and whoever keeps the copy is told either way."""
    import sqlite3

    db = tmp_path / "q.db"
    store = SQLiteStore(db)
    try:
        start = {"task_type": "api", "goal": "g", "tools": ["fetch"], "injected_lesson_ids": []}
        steps = [
            ("tsk_a", "task_start", start),
            ("tsk_a", "task_end", {"result": {"status": "failed"}}),
            ("tsk_b", "task_start", start),
            ("tsk_b", "task_end", {"result": {"status": "failed"}}),
        ]
        _stored(store, tmp_path, steps)
        store.enqueue_jobs([{"task_id": "tsk_a", "kind": "full", "trigger": "task_end"}])
        told: list[list[dict[str, Any]]] = []
        woken: list[int] = []
        triggers = Triggers(
            store,
            review_min_events=10,
            live=True,
            wake=lambda: woken.append(1),
            on_unqueued=told.append,
        )
        kept = [
            {"task_id": "tsk_a", "kind": "full", "trigger": "task_end"},
            {
                "task_id": "tsk_a",
                "kind": "local",
                "trigger": "consecutive_failures",
                "window": [0, 1],
            },
            {"task_id": "tsk_b", "kind": "full", "trigger": "task_end"},
        ]
        con = sqlite3.connect(db)
        con.executescript(
            "CREATE TRIGGER refuse BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'no'); END;"
        )
        triggers.requeue(kept)
        assert triggers._unqueued == kept[1:] and told == [kept[1:]] and woken == []
        con.executescript("DROP TRIGGER refuse;")
        con.close()
        triggers.on_batch([], [])  # the writer's last try, as it stops
        queued = [(j["task_id"], j["kind"], j["trigger"]) for j in reversed(store.jobs())]
        assert queued == [
            ("tsk_a", "full", "task_end"),
            ("tsk_a", "local", "consecutive_failures"),
            ("tsk_b", "full", "task_end"),
        ]
        assert triggers._unqueued == [] and told[-1] == [] and woken == [1]
    finally:
        store.close()
