"""A task's outcome rates only the lessons injected into that task, once: the library, the MCP
server and the HTTP API give the same answer, and name the ids they did not count."""

from __future__ import annotations

import os
import socket
import sys
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
