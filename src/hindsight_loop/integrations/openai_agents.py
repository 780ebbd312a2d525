"""OpenAI Agents SDK: its traces recorded as Hindsight runs, and advice in its instructions.

The SDK reports each run as a trace to its tracing processors: agent spans, function (tool)
spans with their input, output and error, model spans. ``HindsightAgents`` is such a processor
(one trace is one task) and also brings the two run-level pieces tracing cannot give:

- ``hooks`` (``RunHooks``): the model's answers as ``llm_decision`` events, whatever the model
  class (a generation span carries them only for some), and the run's first user message as
  the task's goal;
- ``run_config()`` (a ``RunConfig`` with ``call_model_input_filter``): before the first model
  call of a run, recalls lessons for its input and adds their advice to the agent's
  instructions (as ``hs.inject(mode="append")`` does); the run's task is credited with them.

Function tools hide error details by default: the model and the trace see "An error occurred
while running the tool" and "Error details are redacted". What the SDK exposes is recorded
(``error_type`` ``ToolError`` when nothing names one); give a tool
``failure_error_function=lambda ctx, e: f"{type(e).__name__}: {e}"`` to keep the error's type
and text.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hindsight_loop.integrations import missing

try:
    from agents import RunConfig, RunHooks
    from agents.run_config import CallModelData, ModelInputData
    from agents.tracing import Span, Trace, TracingProcessor, get_current_trace
    from agents.tracing.span_data import AgentSpanData, FunctionSpanData
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("openai-agents", "openai-agents") from exc

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight
    from hindsight_loop.recall import LessonSet

log = logging.getLogger("hindsight_loop")


@dataclass(kw_only=True)
class _Run:
    """What is known about one trace's run before its ``task_start`` is recorded."""

    task_id: str
    """The Hindsight task of the trace."""
    name: str
    """The trace's workflow name."""
    goal: str = ""
    """The run's first user message."""
    tools: list[str] = field(default_factory=list)
    """The tools of its agents."""
    lessons: list[Any] = field(default_factory=list)
    """The lessons whose advice is in its instructions."""
    recalled: bool = False
    """Recall ran for it (once, before its first model call)."""
    started: bool = False
    """``task_start`` was recorded."""
    error: str | None = None
    """Why an agent span failed, if one did."""


class HindsightAgents(TracingProcessor):
    """Records OpenAI Agents SDK runs as Hindsight tasks, and injects recalled advice.

    Register it and pass its hooks and run config to each run::

        hindsight = HindsightAgents(hs, task_type="csv_report")
        add_trace_processor(hindsight)
        await Runner.run(agent, "Summarize a.csv", hooks=hindsight.hooks,
                         run_config=hindsight.run_config())

    Args:
        hs: Where runs are recorded.
        task_type: The task type of every run and of recall (default: the trace's workflow
            name).
        scope: ``global``, ``project:NAME`` or ``user:NAME``.
        intent: Recall only lessons for this intent, and record it on the task.
    """

    def __init__(
        self,
        hs: Hindsight,
        *,
        task_type: str | None = None,
        scope: str = "global",
        intent: str | None = None,
    ) -> None:
        from hindsight_loop.lessons import check_scope

        self.hs = hs
        self.task_type = task_type
        self.scope = check_scope(scope)
        self.intent = intent
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self.task_ids: list[str] = []
        """The tasks recorded, in the order their traces started."""
        self.hooks: RunHooks = _Hooks(self)
        """Pass as ``Runner.run(..., hooks=hindsight.hooks)``."""

    def run_config(self, **fields: Any) -> RunConfig:
        """A ``RunConfig`` (with your other ``fields``) whose model input filter adds advice."""
        return RunConfig(call_model_input_filter=self.inject, **fields)

    # -- recall and injection -----------------------------------------------------------------
    def inject(self, data: CallModelData[Any]) -> ModelInputData:
        """``call_model_input_filter``: the agent's instructions plus the advice for this run."""
        model_data = data.model_data
        run = self._current()
        if run is None:
            return model_data
        with self._lock:
            first, run.recalled = not run.recalled, True
            if first and not run.goal:
                run.goal = _first_user_text(model_data.input)
        if first:
            tools = [t.name for t in data.agent.tools if isinstance(getattr(t, "name", None), str)]
            run.tools.extend(t for t in tools if t not in run.tools)
            run.lessons = list(self._recall(run.goal, tools, run.name))
            self._ensure_started(run)
        if not run.lessons:
            return model_data
        system = [{"role": "system", "content": model_data.instructions or ""}]
        advised = self.hs.inject(system, run.lessons, mode="append")[0]["content"]
        return ModelInputData(input=model_data.input, instructions=advised)

    def _recall(self, query: str, tools: list[str], name: str) -> LessonSet:
        from hindsight_loop.recall import LessonSet

        try:
            return self.hs.recall(
                task_type=self.task_type or name,
                tools=tools,
                query=query,
                intent=self.intent,
                scope=self.scope,
            )
        except Exception:  # noqa: BLE001 - no lessons is better than no run
            log.exception("hindsight: recall at run start failed")
            return LessonSet()

    # -- the task -----------------------------------------------------------------------------
    def _current(self) -> _Run | None:
        current = get_current_trace()
        if current is None:
            return None
        with self._lock:
            return self._runs.get(current.trace_id)

    def _ensure_started(self, run: _Run) -> None:
        with self._lock:
            if run.started:
                return
            run.started = True
        self.hs.record(
            {
                "type": "task_start",
                "task_id": run.task_id,
                "task_type": self.task_type or run.name,
                "goal": run.goal,
                "tools": run.tools,
                "scope": self.scope,
                "intent": self.intent,
                "injected_lesson_ids": [x.lesson_id for x in run.lessons],
                "context": {"metadata": {"workflow": run.name}},
            }
        )
        if run.goal:
            self.hs.record(
                {"type": "user_input", "task_id": run.task_id, "input": {"text": run.goal}}
            )

    def _decision(self, run: _Run, calls: list[str], text: str) -> None:
        self._ensure_started(run)
        decision: dict[str, Any] = {
            "chosen_action": calls[0] if calls else "reply",
            "alternatives": [],
            "tool_calls": calls,
        }
        if text:
            decision["reasoning"] = text
        self.hs.record({"type": "llm_decision", "task_id": run.task_id, "decision": decision})

    # -- TracingProcessor ---------------------------------------------------------------------
    def on_trace_start(self, trace: Trace) -> None:
        from hindsight_loop.models import new_id

        run = _Run(task_id=new_id("tsk"), name=trace.name or "agent_run")
        with self._lock:
            self._runs[trace.trace_id] = run
            self.task_ids.append(run.task_id)

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            with self._lock:
                run = self._runs.get(span.trace_id)
                if run is not None:
                    run.tools.extend(t for t in data.tools or () if t not in run.tools)

    def on_span_end(self, span: Span[Any]) -> None:
        try:
            with self._lock:
                run = self._runs.get(span.trace_id)
            if run is None:
                return
            data = span.span_data
            if isinstance(data, FunctionSpanData):
                self._tool(run, span, data)
            elif isinstance(data, AgentSpanData) and span.error:
                run.error = str(span.error.get("message") or "agent error")
        except Exception:  # noqa: BLE001 - tracing must never break the agent
            log.exception("hindsight: recording a span failed")

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            run = self._runs.pop(trace.trace_id, None)
        if run is None:
            return
        self._ensure_started(run)
        result: dict[str, Any] = {"status": "succeeded"}
        if run.error:
            result = {"status": "failed", "error_type": "AgentError", "error_message": run.error}
        self.hs.record({"type": "task_end", "task_id": run.task_id, "result": result})

    def shutdown(self) -> None:
        self.hs.flush()

    def force_flush(self) -> None:
        self.hs.flush()

    def _tool(self, run: _Run, span: Span[Any], data: FunctionSpanData) -> None:
        from hindsight_loop.ingest import tool_error
        from hindsight_loop.ingest.wire import parse_args

        if data.name in self.hs.skip_tools:
            return
        self._ensure_started(run)
        output = data.output
        if not isinstance(output, str | int | float | bool | dict | list | type(None)):
            output = str(output)
        result: dict[str, Any] = {"status": "succeeded", "output": output}
        if span.error:
            # What the SDK exposes: the text the model got (a failure_error_function's), the
            # error in the span's data (redacted by default), the span's message.
            said = (span.error.get("data") or {}).get("error")
            found = tool_error(output) or (tool_error(said) if said else None)
            message = str(said or span.error.get("message") or "")
            error_type, error_message = found or ("ToolError", message)
            result.update(status="failed", error_type=error_type, error_message=error_message)
        else:
            found = tool_error(output)
            if found:
                result.update(status="failed", error_type=found[0], error_message=found[1])
        latency = _latency_ms(span)
        if latency is not None:
            result["latency_ms"] = latency
        self.hs.record(
            {
                "type": "action_executed",
                "task_id": run.task_id,
                "input": {"tool": data.name, "args": parse_args(data.input)},
                "result": result,
            }
        )


class _Hooks(RunHooks):
    """The run hooks of one ``HindsightAgents``: the goal and the model's decisions."""

    def __init__(self, owner: HindsightAgents) -> None:
        self.owner = owner

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: str | None, input_items: list[Any]
    ) -> None:
        run = self.owner._current()
        if run is not None and not run.goal and not run.started:
            run.goal = _first_user_text(input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        run = self.owner._current()
        if run is None:
            return
        calls: list[str] = []
        texts: list[str] = []
        for item in getattr(response, "output", None) or ():
            kind = getattr(item, "type", None)
            if kind == "function_call":
                calls.append(str(getattr(item, "name", "") or "unknown_tool"))
            elif kind == "message":
                for part in getattr(item, "content", None) or ():
                    text = getattr(part, "text", None)
                    if isinstance(text, str):
                        texts.append(text)
        self.owner._decision(run, calls, "\n".join(texts))


def _first_user_text(items: Any) -> str:
    if isinstance(items, str):
        return items
    for item in items or ():
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                texts = [p.get("text") for p in content if isinstance(p, dict)]
                return " ".join(t for t in texts if isinstance(t, str))
    return ""


def _latency_ms(span: Span[Any]) -> float | None:
    try:
        start = datetime.fromisoformat(str(span.started_at))
        end = datetime.fromisoformat(str(span.ended_at))
    except (TypeError, ValueError):
        return None
    return round((end - start).total_seconds() * 1000, 3)


__all__ = ["HindsightAgents"]
