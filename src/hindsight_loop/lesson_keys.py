"""How recall's rule stage reads a lesson: the normalized keys it filters and ranks on, and
what its advice says of its own condition (a remedy for a call gone wrong, or a precaution).

Recall keeps these keys in memory (``recall.LessonIndex``) and the PostgreSQL store keeps them in
columns, so the rule stage can run in SQL; both take them from here, so the two can never filter
differently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
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
    task type) and their scopes may be read by one recall (``scopes_apart`` aside: the same
    scope, or one global, which every recall reads). The lessons curation must compare for
    contradictions, since recall keeps apart only recorded ones."""
    ta, tb = task_key(a.task_type), task_key(b.task_type)
    sa, sb = scope_key(a.scope), scope_key(b.scope)
    return (ta == tb or not ta or not tb) and (
        sa == sb or "global" in (sa, sb) or _kinds_apart(sa, sb)
    )


def scopes_apart(a: Lesson | LessonDraft, b: Lesson | LessonDraft) -> bool:
    """Whether two lessons are of two owners' scopes that one recall may still read together:
    scopes of two kinds, neither global. A recall names the caller's own scopes, one of each
    kind ("project:web" with "user:alice"; ``attribute.scopes_for``: an agent role with its
    team), so a user's lesson is served beside its project's, never beside another user's."""
    return _kinds_apart(scope_key(a.scope), scope_key(b.scope))


def _scope_kind(key: str) -> str:
    """``project``, ``user``, ``agent``, ``team`` (or ``global``) of a scope key."""
    return key.partition(":")[0]


def _kinds_apart(sa: str, sb: str) -> bool:
    return "global" not in (sa, sb) and _scope_kind(sa) != _scope_kind(sb)


def gathers_uncompared(task_key: str | None, scope_keys: Sequence[str]) -> bool:
    """Whether one recall may gather two lessons ``served_together`` says are never served
    together, which curation therefore never compared: it names no task type (``task_key``
    ``None`` or ``""``: every task type passes), or two scopes of one kind ("user:alice" with
    "user:bob", "project:web" with "project:api")."""
    if not task_key:
        return True
    kinds = [_scope_kind(key) for key in set(scope_keys) - {"global"}]
    return len(kinds) > len(set(kinds))


# -- what advice says of its own condition ------------------------------------------------------

#: A call going wrong, in a remedy's condition: a failure verb ("fails", "times out", "raises"),
#: or a call returning nothing or an error ("returns no results", "get_weather returns 404",
#: "run_sql says …": a tool's name, or "the call" / "it", before "returns" or "says").
_FAILS_EN = (
    r"fail(?:s|ed|ing)?|errors?|errored|raises?|raised|throws?|threw|times? out|timed out|"
    r"crash(?:es|ed)?|rejects?|rejected|refuses?|refused"
)
_RETURNS_EN = r"returns?|returned|says|said|reports?|gives?|comes? back"
_REMEDY_EN = re.compile(
    r"\b(?:when|whenever|if)\b[^.,;:!?]{0,80}?\b(?:"
    rf"(?:{_FAILS_EN})\b"
    rf"|(?:\w+_\w+|call|tool|request|api|it)\s+(?:{_RETURNS_EN})\b"
    rf"|(?:{_RETURNS_EN})\s+(?:no|nothing|empty|an? error|errors?|null|none|[45]\d\d)\b)",
    re.IGNORECASE,
)
#: The same in Chinese: a failure word, in a clause closed by 时 / 时候 or opened by 如果 / 若 /
#: 一旦 / 当 ("读取 CSV 报编码错误时，", "如果上传失败"). 时 must close the clause: 实时 and 及时 do not.
_FAILS_ZH = (
    r"(?:报错|报[^。；，,;]{0,8}错|出错|错误|失败|超时|异常|拒绝|崩溃|无结果|没有结果|"
    r"返回(?:空|为空|错误|\s*[45]\d\d))"
)
_REMEDY_ZH = re.compile(
    rf"(?:如果|若|一旦|当)[^。；，,;]{{0,30}}{_FAILS_ZH}"
    rf"|{_FAILS_ZH}[^。；，,;]{{0,30}}(?:时候|时[，,：:\s])"
)

#: A precaution worded after the failure that taught it: what to do first, next time ("When
#: read_csv fails with EncodingError, you should call it with encoding='utf-8-sig' first
#: instead of encoding='utf-8'", "…, you should avoid calling …: try another option first",
#: "…时，你应该先用 gbk 读取"): the reflector's own lessons read so, and they are for the start
#: of the next run, not for after the failure.
_PRECAUTION_EN = re.compile(
    r"\bfirst\b[^.;!?]{0,80}\binstead of\b|\binstead of\b[^.;!?]{0,80}\bfirst\b"
    r"|\bavoid\b[^.!?]{0,160}\bfirst\b",
    re.IGNORECASE,
)
_PRECAUTION_ZH = re.compile(r"先[^。；！？!?]{0,60}而不是|避免[^。！？!?]{0,80}先|一开始就")


def names_failure(text: str) -> bool:
    """Whether text holds a remedy's condition: a call gone wrong ("when get_weather returns
    404", "如果上传失败")."""
    return bool(_REMEDY_EN.search(text) or _REMEDY_ZH.search(text))


def is_remedy(advice: str) -> bool:
    """Whether a lesson's advice is a remedy: what to do once a call has gone wrong, and not a
    precaution for the next run's start. Recall ranks a remedy lower for a request that reports
    nothing gone wrong (``recall.Ranking.remedy_miss``); curation takes a remedy and a
    precaution for lessons of two situations (``lessons._scenario``)."""
    if _PRECAUTION_EN.search(advice) or _PRECAUTION_ZH.search(advice):
        return False
    return names_failure(advice)


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
