"""OpenTelemetry traces (OTLP/JSON) that follow the GenAI semantic conventions, into wire events.

The input is what an OTLP/JSON file exporter writes: ``{"resourceSpans": [{"resource": …,
"scopeSpans": [{"spans": [...]}]}]}`` (one object, a list of them, or one per line), attributes
as ``{"key": …, "value": {"stringValue" | "intValue" | …}}`` and times in unix nanoseconds.

Tasks: each ``invoke_agent`` span (``gen_ai.operation.name``) not inside another one is a task
with all the spans below it; GenAI spans of a trace outside any such span make one task for that
trace. Within a task, in start-time order:

- ``chat`` / ``text_completion`` / ``generate_content`` spans: user messages in
  ``gen_ai.input.messages`` not seen earlier in the task become ``user_input``; the
  ``gen_ai.output.messages`` text and ``tool_call`` parts become an ``llm_decision`` (and an
  ``action_executed`` per call, completed by the matching tool span or by a later
  ``tool_call_response`` part); ``gen_ai.system_instructions`` (or a system message) becomes
  ``context.system``;
- ``execute_tool`` spans: ``action_executed`` with ``gen_ai.tool.name``,
  ``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``; failed when the span's status
  code is 2 (ERROR, its message kept), ``error.type`` is set, or the result reads as an error;
- other GenAI operations (embeddings, retrieval, …): ``state_change``.

Non-GenAI spans (HTTP, database…) are only counted. Attributes with no wire field stay in the
event's ``context.metadata``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from hindsight_loop.ingest.wire import (
    Overrides,
    RunBuilder,
    RunInfo,
    digest,
    join_text,
    parse_args,
    text_of,
    tool_error,
    tool_result,
)

OP = "gen_ai.operation.name"
_CHAT_OPS = frozenset({"chat", "text_completion", "generate_content"})
_AGENT_OPS = frozenset({"invoke_agent"})
_MAPPED_ATTRS = frozenset(
    {
        OP,
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.agent.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "error.type",
    }
)


def otlp_events(data: Any, overrides: Overrides | None = None) -> list[tuple[str, list[dict]]]:
    """Map OTLP/JSON trace data to runs: a list of (task id, wire events)."""
    overrides = overrides or Overrides()
    spans = _spans(data)
    traces: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        traces.setdefault(span["trace_id"], []).append(span)
    runs: list[tuple[str, list[dict]]] = []
    for trace_id, trace in traces.items():
        by_id = {s["span_id"]: s for s in trace if s["span_id"]}
        groups: dict[str | None, list[dict[str, Any]]] = {}
        for span in trace:
            root = _task_root(span, by_id)
            groups.setdefault(root["span_id"] if root else None, []).append(span)
        for root_id, members in groups.items():
            root = by_id.get(root_id) if root_id else None
            if root is None and not any(s["attrs"].get(OP) for s in members):
                continue  # a trace with no GenAI spans outside the agents is not a run
            runs.append(_run(trace_id, root, members, by_id, overrides))
    return runs


# -- reading OTLP/JSON --------------------------------------------------------------------------


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as plain JSON."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        try:
            return int(v["intValue"])  # int64 travels as a string in OTLP/JSON
        except (TypeError, ValueError):
            return v["intValue"]
    if "doubleValue" in v:
        return v["doubleValue"]
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        return [_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return _attrs((v["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _attrs(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or ():
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = _value(item.get("value"))
    return out


def _ns(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "", 0, "0") else None
    except (TypeError, ValueError):
        return None


def _spans(data: Any) -> list[dict[str, Any]]:
    """Every span in the data, flattened with its decoded attributes and resource."""
    requests = data if isinstance(data, list) else [data]
    spans: list[dict[str, Any]] = []
    for request in requests:
        if not isinstance(request, dict) or not isinstance(request.get("resourceSpans"), list):
            raise ValueError(
                "OTLP/JSON trace data needs 'resourceSpans' (the OTLP file exporter's shape)"
            )
        for rs in request["resourceSpans"]:
            resource = _attrs(((rs or {}).get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                for span in (ss or {}).get("spans") or ():
                    if not isinstance(span, dict):
                        continue
                    status = span.get("status") or {}
                    code = status.get("code")
                    spans.append(
                        {
                            "trace_id": str(span.get("traceId") or ""),
                            "span_id": str(span.get("spanId") or ""),
                            "parent_id": str(span.get("parentSpanId") or ""),
                            "name": span.get("name") or "",
                            "start": _ns(span.get("startTimeUnixNano")),
                            "end": _ns(span.get("endTimeUnixNano")),
                            "attrs": _attrs(span.get("attributes")),
                            "error": code in (2, "2", "STATUS_CODE_ERROR", "ERROR"),
                            "status_message": status.get("message") or "",
                            "events": span.get("events") or [],
                            "resource": resource,
                        }
                    )
    return spans


def _ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    seen = {span["span_id"]}
    parent = by_id.get(span["parent_id"])
    while parent is not None and parent["span_id"] not in seen:
        chain.append(parent)
        seen.add(parent["span_id"])
        parent = by_id.get(parent["parent_id"])
    return chain


def _task_root(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The outermost ``invoke_agent`` span at or above this one, if any."""
    root = span if span["attrs"].get(OP) in _AGENT_OPS else None
    for ancestor in _ancestors(span, by_id):
        if ancestor["attrs"].get(OP) in _AGENT_OPS:
            root = ancestor
    return root


def _agent_of(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> str | None:
    """The name of the nearest agent at or above a span."""
    for s in (span, *_ancestors(span, by_id)):
        name = s["attrs"].get("gen_ai.agent.name")
        if isinstance(name, str) and name:
            return name
    return None


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    parsed = _json(value)
    if isinstance(parsed, dict):
        parsed = [parsed]
    return [m for m in parsed if isinstance(m, dict)] if isinstance(parsed, list) else []


def _parts(message: dict[str, Any]) -> list[Any]:
    parts = message.get("parts", message.get("content"))
    if isinstance(parts, str):
        return [{"type": "text", "content": parts}]
    return parts if isinstance(parts, list) else []


# -- one task -------------------------------------------------------------------------------


def _run(
    trace_id: str,
    root: dict[str, Any] | None,
    members: list[dict[str, Any]],
    by_id: dict[str, dict[str, Any]],
    overrides: Overrides,
) -> tuple[str, list[dict]]:
    members = sorted(members, key=lambda s: (s["start"] or 0, s["end"] or 0))
    # Content decides event ids; the trace (and agent span) decide the task id.
    builder = RunBuilder(digest([trace_id, [_fingerprint(s) for s in members]]))
    info = RunInfo(task_id="tsk_" + digest([trace_id, root["span_id"] if root else None]))
    resource = members[0]["resource"] if members else {}
    info.metadata = {"trace_id": trace_id}
    if resource:
        info.metadata["resource"] = resource
    if root is not None:
        info.start_ns, info.end_ns = root["start"], root["end"]
        info.task_type = _str(root["attrs"].get("gen_ai.agent.name"))
        info.metadata["agent_span"] = _span_meta(root)
        if root["error"] or root["attrs"].get("error.type"):
            info.end_error = (
                _error_type(root) or "AgentError",
                root["status_message"] or str(root["attrs"].get("error.type") or ""),
            )

    seen_users: Counter[str] = Counter()
    pending: dict[str, dict[str, Any]] = {}  # tool call id -> its action event
    open_decision: dict[str, Any] | None = None  # a decision whose tool calls the tools name
    unmapped = 0
    had_chat = any(s["attrs"].get(OP) in _CHAT_OPS for s in members)

    for span in members:
        attrs = span["attrs"]
        op = attrs.get(OP)
        agent = _agent_of(span, by_id)
        if op is None:
            unmapped += 1
            continue
        if op in _CHAT_OPS or (op in _AGENT_OPS and span is root and not had_chat):
            if info.system is None:
                info.system = _system(attrs)
            _user_inputs(builder, attrs, seen_users, span["start"], agent, pending)
            if op in _AGENT_OPS and "gen_ai.output.messages" not in attrs:
                continue
            open_decision = _decision(builder, span, agent, pending)
            model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
            if info.model is None and isinstance(model, str):
                info.model = model
        elif op == "execute_tool":
            _tool(builder, span, agent, pending, open_decision)
        elif op in _AGENT_OPS:
            if span is root:
                _user_inputs(builder, attrs, seen_users, span["start"], agent, pending)
            continue  # a sub-agent: its own spans are steps of this task
        else:
            builder.add(
                "state_change",
                span["start"],
                input={"operation": op, "name": span["name"]},
                agent_state={"agent": agent} if agent else None,
                context={"metadata": _span_meta(span)},
            )
    if unmapped:
        info.metadata["unmapped_spans"] = unmapped
    return builder.build(info, overrides)


def _fingerprint(span: dict[str, Any]) -> list[Any]:
    return [span["span_id"], span["start"], span["end"], span["attrs"], span["error"]]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _span_meta(span: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"span_id": span["span_id"], "span_name": span["name"]}
    rest = {k: v for k, v in span["attrs"].items() if k not in _MAPPED_ATTRS}
    if rest:
        meta["attributes"] = rest
    return meta


def _system(attrs: dict[str, Any]) -> str | None:
    instructions = _json(attrs.get("gen_ai.system_instructions"))
    if instructions:
        return text_of(instructions)[0] or None
    for message in _messages(attrs.get("gen_ai.input.messages")):
        if message.get("role") == "system":
            return text_of(_parts(message))[0] or None
    return None


def _user_inputs(
    builder: RunBuilder,
    attrs: dict[str, Any],
    seen: Counter[str],
    when: int | None,
    agent: str | None,
    pending: dict[str, dict[str, Any]],
) -> None:
    """User messages the model sees for the first time here; tool responses fill their calls."""
    here: Counter[str] = Counter()
    for message in _messages(attrs.get("gen_ai.input.messages")):
        parts = _parts(message)
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "tool_call_response":
                event = pending.pop(str(part.get("id")), None)
                if event is not None:
                    event["result"] = tool_result(part.get("response"))
        if message.get("role") != "user":
            continue
        text = text_of([p for p in parts if not isinstance(p, dict) or p.get("type") == "text"])[0]
        if not text:
            continue
        here[text] += 1
        if here[text] > seen[text]:
            seen[text] = here[text]
            builder.user_input(text, when, agent=agent)


def _decision(
    builder: RunBuilder,
    span: dict[str, Any],
    agent: str | None,
    pending: dict[str, dict[str, Any]],
) -> dict[str, Any] | None:
    """The model's answer; returns the decision when its tool calls are still to be named."""
    attrs = span["attrs"]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    outputs = _messages(attrs.get("gen_ai.output.messages"))
    for message in outputs:
        for part in _parts(message):
            kind = part.get("type") if isinstance(part, dict) else "text"
            if kind == "tool_call":
                calls.append(part)
            elif kind == "reasoning" and isinstance(part.get("content"), str):
                reasoning.append(part["content"])
            else:
                texts.append(text_of([part])[0])
    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
    when = span["end"] or span["start"]
    decision = builder.decision(
        join_text(texts),
        [str(c.get("name") or "unknown_tool") for c in calls],
        when,
        agent=agent,
        model=model if isinstance(model, str) else None,
        reasoning=join_text(reasoning) or None,
        context={"metadata": _span_meta(span)},
    )
    for call in calls:
        call_id = str(call["id"]) if call.get("id") else None
        event = builder.action(
            str(call.get("name") or "unknown_tool"),
            parse_args(call.get("arguments")),
            when,
            call_id=call_id,
            agent=agent,
        )
        if call_id:
            pending[call_id] = event
    reasons = attrs.get("gen_ai.response.finish_reasons") or ()
    wants_tools = any(isinstance(r, str) and r.startswith("tool") for r in reasons)
    return decision if not outputs and wants_tools else None


def _error_type(span: dict[str, Any]) -> str | None:
    kind = span["attrs"].get("error.type")
    if isinstance(kind, str) and kind and kind != "_OTHER":
        return kind
    for event in span["events"]:
        if isinstance(event, dict) and event.get("name") == "exception":
            found = _attrs(event.get("attributes")).get("exception.type")
            if isinstance(found, str) and found:
                return found.rsplit(".", 1)[-1]
    return None


def _tool_error_type(span: dict[str, Any]) -> str | None:
    """The error type of a failed tool span. A framework's retry wrapper (pydantic-ai's
    ``ToolRetryError`` around a ``ModelRetry``) says only that the model will retry: the type the
    message names, when it names one, is the tool's own error."""
    kind = _error_type(span)
    if kind is None or "Retry" in kind:
        message = span["status_message"] or _exception_message(span) or ""
        named = tool_error(message)
        if named is not None and named[0] != "ToolError":
            return named[0]
    return kind


def _exception_message(span: dict[str, Any]) -> str | None:
    for event in span["events"]:
        if isinstance(event, dict) and event.get("name") == "exception":
            found = _attrs(event.get("attributes")).get("exception.message")
            if isinstance(found, str) and found:
                return found
    return None


def _tool(
    builder: RunBuilder,
    span: dict[str, Any],
    agent: str | None,
    pending: dict[str, dict[str, Any]],
    open_decision: dict[str, Any] | None,
) -> None:
    attrs = span["attrs"]
    name = str(attrs.get("gen_ai.tool.name") or span["name"] or "unknown_tool")
    call_id = attrs.get("gen_ai.tool.call.id")
    raw_args = attrs.get("gen_ai.tool.call.arguments")
    event = pending.pop(str(call_id), None) if call_id else None
    if event is None:
        event = builder.action(
            name,
            parse_args(raw_args),
            span["start"],
            call_id=str(call_id) if call_id else None,
            agent=agent,
        )
        if open_decision is not None:
            # The model's answer was not recorded, but it asked for tools: these are its calls.
            decision = open_decision["decision"]
            decision.setdefault("tool_calls", []).append(name)
            if decision.get("chosen_action") == "reply":
                decision["chosen_action"] = name
    elif raw_args is not None:
        event["input"]["args"] = parse_args(raw_args)
    event.setdefault("context", {})["metadata"] = _span_meta(span)
    failed = span["error"] or bool(attrs.get("error.type"))
    result = tool_result(
        attrs.get("gen_ai.tool.call.result"),
        is_error=failed,
        error_type=_tool_error_type(span) if failed else None,
        error_message=(span["status_message"] or _exception_message(span)) if failed else None,
    )
    if span["start"] and span["end"]:
        result["duration_ms"] = round((span["end"] - span["start"]) / 1e6, 3)
    event["result"] = result
