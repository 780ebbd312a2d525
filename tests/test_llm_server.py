"""Reflection against a real HTTP server on 127.0.0.1, through the real openai and anthropic clients.

The server (``hindsight_loop.testing.llm_server``) replays scripted answers and faults; nothing in
the clients is patched. Every fault ends in a recorded ``failed`` or ``suspect`` reflection, fast.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hindsight_loop.llm import LLM, LLMError
from hindsight_loop.llm.anthropic import AnthropicLLM
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.llm.reflector import LLMReflector, RetryPolicy
from hindsight_loop.testing.llm import sample_chronicle
from hindsight_loop.testing.llm_server import (
    Item,
    LLMServer,
    RecordedRequest,
    answer,
    broken,
    disconnect,
    empty,
    fenced,
    hang,
    prose,
    rate_limited,
    rejected,
    server_error,
    truncated,
)

LESSON = {
    "advice": "You should call detect_encoding before read_csv and pass the encoding it finds.",
    "root_cause": "read_csv assumed utf-8 while the export is gbk-encoded.",
    "suggestions": [
        "Call detect_encoding before read_csv",
        "Pass the detected encoding to read_csv",
        "Do not repeat a failed read with the same encoding",
    ],
    "general_rule": "Find out an input file's encoding before parsing it.",
    "tools": ["read_csv", "detect_encoding"],
    "error_type": "EncodingError",
    "keywords": ["encoding", "gbk", "csv"],
}
FULL = {
    "task_goal": "Clean sales_2024.csv.",
    "execution_path": "Two utf-8 reads failed, detect_encoding found gbk, then the read worked.",
    "effective_steps": ["#5 detect_encoding"],
    "ineffective_steps": ["#2 and #3 read_csv with utf-8"],
    "key_decisions": ["#4 switch to detecting the encoding"],
    "improvements": ["Detect the encoding first"],
    "lesson": LESSON,
}
TIMEOUT = 0.4
FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02, max_retry_after=1.0)
PROVIDERS = ["openai", "anthropic"]


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


def make_llm(provider: str, server: LLMServer, *, model: str = "strong-1", **kwargs: Any) -> LLM:
    if provider == "openai":
        return OpenAILLM(
            model, base_url=server.openai_base_url, api_key="sk-test", timeout=TIMEOUT, **kwargs
        )
    return AnthropicLLM(
        model, base_url=server.anthropic_base_url, api_key="sk-ant-test", timeout=TIMEOUT, **kwargs
    )


def reflect(provider: str, server: LLMServer, *items: Item, kind: str = "full", **kwargs: Any):
    server.add(*items)
    llm = make_llm(provider, server, **kwargs.pop("llm_kwargs", {}))
    with LLMReflector(llm, retry=kwargs.pop("retry", FAST), owns_llm=True, **kwargs) as reflector:
        return reflector.reflect(sample_chronicle(status="failed"), kind=kind)  # type: ignore[arg-type]


# -- answers that work ---------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_good_answer_becomes_a_lesson_from_the_model_with_usage(
    provider: str, server: LLMServer
) -> None:
    r = reflect(
        provider, server, answer(FULL, tokens_in=812, tokens_out=233, model="strong-1-2025")
    )
    assert r.status == "ok", r.error
    assert r.reflector == f"{provider}:strong-1"
    assert r.model == "strong-1-2025"  # what the server says answered
    assert (r.tokens_in, r.tokens_out) == (812, 233)
    assert r.latency_ms is not None and r.latency_ms > 0
    (draft,) = r.lessons
    assert draft.advice == LESSON["advice"]
    assert draft.root_cause == LESSON["root_cause"]
    assert draft.general_rule == LESSON["general_rule"]
    assert draft.suggestions == LESSON["suggestions"]
    assert draft.features.error_type == "EncodingError"
    assert len(server.requests) == 1


def test_openai_requests_ask_for_json_mode_at_temperature_0_2(server: LLMServer) -> None:
    reflect("openai", server, answer(FULL))
    (req,) = server.requests
    assert req.protocol == "openai" and req.path == "/v1/chat/completions"
    assert req.body["response_format"] == {"type": "json_object"}
    assert req.body["temperature"] == 0.2
    assert req.model == "strong-1"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert [m["role"] for m in req.messages] == ["system", "user"]
    assert "Today is " in req.system
    assert "#2 action_executed read_csv [parse] failed EncodingError" in req.prompt


def test_anthropic_requests_carry_the_json_instruction_in_the_system_prompt(
    server: LLMServer,
) -> None:
    reflect("anthropic", server, answer(FULL))
    (req,) = server.requests
    assert req.protocol == "anthropic" and req.path == "/v1/messages"
    # The 2.x client sends the key as a bearer token; older ones as x-api-key.
    assert "sk-ant-test" in (
        req.headers.get("x-api-key", "") + req.headers.get("authorization", "")
    )
    assert "anthropic-version" in req.headers
    assert "exactly one JSON object" in req.system
    assert req.body["max_tokens"] > 0
    assert req.prefill is None  # prefill is opt-in
    assert "#2 action_executed read_csv" in req.prompt


def test_anthropic_prefill_starts_the_answer_with_a_brace(server: LLMServer) -> None:
    r = reflect("anthropic", server, answer(FULL), llm_kwargs={"prefill": True})
    assert r.status == "ok", r.error
    assert server.requests[0].prefill == "{"
    assert r.lessons[0].advice == LESSON["advice"]


def test_anthropic_prefill_rejected_falls_back_and_is_remembered(server: LLMServer) -> None:
    server.add(rejected(400, "prefill is not supported for this model"), answer(FULL), answer(FULL))
    llm = make_llm("anthropic", server, prefill=True)
    with LLMReflector(llm, retry=FAST, owns_llm=True) as reflector:
        assert reflector.reflect(sample_chronicle()).status == "ok"
        assert reflector.reflect(sample_chronicle()).status == "ok"
    assert [r.prefill for r in server.requests] == ["{", None, None]


def test_openai_json_mode_rejected_falls_back_and_is_remembered(server: LLMServer) -> None:
    server.add(rejected(400, "response_format is not supported"), answer(FULL), answer(FULL))
    llm = make_llm("openai", server)
    with LLMReflector(llm, retry=FAST, owns_llm=True) as reflector:
        assert reflector.reflect(sample_chronicle()).status == "ok"
        assert reflector.reflect(sample_chronicle()).status == "ok"
    assert [r.json_mode for r in server.requests] == [True, False, False]


def test_local_reviews_go_to_the_cheaper_model(server: LLMServer) -> None:
    local = {k: LESSON[k] for k in ("root_cause", "suggestions", "general_rule", "advice")}
    r = reflect("openai", server, answer(local), kind="local", local_model="cheap-1")
    assert r.status == "ok", r.error
    assert server.requests[0].model == "cheap-1" and r.reflector == "openai:cheap-1"
    assert r.lessons[0].kind == "local_review"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_chinese_answer_with_chinese_keys_gives_a_chinese_lesson(
    provider: str, server: LLMServer
) -> None:
    zh = {
        "根本原因": "read_csv 默认用 utf-8 读取，而文件是 gbk 编码。",
        "建议": ["先调用 detect_encoding", "把编码传给 read_csv", "失败后不要原样重试"],
        "通用规则": "解析文件之前先确定它的编码。",
        "忠告": "你应该先用 detect_encoding 检测编码，再调用 read_csv。",
    }
    server.add(fenced(zh))
    with LLMReflector(make_llm(provider, server), retry=FAST, owns_llm=True) as reflector:
        r = reflector.reflect(sample_chronicle(language="zh"), kind="local")
    assert r.status == "ok", r.error
    assert "中文" in server.requests[0].system
    (draft,) = r.lessons
    assert (
        draft.language == "zh" and draft.advice == zh["忠告"] and draft.root_cause == zh["根本原因"]
    )


# -- faults --------------------------------------------------------------------------------------

# (name, script, expected status, requests the server sees, words in the error)
FAULTS: list[tuple[str, list[Item], str, int, str]] = [
    ("fenced", [fenced(FULL)], "ok", 1, ""),
    ("broken", [broken(FULL)], "ok", 1, ""),
    ("prose", [prose(), prose()], "suspect", 2, "not the JSON"),
    ("prose then json", [prose(), answer(FULL)], "ok", 2, ""),
    ("429 then ok", [rate_limited(0.05), answer(FULL)], "ok", 2, ""),
    ("429 always", [rate_limited(0.01)] * 3, "failed", 3, "429"),
    ("429 retry-after too long", [rate_limited(120)], "failed", 1, "try again later"),
    ("500 then ok", [server_error(500), answer(FULL)], "ok", 2, ""),
    ("500 always", [server_error(500)] * 3, "failed", 3, "HTTP 500"),
    ("503 then 529 then ok", [server_error(503), server_error(529), answer(FULL)], "ok", 3, ""),
    ("hang past timeout", [hang(10)] * 3, "failed", 3, "timeout"),
    ("hang then ok", [hang(10), answer(FULL)], "ok", 2, ""),
    ("empty", [empty()] * 3, "failed", 3, "empty answer"),
    ("truncated", [truncated(FULL)], "suspect", 1, "cut at the token limit"),
    ("dropped connection", [disconnect()] * 3, "failed", 3, "cannot reach"),
    ("401", [rejected(401, "invalid api key")], "failed", 1, "401"),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("name", "script", "status", "requests", "words"), FAULTS, ids=[f[0] for f in FAULTS]
)
def test_every_fault_ends_in_a_recorded_reflection_quickly(
    provider: str,
    server: LLMServer,
    name: str,
    script: list[Item],
    status: str,
    requests: int,
    words: str,
) -> None:
    started = time.monotonic()
    r = reflect(provider, server, *script)
    elapsed = time.monotonic() - started
    assert r.status == status, (r.status, r.error)
    assert len(server.requests) == requests
    assert server.remaining == 0
    assert words in (r.error or ""), r.error
    assert r.latency_ms is not None
    if status == "ok":
        assert r.lessons[0].advice == LESSON["advice"] and r.error is None
    else:
        assert r.lessons == []
    if status == "suspect":
        assert r.raw_text  # kept for a human to judge
        assert r.tokens_out is not None
    # Generous bound for slow CI; the point is "bounded", not a benchmark.
    assert elapsed < 10 * TIMEOUT + 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_retry_after_is_respected(provider: str, server: LLMServer) -> None:
    r = reflect(provider, server, rate_limited(0.3), answer(FULL))
    assert r.status == "ok"
    first, second = server.requests
    assert second.received_at - first.received_at >= 0.3


@pytest.mark.parametrize("provider", PROVIDERS)
def test_connection_refused_is_a_failed_reflection(provider: str) -> None:
    with socket.socket() as sock:  # a port that nothing listens on once this block ends
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    llm: LLM = (
        OpenAILLM("m", base_url=base + "/v1", api_key="k", timeout=TIMEOUT)
        if provider == "openai"
        else AnthropicLLM("m", base_url=base, api_key="k", timeout=TIMEOUT)
    )
    with LLMReflector(llm, retry=FAST, owns_llm=True) as reflector:
        r = reflector.reflect(sample_chronicle())
    assert (
        r.status == "failed"
        and "cannot reach" in (r.error or "")
        and "3 attempts" in (r.error or "")
    )


# -- the clients on their own ----------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_client_errors_say_whether_to_retry(provider: str, server: LLMServer) -> None:
    server.add(rate_limited(2.5), rejected(404, "no such model"))
    with make_llm(provider, server) as llm:  # type: ignore[attr-defined]
        with pytest.raises(LLMError) as busy:
            llm.complete("hi")
        assert busy.value.retryable and busy.value.retry_after == 2.5 and busy.value.status == 429
        with pytest.raises(LLMError) as missing:
            llm.complete("hi")
        assert not missing.value.retryable and missing.value.status == 404
        assert "no such model" in str(missing.value)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_completion_reports_text_model_tokens_and_finish(
    provider: str, server: LLMServer
) -> None:
    server.add(answer("hello", tokens_in=7, tokens_out=1), truncated({"a": "b" * 50}))
    with make_llm(provider, server) as llm:  # type: ignore[attr-defined]
        done = llm.complete("hi", system="be brief", model="other-model")
        cut = llm.complete("hi")
    assert (done.text, done.model, done.tokens_in, done.tokens_out) == (
        "hello",
        "other-model",
        7,
        1,
    )
    assert not done.truncated and cut.truncated
    assert server.requests[0].model == "other-model"


# -- the fake server itself ------------------------------------------------------------------------


def test_the_server_answers_500_when_its_script_runs_out(server: LLMServer) -> None:
    with make_llm("openai", server) as llm, pytest.raises(LLMError, match="script exhausted"):  # type: ignore[attr-defined]
        llm.complete("hi")


def test_the_server_can_answer_with_a_function() -> None:
    def route(request: RecordedRequest) -> Item:
        return answer({"model_was": request.model, "protocol": request.protocol})

    with LLMServer(route) as server:
        for provider in PROVIDERS:
            with make_llm(provider, server, model=f"m-{provider}") as llm:  # type: ignore[attr-defined]
                assert f'"model_was": "m-{provider}"' in llm.complete("hi").text
    assert [r.protocol for r in server.requests] == PROVIDERS


def test_closing_the_server_ends_a_hang_at_once() -> None:
    server = LLMServer([hang(60)]).start()
    llm = OpenAILLM("m", base_url=server.openai_base_url, api_key="k", timeout=5)
    import threading

    errors: list[Exception] = []
    call: Callable[[], None] = lambda: _capture(errors, lambda: llm.complete("hi"))  # noqa: E731
    caller = threading.Thread(target=call)
    caller.start()
    while not server.requests:
        time.sleep(0.01)
    started = time.monotonic()
    server.close()
    caller.join()
    llm.close()
    assert time.monotonic() - started < 3
    assert errors and isinstance(errors[0], LLMError)


def _capture(errors: list[Exception], fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:
        errors.append(exc)
