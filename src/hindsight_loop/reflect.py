"""Reflection: turn a replayed run (a chronicle) into lessons.

Every reflector, offline or LLM-backed, answers the same question through the ``Reflector``
protocol, so the facade and the review worker never care who reflected. ``OfflineReflector`` is
the default when no model is configured: it needs nothing but the chronicle, and it is
deterministic (the same chronicle always gives the same drafts), which makes lessons testable and
the demo reproducible. It looks for the two patterns a careful reviewer points at first:

- a *recovery*: an action failed at a step, then an alternative (another tool, or the same tool
  with other arguments) succeeded at that step. The lesson: start with what worked.
- *repeated failures* with no recovery: the same tool failed at least twice at a step. The
  lesson: do not start with what failed.

Each lesson carries a structured form a plain program can apply without an LLM::

    when   = {"tool": T, "step": S, "error_type": E, "context": {"source": "erp_cn"}}
    prefer = {"tool": T2, "args": {"encoding": "gbk"}}     # only the arguments that differ
    avoid  = {"tool": T, "args": {"encoding": "utf-8"},
              "variants": [{"encoding": "utf-8"}, {"encoding": "utf-8-sig"}]}  # when several failed
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from hindsight_loop.models import (
    Chronicle,
    Features,
    LessonDraft,
    Reflection,
    Step,
    Structured,
    Task,
    is_failure,
    is_success,
    iso,
    new_id,
    utcnow,
)
from hindsight_loop.patterns import identifying_context as _identifying_context
from hindsight_loop.patterns import review_runs
from hindsight_loop.text import QUOTE_MAX, detect_language, quote_value

__all__ = ["OfflineReflector", "Reflector", "needs_review", "review_runs"]

ReviewKind = Literal["full", "local"]

#: Arguments that point at the one input of a run (a file, a URL); dropped from an ``avoid``
#: built from identical failed calls, where no successful call shows which arguments mattered.
_LOCATOR_ARGS = frozenset({"path", "file", "file_path", "filename", "url", "uri", "id"})
_MAX_KEYWORDS = 10


@runtime_checkable
class Reflector(Protocol):
    """Turns a chronicle into a reflection with lesson drafts; offline or backed by an LLM."""

    name: str

    def reflect(
        self,
        chronicle: Chronicle,
        *,
        kind: ReviewKind = "full",
        window: tuple[int, int] | None = None,
    ) -> Reflection:
        """Review a run (``kind="full"``) or the window of steps around an anomaly.

        Args:
            chronicle: The replayed run.
            kind: ``full`` for a whole run, ``local`` for a window.
            window: ``(first_step_index, last_step_index)`` of the chronicle, both included, for
                a local review.

        Returns:
            A reflection whose ``lessons`` are drafts for curation; status ``ok``, ``suspect``
            (the answer could not be parsed cleanly) or ``failed``. Should not raise for bad data.
        """
        ...


def needs_review(
    task: Task, event_count: int, *, min_events: int = 10, had_failure: bool = False
) -> bool:
    """Whether a finished task deserves a full review.

    It does when it failed, when it ran long enough, or when one of its actions failed even
    though the task succeeded: a recovery is where the most useful lessons are.

    Args:
        task: The task, with its final status.
        event_count: How many events it recorded.
        min_events: A successful task needs at least this many events to be reviewed.
        had_failure: Whether any of its actions failed.
    """
    return task.status == "failed" or had_failure or event_count >= min_events


# -- reading the chronicle ----------------------------------------------------------------------


def _args(step: Step) -> dict[str, Any]:
    """The arguments of an action step: ``input["args"]``, or the input minus the tool name."""
    data = step.input or {}
    args = data.get("args")
    if isinstance(args, dict):
        return args
    return {k: v for k, v in data.items() if k != "tool"}


def _same_call(a: Step, b: Step) -> bool:
    return a.action == b.action and _args(a) == _args(b)


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``a`` that ``b`` lacks or holds with another value (sorted keys)."""
    return {k: a[k] for k in sorted(a) if k not in b or b[k] != a[k]}


def _language(chronicle: Chronicle, steps: Sequence[Step]) -> str:
    """``zh`` when the people's words in the run (goal, user input) are Chinese."""
    texts = [chronicle.task.goal or ""]
    for step in steps:
        if step.type == "user_input":
            texts.append(str((step.input or {}).get("text") or step.summary or ""))
    return detect_language(" ".join(texts))


@dataclass(kw_only=True, slots=True)
class _Recovery:
    failures: list[Step]
    """The failed calls at the step, oldest first (the first is what the agent started with)."""
    success: Step
    """The alternative that worked."""


@dataclass(kw_only=True, slots=True)
class _Repeated:
    failures: list[Step] = field(default_factory=list)


def _patterns(
    steps: Sequence[Step], key_nodes: Sequence[Any]
) -> tuple[list[_Recovery], list[_Repeated]]:
    """Find recoveries and unrecovered repeated failures among the action steps, in run order."""
    actions = [
        s
        for s in steps
        if s.type == "action_executed"
        and s.action
        and (is_failure(s.status) or is_success(s.status))
    ]
    pending: dict[str, list[Step]] = {}
    recoveries: list[_Recovery] = []
    for step in actions:
        # Without step labels a failure and a success only belong together when they used the
        # same tool: any other pairing would invent a recovery between unrelated actions.
        label = step.step if step.step is not None else f"tool:{step.action}"
        if is_failure(step.status):
            pending.setdefault(label, []).append(step)
            continue
        failures = pending.pop(label, [])
        if failures and not any(_same_call(f, step) for f in failures):
            recoveries.append(_Recovery(failures=failures, success=step))
        # A success that repeats a failed call means the failure was transient: no lesson.

    # Replay may mark recoveries itself (related = [failed_idx, success_idx]); honour those it
    # saw that step pairing did not (e.g. across differently labelled steps).
    by_index = {s.index: s for s in actions}
    seen = {r.success.index for r in recoveries}
    for node in key_nodes:
        if getattr(node, "kind", None) != "recovery" or len(getattr(node, "related", [])) < 2:
            continue
        failed, success = by_index.get(node.related[0]), by_index.get(node.related[-1])
        if (
            failed is None
            or success is None
            or success.index in seen
            or not is_failure(failed.status)
            or not is_success(success.status)
            or _same_call(failed, success)
        ):
            continue
        recoveries.append(_Recovery(failures=[failed], success=success))
        seen.add(success.index)
    recoveries.sort(key=lambda r: r.success.index)

    repeated: list[_Repeated] = []
    for failures in pending.values():
        by_tool: dict[str, list[Step]] = {}
        for f in failures:
            by_tool.setdefault(f.action or "", []).append(f)
        repeated += [_Repeated(failures=fs) for fs in by_tool.values() if len(fs) >= 2]
    repeated.sort(key=lambda r: r.failures[0].index)
    return recoveries, repeated


# -- wording ------------------------------------------------------------------------------------
# Lessons are read by people in the review queue and injected into prompts, so they are
# written as sentences in the run's language; identifiers (tools, arguments, values) stay as
# they are in both languages because the agent has to type them back.


def _fmt_args(args: dict[str, Any]) -> str:
    # Recorded names and values: quoted and bounded (the whole lesson is defused once, later).
    return ", ".join(f"{str(k)[:QUOTE_MAX]}={quote_value(v)}" for k, v in args.items())


def _fmt_call(tool: str, args: dict[str, Any], lang: str) -> str:
    if lang == "zh":
        return f"用 {_fmt_args(args)} 调用 {tool}" if args else f"调用 {tool}"
    return f"{tool} with {_fmt_args(args)}" if args else tool


def _fmt_context(context: dict[str, Any]) -> str:
    return ", ".join(f"{str(k)[:QUOTE_MAX]} {quote_value(v)}" for k, v in context.items())


def _join(items: list[str], lang: str) -> str:
    if lang == "zh":
        return "、".join(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def _tried(tool: str, variants: list[dict[str, Any]], lang: str) -> str:
    """``read_csv with encoding='utf-8' or encoding='gbk'`` / ``用 encoding='utf-8'、… 调用 read_csv``."""
    shown = [_fmt_args(v) for v in variants if v]
    if not shown:
        return _fmt_call(tool, {}, lang)
    if lang == "zh":
        return f"用 {_join(shown, 'zh')} 调用 {tool}"
    return f"{tool} with {_join(shown, 'en')}"


def _situation(
    tool: str, step: str | None, error: str | None, ctx: dict[str, Any], lang: str
) -> str:
    """The ``When …`` clause shared by a lesson's advice and suggestions."""
    if lang == "zh":
        where = f"在 {_fmt_context(ctx)} 的情况下，" if ctx else ""
        at = f"（步骤 '{step}'）" if step else ""
        err = f"出现 {error} " if error else "失败"
        return f"{where}{tool}{at}{err}时"
    at = f" (step '{step}')" if step else ""
    err = f" with {error}" if error else ""
    for_ctx = f" for {_fmt_context(ctx)}" if ctx else ""
    return f"When {tool}{at} fails{err}{for_ctx}"


def _recovery_draft(
    chronicle: Chronicle, rec: _Recovery, *, lang: str, kind: ReviewKind
) -> LessonDraft:
    first, ok = rec.failures[0], rec.success
    tool, alt = first.action or "", ok.action or ""
    step, error = first.step, first.error_type
    ctx = _identifying_context(first)
    prefer_args = _diff(_args(ok), _args(first))
    avoid_args = _diff(_args(first), _args(ok))
    # Every distinct failed variant of the first tool, so a program can skip all of them.
    variants: list[dict[str, Any]] = []
    for f in rec.failures:
        if f.action == tool:
            v = _diff(_args(f), _args(ok))
            if v not in variants:
                variants.append(v)
    avoid: dict[str, Any] = {"tool": tool, "args": avoid_args}
    if len(variants) > 1:
        avoid["variants"] = variants

    when_clause = _situation(tool, step, error, ctx, lang)
    do = _fmt_call(alt, prefer_args, lang)
    tried = _tried(tool, variants or [avoid_args], lang)
    where = _fmt_context(ctx)
    if lang == "zh":
        instead = (
            _fmt_args(avoid_args)
            if alt == tool and avoid_args
            else _fmt_call(tool, avoid_args, "zh")
        )
        advice = f"{when_clause}，你应该先{do}，而不是 {instead}。"
        root = (
            f"在{' ' + where + ' 的情况下' if where else '这种情况下'}，"
            f"{_fmt_call(tool, avoid_args, 'zh')} 会失败（{error or '失败'}），而{do} 成功了。"
        )
        suggestions = [
            f"{'遇到 ' + where + ' 时' if where else '在这种情况下'}，一开始就{do}。",
            f"不要先{tried}：这些调用在这里失败过。",
            "如果首选做法也失败，换用还没试过的选项，不要重复已经失败的调用。",
            f"离开步骤 '{step or alt}' 之前先检查结果是否正确。",
        ]
        rule = "某个动作在一种可识别的情况下失败时，记住在该情况下奏效的替代做法，下次直接先用它。"
    else:
        instead = (
            _fmt_args(avoid_args)
            if alt == tool and avoid_args
            else _fmt_call(tool, avoid_args, "en")
        )
        advice = f"{when_clause}, you should call {do} first instead of {instead}."
        root = (
            f"{_fmt_call(tool, avoid_args, 'en')} does not work for {where or 'this situation'} "
            f"({error or 'it failed'}); {do} does."
        )
        suggestions = [
            f"Start with {do} for {where or 'this situation'}.",
            f"Do not start with {tried}: it failed here before.",
            "If the preferred call fails too, move on to an option not tried yet instead of "
            "repeating a failed call.",
            f"Check the result before leaving step '{step or alt}'.",
        ]
        rule = (
            "When an action fails in a recognisable situation, remember the alternative that "
            "worked there and start with it next time."
        )
    return LessonDraft(
        task_type=chronicle.task.task_type,
        advice=advice,
        features=_features(chronicle, [tool, alt], step, error, ctx, [prefer_args, *variants]),
        root_cause=root,
        suggestions=suggestions,
        general_rule=rule,
        structured=Structured(
            when=_when(tool, step, error, ctx),
            prefer={"tool": alt, "args": prefer_args},
            avoid=avoid,
        ),
        kind="local_review" if kind == "local" else "full_review",
        scope=chronicle.task.scope,
        source_task_ids=[chronicle.task.task_id],
        language=lang,
    )


def _repeated_draft(
    chronicle: Chronicle, rep: _Repeated, *, lang: str, kind: ReviewKind
) -> LessonDraft:
    first = rep.failures[0]
    tool, step, error = first.action or "", first.step, first.error_type
    ctx = _identifying_context(first)
    all_args = [_args(f) for f in rep.failures]
    # The arguments the agent varied between attempts are what it was trying; the rest (the
    # file it was given …) is this run's input and must not be part of the lesson.
    varied = sorted({k for a in all_args for k in a if any(a.get(k) != b.get(k) for b in all_args)})
    variants: list[dict[str, Any]] = []
    for a in all_args:
        v = (
            {k: a[k] for k in varied if k in a}
            if varied
            else {k: val for k, val in sorted(a.items()) if k.lower() not in _LOCATOR_ARGS}
        )
        if v not in variants:
            variants.append(v)
    avoid: dict[str, Any] = {"tool": tool, "args": variants[0]}
    if len(variants) > 1:
        avoid["variants"] = variants
    when_clause = _situation(tool, step, error, ctx, lang)
    tried = _tried(tool, variants, lang)
    where = _fmt_context(ctx)
    n = len(rep.failures)

    if lang == "zh":
        advice = f"{when_clause}，你应该避免{tried}：每一种都在这里失败过，请先尝试其他选项。"
        root = (
            f"在{' ' + where + ' 的情况下' if where else '这种情况下'}，{tool} 连续失败 {n} 次"
            f"（{error or '失败'}），没有找到可行的替代做法。"
        )
        suggestions = [
            f"{'遇到 ' + where + ' 时' if where else '在这种情况下'}，跳过{tried}。",
            "先尝试还没有失败过的参数或其他工具。",
            "同样的失败出现两次后就换一种做法，不要继续重试。",
            "找到可行的做法后记下来，下次直接先用它。",
        ]
        rule = "不要在同一情况下重复已经以同样方式失败的动作；改变参数或换一个工具。"
    else:
        advice = (
            f"{when_clause}, you should avoid calling {tried}: each failed there; "
            "try another option first."
        )
        root = (
            f"{tool} failed {n} times for {where or 'this situation'} ({error or 'failed'}) "
            "and no alternative that works was found."
        )
        suggestions = [
            f"Skip {tried} for {where or 'this situation'}.",
            "Try arguments or a tool that has not failed yet.",
            "After the same failure twice, change the approach instead of retrying.",
            "Once something works, note it so the next run can start with it.",
        ]
        rule = (
            "Do not repeat an action that already failed the same way in the same situation; "
            "change the arguments or the tool."
        )
    return LessonDraft(
        task_type=chronicle.task.task_type,
        advice=advice,
        features=_features(chronicle, [tool], step, error, ctx, variants),
        root_cause=root,
        suggestions=suggestions,
        general_rule=rule,
        structured=Structured(when=_when(tool, step, error, ctx), prefer=None, avoid=avoid),
        kind="local_review" if kind == "local" else "full_review",
        scope=chronicle.task.scope,
        source_task_ids=[chronicle.task.task_id],
        language=lang,
    )


def _when(tool: str, step: str | None, error: str | None, ctx: dict[str, Any]) -> dict[str, Any]:
    when: dict[str, Any] = {"tool": tool}
    if step is not None:
        when["step"] = step
    if error is not None:
        when["error_type"] = error
    if ctx:
        when["context"] = ctx
    return when


def _features(
    chronicle: Chronicle,
    tools: list[str],
    step: str | None,
    error: str | None,
    ctx: dict[str, Any],
    arg_sets: list[dict[str, Any]],
) -> Features:
    words: list[str] = [str(v) for v in ctx.values()]
    words += [error] if error else []
    words += tools
    words += [
        str(v) for args in arg_sets for v in args.values() if isinstance(v, str | int | float)
    ]
    keywords = list(dict.fromkeys(w for w in words if w))[:_MAX_KEYWORDS]
    return Features(
        tools=list(dict.fromkeys(t for t in tools if t)),
        intent=chronicle.task.intent,
        step=step,
        error_type=error,
        keywords=keywords,
    )


# -- the reflector ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OfflineReflector:
    """The deterministic reflector used when no LLM is configured.

    Args:
        max_lessons: At most this many drafts per reflection (recoveries first).
    """

    name: str = "offline"
    max_lessons: int = 5

    def reflect(
        self,
        chronicle: Chronicle,
        *,
        kind: ReviewKind = "full",
        window: tuple[int, int] | None = None,
    ) -> Reflection:
        """Review a chronicle (or a window of it) into lesson drafts; never raises.

        Args:
            chronicle: The replayed run.
            kind: ``full`` or ``local``.
            window: ``(first_step_index, last_step_index)``, both included; only those steps
                are looked at.

        Returns:
            A reflection with status ``ok`` (possibly with no lessons when the run shows no
            recovery and no repeated failure), or ``failed`` with the error if the chronicle was
            unusable.
        """
        started = time.perf_counter()
        task_id = getattr(getattr(chronicle, "task", None), "task_id", "") or ""
        try:
            drafts = self.drafts(chronicle, kind=kind, window=window)
        except Exception as exc:  # noqa: BLE001 - a bad chronicle must not break the review worker
            return Reflection(
                reflection_id=new_id("ref"),
                task_id=task_id,
                kind=kind,
                status="failed",
                reflector=self.name,
                latency_ms=(time.perf_counter() - started) * 1000,
                error=f"{type(exc).__name__}: {exc}",
                created_at=iso(utcnow()),
            )
        parsed: dict[str, Any] = {
            "lessons": [
                {
                    "advice": d.advice,
                    "root_cause": d.root_cause,
                    "suggestions": d.suggestions,
                    "general_rule": d.general_rule,
                    "structured": d.structured.to_dict() if d.structured else None,
                }
                for d in drafts
            ]
        }
        if drafts:
            parsed.update(
                root_cause=drafts[0].root_cause,
                suggestions=drafts[0].suggestions,
                general_rule=drafts[0].general_rule,
            )
        return Reflection(
            reflection_id=new_id("ref"),
            task_id=task_id,
            kind=kind,
            status="ok",
            reflector=self.name,
            latency_ms=(time.perf_counter() - started) * 1000,
            parsed=parsed,
            lessons=drafts,
            created_at=iso(utcnow()),
        )

    def drafts(
        self,
        chronicle: Chronicle,
        *,
        kind: ReviewKind = "full",
        window: tuple[int, int] | None = None,
    ) -> list[LessonDraft]:
        """The lesson drafts alone (a pure function of the chronicle and the window)."""
        steps = list(chronicle.steps)
        nodes = list(chronicle.key_nodes)
        if window is not None:
            lo, hi = sorted(window)
            steps = [s for s in steps if lo <= s.index <= hi]
            nodes = [n for n in nodes if lo <= n.index <= hi]
        lang = _language(chronicle, steps)
        recoveries, repeated = _patterns(steps, nodes)
        out: list[LessonDraft] = []
        seen: set[str] = set()
        candidates = [_recovery_draft(chronicle, r, lang=lang, kind=kind) for r in recoveries]
        candidates += [_repeated_draft(chronicle, r, lang=lang, kind=kind) for r in repeated]
        for draft in candidates:
            # The same lesson twice in one run (a loop that recovered twice) is one lesson.
            if draft.advice in seen:
                continue
            seen.add(draft.advice)
            out.append(draft)
        return out[: self.max_lessons]
