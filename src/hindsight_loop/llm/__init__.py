"""LLM access behind one small protocol, so reflection does not care who answers.

Hindsight asks a model for one thing: a JSON answer to a review prompt. ``LLM.complete`` is that
call and nothing more; the providers (any OpenAI-compatible endpoint, Anthropic) translate it to
their API and translate their errors into ``LLMError``, whose ``retryable`` / ``retry_after`` let
the reflector retry the same way for every provider. Retries, parsing and lessons live in
``hindsight_loop.llm.reflector``; the fakes in ``hindsight_loop.testing`` implement the protocol too.

Configuration comes from code (``LLMConfig(...)``) or the environment (``LLMConfig.from_env()``):

=============================  ===========================================================
``HINDSIGHT_LLM_PROVIDER``     ``openai`` (any OpenAI-compatible endpoint), ``anthropic``,
                               or ``offline`` (no model; the offline reflector is used)
``HINDSIGHT_LLM_BASE_URL``     endpoint, e.g. ``http://localhost:11434/v1`` for Ollama
``HINDSIGHT_LLM_MODEL``        the strong model, used for full reviews
``HINDSIGHT_LLM_LOCAL_MODEL``  a cheaper model for local reviews (default: the strong one)
``HINDSIGHT_LLM_API_KEY``      key (default: the SDK's own ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``)
``HINDSIGHT_LLM_TIMEOUT``      seconds per request (default 60)
``HINDSIGHT_LLM_TEMPERATURE``  default 0.2
``HINDSIGHT_LLM_LANGUAGE``     ``en`` / ``zh`` to force the lessons' language (default: the run's)
``HINDSIGHT_LLM_MAX_TOKENS``   upper bound on an answer (default 2000)
``HINDSIGHT_LLM_PREFILL``      ``1``: Anthropic answers start from a prefilled ``{``
=============================  ===========================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Provider = Literal["openai", "anthropic"]
PROVIDERS: tuple[str, ...] = ("openai", "anthropic")

DEFAULT_TIMEOUT = 60.0
DEFAULT_TEMPERATURE = 0.2
DEFAULT_MAX_TOKENS = 2000


@dataclass(kw_only=True, slots=True)
class Completion:
    """One answer of a model."""

    text: str
    """The answer's text (for Anthropic with a prefill, the prefill included)."""
    model: str
    """The model that answered, as the server named it."""
    tokens_in: int | None = None
    """Prompt tokens, as the server counted them."""
    tokens_out: int | None = None
    """Answer tokens, as the server counted them."""
    latency_ms: float = 0.0
    """Wall time of the request that produced this answer."""
    finish_reason: str | None = None
    """``stop``, ``length`` … as the provider said; ``length`` / ``max_tokens`` mean truncated."""

    @property
    def truncated(self) -> bool:
        """True when the model stopped because it ran out of tokens."""
        return self.finish_reason in ("length", "max_tokens")


@dataclass(kw_only=True, slots=True)
class LLMRequest:
    """What was asked of a model; the fakes record these."""

    prompt: str
    system: str | None = None
    model: str | None = None
    json_mode: bool = False
    temperature: float | None = None
    max_tokens: int | None = None


class LLMError(Exception):
    """A request to a model failed; says whether trying again may help."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        """Timeouts, refused connections, 429 and 5xx are worth another try; 4xx are not."""
        self.retry_after = retry_after
        """Seconds the server asked us to wait (``Retry-After``), when it said."""
        self.status = status
        """HTTP status, when there was a response."""


class LLMConfigError(ValueError):
    """The LLM configuration is incomplete or wrong; the message names the setting to fix."""


@runtime_checkable
class LLM(Protocol):
    """A chat model that answers one prompt."""

    provider: str
    """``openai``, ``anthropic``, or a fake's name."""
    name: str
    """``provider:model``, e.g. ``openai:gpt-4o-mini``."""
    model: str
    """The default model; ``complete(model=...)`` overrides it per call."""

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
        """Answer ``prompt``; raises ``LLMError`` when the request fails."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(kw_only=True, slots=True)
class LLMConfig:
    """How to reach a model, by code or by ``HINDSIGHT_LLM_*`` environment variables."""

    provider: Provider = "openai"
    """``openai`` (any OpenAI-compatible endpoint) or ``anthropic``."""
    model: str
    """Strong model, used for full reviews."""
    local_model: str | None = None
    """Cheaper model for local reviews; ``None`` uses ``model``."""
    base_url: str | None = None
    """Endpoint; ``None`` uses the provider's public API."""
    api_key: str | None = None
    """``None`` lets the SDK read ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds per request before it counts as a timeout."""
    temperature: float = DEFAULT_TEMPERATURE
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Upper bound on the answer's length."""
    language: str | None = None
    """``en`` / ``zh`` forces the lessons' language; ``None`` follows the run."""
    prefill: bool = False
    """Anthropic only: start JSON answers with a prefilled ``{`` (models that allow prefill)."""

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise LLMConfigError(
                f"unknown LLM provider {self.provider!r}; use one of {', '.join(PROVIDERS)} "
                "(HINDSIGHT_LLM_PROVIDER), or 'offline' for no model"
            )
        if not self.model:
            raise LLMConfigError(
                f"no model given for provider {self.provider!r}; set HINDSIGHT_LLM_MODEL "
                "(e.g. 'gpt-4o-mini', 'qwen2.5:14b', 'claude-sonnet-4-5')"
            )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LLMConfig | None:
        """Read ``HINDSIGHT_LLM_*``; ``None`` when no model is configured (or provider ``offline``).

        Raises ``LLMConfigError`` when the settings are present but unusable.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(f"HINDSIGHT_LLM_{name}", "").strip()
            return value or None

        provider = (get("PROVIDER") or "").lower()
        if provider == "offline":
            return None
        # Only an explicit Hindsight setting turns the LLM on: an OPENAI_API_KEY that happens to be
        # in the environment must not start paid calls nobody asked for.
        if not provider and not (get("BASE_URL") or get("MODEL")):
            return None
        return cls(
            provider=provider or "openai",  # type: ignore[arg-type]  # checked in __post_init__
            model=get("MODEL") or "",
            local_model=get("LOCAL_MODEL"),
            base_url=get("BASE_URL"),
            api_key=get("API_KEY"),
            timeout=_number(get("TIMEOUT"), DEFAULT_TIMEOUT, "HINDSIGHT_LLM_TIMEOUT"),
            temperature=_number(
                get("TEMPERATURE"), DEFAULT_TEMPERATURE, "HINDSIGHT_LLM_TEMPERATURE"
            ),
            max_tokens=int(
                _number(get("MAX_TOKENS"), DEFAULT_MAX_TOKENS, "HINDSIGHT_LLM_MAX_TOKENS")
            ),
            language=get("LANGUAGE"),
            prefill=(get("PREFILL") or "").lower() in ("1", "true", "yes", "on"),
        )


def _number(raw: str | None, default: float, name: str) -> float:
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise LLMConfigError(f"{name}={raw!r} is not a number") from None


def connect(config: LLMConfig) -> LLM:
    """Build the client for ``config``; raises ``ImportError`` naming the extra when it is missing."""
    if config.provider == "anthropic":
        from hindsight_loop.llm.anthropic import AnthropicLLM

        return AnthropicLLM.from_config(config)
    from hindsight_loop.llm.openai import OpenAILLM

    return OpenAILLM.from_config(config)


def from_env(environ: dict[str, str] | None = None) -> LLM | None:
    """The LLM the environment configures, or ``None`` (then the offline reflector is used)."""
    config = LLMConfig.from_env(environ)
    return None if config is None else connect(config)


def estimate_tokens(text: str) -> int:
    """Rough token count without a tokenizer: ~4 chars per token for Latin text, 1 per CJK char."""
    cjk = sum(1 for ch in text if _is_cjk(ch))
    return cjk + (len(text) - cjk + 3) // 4


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return (
        0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or 0x3400 <= code <= 0x4DBF  # extension A
        or 0x3000 <= code <= 0x303F  # CJK punctuation
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
        or 0x3040 <= code <= 0x30FF  # kana
        or 0xAC00 <= code <= 0xD7AF  # hangul
    )


def __getattr__(name: str) -> object:
    # The reflector imports this module; exporting it lazily avoids an import cycle and keeps
    # ``from hindsight_loop.llm import reflector_from_env`` working.
    if name in ("LLMReflector", "RetryPolicy", "reflector_from_env"):
        from hindsight_loop.llm import reflector

        return getattr(reflector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TIMEOUT",
    "LLM",
    "Completion",
    "LLMConfig",
    "LLMConfigError",
    "LLMError",
    "LLMReflector",
    "LLMRequest",
    "RetryPolicy",
    "connect",
    "estimate_tokens",
    "from_env",
    "reflector_from_env",
]
