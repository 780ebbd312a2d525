"""The OpenAI Agents SDK integration: a run of an agent with two function tools, driven by the
SDK's own ScriptedModel, is recorded as one task through the tracing processor and run hooks;
the offline reflector learns from the failure; the next run gets the advice in its
instructions (seen by the model) and is credited with the lesson."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hindsight_loop import Hindsight

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool, set_trace_processors  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from hindsight_loop.integrations.openai_agents import HindsightAgents  # noqa: E402

ENCODING_ERROR = "codec can't decode byte 0xed in position 3"


class EncodingError(ValueError):
    """The file is not in the encoding asked for."""


# The README's advice: keep the error's type and text (the SDK hides them by default).
@function_tool(failure_error_function=lambda ctx, e: f"{type(e).__name__}: {e}")
def read_csv(path: str, encoding: str) -> str:
    """Read a CSV file with the given encoding."""
    if encoding != "utf-8-sig":
        raise EncodingError(ENCODING_ERROR)
    return "3 rows"


@function_tool
def summarize(rows: int) -> str:
    """Summarize the rows read."""
    return "total 42"


@function_tool
def fetch(url: str) -> str:
    """Fetch a page (fails, with the SDK's default error handling)."""
    raise TimeoutError("upstream timed out")


@pytest.fixture
def hindsight(hs: Hindsight) -> Iterator[HindsightAgents]:
    processor = HindsightAgents(hs, task_type="csv_report")
    set_trace_processors([processor])  # only ours: no trace leaves the machine
    yield processor
    set_trace_processors([])


def _model(*encodings: str) -> ScriptedModel:
    steps: list[Any] = [
        [function_call("read_csv", {"path": "a.csv", "encoding": e}, call_id=f"c{i}")]
        for i, e in enumerate(encodings)
    ]
    steps.append([function_call("summarize", {"rows": 3}, call_id="s")])
    steps.append([assistant_message("Sales total: 42")])
    return ScriptedModel(steps)


def _run(hindsight: HindsightAgents, model: ScriptedModel, tools: list[Any] | None = None) -> Any:
    agent = Agent(
        name="csv_agent",
        instructions="You summarize CSV files.",
        model=model,
        tools=tools or [read_csv, summarize],
    )
    return asyncio.run(
        Runner.run(
            agent, "Summarize a.csv", hooks=hindsight.hooks, run_config=hindsight.run_config()
        )
    )


def _calls(hs: Hindsight, task_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.input["tool"], e.input["args"], e.result["status"], e.result.get("error_type"))
        for e in hs.store.events(task_id)
        if e.type == "action_executed" and e.input and e.result
    ]


def test_agents_run_is_recorded_reflected_and_the_next_run_gets_the_lesson(
    hs: Hindsight, hindsight: HindsightAgents
) -> None:
    model = _model("utf-8", "utf-8-sig")
    assert _run(hindsight, model).final_output == "Sales total: 42"
    hs.flush()

    [first] = hs.tasks()
    assert first.task_id == hindsight.task_ids[0]
    assert first.task_type == "csv_report" and first.goal == "Summarize a.csv"
    assert first.status == "succeeded"
    assert sorted(first.tools) == ["read_csv", "summarize"]
    assert _calls(hs, first.task_id) == [
        ("read_csv", {"path": "a.csv", "encoding": "utf-8"}, "failed", "EncodingError"),
        ("read_csv", {"path": "a.csv", "encoding": "utf-8-sig"}, "succeeded", None),
        ("summarize", {"rows": 3}, "succeeded", None),
    ]
    events = hs.store.events(first.task_id)
    failed = next(e for e in events if e.result and e.result.get("status") == "failed")
    assert ENCODING_ERROR in failed.result["error_message"]
    assert failed.result["latency_ms"] >= 0
    decisions = [e.decision["chosen_action"] for e in events if e.type == "llm_decision"]
    assert decisions == ["read_csv", "read_csv", "summarize", "reply"]
    assert model.calls[0].system_instructions == "You summarize CSV files."

    reflection = hs.reflect(first.task_id)
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and "read_csv" in lesson.features.tools

    advised = _model("utf-8-sig")
    _run(hindsight, advised)
    hs.flush()
    seen = advised.calls[0].system_instructions or ""
    assert seen.startswith("You summarize CSV files.")  # the agent's own instructions first
    assert " ".join(lesson.advice.split()) in seen
    second = hs.get_task(hindsight.task_ids[1])
    assert second is not None and second.injected_lesson_ids == reflection.lesson_ids
    assert [s for _, _, s, _ in _calls(hs, second.task_id)] == ["succeeded", "succeeded"]


def test_a_hidden_tool_error_is_recorded_as_the_sdk_shows_it(
    hs: Hindsight, hindsight: HindsightAgents
) -> None:
    model = ScriptedModel(
        [
            [function_call("fetch", {"url": "https://example.org"}, call_id="f1")],
            [assistant_message("I could not fetch it.")],
        ]
    )
    _run(hindsight, model, tools=[fetch])
    hs.flush()
    [task] = hs.tasks()
    [(tool, args, status, error_type)] = _calls(hs, task.task_id)
    assert (tool, args, status) == ("fetch", {"url": "https://example.org"}, "failed")
    assert error_type  # ToolError: the SDK redacts the exception by default
