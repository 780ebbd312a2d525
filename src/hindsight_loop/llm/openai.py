"""Any OpenAI-compatible chat-completions endpoint, through the official ``openai`` client.

OpenAI itself, vLLM, Ollama, llama.cpp's server, DeepSeek, Qwen's compatible mode … all speak
this protocol; ``base_url`` picks the server. The SDK's own retries are off (``max_retries=0``):
the reflector retries every provider with one policy and one record of what happened.
"""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from hindsight_loop.llm import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TIMEOUT,
    Completion,
    LLMConfig,
    LLMConfigError,
    LLMError,
)
from hindsight_loop.llm._errors import translate

INSTALL_HINT = "pip install 'hindsight-loop[openai]'"


def _sdk() -> ModuleType:
    # Imported lazily: the openai package is an optional extra, not a core dependency.
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            f"the OpenAI-compatible LLM provider needs the 'openai' package: {INSTALL_HINT}"
        ) from exc
    return openai


class OpenAILLM:
    """A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        temperature: float = DEFAULT_TEMPERATURE,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        """Connect lazily (no request is made here).

        Args:
            model: Default model name, e.g. ``gpt-4o-mini`` or ``qwen2.5:14b``.
            base_url: Endpoint including ``/v1``; ``None`` means api.openai.com.
            api_key: Key; ``None`` reads ``OPENAI_API_KEY`` (local servers need none).
            timeout: Seconds per request.
            temperature: Default sampling temperature.
            max_tokens: Default upper bound on the answer.
        """
        self._sdk = _sdk()
        if api_key is None and not os.environ.get("OPENAI_API_KEY"):
            if base_url is None:
                raise LLMConfigError(
                    "no API key for OpenAI: set HINDSIGHT_LLM_API_KEY or OPENAI_API_KEY, or point "
                    "HINDSIGHT_LLM_BASE_URL at a local OpenAI-compatible server"
                )
            api_key = "not-needed"  # local servers (Ollama, llama.cpp, vLLM) ignore the key
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url
        self.timeout = timeout
        self.temperature = temperature
        self.max_tokens = max_tokens
        # Many compatible servers reject response_format; once one has, stop sending it.
        self.json_mode_supported = True
        self._client = self._sdk.OpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    @classmethod
    def from_config(cls, config: LLMConfig) -> OpenAILLM:
        return cls(
            config.model,
            base_url=config.base_url,
            api_key=config.api_key,
            timeout=config.timeout,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
        )

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
        """One chat completion; raises ``LLMError`` (with ``retryable``) when it fails."""
        messages: list[dict[str, str]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        kwargs: dict[str, Any] = {
            "model": model or self.model,
            "messages": messages,
            "temperature": self.temperature if temperature is None else temperature,
            # max_tokens, not max_completion_tokens: it is the one every compatible server reads.
            "max_tokens": max_tokens or self.max_tokens,
        }
        if json_mode and self.json_mode_supported:
            try:
                return self._create({**kwargs, "response_format": {"type": "json_object"}})
            except LLMError as err:
                if err.status not in (400, 422):
                    raise
            # The server refused JSON mode (or the request): ask once more without it; only a
            # success proves JSON mode was the problem, so only then remember it.
            completion = self._create(kwargs)
            self.json_mode_supported = False
            return completion
        return self._create(kwargs)

    def _create(self, kwargs: dict[str, Any]) -> Completion:
        where = self.base_url or "api.openai.com"
        started = time.perf_counter()
        try:
            response = self._client.chat.completions.create(**kwargs)
        except Exception as exc:
            raise translate(exc, self._sdk, where=where, timeout=self.timeout) from exc
        latency_ms = (time.perf_counter() - started) * 1000
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = response.usage
        return Completion(
            text=text,
            model=response.model or kwargs["model"],
            tokens_in=usage.prompt_tokens if usage else None,
            tokens_out=usage.completion_tokens if usage else None,
            latency_ms=latency_ms,
            finish_reason=choice.finish_reason if choice else None,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAILLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAILLM(model={self.model!r}, base_url={self.base_url!r})"
