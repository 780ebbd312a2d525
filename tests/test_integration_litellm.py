"""The LiteLLM callback logger: an agent loop over LiteLLM's own mock responses (``mock_tool_calls``
/ ``mock_response``: no network) with real tools is recorded into its task with its tool calls,
the offline reflector learns from the failure, and the next run's messages carry the lesson."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from hindsight_loop import Hindsight

# LiteLLM fetches its model price list at import unless told to use the copy it ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

from hindsight_loop.integrations.litellm import HindsightLiteLLM  # noqa: E402

# LiteLLM's own pydantic models warn about their ReadOnly TypedDicts when first built.
pytestmark = pytest.mark.filterwarnings("ignore:Item.*ReadOnly.*:UserWarning")

MODEL = "gpt-4o-mini"
ENCODING_ERROR = "EncodingError: 'utf-8' codec can't decode byte 0xef in position 0"


def read_csv(path: str, encoding: str) -> str:
    if encoding != "utf-8-sig":
        return ENCODING_ERROR
    return "3 rows"


def summarize(rows: int) -> str:
    return "total 42"


TOOLS = {"read_csv": read_csv, "summarize": summarize}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _script(*encodings: str) -> list[dict[str, Any]]:
    """What the scripted model answers, turn by turn: read_csv with each encoding, summarize,
    then the reply."""
    turns = [
        {"mock_tool_calls": [_call(f"c{i}", "read_csv", f'{{"path": "a.csv", "encoding": "{e}"}}')]}
        for i, e in enumerate(encodings)
    ]
    turns.append({"mock_tool_calls": [_call("s", "summarize", '{"rows": 3}')]})
    turns.append({"mock_response": "Sales total: 42"})
    return turns


def _agent(messages: list[dict[str, Any]], script: list[dict[str, Any]]) -> str:
    """A tool-calling loop: the model's tool calls are run and their results sent back."""
    import json

    messages = list(messages)
    for turn in script:
        answer = litellm.completion(model=MODEL, messages=messages, **turn).choices[0].message
        if not answer.tool_calls:
            return str(answer.content)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call(c.id, c.function.name, c.function.arguments) for c in answer.tool_calls
                ],
            }
        )
        for call in answer.tool_calls:
            out = TOOLS[call.function.name](**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    raise AssertionError("the script ended without a reply")


def _events(hs: Hindsight, task_id: str, decisions: int) -> list[Any]:
    """The task's events, once LiteLLM's logging threads have delivered its decisions."""
    deadline = time.monotonic() + 20
    while True:
        hs.flush()
        events = hs.store.events(task_id)
        if sum(e.type == "llm_decision" for e in events) >= decisions:
            return events
        assert time.monotonic() < deadline, f"decisions not recorded: {events}"
        time.sleep(0.05)


def _calls(events: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (e.input["tool"], e.input["args"], e.result["status"], e.result.get("error_type"))
        for e in events
        if e.type == "action_executed" and e.input and e.result
    ]


@pytest.fixture
def logger(hs: Hindsight):  # noqa: ANN201
    handler = HindsightLiteLLM(hs)
    litellm.callbacks = [handler]
    yield handler
    # LiteLLM copies its callbacks into lists of its own at the first call: take it off them all.
    litellm.logging_callback_manager.remove_callback_from_all_lists(handler)
    litellm.callbacks = []


def test_litellm_run_is_recorded_reflected_and_the_next_run_gets_the_lesson(
    hs: Hindsight, logger: HindsightLiteLLM
) -> None:
    request = [
        {"role": "system", "content": "You summarize CSV files."},
        {"role": "user", "content": "Summarize a.csv"},
    ]
    with hs.task("csv_report", goal="Summarize a.csv", tools=list(TOOLS)) as task:
        assert hs.inject(request, task.lessons) == request  # nothing learned yet
        assert _agent(request, _script("utf-8", "utf-8-sig")) == "Sales total: 42"
        assert logger.wait()
    events = _events(hs, task.task_id, decisions=4)
    assert _calls(events) == [
        ("read_csv", {"path": "a.csv", "encoding": "utf-8"}, "failed", "EncodingError"),
        ("read_csv", {"path": "a.csv", "encoding": "utf-8-sig"}, "succeeded", None),
        ("summarize", {"rows": 3}, "succeeded", None),
    ]
    failed = next(e for e in events if e.result and e.result.get("status") == "failed")
    assert failed.result["error_message"] == ENCODING_ERROR
    assert failed.result["latency_ms"] >= 0
    decisions = [e.decision["chosen_action"] for e in events if e.type == "llm_decision"]
    assert decisions == ["read_csv", "read_csv", "summarize", "reply"]
    stored = hs.get_task(task.task_id)
    assert stored is not None and stored.status == "succeeded"

    reflection = hs.reflect(task.task_id)
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and "read_csv" in lesson.features.tools

    with hs.task("csv_report", goal="Summarize a.csv", tools=list(TOOLS)) as second:
        messages = hs.inject(request, second.lessons)
        system, advice, user = messages
        assert system == request[0] and user == request[1]  # the system prompt is untouched
        assert " ".join(lesson.advice.split()) in advice["content"]
        _agent(messages, _script("utf-8-sig"))  # advised, the model asks for utf-8-sig at once
        assert logger.wait()
    events = _events(hs, second.task_id, decisions=3)
    assert [s for _, _, s, _ in _calls(events)] == ["succeeded", "succeeded"]
    stored = hs.get_task(second.task_id)
    assert stored is not None and stored.injected_lesson_ids == reflection.lesson_ids


def test_async_completions_and_a_failed_call_are_recorded(
    hs: Hindsight, logger: HindsightLiteLLM
) -> None:
    async def run() -> None:
        messages = [{"role": "user", "content": "hi"}]
        await litellm.acompletion(model=MODEL, messages=messages, mock_response="hello")
        with pytest.raises(Exception, match="rate limited"):
            await litellm.acompletion(
                model=MODEL, messages=messages, mock_response=Exception("rate limited"),
                num_retries=0,
            )  # fmt: skip
        assert await logger.await_recorded()

    with hs.task("chat", goal="say hi") as task:
        asyncio.run(run())
    events = _events(hs, task.task_id, decisions=2)
    decisions = [e for e in events if e.type == "llm_decision"]
    assert [d.decision["chosen_action"] for d in decisions] == ["reply", "error"]
    assert decisions[1].result["status"] == "failed"
    assert "rate limited" in decisions[1].result["error_message"]


def test_calls_outside_a_task_are_not_recorded_unless_named(
    hs: Hindsight, logger: HindsightLiteLLM
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    litellm.completion(model=MODEL, messages=messages, mock_response="hello")
    with hs.task("chat", goal="say hi") as task:
        pass
    litellm.completion(
        model=MODEL,
        messages=messages,
        mock_response="named",
        metadata={"hindsight_task_id": task.task_id},
    )
    events = _events(hs, task.task_id, decisions=1)
    assert [e.decision.get("reasoning") for e in events if e.type == "llm_decision"] == ["named"]
    assert len(hs.tasks()) == 1
