"""The LangChain callback handler on a real LangGraph graph: an agent node over langchain-core's
fake chat model and LangGraph's own ``ToolNode`` (which turns a tool's exception into an error
``ToolMessage``, as a LangGraph agent does) is recorded as one task, the offline reflector learns
from the failure, and the next run gets the lesson in its messages."""

from __future__ import annotations

from typing import Any

import pytest

from hindsight_loop import Hindsight

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import (  # noqa: E402
    FakeMessagesListChatModel,
)
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from hindsight_loop.integrations.langchain import HindsightCallbackHandler  # noqa: E402


class EncodingError(ValueError):
    """The file is not in the encoding asked for."""


@tool
def read_csv(path: str, encoding: str) -> str:
    """Read a CSV file with the given encoding."""
    if encoding != "utf-8-sig":
        raise EncodingError("'utf-8' codec can't decode byte 0xef in position 0")
    return "3 rows"


@tool
def summarize(rows: int) -> str:
    """Summarize the rows read."""
    return "total 42"


def _call(call_id: str, name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"id": call_id, "name": name, "args": args}])


def _graph(*encodings: str) -> Any:
    """agent -> tools -> agent ... -> END, the shape of LangGraph's prebuilt ReAct agent."""
    model = FakeMessagesListChatModel(
        responses=[
            *(_call(f"c{i}", "read_csv", {"path": "a.csv", "encoding": e}) for i, e in
              enumerate(encodings)),
            _call("s", "summarize", {"rows": 3}),
            AIMessage("Sales total: 42"),
        ]
    )  # fmt: skip

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([read_csv, summarize], handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile()


def _calls(hs: Hindsight, task_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.input["tool"], e.input["args"], e.result["status"], e.result.get("error_type"))
        for e in hs.store.events(task_id)
        if e.type == "action_executed" and e.input and e.result
    ]


def test_a_langgraph_run_is_one_task_and_the_next_run_gets_the_lesson(hs: Hindsight) -> None:
    handler = HindsightCallbackHandler(hs, task_type="csv_report", tools=["read_csv", "summarize"])
    request = [SystemMessage("You summarize CSV files."), HumanMessage("Summarize a.csv")]

    out = _graph("utf-8", "utf-8-sig").invoke(
        {"messages": handler.inject(request)}, config={"callbacks": [handler]}
    )
    assert out["messages"][-1].content == "Sales total: 42"
    hs.flush()
    [first] = hs.tasks()
    assert first.task_id == handler.task_ids[0] and first.goal == "Summarize a.csv"
    assert first.status == "succeeded"
    calls = _calls(hs, first.task_id)
    assert [(c[0], c[1].get("encoding"), c[2]) for c in calls] == [
        ("read_csv", "utf-8", "failed"),
        ("read_csv", "utf-8-sig", "succeeded"),
        ("summarize", None, "succeeded"),
    ]
    assert calls[0][3] == "EncodingError"  # ToolNode's error text still names the exception

    reflection = hs.reflect(first.task_id)
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and "read_csv" in lesson.features.tools

    messages = handler.inject(request)
    assert len(messages) == 3 and messages[0] == request[0] and messages[2] == request[1]
    assert " ".join(lesson.advice.split()) in str(messages[1].content)
    _graph("utf-8-sig").invoke({"messages": messages}, config={"callbacks": [handler]})
    hs.flush()
    second = hs.get_task(handler.task_ids[1])
    assert second is not None and second.injected_lesson_ids == reflection.lesson_ids
    assert [c[2] for c in _calls(hs, second.task_id)] == ["succeeded", "succeeded"]
