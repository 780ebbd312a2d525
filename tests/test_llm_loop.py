"""LLM reflection through the facade and the CLI, against the fake server on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.llm.reflector import LLMReflector, RetryPolicy
from hindsight_loop.testing.llm_server import LLMServer, answer, hang, rejected, server_error

LESSON = {
    "advice": "You should call detect_encoding before read_csv on the ERP export.",
    "root_cause": "read_csv assumed utf-8 for a gbk-encoded export.",
    "suggestions": [
        "Detect the encoding first",
        "Pass it to read_csv",
        "Never repeat a failed read",
    ],
    "general_rule": "Find out a file's encoding before parsing it.",
    "tools": ["read_csv"],
    "error_type": "UnicodeDecodeError",
    "keywords": ["encoding", "gbk"],
}
FULL = {
    "task_goal": "clean the export",
    "execution_path": "read_csv failed twice",
    "lesson": LESSON,
}
FAST = RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.02, max_retry_after=1.0)


def failing_task(hs: Hindsight) -> str:
    with hs.task(
        "csv_cleaning", goal="clean the ERP export", tools=["read_csv", "detect_encoding"]
    ) as task:
        for _ in range(2):
            try:
                with task.action("read_csv", {"path": "a.csv", "encoding": "utf-8"}, step="parse"):
                    raise UnicodeDecodeError("utf-8", b"\xd6", 0, 1, "invalid continuation byte")
            except UnicodeDecodeError:
                pass
        task.fail("could not read a.csv")
    return task.task_id


def llm_reflector(server: LLMServer) -> LLMReflector:
    llm = OpenAILLM("strong-1", base_url=server.openai_base_url, api_key="k", timeout=0.4)
    return LLMReflector(llm, retry=FAST, owns_llm=True)


def test_a_failed_task_yields_the_models_lesson_stored_with_usage(db_path: Path) -> None:
    with (
        LLMServer([answer(FULL, tokens_in=900, tokens_out=150)]) as server,
        llm_reflector(server) as reflector,
        Hindsight(db_path, background=False) as hs,
    ):
        task_id = failing_task(hs)
        r = hs.reflect(task_id, reflector=reflector)
        assert r.status == "ok", r.error
        (stored,) = [x for x in hs.store.reflections(task_id) if x.reflection_id == r.reflection_id]
        assert stored.model == "strong-1" and stored.reflector == "openai:strong-1"
        assert (stored.tokens_in, stored.tokens_out) == (900, 150)
        assert stored.latency_ms and stored.latency_ms > 0
        lessons = [hs.store.get_lesson(i) for i in r.lesson_ids]
        assert lessons and lessons[0] is not None
        lesson = lessons[0]
        assert lesson.advice == LESSON["advice"]
        assert lesson.root_cause == LESSON["root_cause"]
        assert lesson.general_rule == LESSON["general_rule"]
        assert lesson.kind == "full_review" and lesson.source_task_ids == [task_id]
    assert "read_csv" in server.requests[0].prompt


@pytest.mark.parametrize("fault", [server_error(500), hang(10)], ids=["500", "hang"])
def test_a_failing_model_leaves_the_task_whole_and_a_failed_reflection(
    db_path: Path, fault
) -> None:
    with (
        LLMServer([fault, fault]) as server,
        llm_reflector(server) as reflector,
        Hindsight(db_path, reflector=reflector, background=True) as hs,
    ):
        task_id = failing_task(hs)
        hs.drain()
        task = hs.store.get_task(task_id)
        assert task is not None and task.status == "failed"
        # task_start, two read_csv calls, task_end: nothing lost to the failing model
        assert hs.store.event_count(task_id) == 4
        by_llm = [x for x in hs.store.reflections(task_id) if x.reflector.startswith("openai:")]
        assert by_llm and all(x.status == "failed" for x in by_llm)
        assert all("HTTP 500" in (x.error or "") or "timeout" in (x.error or "") for x in by_llm)
        assert all(x.lessons == [] and x.lesson_ids == [] for x in by_llm)


def test_hindsight_reflect_llm_uses_the_configured_model(db_path: Path) -> None:
    with Hindsight(db_path, background=False) as hs:
        task_id = failing_task(hs)
    runner = CliRunner()
    # The CLI reflector uses the default retry policy: a 401 fails at once, with no backoff.
    with LLMServer([answer(FULL), rejected(401, "invalid api key")]) as server:
        env = {
            "HINDSIGHT_LLM_BASE_URL": server.openai_base_url,
            "HINDSIGHT_LLM_MODEL": "strong-1",
            "HINDSIGHT_LLM_TIMEOUT": "1",
        }
        ok = runner.invoke(
            app, ["reflect", task_id, "--db", str(db_path), "--llm", "--json"], env=env
        )
        bad = runner.invoke(app, ["reflect", task_id, "--db", str(db_path), "--llm"], env=env)
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output)
    assert out["status"] == "ok" and out["model"] == "strong-1" and out["tokens_in"]
    assert out["lessons"][0]["advice"] == LESSON["advice"]
    assert "failed" in bad.output and "HTTP 401" in bad.output and "invalid api key" in bad.output
