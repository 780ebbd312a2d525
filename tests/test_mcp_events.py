"""What the gateway writes: bounded result summaries and one error taxonomy for both error paths."""

from __future__ import annotations

import base64

import mcp_types as types
import pytest
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_TIMEOUT

from hindsight_loop.mcp.events import (
    ADVICE_MARKER,
    action_event,
    advice_text,
    classify_jsonrpc_error,
    classify_result_error,
    summarize_content,
)
from hindsight_loop.models import Event, Features, Lesson
from hindsight_loop.recall import LessonSet


def _result(*texts: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=t) for t in texts], is_error=is_error
    )


def test_summary_keeps_text_names_binary_and_is_bounded() -> None:
    image = types.ImageContent(
        type="image", data=base64.b64encode(b"x" * 300).decode(), mime_type="image/png"
    )
    link = types.ResourceLink(type="resource_link", uri="file:///r.txt", name="r")
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text="北京时间 12:00"), image, link]
    )
    summary = summarize_content(result)
    assert summary.splitlines() == [
        "北京时间 12:00",
        "[image image/png, 300 bytes]",
        "[resource link file:///r.txt]",
    ]
    long = summarize_content(_result("a" * 2000), limit=100)
    assert len(long) == 100 and long.endswith("…")


def test_summary_falls_back_to_structured_content() -> None:
    result = types.CallToolResult(content=[], structured_content={"rows": 3})
    assert summarize_content(result) == '{"rows":3}'


@pytest.mark.parametrize(
    ("text", "known", "fit", "expected"),
    [
        ("Error: Invalid timezone 'Mars/Base'", True, True, "tool_error"),
        (
            "1 validation error for Args\ntimezone  Input should be a valid string",
            True,
            False,
            "invalid_arguments",
        ),
        ("Input validation error: 5 is not of type 'string'", True, None, "invalid_arguments"),
        ("Missing required argument: timezone", True, True, "invalid_arguments"),
        # A tool's own complaint about its data is not an argument problem when the args fit.
        ("validation error in row 3 of the sheet", True, True, "tool_error"),
        ("Error processing query: Unknown tool: nope", False, None, "unknown_tool"),
    ],
)
def test_is_error_results_classify(text: str, known: bool, fit: bool | None, expected: str) -> None:
    result = _result(text, is_error=True)
    assert classify_result_error(result, known_tool=known, arguments_fit=fit) == expected


@pytest.mark.parametrize(
    ("code", "message", "known", "expected"),
    [
        (INVALID_PARAMS, "Unknown tool: nope", True, "unknown_tool"),
        (INVALID_PARAMS, "Invalid params", False, "unknown_tool"),
        (INVALID_PARAMS, "Invalid arguments for tool x", True, "invalid_arguments"),
        (METHOD_NOT_FOUND, "Method not found", False, "unknown_tool"),
        (CONNECTION_CLOSED, "Connection closed", True, "upstream_unavailable"),
        (REQUEST_TIMEOUT, "Request 'tools/call' timed out", True, "timeout"),
        (-32000, "Server busy", True, "jsonrpc_error"),
        (-32603, "Internal error", True, "jsonrpc_error"),
    ],
)
def test_jsonrpc_errors_classify(code: int, message: str, known: bool, expected: str) -> None:
    assert classify_jsonrpc_error(code, message, known_tool=known) == expected


def test_action_event_is_valid_wire_format() -> None:
    failed = action_event(
        task_id="tsk_1",
        tool="time__now",
        arguments={"tz": "X"},
        server="time",
        timestamp=1,
        latency_ms=1.23456,
        output=None,
        is_error=False,
        error_type="unknown_tool",
        error_message="Unknown tool: now",
        error_code=INVALID_PARAMS,
        upstream_tool="now",
    )
    event = Event.from_dict(failed)
    assert event.action == "time__now" and event.failed
    assert event.input == {
        "tool": "time__now",
        "args": {"tz": "X"},
        "server": "time",
        "upstream_tool": "now",
    }
    assert event.result is not None and event.result["error_code"] == INVALID_PARAMS
    assert event.result["latency_ms"] == 1.235
    ok = action_event(
        task_id="tsk_1",
        tool="now",
        arguments=None,
        server="time",
        timestamp=1,
        latency_ms=1,
        output="12:00",
        is_error=False,
    )
    assert ok["input"] == {"tool": "now", "args": {}, "server": "time"}
    assert ok["result"]["status"] == "succeeded" and "error_type" not in ok["result"]


def test_advice_text_is_marked_and_uses_the_lesson_prompt() -> None:
    lessons = LessonSet(
        [
            Lesson(
                lesson_id="les_1",
                task_type="t",
                advice="Use IANA names like Asia/Tokyo.",
                features=Features(tools=["get_current_time"]),
            )
        ]
    )
    text = advice_text(lessons)
    assert text.startswith(ADVICE_MARKER)
    assert "[get_current_time] Use IANA names like Asia/Tokyo." in text
    assert "Use X." in advice_text([Lesson(lesson_id="les_2", task_type="t", advice="Use X.")])
