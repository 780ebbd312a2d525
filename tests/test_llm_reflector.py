"""LLMReflector with the in-process fakes: answers become lessons, failures become records."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from hindsight_loop.llm import Completion, LLMError, LLMRequest, estimate_tokens
from hindsight_loop.llm.reflector import LLMReflector, RetryPolicy
from hindsight_loop.reflect import Reflector
from hindsight_loop.replay import LOCAL_WINDOW_AFTER, local_window
from hindsight_loop.testing.llm import FunctionLLM, ScriptedLLM, sample_chronicle

FULL = {
    "task_goal": "Clean sales_2024.csv and write it back.",
    "execution_path": "read_csv failed twice on utf-8, detect_encoding found gbk, then it worked.",
    "effective_steps": ["#5: detect_encoding found gbk"],
    "ineffective_steps": ["#2, #3: read_csv with utf-8"],
    "key_decisions": ["#4: switching to detect_encoding"],
    "improvements": ["Detect the encoding first"],
    "lesson": {
        "advice": "You should call detect_encoding before read_csv on files from the ERP export.",
        "root_cause": "read_csv assumed utf-8 for a gbk-encoded file.",
        "suggestions": [
            "Call detect_encoding first",
            "Pass the encoding to read_csv",
            "Do not retry the same encoding",
            "Log the detected encoding",
            "Keep a per-source default",
            "Sixth one",
        ],
        "general_rule": "Detect an input file's encoding before parsing it.",
        "tools": ["read_csv", "detect_encoding", "imaginary_tool"],
        "error_type": "EncodingError",
        "keywords": ["encoding", "gbk", "csv"],
        "when": {"tool": "read_csv", "error_type": "EncodingError", "step": "…"},
        "prefer": {"tool": "read_csv", "input": {"encoding": "gbk"}},
        "avoid": {"tool": "read_csv", "args": {"encoding": "utf-8"}},
    },
}
LOCAL = {
    "root_cause": "The same utf-8 read was repeated after it failed.",
    "suggestions": [
        "Change an argument after a failure",
        "Detect the encoding",
        "Stop after two failures",
    ],
    "general_rule": "Never repeat a failed call unchanged.",
    "advice": "You should change the encoding instead of retrying read_csv unchanged.",
}
FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02, max_retry_after=1.0)
NOW = datetime(2024, 11, 20, 14, 32, tzinfo=UTC)


def reflector(llm: Any, **kwargs: Any) -> LLMReflector:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("clock", lambda: NOW)
    return LLMReflector(llm, **kwargs)


def test_it_implements_the_reflector_protocol() -> None:
    assert isinstance(reflector(ScriptedLLM()), Reflector)


def test_a_good_full_review_becomes_one_lesson_draft() -> None:
    llm = ScriptedLLM([FULL], model="strong")
    r = reflector(llm).reflect(sample_chronicle(status="failed"))
    assert r.status == "ok", r.error
    assert r.kind == "full" and r.task_id == "tsk_sample"
    assert r.reflector == "scripted:strong" and r.model == "strong"
    assert r.tokens_in and r.tokens_out and r.latency_ms is not None
    assert r.raw_text is None and r.error is None
    assert r.parsed is not None and r.parsed["task_goal"] == FULL["task_goal"]
    (draft,) = r.lessons
    lesson = FULL["lesson"]
    assert draft.advice == lesson["advice"]
    assert draft.root_cause == lesson["root_cause"]
    assert draft.general_rule == lesson["general_rule"]
    assert draft.suggestions == lesson["suggestions"][:5]
    assert draft.kind == "full_review" and draft.task_type == "csv_cleaning"
    assert draft.source_task_ids == ["tsk_sample"] and draft.language == "en"
    assert draft.features.tools == ["read_csv", "detect_encoding"]  # the imaginary tool is dropped
    assert draft.features.error_type == "EncodingError"
    assert draft.features.step == "parse"
    assert draft.features.keywords == ["encoding", "gbk", "csv"]
    assert draft.structured is not None
    assert draft.structured.when == {"tool": "read_csv", "error_type": "EncodingError"}
    assert draft.structured.prefer == {"tool": "read_csv", "args": {"encoding": "gbk"}}
    assert draft.structured.avoid == {"tool": "read_csv", "args": {"encoding": "utf-8"}}


def test_the_request_asks_for_json_at_temperature_0_2_with_the_date_and_the_run() -> None:
    llm = ScriptedLLM([FULL])
    reflector(llm).reflect(sample_chronicle())
    request = llm.last
    assert request.json_mode is True and request.temperature == 0.2
    assert request.system is not None and "Today is 2024-11-20." in request.system
    assert "Write every text value in English." in request.system
    assert "Goal: Clean sales_2024.csv" in request.prompt
    assert "#2 action_executed read_csv [parse] failed EncodingError" in request.prompt
    assert '"lesson": {' in request.prompt


def test_local_reviews_use_the_cheaper_model_and_only_the_window() -> None:
    llm = ScriptedLLM([LOCAL, FULL], model="strong")
    r = reflector(llm, local_model="cheap").reflect(sample_chronicle(), kind="local", window=(1, 4))
    assert r.status == "ok", r.error
    assert llm.last.model == "cheap" and r.model == "cheap" and r.reflector == "scripted:cheap"
    assert r.kind == "local" and r.trigger == "consecutive_failures"
    assert "two tool failures in a row" in llm.last.prompt
    assert "Steps 1 to 4" in llm.last.prompt
    assert "#3 action_executed" in llm.last.prompt and "#6 action_executed" not in llm.last.prompt
    (draft,) = r.lessons
    assert draft.kind == "local_review"
    assert draft.advice == LOCAL["advice"] and draft.root_cause == LOCAL["root_cause"]
    assert draft.general_rule == LOCAL["general_rule"] and draft.suggestions == LOCAL["suggestions"]
    assert draft.features.tools == ["read_csv"] and draft.features.error_type == "EncodingError"

    reflector(llm, local_model="cheap").reflect(sample_chronicle())
    assert llm.last.model == "strong"


def test_a_local_review_without_a_window_centres_on_the_last_anomaly() -> None:
    llm = ScriptedLLM([LOCAL])
    reflector(llm).reflect(sample_chronicle(padding=30), kind="local")
    assert "Steps 0 to 6" in llm.last.prompt
    assert "inspect_row [clean]" not in llm.last.prompt


def test_a_chinese_run_asks_for_and_gets_a_chinese_lesson() -> None:
    answer = {
        "根本原因": "read_csv 默认使用 utf-8，而文件是 gbk 编码。",
        "建议": ["先调用 detect_encoding", "把检测到的编码传给 read_csv", "失败后不要原样重试"],
        "通用规则": "解析文件之前先确定它的编码。",
        "忠告": "你应该在调用 read_csv 之前先用 detect_encoding 检测编码。",
    }
    llm = ScriptedLLM([answer])
    r = reflector(llm).reflect(sample_chronicle(language="zh"), kind="local")
    assert "所有文本值都用中文书写" in (llm.last.system or "")
    assert r.status == "ok", r.error
    (draft,) = r.lessons
    assert draft.language == "zh"
    assert draft.advice == answer["忠告"] and draft.root_cause == answer["根本原因"]
    assert draft.suggestions == answer["建议"] and draft.general_rule == answer["通用规则"]


def test_a_configured_language_overrides_the_run() -> None:
    llm = ScriptedLLM([LOCAL])
    r = reflector(llm, language="zh").reflect(sample_chronicle(), kind="local")
    assert "所有文本值都用中文书写" in (llm.last.system or "")
    assert r.lessons[0].language == "zh"


def test_near_miss_keys_and_a_flattened_lesson_are_accepted() -> None:
    answer = {
        "taskGoal": "clean",
        "Root Cause": "utf-8 assumed",
        "general rule": "Detect encodings first.",
        "Advice": "You detect the encoding first.",
        "Suggestions": "1. detect\n2. pass encoding\n3. stop repeating",
    }
    r = reflector(ScriptedLLM([answer])).reflect(sample_chronicle())
    assert r.status == "ok", r.error
    (draft,) = r.lessons
    assert draft.root_cause == "utf-8 assumed" and draft.general_rule == "Detect encodings first."
    assert draft.suggestions == ["detect", "pass encoding", "stop repeating"]


def test_without_advice_the_general_rule_is_the_advice() -> None:
    answer = {"root_cause": "x", "general_rule": "Detect encodings first.", "suggestions": ["a"]}
    r = reflector(ScriptedLLM([answer])).reflect(sample_chronicle(), kind="local")
    assert r.status == "ok" and r.lessons[0].advice == "Detect encodings first."


def test_prose_is_asked_again_then_kept_as_suspect_with_no_lesson() -> None:
    prose = "The agent should have checked the encoding."
    llm = ScriptedLLM([prose, prose + " Really."])
    r = reflector(llm).reflect(sample_chronicle())
    assert len(llm.requests) == 2  # one parse retry
    assert r.status == "suspect" and r.lessons == []
    assert r.raw_text == prose + " Really."
    assert "not the JSON" in (r.error or "")
    assert r.tokens_in == sum(estimate_tokens((q.system or "") + q.prompt) for q in llm.requests)


def test_prose_then_json_is_ok() -> None:
    llm = ScriptedLLM(["I think the encoding was wrong.", FULL])
    r = reflector(llm).reflect(sample_chronicle())
    assert r.status == "ok" and len(r.lessons) == 1 and r.raw_text is None


def test_an_answer_with_no_lesson_in_it_is_suspect() -> None:
    llm = ScriptedLLM([{"root_cause": "", "mood": "ok"}, {"task_goal": "g"}])
    r = reflector(llm).reflect(sample_chronicle())
    assert r.status == "suspect" and r.lessons == [] and r.raw_text == '{"task_goal": "g"}'


def test_a_truncated_answer_is_suspect_and_not_asked_again() -> None:
    text = json.dumps(FULL)[:300]
    cut = Completion(text=text, model="m", tokens_out=80, finish_reason="length")
    llm = ScriptedLLM([cut])
    r = reflector(llm).reflect(sample_chronicle())
    assert len(llm.requests) == 1
    assert r.status == "suspect" and r.lessons == [] and r.raw_text == text
    assert "HINDSIGHT_LLM_MAX_TOKENS" in (r.error or "")


def test_retryable_errors_are_retried_with_backoff_and_retry_after() -> None:
    slept: list[float] = []
    llm = ScriptedLLM(
        [
            LLMError("HTTP 429", retryable=True, retry_after=0.5),
            LLMError("HTTP 503", retryable=True),
            FULL,
        ]
    )
    policy = RetryPolicy(attempts=3, backoff=1.0, max_retry_after=10)
    r = reflector(llm, retry=policy, sleep=slept.append).reflect(sample_chronicle())
    assert r.status == "ok"
    assert slept[0] == 0.5  # Retry-After is obeyed as given
    assert 1.6 <= slept[1] <= 2.0  # second backoff, doubled, with jitter
    assert len(llm.requests) == 3


def test_empty_answers_are_retried_then_the_reflection_fails() -> None:
    llm = ScriptedLLM(["", "  ", ""])
    r = reflector(llm).reflect(sample_chronicle())
    assert r.status == "failed" and r.lessons == []
    assert "empty answer" in (r.error or "") and "3 attempts" in (r.error or "")


def test_a_retry_after_beyond_the_cap_gives_up_at_once() -> None:
    slept: list[float] = []
    llm = ScriptedLLM([LLMError("HTTP 429", retryable=True, retry_after=3600), FULL])
    r = reflector(llm, sleep=slept.append).reflect(sample_chronicle())
    assert r.status == "failed" and slept == [] and len(llm.requests) == 1
    assert "try again later" in (r.error or "")


def test_errors_that_retrying_cannot_fix_fail_at_once() -> None:
    llm = ScriptedLLM([LLMError("HTTP 401 bad key", status=401), FULL])
    r = reflector(llm).reflect(sample_chronicle())
    assert r.status == "failed" and "401" in (r.error or "") and len(llm.requests) == 1


def test_a_client_that_raises_anything_never_breaks_reflect() -> None:
    def explode(request: LLMRequest) -> Any:
        raise RuntimeError("boom")

    r = reflector(FunctionLLM(explode)).reflect(sample_chronicle())
    assert r.status == "failed" and "RuntimeError: boom" in (r.error or "")


def test_a_bug_inside_the_reflector_becomes_a_failed_reflection() -> None:
    chronicle = sample_chronicle()
    chronicle.task.tools = None  # type: ignore[assignment]  # bad data from somewhere
    r = reflector(ScriptedLLM([FULL])).reflect(chronicle)
    assert r.status == "failed" and (r.error or "").startswith("reflector error: TypeError")
    assert r.latency_ms is not None


def test_an_exhausted_script_is_a_failed_reflection() -> None:
    r = reflector(ScriptedLLM([])).reflect(sample_chronicle())
    assert r.status == "failed" and "script exhausted" in (r.error or "")


def test_a_function_llm_sees_each_request() -> None:
    def answer(request: LLMRequest) -> Any:
        return LOCAL if "Steps" in request.prompt else FULL

    llm = FunctionLLM(answer)
    full = reflector(llm).reflect(sample_chronicle())
    local = reflector(llm).reflect(sample_chronicle(), kind="local")
    assert full.lessons[0].advice == FULL["lesson"]["advice"]
    assert local.lessons[0].advice == LOCAL["advice"]
    assert [r.json_mode for r in llm.requests] == [True, True]


def test_the_chronicle_in_the_prompt_is_bounded_by_the_budget() -> None:
    llm = ScriptedLLM([FULL])
    reflector(llm, budget_tokens=600).reflect(sample_chronicle(padding=500))
    prompt = llm.last.prompt
    template_overhead = 700
    assert estimate_tokens(prompt) <= 600 + template_overhead
    assert "steps omitted" in prompt and "consecutive_failures" in prompt


def test_reflector_owning_its_client_closes_it() -> None:
    llm = ScriptedLLM([])
    with LLMReflector(llm, owns_llm=True):
        pass
    assert llm.closed
    other = ScriptedLLM([])
    LLMReflector(other).close()
    assert not other.closed


@pytest.mark.parametrize("kind", ["full", "local"])
def test_a_run_that_went_well_still_gets_reviewed(kind: str) -> None:
    llm = ScriptedLLM([FULL if kind == "full" else LOCAL])
    chronicle = sample_chronicle()
    chronicle.key_nodes = []
    r = reflector(llm).reflect(chronicle, kind=kind)  # type: ignore[arg-type]
    assert r.status == "ok"
    assert "Key nodes: none flagged" in llm.last.prompt


def test_closing_the_reflector_cuts_a_backoff_short() -> None:
    llm = ScriptedLLM([LLMError("HTTP 503", retryable=True), FULL])
    slow = LLMReflector(llm, retry=RetryPolicy(attempts=3, backoff=30, max_backoff=30))
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(slow.reflect(sample_chronicle())))
    worker.start()
    while not llm.requests:
        time.sleep(0.005)
    started = time.monotonic()
    slow.close()
    worker.join(timeout=5)
    assert time.monotonic() - started < 2
    (r,) = results
    assert r.status == "failed" and "closed" in (r.error or "")
    assert len(llm.requests) == 1
    assert slow.reflect(sample_chronicle()).status == "failed"  # closed for good


def test_a_window_past_the_end_of_the_run_is_cut_to_it() -> None:
    # A live trigger asks for local_window() steps after the anomaly, which may not exist yet.
    llm = ScriptedLLM([LOCAL])
    chronicle = sample_chronicle()
    last = chronicle.steps[-1].index
    first, end = local_window([2, 3])
    reflector(llm).reflect(chronicle, kind="local", window=(first, last + 5))
    assert f"Steps {first} to {last}" in llm.last.prompt
    assert (first, end) == (0, 3 + LOCAL_WINDOW_AFTER)
