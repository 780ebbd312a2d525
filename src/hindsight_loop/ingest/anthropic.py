"""Anthropic Messages into wire-format events.

- ``system`` (a top-level string or text blocks on the run object, or ``system`` role
  messages some exports add): ``task_start`` ``context.system``;
- a ``user`` message's text (string content or ``text`` blocks): a ``user_input``;
- its ``tool_result`` blocks (``tool_use_id``, ``content``, ``is_error``): the results of
  earlier calls; failed when ``is_error`` is true or ``wire.tool_error`` reads the content as
  an error;
- an ``assistant`` message: one ``llm_decision`` (``text`` blocks joined into ``message``,
  ``thinking`` into ``reasoning``, ``chosen_action`` the first ``tool_use`` or ``reply``), then
  one ``action_executed`` per ``tool_use`` block (``name``, ``input`` as args).

Blocks with no wire meaning (images, documents, server tools…) stay in ``context.metadata``.
"""

from __future__ import annotations

from typing import Any

from hindsight_loop.ingest.wire import (
    Overrides,
    RunBuilder,
    digest,
    join_text,
    split_run,
    text_of,
    timestamp_ns,
    tool_result,
)

_MAPPED = frozenset({"role", "content", "timestamp"})


def anthropic_events(
    run: Any, overrides: Overrides | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """Map one Anthropic run (a list of messages, or an object with ``messages`` and
    ``system``) to wire events: the run's task id and its events, ``task_start`` first."""
    overrides = overrides or Overrides()
    messages, info = split_run(run)
    builder = RunBuilder(digest(run))
    systems: list[str] = [info.system] if info.system else []
    pending: dict[str, dict[str, Any]] = {}  # tool_use id -> its action event

    for msg in messages:
        if not isinstance(msg, dict):
            builder.add("state_change", input={"message": msg})
            continue
        role = msg.get("role")
        when = timestamp_ns(msg.get("timestamp"))
        blocks = msg.get("content")
        if isinstance(blocks, str) or blocks is None:
            blocks = [{"type": "text", "text": blocks or ""}]
        elif isinstance(blocks, dict):
            blocks = [blocks]
        meta = {k: v for k, v in msg.items() if k not in _MAPPED and v is not None}
        name = msg.get("name") if isinstance(msg.get("name"), str) else None

        texts: list[str] = []
        thinking: list[str] = []
        uses: list[dict[str, Any]] = []
        other: list[Any] = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(block, str):
                texts.append(block)
            elif kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
            elif kind == "tool_use" and role == "assistant":
                uses.append(block)
            elif kind == "tool_result":
                _result(builder, pending, block, when)
            else:
                other.append(block)
        if other:
            meta["blocks"] = other
        context = {"metadata": meta} if meta else None
        text = join_text(texts)

        if role == "system":
            if text:
                systems.append(text)
        elif role == "user":
            if text or not any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks
            ):
                builder.user_input(text, when, agent=name, context=context)
            elif meta:
                info.metadata.setdefault("message_fields", []).append(meta)
        elif role == "assistant":
            builder.decision(
                text,
                [u.get("name") or "unknown_tool" for u in uses],
                when,
                agent=name,
                reasoning=join_text(thinking) or None,
                context=context,
            )
            for use in uses:
                call_id = use.get("id") if isinstance(use.get("id"), str) else None
                event = builder.action(
                    use.get("name") or "unknown_tool",
                    use.get("input") if use.get("input") is not None else {},
                    when,
                    call_id=call_id,
                    agent=name,
                )
                if call_id:
                    pending[call_id] = event
        else:
            builder.add("state_change", when, input={"role": role, "text": text}, context=context)

    if systems:
        info.system = join_text(systems)
    return builder.build(info, overrides)


def _result(
    builder: RunBuilder, pending: dict[str, dict[str, Any]], block: dict[str, Any], when: int | None
) -> None:
    """Attach a ``tool_result`` block to its call (or keep it as its own step)."""
    call_id = block.get("tool_use_id")
    event = pending.pop(call_id, None) if isinstance(call_id, str) else None
    if event is None:
        event = builder.action(
            "unknown_tool",
            {},
            when,
            call_id=call_id if isinstance(call_id, str) else None,
            context={"metadata": {"note": "tool result without a matching call"}},
        )
    text, other = text_of(block.get("content"))
    event["result"] = tool_result(
        text if not other else block.get("content"), is_error=block.get("is_error") is True
    )
