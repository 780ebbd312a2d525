"""Turn what crosses the MCP boundary into Hindsight's wire-format events.

Pure functions of MCP values, kept apart from the gateway's I/O so the one error taxonomy and the
bounded result summary are defined (and tested) in one place. Both ways an MCP server can report
a failure, an ``isError`` tool result and a JSON-RPC error, end up in the same ``error_type``
vocabulary, so a lesson learned from one server's wording applies to another's.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import mcp_types as types
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_TIMEOUT

ErrorType = Literal[
    "tool_error",
    "invalid_arguments",
    "unknown_tool",
    "jsonrpc_error",
    "timeout",
    "upstream_unavailable",
    "cancelled",
]
"""Every failed call gets exactly one of these:

- ``tool_error``: the tool ran and reported a failure (``isError`` result).
- ``invalid_arguments``: the arguments do not fit the tool's input schema (either way of reporting).
- ``unknown_tool``: no upstream offers a tool of that name.
- ``jsonrpc_error``: any other JSON-RPC error response (``error_code`` holds the code).
- ``timeout``: the call did not answer within the gateway's ``timeout``.
- ``upstream_unavailable``: the server could not be reached or its connection broke.
- ``cancelled``: the client cancelled the call before it answered (``notifications/cancelled``);
  the upstream was told, and whatever it did is unknown.
"""

#: Marks the advice block the gateway appends with ``--advise``, so people and programs can tell
#: it from the tool's own output.
ADVICE_MARKER = "[Hindsight advice]"

# Wording servers use for the two client-side mistakes. Used only when the schema check cannot
# decide (no schema, or a server stricter than its schema).
_UNKNOWN_TOOL = re.compile(
    r"unknown tool|tool .{0,80}not found|no such tool|not a known tool", re.I
)
_BAD_ARGS = re.compile(
    r"validation error|invalid (?:argument|param|input)|missing required|required (?:argument|property)"
    r"|is a required property|is not of type|unexpected keyword argument",
    re.I,
)
_STRICT_BAD_ARGS = re.compile(r"missing required argument|invalid argument", re.I)


def summarize_content(result: types.CallToolResult, limit: int = 500) -> str:
    """A short, human-readable view of a tool result's content, at most ``limit`` characters.

    Text blocks are kept (joined by newlines); binary blocks are named, not inlined, since a
    base64 image says nothing to a reflector and would crowd out everything else. When there is
    no content but structured content, that is shown instead.
    """
    parts: list[str] = []
    size = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            piece = block.text
        elif isinstance(block, types.ImageContent | types.AudioContent):
            piece = f"[{block.type} {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            text = getattr(res, "text", None)
            piece = f"[resource {res.uri}]" + (f" {text}" if isinstance(text, str) else "")
        elif isinstance(block, types.ResourceLink):
            piece = f"[resource link {block.uri}]"
        else:  # a block type from a newer protocol revision
            piece = f"[{getattr(block, 'type', 'content')}]"
        parts.append(piece)
        size += len(piece)
        if size > limit:
            break
    if not parts and result.structured_content is not None:
        parts.append(_compact(result.structured_content))
    return _cut("\n".join(parts), limit)


def error_text(result: types.CallToolResult, limit: int = 500) -> str:
    """The text of a failed result (what the model reads as the error)."""
    return summarize_content(result, limit)


def classify_result_error(
    result: types.CallToolResult, *, known_tool: bool, arguments_fit: bool | None
) -> ErrorType:
    """The ``error_type`` of an ``isError`` result.

    Args:
        result: The failed result.
        known_tool: Whether the tool was in the upstream's listing.
        arguments_fit: Whether the arguments validate against the tool's input schema (``None``
            when there is no usable schema). The schema check is exact, so wording is consulted
            only where it cannot decide.
    """
    if not known_tool:
        return "unknown_tool"
    if arguments_fit is False:
        return "invalid_arguments"
    text = error_text(result, 2000)
    # With arguments that fit the schema, only a server that is stricter than its schema
    # ("missing required argument" for an empty string) counts as an argument problem: a tool's
    # own "validation error" about its data is a tool error.
    pattern = _BAD_ARGS if arguments_fit is None else _STRICT_BAD_ARGS
    return "invalid_arguments" if pattern.search(text) else "tool_error"


def classify_jsonrpc_error(code: int, message: str, *, known_tool: bool) -> ErrorType:
    """The ``error_type`` of a JSON-RPC error answering ``tools/call``."""
    if code == CONNECTION_CLOSED and message == "Connection closed":
        # The SDK's own code for a connection that dropped under an in-flight request.
        return "upstream_unavailable"
    if code == REQUEST_TIMEOUT and "timed out" in message:
        return "timeout"
    if code == INVALID_PARAMS:
        if not known_tool or _UNKNOWN_TOOL.search(message):
            return "unknown_tool"
        return "invalid_arguments"
    if code == METHOD_NOT_FOUND and not known_tool:
        return "unknown_tool"
    return "jsonrpc_error"


def action_event(
    *,
    task_id: str,
    tool: str,
    arguments: dict[str, Any] | None,
    server: str | None,
    timestamp: int | str,
    latency_ms: float,
    output: str | None,
    is_error: bool,
    error_type: ErrorType | None = None,
    error_message: str | None = None,
    error_code: int | None = None,
    upstream_tool: str | None = None,
) -> dict[str, Any]:
    """One ``action_executed`` event in the wire format of DESIGN.md."""
    failed = error_type is not None
    tool_input: dict[str, Any] = {"tool": tool, "args": arguments or {}, "server": server}
    if upstream_tool is not None and upstream_tool != tool:
        tool_input["upstream_tool"] = upstream_tool
    result: dict[str, Any] = {
        "status": "failed" if failed else "succeeded",
        "output": output,
        "is_error": is_error,
        "latency_ms": round(latency_ms, 3),
    }
    if failed:
        result["error_type"] = error_type
        result["error_message"] = error_message
        if error_code is not None:
            result["error_code"] = error_code
    return {
        "type": "action_executed",
        "task_id": task_id,
        "timestamp": timestamp,
        "input": tool_input,
        "result": result,
    }


def advice_text(lessons: list[Any]) -> str:
    """The text block appended to a failed result with ``--advise``."""
    as_prompt = getattr(lessons, "as_prompt", None)
    if callable(as_prompt):
        body = str(as_prompt()).strip()
    else:
        body = "\n".join(f"- {getattr(lesson, 'advice', lesson)}" for lesson in lessons)
    return f"{ADVICE_MARKER} Lessons from earlier runs that hit a similar failure:\n{body}"


def _compact(value: Any) -> str:
    import orjson

    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return str(value)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


__all__ = [
    "ADVICE_MARKER",
    "ErrorType",
    "action_event",
    "advice_text",
    "classify_jsonrpc_error",
    "classify_result_error",
    "error_text",
    "summarize_content",
]
