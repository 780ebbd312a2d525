"""OpenTelemetry GenAI spans, recorded live as Hindsight runs.

Frameworks that follow the GenAI semantic conventions (pydantic-ai, and others that emit
``invoke_agent`` / ``execute_tool`` / ``chat`` spans) already say what their agent did. The
exporter turns those spans into wire events with the very mapping ``hindsight import --format
otlp`` uses (``ingest.otlp``): it writes each finished trace in the OTLP/JSON shape and hands it
to ``ingest.runs_from``, so a live run and the same run imported from a file give the same
events, ids included (one mapping per source format).

A run is mapped when its trace's local root span ends (a span with no parent, or a remote
one): before that, a later span could still belong to it, and mapping a run twice would split
it. So the events of a run reach the store when the outermost span around it ends, not span by
span; in a web service that is the end of the request.

``HindsightSpanExporter.recall`` recalls lessons inside a run and remembers which span they
were handed to: that run's ``task_start`` then carries them as ``injected_lesson_ids``, so the
run's outcome scores them like any injected lesson.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hindsight_loop.integrations import missing

try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("opentelemetry-sdk", "otel") from exc

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight
    from hindsight_loop.recall import LessonSet

log = logging.getLogger("hindsight_loop")

#: Traces whose run was recorded, remembered so a span ending after its root (a detached task)
#: is dropped rather than recorded as a second, partial run of the same task.
_DONE_TRACES = 4096


def spans_to_otlp(spans: Iterable[ReadableSpan]) -> dict[str, Any]:
    """SDK spans as one OTLP/JSON export request (``{"resourceSpans": [...]}``).

    The shape an OTLP/JSON file exporter writes: ids in hex, times in unix nanoseconds as
    strings, attributes as ``{"key", "value": AnyValue}``, status codes as numbers.
    """
    resources: dict[int, tuple[Any, dict[tuple[str, str | None], list[dict[str, Any]]]]] = {}
    for span in spans:
        res = resources.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        res[1].setdefault(key, []).append(_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(getattr(resource, "attributes", None))},
                "scopeSpans": [
                    {"scope": _scope(name, version), "spans": encoded}
                    for (name, version), encoded in scopes.items()
                ],
            }
            for resource, scopes in resources.values()
        ]
    }


def _scope(name: str, version: str | None) -> dict[str, Any]:
    return {"name": name, "version": version} if version else {"name": name}


def _span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x") if ctx else "",
        "spanId": format(ctx.span_id, "016x") if ctx else "",
        "parentSpanId": format(span.parent.span_id, "016x") if span.parent else "",
        "name": span.name,
        "kind": span.kind.value + 1,  # the SDK counts from INTERNAL = 0, OTLP from 1
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _attributes(span.attributes),
        "status": {"code": span.status.status_code.value},
    }
    if span.status.description:
        out["status"]["message"] = span.status.description
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": _attributes(event.attributes),
            }
            for event in span.events
        ]
    return out


def _attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in (attrs or {}).items()]


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):  # before int: a bool is an int
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 travels as a string in OTLP/JSON
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _attributes(value)}}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


class HindsightSpanExporter(SpanExporter):
    """Records the GenAI runs in finished spans as Hindsight tasks.

    Use it behind any span processor::

        provider.add_span_processor(SimpleSpanProcessor(HindsightSpanExporter(hs)))

    ``BatchSpanProcessor`` keeps the mapping off the agent's thread; ``SimpleSpanProcessor``
    maps on it when a run ends (no I/O: events are handed to the recorder).

    Args:
        hs: Where runs are recorded.
        task_type: The task type of every run (default: the agent's name,
            ``gen_ai.agent.name``, else ``imported``). Recall uses the same.
        goal: The goal of every run (default: its first user message).
        scope: The scope of every run and of recall (``global``, ``project:NAME``,
            ``user:NAME``).
    """

    def __init__(
        self,
        hs: Hindsight,
        *,
        task_type: str | None = None,
        goal: str | None = None,
        scope: str | None = None,
    ) -> None:
        from hindsight_loop.lessons import check_scope

        self.hs = hs
        self.task_type = task_type
        self.goal = goal
        self.scope = check_scope(scope) if scope is not None else None
        self._lock = threading.Lock()
        self._traces: dict[int, list[ReadableSpan]] = {}
        self._done: OrderedDict[int, None] = OrderedDict()
        # (trace id, span id) -> the lessons recalled under that span
        self._recalled: dict[tuple[int, int], LessonSet] = {}
        self._shut = False

    # -- SpanExporter -------------------------------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Buffer spans by trace; record a trace's runs when its local root span ends."""
        ended: list[int] = []
        with self._lock:
            if self._shut:
                return SpanExportResult.FAILURE
            for span in spans:
                ctx = span.get_span_context()
                if ctx is None or ctx.trace_id in self._done:
                    continue  # ended after its trace was recorded (see _DONE_TRACES)
                self._traces.setdefault(ctx.trace_id, []).append(span)
                if span.parent is None or span.parent.is_remote:
                    ended.append(ctx.trace_id)
        for trace_id in ended:
            self._record_trace(trace_id)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until the runs recorded so far are durable (open traces stay buffered)."""
        return self.hs.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Record what is still buffered (runs cut off by the shutdown) and flush."""
        with self._lock:
            self._shut = True
            pending = list(self._traces)
        for trace_id in pending:
            self._record_trace(trace_id)
        self.hs.flush()

    # -- recall -------------------------------------------------------------------------------
    def recall(
        self,
        *,
        query: str = "",
        tools: Sequence[str] = (),
        task_type: str | None = None,
        intent: str | None = None,
    ) -> LessonSet:
        """Lessons for the run the current span belongs to, counted as injected into it.

        Call it where the framework builds the agent's instructions, inside the run's span:
        the run's task then carries the lessons (``injected_lesson_ids``) and its outcome
        scores them. Called again under the same span, it returns the same lessons without
        recalling again (frameworks rebuild instructions on every model request).
        """
        ctx = trace.get_current_span().get_span_context()
        key = (ctx.trace_id, ctx.span_id) if ctx.is_valid else None
        with self._lock:
            if key is not None and key in self._recalled:
                return self._recalled[key]
        from hindsight_loop.recall import LessonSet

        try:
            lessons = self.hs.recall(
                task_type=task_type or self.task_type,
                tools=tools,
                query=query,
                intent=intent,
                scope=self.scope,
            )
        except Exception:  # noqa: BLE001 - no lessons is better than no run
            log.exception("hindsight: recall at run start failed")
            lessons = LessonSet()
        if key is not None:
            with self._lock:
                self._recalled[key] = lessons
        return lessons

    # -- mapping ------------------------------------------------------------------------------
    def _record_trace(self, trace_id: int) -> None:
        from hindsight_loop.ingest import runs_from

        with self._lock:
            spans = self._traces.pop(trace_id, [])
            keys = [key for key in self._recalled if key[0] == trace_id]
            recalled = {key[1]: self._recalled.pop(key) for key in keys}
            self._done[trace_id] = None
            while len(self._done) > _DONE_TRACES:
                self._done.popitem(last=False)
        if not any("gen_ai.operation.name" in (s.attributes or {}) for s in spans):
            return  # no GenAI span: not an agent's run (an HTTP request, a query)
        try:
            runs = runs_from(
                spans_to_otlp(spans),
                "otlp",
                task_type=self.task_type,
                goal=self.goal,
                scope=self.scope,
            )
            for run in runs:
                _credit(run.events, recalled, alone=len(runs) == 1)
                for event in run.events:
                    self.hs.record(event)
        except Exception:  # noqa: BLE001 - tracing must never break the agent
            log.exception("hindsight: recording the runs of trace %032x failed", trace_id)


def _credit(events: list[dict[str, Any]], recalled: dict[int, LessonSet], *, alone: bool) -> None:
    """Put the lessons recalled under a run's spans into its ``task_start``."""
    if not events or not recalled:
        return
    spans: set[int] = set()
    for event in events:
        meta = (event.get("context") or {}).get("metadata") or {}
        for found in (meta.get("span_id"), (meta.get("agent_span") or {}).get("span_id")):
            if isinstance(found, str) and found:
                spans.add(int(found, 16))
    ids: list[str] = []
    for span_id, lessons in recalled.items():
        # A recall under a span outside every run (the app's own span) goes to a lone run.
        if span_id in spans or alone:
            ids.extend(x for x in lessons.ids if x not in ids)
    if ids:
        start = events[0]
        start["injected_lesson_ids"] = [*start.get("injected_lesson_ids", ()), *ids]


__all__ = ["HindsightSpanExporter", "spans_to_otlp"]
