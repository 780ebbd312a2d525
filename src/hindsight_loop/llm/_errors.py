"""Turn the provider SDKs' exceptions into ``LLMError`` so one retry policy fits every provider.

The official ``openai`` and ``anthropic`` clients share an exception shape (``APITimeoutError``,
``APIConnectionError``, ``APIStatusError`` with ``status_code`` and ``response``), so one function
handles both, given the SDK module.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from hindsight_loop.llm import LLMError

# 408 request timeout, 409 lock conflict, 425 too early, 429 rate limit, 5xx and Anthropic's
# 529 overloaded are transient: the same request can succeed a moment later.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


def translate(exc: Exception, sdk: ModuleType, *, where: str, timeout: float) -> Exception:
    """The ``LLMError`` for an SDK exception, or ``exc`` itself when it is not a request failure."""
    if isinstance(exc, sdk.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return LLMError(f"no answer from {where} within {timeout:g}s (timeout)", retryable=True)
    if isinstance(exc, sdk.APIConnectionError):
        return LLMError(f"cannot reach {where}: {exc}", retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        return LLMError(
            f"{where} answered HTTP {status}: {_message(exc)}",
            retryable=status in RETRYABLE_STATUS or status >= 500,
            retry_after=retry_after(headers),
            status=status,
        )
    return exc


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:300]
    return str(getattr(exc, "message", exc))[:300]


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date), if present."""
    try:
        raw_ms = headers.get("retry-after-ms")
        if raw_ms is not None:
            return max(0.0, float(raw_ms) / 1000)
        raw = headers.get("retry-after")
    except (TypeError, ValueError):
        return None
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())
