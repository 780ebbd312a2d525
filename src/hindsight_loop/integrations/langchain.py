"""LangChain / LangGraph: a callback handler that records runs, and advice in the messages.

LangChain reports every step of a run to its callback handlers: chains (a LangGraph graph is
one), chat model calls and tool calls, each with a run id and its parent's. The handler turns
them into wire events through the facade (``hs.record``):

- the outermost run (no parent) is the task: ``task_start`` when it starts, ``task_end`` when
  it ends (failed when it raised), the last human message of its input as the goal;
- a chat model call's answer is an ``llm_decision`` (its tool calls, or ``reply``);
- a tool call is an ``action_executed`` with its arguments, its output, its latency, and the
  error type and message when it raised or returned an error (``status="error"`` on a
  ``ToolMessage``, or an output that reads as an error by the import's rule,
  ``ingest.tool_error``).

Callbacks cannot change what the model is sent, so recall and injection happen before the run:
``handler.inject(messages)`` recalls lessons for the task and returns the messages with the
advice in a system message (placed by ``hs.inject``'s rule); the next run the handler sees is
credited with those lessons.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from hindsight_loop.integrations import missing

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, LLMResult
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("langchain-core", "langchain") from exc

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight
    from hindsight_loop.recall import LessonSet

log = logging.getLogger("hindsight_loop")

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


class HindsightCallbackHandler(BaseCallbackHandler):
    """Records LangChain runs as Hindsight tasks.

    Pass it in the run's config: ``graph.invoke(inputs, config={"callbacks": [handler]})``.
    Invoke the agent as one runnable (a chain, a LangGraph graph, a ``RunnableLambda`` over
    your own loop) so its model and tool calls share one outermost run: that run is the task.

    Args:
        hs: Where runs are recorded.
        task_type: The task type of every run, and of recall.
        tools: The agent's tool names (for recall; the task lists the tools it called too).
        scope: ``global``, ``project:NAME`` or ``user:NAME``.
        intent: Recall only lessons for this intent, and record it on the task.
    """

    raise_error = False  # a recording problem must never break the agent
    run_inline = True  # in async runs too: cheap, thread-safe, and keeps the steps in order

    def __init__(
        self,
        hs: Hindsight,
        *,
        task_type: str,
        tools: Sequence[str] = (),
        scope: str = "global",
        intent: str | None = None,
    ) -> None:
        from hindsight_loop.lessons import check_scope

        self.hs = hs
        self.task_type = task_type
        self.tools = list(tools)
        self.scope = check_scope(scope)
        self.intent = intent
        self._lock = threading.Lock()
        self._root: dict[UUID, UUID] = {}  # run id -> its task's (outermost) run id
        self._tasks: dict[UUID, str] = {}  # outermost run id -> task id
        self._tools: dict[UUID, tuple[str, Any, float]] = {}  # tool run -> name, args, start
        self._pending: LessonSet | None = None
        self.task_ids: list[str] = []
        """The tasks recorded, in the order they started."""

    # -- recall and injection -----------------------------------------------------------------
    def recall(self, query: str = "") -> LessonSet:
        """Lessons for the next run; they are credited to it when it starts."""
        from hindsight_loop.recall import LessonSet

        try:
            lessons = self.hs.recall(
                task_type=self.task_type,
                tools=self.tools,
                query=query,
                intent=self.intent,
                scope=self.scope,
            )
        except Exception:  # noqa: BLE001 - no lessons is better than no run
            log.exception("hindsight: recall before the run failed")
            lessons = LessonSet()
        with self._lock:
            self._pending = lessons
        return lessons

    def inject(
        self, messages: Sequence[BaseMessage], *, query: str | None = None
    ) -> list[BaseMessage]:
        """The messages with the recalled advice in a system message before the last human one.

        ``query`` defaults to the last human message.
        """
        out = list(messages)
        lessons = self.recall(_last_human(out) if query is None else query)
        if not lessons:
            return out
        # Where the advice goes is recall.inject's rule: ask it with the roles alone.
        skeleton = [{"role": _ROLES.get(m.type, m.type)} for m in out]
        placed = self.hs.inject(skeleton, lessons)
        at = next(i for i, m in enumerate(placed) if "content" in m)
        out.insert(at, SystemMessage(content=placed[at]["content"]))
        return out

    # -- the task -----------------------------------------------------------------------------
    def _task_of(self, run_id: UUID, parent_run_id: UUID | None, inputs: Any = None) -> str:
        """The task a run belongs to; an outermost run starts one."""
        with self._lock:
            if parent_run_id is not None and parent_run_id in self._root:
                root = self._root[parent_run_id]
                self._root[run_id] = root
                return self._tasks[root]
            self._root[run_id] = run_id
            from hindsight_loop.models import new_id

            task_id = new_id("tsk")
            self._tasks[run_id] = task_id
            self.task_ids.append(task_id)
            lessons, self._pending = self._pending, None
        goal = _goal(inputs)
        self.hs.record(
            {
                "type": "task_start",
                "task_id": task_id,
                "task_type": self.task_type,
                "goal": goal,
                "tools": self.tools,
                "scope": self.scope,
                "intent": self.intent,
                "injected_lesson_ids": lessons.ids if lessons else [],
            }
        )
        if goal:
            self.hs.record({"type": "user_input", "task_id": task_id, "input": {"text": goal}})
        return task_id

    def _end(self, run_id: UUID, result: dict[str, Any]) -> None:
        with self._lock:
            task_id = self._tasks.pop(run_id, None) if self._root.get(run_id) == run_id else None
            if task_id is not None:
                self._root = {r: t for r, t in self._root.items() if t != run_id}
        if task_id is not None:
            self.hs.record({"type": "task_end", "task_id": task_id, "result": result})

    def _finished(self, run_id: UUID) -> None:
        """A run inside a task ended; forget it (the task's own run ends in ``_end``)."""
        with self._lock:
            if self._root.get(run_id) != run_id:
                self._root.pop(run_id, None)

    # -- chains -------------------------------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._task_of(run_id, parent_run_id, inputs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, {"status": "succeeded"})
        self._finished(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(
            run_id,
            {"status": "failed", "error_type": type(error).__name__, "error_message": str(error)},
        )
        self._finished(run_id)

    # -- chat models --------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._task_of(run_id, parent_run_id, messages[0] if messages else None)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._task_of(run_id, parent_run_id, prompts[0] if prompts else None)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            root = self._root.get(run_id)
            task_id = self._tasks.get(root) if root is not None else None
        if task_id is not None:
            self._decision(task_id, response)
        self._end(run_id, {"status": "succeeded"})
        self._finished(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(
            run_id,
            {"status": "failed", "error_type": type(error).__name__, "error_message": str(error)},
        )
        self._finished(run_id)

    def _decision(self, task_id: str, response: LLMResult) -> None:
        generation = (
            response.generations[0][0] if response.generations and response.generations[0] else None
        )
        if generation is None:
            return
        calls: list[str] = []
        text = generation.text
        model = None
        if isinstance(generation, ChatGeneration):
            message = generation.message
            calls = [c["name"] for c in getattr(message, "tool_calls", None) or ()]
            text = message.text if isinstance(message.text, str) else text
            meta = getattr(message, "response_metadata", None) or {}
            model = meta.get("model_name") or meta.get("model")
        decision: dict[str, Any] = {
            "chosen_action": calls[0] if calls else "reply",
            "alternatives": [],
            "tool_calls": calls,
        }
        if text:
            decision["reasoning"] = text
        event: dict[str, Any] = {"type": "llm_decision", "task_id": task_id, "decision": decision}
        if model:
            event["agent_state"] = {"model": model}
        self.hs.record(event)

    # -- tools --------------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._task_of(run_id, parent_run_id, None)
        name = (serialized or {}).get("name") or kwargs.get("name") or "unknown_tool"
        args: Any = inputs if inputs is not None else input_str
        if not isinstance(args, dict):
            from hindsight_loop.ingest.wire import parse_args

            args = parse_args(args)
        with self._lock:
            self._tools[run_id] = (str(name), args, time.perf_counter())

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        from hindsight_loop.ingest import tool_error

        content = output.content if isinstance(output, ToolMessage) else output
        if not isinstance(content, str | int | float | bool | dict | list | type(None)):
            content = str(content)
        result: dict[str, Any] = {"status": "succeeded", "output": content}
        found = tool_error(content)
        if isinstance(output, ToolMessage) and output.status == "error":
            found = found or ("ToolError", str(content))
        if found:
            result.update(status="failed", error_type=found[0], error_message=found[1])
        self._tool_done(run_id, result)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(
            run_id,
            {"status": "failed", "error_type": type(error).__name__, "error_message": str(error)},
        )

    def _tool_done(self, run_id: UUID, result: dict[str, Any]) -> None:
        with self._lock:
            started = self._tools.pop(run_id, None)
            root = self._root.get(run_id)
            task_id = self._tasks.get(root) if root is not None else None
        if started is not None and task_id is not None:
            name, args, t0 = started
            if name not in self.hs.skip_tools:
                result["latency_ms"] = round((time.perf_counter() - t0) * 1000, 3)
                self.hs.record(
                    {
                        "type": "action_executed",
                        "task_id": task_id,
                        "input": {"tool": name, "args": args},
                        "result": result,
                    }
                )
        self._end(run_id, {"status": result["status"]})
        self._finished(run_id)


def _last_human(messages: Sequence[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, BaseMessage) and message.type == "human":
            return message.text if isinstance(message.text, str) else str(message.content)
        if isinstance(message, tuple) and len(message) == 2 and message[0] in ("human", "user"):
            return str(message[1])
        if isinstance(message, dict) and message.get("role") in ("human", "user"):
            return str(message.get("content") or "")
    return ""


def _goal(inputs: Any) -> str:
    """The request a run starts from: the last human message, else the input text."""
    if isinstance(inputs, dict):
        for key in ("messages", "input", "question", "query"):
            if key in inputs:
                return _goal(inputs[key])
        return ""
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, BaseMessage):
        return _last_human([inputs])
    if isinstance(inputs, Sequence):
        return _last_human(inputs)
    return ""


__all__ = ["HindsightCallbackHandler"]
