"""Anthropic's Messages API, through the official ``anthropic`` client.

The Messages API has no JSON switch for free-form objects, so JSON mode is an instruction in the
system prompt, and optionally a prefilled ``{`` as the start of the answer. Prefill is off by
default because newer Claude models reject it with a 400; when it is on and a model rejects it,
the request is repeated without it and prefill stays off for this client.

Temperature is not sent: the Messages API of the ``anthropic`` 2.x client no longer takes sampling
parameters, so ``temperature`` is accepted (the ``LLM`` protocol has it) and ignored.
"""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from hindsight_loop.llm import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT,
    Completion,
    LLMConfig,
    LLMConfigError,
    LLMError,
)
from hindsight_loop.llm._errors import translate

INSTALL_HINT = "pip install 'hindsight-loop[anthropic]'"
JSON_INSTRUCTION = (
    "Answer with exactly one JSON object and nothing else: no prose before or after it, "
    "no markdown code fences."
)


def _sdk() -> ModuleType:
    # Imported lazily: the anthropic package is an optional extra, not a core dependency.
    try:
        import anthropic
    except ImportError as exc:
        raise ImportError(
            f"the Anthropic LLM provider needs the 'anthropic' package: {INSTALL_HINT}"
        ) from exc
    return anthropic


class AnthropicLLM:
    """A Claude model behind the Messages API (``/v1/messages``)."""

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        prefill: bool = False,
    ) -> None:
        """Connect lazily (no request is made here).

        Args:
            model: Default model name, e.g. ``claude-sonnet-4-5``.
            base_url: Endpoint without ``/v1``; ``None`` means api.anthropic.com.
            api_key: Key; ``None`` reads ``ANTHROPIC_API_KEY``.
            timeout: Seconds per request.
            max_tokens: Default upper bound on the answer (the API requires one).
            prefill: Start JSON answers with a prefilled ``{`` (for models that allow prefill).
        """
        self._sdk = _sdk()
        if api_key is None and not os.environ.get("ANTHROPIC_API_KEY"):
            if base_url is None:
                raise LLMConfigError(
                    "no API key for Anthropic: set HINDSIGHT_LLM_API_KEY or ANTHROPIC_API_KEY"
                )
            api_key = "not-needed"  # a local gateway may not check it
        self.model = model
        self.name = f"anthropic:{model}"
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.prefill = prefill
        self._client = self._sdk.Anthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    @classmethod
    def from_config(cls, config: LLMConfig) -> AnthropicLLM:
        return cls(
            config.model,
            base_url=config.base_url,
            api_key=config.api_key,
            timeout=config.timeout,
            max_tokens=config.max_tokens,
            prefill=config.prefill,
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
        """One message; raises ``LLMError`` (with ``retryable``) when it fails.

        ``temperature`` is ignored: the Messages API no longer takes it.
        """
        del temperature
        if json_mode:
            system = f"{system}\n\n{JSON_INSTRUCTION}" if system else JSON_INSTRUCTION
        kwargs: dict[str, Any] = {
            "model": model or self.model,
            "max_tokens": max_tokens or self.max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
        if system:
            kwargs["system"] = system
        if json_mode and self.prefill:
            prefilled = {
                **kwargs,
                "messages": [*kwargs["messages"], {"role": "assistant", "content": "{"}],
            }
            try:
                return self._create(prefilled, prefix="{")
            except LLMError as err:
                if err.status != 400:
                    raise
            # Only a success without the prefill proves the prefill was what the model refused.
            completion = self._create(kwargs, prefix="")
            self.prefill = False
            return completion
        return self._create(kwargs, prefix="")

    def _create(self, kwargs: dict[str, Any], *, prefix: str) -> Completion:
        where = self.base_url or "api.anthropic.com"
        started = time.perf_counter()
        try:
            message = self._client.messages.create(**kwargs)
        except Exception as exc:
            raise translate(exc, self._sdk, where=where, timeout=self.timeout) from exc
        latency_ms = (time.perf_counter() - started) * 1000
        text = "".join(
            block.text for block in message.content if getattr(block, "type", None) == "text"
        )
        # The answer continues the prefill; put it back, unless the server ignored the prefill
        # and answered the whole object anyway.
        if prefix and text and not text.lstrip().startswith(prefix):
            text = prefix + text
        usage = message.usage
        return Completion(
            text=text,
            model=message.model or kwargs["model"],
            tokens_in=usage.input_tokens if usage else None,
            tokens_out=usage.output_tokens if usage else None,
            latency_ms=latency_ms,
            finish_reason=message.stop_reason,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AnthropicLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AnthropicLLM(model={self.model!r}, base_url={self.base_url!r})"
