"""OpenAI chat messages into wire-format events.

The Chat Completions shape most agent frameworks and datasets keep their runs in:

- ``system`` / ``developer`` messages: the system prompt, kept in ``task_start`` ``context.system``;
- ``user``: a ``user_input`` with ``input.text``;
- ``assistant`` with text only: an ``llm_decision`` (``chosen_action="reply"``, ``message``);
- ``assistant`` with ``tool_calls`` (or a legacy ``function_call``): one ``llm_decision``
  (``chosen_action`` the first tool, ``tool_calls`` all their names, ``message`` any text), then
  one ``action_executed`` per call with ``input={"tool", "args"}`` (arguments parsed from JSON,
  the raw string kept when they are not JSON);
- ``tool`` (matched by ``tool_call_id``) or legacy ``function`` (matched by name): the result of
  its call. There is no failure flag, so ``wire.tool_error`` reads the result; a call that never
  gets a result is ``status="unknown"``, a result with no call is kept as its own action.

A message's ``name`` is the speaking agent (``agent_state.agent``); fields with no wire meaning
stay in the event's ``context.metadata``.
"""

from __future__ import annotations

from typing import Any

from hindsight_loop.ingest.wire import (
    Overrides,
    RunBuilder,
    digest,
    join_text,
    parse_args,
    split_run,
    text_of,
    timestamp_ns,
    tool_result,
)

_MAPPED = frozenset(
    {
        "role",
        "content",
        "name",
        "tool_calls",
        "function_call",
        "tool_call_id",
        "timestamp",
        "reasoning_content",
    }
)


def openai_events(run: Any, overrides: Overrides | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Map one OpenAI run (a list of messages, or an object holding them) to wire events.

    Returns the run's task id and its events, ``task_start`` first and ``task_end`` last.
    """
    overrides = overrides or Overrides()
    messages, info = split_run(run)
    builder = RunBuilder(digest(run))
    systems: list[str] = [info.system] if info.system else []
    pending: dict[str, dict[str, Any]] = {}  # tool_call_id -> its action event
    pending_by_name: dict[str, list[dict[str, Any]]] = {}  # for legacy function messages

    for index, msg in enumerate(messages):
        if not isinstance(msg, dict):
            builder.add("state_change", input={"message": msg}, context=_not_an_object(index))
            continue
        role = msg.get("role")
        text, other_parts = text_of(msg.get("content"))
        when = timestamp_ns(msg.get("timestamp"))
        meta = _leftovers(msg, other_parts)
        context = {"metadata": meta} if meta else None
        name = msg.get("name") if isinstance(msg.get("name"), str) else None

        if role in ("system", "developer"):
            if text:
                systems.append(text)
            if meta:
                info.metadata.setdefault("system_message_fields", []).append(meta)
        elif role == "user":
            builder.user_input(text, when, agent=name, context=context)
        elif role == "assistant":
            calls = _calls(msg)
            reasoning = msg.get("reasoning_content")
            builder.decision(
                text,
                [c[1] for c in calls],
                when,
                agent=name,
                reasoning=reasoning if isinstance(reasoning, str) else None,
                context=context,
            )
            for call_id, tool, raw_args in calls:
                event = builder.action(
                    tool, parse_args(raw_args), when, call_id=call_id, agent=name
                )
                if call_id:
                    pending[call_id] = event
                else:
                    pending_by_name.setdefault(tool, []).append(event)
        elif role in ("tool", "function"):
            call_id = msg.get("tool_call_id")
            found = pending.pop(call_id, None) if isinstance(call_id, str) else None
            if found is None and name and pending_by_name.get(name):
                found = pending_by_name[name].pop(0)
            if found is None:
                # A result whose call is not in the transcript: kept as its own step.
                event = builder.action(
                    name or "unknown_tool",
                    {},
                    when,
                    call_id=call_id if isinstance(call_id, str) else None,
                    context={"metadata": {"note": "tool result without a matching call"}},
                )
            else:
                event = found
            output: Any = text if not other_parts else msg.get("content")
            event["result"] = tool_result(output)
            if meta:
                event.setdefault("context", {}).setdefault("metadata", {}).update(meta)
        else:
            builder.add(
                "state_change",
                when,
                input={"role": role, "text": text},
                context={"metadata": meta} if meta else None,
            )

    if systems:
        info.system = join_text(systems)
    return builder.build(info, overrides)


def _calls(msg: dict[str, Any]) -> list[tuple[str | None, str, Any]]:
    """(call id, tool name, raw arguments) of each tool call an assistant message makes."""
    calls: list[tuple[str | None, str, Any]] = []
    for call in msg.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
        name: str = fn["name"] if isinstance(fn.get("name"), str) else "unknown_tool"
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        calls.append((call_id, name, fn.get("arguments")))
    legacy = msg.get("function_call")
    if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
        calls.append((None, legacy["name"], legacy.get("arguments")))
    return calls


def _leftovers(msg: dict[str, Any], other_parts: list[Any]) -> dict[str, Any]:
    """The message's fields (and non-text parts) that no wire field holds."""
    meta = {k: v for k, v in msg.items() if k not in _MAPPED and v is not None}
    if other_parts:
        meta["parts"] = other_parts
    return meta


def _not_an_object(index: int) -> dict[str, Any]:
    return {"metadata": {"note": f"message {index} is not an object"}}
