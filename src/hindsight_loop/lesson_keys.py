"""How recall's rule stage reads a lesson: the normalized keys it filters and ranks on.

Recall keeps these keys in memory (``recall.LessonIndex``) and the PostgreSQL store keeps them in
columns, so the rule stage can run in SQL; both take them from here, so the two can never filter
differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hindsight_loop.embed import lesson_text
from hindsight_loop.models import Lesson, LessonDraft, parse_ts
from hindsight_loop.text import tokenize

#: Task types that name no task type in particular: such a lesson fits any task.
ANY_TASK_TYPES = ("", "*", "any")


def norm(value: str | None) -> str:
    return (value or "").strip().casefold()


def task_key(task_type: str | None) -> str:
    """The task type as matched; ``""`` for a lesson (or query) of any task type."""
    key = norm(task_type)
    return "" if key in ANY_TASK_TYPES else key


def scope_key(scope: str | None) -> str:
    return norm(scope) or "global"


def same_keys(a: Lesson | LessonDraft, b: Lesson | LessonDraft) -> bool:
    """Whether two lessons are of one task type and one scope as recall reads them (case and
    surrounding spaces ignored): the lessons curation may merge."""
    return task_key(a.task_type) == task_key(b.task_type) and scope_key(a.scope) == scope_key(
        b.scope
    )


def served_together(a: Lesson | LessonDraft, b: Lesson | LessonDraft) -> bool:
    """Whether one recall may return both lessons: their task types match (or one is of any
    task type) and their scopes match (or one is global, which every recall reads). The lessons
    curation must compare for contradictions, since recall keeps apart only recorded ones."""
    ta, tb = task_key(a.task_type), task_key(b.task_type)
    sa, sb = scope_key(a.scope), scope_key(b.scope)
    return (ta == tb or not ta or not tb) and (sa == sb or "global" in (sa, sb))


def valid_epoch(lesson: Lesson) -> float:
    """Until when (epoch seconds) the lesson may be recalled; pinned or undated: forever."""
    if lesson.pinned or not lesson.valid_until:
        return math.inf
    try:
        return parse_ts(lesson.valid_until).timestamp()
    except ValueError:
        return -math.inf  # an unreadable date must not keep a lesson alive forever


def value_of(lesson: Lesson) -> float:
    """The value score as ranking uses it: in [0, 1], unknown (NaN) as 0.5."""
    v = lesson.value_score
    if v is None or math.isnan(v):
        return 0.5
    return min(max(float(v), 0.0), 1.0)


@dataclass(kw_only=True, frozen=True, slots=True)
class RecallKeys:
    """Everything recall's rule and rank stages read from a lesson, except its vector."""

    task_key: str
    scope_key: str
    intent_key: str
    step_key: str
    error_key: str
    valid_epoch: float
    tools: list[str]
    """Distinct normalized tool names, in first-seen order."""
    tokens: list[str]
    """The BM25 terms of ``lesson_text`` in order, repeats kept."""
    value: float


def recall_keys(lesson: Lesson) -> RecallKeys:
    feats = lesson.features
    return RecallKeys(
        task_key=task_key(lesson.task_type),
        scope_key=scope_key(lesson.scope),
        intent_key=norm(feats.intent),
        step_key=norm(feats.step),
        error_key=norm(feats.error_type),
        valid_epoch=valid_epoch(lesson),
        tools=[t for t in dict.fromkeys(norm(t) for t in feats.tools) if t],
        tokens=tokenize(lesson_text(lesson), with_concepts=True),
        value=value_of(lesson),
    )


@dataclass(kw_only=True, frozen=True, slots=True)
class RuleFilter:
    """Recall's rule stage as data, for a store that filters in its own query language."""

    now: float
    """Epoch seconds: lessons valid until then or later pass."""
    task_key: str | None
    """Lessons of this task type or of any (``None``: every task type)."""
    scope_keys: list[str]
    """Besides global lessons, those in these scopes."""
    intent_key: str | None
    """Lessons without an intent or with this one (``None``: any intent)."""
    tools: list[str] | None
    """Lessons without tools or sharing one of these (``None``: tools do not filter)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class ScoreBound:
    """An upper bound of recall's score that a store can compute per lesson: every signal
    exact (cosine too) except BM25, bounded by the query terms the lesson holds."""

    model: str
    """Lessons with a stored vector of another model (or none) get cosine 1."""
    vector: list[float] | None
    """The query's embedding; ``None`` when the query has no text."""
    cos_floor: float | None
    """Rescale cosines from this floor (``None``: as they are)."""
    term_weights: dict[str, float]
    """Query term -> the most it adds to the normalized BM25 (idf / reference)."""
    specific_counts: bool
    """Whether a lesson for this very task type scores above one for any task type."""
    tool_fit_max: float
    """1 when the query names tools (a lesson may share all of them), else 0.5."""
    step_key: str
    error_key: str
    vector_weight: float
    bm25_weight: float
    scenario_weight: float
    step_boost: float
    error_boost: float
    value_floor: float
    value_span: float
    at_least: float
    """Keep lessons whose bound reaches this."""
