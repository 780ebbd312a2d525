"""The LangChain callback handler: an agent loop over langchain-core's own fake chat model and
real ``@tool`` tools is recorded as one task with its tool calls, the offline reflector learns
from the failure, and the next run gets the lesson in a system message."""

from __future__ import annotations

from typing import Any

import pytest

from hindsight_loop import Hindsight

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import (  # noqa: E402
    FakeMessagesListChatModel,
)
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig, RunnableLambda  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from hindsight_loop.integrations.langchain import HindsightCallbackHandler  # noqa: E402

ENCODING_ERROR = "codec can't decode byte 0xed in position 3"


class EncodingError(ValueError):
    """The file is not in the encoding asked for."""


@tool
def read_csv(path: str, encoding: str) -> str:
    """Read a CSV file with the given encoding."""
    if encoding != "utf-8-sig":
        raise EncodingError(ENCODING_ERROR)
    return "3 rows"


@tool
def summarize(rows: int) -> str:
    """Summarize the rows read."""
    return "total 42"


TOOLS = {t.name: t for t in (read_csv, summarize)}


def _call(call_id: str, name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"id": call_id, "name": name, "args": args}])


def _model(*encodings: str) -> FakeMessagesListChatModel:
    """A scripted model: read_csv with each encoding in turn, then summarize, then answer."""
    calls = [
        _call(f"c{i}", "read_csv", {"path": "a.csv", "encoding": e})
        for i, e in enumerate(encodings)
    ]
    return FakeMessagesListChatModel(
        responses=[*calls, _call("s", "summarize", {"rows": 3}), AIMessage("Sales total: 42")]
    )


def _agent(model: FakeMessagesListChatModel) -> RunnableLambda:
    """A tool-calling loop, run as one runnable; tool errors go back to the model (as
    LangGraph's ToolNode does)."""

    def loop(messages: list[BaseMessage], config: RunnableConfig) -> str:
        messages = list(messages)
        while True:
            answer = model.invoke(messages, config)
            messages.append(answer)
            if not isinstance(answer, AIMessage) or not answer.tool_calls:
                return str(answer.content)
            for call in answer.tool_calls:
                try:
                    out = TOOLS[call["name"]].invoke(call, config)
                except Exception as exc:  # noqa: BLE001
                    out = ToolMessage(
                        f"{type(exc).__name__}: {exc}", tool_call_id=call["id"], status="error"
                    )
                messages.append(out)

    return RunnableLambda(loop)


def _calls(hs: Hindsight, task_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.input["tool"], e.input["args"], e.result["status"], e.result.get("error_type"))
        for e in hs.store.events(task_id)
        if e.type == "action_executed" and e.input and e.result
    ]


def test_langchain_run_is_recorded_reflected_and_the_next_run_gets_the_lesson(
    hs: Hindsight,
) -> None:
    handler = HindsightCallbackHandler(hs, task_type="csv_report", tools=list(TOOLS))
    request = [SystemMessage("You summarize CSV files."), HumanMessage("Summarize a.csv")]

    messages = handler.inject(request)
    assert messages == request  # nothing learned yet
    out = _agent(_model("utf-8", "utf-8-sig")).invoke(messages, {"callbacks": [handler]})
    assert out == "Sales total: 42"
    hs.flush()

    [first] = hs.tasks()
    assert first.task_id == handler.task_ids[0]
    assert first.task_type == "csv_report" and first.goal == "Summarize a.csv"
    assert first.status == "succeeded"
    assert _calls(hs, first.task_id) == [
        ("read_csv", {"path": "a.csv", "encoding": "utf-8"}, "failed", "EncodingError"),
        ("read_csv", {"path": "a.csv", "encoding": "utf-8-sig"}, "succeeded", None),
        ("summarize", {"rows": 3}, "succeeded", None),
    ]
    events = hs.store.events(first.task_id)
    failed = next(e for e in events if e.result and e.result.get("status") == "failed")
    assert failed.result["error_message"] == ENCODING_ERROR
    assert failed.result["latency_ms"] >= 0
    decisions = [e.decision["chosen_action"] for e in events if e.type == "llm_decision"]
    assert decisions == ["read_csv", "read_csv", "summarize", "reply"]

    reflection = hs.reflect(first.task_id)
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and "read_csv" in lesson.features.tools

    messages = handler.inject(request)
    assert len(messages) == 3
    system, advice, human = messages
    assert system == request[0] and human == request[1]  # the system prompt is untouched
    assert isinstance(advice, SystemMessage)
    assert " ".join(lesson.advice.split()) in str(advice.content)
    # The model, now advised, asks for utf-8-sig at once.
    _agent(_model("utf-8-sig")).invoke(messages, {"callbacks": [handler]})
    hs.flush()
    second = hs.get_task(handler.task_ids[1])
    assert second is not None and second.injected_lesson_ids == reflection.lesson_ids
    assert [s for _, _, s, _ in _calls(hs, second.task_id)] == ["succeeded", "succeeded"]


def test_a_failed_run_fails_its_task(hs: Hindsight) -> None:
    handler = HindsightCallbackHandler(hs, task_type="csv_report")

    def boom(messages: list[BaseMessage], config: RunnableConfig) -> str:
        read_csv.invoke({"path": "a.csv", "encoding": "latin-1"}, config)
        return "unreachable"

    with pytest.raises(EncodingError):
        RunnableLambda(boom).invoke([HumanMessage("Summarize a.csv")], {"callbacks": [handler]})
    hs.flush()
    [task] = hs.tasks()
    assert task.status == "failed"
    assert task.outcome and task.outcome["error_type"] == "EncodingError"
    assert _calls(hs, task.task_id)[0][2:] == ("failed", "EncodingError")


def test_a_tool_error_returned_as_text_is_a_failure(hs: Hindsight) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"Error: no such key {key!r}"

    handler = HindsightCallbackHandler(hs, task_type="lookup")
    lookup.invoke({"key": "k1"}, {"callbacks": [handler]})  # a tool alone is a task too
    hs.flush()
    [task] = hs.tasks()
    assert _calls(hs, task.task_id) == [("lookup", {"key": "k1"}, "failed", "ToolError")]
