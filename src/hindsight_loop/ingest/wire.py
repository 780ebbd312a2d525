"""What every transcript mapping shares: building wire-format events, and the wire format itself.

Each source format (``openai``, ``anthropic``, ``otlp``) reads its own shape and hands the steps
it finds to one ``RunBuilder``, so ids, timestamps, the ``task_start`` / ``task_end`` pair and the
answer to "did this tool call fail?" (``tool_result``) are decided once here for all of them.
``wire_runs`` groups events that are already in the wire format into runs.

Everything here is a pure function of the data it is handed: no store, no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from hindsight_loop.models import (
    EVENT_TYPES,
    is_failure,
    iso,
    normal_status,
    parse_ts,
    wire_event_problem,
)

#: Where synthesized timestamps start when a source has none: fixed, so importing the same run
#: twice gives the same events (and the same ids), one millisecond apart in run order.
SYNTHETIC_BASE = datetime(2000, 1, 1, tzinfo=UTC)
_NS_PER_MS = 1_000_000
_BASE_NS = int(SYNTHETIC_BASE.timestamp()) * 1_000_000_000

#: ``result.status`` of a tool call whose result never appears in the transcript (the run was
#: cut off, or the result was lost). Neither a success nor a failure: replay shows it as an
#: anomaly worth a look.
MISSING_RESULT_STATUS = "unknown"

#: The task type given to an imported run when neither the caller nor the run names one.
DEFAULT_TASK_TYPE = "imported"

# A result that opens with a generic error marker, in English or Chinese: "Error: …",
# "error - …", "Exception …", "Traceback (most recent call last)", "[ERROR] …", "Fatal: …",
# "错误：…", "失败…", "异常…", "报错…". The English words must stand alone ("Errors found: 0",
# "error_count" and "Failure rate" are not errors).
_ERROR_MARKER = re.compile(
    r"^[\s\[(<*#>-]*(?:(?:error|exception|traceback|fatal|failed)(?!\w)|错误|失败|异常|报错|出错)",
    re.IGNORECASE,
)
# "ValueError: …", "requests.exceptions.HTTPError: …", "KeyError(…)": an exception's own type.
_TYPED_ERROR = re.compile(
    r"^\s*((?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exceeded|Fault|Denied)))\s*[:(]"
)
_TYPED_ERROR_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception)))\s*:", re.MULTILINE
)
GENERIC_ERROR_TYPE = "ToolError"


def tool_error(output: Any) -> tuple[str, str] | None:
    """Whether a tool's result, as the run shows it, is an error: ``(error_type, message)`` or None.

    The one rule every mapping uses for sources with no failure flag (an OpenAI ``tool``
    message, a span without an error status). A result is an error when it is

    - a JSON object (or the text of one) with a top-level, non-empty ``error`` key; or
    - text that opens with a generic error marker: ``Error``, ``Exception``, ``Traceback``,
      ``Fatal``, ``Failed`` as a whole word (any case, optionally after ``[``), ``错误``, ``失败``,
      ``异常``, ``报错``, ``出错``; or with an exception's own type (``ValueError: …``).

    ``error_type`` is that exception type when the text names one (a traceback's last
    ``XError:`` line, a ``type`` inside the ``error`` object), else ``"ToolError"``;
    ``message`` is the whole text, never cut here (the recorder bounds long fields).
    """
    if isinstance(output, dict):
        if not output.get("error"):
            return None
        text = orjson.dumps(output, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
        return _error_object_type(output["error"]) or _typed(text) or GENERIC_ERROR_TYPE, text
    if not isinstance(output, str):
        return None
    text = output
    head = text.lstrip()
    if head.startswith("{"):
        try:
            parsed = orjson.loads(head)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            if not parsed.get("error"):
                return None
            return _error_object_type(parsed["error"]) or GENERIC_ERROR_TYPE, text
    typed = _TYPED_ERROR.match(head)
    if typed:
        return typed.group(2), text
    if _ERROR_MARKER.match(head):
        return _typed(text) or GENERIC_ERROR_TYPE, text
    return None


def _typed(text: str) -> str | None:
    """The last ``SomethingError:`` line of a text (a traceback's final line), if any."""
    found = _TYPED_ERROR_LINE.findall(text)
    return found[-1][1] if found else None


def _error_object_type(error: Any) -> str | None:
    if isinstance(error, dict):
        for key in ("type", "code", "name"):
            value = error.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None


def tool_result(
    output: Any,
    *,
    is_error: bool = False,
    error_type: str | None = None,
    error_message: str | None = None,
) -> dict[str, Any]:
    """The ``result`` of an ``action_executed`` event from what the source shows.

    Failed when the source flags the call (``is_error``, a span's error status, an
    ``error.type``) or when ``tool_error`` reads the output as an error; else succeeded with
    the output as given.
    """
    found = tool_error(output)
    if not is_error and found is None:
        return (
            {"status": "succeeded"} if output is None else {"status": "succeeded", "output": output}
        )
    text = output if isinstance(output, str) else None
    if text is None and output is not None:
        text = orjson.dumps(output, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    if found is not None:
        kind, text = found
    else:
        kind = (
            (_typed(text) if text else None)
            or (_typed(error_message) if error_message else None)
            or GENERIC_ERROR_TYPE
        )
    return {
        "status": "failed",
        "error_type": error_type or kind,
        "error_message": error_message or text or "",
    }


def parse_args(raw: Any) -> Any:
    """Tool arguments as structured data: JSON text is parsed, anything else kept as given."""
    if isinstance(raw, str):
        try:
            return orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return raw
    return {} if raw is None else raw


def digest(value: Any) -> str:
    """A short stable hash of a JSON-like value (keys sorted), the seed of imported ids."""
    data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    return hashlib.blake2b(data, digest_size=10).hexdigest()


def timestamp_ns(value: Any) -> int | None:
    """A source timestamp (ISO text, epoch seconds/ms/ns) in unix nanoseconds, or None."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        dt = parse_ts(value)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    # Whole microseconds since the epoch, in integers: ``int(dt.timestamp())`` rounds toward
    # zero, and a time half a second before 1970 came out half a second after it.
    return (dt - _EPOCH) // _MICROSECOND * 1000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _iso_ns(ns: int) -> str:
    secs, rem = divmod(ns, 1_000_000_000)
    return iso(datetime.fromtimestamp(secs, UTC).replace(microsecond=rem // 1000))


def outcome_status(outcome: Any) -> str | None:
    """A run's stated outcome as ``succeeded`` / ``failed``, or None when it states none."""
    if outcome is None:
        return None
    if isinstance(outcome, bool):
        return "succeeded" if outcome else "failed"
    if isinstance(outcome, int | float):
        return reward_status(outcome)
    status = normal_status(outcome)
    if not status:
        return None
    if status in ("succeeded", "success", "ok", "completed", "done", "pass", "passed", "true"):
        return "succeeded"
    return "failed"


def reward_status(reward: Any) -> str | None:
    """A reward of 1 or more is a success, anything lower a failure (None when not a number)."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return None
    return "succeeded" if reward >= 1 else "failed"


@dataclass(kw_only=True)
class RunInfo:
    """What a source says about a run as a whole, besides its steps."""

    task_id: str | None = None
    """The run's own id, when it has one."""
    task_type: str | None = None
    goal: str | None = None
    outcome: Any = None
    """``succeeded`` / ``failed`` (or success words, a boolean), when the run states it."""
    reward: Any = None
    """A numeric reward: >= 1 succeeded, else failed (unless ``outcome`` says otherwise)."""
    scope: str | None = None
    system: str | None = None
    """The system prompt, kept in ``task_start`` ``context.system``."""
    tools: list[str] = field(default_factory=list)
    """Tools the run declares (the ones it called are added)."""
    model: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """Everything about the run that has no wire field: kept in ``task_start`` ``context.metadata``."""
    start_ns: int | None = None
    """When the run started, if the source says."""
    end_ns: int | None = None
    end_error: tuple[str, str] | None = None
    """The run itself failed with (error_type, message): an agent span's error status."""


@dataclass(kw_only=True)
class Overrides:
    """What the caller of an import says about every run: it wins over what a run says."""

    task_type: str | None = None
    goal: str | None = None
    outcome: str | None = None
    scope: str | None = None
    source: str = ""


class RunBuilder:
    """Collects one run's steps in order and turns them into wire-format events.

    Ids are deterministic: ``seed`` is a digest of the run's source data, the task id is the
    run's own id or ``tsk_<seed>``, and each event id is a hash of seed, task id and position,
    so importing the same run twice yields the same events.
    """

    __slots__ = ("_seed", "_steps", "called_tools", "first_user_text")

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._steps: list[tuple[dict[str, Any], int | None]] = []
        self.called_tools: list[str] = []
        self.first_user_text: str | None = None

    def add(self, etype: str, when: int | None = None, **body: Any) -> dict[str, Any]:
        """Append a step (``input=…``, ``decision=…``…; empty parts left out) and return it."""
        event: dict[str, Any] = {"type": etype}
        for key, value in body.items():
            if value:
                event[key] = value
        self._steps.append((event, when))
        return event

    def user_input(
        self, text: str, when: int | None = None, *, agent: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        if self.first_user_text is None and text.strip():
            self.first_user_text = text
        return self.add(
            "user_input",
            when,
            input={"text": text},
            agent_state={"agent": agent} if agent else None,
            **extra,
        )

    def decision(
        self,
        text: str,
        calls: list[str],
        when: int | None = None,
        *,
        agent: str | None = None,
        model: str | None = None,
        reasoning: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An ``llm_decision``: a reply, or the tool calls the model chose (first one chosen)."""
        decision: dict[str, Any] = {"chosen_action": calls[0] if calls else "reply"}
        if text:
            decision["message"] = text
        if calls:
            decision["tool_calls"] = list(calls)
        if reasoning:
            decision["reasoning"] = reasoning
        state = {k: v for k, v in (("agent", agent), ("model", model)) if v}
        return self.add("llm_decision", when, agent_state=state, decision=decision, context=context)

    def action(
        self,
        tool: str,
        args: Any,
        when: int | None = None,
        *,
        call_id: str | None = None,
        agent: str | None = None,
        result: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An ``action_executed`` whose result may be filled in later (``event["result"] = …``)."""
        self.called_tools.append(tool)
        state: dict[str, Any] = {"agent": agent} if agent else {}
        if call_id:
            state["tool_call_id"] = call_id
        return self.add(
            "action_executed",
            when,
            agent_state=state,
            input={"tool": tool, "args": args},
            result=result,
            context=context,
        )

    def build(self, info: RunInfo, overrides: Overrides) -> tuple[str, list[dict[str, Any]]]:
        """The run's task id and its events: ``task_start`` first, ``task_end`` last."""
        task_id = info.task_id or f"tsk_{self._seed}"
        steps = self._steps
        # A call whose result never showed up is neither a success nor a failure.
        for event, _ in steps:
            if event["type"] == "action_executed" and "result" not in event:
                event["result"] = {
                    "status": MISSING_RESULT_STATUS,
                    "note": "no result for this tool call in the transcript",
                }

        tools = list(dict.fromkeys([*info.tools, *self.called_tools]))
        start: dict[str, Any] = {
            "type": "task_start",
            "task_type": overrides.task_type or info.task_type or DEFAULT_TASK_TYPE,
            "goal": overrides.goal or info.goal or self.first_user_text or "",
            "tools": tools,
        }
        scope = overrides.scope or info.scope
        if scope:
            start["scope"] = scope
        context: dict[str, Any] = {}
        if info.system:
            context["system"] = info.system
        if overrides.source:
            context["import_source"] = overrides.source
        if info.metadata:
            context["metadata"] = info.metadata
        if context:
            start["context"] = context
        if info.model:
            start["agent_state"] = {"model": info.model}

        end_result = self._end_result(info, overrides)
        first_when = info.start_ns
        if first_when is None:
            first_when = next((w for _, w in steps if w is not None), None)
        last_when = info.end_ns
        all_steps = [
            (start, first_when),
            *steps,
            ({"type": "task_end", "result": end_result}, last_when),
        ]

        events: list[dict[str, Any]] = []
        prev = _BASE_NS - _NS_PER_MS
        for seq, (body, when) in enumerate(all_steps):
            # Source times are kept unless they would run backwards (then the previous one is
            # reused and seq orders); missing ones follow the previous by a millisecond.
            when = prev + _NS_PER_MS if when is None else max(when, prev)
            prev = when
            event = {
                "event_id": "evt_"
                + hashlib.blake2b(
                    f"{self._seed}|{task_id}|{seq}".encode(), digest_size=10
                ).hexdigest(),
                "task_id": task_id,
                "seq": seq,
                "timestamp": _iso_ns(when),
            }
            event.update(body)
            events.append(event)
        return task_id, events

    def _end_result(self, info: RunInfo, overrides: Overrides) -> dict[str, Any]:
        """How the run ended: the caller's word, then the run's outcome, its reward, an error
        status on the run itself; failing all those it is inferred (see ``ingest``)."""
        result: dict[str, Any] = {}
        status = outcome_status(overrides.outcome)
        source = "caller"
        if status is None:
            status, source = outcome_status(info.outcome), "outcome"
        if status is None:
            status, source = reward_status(info.reward), "reward"
        if status is None and info.end_error is not None:
            status, source = "failed", "run_status"
            result["error_type"], result["error_message"] = info.end_error
        if status is None:
            # Nothing says how it ended: it failed if its last tool call failed (or never got a
            # result), since the agent did not get past that; otherwise it succeeded.
            last = next(
                (e for e, _ in reversed(self._steps) if e["type"] == "action_executed"), None
            )
            last_status = (last or {}).get("result", {}).get("status")
            failed = last is not None and (
                is_failure(last_status) or last_status == MISSING_RESULT_STATUS
            )
            status, source = ("failed" if failed else "succeeded"), "inferred"
        result = {"status": status, **result, "outcome_source": source}
        if info.reward is not None:
            result["reward"] = info.reward
        return result


def wire_runs(data: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Group wire-format events (one, or a list in any mix of tasks) by task, in order.

    Events pass through unchanged; the facade's record path checks each one.
    """
    items = data if isinstance(data, list) else [data]
    runs: dict[str, list[dict[str, Any]]] = {}
    for i, event in enumerate(items):
        if not is_wire_event(event):
            raise ValueError(
                f"item {i} is not a wire-format event (it needs 'type' in "
                f"{', '.join(sorted(EVENT_TYPES))} and a 'task_id'); "
                "pick the transcript's format with --format openai|anthropic|otlp"
            )
        runs.setdefault(event["task_id"], []).append(event)
    return list(runs.items())


def is_wire_event(item: Any) -> bool:
    """Whether a JSON value looks like one wire-format event."""
    return (
        isinstance(item, dict)
        and item.get("type") in EVENT_TYPES
        and isinstance(item.get("task_id"), str)
        and bool(item["task_id"])
    )


def read_wire_lines(path: str | os.PathLike[str], *, sniff: bool) -> list[tuple[Any, str]] | None:
    """A JSONL file of wire-format events as ``(event or None, problem)`` per line, each checked
    by ``models.wire_event_problem``; with ``sniff``, None when the file does not look like one
    (its first line is not a wire event), so another format can be tried."""
    out: list[tuple[Any, str]] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a BOM from Windows tools
            if not raw.strip():
                continue
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                if sniff and not out:
                    return None  # one JSON document spread over lines, not JSONL
                out.append((None, f"line {lineno}: not JSON ({exc})"))
                continue
            if sniff and not out and not is_wire_event(event):
                return None
            problem = wire_event_problem(event)
            out.append((None, f"line {lineno}: {problem}") if problem else (event, ""))
    return out


def join_text(parts: list[str]) -> str:
    return "\n".join(p for p in parts if p)


#: Keys a run object may carry for its messages, in the order they are looked for.
MESSAGE_KEYS = ("messages", "traj", "trajectory")
_RUN_KEYS = frozenset(
    {
        *MESSAGE_KEYS,
        "task_id",
        "task_type",
        "goal",
        "outcome",
        "reward",
        "metadata",
        "scope",
        "system",
        "tools",
        "model",
        "timestamp",
        "created_at",
        "start_time",
    }
)


def split_run(run: Any) -> tuple[list[Any], RunInfo]:
    """A run's messages and what it says about itself (a bare list is all messages).

    Fields with no wire meaning (``info``, ``trial``, …) go to ``RunInfo.metadata`` next to the
    run's own ``metadata`` so nothing is dropped.
    """
    if isinstance(run, list):
        return run, RunInfo()
    if not isinstance(run, dict):
        raise ValueError(f"a run must be a list of messages or an object, got {type(run).__name__}")
    messages: Any = None
    for key in MESSAGE_KEYS:
        if key in run:
            messages = run[key]
            break
    if not isinstance(messages, list):
        raise ValueError(
            "a run object needs its messages as a list under 'messages', 'traj' or 'trajectory'"
        )
    raw_meta = run.get("metadata")
    metadata: dict[str, Any] = (
        dict(raw_meta)
        if isinstance(raw_meta, dict)
        else ({} if raw_meta is None else {"metadata": raw_meta})
    )
    for key, value in run.items():
        if key not in _RUN_KEYS:
            metadata.setdefault(key, value)
    task_id = run.get("task_id")
    info = RunInfo(
        task_id=str(task_id) if isinstance(task_id, str | int) and str(task_id) else None,
        task_type=_str(run.get("task_type")),
        goal=_str(run.get("goal")),
        outcome=run.get("outcome"),
        reward=run.get("reward"),
        scope=_str(run.get("scope")),
        tools=tool_names(run.get("tools")),
        model=_str(run.get("model")),
        metadata=metadata,
        start_ns=timestamp_ns(
            run.get("timestamp") or run.get("created_at") or run.get("start_time")
        ),
    )
    system = run.get("system")
    if system is not None:
        info.system = text_of(system)[0]
    return messages, info


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def tool_names(tools: Any) -> list[str]:
    """Names from declared tools: OpenAI ``{"function": {"name"}}``, ``{"name"}``, or strings."""
    names: list[str] = []
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, str):
            names.append(tool)
        elif isinstance(tool, dict):
            fn = tool.get("function")
            name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
            if isinstance(name, str) and name:
                names.append(name)
    return names


#: Content-part types whose text is the message's text (OpenAI, Anthropic, OTel GenAI parts).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def text_of(content: Any) -> tuple[str, list[Any]]:
    """A message's text and the parts that are not text (images, files …, kept as given).

    Content may be a string, None, or a list of parts (``{"type": "text", "text": …}``,
    ``{"type": "text", "content": …}`` in OTel, or bare strings); texts are joined by newlines.
    """
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return str(content), []
    texts: list[str] = []
    other: list[Any] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS:
            value = part.get("text", part.get("content"))
            if isinstance(value, str):
                texts.append(value)
            else:
                other.append(part)
        else:
            other.append(part)
    return join_text(texts), other
