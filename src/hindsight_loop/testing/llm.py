"""Fake LLMs without a network, for testing agents and reflection offline.

Both implement the ``hindsight_loop.llm.LLM`` protocol and record every request in ``.requests``:

- ``ScriptedLLM`` answers from a list: a dict is sent back as JSON text, a string as is, a
  ``Completion`` as given, an exception is raised (``LLMError(..., retryable=True)`` plays a 429).
- ``FunctionLLM`` answers with a function of the request, for answers that depend on the prompt.

Example::

    llm = ScriptedLLM([{"root_cause": "…", "advice": "You …"}])
    reflection = LLMReflector(llm).reflect(chronicle, kind="local")
    assert "Steps" in llm.requests[0].prompt
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from hindsight_loop.llm import Completion, LLMError, LLMRequest, estimate_tokens
from hindsight_loop.models import Chronicle, KeyNode, Step, Task

Answer = str | dict[str, Any] | list[Any] | Completion | BaseException


class _FakeLLM:
    provider = "fake"

    def __init__(self, model: str) -> None:
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.requests: list[LLMRequest] = []
        self.closed = False
        self._lock = threading.Lock()

    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        model: str | None = None,
        json_mode: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        request = LLMRequest(
            prompt=prompt,
            system=system,
            model=model or self.model,
            json_mode=json_mode,
            temperature=temperature,
            max_tokens=max_tokens,
        )
        with self._lock:
            self.requests.append(request)
        started = time.perf_counter()
        result = self._answer(request)
        if isinstance(result, BaseException):
            raise result
        if isinstance(result, Completion):
            return result
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return Completion(
            text=text,
            model=request.model or self.model,
            tokens_in=estimate_tokens((system or "") + prompt),
            tokens_out=estimate_tokens(text),
            latency_ms=(time.perf_counter() - started) * 1000,
            finish_reason="stop",
        )

    def _answer(self, request: LLMRequest) -> Answer:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True

    @property
    def last(self) -> LLMRequest:
        """The most recent request."""
        if not self.requests:
            raise AssertionError(f"{self.name} was never asked anything")
        return self.requests[-1]


class ScriptedLLM(_FakeLLM):
    """Answers from a script, in order; records what it was asked."""

    provider = "scripted"

    def __init__(self, answers: Iterable[Answer] = (), *, model: str = "scripted") -> None:
        """Prepare.

        Args:
            answers: One per request: a dict/list (sent as JSON text), a string, a
                ``Completion``, or an exception to raise.
            model: The default model name.
        """
        super().__init__(model)
        self._answers: deque[Answer] = deque(answers)

    def add(self, *answers: Answer) -> None:
        """Append answers to the script."""
        with self._lock:
            self._answers.extend(answers)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._answers)

    def _answer(self, request: LLMRequest) -> Answer:
        with self._lock:
            if self._answers:
                return self._answers.popleft()
        return LLMError(f"{self.name}: script exhausted after {len(self.requests) - 1} answers")


class FunctionLLM(_FakeLLM):
    """Answers with ``function(request)``; records what it was asked."""

    provider = "function"

    def __init__(
        self, function: Callable[[LLMRequest], Answer], *, model: str = "function"
    ) -> None:
        """Prepare.

        Args:
            function: Gets the ``LLMRequest``; returns what ``ScriptedLLM`` accepts as an answer
                (or raises).
            model: The default model name.
        """
        super().__init__(model)
        self.function = function

    def _answer(self, request: LLMRequest) -> Answer:
        return self.function(request)


# -- a run to reflect on ----------------------------------------------------------------------

_TEXT = {
    "en": {
        "goal": "Clean sales_2024.csv and write the cleaned file",
        "ask": "Please clean /data/raw/sales_2024.csv",
        "fail": "codec can't decode byte 0xed",
        "decide": "switch to detecting the encoding",
        "detected": "encoding is gbk",
        "parsed": "parsed 1204 rows",
        "wrote": "wrote 1198 rows",
        "pad": "checked a row",
        "first": "read_csv failed: EncodingError",
        "twice": "read_csv failed twice in a row",
        "recovered": "read_csv worked with gbk",
    },
    "zh": {
        "goal": "清洗 sales_2024.csv 并写出清洗后的文件",
        "ask": "请帮我清洗 /data/raw/sales_2024.csv",
        "fail": "编码错误：无法解码字节 0xed",
        "decide": "改为先检测文件编码",
        "detected": "检测到编码为 gbk",
        "parsed": "解析了 1204 行",
        "wrote": "写出了 1198 行",
        "pad": "检查了一行数据",
        "first": "read_csv 失败：编码错误",
        "twice": "read_csv 连续失败两次",
        "recovered": "用 gbk 编码读取成功",
    },
}


def sample_chronicle(
    *,
    language: str = "en",
    padding: int = 0,
    status: str = "succeeded",
    task_id: str = "tsk_sample",
) -> Chronicle:
    """A replayed CSV-cleaning run in which ``read_csv`` failed twice on the encoding, then worked.

    For testing reflectors and prompts without recording anything. ``padding`` adds that many
    ordinary steps in the middle (to test token budgets); ``language`` is ``en`` or ``zh``.
    """
    t = _TEXT[language]
    path = "/data/raw/sales_2024.csv"
    rows: list[dict[str, Any]] = [
        {"type": "task_start", "summary": t["goal"]},
        {"type": "user_input", "summary": t["ask"], "input": {"text": t["ask"]}},
    ]
    for _ in range(2):
        rows.append(
            {
                "type": "action_executed",
                "action": "read_csv",
                "status": "failed",
                "step": "parse",
                "error_type": "EncodingError",
                "summary": t["fail"],
                "input": {"tool": "read_csv", "args": {"path": path, "encoding": "utf-8"}},
            }
        )
    rows.append({"type": "llm_decision", "action": "detect_encoding", "summary": t["decide"]})
    rows.append(
        {
            "type": "action_executed",
            "action": "detect_encoding",
            "status": "succeeded",
            "step": "parse",
            "summary": t["detected"],
            "input": {"tool": "detect_encoding", "args": {"path": path}},
            "output": "gbk",
        }
    )
    rows.append(
        {
            "type": "action_executed",
            "action": "read_csv",
            "status": "succeeded",
            "step": "parse",
            "summary": t["parsed"],
            "input": {"tool": "read_csv", "args": {"path": path, "encoding": "gbk"}},
        }
    )
    for i in range(padding):
        rows.append(
            {
                "type": "action_executed",
                "action": "inspect_row",
                "status": "succeeded",
                "step": "clean",
                "summary": f"{t['pad']} {i}",
                "input": {"tool": "inspect_row", "args": {"row": i, "columns": ["date", "amount"]}},
                "output": {"ok": True, "row": i},
            }
        )
    rows.append(
        {
            "type": "action_executed",
            "action": "write_csv",
            "status": status,
            "step": "write",
            "summary": t["wrote"],
            "input": {"tool": "write_csv", "args": {"path": "/data/clean/sales_2024.csv"}},
        }
    )
    rows.append({"type": "task_end", "status": status, "summary": status})
    steps = [Step(index=i, event_id=f"evt_{task_id}_{i}", **row) for i, row in enumerate(rows)]
    recovered = 6
    key_nodes = [
        KeyNode(
            kind="first_failure",
            index=2,
            event_id=steps[2].event_id,
            summary=t["first"],
            action="read_csv",
            error_type="EncodingError",
        ),
        KeyNode(
            kind="consecutive_failures",
            index=3,
            event_id=steps[3].event_id,
            summary=t["twice"],
            action="read_csv",
            error_type="EncodingError",
            related=[2, 3],
        ),
        KeyNode(
            kind="recovery",
            index=recovered,
            event_id=steps[recovered].event_id,
            summary=t["recovered"],
            action="read_csv",
            related=[2, 3],
        ),
    ]
    task = Task(
        task_id=task_id,
        task_type="csv_cleaning",
        goal=t["goal"],
        tools=["read_csv", "detect_encoding", "inspect_row", "write_csv"],
        status=status,  # type: ignore[arg-type]
        outcome={"status": status},
        event_count=len(steps),
    )
    return Chronicle(task=task, steps=steps, key_nodes=key_nodes, event_count=len(steps))


__all__ = ["FunctionLLM", "ScriptedLLM", "sample_chronicle"]
