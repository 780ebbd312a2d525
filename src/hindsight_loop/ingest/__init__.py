"""Import the runs agents already produce: transcripts and traces into wire-format events.

Users have OpenAI or Anthropic message lists and OpenTelemetry GenAI spans, not Hindsight's wire
format. One module per source format maps them (``openai``, ``anthropic``, ``otlp``; ``wire``
holds what they share); ``runs_from`` picks the mapping and ``read_runs`` reads a file. The
mappings are pure: the facade records the events they return.

Decisions every mapping shares (``wire.RunBuilder``):

- Ids are deterministic, so importing the same file twice gives the same events (the store
  dedupes by ``event_id``): a run's task id is its own ``task_id`` when it has one, else
  ``tsk_`` + a hash of the run's data; event ids hash the run's data, task id and position.
- Timestamps are the source's when it has them (never running backwards); otherwise they are
  synthesized one millisecond apart from ``wire.SYNTHETIC_BASE`` (2000-01-01T00:00:00Z).
- A tool call failed when the source flags it (Anthropic ``is_error``, a span's ERROR status or
  ``error.type``) or when its result reads as an error (``wire.tool_error``: a generic error
  marker such as ``Error:``, ``Traceback``, ``错误``, or a JSON object with an ``error`` key).
  A call whose result never appears gets ``result.status = "unknown"``.
- ``task_end``: the caller's ``outcome``, else the run's ``outcome``, else its ``reward``
  (>= 1 succeeded, else failed; kept in ``result.reward``), else an error status on the agent
  span; with none of those the run failed if its last tool call failed or got no result, and
  succeeded otherwise. ``result.outcome_source`` says which rule decided.
- What the caller passes (``task_type``, ``goal``, ``outcome``, ``scope``) wins over what a run
  says about itself; a run with no goal takes its first user message.

``import_data`` and ``import_path`` record what the mappings return through a ``Hindsight`` (its
recorder, so imported events are sanitized and redacted like live ones, and its worker, which
reviews the ended runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from hindsight_loop.ingest.ag2 import ag2_events, is_ag2_run
from hindsight_loop.ingest.anthropic import anthropic_events
from hindsight_loop.ingest.openai import openai_events
from hindsight_loop.ingest.otlp import otlp_events
from hindsight_loop.ingest.wire import (
    MESSAGE_KEYS,
    Overrides,
    is_wire_event,
    read_wire_lines,
    tool_error,
    wire_runs,
)
from hindsight_loop.models import wire_event_problem

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight

FORMATS = ("auto", "wire", "openai", "anthropic", "otlp", "ag2")

__all__ = [
    "FORMATS",
    "ImportReport",
    "Run",
    "detect_format",
    "import_data",
    "import_path",
    "read_runs",
    "record_runs",
    "runs_from",
    "tool_error",
]


@dataclass(kw_only=True)
class Run:
    """One imported run."""

    task_id: str
    """The Hindsight task the events belong to."""
    events: list[dict[str, Any]]
    """Wire-format events, ``task_start`` first and ``task_end`` last (wire input: as given)."""


@dataclass(kw_only=True)
class ImportReport:
    """What an import stored."""

    runs: int = 0
    """Runs read (a JSONL file of wire events counts as one)."""
    accepted: int = 0
    """Events recorded."""
    duplicates: int = 0
    """Events skipped because the store already had them (same ``event_id``)."""
    problems: list[str] = field(default_factory=list)
    """Events refused, and why (with the line number for a JSONL file)."""


def record_runs(
    runs: Iterable[list[dict[str, Any]]],
    *,
    stored_ids: Callable[[str], set[str]],
    accept: Callable[[dict[str, Any]], None],
    checked: bool = False,
) -> ImportReport:
    """Hand the events of runs to ``accept``, skipping those already stored.

    Args:
        runs: Each run's wire-format events.
        stored_ids: The ids of a task's stored events (asked once per task).
        accept: Records one checked event.
        checked: The events passed ``models.wire_event_problem`` already.
    """
    report = ImportReport()
    stored: dict[str, set[str]] = {}
    for events in runs:
        report.runs += 1
        for event in events:
            problem = None if checked else wire_event_problem(event)
            if problem:
                report.problems.append(problem)
                continue
            task_id, event_id = event["task_id"], event.get("event_id")
            if task_id not in stored:
                stored[task_id] = stored_ids(task_id)
            if isinstance(event_id, str):
                if event_id in stored[task_id]:
                    report.duplicates += 1
                    continue
                stored[task_id].add(event_id)
            accept(event)
            report.accepted += 1
    return report


def import_data(hs: Hindsight, data: Any, format: str = "auto", **fields: Any) -> ImportReport:  # noqa: A002
    """Record the runs in parsed ``data`` (``runs_from``'s arguments) into ``hs``."""
    runs = runs_from(data, format, **_checked(fields))
    return _record_into(hs, [run.events for run in runs])


def import_path(
    hs: Hindsight,
    path: str | os.PathLike[str],
    format: str = "auto",  # noqa: A002
    **fields: Any,
) -> ImportReport:
    """Record the runs of a file (``read_runs``'s arguments) into ``hs``. A JSONL file of
    wire-format events is read line by line: a bad line is reported with its number and the
    rest is imported."""
    if format in ("auto", "wire"):
        lines = read_wire_lines(path, sniff=format == "auto")
        if lines is not None:
            events = [e for e, _ in lines if e is not None]
            report = _record_into(hs, [events], checked=True)
            report.problems = [p for _, p in lines if p] + report.problems
            return report
    runs = read_runs(path, format, **_checked(fields))
    return _record_into(hs, [run.events for run in runs])


def _checked(fields: dict[str, Any]) -> dict[str, Any]:
    """A mistyped scope would leak or lose lessons: refuse it before anything is recorded."""
    if fields.get("scope") is not None:
        from hindsight_loop.lessons import check_scope

        fields = {**fields, "scope": check_scope(fields["scope"])}
    return fields


def _record_into(
    hs: Hindsight, runs: list[list[dict[str, Any]]], *, checked: bool = False
) -> ImportReport:
    hs.flush()  # what was recorded before counts as stored
    report = record_runs(
        runs, stored_ids=hs.store.event_ids, accept=hs.recorder.emit_event, checked=checked
    )
    hs.flush()
    # Many runs at once: besides each run's own review, what recurs among them.
    hs.worker.request_batch(
        {e["task_type"] for run in runs for e in run if e.get("type") == "task_start"}
    )
    return report


def runs_from(
    data: Any,
    format: str = "auto",
    *,
    task_type: str | None = None,
    goal: str | None = None,
    outcome: str | None = None,
    scope: str | None = None,
    source: str = "",
) -> list[Run]:
    """Map parsed JSON data in a transcript or trace format to runs of wire-format events.

    Args:
        data: one run (a list of messages, or an object with ``messages`` / ``traj`` /
            ``trajectory``), a list of runs, OTLP/JSON trace data, or wire-format events.
        format: one of ``FORMATS``; ``auto`` guesses with ``detect_format``.
        task_type, goal, outcome, scope: given to every run, over what the run says itself
            (wire-format events already carry their own and pass through unchanged).
        source: where the runs came from (a file name), kept in ``task_start``
            ``context.import_source``.

    Raises:
        ValueError: the format is unknown, cannot be guessed, or the data does not fit it.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; use --format {'|'.join(FORMATS)}")
    if format == "auto":
        format = detect_format(data)
    overrides = Overrides(
        task_type=task_type, goal=goal, outcome=outcome, scope=scope, source=source
    )
    if format == "wire":
        return [Run(task_id=t, events=e) for t, e in wire_runs(data)]
    if format == "otlp":
        return [Run(task_id=t, events=e) for t, e in otlp_events(data, overrides)]
    if format == "ag2":
        chats = data if isinstance(data, list) else [data]
        return [Run(task_id=t, events=e) for t, e in (ag2_events(c, overrides) for c in chats)]
    mapping = openai_events if format == "openai" else anthropic_events
    runs: list[Run] = []
    for run in _runs_in(data):
        task_id, events = mapping(run, overrides)
        runs.append(Run(task_id=task_id, events=events))
    return runs


def read_runs(
    path: str | os.PathLike[str],
    format: str = "auto",
    *,
    task_type: str | None = None,
    goal: str | None = None,
    outcome: str | None = None,
    scope: str | None = None,
    source: str | None = None,
) -> list[Run]:
    """Read a JSON file, or a JSONL file (one run, one message, one wire event or one OTLP
    export per line), and map it with ``runs_from``. ``source`` defaults to the file name."""
    data = load_json_or_jsonl(path)
    return runs_from(
        data,
        format,
        task_type=task_type,
        goal=goal,
        outcome=outcome,
        scope=scope,
        source=os.path.basename(os.fspath(path)) if source is None else source,
    )


def load_json_or_jsonl(path: str | os.PathLike[str]) -> Any:
    """A file's JSON value, or the list of values of its lines when it is JSONL."""
    with open(path, "rb") as fh:
        raw = fh.read().removeprefix(b"\xef\xbb\xbf")  # a BOM from Windows tools
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    items: list[Any] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(path)}: line {lineno} is not JSON ({exc})") from None
    return items


# -- format detection ---------------------------------------------------------------------------

_OPENAI_ROLES = frozenset({"tool", "function", "developer"})
_OPENAI_KEYS = frozenset({"tool_calls", "function_call", "tool_call_id"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "input_text", "output_text", "refusal"})
_ANTHROPIC_BLOCKS = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use", "document"}
)


def _unsure(what: str) -> ValueError:
    return ValueError(
        f"cannot tell the format of this data ({what}); "
        "name it with --format wire|openai|anthropic|otlp|ag2 "
        "(format=... in runs_from / read_runs)"
    )


def detect_format(data: Any) -> str:
    """Guess the format of parsed JSON data: ``wire``, ``openai``, ``anthropic``, ``otlp`` or ``ag2``.

    Plain text messages read the same in both chat formats and are called ``openai``.

    Raises:
        ValueError: when the data fits no format or mixes signs of two; the message names
            ``--format``.
    """
    if isinstance(data, dict):
        if "resourceSpans" in data:
            return "otlp"
        if is_wire_event(data):
            return "wire"
        if is_ag2_run(data):
            return "ag2"  # an AG2 group chat: {"history": [{"name", "content", …}]}
        if any(isinstance(data.get(k), list) for k in MESSAGE_KEYS):
            return _chat_format([data])
        raise _unsure("an object with neither 'resourceSpans', 'messages' nor a wire 'type'")
    if not isinstance(data, list):
        raise _unsure(f"a JSON {type(data).__name__}")
    if not data:
        raise _unsure("an empty list")
    if all(isinstance(x, dict) and "resourceSpans" in x for x in data):
        return "otlp"
    if all(is_wire_event(x) for x in data):
        return "wire"
    if all(is_ag2_run(x) for x in data):
        return "ag2"
    if all(isinstance(x, dict) and "role" in x for x in data):
        return _chat_format([data])  # one run: a list of messages
    if all(
        isinstance(x, list) or (isinstance(x, dict) and any(k in x for k in MESSAGE_KEYS))
        for x in data
    ):
        return _chat_format(data)  # a list of runs
    raise _unsure("a list that is neither messages, runs, wire events nor OTLP exports")


def _runs_in(data: Any) -> list[Any]:
    """The runs in chat data: one run (messages, or an object holding them) or a list of runs."""
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list) and data and all(isinstance(x, dict) and "role" in x for x in data):
        return [data]
    if isinstance(data, list):
        return data
    raise ValueError(f"chat transcripts are a list or an object, got {type(data).__name__}")


def _chat_format(runs: list[Any]) -> str:
    openai = anthropic = False
    for run in runs:
        messages: Any = run
        if isinstance(run, dict):
            messages = next((run[k] for k in MESSAGE_KEYS if isinstance(run.get(k), list)), [])
            anthropic |= "system" in run and not isinstance(run.get("system"), dict)
        for msg in messages if isinstance(messages, list) else ():
            if not isinstance(msg, dict):
                continue
            openai |= msg.get("role") in _OPENAI_ROLES or any(k in msg for k in _OPENAI_KEYS)
            content = msg.get("content")
            for part in content if isinstance(content, list) else ():
                kind = part.get("type") if isinstance(part, dict) else None
                openai |= kind in _OPENAI_PARTS
                anthropic |= kind in _ANTHROPIC_BLOCKS or (
                    kind == "image" and isinstance(part.get("source"), dict)
                )
        if openai and anthropic:
            raise _unsure("messages show signs of both OpenAI and Anthropic")
    return "anthropic" if anthropic else "openai"
