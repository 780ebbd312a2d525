"""The agent-side task context: ``with hs.task(...) as task`` and the calls made inside it.

Everything here runs on the agent's thread, so it only builds small payloads and hands them to
the recorder (no I/O, no serialization); a task that raises is recorded as failed and the
exception goes on unchanged.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hindsight_loop.models import is_failure
from hindsight_loop.record import warn

if TYPE_CHECKING:
    from hindsight_loop.models import Lesson
    from hindsight_loop.recall import LessonSet
    from hindsight_loop.record import Recorder

log = logging.getLogger("hindsight_loop")


class Facade(Protocol):
    """What a task needs of the ``Hindsight`` object that started it (the facade passes itself)."""

    recorder: Recorder
    skip_tools: frozenset[str]

    def task(
        self,
        task_type: str,
        *,
        goal: str = ...,
        tools: Sequence[str] = ...,
        scope: str = ...,
        intent: str | None = ...,
        query: str | None = ...,
        recall: bool = ...,
        task_id: str | None = ...,
        timestamp: Any = ...,
    ) -> TaskRun: ...

    def record(self, event: dict[str, Any]) -> bool: ...

    def recall(
        self,
        *,
        task_type: str | None = ...,
        tools: Sequence[str] = ...,
        query: str = ...,
        intent: str | None = ...,
        scope: str | None = ...,
        step: str | None = ...,
        error_type: str | None = ...,
        limit: int = ...,
    ) -> LessonSet: ...

    def credit_lessons(self, task_id: str, lesson_ids: Sequence[str]) -> None: ...

    def inject(self, messages: list[dict[str, Any]], lessons: Sequence[Lesson]) -> list[Any]: ...

    def drain(self, timeout: float = ...) -> bool: ...


F = TypeVar("F", bound=Callable[..., Any])

_current_task: contextvars.ContextVar[TaskRun | None] = contextvars.ContextVar(
    "hindsight_current_task", default=None
)


def current_task() -> TaskRun | None:
    """The task whose ``with hs.task(...)`` block the caller is in, if any."""
    return _current_task.get()


def tool(fn: F) -> F:
    """Wrap a tool (sync or async) so each call inside a ``hs.task`` block is recorded.

    Outside a task the tool runs as it is: a decorated tool never needs Hindsight to work.
    """
    sig = inspect.signature(fn)
    name = fn.__name__

    def arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
        try:
            bound = sig.bind_partial(*args, **kwargs)
            return dict(bound.arguments)
        except TypeError:
            return {"args": list(args), **kwargs}

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            task = _current_task.get()
            if task is None:
                return await fn(*args, **kwargs)
            with task.action(name, arguments(args, kwargs)) as call:
                out = await fn(*args, **kwargs)
                call.result(out)
                return out

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        task = _current_task.get()
        if task is None:
            return fn(*args, **kwargs)
        with task.action(name, arguments(args, kwargs)) as call:
            out = fn(*args, **kwargs)
            call.result(out)
            return out

    return wrapper  # type: ignore[return-value]


class TaskRun:
    """One task being recorded; created by ``Hindsight.task``."""

    def __init__(
        self,
        hs: Facade,
        *,
        task_type: str,
        goal: str,
        tools: list[str],
        scope: str,
        intent: str | None,
        query: str | None,
        recall: bool,
        task_id: str,
        timestamp: Any,
    ) -> None:
        self.hs = hs
        self.task_id = task_id
        self.task_type = task_type
        self.goal = goal
        self.tools = tools
        self.scope = scope
        self.intent = intent
        self._query = query
        self._recall = recall
        self._timestamp = timestamp
        self._outcome: dict[str, Any] | None = None
        self._token: contextvars.Token | None = None
        self.lessons: LessonSet = _empty_lessons()
        self.events = 0

    # -- context -----------------------------------------------------------------------------
    def __enter__(self) -> TaskRun:
        if self._recall:
            try:
                self.lessons = self.hs.recall(
                    task_type=self.task_type,
                    tools=self.tools,
                    query=self._query or self.goal,
                    intent=self.intent,
                    scope=self.scope,
                )
            except Exception:  # noqa: BLE001 - no lessons is better than no task
                log.exception("hindsight: recall at task start failed")
        self._emit(
            "task_start",
            {
                "task_type": self.task_type,
                "goal": self.goal,
                "tools": self.tools,
                "scope": self.scope,
                "intent": self.intent,
                "injected_lesson_ids": [x.lesson_id for x in self.lessons],
            },
            timestamp=self._timestamp,
        )
        self._token = _current_task.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            try:
                _current_task.reset(self._token)
            except ValueError:  # exited in another context (a generator, a thread)
                _current_task.set(None)
        if exc is not None:
            result = {
                "status": "failed",
                "error_type": type(exc).__name__,
                "error_message": _error_text(exc),
            }
        else:
            result = self._outcome or {"status": "succeeded"}
        self._emit("task_end", {"result": result})
        # the exception, if any, propagates: returning None does not swallow it

    # -- steps -------------------------------------------------------------------------------
    def _emit(self, etype: str, payload: dict[str, Any], *, timestamp: Any = None) -> None:
        self.events += 1
        self.hs.recorder.emit(self.task_id, etype, payload, timestamp=timestamp)

    def user_input(self, text: str, *, timestamp: Any = None) -> None:
        """The user said something."""
        self._emit("user_input", {"input": {"text": text}}, timestamp=timestamp)

    def decision(
        self,
        chosen: str,
        *,
        alternatives: Sequence[str] = (),
        confidence: float | None = None,
        reasoning: str | None = None,
        step: str | None = None,
        timestamp: Any = None,
    ) -> None:
        """The model chose an action (``llm_decision``)."""
        payload: dict[str, Any] = {
            "decision": {
                "chosen_action": chosen,
                "alternatives": list(alternatives),
                "confidence": confidence,
            }
        }
        if reasoning:
            payload["decision"]["reasoning"] = reasoning
        if step:
            payload["agent_state"] = {"current_step": step}
        self._emit("llm_decision", payload, timestamp=timestamp)

    def state(
        self, *, timestamp: Any = None, context: dict[str, Any] | None = None, **agent_state: Any
    ) -> None:
        """The agent's state changed (``current_step=…``, ``context_count=…``)."""
        payload: dict[str, Any] = {"agent_state": agent_state}
        if context:
            payload["context"] = context
        self._emit("state_change", payload, timestamp=timestamp)

    def feedback(
        self, text: str = "", *, score: float | None = None, timestamp: Any = None
    ) -> None:
        """The user's satisfaction: a negative score or words of complaint mark dissatisfaction."""
        self._emit("feedback", {"input": {"text": text, "score": score}}, timestamp=timestamp)

    def action(
        self,
        name: str,
        input: dict[str, Any] | None = None,  # noqa: A002 - the wire format's own word
        *,
        step: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> ActionCall:
        """Record one tool call: ``with task.action("read_csv", {...}) as call: ...``."""
        return ActionCall(self, name, input, step=step, context=context)

    def record_action(
        self,
        name: str,
        args: dict[str, Any] | None,
        *,
        output: Any = None,
        status: str = "succeeded",
        error_type: str | None = None,
        error_message: str | None = None,
        step: str | None = None,
        latency_ms: float | None = None,
        timestamp: Any = None,
    ) -> None:
        """Record a tool call that already happened, in one call (the cheapest path)."""
        if name in self.hs.skip_tools:
            return
        result: dict[str, Any] = {"status": status, "output": output}
        if error_type is not None:
            result["error_type"] = error_type
            result["error_message"] = error_message
        if latency_ms is not None:
            result["latency_ms"] = latency_ms
        # The cheapest path takes ``args`` as given (no copy): the writer reads it within a few
        # milliseconds, so do not refill the same dict for the next call (task.action copies).
        payload: dict[str, Any] = {"input": {"tool": name, "args": args}, "result": result}
        if step is not None:
            payload["agent_state"] = {"current_step": step}
        # ``_emit`` written out: a Python frame fewer on the agent's cheapest path.
        self.events += 1
        self.hs.recorder.emit(self.task_id, "action_executed", payload, timestamp=timestamp)

    def fail(self, reason: str | None = None, **details: Any) -> None:
        """Mark the task failed (recorded when the ``with`` block ends)."""
        self._outcome = {"status": "failed", "error_message": reason, **details}

    def succeed(self, **details: Any) -> None:
        """Mark the task succeeded (the default when the block ends without an exception)."""
        self._outcome = {"status": "succeeded", **details}

    # -- lessons -----------------------------------------------------------------------------
    @property
    def advice(self) -> str:
        """The recalled lessons rendered as tool-usage advice ('' when there are none)."""
        return self.lessons.as_prompt() if self.lessons else ""

    def advice_for(self, tool: str, *, error_type: str | None = None, query: str = "") -> LessonSet:
        """Recall during the run, e.g. right after a tool failed, to change course in time."""
        try:
            found = self.hs.recall(
                task_type=self.task_type,
                tools=[tool],
                query=query or f"{tool} {error_type or ''}",
                scope=self.scope,
                error_type=error_type,
            )
            fresh = [x for x in found if x.lesson_id not in {y.lesson_id for y in self.lessons}]
            if fresh:
                # They were handed to the agent: the task's outcome counts for them too.
                self.lessons.extend(fresh)
                self.hs.credit_lessons(self.task_id, [x.lesson_id for x in fresh])
            return found
        except Exception:  # noqa: BLE001
            log.exception("hindsight: in-run recall failed")
            return _empty_lessons()


class ActionCall:
    """One tool call being recorded; ``call.result(...)`` sets its result explicitly."""

    __slots__ = ("_context", "_name", "_result", "_started", "_step", "_task", "input")

    def __init__(
        self,
        task: TaskRun,
        name: str,
        input: dict[str, Any] | None,  # noqa: A002
        *,
        step: str | None,
        context: dict[str, Any] | None,
    ) -> None:
        self._task = task
        self._name = name
        # As called: a dict the agent refills for its next call must not rewrite this one.
        self.input = input.copy() if type(input) is dict else input
        self._step = step
        self._context = context
        self._result: dict[str, Any] | None = None
        self._started = 0.0

    def __enter__(self) -> ActionCall:
        self._started = time.perf_counter()
        return self

    def result(self, output: Any = None, *, status: str | None = None, **fields: Any) -> None:
        """Set what the call returned. ``status`` defaults to succeeded."""
        self._result = {"status": status or "succeeded", "output": output, **fields}

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._name in self._task.hs.skip_tools:
            return
        latency = round((time.perf_counter() - self._started) * 1000, 3)
        result: dict[str, Any]
        if exc is not None:
            result = {
                "status": "failed",
                "error_type": type(exc).__name__,
                "error_message": _error_text(exc),
            }
            if self._result and "output" in self._result:
                result["output"] = self._result["output"]
        else:
            result = self._result or {"status": "succeeded"}
        result["latency_ms"] = latency
        payload: dict[str, Any] = {
            "input": {"tool": self._name, "args": self.input},
            "result": result,
        }
        if self._step is not None:
            payload["agent_state"] = {"current_step": self._step}
        if self._context:
            payload["context"] = self._context
        self._task._emit("action_executed", payload)


def run_with_feedback(
    hs: Facade,
    task_type: str,
    runner: Callable[[Any, Callable[[dict[str, Any]], None]], Any],
    task_input: Any,
    *,
    goal: str | None,
    tools: Sequence[str],
    scope: str,
    intent: str | None,
) -> Any:
    """The whole loop in one call (``hs.run_task_with_feedback``): recall and inject, run,
    record the outcome, then wait for the reviews so the next run has their lessons."""
    text_goal = goal if goal is not None else goal_text(task_input)
    try:
        with hs.task(task_type, goal=text_goal, tools=tools, scope=scope, intent=intent) as task:
            if isinstance(task_input, dict) and isinstance(task_input.get("messages"), list):
                task_input = {
                    **task_input,
                    "messages": hs.inject(task_input["messages"], task.lessons),
                }

            def event_callback(event: dict[str, Any]) -> None:
                if isinstance(event, dict):
                    hs.record({**event, "task_id": task.task_id})
                else:
                    hs.record(event)  # refused with a warning, kept in the dead letter

            result = runner(task_input, event_callback)
            if isinstance(result, dict) and is_failure(result.get("status")):
                task.fail(str(result.get("error") or "runner reported failure"))
    finally:
        # After task_end is recorded, also when the runner raised: the review sees the whole
        # run, then the exception goes on.
        try:
            hs.drain()
        except Exception:  # noqa: BLE001 - reviewing never breaks the task
            log.exception("hindsight: review after the task failed")
    return result


# -- helpers ------------------------------------------------------------------------------------


def _empty_lessons() -> LessonSet:
    from hindsight_loop.recall import LessonSet

    return LessonSet()


def tool_list(tools: Sequence[str] | str | None) -> list[str]:
    """Tool names as a list; a lone string is one tool, not its letters."""
    if tools is None:
        return []
    if isinstance(tools, str):
        warn(f"tools={tools!r} is a string: taken as one tool; pass a list of tool names")
        return [tools]
    return [str(t) for t in tools]


def _error_text(exc: BaseException) -> str:
    """``str(exc)`` that cannot fail: the agent's own exception must stay the one it sees."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__}: str() failed>"


def goal_text(task_input: Any) -> str:
    if isinstance(task_input, str):
        return task_input[:500]
    if isinstance(task_input, dict):
        for key in ("goal", "query", "question", "input", "task"):
            if isinstance(task_input.get(key), str):
                return task_input[key][:500]
        msgs = task_input.get("messages")
        if isinstance(msgs, list):
            for m in reversed(msgs):
                if (
                    isinstance(m, dict)
                    and m.get("role") == "user"
                    and isinstance(m.get("content"), str)
                ):
                    return m["content"][:500]
    return repr(task_input)[:500]


__all__ = [
    "ActionCall",
    "TaskRun",
    "current_task",
    "goal_text",
    "run_with_feedback",
    "tool",
    "tool_list",
]
