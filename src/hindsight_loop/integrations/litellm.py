"""LiteLLM: a callback logger that records an agent's completions and the tool calls they led to.

LiteLLM is one call to any provider, not an agent runtime: the loop (call the model, run the
tools it asked for, send the results back) is the agent's own code. So the run is the agent's
``with hs.task(...)`` block, and the logger records what LiteLLM sees of it:

- each completion's answer is an ``llm_decision`` (its tool calls, or ``reply``; the model);
  a completion that raised is an ``llm_decision`` with a failed result (its error type and
  message);
- each tool result the agent sends back (a ``tool`` message answering an assistant tool call)
  is an ``action_executed`` with the call's name and arguments, the output, and the error type
  and message when the output reads as an error by the import's rule (``ingest.tool_error``).
  Its ``latency_ms`` is the time from the task's last answer (the one that asked for the call)
  to the request that sent its result back: the tool's run plus the agent's own work between.

A tool's result is seen when the agent sends it back: results of the last turn, which no
completion carries, are not recorded. Calls made outside a task are not recorded either (there
is no run to put them in); ``metadata={"hindsight_task_id": ...}`` names a task explicitly.

LiteLLM delivers answers to its loggers after the call returned, on its own threads (or its
event loop, for async calls): ``logger.wait()`` (``await logger.await_recorded()``) before the
task block ends makes sure the review sees the last decisions.

Recall and injection are the task's: ``task.lessons`` were recalled when it started, and
``hs.inject(messages, task.lessons)`` places them; they are credited with its outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from hindsight_loop.integrations import missing

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("litellm", "litellm") from exc

if TYPE_CHECKING:
    from datetime import datetime

    from hindsight_loop.hindsight import Hindsight

log = logging.getLogger("hindsight_loop")

#: Calls in flight and tasks whose tool results were seen, remembered at most this many each
#: (a call whose handler never runs, a task that ended, must not grow memory).
_REMEMBER = 4096


class HindsightLiteLLM(CustomLogger):
    """Records LiteLLM completions made inside a ``hs.task`` block into that task.

    Register it once: ``litellm.callbacks = [HindsightLiteLLM(hs)]``. Sync and async
    completions are both recorded; streaming completions are recorded when the stream ends.
    Nothing here ever raises into the agent's call.
    """

    def __init__(self, hs: Hindsight) -> None:
        super().__init__()
        self.hs = hs
        self._lock = threading.Condition()
        self._calls: OrderedDict[str, str] = OrderedDict()  # litellm call id -> task id
        self._seen: OrderedDict[str, set[str]] = OrderedDict()  # task id -> tool call ids
        self._answered: OrderedDict[str, float] = OrderedDict()  # task id -> last answer's time

    # -- before the request: which task, and the tool results the agent sends back --------------
    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        try:
            task_id = self._task_id(kwargs)
            if task_id is None:
                return
            call_id = kwargs.get("litellm_call_id")
            with self._lock:
                if call_id:
                    _remember(self._calls, str(call_id), task_id)
            self._tool_results(task_id, messages or kwargs.get("messages") or [])
        except Exception:  # noqa: BLE001 - recording must never break the agent's call
            log.exception("hindsight: recording a LiteLLM request failed")

    async def async_log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        self.log_pre_api_call(model, messages, kwargs)

    def _task_id(self, kwargs: dict[str, Any]) -> str | None:
        """The task of this call: named in its metadata, else the ``hs.task`` block it runs in.

        Read on the agent's thread (the success handlers run on LiteLLM's own threads and tasks,
        where the block's context is not always there).
        """
        from hindsight_loop.task import current_task

        params = kwargs.get("litellm_params") or {}
        metadata = params.get("metadata") or kwargs.get("metadata") or {}
        named = metadata.get("hindsight_task_id") if isinstance(metadata, dict) else None
        if isinstance(named, str) and named:
            return named
        task = current_task()
        if task is not None and task.hs is self.hs:
            return task.task_id
        return None

    def _tool_results(self, task_id: str, messages: Any) -> None:
        from hindsight_loop.ingest import tool_error
        from hindsight_loop.ingest.wire import parse_args

        asked: dict[str, tuple[str, Any]] = {}
        results: list[tuple[str, Any]] = []
        for message in messages:
            role = _get(message, "role")
            if role == "assistant":
                for call in _get(message, "tool_calls") or ():
                    function = _get(call, "function") or {}
                    call_id = _get(call, "id")
                    if call_id:
                        asked[str(call_id)] = (
                            str(_get(function, "name") or "unknown_tool"),
                            parse_args(_get(function, "arguments")),
                        )
            elif role == "tool" and _get(message, "tool_call_id"):
                results.append((str(_get(message, "tool_call_id")), _get(message, "content")))
        if not results:
            return
        now_ns = time.time_ns()
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(task_id)
            if seen is None:
                seen = set()
                _remember(self._seen, task_id, seen)
            fresh = [(cid, out) for cid, out in results if cid not in seen and cid in asked]
            seen.update(cid for cid, _ in fresh)
            answered = self._answered.get(task_id)
        for call_id, content in fresh:
            name, args = asked[call_id]
            if name in self.hs.skip_tools:
                continue
            output = _text(content)
            result: dict[str, Any] = {"status": "succeeded", "output": output}
            found = tool_error(output)
            if found:
                result.update(status="failed", error_type=found[0], error_message=found[1])
            if answered is not None:
                result["latency_ms"] = round((now - answered) * 1000, 3)
            self.hs.record(
                {
                    "type": "action_executed",
                    "task_id": task_id,
                    "timestamp": now_ns,
                    "input": {"tool": name, "args": args, "call_id": call_id},
                    "result": result,
                }
            )

    # -- after the request: the model's decision ------------------------------------------------
    def log_post_api_call(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        # On the agent's thread as the answer comes back: the tool calls it asks for start now
        # (the decision itself is recorded by the success handler, on LiteLLM's thread).
        call_id = kwargs.get("litellm_call_id")
        with self._lock:
            task_id = self._calls.get(str(call_id)) if call_id else None
            if task_id is not None:
                _remember(self._answered, task_id, time.monotonic())

    def log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            task_id = self._task_of_call(kwargs)
            if task_id is not None:
                self._decision(task_id, kwargs, response_obj, end_time)
        except Exception:  # noqa: BLE001
            log.exception("hindsight: recording a LiteLLM answer failed")

    def log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            task_id = self._task_of_call(kwargs)
            if task_id is None:
                return
            error = kwargs.get("exception")
            self.hs.record(
                {
                    "type": "llm_decision",
                    "task_id": task_id,
                    "timestamp": _ns(end_time),
                    "decision": {"chosen_action": "error", "alternatives": [], "tool_calls": []},
                    "agent_state": {"model": str(kwargs.get("model") or "")},
                    "result": {
                        "status": "failed",
                        "error_type": type(error).__name__ if error is not None else "LLMError",
                        "error_message": str(error) if error is not None else "",
                    },
                }
            )
        except Exception:  # noqa: BLE001
            log.exception("hindsight: recording a failed LiteLLM call failed")

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.log_success_event(kwargs, response_obj, start_time, end_time)

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.log_failure_event(kwargs, response_obj, start_time, end_time)

    def _task_of_call(self, kwargs: dict[str, Any]) -> str | None:
        call_id = kwargs.get("litellm_call_id")
        with self._lock:
            task_id = self._calls.pop(str(call_id), None) if call_id else None
            self._lock.notify_all()
        return task_id

    # -- waiting for LiteLLM's handlers ---------------------------------------------------------
    def wait(self, timeout: float = 10.0) -> bool:
        """Wait until every answer LiteLLM has returned so far is recorded; True when all are.

        LiteLLM hands answers to its loggers on its own threads, after the call returned: call
        this before a task block ends so the task's review sees its last decisions. In async
        code, ``await logger.await_recorded()`` instead (the handlers run on the event loop).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.05))
        return True

    async def await_recorded(self, timeout: float = 10.0) -> bool:
        """``wait`` for async code: lets LiteLLM's logging worker run its queued handlers."""
        import asyncio

        try:
            from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

            await asyncio.wait_for(GLOBAL_LOGGING_WORKER.flush(), timeout)
        except Exception:  # noqa: BLE001 - an older or newer LiteLLM without the worker
            log.debug("hindsight: LiteLLM's logging worker could not be flushed", exc_info=True)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._calls:
                    return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)

    def _decision(self, task_id: str, kwargs: dict[str, Any], response: Any, end: Any) -> None:
        choices = _get(response, "choices") or []
        message = _get(choices[0], "message") if choices else None
        if message is None:
            return
        calls = list(_get(message, "tool_calls") or ())
        names = [str(_get(_get(c, "function") or {}, "name") or "unknown_tool") for c in calls]
        decision: dict[str, Any] = {
            "chosen_action": names[0] if names else "reply",
            "alternatives": [],
            "tool_calls": names,
        }
        text = _get(message, "content")
        if isinstance(text, str) and text:
            decision["reasoning"] = text
        model = _get(response, "model") or kwargs.get("model")
        event: dict[str, Any] = {
            "type": "llm_decision",
            "task_id": task_id,
            "timestamp": _ns(end),
            "decision": decision,
        }
        if model:
            event["agent_state"] = {"model": str(model)}
        self.hs.record(event)


def _get(obj: Any, key: str) -> Any:
    """A field of a message or tool call, whether LiteLLM gives a dict or a model object."""
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _text(content: Any) -> Any:
    """A tool message's content as the agent sent it: text parts joined, anything else as is."""
    if isinstance(content, list):
        parts = [_get(p, "text") for p in content]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
    return content


def _ns(when: datetime | Any) -> int:
    stamp = getattr(when, "timestamp", None)
    return int(stamp() * 1_000_000_000) if callable(stamp) else time.time_ns()


def _remember(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` as the newest entry, dropping the oldest past ``_REMEMBER``."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > _REMEMBER:
        table.popitem(last=False)


__all__ = ["HindsightLiteLLM"]
