"""LLM configuration by code and environment, the optional extras, and ``hindsight llm``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from hindsight_loop.cli import app
from hindsight_loop.llm import LLMConfig, LLMConfigError, from_env, reflector_from_env
from hindsight_loop.llm.anthropic import AnthropicLLM
from hindsight_loop.llm.judge import CANARIES
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.llm.reflector import LLMReflector
from hindsight_loop.testing.llm_server import (
    LLMServer,
    RecordedRequest,
    answer,
    rejected,
    server_error,
)

ENV_NAMES = (
    "PROVIDER",
    "BASE_URL",
    "MODEL",
    "LOCAL_MODEL",
    "API_KEY",
    "TIMEOUT",
    "TEMPERATURE",
    "LANGUAGE",
    "MAX_TOKENS",
    "PREFILL",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ENV_NAMES:
        monkeypatch.delenv(f"HINDSIGHT_LLM_{name}", raising=False)
    yield


def test_nothing_configured_means_offline() -> None:
    assert LLMConfig.from_env({}) is None
    assert from_env({}) is None
    assert reflector_from_env({}) is None


def test_an_api_key_alone_does_not_turn_the_llm_on() -> None:
    assert LLMConfig.from_env({"OPENAI_API_KEY": "sk-x", "HINDSIGHT_LLM_API_KEY": "sk-y"}) is None


def test_provider_offline_wins_over_other_settings() -> None:
    env = {"HINDSIGHT_LLM_PROVIDER": "offline", "HINDSIGHT_LLM_MODEL": "gpt-4o-mini"}
    assert LLMConfig.from_env(env) is None


def test_every_setting_is_read() -> None:
    config = LLMConfig.from_env(
        {
            "HINDSIGHT_LLM_PROVIDER": "Anthropic",
            "HINDSIGHT_LLM_BASE_URL": "http://gateway:8080",
            "HINDSIGHT_LLM_MODEL": "claude-strong",
            "HINDSIGHT_LLM_LOCAL_MODEL": "claude-cheap",
            "HINDSIGHT_LLM_API_KEY": "sk-ant",
            "HINDSIGHT_LLM_TIMEOUT": "12.5",
            "HINDSIGHT_LLM_TEMPERATURE": "0",
            "HINDSIGHT_LLM_MAX_TOKENS": "900",
            "HINDSIGHT_LLM_LANGUAGE": "zh",
            "HINDSIGHT_LLM_PREFILL": "1",
        }
    )
    assert config == LLMConfig(
        provider="anthropic",
        model="claude-strong",
        local_model="claude-cheap",
        base_url="http://gateway:8080",
        api_key="sk-ant",
        timeout=12.5,
        temperature=0.0,
        max_tokens=900,
        language="zh",
        prefill=True,
    )


def test_a_base_url_and_model_default_to_the_openai_protocol() -> None:
    env = {
        "HINDSIGHT_LLM_BASE_URL": "http://localhost:11434/v1",
        "HINDSIGHT_LLM_MODEL": "qwen2.5:14b",
    }
    config = LLMConfig.from_env(env)
    assert config is not None and config.provider == "openai" and config.temperature == 0.2


@pytest.mark.parametrize(
    ("env", "fix"),
    [
        ({"HINDSIGHT_LLM_PROVIDER": "openai"}, "HINDSIGHT_LLM_MODEL"),
        (
            {"HINDSIGHT_LLM_PROVIDER": "gemini", "HINDSIGHT_LLM_MODEL": "x"},
            "HINDSIGHT_LLM_PROVIDER",
        ),
        ({"HINDSIGHT_LLM_MODEL": "x", "HINDSIGHT_LLM_TIMEOUT": "soon"}, "HINDSIGHT_LLM_TIMEOUT"),
    ],
)
def test_unusable_settings_name_the_fix(env: dict[str, str], fix: str) -> None:
    with pytest.raises(LLMConfigError, match=fix):
        LLMConfig.from_env(env)


def test_the_environment_builds_the_client_and_the_routed_reflector() -> None:
    env = {
        "HINDSIGHT_LLM_BASE_URL": "http://127.0.0.1:9/v1",
        "HINDSIGHT_LLM_MODEL": "strong",
        "HINDSIGHT_LLM_LOCAL_MODEL": "cheap",
        "HINDSIGHT_LLM_TIMEOUT": "3",
    }
    llm = from_env(env)
    assert isinstance(llm, OpenAILLM) and llm.timeout == 3 and llm.name == "openai:strong"
    llm.close()
    reflector = reflector_from_env(env)
    assert isinstance(reflector, LLMReflector)
    assert (reflector.name, reflector.model, reflector.local_model) == (
        "openai:strong",
        "strong",
        "cheap",
    )
    reflector.close()

    anthropic = reflector_from_env({**env, "HINDSIGHT_LLM_PROVIDER": "anthropic"})
    assert anthropic is not None and isinstance(anthropic.llm, AnthropicLLM)
    anthropic.close()


def test_openai_without_any_key_or_url_says_where_to_put_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LLMConfigError, match="HINDSIGHT_LLM_API_KEY"):
        OpenAILLM("gpt-4o-mini")


def test_anthropic_without_any_key_says_where_to_put_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LLMConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicLLM("claude-sonnet-4-5")


@pytest.mark.parametrize(
    ("module", "build"),
    [
        ("openai", lambda: OpenAILLM("m", base_url="http://127.0.0.1:9/v1")),
        ("anthropic", lambda: AnthropicLLM("m", base_url="http://127.0.0.1:9")),
    ],
)
def test_a_missing_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, module: str, build
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a package not installed
    with pytest.raises(ImportError, match=rf"pip install 'hindsight-loop\[{module}\]'"):
        build()


# -- hindsight llm --------------------------------------------------------------------------------

runner = CliRunner()


def test_llm_config_offline() -> None:
    result = runner.invoke(app, ["llm", "config", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"provider": "offline", "configured": False}
    text = runner.invoke(app, ["llm", "config"])
    assert "HINDSIGHT_LLM_MODEL" in text.output


def test_llm_config_shows_the_settings_but_not_the_key() -> None:
    env = {
        "HINDSIGHT_LLM_BASE_URL": "http://x/v1",
        "HINDSIGHT_LLM_MODEL": "m",
        "HINDSIGHT_LLM_API_KEY": "sk-secret",
    }
    result = runner.invoke(app, ["llm", "config", "--json"], env=env)
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["model"] == "m" and info["local_model"] == "m" and info["api_key"] == "set"
    assert "sk-secret" not in result.output


def test_llm_check_reports_each_model() -> None:
    with LLMServer(
        [answer({"ok": True}, tokens_in=20, tokens_out=4), answer({"ok": True})]
    ) as server:
        env = {
            "HINDSIGHT_LLM_BASE_URL": server.openai_base_url,
            "HINDSIGHT_LLM_MODEL": "strong",
            "HINDSIGHT_LLM_LOCAL_MODEL": "cheap",
        }
        result = runner.invoke(app, ["llm", "check", "--json"], env=env)
        text = runner.invoke(app, ["llm", "check", "--no-local"], env={**env})
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [r["model"] for r in out["results"]] == ["strong", "cheap"]
    assert out["results"][0]["tokens_in"] == 20 and out["results"][0]["json"] is True
    assert [r.model for r in server.requests[:2]] == ["strong", "cheap"]
    assert text.exit_code == 1  # the script ran out: the server answered 500
    assert "HINDSIGHT_LLM_BASE_URL" in text.output


def _model(right: bool) -> Callable[[RecordedRequest], Any]:
    """A model that answers the judge's check pairs right, or "same" to every pair."""
    relations = {b: r for _, b, r in CANARIES}

    def handle(request: RecordedRequest) -> Any:
        for b, relation in relations.items():
            if f'Lesson B: "{b}"' in request.prompt:
                return answer({"relation": relation if right else "same"})
        return answer({"ok": True})

    return handle


def test_llm_check_judge_says_whether_curation_will_use_the_model() -> None:
    for right in (True, False):
        with LLMServer(_model(right)) as server:
            env = {"HINDSIGHT_LLM_BASE_URL": server.openai_base_url, "HINDSIGHT_LLM_MODEL": "m"}
            text = runner.invoke(app, ["llm", "check", "--no-local", "--judge"], env=env)
            out = json.loads(
                runner.invoke(app, ["llm", "check", "--judge", "--json"], env=env).output
            )
        assert text.exit_code == 0, text.output
        assert len(server.requests) == 2 * (1 + len(CANARIES))
        assert out["judge"]["trusted"] is right
        if right:
            assert "6 of 6 check pairs right: curation uses its word" in text.output
            assert out["judge"]["missed"] == []
        else:
            assert "2 of 6 check pairs right" in text.output
            assert "curation will not use it" in text.output
            assert {m["expected"] for m in out["judge"]["missed"]} == {"opposite", "different"}
    # Without --judge: one request, as before.
    with LLMServer(_model(True)) as server:
        env = {"HINDSIGHT_LLM_BASE_URL": server.openai_base_url, "HINDSIGHT_LLM_MODEL": "m"}
        assert runner.invoke(app, ["llm", "check", "--no-local"], env=env).exit_code == 0
    assert len(server.requests) == 1


def test_llm_check_judge_fails_when_the_check_pairs_get_no_answer() -> None:
    with LLMServer([answer({"ok": True})], default=rejected(401)) as server:
        env = {"HINDSIGHT_LLM_BASE_URL": server.openai_base_url, "HINDSIGHT_LLM_MODEL": "m"}
        result = runner.invoke(app, ["llm", "check", "--no-local", "--judge"], env=env)
    assert result.exit_code == 1
    assert "check pairs got no answer" in result.output
    assert len(server.requests) == 1 + 3  # the check tried three times, one request each


def test_llm_check_fails_with_the_fix_when_the_server_errs() -> None:
    with LLMServer([server_error(503)]) as server:
        env = {"HINDSIGHT_LLM_BASE_URL": server.openai_base_url, "HINDSIGHT_LLM_MODEL": "m"}
        result = runner.invoke(app, ["llm", "check"], env=env)
    assert result.exit_code == 1
    assert "HTTP 503" in result.output and "HINDSIGHT_LLM_BASE_URL" in result.output


def test_llm_check_without_configuration_says_what_to_set() -> None:
    result = runner.invoke(app, ["llm", "check"])
    assert result.exit_code == 1
    assert "HINDSIGHT_LLM_PROVIDER" in result.output


def test_llm_help() -> None:
    result = runner.invoke(app, ["llm", "--help"])
    assert result.exit_code == 0 and "check" in result.output and "config" in result.output
