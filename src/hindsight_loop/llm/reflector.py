"""Reflection by a language model: chronicle in, lesson drafts out, and never an exception.

``LLMReflector`` implements the ``Reflector`` protocol of ``hindsight_loop.reflect``. It renders
the chronicle into a review prompt (bounded by a token budget), asks the model for JSON, retries
what is worth retrying (timeouts, refused connections, 429 with ``Retry-After``, 5xx, empty
answers, an answer that is not JSON), parses what came back leniently, and turns it into a
``LessonDraft``. Whatever happens is recorded on the returned ``Reflection``: ``ok`` with lessons;
``suspect`` with the raw answer and no lesson when the answer could not be trusted; ``failed``
with the error when no answer came. Model, latency and tokens are recorded either way.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from hindsight_loop.llm import (
    DEFAULT_TEMPERATURE,
    LLM,
    Completion,
    LLMConfig,
    LLMError,
    connect,
)
from hindsight_loop.llm.parse import as_dict, as_list, as_text, parse_review
from hindsight_loop.llm.templates import (
    DEFAULT_BUDGET_TOKENS,
    language_instruction,
    render,
    render_chronicle,
)
from hindsight_loop.models import (
    MAX_KEYWORDS,
    MAX_SUGGESTIONS,
    Chronicle,
    Features,
    KeyNode,
    LessonDraft,
    Reflection,
    Structured,
    iso,
    new_id,
    utcnow,
)
from hindsight_loop.replay import LIVE_KINDS, local_window, run_language
from hindsight_loop.text import detect_language

log = logging.getLogger(__name__)

ReviewKind = Literal["full", "local"]
# The kinds that start a local review (the live watch's), most telling first.
ANOMALY_KINDS = LIVE_KINDS
_ANOMALY_WORDS = {
    "consecutive_failures": "two tool failures in a row",
    "dissatisfaction": "the user showed dissatisfaction",
    "loop": "the same action repeated more than three times",
    "first_failure": "a tool failed",
    "hesitation": "the agent hesitated between actions",
    "anomaly": "an anomaly",
    "recovery": "the agent recovered from a failure",
}
_NULLS = {"", "null", "none", "n/a", "na", "无", "-"}


@dataclass(kw_only=True, frozen=True, slots=True)
class RetryPolicy:
    """How hard to try before a reflection is recorded as failed."""

    attempts: int = 3
    """Requests per answer (1 = no retry) for timeouts, connection errors, 429, 5xx, empty answers."""
    backoff: float = 1.0
    """Seconds before the second attempt; doubles after each failure (with jitter)."""
    max_backoff: float = 20.0
    """Upper bound on one backoff."""
    max_retry_after: float = 60.0
    """A ``Retry-After`` longer than this ends the reflection now (a queue can try again later)."""
    parse_retries: int = 1
    """Extra requests when an answer is not the JSON asked for."""

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait after failed ``attempt`` (1-based); ``None`` means stop trying."""
        if retry_after is not None:
            return None if retry_after > self.max_retry_after else retry_after
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        # Jitter keeps many workers that failed together from retrying together.
        return base * random.uniform(0.8, 1.0)


class LLMReflector:
    """A ``Reflector`` that asks a language model to review a chronicle."""

    def __init__(
        self,
        llm: LLM,
        *,
        model: str | None = None,
        local_model: str | None = None,
        language: str | None = None,
        temperature: float = DEFAULT_TEMPERATURE,
        max_tokens: int | None = None,
        budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        retry: RetryPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] | None = None,
        owns_llm: bool = False,
    ) -> None:
        """Configure the reviews.

        Args:
            llm: The model client (``OpenAILLM``, ``AnthropicLLM``, or a fake from
                ``hindsight_loop.testing.llm``).
            model: Model for full reviews; ``None`` uses ``llm.model``.
            local_model: Cheaper model for local reviews; ``None`` uses the full-review model.
            language: ``en`` / ``zh`` forces the lessons' language; ``None`` follows the run.
            temperature: Sampling temperature.
            max_tokens: Upper bound on an answer; ``None`` uses the client's default.
            budget_tokens: Upper bound on the (estimated) tokens of the chronicle in the prompt.
            retry: Retry policy; ``None`` uses ``RetryPolicy()``.
            clock: Gives "now" (the date in the prompt, ``created_at``).
            sleep: Waits between retries; ``None`` waits in a way ``close()`` can cut short.
            owns_llm: ``close()`` also closes ``llm``.
        """
        self.llm = llm
        self.model = model or llm.model
        self.local_model = local_model or self.model
        self.language = language
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.budget_tokens = budget_tokens
        self.retry = retry or RetryPolicy()
        self.clock = clock
        self.sleep = sleep
        # Set by close(): a worker shutting down must not sit out a backoff or start new attempts.
        self._closing = threading.Event()
        self.owns_llm = owns_llm
        self.name = f"{llm.provider}:{self.model}"

    @classmethod
    def from_config(cls, config: LLMConfig, **kwargs: Any) -> LLMReflector:
        """A reflector over a new client for ``config`` (closed by ``close()``)."""
        kwargs.setdefault("local_model", config.local_model)
        kwargs.setdefault("language", config.language)
        kwargs.setdefault("temperature", config.temperature)
        return cls(connect(config), owns_llm=True, **kwargs)

    def close(self) -> None:
        """Stop retrying (reflections in flight end as failed) and close an owned client."""
        self._closing.set()
        if self.owns_llm:
            self.llm.close()

    def __enter__(self) -> LLMReflector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LLMReflector({self.name!r}, local_model={self.local_model!r})"

    # -- the Reflector protocol ---------------------------------------------------------------

    def reflect(
        self,
        chronicle: Chronicle,
        *,
        kind: ReviewKind = "full",
        window: tuple[int, int] | None = None,
    ) -> Reflection:
        """Review a run (``full``) or a window of it around an anomaly (``local``).

        Args:
            chronicle: The replayed run.
            kind: ``full`` for a finished task, ``local`` for a window around an anomaly.
            window: ``(first_step_index, last_step_index)`` for a local review; ``None`` centres
                the window on the last anomaly.

        Returns:
            The reflection, ``ok`` with one lesson draft, ``suspect`` or ``failed`` without; it
            never raises.
        """
        started = time.perf_counter()
        now = self.clock()
        model = self.local_model if kind == "local" else self.model
        reflection = Reflection(
            reflection_id=new_id("ref"),
            task_id=chronicle.task.task_id,
            kind=kind,
            reflector=f"{self.llm.provider}:{model}",
            model=model,
            created_at=iso(now),
        )
        try:
            self._review(reflection, chronicle, kind=kind, window=window, model=model, now=now)
        except Exception as exc:  # a bug here must not reach the agent or kill the worker
            log.exception("reflection of task %s failed", chronicle.task.task_id)
            reflection.status = "failed"
            reflection.error = f"reflector error: {type(exc).__name__}: {exc}"
            reflection.lessons = []
        if reflection.latency_ms is None:
            reflection.latency_ms = (time.perf_counter() - started) * 1000
        return reflection

    # -- steps --------------------------------------------------------------------------------

    def _review(
        self,
        reflection: Reflection,
        chronicle: Chronicle,
        *,
        kind: ReviewKind,
        window: tuple[int, int] | None,
        model: str,
        now: datetime,
    ) -> None:
        if kind == "local":
            window = _within(window, chronicle) if window else _default_window(chronicle)
            reflection.trigger = _anomaly_kind(chronicle, window) or "anomaly"
        language = self.language or run_language(chronicle)
        system = render(
            "system",
            date=now.date().isoformat(),
            language_instruction=language_instruction(language),
        )
        prompt = self._prompt(chronicle, kind=kind, window=window)

        completions: list[Completion] = []
        for _round in range(1 + max(0, self.retry.parse_retries)):
            completion, error = self._ask(prompt, system=system, model=model)
            if completion is None:
                if reflection.status == "suspect":  # keep the answer we have; say what followed
                    reflection.error = f"{reflection.error}; asking again failed: {error}"
                else:
                    reflection.status, reflection.error = "failed", error
                break
            completions.append(completion)
            reflection.raw_text = completion.text
            reflection.lessons = []
            parsed = parse_review(completion.text, kind)
            reflection.parsed = parsed
            if completion.truncated:
                # A cut answer may parse after repair, but its last fields (the lesson) are cut.
                reflection.status = "suspect"
                reflection.error = (
                    f"the answer was cut at the token limit ({completion.tokens_out} tokens): "
                    "raise HINDSIGHT_LLM_MAX_TOKENS"
                )
                break
            if parsed is None:
                reflection.status = "suspect"
                reflection.error = "the answer is not the JSON review that was asked for"
                continue
            draft = self._draft(parsed, chronicle, kind=kind, window=window)
            if draft is None:
                reflection.status = "suspect"
                reflection.error = "the answer has no advice or general rule"
                continue
            reflection.status, reflection.error = "ok", None
            reflection.raw_text = None  # kept only when it is needed to judge a suspect answer
            reflection.lessons = [draft]
            break
        _record_usage(reflection, completions)

    def _prompt(
        self,
        chronicle: Chronicle,
        *,
        kind: ReviewKind,
        window: tuple[int, int] | None,
    ) -> str:
        task = chronicle.task
        text = render_chronicle(chronicle, budget_tokens=self.budget_tokens, window=window)
        common = {
            "task_type": task.task_type,
            "goal": task.goal or "(not recorded)",
            "tools": ", ".join(task.tools) or "(not recorded)",
            "chronicle": text,
        }
        if kind == "local":
            first, last = window or (0, max((s.index for s in chronicle.steps), default=0))
            kinds = _anomaly_kinds(chronicle, (first, last))
            return render(
                "local_review",
                anomaly="; ".join(_ANOMALY_WORDS.get(k, k) for k in kinds) or "an anomaly",
                window_first=first,
                window_last=last,
                **common,
            )
        outcome: str = task.status
        if task.outcome:
            outcome += " " + json.dumps(task.outcome, ensure_ascii=False, default=str)[:300]
        return render("full_review", outcome=outcome, event_count=chronicle.event_count, **common)

    def _ask(self, prompt: str, *, system: str, model: str) -> tuple[Completion | None, str | None]:
        """One answer with retries; ``(None, what went wrong)`` when there is none."""
        failures: list[str] = []
        attempt = 0
        while True:
            if self._closing.is_set():
                return None, "; ".join([*failures, "the reflector was closed"])
            attempt += 1
            try:
                completion = self.llm.complete(
                    prompt,
                    system=system,
                    model=model,
                    json_mode=True,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                )
            except LLMError as exc:
                err = exc
            except Exception as exc:  # an unknown client error: report it, do not retry blindly
                err = LLMError(f"{type(exc).__name__}: {exc}")
            else:
                if completion.text.strip():
                    return completion, None
                err = LLMError("the model returned an empty answer", retryable=True)
            failures.append(str(err))
            summary = f"{'; '.join(failures)} ({attempt} attempt{'s' if attempt > 1 else ''})"
            if not err.retryable or attempt >= self.retry.attempts:
                return None, summary
            delay = self.retry.delay(attempt, err.retry_after)
            if delay is None:
                return None, (
                    f"{summary}; the server asked to wait {err.retry_after:g}s, more than "
                    f"{self.retry.max_retry_after:g}s: try again later"
                )
            if self.sleep is not None:
                self.sleep(delay)
            else:
                self._closing.wait(delay)

    def _draft(
        self,
        parsed: Mapping[str, Any],
        chronicle: Chronicle,
        *,
        kind: ReviewKind,
        window: tuple[int, int] | None,
    ) -> LessonDraft | None:
        lesson = parsed.get("lesson") if kind == "full" else parsed
        if not isinstance(lesson, Mapping):
            return None
        general_rule = as_text(lesson.get("general_rule"))
        advice = as_text(lesson.get("advice")) or general_rule
        if not advice:
            return None
        task = chronicle.task
        nodes = _nodes_in(chronicle, window)
        known = _known_tools(chronicle)
        prefer = _action_form(lesson.get("prefer"), known)
        avoid = _action_form(lesson.get("avoid"), known)
        # A condition with nothing to do about it is not something a program can apply.
        structured = (
            Structured(when=_when_form(lesson.get("when")), prefer=prefer, avoid=avoid)
            if prefer or avoid
            else None
        )
        return LessonDraft(
            task_type=task.task_type,
            advice=advice,
            features=Features(
                tools=_lesson_tools(as_list(lesson.get("tools")), known, nodes),
                intent=task.intent,
                step=_node_step(chronicle, nodes),
                error_type=_error_type(as_text(lesson.get("error_type")), nodes),
                keywords=as_list(lesson.get("keywords"))[:MAX_KEYWORDS],
            ),
            root_cause=as_text(lesson.get("root_cause")),
            suggestions=as_list(lesson.get("suggestions"))[:MAX_SUGGESTIONS],
            general_rule=general_rule,
            structured=structured,
            kind="local_review" if kind == "local" else "full_review",
            scope=task.scope,
            source_task_ids=[task.task_id],
            language=self.language or detect_language(advice),
        )


def reflector_from_env(environ: dict[str, str] | None = None, **kwargs: Any) -> LLMReflector | None:
    """The ``LLMReflector`` the ``HINDSIGHT_LLM_*`` environment configures, or ``None``.

    ``None`` means no model is configured (or ``HINDSIGHT_LLM_PROVIDER=offline``): use the offline
    reflector. Raises ``LLMConfigError`` for unusable settings and ``ImportError`` naming the
    extra to install when the provider's client package is missing. Keyword arguments go to
    ``LLMReflector`` (``retry=``, ``budget_tokens=`` …).
    """
    config = LLMConfig.from_env(environ)
    return None if config is None else LLMReflector.from_config(config, **kwargs)


# -- helpers ----------------------------------------------------------------------------------


def _record_usage(reflection: Reflection, completions: list[Completion]) -> None:
    if not completions:
        return
    last = completions[-1]
    reflection.model = last.model or reflection.model
    reflection.latency_ms = sum(c.latency_ms for c in completions)
    tokens_in = [c.tokens_in for c in completions if c.tokens_in is not None]
    tokens_out = [c.tokens_out for c in completions if c.tokens_out is not None]
    reflection.tokens_in = sum(tokens_in) if tokens_in else None
    reflection.tokens_out = sum(tokens_out) if tokens_out else None


def _default_window(chronicle: Chronicle) -> tuple[int, int]:
    """The window around the last anomaly (``replay.local_window``), or the whole run."""
    indices = [s.index for s in chronicle.steps] or [0]
    nodes = [k for k in chronicle.key_nodes if k.kind in ANOMALY_KINDS] or chronicle.key_nodes
    if not nodes:
        return min(indices), max(indices)
    node = max(nodes, key=lambda k: k.index)
    first, last = local_window([node.index, *node.related], last=max(indices))
    return max(min(indices), first), last


def _within(window: tuple[int, int] | list[int], chronicle: Chronicle) -> tuple[int, int]:
    """A window cut to the steps the chronicle has (a live trigger may ask past the run's end)."""
    first, last = window
    if chronicle.steps:
        last = min(last, chronicle.steps[-1].index)
    return first, max(first, last)


def _nodes_in(chronicle: Chronicle, window: tuple[int, int] | None) -> list[KeyNode]:
    if window is None:
        return list(chronicle.key_nodes)
    lo, hi = window
    return [k for k in chronicle.key_nodes if lo <= k.index <= hi]


def _anomaly_kinds(chronicle: Chronicle, window: tuple[int, int]) -> list[str]:
    kinds = [k.kind for k in _nodes_in(chronicle, window)]
    ordered = [k for k in ANOMALY_KINDS if k in kinds] or kinds
    return list(dict.fromkeys(ordered))


def _anomaly_kind(chronicle: Chronicle, window: tuple[int, int]) -> str | None:
    kinds = _anomaly_kinds(chronicle, window)
    return kinds[0] if kinds else None


def _known_tools(chronicle: Chronicle) -> set[str]:
    return set(chronicle.task.tools) | {s.action for s in chronicle.steps if s.action}


def _lesson_tools(named: list[str], known: set[str], nodes: list[KeyNode]) -> list[str]:
    # Keep only tools the run had or used: a model may name a tool that does not exist.
    tools = [t for t in named if t in known] if known else named
    if not tools:
        tools = [k.action for k in nodes if k.action and (not known or k.action in known)]
    return list(dict.fromkeys(tools))


def _action_form(value: Any, known: set[str]) -> dict[str, Any] | None:
    """``{"tool": T, "args": {...}}``, the shape the offline reflector and curation use."""
    data = as_dict(value)
    if data is None:
        return None
    tool = as_text(data.get("tool") or data.get("action") or data.get("name"))
    if _empty(tool) or (known and tool not in known):
        return None  # a rule about a tool the agent does not have cannot be applied
    args: dict[str, Any] = next(
        (
            data[k]
            for k in ("args", "input", "arguments", "parameters")
            if isinstance(data.get(k), dict)
        ),
        {},
    )
    return {"tool": tool, "args": {k: v for k, v in args.items() if not _empty(v)}}


def _when_form(value: Any) -> dict[str, Any]:
    data = as_dict(value) or {}
    return {str(k): v for k, v in data.items() if not _empty(v)}


def _empty(value: Any) -> bool:
    # Models echo the template's placeholders ("…") or write null-ish words.
    return value is None or (
        isinstance(value, str) and value.strip().lower() in _NULLS | {"…", "..."}
    )


def _node_step(chronicle: Chronicle, nodes: list[KeyNode]) -> str | None:
    labels = {s.index: s.step for s in chronicle.steps if s.step}
    for node in nodes:
        if node.index in labels:
            return labels[node.index]
    return None


def _error_type(named: str, nodes: list[KeyNode]) -> str | None:
    if not _empty(named):
        return named
    return next((k.error_type for k in nodes if k.error_type), None)
