"""A task's outcome rates only the lessons injected into that task, once: the library, the MCP
server and the HTTP API give the same answer, and name the ids they did not count."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from hindsight_loop import Hindsight
from hindsight_loop.mcp.server import build_server
from hindsight_loop.models import Features, LessonDraft

TOKEN = "test-token-not-secret"
HINDSIGHT = str(Path(sys.executable).with_name("hindsight"))


def _book(hs: Hindsight) -> tuple[str, str]:
    """Two lessons: one a csv_cleaning task recalls, one of another task type it never sees."""
    used = hs.add_lesson(
        LessonDraft(
            task_type="csv_cleaning",
            advice="Read files exported by the old ERP with encoding='gbk'.",
            features=Features(tools=["read_csv"], keywords=["encoding", "gbk"]),
        )
    )
    other = hs.add_lesson(
        LessonDraft(
            task_type="weather_query",
            advice="Ask which city the user means before calling get_weather.",
            features=Features(tools=["get_weather"], keywords=["city"]),
        )
    )
    return used.lesson_id, other.lesson_id


def _counts(hs: Hindsight, lesson_id: str) -> tuple[int, int]:
    lesson = hs.lesson(lesson_id)
    assert lesson is not None
    return lesson.helpful, lesson.harmful


def _start(hs: Hindsight, task_id: str, injected: list[str]) -> None:
    hs.record(
        {
            "type": "task_start",
            "task_id": task_id,
            "task_type": "csv_cleaning",
            "goal": "clean the sales file",
            "injected_lesson_ids": injected,
        }
    )
    hs.flush()


def test_the_library_rates_only_the_lessons_injected_into_the_task(hs: Hindsight) -> None:
    used, other = _book(hs)
    _start(hs, "tsk_given", [used])
    rated = {used: True, other: False, "les_nowhere": False}
    got = hs.report_outcome("tsk_given", "succeeded", rated=rated)
    assert got == [used]
    assert got.ignored == [other, "les_nowhere"]
    hs.drain()
    assert _counts(hs, used) == (1, 0)
    assert _counts(hs, other) == (0, 0)  # before: (0, 1), from a task that never saw it
    # A client retrying the same report: the lesson counts once.
    again = hs.report_outcome("tsk_given", "succeeded", rated={used: True})
    assert again == [] and again.ignored == [used]
    hs.drain()
    assert _counts(hs, used) == (1, 0)


def test_a_task_with_no_lessons_injected_has_none_to_rate_and_still_ends(hs: Hindsight) -> None:
    used, _ = _book(hs)
    _start(hs, "tsk_bare", [])
    got = hs.report_outcome("tsk_bare", "failed", summary="gave up", rated={used: False})
    assert got == [] and got.ignored == [used]
    hs.drain()
    assert _counts(hs, used) == (0, 0)
    task = hs.get_task("tsk_bare")
    assert task is not None and task.status == "failed"
    with pytest.raises(KeyError):
        hs.report_outcome("tsk_none", "failed", rated={used: False})


def test_a_lesson_credited_to_the_task_mid_run_can_be_rated(hs: Hindsight) -> None:
    used, other = _book(hs)
    _start(hs, "tsk_late", [])
    hs.credit_lessons("tsk_late", [other])  # recalled mid-run, by another route
    got = hs.report_outcome("tsk_late", "succeeded", rated={other: False, used: True})
    assert got == [other] and got.ignored == [used]
    hs.drain()
    assert _counts(hs, other) == (0, 1)
    assert _counts(hs, used) == (0, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_report_outcome_names_the_ids_it_did_not_count(
    tmp_path: Path, anyio_backend: str
) -> None:
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        used, other = _book(hs)
        async with Client(build_server(hs)) as client:
            recall = await client.call_tool(
                "recall_lessons",
                {
                    "task_type": "csv_cleaning",
                    "tools": ["read_csv"],
                    "query": "encoding gbk",
                    "task_id": "tsk_mcp",
                },
            )
            assert not recall.is_error
            assert [x["lesson_id"] for x in recall.structured_content["lessons"]] == [used]  # type: ignore[index]
            start = {"type": "task_start", "task_id": "tsk_mcp", "task_type": "csv_cleaning"}
            assert not (await client.call_tool("record_event", {"event": start})).is_error
            result = await client.call_tool(
                "report_outcome",
                {
                    "task_id": "tsk_mcp",
                    "status": "succeeded",
                    "helpful_lesson_ids": [used],
                    "harmful_lesson_ids": [other],
                },
            )
            assert not result.is_error  # an answer, not an error into the agent's task
            done = result.structured_content
            assert done is not None
            assert done["lessons_updated"] == [used]
            assert done["lessons_ignored"] == [other]
            assert other in done["note"] and "recall_lessons" in done["note"]
        hs.drain()
        assert _counts(hs, used) == (1, 0)
        assert _counts(hs, other) == (0, 0)


@pytest.fixture
def served(tmp_path: Path, http_process: Any) -> Any:
    pytest.importorskip("starlette")
    pytest.importorskip("jinja2")
    db = tmp_path / "serve.db"
    with Hindsight(db, background=False) as hs:
        ids = _book(hs)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HINDSIGHT_TOKEN": TOKEN}
    http_process(HINDSIGHT, ["serve", "--db", str(db), "--port", str(port)], port, env=env)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=headers) as agent:
        yield agent, ids


def test_http_end_rates_only_the_lessons_injected_into_the_task(served: Any) -> None:
    agent, (used, other) = served
    started = agent.post(
        "/api/tasks",
        json={"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding gbk"},
    ).json()
    assert [x["lesson_id"] for x in started["lessons"]] == [used]
    ended = agent.post(
        f"/api/tasks/{started['task_id']}/end",
        json={"status": "failed", "helpful": [used], "harmful": [other]},
    )
    assert ended.status_code == 200
    body = ended.json()
    assert body["lessons_updated"] == [used] and body["lessons_ignored"] == [other]
    assert other in body["note"] and "injected_lesson_ids" in body["note"]
    assert agent.get(f"/api/lessons/{other}").json()["harmful"] == 0
    assert agent.get(f"/api/lessons/{used}").json()["helpful"] == 1
    task = agent.get(f"/api/tasks/{started['task_id']}").json()["task"]
    assert task["status"] == "failed"


# -- each task counts once ---------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def any_hs(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A facade on an SQLite file, and on a fresh PostgreSQL database: both count alike."""
    where = (
        str(tmp_path / "once.db")
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    with Hindsight(where, background=False) as hs:
        yield hs


def _end(hs: Hindsight, task_id: str, status: str) -> None:
    hs.record({"type": "task_end", "task_id": task_id, "result": {"status": status}})
    hs.drain()


def test_each_task_end_of_one_task_counts_its_lessons_once(any_hs: Hindsight) -> None:
    hs = any_hs
    used, _ = _book(hs)
    _start(hs, "tsk_thrice", [used])
    for _ in range(3):  # a duplicate task_end, a client sending the end again
        _end(hs, "tsk_thrice", "succeeded")
    assert _counts(hs, used) == (1, 0)  # before: (2, 0), then (3, 0)
    task = hs.get_task("tsk_thrice")
    assert task is not None and task.injected_lesson_ids == [used]


def test_a_later_report_that_changes_the_verdict_replaces_the_earlier_one(
    any_hs: Hindsight,
) -> None:
    hs = any_hs
    used, _ = _book(hs)
    _start(hs, "tsk_turn", [used])
    _end(hs, "tsk_turn", "succeeded")
    assert _counts(hs, used) == (1, 0)
    _end(hs, "tsk_turn", "failed")  # a person's later word: it failed
    assert _counts(hs, used) == (0, 1)  # before: (1, 1), one task counted twice
    hs.report_outcome("tsk_turn", "succeeded")  # and back
    hs.drain()
    assert _counts(hs, used) == (1, 0)
    hs.report_outcome("tsk_turn", "succeeded")  # the same word again moves nothing
    hs.drain()
    assert _counts(hs, used) == (1, 0)


def test_report_outcome_after_the_ingested_task_end_counts_once(hs: Hindsight) -> None:
    used, _ = _book(hs)
    _start(hs, "tsk_sent", [used])
    _end(hs, "tsk_sent", "succeeded")  # the whole trajectory, with its task_end
    got = hs.report_outcome("tsk_sent", "succeeded")
    assert got == [] and got.ignored == []
    hs.drain()
    assert _counts(hs, used) == (1, 0)  # before: (2, 0)


def test_a_rating_replaces_the_verdict_the_outcome_counted(hs: Hindsight) -> None:
    used, _ = _book(hs)
    _start(hs, "tsk_rated", [used])
    _end(hs, "tsk_rated", "failed")
    assert _counts(hs, used) == (0, 1)
    # A person: the task failed, but the lesson was right.
    got = hs.report_outcome("tsk_rated", "failed", rated={used: True})
    assert got == [used] and got.ignored == []
    hs.drain()
    assert _counts(hs, used) == (1, 0)  # before: (1, 1)
    # The rating keeps its word over a later outcome of the same task.
    _end(hs, "tsk_rated", "succeeded")
    _end(hs, "tsk_rated", "failed")
    assert _counts(hs, used) == (1, 0)
    # A changed rating moves the count; the same rating again is a retry.
    assert hs.report_outcome("tsk_rated", "failed", rated={used: False}) == [used]
    hs.drain()
    assert _counts(hs, used) == (0, 1)
    again = hs.report_outcome("tsk_rated", "failed", rated={used: False})
    assert again == [] and again.ignored == [used]
    hs.drain()
    assert _counts(hs, used) == (0, 1)


def test_a_rated_lesson_stays_listed_as_injected(hs: Hindsight) -> None:
    used, _ = _book(hs)
    _start(hs, "tsk_seen", [used])
    assert hs.report_outcome("tsk_seen", "succeeded", rated={used: False}) == [used]
    hs.drain()
    task = hs.get_task("tsk_seen")
    assert task is not None and task.injected_lesson_ids == [used]  # before: []
    assert _counts(hs, used) == (0, 1)


def test_a_task_id_run_again_counts_each_run(hs: Hindsight) -> None:
    used, _ = _book(hs)
    for day in ("2024-11-20", "2024-11-21"):
        hs.record(
            {
                "type": "task_start",
                "task_id": "tsk_daily",
                "task_type": "csv_cleaning",
                "timestamp": f"{day}T08:00:00Z",
                "injected_lesson_ids": [used],
            }
        )
        hs.record(
            {
                "type": "task_end",
                "task_id": "tsk_daily",
                "timestamp": f"{day}T08:05:00Z",
                "result": {"status": "succeeded"},
            }
        )
        hs.drain()
    assert _counts(hs, used) == (2, 0)


async def anyio_drain(hs: Hindsight) -> None:
    import anyio

    await anyio.to_thread.run_sync(hs.drain)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_trajectory_then_report_outcome_counts_once(
    tmp_path: Path, anyio_backend: str
) -> None:
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        used, _ = _book(hs)
        async with Client(build_server(hs)) as client:
            recall = await client.call_tool(
                "recall_lessons",
                {"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding gbk"},
            )
            assert [x["lesson_id"] for x in recall.structured_content["lessons"]] == [used]  # type: ignore[index]
            sent = await client.call_tool(
                "record_event",
                {
                    "events": [
                        {
                            "type": "task_start",
                            "task_type": "csv_cleaning",
                            "injected_lesson_ids": [used],
                        },
                        {"type": "task_end", "result": {"status": "succeeded"}},
                    ]
                },
            )
            assert not sent.is_error
            task_id = sent.structured_content["task_id"]  # type: ignore[index]
            await anyio_drain(hs)
            result = await client.call_tool(
                "report_outcome", {"task_id": task_id, "status": "succeeded"}
            )
            assert not result.is_error
            await anyio_drain(hs)
        assert _counts(hs, used) == (1, 0)  # before: (2, 0)


def test_http_end_sent_twice_counts_once(served: Any, tmp_path: Path) -> None:
    from hindsight_loop.store import open_store

    agent, (used, _) = served
    started = agent.post(
        "/api/tasks",
        json={"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding gbk"},
    ).json()
    assert [x["lesson_id"] for x in started["lessons"]] == [used]
    for _ in range(2):  # a client retrying after a lost answer
        ended = agent.post(f"/api/tasks/{started['task_id']}/end", json={"status": "succeeded"})
        assert ended.status_code == 200
    store = open_store(str(tmp_path / "serve.db"))
    try:
        deadline = time.monotonic() + 60
        while store.pending_jobs() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.pending_jobs() == 0
    finally:
        store.close()
    assert agent.get(f"/api/lessons/{used}").json()["helpful"] == 1  # before: 2
    task = agent.get(f"/api/tasks/{started['task_id']}").json()["task"]
    assert task["injected_lesson_ids"] == [used]
