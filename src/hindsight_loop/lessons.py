"""Curation and feedback: keep the lesson book small, true and sharp.

Every new lesson passes through ``curate`` (add it, merge it into the lesson it repeats, or flag
it as contradicting one), every task that had lessons injected feeds ``apply_outcome``, and
lessons age out through ``expire_due``. People change lessons through ``edit`` and the review
verbs built on it, so each change lands in the lesson's history with who, when and what.

These are functions of data: they return new ``Lesson`` values and never touch the store. The
facade (or the CLI) loads the book, calls them and saves what they return.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import itertools
import logging
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

import numpy as np
import orjson

from hindsight_loop import lesson_keys
from hindsight_loop.embed import cosine_floor, is_model_floor, rescale_cosines
from hindsight_loop.lesson_keys import norm
from hindsight_loop.models import (
    DEFAULT_VALIDITY,
    Features,
    Intent,
    Lesson,
    LessonDraft,
    LessonKind,
    LessonStatus,
    Structured,
    check_lesson_text,
    iso,
    new_id,
    parse_ts,
    utcnow,
)
from hindsight_loop.text import STOPWORDS, detect_language, is_cjk, tokenize

log = logging.getLogger("hindsight_loop")

# Two lessons' advice is compared by the mean of the embedder's cosine and a weighted overlap of
# their terms (``text_similarity``). The offline hashed embedder knows no synonyms and scores
# unrelated sentences of one template ("confirm the X before calling Y") high; the term overlap
# keeps concrete values (``utf-8-sig``, ``sep=';'``) decisive. Tuned on ten-fold rewordings in
# English and Chinese (pairs score >= 0.47) against distinct lessons of one task type (<= 0.43).
#: Similarity above which a draft repeats a lesson when neither names a step or error type ...
MERGE_THRESHOLD = 0.45
#: ... when both name the same step / error type (and no tool differs) ...
MERGE_THRESHOLD_SAME_SCENARIO = 0.38
#: ... and when only one of them names a step or error type.
MERGE_THRESHOLD_PARTIAL_SCENARIO = 0.55
#: Two texts that differ only in a negation ("use X" / "do not use X") score this high once the
#: negation and emphasis words are stripped; below it, a negation is just a rewording.
CONFLICT_THRESHOLD = 0.85
#: Below this similarity two lessons of one scenario are about different things: even terms
#: one prefers and the other avoids make no conflict.
CONFLICT_MIN_SIMILARITY = 0.2
#: The weight (``_term_weight`` squared) of the terms one lesson prefers and another avoids
#: that makes them opposites, when it also outweighs what they agree on (``stance_relation``).
MIN_OPPOSITION = 1.0
#: The weight of the terms the rules can read (a concrete value, an act of the concept lexicon)
#: that two near lessons must take the same way to merge (``agreement_shown``).
MIN_AGREEMENT = 1.0
#: How much more specific (``specificity``) a repeat's advice must be to replace the kept text.
SPECIFICITY_MARGIN = 8.0
#: Source task ids a lesson keeps as a sample (``source_count`` has the total).
MAX_SOURCE_SAMPLE = 20
#: The curator's most recent merges kept entry by entry in a lesson's history; older ones are
#: folded into one ``merge_summary`` entry (people's actions are always kept).
MAX_MERGE_ENTRIES = 16
#: Reworded versions of a lesson kept (in its history) so later rewordings can match any of them.
MAX_VARIANTS = 8
#: Distinct tools a lesson names. Repeats that name more than this between them show it is about
#: no tool in particular: it is then about any tool (no tools, as recall's rule stage reads it).
MAX_TOOLS = 16
#: Pairs within this of the merge threshold (either side) are open: a model, when one is
#: configured, has the last word on them (``llm.judge``).
JUDGE_MARGIN = 0.15
#: Pairs a model is asked about per draft: the open ones closest first, then the far ones.
MAX_JUDGED = 2
#: Wordings merged on a model's word alone that may wait on one lesson for a person's look
#: (each kept in its history until then); beyond them the model's word merges nothing more.
MAX_PENDING_JUDGED = 16

#: A lesson is flagged when, since it was last confirmed, it hurt at least this often and more
#: often than it helped.
HARMFUL_MIN = 3
#: Recency half-life of the value score.
RECENCY_HALF_LIFE_DAYS = 30.0

#: ``agent:ROLE`` holds one agent role's own lessons, ``team:NAME`` a team's collaboration lessons.
SCOPE_RE = re.compile(r"^(global|(project|user|agent|team):\S.*)$")
STATUSES: tuple[str, ...] = get_args(LessonStatus)
INTENTS: tuple[str, ...] = get_args(Intent)
KINDS: tuple[str, ...] = get_args(LessonKind)
FEATURE_FIELDS = ("tools", "intent", "step", "error_type", "keywords")


@dataclass(kw_only=True, slots=True)
class Change:
    """What curation decided for one draft; save ``saves`` (``lesson`` and ``others``)."""

    action: Literal["add", "merge", "conflict"]
    """``add`` a new lesson, ``merge`` into an existing one, or a new lesson in ``conflict``."""
    lesson: Lesson
    """The new lesson (add, conflict) or the existing lesson the draft was merged into (merge)."""
    others: list[Lesson] = dataclasses.field(default_factory=list)
    """Every live or waiting lesson contradicted, each with ``lesson``'s id added to its
    conflicts (recall keeps apart only the pairs recorded, so none may be left out): for a
    conflict, those the new lesson contradicts; for a merge, those the draft contradicts, now
    recorded against the lesson it went into."""

    @property
    def other(self) -> Lesson | None:
        """The first lesson contradicted (``others`` has them all)."""
        return self.others[0] if self.others else None

    @property
    def saves(self) -> list[Lesson]:
        """The lessons the caller has to write back to the store."""
        return [self.lesson, *self.others]


# -- small helpers ------------------------------------------------------------------------------


def check_scope(scope: str) -> str:
    """Return ``scope`` if it is ``global`` or ``project:``/``user:``/``agent:``/``team:NAME``;
    else raise."""
    if not isinstance(scope, str) or not SCOPE_RE.match(scope.strip()):
        raise ValueError(
            f"invalid scope {scope!r}: use 'global', 'project:NAME', 'user:NAME', "
            "'agent:ROLE' or 'team:NAME'"
        )
    return scope.strip()


def _history(now: datetime, by: str, action: str, changes: dict[str, Any]) -> dict[str, Any]:
    return {"at": iso(now), "by": by, "action": action, "changes": changes}


# Each starts where a run of its characters starts (the lookbehind): the matches are the same
# (a match is a whole run), and a long run without one is read once, not once per character.
_CONCRETE_RE = re.compile(r"(?<![\w.=/:'\"`-])[\w.=/:'\"`-]*[\d_=./:'\"`-][\w.=/:'\"`-]*")


def specificity(text: str) -> float:
    """How concrete advice is: its length plus a bonus per code-like token (``utf-8-sig``, ``x=1``)."""
    concrete = [t for t in _CONCRETE_RE.findall(text) if re.search(r"\w", t)]
    return len(text.strip()) + 8.0 * len(concrete)


def _merge_list(a: Sequence[Any], b: Sequence[Any], limit: int | None = None) -> list[Any]:
    out = list(a)
    out += [x for x in b if x not in out]
    return out[:limit] if limit else out


def _canon(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


# -- drafts into lessons ------------------------------------------------------------------------


def draft_to_lesson(
    draft: LessonDraft,
    *,
    now: datetime | None = None,
    validity: timedelta = DEFAULT_VALIDITY,
    by: str = "curator",
) -> Lesson:
    """A new active lesson from a reflector's draft: fresh id, timestamps, 30-day validity."""
    now = now or utcnow()
    lesson = Lesson(
        lesson_id=new_id("les"),
        task_type=draft.task_type,
        advice=draft.advice.strip(),
        features=copy.deepcopy(draft.features),
        root_cause=draft.root_cause,
        suggestions=list(draft.suggestions),
        general_rule=draft.general_rule,
        structured=copy.deepcopy(draft.structured),
        kind=draft.kind,
        scope=check_scope(draft.scope),
        source_task_ids=list(draft.source_task_ids),
        created_at=iso(now),
        updated_at=iso(now),
        valid_until=iso(now + validity),
        language=detect_language(draft.advice),
        history=[_history(now, by, "create", {"source_task_ids": list(draft.source_task_ids)})],
    )
    lesson.value_score = value_score(lesson, now)
    return lesson


# -- curation -----------------------------------------------------------------------------------

_NEG_EN = re.compile(
    r"\b(?:do\s+not|does\s+not|don't|don’t|doesn't|never|not|no|avoid(?:s|ing)?|without|"
    r"refrain\s+from|stop|quit|forgo(?:ing)?|forego(?:ing)?|eschew(?:s|ing)?|"
    r"steer(?:s|ing)?\s+clear\s+of|stay(?:s|ing)?\s+away\s+from|"
    r"(?:can|could|may)\s+(?:safely\s+|just\s+)?leave\s+out)\b",
    re.IGNORECASE,
)
_EMPH_EN = re.compile(
    r"\b(?:always|prefer(?:s|ably)?|must|should|make\s+sure\s+(?:to|that)|be\s+sure\s+to|do)\b",
    re.IGNORECASE,
)
# Prohibitions said in Chinese besides 不要 / 别 (these merged into their opposite): 切忌 and 忌
# (not 禁忌, 顾忌, 忌讳, 忌口), 不准 (not 不准确, 不准时, 说不准), 莫 (not 莫名, 莫非, 莫过于, 约莫),
# and 少 before an act ("少问", "少用缓存": ask less, use it less; not 至少, 多少, 不少, 减少, 少数,
# 少于: an amount, not advice). Not a question of yes or no: "允不允许抓取", "该不该重试".
_FORBID_ZH = (
    r"严禁|切忌|(?<![禁顾猜妒避])忌(?![讳口惮妒日])|(?<!该)不该|不应当|(?<!宜)不宜"
    r"|(?<![说拿对瞄准])不准(?![确时])|(?<!许)不许|(?<!允)不允许|(?<!倡)不提倡"
    r"|(?<![约])莫(?![名非过大斯测如须衷属若扎奈高])"
    r"|(?<![至多不减缺很较稍最太极过更年老青可稀])少"
    r"(?=\s*(?:x[a-z]|[用问调发改写做开加传打碰管说查试跑等建删存读拉提设放填猜]))"
)
# No bare 不: it starts many ordinary words (不同, 不断); 别 only before a verb (not 特别, 类别).
_NEG_ZH = re.compile(
    r"不要|不能|不应该|不应|不可以|不可|不得|不用|不必|无需|无须|不需要|不建议|不推荐|不主张|切勿|请勿|勿|"
    r"从来不|从不|绝不|决不|永不|禁止|避免|甭|别(?=[用再让把去忘使])|" + _FORBID_ZH
)
# 建议 / 需要 go after the negations are gone: "不建议 X" and "建议 X" leave one core.
_EMPH_ZH = re.compile(r"总是|务必|一定要|应当|应该|优先|建议|推荐|主张|需要")
#: snake_case names in advice: tools and columns (``get_weather``, ``order_date``).
# The name is group 1; a match starts only where a run of letters and digits starts, the digits
# before the name's first letter skipped: a run with no name in it ("a9a9…") is read once, not
# once for each letter in it (each start read to the run's end: 4 s for 20,000 characters).
_IDENTIFIER_RE = re.compile(r"(?<![A-Za-z0-9])[0-9]*([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)")


def _polarity(text: str) -> tuple[bool, str]:
    """Whether advice is phrased as a prohibition, and the text with polarity words removed."""
    text = _plain(text)
    negative = bool(_NEG_EN.search(text) or _NEG_ZH.search(text))
    core = _EMPH_ZH.sub("", _NEG_ZH.sub("", _EMPH_EN.sub("", _NEG_EN.sub("", text))))
    return negative, " ".join(core.split())


def _scenario(lesson: Lesson | LessonDraft) -> dict[str, Any]:
    """The situation a lesson is about: tool(s), step and error type, from features and ``when``."""
    when = lesson.structured.when if lesson.structured else {}
    f = lesson.features
    # Normalized as recall matches them (``lesson_keys.norm``): "Fetch_Quote" is fetch_quote.
    tools = {norm(t) for t in f.tools} - {""}
    if isinstance(when.get("tool"), str):
        tools.add(norm(when["tool"]))
    if not tools:
        # No tools given: the snake_case names the advice mentions stand in (get_weather).
        tools = {m.lower() for m in _IDENTIFIER_RE.findall(lesson.advice)}
    return {
        "tools": tools,
        "step": norm(when.get("step") or f.step) or None,
        "error_type": norm(when.get("error_type") or f.error_type) or None,
        "context": _canon(when["context"]) if when.get("context") else None,
        "phase": _phase(lesson.advice),
    }


#: Advice for before a call: "before calling get_weather", "调用 get_weather 前".
_BEFORE_CALL_RE = re.compile(
    r"\bbefore\s+(?:you\s+)?(?:call|calling|use|using|run|running|invoke|invoking)\b"
    r"|\bbefore\s+[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"
    r"|(?:调用|使用|执行|运行)[^。；，,!?！？]{0,30}?(?:之前|以前|前)"
    # From a name's first character only: tried from every character of a long name, the
    # name was read again to its end each time (a 30,000-character one took 10 s a curation).
    r"|(?<![A-Za-z0-9_])[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\s*(?:之前|以前|前)",
    re.IGNORECASE,
)


def _phase(advice: str) -> str | None:
    """When in a call the advice itself says it applies: ``remedy`` once the call has gone wrong
    ("get_weather 返回 404 时", "when fetch_quote times out", as recall reads a remedy),
    ``before`` the call ("before calling get_weather", "调用 get_weather 前"), else None."""
    if lesson_keys.is_remedy(advice):
        return "remedy"
    return "before" if _BEFORE_CALL_RE.search(advice) else None


def _scenario_agreement(a: dict[str, Any], b: dict[str, Any]) -> int:
    """How far two lessons' scenarios agree: -2 they differ (another step, error type, context or
    tool), 1 both name the same step or error type, -1 only one names them, 0 neither does.

    A shared tool alone says little: most lessons of a task type are about the same few tools.
    Where neither names a step or error type, advice for once a call has gone wrong and advice
    for before it (``_phase``: a remedy and a precaution) count as only one naming an error:
    "ask the user's city before calling get_weather" and "when get_weather returns 404, check
    the city's spelling" share the tool and the city, not the situation.
    """
    for key in ("step", "error_type", "context"):
        if a[key] and b[key] and a[key] != b[key]:
            return -2
    if a["tools"] and b["tools"] and not a["tools"] & b["tools"]:
        return -2
    named_a, named_b = (a["step"], a["error_type"]), (b["step"], b["error_type"])
    if named_a == named_b:
        if any(named_a):
            return 1
        return -1 if {a["phase"], b["phase"]} == {"remedy", "before"} else 0
    return -1


#: Merge threshold by ``_scenario_agreement`` (-2, different scenarios, never merges).
_MERGE_THRESHOLDS = {
    1: MERGE_THRESHOLD_SAME_SCENARIO,
    0: MERGE_THRESHOLD,
    -1: MERGE_THRESHOLD_PARTIAL_SCENARIO,
}

_WEIGHTED_TERM_RE = re.compile(r"[\d=\-.'\"]")
_SNAKE_RE = re.compile(r"^[a-z]+(?:_[a-z]+)+$")


def _term_weight(term: str) -> float:
    # Values (utf-8-sig, sep=';', 3.0) say what to do; snake_case names are tools and columns,
    # shared by every lesson about them; a lone Chinese character says little.
    if _SNAKE_RE.match(term):
        return 1.0
    if _WEIGHTED_TERM_RE.search(term):
        return 3.0
    return 0.5 if len(term) == 1 and is_cjk(term) else 1.0


# Words nearly every piece of agent advice uses: two lessons sharing them share no content.
_ADVICE_WORDS = frozenset(
    # "alway": the tokenizer folds plurals, and takes "always" for one.
    {"user", "call", "calling", "called", "before", "after", "first", "always", "alway", "never"}
    | {"make", "xuntil"}
    | {"sure", "need", "tool", "用户", "调用", "之前", "之后", "务必", "总是", "一定"}
)


# Curation reads each book lesson's text again for every draft it meets (term overlap, stance):
# cached, a review no longer tokenizes the same advice dozens of times.
@functools.lru_cache(maxsize=8192)
def _terms(text: str) -> frozenset[str]:
    # A snake_case name is one term: its parts ("get", "weather" of get_weather) would make every
    # lesson about one tool share three terms instead of one.
    names = {m.lower() for m in _IDENTIFIER_RE.findall(text)}
    # Concept tags: "backup" and "备份", "删除" and "删掉" meet on one term.
    words = tokenize(_IDENTIFIER_RE.sub(_unname, text), with_concepts=True)
    return frozenset(names | {t for t in words if t not in _ADVICE_WORDS and not _straddles(t)})


def _unname(m: re.Match[str]) -> str:
    """An identifier out of the text, the digits before it (``_IDENTIFIER_RE``) left."""
    return m[0][: m.start(1) - m.start()] + " "


def _straddles(term: str) -> bool:
    # A Chinese bigram with a particle in it ("件前", "前先", "先把") spans a word boundary: it
    # says how a sentence is built, not what it is about, and advice written to one template
    # ("发送邮件前先…") would share it whatever it advises. A segmenter would not make it.
    return len(term) == 2 and is_cjk(term[0]) and (term[0] in STOPWORDS or term[1] in STOPWORDS)


def term_overlap(a: str, b: str) -> float:
    """Weighted cosine of the two texts' term sets (CJK-aware, stopwords dropped), in [0, 1]."""
    ta, tb = _terms(_fold_concepts(a)), _terms(_fold_concepts(b))
    if not ta or not tb:
        return 0.0

    shared = sum(_term_weight(t) ** 2 for t in ta & tb)
    norm = math.sqrt(sum(_term_weight(t) ** 2 for t in ta) * sum(_term_weight(t) ** 2 for t in tb))
    return shared / norm


#: The share of a model embedder's cosine in ``text_similarity`` (the hashed embedder's is 0.5):
#: a model knows synonyms, so a rewording sharing few words ("send an idempotency key" / "include
#: an idempotency_key so retries cannot bill twice") should not be held back by the term overlap
#: as much; the terms still keep concrete values decisive.
MODEL_COSINE_WEIGHT = 0.6


def text_similarity(a: str, b: str, cosine: float, weight: float = 0.5) -> float:
    """How alike two pieces of advice are: ``weight`` of the embedding ``cosine`` and the rest
    of ``term_overlap`` (the mean of the two by default)."""
    return weight * max(cosine, 0.0) + (1.0 - weight) * term_overlap(a, b)


# -- what a lesson tells the agent to do and not to do ------------------------------------------
#
# Two lessons may be close in words and opposite in intent ("ask the user which city before
# get_weather" / "call get_weather for Beijing without asking"). Each lesson is read as a signed
# set of terms: + for what a clause tells the agent to do, - for what it forbids, nothing for the
# situation a clause sets (``when …``, ``before …``, ``…时``). Terms one lesson prefers and the other
# avoids are an opposition; terms both take the same way are an agreement.

# Words for one act, folded to one token so "ask the user" and "confirm with the user" meet.
_CONCEPTS_EN = (
    (re.compile(r"\b(?:ask(?:s|ed|ing)?|confirm(?:s|ed|ing)?|check(?:s|ed|ing)? with|"
                r"clarif(?:y|ies|ied|ying)|verif(?:y|ies|ied|ying)|approv(?:e|es|ed|ing|al)|"
                r"sign-?off)\b", re.I), " xask "),
    # "in a single upload_mission call", "in one request", "in a single visit": all of it at once.
    (re.compile(r"\b(?:all at once|in one go|in (?:a )?(?:single )?batch|in bulk|"
                r"in (?:a single|one) ((?:[\w-]+ ){0,2}?)(?:call|request|upload|pass|transaction|shot|"
                r"visit|sitting|session|trip|step|jump|leap))\b",
                re.I), r" xbatch \1 "),
    # "in small chunks", "piece by piece", "split it up": a part at a time.
    (re.compile(r"\b(?:one by one|one at a time|individually|in small batches|in (?:small )?chunks|"
                r"(?:chunk|piece|part|page|batch) by (?:chunk|piece|part|page|batch)|in pieces|"
                r"(?:split|break)(?:s|ting|ing)? (?:it |them |this |that )?up|"
                # "in small steps over several visits", "gradually", "a little at a time".
                r"gradually|incrementally|step by step|a little at a time|bit by bit|little by little|"
                r"in (?:small |several |multiple )?(?:steps|stages|increments)|"
                r"(?:over|across) (?:several|multiple|a few|two|three) (?:visits|sessions|passes|days|hours|rounds|trips))\b",
                re.I), " xeach "),
    (re.compile(r"\b(?:right away|immediately|immediate|at once|as soon as|straight away|instantly|directly|"
                r"without waiting)\b", re.I), " xnow "),
    (re.compile(r"\b(?:retr(?:y|ies|ied|ying)|re-?try(?:ing)?)\b(?!-)", re.I), " xretry "),
    # Filling a value in by default is guessing it: the opposite of asking (``_ANTONYMS``).
    (re.compile(r"\b(?:assum(?:e|es|ed|ing)|guess(?:es|ed|ing)?|by default|default(?:s|ed|ing)? to|"
                r"fall(?:s|ing)? back to)\b", re.I), " xguess "),
    # "don't approve it until you've checked": a wait, and a mark (``xuntil``, no term of its
    # own) where the step to take first begins (``_until``).
    (re.compile(r"\buntil\b", re.I), " xwait xuntil "),
    (re.compile(r"\b(?:wait(?:s|ed|ing)?|back(?:ing)? off|sleep|hold(?:s|ing)? off|"
                r"paus(?:e|es|ed|ing))\b", re.I),
     " xwait "),
    # "leave it unassigned": the act negated ("not assign"), read by ``_EXCLUDE_RE``.
    (re.compile(r"\bun(?!der)([a-z]{4,}?)(?:ed|d)\b", re.I), r" not \1 "),
    # "only one of them" and "both": one act taken two opposite ways (``_signed_terms``).
    # Not "only after / only if": an order or a condition.
    (re.compile(r"\b(?:only|solely)\b(?!\s+(?:after|when|if|then|once|until))", re.I), " xonly "),
    (re.compile(r"\bboth\b", re.I), " xboth "),
    # "X and also Y", "Y as well", "Y too": more than the one act, the opposite of "only X".
    (re.compile(r"\b(?:also|as well(?: as)?|in addition(?: to)?|besides|along with)\b|"
                r"\btoo\b(?=\s*(?:[,.;:!?)]|$))", re.I), " xboth "),
)  # fmt: skip
# "isn't", "don't", "can’t", "cannot": the verb and "not", so every negated form reads as its
# "not" form. The apostrophe may be left out ("dont", "shouldnt": "Dont ask" merged into "Ask");
# "cant" and "wont" are words of their own, rarely met in advice.
_NOT_CONTRACTED_RE = re.compile(
    r"\b(is|are|was|were|do|does|did|has|have|had|should|must|need|could|would)n[’']?t\b"
    r"|\b(ca|wo)n[’']?t\b|\b(can)not\b",
    re.I,
)
_CONCEPTS_ZH = (
    (re.compile(r"问清楚|问清|询问|确认|核实|核对|同意|批准|审批|问(?!题)"), " xask "),
    (
        re.compile(
            r"一次性|一口气|全部一起|一起提交|一股脑|一步到位|一下子"
            # Not 第一次 / 每一次 / 这一次 (the first, each, this time).
            r"|(?<![第每这上下再同某哪])一次就?(?:到位|调到|拉到|升到|做完|搞定)"
        ),
        " xbatch ",
    ),
    # A measure word said twice is one at a time: 一张一张, 一条条, 逐个, 挨个.
    (
        re.compile(
            r"逐[个一条张项笔份件台页批]|挨[个着]|一([个张条份封笔页项件台行批篇段])一?\1|分批|分段|分块|拆分|拆开|拆成"
            r"|逐步|逐渐|渐渐|循序渐进|一点一点|分阶段|分(?:几|多|两|三)次"
        ),
        " xeach ",
    ),
    (re.compile(r"马上|立即|立刻|直接|急着|急于|上来就|第一时间"), " xnow "),
    (re.compile(r"重试|重新请求|再试"), " xretry "),
    (re.compile(r"假设|假定|猜测|猜|默认"), " xguess "),
    (
        re.compile(r"等待|等到|暂停|退避|(?<![幂平相同对均初中高上次何])等(?![于同级号价效])"),
        " xwait ",
    ),
    (re.compile(r"只(?!有|能在|要)|仅(?!在)|光(?=[用靠看查填报传做写发])|单单"), " xonly "),
    # 除了 A (…) 也/还 B: A and B both (not 除了 A 都不: "all but A"); 也要 / 还要 / 一并: one
    # more act.
    (
        re.compile(
            r"同时|都要|两个都|除了(?=[^。；;！？]*?[也还])|也要|还要|也得|还得|也一起|一并|连同"
        ),
        " xboth ",
    ),
)
# Clause ends: ASCII ``;``, ``,`` and ``:`` only before a space or the end, so a value keeps
# them (``sep=';'``, ``postgres:16.2``, ``1,234``); a dash (``——``) ends a clause too. A split
# starts at the dash or the word, after a space (lookbehind), never at a space: tried from each
# space of a run, ``\s*—+`` or ``\s+but`` read the run to its end every time (minutes for
# 30,000 spaces). The spaces left at a clause's edge are stripped where clauses are read.
_ORDER_SPLIT_RE = re.compile(r"[；。!?！？，：\n]+|[;,:](?=\s|$)|\.(?=\s|$)|—+\s*")
_CLAUSE_SPLIT_RE = re.compile(
    r"[；。!?！？，：\n]+|[;,:](?=\s|$)|\.(?=\s|$)|—+\s*|(?<=\s)(?:but|then|and then)\s+"
    # "put a LIMIT on it so they do not scan the whole table": the purpose is a clause of its own.
    r"|(?<=\s)(?=so\s+(?:that\b|(?:you|we|it|they|he|she|this|these|those|there|nothing)\b))",
    re.I,
)
# A clause that sets the situation, not the act.
_CONDITION_EN = re.compile(
    r"^\s*(?:when|whenever|if|unless|before|after|once|while|for|on|in case)\b", re.I
)
_CONDITION_MID_EN = re.compile(
    r"\s(?:before|after|when|whenever|if|unless|once|as\s+soon\s+as)\s", re.I
)
_CONDITION_ZH = re.compile(
    # Not 小时 / 及时 / 同时 ... at the end: "至少隔 48 小时" is a value, not a when.
    # Not 无需 / 无须 / 没有必要: "无需再转义" says what not to do, not when.
    r"^\s*(?:如果|若|当|一旦|对于|在|没有(?!必要)|无(?![需须]))"
    r"|(?:(?<![小按准及同临实定计])时|之前|以前|前|之后|以后|后|的话)\s*$"
)
_CONDITION_MID_ZH = re.compile(
    r"(?:时(?![区间候刻长效段差])|之前|以前|之后|以后)(?=\s*\S)|[前后](?=\s*(?:先|再|要|请|务必|应|xnow|就))"
    # "超过 8 米就取消": the head of "…就 <act>" is when ("就行", "就是", "就够" are no act).
    r"|(?<=\S)就(?!行|好|可以|是|够|算|对|会|能|要|得)(?=\s*\S)"
)
# Prohibitions: what follows is avoided; what precedes is the subject (neutral) ...
_FORBID_RE = re.compile(
    r"\b(?:do\s+not|does\s+not|don't|don’t|doesn't|never|avoid(?:s|ing)?|refrain\s+from|"
    # "stop calling it" forbids; "stop and tell the user" is the act of stopping.
    r"stop(?=\s+(?:\w+ing|x[a-z]+)\b)|must\s+not|should\s+not|shouldn't|mustn't|no\s+longer|"
    # "skipping the check? No." (not "skipped": "re-run the skipped tests" names the tests).
    r"skip(?:s|ping)?|omit(?:s|ting)?|"
    # "there's no point letting it soak", "no need to ask again": what follows is not done.
    r"there(?:'s|’s|\s+is)\s+no\s+(?:point|need|sense|reason)(?:\s+in)?|no\s+(?:need|reason)\s+to|"
    r"need\s+not|needn't|(?:it's|it\s+is)\s+pointless\s+to|"
    # "forgo calling it", "quit calling it", "eschew it", "you can leave out the header" (not
    # "leave out public holidays" when counting days: what the count excludes, not an act).
    r"forgo(?:es|ing)?|forego(?:es|ing)?|eschew(?:s|ing)?|quit(?=\s+(?:\w+ing|x[a-z]+)\b)|"
    r"(?:can|could|may)\s+(?:safely\s+|just\s+)?leave\s+out|"
    # "under no circumstances ask", "steer clear of asking" (these merged into "ask").
    r"under\s+no\s+circumstances?|on\s+no\s+account|in\s+no\s+case|at\s+no\s+time|"
    r"steer(?:s|ing)?\s+clear\s+of|stay(?:s|ing)?\s+away\s+from|"
    # "ignore the Retry-After header" merged into "honor the Retry-After header".
    r"ignor(?:e|es|ing)|disregard(?:s|ing)?)\b"
    # 甭 (不用 said as one syllable): "甭等", "甭管".
    r"|不要|不能|不应该|不应|不可以|不可|不得|切勿|请勿|勿|禁止|避免|跳过|省略|甭|不建议|不推荐|不主张|忽略|无视|不理会|"
    + _FORBID_ZH
    # "never" said in Chinese: 从不备份 / 绝不重试 ("总是先备份" merged into its opposite).
    + r"|从来不|从不|绝不|决不|永不"
    # 别 is "don't" except inside a word: 别的 / 别人 (other), 区别, 告别, 分别, 类别, 特别, 级别 ...
    r"|(?<![区告分类特级性识个差辨派道离鉴])别(?![的人处称名致扭])",
    re.IGNORECASE,
)
# ... dismissals: what precedes is avoided ("listing the files first is a waste of time").
_DISMISS_RE = re.compile(
    # "… is a waste of a morning": a waste of anything dismisses what precedes.
    r"\b(?:is|are|was)\s+(?:a\s+|just\s+a\s+)?(?:(?:complete\s+|total\s+)?waste\s+of|unnecessary|pointless|"
    r"overkill|useless|not\s+needed|not\s+necessary|(?:an?\s+)?(?:bad|terrible|poor)\s+idea)\b"
    r"|\b(?:(?:is|are|was|'s)\s+)?(?:an?\s+)?(?:overkill|not\s+worth\s+(?:it|the)|too\s+slow|"
    r"too\s+expensive|too\s+risky|more\s+trouble\s+than|not\s+enough|proves?\s+nothing)\b"
    # "calling it again just burns quota", "re-reviewing them wastes the reviewer's time".
    r"|\b(?:just\s+|only\s+)?(?:wastes?|wasting|burns?|burning|eats?\s+up)\s+(?:[\w'-]+\s+){0,3}?"
    r"(?:time|quota|money|tokens?|credits?|budget|calls?|requests?)\b"
    # What an act costs others: "just keeps patients waiting", "only generates refund noise",
    # "money down the drain"; "白白耽误工夫", "徒增工作量" (stance reads them after folding:
    # "waiting" is ``xwait`` there, "only" ``xonly``).
    r"|\b(?:just\s+|only\s+|xonly\s+)?(?:keeps?|leaves?)\s+(?:[\w'-]+\s+){0,3}?(?:waiting|xwait)\b"
    r"|\b(?:just|only|xonly)\s+(?:slows?|holds?)\s+(?:[\w'-]+\s+){0,3}?(?:down|up)\b"
    r"|\b(?:just|only|xonly)\s+(?:generates?|creates?|adds?|produces?)\s+(?:[\w'-]+\s+){0,2}?"
    r"(?:noise|churn|clutter|confusion|work|overhead)\b"
    r"|\b(?:money|time|effort)\s+down\s+the\s+drain\b|\bthrow(?:s|ing)?\s+(?:good\s+)?money\s+away\b"
    # "spreading it over several visits just means it never holds": all an act brings is that
    # (not a definition, "an empty result just means no rows matched": ``_act_before``).
    r"|(?P<means>\b(?:just|only|xonly)\s+means?\b)"
    r"|白白|白搭|耽误(?:时间|工夫|功夫|事)|徒增|添乱"
    r"|是多余的|纯属多余|没必要|没有必要|不必要|浪费时间|多此一举|不值得|不划算|得不偿失|太慢|"
    r"太麻烦|太贵|太冒险|白费|犯不着|用不着|大可不必|没那个必要|省了吧"
    # "X can be skipped", "X is optional", "X 完全可以省掉": X may be left undone.
    r"|\b(?:can|could|may)\s+(?:safely\s+|just\s+)?be\s+(?:skipped|omitted|dropped|left\s+out)\b"
    r"|\b(?:is|are)\s+(?:purely\s+)?optional\b|可以(?:省掉|省去|省略|跳过|免掉|不做)|可有可无",
    re.IGNORECASE,
)
# ... exclusions: what precedes is what to do ("X instead of Y", "X without Y", "X, not Y").
_EXCLUDE_RE = re.compile(
    # 是不是 asks whether, excluding nothing.
    # "用 A 代替 B": A is done in place of B, as "A instead of B".
    r"\b(?:instead\s+of|rather\s+than|in\s+place\s+of|without|not)\b|而不是|而非|(?<!是)不是(?!不)"
    # "retry every error except 5xx" leaves 5xx out ("except when …" is a situation).
    r"|\b(?:except(?:\s+for)?|other\s+than|apart\s+from)(?=\s+(?!(?:when|if|where|while|after|before)\b)\S)"
    # "与其重试，不如报错": what 与其 leads is declined.
    r"|不用|不必|无需|无须|不需要|代替|取代|替代|与其",
    re.IGNORECASE,
)
_GENERIC_ACTS = frozenset(
    {"use", "try", "pass", "pick", "choose", "set", "run", "go", "take", "put", "do", "be",
     "you", "it", "one", "right", "way", "instead", "thing",
     "使用", "用", "尝试", "选择", "进行"}
)  # fmt: skip


_NOW_RE = re.compile(r"\bxnow\b")


# A bound is a value, not a prohibition: "不能短于 48 小时" / "至少隔 48 小时" / "no fewer than 4"
# ask for the same floor; a floor and a ceiling are opposed (``_ANTONYMS``).
_BOUNDS = (
    (
        re.compile(
            r"\b(?:at\s+least|no\s+(?:fewer|less|shorter|lower|sooner|earlier)\s+than|"
            r"not\s+(?:fewer|less|shorter|lower)\s+than|a\s+minimum\s+of)\b"
            r"|(?:不能|不得|不可|不应|不要)?(?:少于|短于|低于|小于|早于)|不少于|不低于|不短于|至少|起码",
            re.I,
        ),
        " xmin ",
    ),
    (
        re.compile(
            r"\b(?:at\s+most|no\s+(?:more|longer|higher|later)\s+than|"
            r"not\s+(?:more|longer|higher)\s+than|a\s+maximum\s+of)\b"
            r"|(?:不能|不得|不可|不应|不要)(?:超过|多于|长于|高于|大于|晚于)|不超过|不多于|不高于|至多|最多",
            re.I,
        ),
        " xmax ",
    ),
)

#: The tokens the concept lexicon folds acts to (``xask``, ``xwait``...).
_CONCEPT_TOKENS = frozenset(
    word
    for _, token in (*_CONCEPTS_EN, *_CONCEPTS_ZH)
    for word in token.split()
    if word.startswith("x") and word != "xuntil"
) | {token.strip() for _, token in _BOUNDS}


def _expand_not(text: str) -> str:
    """ "isn't" as "is not", "can't" as "can not": one form of each negation to match."""
    return _NOT_CONTRACTED_RE.sub(
        lambda m: (m[1] or m[3] or {"ca": "can", "wo": "will"}[m[2].lower()]) + " not", text
    )


@functools.lru_cache(maxsize=8192)
def _fold_concepts(text: str) -> str:
    text = _expand_not(text)
    for pattern, token in (*_CONCEPTS_EN, *_CONCEPTS_ZH):
        text = pattern.sub(token, text)
    return text


# Checking a fact first is the act of asking for it ("check the policy" / "confirm the loss
# date" / "look up the time zone" / "先查一下" / "看看座位够不够"): read as ``xask`` where advice
# is read for what it tells the agent to do (``stance``, ``_order``), not where texts are
# compared for likeness (``term_overlap``): there every "check" would bring unrelated checks
# before one tool closer.
_LOOK_RE = re.compile(
    r"\b(?:(?:double-)?check(?:s|ed|ing)?(?!\s+(?:out|in|with)\b)|look(?:s|ed|ing)?\s+(?:\w+\s+)?up"
    # A second look is a look: "re-reviewing them wastes time" / "they deserve a second look".
    r"|re-?review(?:s|ed|ing)?|(?:second|another|closer)\s+look)\b"
    r"|检查|核验|校验|查一下|查一查|查清|查看|看一下|看一眼|看看|复核|复查|再看一遍",
    re.I,
)


# A quoted span is a recorded value (``query='check rows …'``), not words of advice.
_QUOTED_RE = re.compile(r"'[^']*'|\"[^\"]*\"|‘[^’]*’|“[^”]*”")


# Advice said as a verdict on an act ("retrying fetch_page is the wrong call", "重试 fetch_page
# 是错的", "it is correct to ask first") or as a choice of one thing over another ("prefer
# read_csv over read_excel"): the clause rules read neither, and the opposites merged ("是对的" /
# "是错的" differ in one word they do not know). ``_plain`` says them as the rules read advice:
# "never retrying fetch_page", "不要重试 fetch_page", "ask first", "read_csv instead of
# read_excel". A verdict on a thing ("the city is wrong", "返回的城市不对") is left as it is.
#
# A verdict said in the passive or with a modal is one too: "asking first should be avoided / is
# discouraged / is not recommended / is forbidden" forbid the act, "… is recommended / is
# encouraged" ask for it (these merged into their opposite: the rules read the act and not the
# word after it). A modal ("should be") says nothing of the subject's number (group ``modal``).
# The verdict ends its clause, or a situation follows it ("… is discouraged before calling
# get_weather", "… should be avoided on a 503"; group ``tail``, kept).
_VERDICT_EN = re.compile(
    r"\s(?:(?P<modal>should|must|ought\s+to|has\s+to|have\s+to|needs?\s+to|is\s+to|are\s+to)"
    r"(?P<mnot>\s+not)?\s+be|is|are|was|were|'s|’s)\s+"
    r"(?:(?:strongly|highly|generally|usually|always|best|clearly|definitely|absolutely)\s+)?"
    r"(?P<not>(?:not|never)\s+)?"
    r"(?:(?:strongly|highly|generally|usually|always|best|clearly|definitely)\s+)?"
    r"(?:(?:the|a|an)\s+)?"
    r"(?:(?P<bad>wrong|incorrect|mistaken|mistake|error|bad\s+(?:idea|call|move|choice|practice)"
    r"|avoided|discouraged|forbidden|prohibited|banned|inadvisable|ill-advised|unwise|"
    r"counterproductive|harmful|risky|dangerous|unsafe|no-go|no-no|frowned\s+upon)"
    r"|right|correct|good\s+(?:idea|call|move|choice|practice)|best\s+practice|(?:the\s+)?way\s+to\s+go"
    r"|recommended|advised|advisable|encouraged|allowed|permitted|required|mandatory|essential|must|wise)"
    r"(?:\s+(?:call|move|choice|approach|way|thing\s+to\s+do))?"
    r"(?:\s*$|(?P<tail>(?=\s+(?:before|after|when|whenever|if|unless|once|while|until|on|in|for)\b)))",
    re.I,
)
# "It is wrong to retry", "it's a good idea to ask first", "it is discouraged to ask": the act
# follows.
_IT_VERDICT_EN = re.compile(
    r"^\s*it(?:'s|’s|\s+is|\s+was)\s+(?P<not>not\s+)?(?:(?:strongly|highly|generally)\s+)?"
    r"(?:(?P<bad>wrong|incorrect|a\s+mistake|an\s+error|a\s+bad\s+idea|unwise|inadvisable|"
    r"ill-advised|discouraged|forbidden|prohibited|counterproductive|harmful|risky|dangerous|unsafe)"
    r"|right|correct|a\s+good\s+idea|wise|better|best|recommended|advisable|encouraged|"
    r"important|essential|required|necessary)\s+to\s+",
    re.I,
)
# No bare 对 (核对, 比对): a verdict ends the clause, after 是 unless it is 不对 / 不正确 / 才对.
_VERDICT_ZH = re.compile(
    r"(?:(?:是|才是|就是|都是)(?:一个|个|一种|种)?(?:(?P<bad>错|错误|不对|不正确|不可取|大忌)|对|正确)"
    r"的?(?:做法|选择|方式)?|(?P<not>(?<!对)不对|不正确|不可取)的?(?:做法|选择)?|才对|没错)\s*$"
)
# The act of a verdict turned down: "not retrying it is wrong", "不重试是错的" ask for it (not
# 不同 / 不断 / 不少 ..., words of their own).
_NOT_FIRST_RE = re.compile(
    r"^\s*(?:not|never)\s+|^\s*(?:不要|不去|没有|没|不(?![同断久少仅但管论过]))", re.I
)
# A verdict on what was said before: "Retry at once? That is wrong.", "这样做是错的。"
_THAT_RE = re.compile(
    r"^\s*(?:that|this|it|doing\s+(?:that|this|so)|这样做|这么做|那样做|这样|那样|这)\s*$", re.I
)
_IF_START_RE = re.compile(
    r"^\s*(?:if|when|whenever|unless|in\s+case)\b|^\s*(?:如果|若|假如|要是|当|一旦)", re.I
)
_PREFER_EN = re.compile(
    r"\b(?:prefer(?:s|red|ring)?|favou?r(?:s|ed|ing)?|choos(?:e|es|ing)|chose|pick(?:s|ed|ing)?|"
    r"select(?:s|ed|ing)?|opt(?:s|ed|ing)?\s+for|go\s+with)\b",
    re.I,
)
# Not "over 10 MB": an amount, not the thing declined. A run of spaces is tried once, from its
# start (``(?<!\s)``): tried from each space, ``\s+`` would read the run to its end each time.
_OVER_RE = re.compile(r"(?<!\s)\s+over\s+(?![\d$€£¥])", re.I)
# The clause ends of ``_ORDER_SPLIT_RE``, kept (group 1) to put the text together again; a dash
# without the spaces around it, which stay in the clauses (``\s*—+`` is tried from every space).
_PLAIN_SPLIT_RE = re.compile(r"([；。!?！？，：\n]+|[;,:](?=\s|$)|\.(?=\s|$)|—+)")


# "Never, ever ask": the comma would leave "never" a clause of its own, read as turning round
# the clause before it, and "ever ask" as asked for.
_NEVER_EVER_RE = re.compile(r"\bnever\s*,\s*ever\b", re.I)


# A Chinese yes-or-no question ("先问用户要不要发票", "确认能不能退款", "可不可以改签") asks about
# an act; it forbids nothing ("不要" inside "要不要" read as one, and the rewordings conflicted).
# (可不可以, 需不需要, 应不应该: the verb's first character is the one said twice.) Only where
# the clause asks (a verb of asking or checking before it, or a question mark after it): "只要不要
# 重复扣款", "最重要不要…", "可能不能…" say 只要 / 重要 / 可能 and then a prohibition (read as a
# question, those opposites merged). A character that makes one word with the first is never one.
_EITHER_ZH_RE = re.compile(
    r"(?<![只重主需想必将就还也概摘首可功才技本职效许认宁应活费作使采利响反适供相答回机社约])"
    r"([要能可该用会需应允行])不\1"
)
_ASKING_ZH_RE = re.compile(
    r"问|确认|核实|核对|确定|看看|看一下|查|检查|判断|决定|知道|了解|弄清|搞清|取决于|考虑|评估|咨询"
)
_CLAUSE_END_ZH_RE = re.compile(r"[，。；！？,.;!?\n]")


def _either_zh(text: str) -> str:
    """``text`` with each yes-or-no question ("要不要") said as "是否要" (``_EITHER_ZH_RE``)."""
    if "不" not in text:
        return text
    out, at = [], 0
    for m in _EITHER_ZH_RE.finditer(text):
        start = max((e.end() for e in _CLAUSE_END_ZH_RE.finditer(text, 0, m.start())), default=0)
        end = _CLAUSE_END_ZH_RE.search(text, m.end())
        asked = (
            _ASKING_ZH_RE.search(text, start, m.start())
            or (end is not None and end[0] in "？?")
            or text[m.end() : end.start() if end else None].rstrip().endswith("吗")
        )
        if asked:
            out += [text[at : m.start()], "是否", m[1]]
            at = m.end()
    out.append(text[at:])
    return "".join(out)


@functools.lru_cache(maxsize=8192)
def _plain(text: str) -> str:
    """Advice with its verdicts on acts and its choices said plainly (``_VERDICT_EN``),
    "isn't" as "is not" (``_expand_not``) and "要不要" as "是否要" (``_either_zh``)."""
    text = _either_zh(_expand_not(text))
    parts = _PLAIN_SPLIT_RE.split(_NEVER_EVER_RE.sub("never", text))
    for i in range(0, len(parts), 2):  # the clauses; the odd parts are what ends them
        parts[i] = _plain_clause(parts[i])
    return "".join(parts)


# An English subject read as an act: a gerund ("retrying it on a 400", "not asking first").
_GERUND_FIRST_RE = re.compile(r"^\s*(?:(?:not|never)\s+)?([a-z]{3,}ing)\b", re.I)
# A subject with a clause of its own ("which tools are forbidden") is not an act.
_IF_WORD_EN = re.compile(
    r"\b(?:when|whenever|if|unless|once|while|where|whose|that|which|what|whether|who|how)\b", re.I
)
# A clause that is only a "no": "Retry at once? No.", "立即重试？不行。"
_NO_RE = re.compile(
    r"^\s*(?:(?:absolutely|definitely|certainly)\s+)?(?:no|nope|not|never)(?:\s*,?\s*ever)?\s*$"
    r"|^\s*(?:绝对|千万|当然)?(?:不行|不可以|不能|不)\s*$",
    re.I,
)


def _verdict_on_act(subject: str, *, plural: bool) -> bool:
    """Whether the subject of an English verdict is an act: a gerund ("retrying it on a 400 is
    wrong"), or an act named as a thing before "are" with no clause of its own ("immediate
    retries of failed uploads are wrong"). Not an order with a clause in it ("ask again when the
    city is wrong", "tell them the date is wrong": the verdict is on the city, the date)."""
    if m := _GERUND_FIRST_RE.match(subject):
        word = m[1].lower()
        return word not in _ING_NOUNS and not word.endswith("thing")
    folded = _fold_concepts(subject)
    return plural and not _IF_WORD_EN.search(subject) and _act_before(folded, len(folded))


def _plain_clause(clause: str) -> str:
    if _NO_RE.match(clause):
        return " never " if clause.isascii() else "不要"
    if (prefer := _PREFER_EN.search(clause)) and (over := _OVER_RE.search(clause, prefer.end())):
        clause = clause[: over.start()] + " instead of " + clause[over.end() :]
    if _IF_START_RE.match(clause):
        return clause  # "if the city is wrong": the situation, not a verdict
    chinese, tail = False, ""
    if m := _IT_VERDICT_EN.match(clause):
        act = clause[m.end() :]
    elif m := _VERDICT_EN.search(clause):
        act = clause[: m.start()]
        tail = clause[m.end() :] if m["tail"] is not None else ""
        plural = bool(m["modal"]) or m[0].split()[0].lower() in ("are", "were")
        if not _THAT_RE.match(act) and not _verdict_on_act(act, plural=plural):
            return clause  # "the response is wrong": a thing, not an act
    elif m := _VERDICT_ZH.search(clause):
        act, chinese = clause[: m.start()], True
    else:
        return clause
    bad = bool(m["bad"]) != (bool(m["not"]) != bool(m.groupdict().get("mnot")))
    if _THAT_RE.match(act):
        # Alone in its clause, a prohibition turns the clause before it round (``stance``).
        return ("不要" if chinese else " never ") if bad else " "
    if negated := _NOT_FIRST_RE.match(act):
        act, bad = act[negated.end() :], not bad
    act += tail
    if not bad:
        return act
    return "不要" + act if chinese else " never " + act


@functools.lru_cache(maxsize=8192)
def _fold_acts(text: str) -> str:
    """``_fold_concepts`` with a look (check, look up, 查一下, 看看) outside quotes read as
    asking, and verdicts and choices said plainly (``_plain``)."""
    text = _plain(text)
    parts, at = [], 0
    for m in _QUOTED_RE.finditer(text):
        parts += [_LOOK_RE.sub(" xask ", text[at : m.start()]), m[0]]
        at = m.end()
    parts.append(_LOOK_RE.sub(" xask ", text[at:]))
    text = "".join(parts)
    for pattern, token in _BOUNDS:
        text = pattern.sub(token, text)
    return _fold_concepts(text)


def _signed_terms(text: str, sign: float, out: dict[str, float]) -> None:
    for term in _terms(text):
        if term in _GENERIC_ACTS or (len(term) == 1 and is_cjk(term)):
            continue
        if term == "xboth":
            # Asking for both is declining "only one"; forbidding both is asking for one (the
            # other terms keep the clause's sign).
            out["xonly"] = out.get("xonly", 0.0) - sign
            continue
        out[term] = out.get(term, 0.0) + sign


def stance(text: str) -> dict[str, float]:
    """What advice tells the agent to do (+1 per mention) and not to do (-1), by term.

    The situation a clause sets ("when no city is given", "读取CSV文件时") counts neither way. A
    dismissal ("… 太慢，不值得", "X is overkill") or a consequence ("immediate retries get the number
    flagged", "X 容易失败") avoids what it speaks of; an act read one way reads its opposite
    (``_ANTONYMS``: asking / guessing a default, haste / waiting) the other way. A clause that
    only answers ("Skip the check? No.", "可不可以跳过确认？可以。") says which way the question
    before it goes, and a "no" on its own turns round the clause before it.
    """
    out: dict[str, float] = {}
    said_read: dict[str, float] = {}  # what the clause before was read as
    said, asked, answered = "", False, False
    for clause, question in _clauses(_fold_acts(text)):
        answer = _answer(clause)
        if answered and answer is not None:
            continue  # "No, you can not.", "不行，不可以。": the answer said again
        read: dict[str, float] = {}
        if said and asked and answer is not None:
            # "Skip the check? No.", "可不可以跳过确认？不可以。": the answer says whether the act
            # asked of is taken; it replaces what the question was read as.
            act: dict[str, float] = {}
            if (plainly := _asked(said, True)) is not said:
                # "Shouldn't you check the order first? Yes.": the act asked of is checking,
                # and "yes" takes it (the question's own "not" is how it is put).
                _read_clause(plainly.strip(), "", act)
            elif said_read:
                act = said_read
            elif order := _ASKED_RE.sub(" ", said).strip():
                _read_clause(order, "", act)  # "是否跳过确认？": read as the order it asks about
            for t in act.keys() | said_read.keys():
                read[t] = answer * act.get(t, 0.0) - said_read.get(t, 0.0)
        elif said and answer is not None and answer < 0:
            # "Retry at once — never.", "猜城市是个坏主意，不要。": a "no" after a statement forbids
            # the act it names; after a prohibition ("不要跳过确认，千万不要。", "Never guess the
            # city. Never.") it says the prohibition again (turned round, opposites merged).
            # A clause already read as a warning ("跳过灰度发布太冒险了，别。", "Loading the whole
            # file blows up memory. Don't.") is said again too.
            warned = (
                said_read
                and all(v < 0 for v in said_read.values())
                and (_RISK_RE.search(said) or _HARM_RE.search(said) or _DISMISS_RE.search(said))
            )
            if warned or any(_NOT_WORD_RE.search(m[0]) for m in _FORBID_RE.finditer(said)):
                pass
            elif said_read and any(v < 0 for v in said_read.values()):
                # "Ignore the Retry-After header. Never.", "Skip the canary stage. Never.": the
                # act turned round is the clause as read (ignoring it), not its bare words.
                for t, v in said_read.items():
                    read[t] = -2.0 * v
            else:
                _signed_terms(said, -2.0, read)
        else:
            _read_clause(clause, said, read)
            if asked:
                # "先核对订单还是直接退款？先核对订单。": the answer takes the option it names and
                # turns down the others (the question read them all as asked for).
                for t in _passed_over(said, clause):
                    read[t] = read.get(t, 0.0) - 2.0
        for t, v in read.items():
            out[t] = out.get(t, 0.0) + v
        said, said_read, asked = clause, read, question
        answered = answer is not None and bool(read)
    signs = {t: math.copysign(1.0, v) for t, v in out.items() if v}
    for a, b in (*_ANTONYMS, *((b, a) for a, b in _ANTONYMS)):
        if a in signs and b not in signs:
            signs[b] = -signs[a]
    return signs


# A clause that only answers the question before it: "Yes.", "No, you can not.", "可以。", "不行。"
# (``_plain`` has already said "no" and "不可以" as "never" and "不要").
_YES_RE = re.compile(
    r"^(?:(?:yes|yeah|yep|sure|of\s+course|absolutely|definitely|certainly|always|correct|right|"
    r"ok|okay)(?:\s+(?:always|so))?|(?:you|we|i|it|they)\s+(?:can|could|should|must|may|do|does|"
    r"will|need\s+to|have\s+to)"
    r"|(?:当然|肯定|一定|必须|务必|绝对)?(?:可以|能|行|要|需要|应该|应当|得|必须|是|是的|对|好|没问题|当然)"
    r"[的了啊呀吧]?)$",
    re.I,
)
_NO_ANSWER_RE = re.compile(
    r"^(?:(?:you|we|i|it|they)\s+(?:can|could|should|must|may|do|does|will|need)\s+not"
    r"|(?:(?:of\s+course|certainly|absolutely|definitely|surely|hell)\s+)?(?:not|no)"
    r"(?:\s+(?:at\s+all|really|ever|way|chance|a\s+chance))?"
    r"|(?:当然|肯定|绝对|千万)?(?:否|不是|不对|不好|不行|不必|不用|不需要|没必要|无需|不应该|不该|不得|"
    r"用不着|别这样|不不不?|不了|有问题|不妥|不太妥|不妥当|欠妥|不合适|最好不要|会出问题|问题很大)"
    r"[的了啊呀吧]?)$",
    re.I,
)
# The negation in a prohibition ("don't", "never", 不要, 别, 勿, 禁止), not a verb that forbids.
_NOT_WORD_RE = re.compile(r"\b(?:not|never|no)\b|n't|n’t|不|别|勿|莫|禁止|甭|绝不|决不|永不", re.I)
# How a question is put, apart from the act it asks about: "can you skip the check", "是否跳过
# 确认", "可以跳过确认吗" ask about skipping the check.
_ASKED_RE = re.compile(
    r"^\s*(?:(?:can|could|may|should|must|shall|will|would|do|does)\s+(?:you|we|i|they|the\s+agent)"
    r"\s+(?:(?:need|have)\s+to\s+)?|is\s+it\s+(?:ok|okay|fine|safe|wise|right|allowed|better)\s+to\s+)"
    r"|是否|能否|可否|吗\s*$",
    re.I,
)


# A question put in the negative: "shouldn't you check …", "isn't it better to check …" (as
# ``_plain`` spells them: "should not you …") ask about checking; what is left is the act.
# Only the contracted forms: "should you not retry?" asks about not retrying ("Correct." is
# "don't"); "isn't it …" only with a word that approves ("isn't it dangerous to retry" is read
# as it stands). In Chinese, "不应该先核对订单吗" asks about checking ("不用。" turns it down).
_NEG_ASKED_RE = re.compile(
    r"^\s*(?:(?:should|must|do|does|did|can|could|would|will)\s+not\s+"
    r"(?:you|we|i|they|the\s+agent)\s+(?:(?:need|have)\s+to\s+)?"
    r"|(?:is|was)\s+not\s+it\s+(?:better|ok|okay|fine|safe|wise|right|best)\s+to\s+"
    r"|would\s+not\s+it\s+be\s+(?:better|safer|wiser|best)\s+to\s+)",
    re.I,
)
_NEG_ASKED_ZH = re.compile(r"(?:难道)?(?:不应该|不应当|不该|不需要)")
# A question offering a choice: "先核对订单还是直接退款？" (``_passed_over``).
_CHOICE_RE = re.compile(r"还是")
# What introduces an answer: "The answer is no.", "A: No.", "答：不可以。".
_ANSWER_LEAD_RE = re.compile(
    r"^\s*(?:(?:so\s+)?the\s+(?:short\s+)?answer\s+is(?:\s+still)?|my\s+answer\s+is|answer\s+is"
    r"|in\s+short|->|=>|→|答案是|回答是|结论是)\s*[:：]?\s*",
    re.I,
)
# The label of a question or an answer, a clause of its own once split at its colon ("Q: …?
# A: No.", "问：…？答：不可以。").
_LABEL_RE = re.compile(
    r"^(?:q|a|question|answer|the\s+answer|short\s+answer|my\s+answer|verdict|in\s+short|tl;?dr"
    r"|问|答|问题|答案|回答|答曰|结论)$",
    re.I,
)


_QUOTES = "\"'“”‘’「」『』()（）[]【】"
# "吗" and a space before more text: a question ends there, unpunctuated.
_MA_GAP_RE = re.compile(r"吗\s+(?=[^\s，。；！？,.;!?])")


def _passed_over(question: str, answer: str) -> set[str]:
    """The terms of the options of a choice (``_CHOICE_RE``) that the clause answering it passes
    over, when it takes one by naming it: "先核对订单还是直接退款？先核对订单。" passes over
    refunding at once. Nothing when it names none ("Is the file UTF-8 or GBK? Check the BOM
    first."), or turns one down ("…？别直接退款。": read as it stands). Chinese only: an
    English "or" often leaves the verb to the first option ("fetch all pages or only the
    first?"), so the option passed over would take the act chosen with it."""
    if not question or not _CHOICE_RE.search(question) or _NOT_WORD_RE.search(answer):
        return set()
    named = _terms(answer)
    options = [_terms(o) for o in _CHOICE_RE.split(question) if o.strip()]
    taken = [o for o in options if o & named]
    if not taken or len(taken) == len(options):
        return set()
    kept = set().union(*taken)
    return {t for o in options if not o & named for t in o} - kept


def _asked(clause: str, question: bool) -> str:
    """A question as the act it asks about: "shouldn't you check the order" asks about checking
    it (its "not" is how it is put: "yes" takes the act, "no" turns it down)."""
    if not question:
        return clause
    if (negative := _NEG_ASKED_RE.match(clause)) and clause[negative.end() :].strip():
        return clause[negative.end() :]
    if is_cjk(clause[0]) and clause.endswith("吗") and (negative := _NEG_ASKED_ZH.search(clause)):
        return clause[: negative.start()] + clause[negative.end() :]
    return clause


# A question tagged on a statement: "…，对吗？", "…, right?" ask about the statement.
_TAG_QUESTION_RE = re.compile(
    r"^(?:对|是|好|行|可以|是否对|是否行|是否可以|是不是|对不对|好不好)吗?$"
    r"|^(?:right|correct|ok|okay|is\s+that\s+(?:right|ok|okay|correct)|is\s+it\s+not|isn't\s+it)$",
    re.I,
)


def _clauses(folded: str, split: re.Pattern[str] = _CLAUSE_SPLIT_RE) -> list[tuple[str, bool]]:
    """The clauses of folded advice, each with whether it asks a question ("…?", "…吗")."""
    out: list[tuple[str, bool]] = []
    at = 0
    folded = _MA_GAP_RE.sub("吗？", folded)  # "可以跳过确认吗 不可以": asked all the same
    for m in split.finditer(folded):
        # '"Skip the check before refund?" No.': the quotes around a question are not words.
        clause = folded[at : m.start()].strip().strip(_QUOTES).strip()
        asked = "?" in m[0] or "？" in m[0] or clause.endswith("吗")
        if asked and out and _TAG_QUESTION_RE.match(clause):
            out[-1] = (out[-1][0], True)  # "跳过确认，对吗？", "skip it, right?": it asks that
        elif _LABEL_RE.match(clause):
            pass  # "Q: …? A: No.": the answer still follows its question
        elif clause:
            out.append((clause, asked))
        at = m.end()
    if clause := folded[at:].strip().strip(_QUOTES).strip():
        out.append((clause, clause.endswith("吗")))
    return out


@functools.lru_cache(maxsize=8192)
def _answer(clause: str) -> float | None:
    """1.0 when a clause only says yes, -1.0 when it only says no ("never", "不要"), else None."""
    if lead := _ANSWER_LEAD_RE.match(clause):
        clause = clause[lead.end() :]
    clause = clause.rstrip(".…。 ")  # "No... never."
    if _YES_RE.match(clause):
        return 1.0
    if _NO_ANSWER_RE.match(clause) or _NO_RE.match(clause):
        return -1.0
    forbid = _FORBID_RE.search(clause) or _NEED_NOT_RE.search(clause)
    if (
        forbid
        and _NOT_WORD_RE.search(forbid[0])  # "skip it", "跳过吧", "avoid it": acts, not a "no"
        and _hollow(clause[: forbid.start()])
        and _hollow(clause[forbid.end() :])
    ):
        return -1.0
    return None


def _read_clause(clause: str, said: str, out: dict[str, float]) -> None:
    """What one clause of folded advice asks for and forbids (``stance``), into ``out``;
    ``said`` is the clause before it."""
    cjk = is_cjk(clause[0])
    situation = _CONDITION_EN.match(clause) or (cjk and _CONDITION_ZH.search(clause))
    if situation and (cjk or not _FORBID_RE.search(clause)):
        # A clause that only sets the scene ("when no city is given"); an English one that
        # forbids ("if in doubt, never guess") still says what not to do.
        return
    # "ask which city before you call get_weather": the tail is the situation;
    # "调用 get_weather 前先确认城市": the head is.
    if mid := _CONDITION_MID_EN.search(clause):
        # "a 125% load test after a brake swap is a waste of a morning": the verdict after
        # the situation still speaks of the head; only the situation itself goes.
        verdict = _DISMISS_RE.search(clause, mid.end())
        clause = clause[: mid.start()] + (" " + clause[verdict.start() :] if verdict else "")
    elif (mid := _CONDITION_MID_ZH.search(clause)) and not _negates(clause[: mid.start()]):
        # "不需要在每次请求时附带 ID": a negation before the situation still governs the act.
        clause = clause[mid.end() :]
    if gated := _until(clause):
        # "don't approve the claim until you've checked the policy": wait, and do what
        # follows "until"; the act held back is neither asked for nor forbidden.
        out["xwait"] = out.get("xwait", 0.0) + 1.0
        _signed_terms(gated[1], 1.0, out)
        return
    if (
        (held := _HELD_ON_RE.search(clause))
        and not _FORBID_RE.search(clause, 0, held.start())
        and not _TILL_RE.search(clause, held.end())
    ):
        # "hold off on retrying the refund", "wait with the refund": waiting, and not the act
        # ("hold off on booking the pickers till …" holds it back for a while: read as before).
        out["xwait"] = out.get("xwait", 0.0) + 1.0
        _avoid(clause[held.end() :], out)
        return
    if _PURPOSE_RE.match(clause):
        # "so you don't create a duplicate", "以免重复扣款", "不然最后一天会漏掉": why, not
        # which act (one lesson's purpose is another's "otherwise"): read neither way.
        return
    dismissed = _DISMISS_RE.search(clause)
    if dismissed and dismissed["means"] and not _act_before(clause, dismissed.start()):
        dismissed = None
    if dismissed:
        head, tail = clause[: dismissed.start()], clause[dismissed.end() :]
        if _terms(head) or not (said or _terms(tail)):
            _avoid(head, out)
        elif _terms(tail):
            # "用不着先在预发布环境跑一遍", "没必要先备份": the dismissal comes before its act.
            _avoid(tail, out)
        else:
            # "…, CONCURRENTLY 太慢而且容易失败, 不值得": a dismissal on its own speaks of the
            # clause before it, which was read as asked for: turn it round.
            _signed_terms(said, -2.0, out)
        return
    risk = _RISK_RE.search(clause)
    if risk is None and (harm := _HARM_RE.search(clause)):
        risk = harm if _act_before(clause, harm.start()) else None
    if risk and not _OUTCOME_RE.match(clause) and not _FORBID_RE.search(clause[: risk.start()]):
        # A consequence told of an act is a reason not to take it; a clause of purpose or
        # outcome ("otherwise it fails", "否则会失败") speaks of not following the advice.
        _avoid(clause[: risk.start()], out)
        return
    forbid, exclude = _FORBID_RE.search(clause), _EXCLUDE_RE.search(clause)
    cut = min((m for m in (forbid, exclude) if m), key=lambda m: m.start(), default=None)
    if cut is None:
        _signed_terms(clause, 1.0, out)
        return
    if cut is exclude:
        _signed_terms(clause[: cut.start()], 1.0, out)
    elif again := _FORBID_RE.match(clause, _skip_space(clause, cut.end())):
        # "never skip the checksum", "千万不要跳过校验": forbidding a skip asks for the act.
        _signed_terms(clause[again.end() :], 1.0, out)
        return
    elif without := _WITHOUT_RE.search(clause, cut.end()):
        # "never call unlock_door without the PIN", "不要未经确认就删除": two negations ask
        # for what follows "without"; the act itself is allowed once that is done.
        stop = _WITHOUT_END_RE.search(clause, without.end())
        _signed_terms(clause[without.end() : stop.start() if stop else None], 1.0, out)
        return
    if said and _hollow(clause[cut.end() :]) and _hollow(clause[: cut.start()]):
        # "核对订单没有意义，跳过。", "…? Skip it.": a verb that forbids, on its own, speaks of
        # the clause before it (a bare "no" is read in ``stance``).
        _signed_terms(said, -2.0, out)
        return
    _avoid(clause[cut.end() :], out)


# Words that only stress a prohibition: "Retry at once? Absolutely never.", "立即重试？永远不要。"
_STRESS_RE = re.compile(
    r"\b(?:absolutely|definitely|certainly|really|ever|at\s+all|please)\b"
    r"|永远|千万|万万|绝对|坚决|根本|一定|请",
    re.I,
)


def _hollow(text: str) -> bool:
    """Whether text names nothing once the words stressing a prohibition are gone."""
    return not _terms(_STRESS_RE.sub(" ", text))


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


# Negations that say an act is not needed ("不需要", "无需", "no need to"), besides prohibitions.
_NEED_NOT_RE = re.compile(r"不需要|无需|无须|不用|不必|\bno\s+need\b|\bneed\s+not\b", re.I)


def _negates(text: str) -> bool:
    """Whether text holds a prohibition or says an act is not needed."""
    return bool(_FORBID_RE.search(text) or _NEED_NOT_RE.search(text))


_UNTIL_RE = re.compile(r"\bxwait\s+xuntil\b")
_HELD_RE = re.compile(r"\bxwait\b")
# "hold off on retrying", "wait with the refund" (not "wait on the webhook": wait for it).
_HELD_ON_RE = re.compile(r"\bxwait\s+(?:with\s+(?=\S)|on\s+(?=(?:x[a-z]+|[a-z]{3,}ing)\b))", re.I)
_TILL_RE = re.compile(r"\b(?:xuntil|until|till)\b", re.I)


def _until(clause: str) -> tuple[str, str] | None:
    """(the act held back, the step to take first) of "don't A until B" / "hold off on A until
    B" (a folded clause); None for any other clause ("poll until it is done" asks for the poll)."""
    m = _UNTIL_RE.search(clause)
    if m is None:
        return None
    head, tail = clause[: m.start()], clause[m.end() :]
    if not (_FORBID_RE.search(head) or _HELD_RE.search(head)) or not _terms(tail):
        return None
    return _FORBID_RE.sub(" ", _HELD_RE.sub(" ", head)), tail


def _avoid(text: str, out: dict[str, float]) -> None:
    if _NOW_RE.search(text):
        # "never retry immediately", "不要立即重试": what is forbidden is the haste, not the
        # act; the act itself is neither asked for nor forbidden by this clause.
        out["xnow"] = out.get("xnow", 0.0) - 1.0
        return
    _signed_terms(text, -1.0, out)


# A clause of purpose or of what happens otherwise: what the advice is for, not an act.
_PURPOSE_RE = re.compile(
    r"^\s*(?:so(?:\s+that)?\s+(?:you|we|it|they|the|he|she|this|these|those|there|nothing)\b"
    r"|in\s+order\s+(?:to|not\s+to)\b|to\s+avoid\b"
    r"|otherwise\b|or\s+else\b|否则|不然|要不然|以免|免得|以防|防止)",
    re.IGNORECASE,
)
_WITHOUT_RE = re.compile(r"\bwithout\b|未经|没有经过|没经过", re.I)
_WITHOUT_END_RE = re.compile(r"就|的情况下|之前")

#: Acts where taking one is declining the other.
_ANTONYMS = (("xask", "xguess"), ("xnow", "xwait"), ("xbatch", "xeach"), ("xmin", "xmax"))

# Consequences: what precedes is avoided ("immediate retries get the sender flagged").
_RISK_RE = re.compile(
    r"\b(?:gets?|got|will\s+get|can\s+get|may\s+get)\s+(?:[\w'-]+\s+){0,4}?(?:flagged|banned|"
    r"blocked|throttled|rejected|suspended|locked|lost|corrupted|overwritten)\b"
    r"|\b(?:causes?|leads?\s+to|results?\s+in|breaks?|corrupts?|risks?)\b"
    r"|容易(?:失败|出错|超时|丢|被|卡)|会(?:失败|出错|超时|丢失|卡住|卡死|被(?:封|拒|限流|拉黑|标记|锁))"
    r"|导致(?!的)"
    # "X backfires", "X 反而 Y" (X, on the contrary, brings Y): what precedes defeats its end.
    r"|\b(?:backfires?|is\s+counterproductive|does\s+more\s+harm\s+than\s+good|"
    r"(?:only|just)\s+makes?\s+(?:it|things|matters|them)\s+worse)\b|(?<=.)反而",
    re.IGNORECASE,
)
# Harm an act can do ("pulling it up all at once can snap old strings"), read as a consequence
# only when an act is what can do it (``_act_before``): "a new string can snap at
# the coil" is the danger a precaution is for, not an act to avoid.
_HARM_RE = re.compile(
    r"\b(?:can|could|may|might|will)\s+(?:easily\s+)?(?:snap|crack|burst|tear|ruin|damage|"
    r"destroy|overload|overheat|fry|kill|crash|warp|shatter|scorch|melt|deform|jam|clog)\b",
    re.IGNORECASE,
)
# A gerund (a stem of four letters at least: not "string"), unless an article makes it a noun
# ("a worn bearing", "the ceiling fan"; group 1) or it is one of the nouns in ``_ING_NOUNS``.
_GERUND_RE = re.compile(
    r"\b(?:(a|an|the|this|that|its|every|each|any|no)\s+(?:[a-z'-]+\s+)?)?['\"‘“]?([a-z]{4,}ing)\b",
    re.I,
)
# Nouns and adjectives in -ing ("by morning frost", "a pending status").
_ING_NOUNS = frozenset({
    "morning", "evening", "ceiling", "bearing", "fitting", "building", "housing", "casing",
    "tubing", "wiring", "piping", "lightning", "clothing", "bedding", "pudding", "pending",
    "missing", "existing", "remaining", "incoming", "outgoing", "upcoming", "following",
    "matching", "corresponding", "leading", "trailing",
})  # fmt: skip
_ACT_TOKEN_RE = re.compile(r"\b(?:" + "|".join(sorted(_CONCEPT_TOKENS)) + r")\b")


def _act_before(clause: str, end: int) -> bool:
    """Whether an act (a gerund or an act of the lexicon: "pulling it up", ``xbatch``) comes
    before ``end`` in a clause: what can do a harm or bring nothing, not a thing ("a new string",
    "anything metal", "by morning frost")."""
    if _ACT_TOKEN_RE.search(clause, 0, end):
        return True
    return any(
        not m[1] and (word := m[2].lower()) not in _ING_NOUNS and not word.endswith("thing")
        for m in _GERUND_RE.finditer(clause, 0, end)
    )


# A clause telling what happens when the advice is not followed, or why it is given.
_OUTCOME_RE = re.compile(
    r"^\s*(?:(?:otherwise|or|else|so|because|since|as)\b|否则|不然|要不然|免得|以免|以防|因为|这样)",
    re.IGNORECASE,
)

# Order: "先 A 再 B" / "A before B" / "B after A" name A first. Two lessons naming one act first
# and the other later are opposed (``order_opposition``), whatever their polarity.
_LATER_ZH = re.compile(
    r"然后再|然后|之后再|以后再|后再|随后|(?<![不要别没勿])再(?!次|也|三)|(?<![刚方])才"
)
_LATER_EN = re.compile(r"\b(?:then|afterwards|later|after\s+that|only\s+then)\b", re.I)
_FIRST_RE = re.compile(r"首先|先|\bfirst\b", re.I)
_BEFORE_EN = re.compile(r"\bbefore\b", re.I)
_AFTER_EN = re.compile(r"\b(?:after|once)\b", re.I)
_BEFORE_ZH_MID = re.compile(r"(?:之前|以前|前)\s*(?:先|首先|要先|得先|务必先|一定要先)")
_FIRST_THEN_ZH = re.compile(r"先(?P<a>[^先后]+?)(?<![之以然过])后(?![果面台端续悔来])(?P<b>.+)")
_BEFORE_ZH_END = re.compile(r"(?:之前|以前|前)\s*$")
_AFTER_ZH_END = re.compile(r"(?:之后|以后|后)\s*$")


def _order(text: str) -> tuple[set[str], set[str]]:
    """The terms advice names as done first and as done later."""
    first: set[str] = set()
    later: set[str] = set()
    pending: set[str] | None = None  # where the clause after a "before …" / "… 之后" clause goes
    clauses = _order_clauses(text)
    for i, (clause, asked) in enumerate(clauses):
        target, pending = pending, None
        if gated := _until(clause):
            # "hold off on tm_commit until review sign-off": the review first.
            later |= _content(gated[0])
            first |= _content(gated[1])
            continue
        ahead, behind = first, later
        answer = _answer(clauses[i + 1][0]) if asked and i + 1 < len(clauses) else None
        if asked and i + 1 < len(clauses) and _passed_over(clause, clauses[i + 1][0]):
            continue  # "先核对订单还是直接退款？先核对订单。": the answer chooses
        clause, negated = _unsay_order(_asked(clause, answer is not None))
        if answer == -1.0:
            negated = not negated  # "Skip the check before you pay? No.": turned down
        if negated:
            # "don't publish before you ask", "不能先放行后补报", "listing them first is a waste
            # of time": the order turned down is the other one asked for.
            ahead, behind = later, first
        if m := _BEFORE_ZH_MID.search(clause):
            # "执行 rm 之前先用 ls 看一下": the head comes later.
            behind |= _content(clause[: m.start()])
            ahead |= _content(clause[m.end() :])
            continue
        if m := _FIRST_THEN_ZH.search(clause):
            # "先收款后发货": a bare 后 after 先 is "then".
            ahead |= _content(m["a"])
            behind |= _content(m["b"])
            continue
        if m := _LATER_ZH.search(clause) or _LATER_EN.search(clause):
            head, tail = clause[: m.start()], clause[m.end() :]
            if not _content(tail) and m.group().lower() in ("later", "afterwards"):
                # "photos can be attached later": the clause ending so is the later step.
                behind |= _content(head)
                continue
            ahead |= _content(_FIRST_RE.sub(" ", head))
            behind |= _content(tail)
            continue
        if is_cjk(clause[0]) and _BEFORE_ZH_END.search(clause):
            behind |= _content(clause)
            pending = ahead
            continue
        if is_cjk(clause[0]) and _AFTER_ZH_END.search(clause):
            ahead |= _content(clause)
            pending = behind
            continue
        if m := _BEFORE_EN.search(clause):
            behind |= _content(clause[m.end() :])
            if clause[: m.start()].strip():
                ahead |= _content(clause[: m.start()])
            else:
                pending = ahead
            continue
        if m := _AFTER_EN.search(clause):
            ahead |= _content(clause[m.end() :])
            if clause[: m.start()].strip():
                behind |= _content(clause[: m.start()])
            else:
                pending = behind
            continue
        if m := _FIRST_RE.search(clause):
            ahead |= _content(clause[: m.start()] + " " + clause[m.end() :])
        elif _NOW_RE.search(clause):
            # "submit the claim right away", "直接提交": done before anything else.
            ahead |= _content(clause)
        elif target is not None:
            target |= _content(clause)
    return first - later, later - first


_ORDER_WORD_EN = re.compile(r"\b(?:first|then|later|afterwards|after|before|once)\b", re.I)
_ORDER_WORDS = (
    _BEFORE_ZH_MID,
    _FIRST_THEN_ZH,
    _LATER_ZH,
    _LATER_EN,
    _FIRST_RE,
    _BEFORE_EN,
    _AFTER_EN,
    _NOW_RE,
)


def _unsay_order(clause: str) -> tuple[str, bool]:
    """A clause of ``_order`` without the words that turn its order down, and whether they do:
    an odd number of prohibitions before its first order word ("don't A before B", "不能先 A 后
    B"; "never skip A before B" asks for it), or a dismissal ("A first is a waste of time")."""
    at = min((m.start() for p in _ORDER_WORDS if (m := p.search(clause))), default=None)
    if at is None:
        return clause, False
    forbids = list(_FORBID_RE.finditer(clause, 0, at))
    dismissal = _DISMISS_RE.search(clause)
    negated = (len(forbids) + (dismissal is not None)) % 2 == 1
    if not negated:
        return clause, False
    spans = sorted([m.span() for m in forbids] + ([dismissal.span()] if dismissal else []))
    kept, last = [], 0
    for start, stop in spans:
        kept.append(clause[last:start])
        last = max(last, stop)
    kept.append(clause[last:])
    return " ".join(kept), True


def _order_clauses(text: str) -> list[tuple[str, bool]]:
    """Clauses of advice, for ``_order``, each with whether it asks a question (``_clauses``);
    an English clause with two order words is two steps ("add the new record first and remove
    the old one only after traffic moved")."""
    out: list[tuple[str, bool]] = []
    for clause, asked in _clauses(_fold_acts(text), _ORDER_SPLIT_RE):
        if len(_ORDER_WORD_EN.findall(clause)) >= 2:
            steps = [c.strip() for c in re.split(r"\s+and\s+", clause, flags=re.I) if c.strip()]
            out.extend((step, asked and i == len(steps) - 1) for i, step in enumerate(steps))
        else:
            out.append((clause, asked))
    return out


def _content(text: str) -> set[str]:
    terms = {t for t in _terms(text) if t not in _GENERIC_ACTS and not (len(t) == 1 and is_cjk(t))}
    # "Retry-After" is a value, not the act of retrying: drop the parts of a hyphenated term.
    parts = {part for t in terms if "-" in t for part in t.split("-")}
    # "call submit_claim" and "submit the claim" name one act: a tool's words count too.
    words = {w for t in terms if _SNAKE_RE.match(t) for w in tokenize(t.replace("_", " "))}
    return (terms - parts) | {w for w in words if len(w) > 3 and w not in _GENERIC_ACTS}


def order_opposition(a: str, b: str) -> float:
    """The weight of the acts one piece of advice takes first and the other later."""
    a_first, a_later = _order(a)
    b_first, b_later = _order(b)
    # Both acts must swap: one act named first by one and later by the other may be the same
    # order told from another step ("list the files, then rm" / "before rm, run ls").
    one_way, other_way = a_first & b_later, a_later & b_first
    if not one_way or not other_way:
        return 0.0
    swapped = one_way | other_way
    return sum(0.25 if _SNAKE_RE.match(t) else _term_weight(t) ** 2 for t in swapped)


# Conditions: "A unless C" does A where C does not hold; "A if C", "A only when C", "A even
# when C" where it does. ``stance`` reads the act and drops the situation, so "retry unless the
# server returns 400" and "retry only when it returns 400" read alike and merged. A condition
# word and the condition it opens; group ``neg``: A is done where it does not hold.
_IF_EN = re.compile(
    r"\b(?:(?P<neg>unless|except\s+(?:when|if|where)|but\s+not\s+(?:when|if))"
    r"|(?:(?:only|just|solely|even)\s+)?(?:when(?:ever)?|if)|in\s+case(?:\s+of)?)\b",
    re.I,
)
# Not 若干 (some).
_IF_ZH = re.compile(
    r"(?P<neg>除非)|只有在?|只在|仅在|仅当|即使|即便|哪怕|就算|如果|若(?!干)|假如|要是|一旦"
)
# Where a condition ends: a comma, "then", 时 / 的话 / 才 / 就 / 也 / 否则 (not 小时, 超时, 就算).
_IF_END_RE = re.compile(
    r"[，]|,(?=\s)|\bthen\b|(?<![小按准及同临实定计超暂])(?:的时候|时候|时)(?![区间候刻长效段差])"
    r"|的话|才|就(?!算)|也|否则|不然",
    re.I,
)
# The words that join a condition to its act, once the condition is gone.
_IF_JOIN_RE = re.compile(
    r"(?:的时候|时候|时|的话)?[\s,，]*(?:then\b|otherwise\b|否则|不然|要不然|才|就|也)?", re.I
)
# 时 / 的话 closing a condition no word opened ("页面返回 404 时重试"; not 小时, 超时, 同时).
_WHEN_ZH = re.compile(r"(?<![小按准及同临实定计超暂])(?:的时候|时候|时)(?![区间候刻长效段差])|的话")
# A negated condition ("unless no city was given", "如果用户没说城市") holds where its words do not.
_IF_NOT_RE = re.compile(
    r"\b(?:not|no|never|without)\b|没有|没|未(?!来)|不(?![同断久少仅但管论过])|无(?!论)", re.I
)
_SENTENCE_RE = re.compile(r"[;!?。；！？\n]+|\.(?=\s|$)")
#: Conditions read per sentence, and in all: enough for advice, bounded for a 30,000-character
#: import (``condition_opposition`` compares each of one text's with each of the other's).
MAX_CONDITIONS = 4
MAX_CONDITIONS_PER_TEXT = 8


@functools.lru_cache(maxsize=8192)
def _conditions(text: str) -> tuple[tuple[frozenset[str], float, str], ...]:
    """(the condition's terms, +1 where the act is done when it holds / -1 when it does not,
    the act) for each condition advice sets: "retry the upload unless the server returns 400"
    is ({server, return, 400}, -1, "retry the upload"); "除非 C，否则 A" and "A，除非 C" read
    as "A unless C", "只有 C 时才 A", "即使 C 也 A" and "如果 C，A" as "A if C"."""
    out: list[tuple[frozenset[str], float, str]] = []
    for sentence in _SENTENCE_RE.split(_plain(text)):
        # (where the condition starts, where its words start, whether A is done where it does
        # not hold); islice: a sentence's first few are read (``MAX_CONDITIONS``).
        heads = [
            (m.start(), m.end(), bool(m["neg"]))
            for p in (_IF_EN, _IF_ZH)
            for m in itertools.islice(p.finditer(sentence), MAX_CONDITIONS)
        ]
        for m in itertools.islice(_WHEN_ZH.finditer(sentence), MAX_CONDITIONS):
            # "页面返回 404 时重试": a condition with no word before it runs from its piece's start.
            piece = max(sentence.rfind("，", 0, m.start()), sentence.rfind(",", 0, m.start())) + 1
            if not any(piece <= at < m.start() for at, _, _ in heads):
                heads.append((piece, piece, False))
        heads = sorted(heads)[:MAX_CONDITIONS]
        conditions: list[tuple[frozenset[str], float]] = []
        act, at = [], 0
        for i, (start, words_at, neg) in enumerate(heads):
            limit = heads[i + 1][0] if i + 1 < len(heads) else len(sentence)
            end = _IF_END_RE.search(sentence, words_at, limit)
            stop = end.start() if end else limit
            words = sentence[words_at:stop]
            sign = -1.0 if neg else 1.0
            if len(_IF_NOT_RE.findall(words)) % 2:
                sign = -sign
            if terms := _terms(_fold_concepts(_IF_NOT_RE.sub(" ", words))):
                conditions.append((terms, sign))
            act.append(sentence[at:start])
            joined = _IF_JOIN_RE.match(sentence, stop)  # matches the empty string at least
            at = max(at, joined.end() if joined else stop)
        act.append(sentence[at:])
        said = " ".join(act)
        out.extend((terms, sign, said) for terms, sign in conditions)
        if len(out) >= MAX_CONDITIONS_PER_TEXT:
            break
    return tuple(out[:MAX_CONDITIONS_PER_TEXT])


def _same_condition(a: frozenset[str], b: frozenset[str]) -> bool:
    """Two conditions of the same words, mostly, and of the same values (400 is not 404)."""
    if (
        not a
        or not b
        or {t for t in a if _WEIGHTED_TERM_RE.search(t)}
        != {t for t in b if _WEIGHTED_TERM_RE.search(t)}
    ):
        return False
    shared = sum(_term_weight(t) ** 2 for t in a & b)
    norm = math.sqrt(sum(_term_weight(t) ** 2 for t in a) * sum(_term_weight(t) ** 2 for t in b))
    return shared / norm >= 0.5


def condition_opposition(a: str, b: str) -> float:
    """The weight of the acts two pieces of advice take opposite ways under one condition: done
    "unless C" by one and "only when C" (or "even when C", "if C") by the other, or done by one
    where C holds and declined there by the other."""
    best = 0.0
    read: dict[str, dict[str, float]] = {}  # one sentence's conditions share its act
    for cond_a, sign_a, act_a in _conditions(a):
        for cond_b, sign_b, act_b in _conditions(b):
            if not _same_condition(cond_a, cond_b):
                continue
            for act in (act_a, act_b):
                if act not in read:
                    read[act] = stance(act)
            sa, sb = read[act_a], read[act_b]
            best = max(
                best,
                sum(
                    _term_weight(t) ** 2
                    for t in sa.keys() & sb.keys()
                    if sa[t] * sign_a != sb[t] * sign_b
                ),
            )
    return best


def stance_relation(a: str, b: str) -> tuple[float, float]:
    """(opposition, agreement) of two pieces of advice: the weight of the terms one prefers and
    the other avoids, and of those both take the same way (``stance``), plus the acts they take
    in opposite order (``order_opposition``)."""
    sa, sb = stance(a), stance(b)
    opposed = order_opposition(a, b) + condition_opposition(a, b)
    agreed = 0.0
    # "withdraw it with weed_collection" / "don't weed it": a tool's word said by itself on one
    # side is the tool's act; a tool both name (weighed below) brings no words of its own.
    tools_a, tools_b = _tool_words(sa), _tool_words(sb)
    for one, other, own, others in ((sa, sb, tools_a, tools_b), (sb, sa, tools_b, tools_a)):
        for word, tool in own.items():
            said_alone = word in other and word not in one and word not in others
            if said_alone and one[tool] != other[word]:
                opposed += _term_weight(word) ** 2
    for term in sa.keys() & sb.keys():
        # A tool both mention says little on its own: most lessons of a task type call it.
        weight = 0.25 if _SNAKE_RE.match(term) else _term_weight(term) ** 2
        if sa[term] == sb[term]:
            agreed += weight
        else:
            opposed += weight
    # A choice turned round ("use upload_file rather than upload_chunked" / the two swapped):
    # one tool each way is no stance read off the wording of a situation, it is the advice.
    swapped = _tools_swapped(sa, sb)
    if all(swapped):
        opposed += 0.75 * sum(map(len, swapped))
    return opposed, agreed


def _tools_swapped(sa: Mapping[str, float], sb: Mapping[str, float]) -> list[set[str]]:
    """The snake_case tools the first stance takes and the second declines, and those the first
    declines and the second takes."""
    shared = [t for t in sa.keys() & sb.keys() if _SNAKE_RE.match(t) and sa[t] != sb[t]]
    return [{t for t in shared if sa[t] == sign} for sign in (1.0, -1.0)]


def _tools_chosen(sa: Mapping[str, float], sb: Mapping[str, float]) -> bool:
    """Both stances take one snake_case tool and decline another, the same ones ("use read_csv,
    not read_excel" / "prefer read_csv over read_excel")."""
    shared = [sa[t] for t in sa.keys() & sb.keys() if _SNAKE_RE.match(t) and sa[t] == sb[t]]
    return 1.0 in shared and -1.0 in shared


def _tool_words(signs: Mapping[str, float]) -> dict[str, str]:
    """The words of the snake_case tools a stance names (``weed`` of ``weed_collection``), each
    with its tool."""
    return {
        word: term
        for term in signs
        if _SNAKE_RE.match(term)
        for word in tokenize(term.replace("_", " "))
        if len(word) > 3 and word not in _GENERIC_ACTS
    }


# Values the tokenizer does not keep whole: an argument set (``sep=';'``, ``thousands=','``:
# the name is kept, the value dropped) and a keyword written in capitals (``LIMIT``, ``NOT NULL``).
# The name is group 1, the assignment runs from its start (``_assigned``); a match starts where a
# run of name characters starts, skipping what comes before the first letter or underscore
# (digits, dots, dashes, Chinese): see _IDENTIFIER_RE.
_ASSIGNED_RE = re.compile(
    r"(?<![\w.-])(?:[^\W_A-Za-z]|[.-])*"
    r"([A-Za-z_][\w.-]*)\s*=\s*(?:'[^']*'|\"[^\"]*\"|[^\s,;，。；]+)"
)
_CAPITALS_RE = re.compile(r"(?<![\w$])[A-Z]{2,}(?:\s+[A-Z]{2,})*(?![\w$])")


@functools.lru_cache(maxsize=8192)
def _named_values(text: str) -> frozenset[str]:
    """The argument values (whole: ``sep=';'`` is not ``sep=','``) and capitalised keywords
    advice names: the same one asked for by two lessons is a concrete value they share
    (``agreement_shown``)."""
    return _assigned_values(text) | {m[0] for m in _CAPITALS_RE.finditer(text)}


@functools.lru_cache(maxsize=8192)
def _assigned_values(text: str) -> frozenset[str]:
    """The arguments advice sets, whole (``sep=';'``, ``thousands=','``)."""
    return frozenset(
        re.sub(r"\s+", "", text[m.start(1) : m.end()]).lower() for m in _ASSIGNED_RE.finditer(text)
    )


def _readable(term: str) -> bool:
    """A term whose sense the rules know: a concrete value (``utf-8-sig``, ``sep=';'``, 429) or
    an act of the concept lexicon (``xask``, ``xwait``, ``xbatch``...)."""
    return term in _CONCEPT_TOKENS or bool(_WEIGHTED_TERM_RE.search(term))


def agreement_shown(a: str, b: str) -> bool:
    """Whether the rules can show two near pieces of advice say the same thing: they take at
    least ``MIN_AGREEMENT`` of weight of *readable* terms (``_readable``) the same way, or they
    name the same steps in the same order.

    Shared words of any other kind prove nothing: two lessons about one situation share its
    words whichever way they advise, and on pairs written without this code the opposites
    ("in batches of 100" / "one record at a time"; "reuse the snapshot, calling get_traffic
    again burns quota" / "call get_traffic again, the snapshot is stale") share *more* words
    than the rewordings do (``bench/curation``). A near pair the rules cannot read goes to a
    person or the judge; a missed merge leaves a duplicate, a wrong one loses a lesson.
    (Terms one prefers and the other avoids are weighed before, by ``stance_relation``.)
    """
    sa, sb = stance(a), stance(b)
    # A value both name (``sep=';'``, ``LIMIT``) is readable even where the tokenizer kept only
    # part of it.
    named = {t for value in _named_values(a) & _named_values(b) for t in _terms(value)}
    shared = sum(
        _term_weight(t) ** 2
        for t in sa.keys() & sb.keys()
        if sa[t] == sb[t] and (_readable(t) or t in named)
    )
    if shared >= MIN_AGREEMENT or _tools_chosen(sa, sb):
        # The same choice of tools (one taken, one declined) is as concrete as a value.
        return True
    a_first, a_later = _order(a)
    b_first, b_later = _order(b)
    return bool(a_first & b_first) and bool(a_later & b_later)


def _arguments(text: str) -> dict[str, set[str]]:
    """The values advice sets each argument to (``retries=3``: retries -> {3}), quotes and
    spaces aside."""
    out: dict[str, set[str]] = {}
    for value in _assigned_values(text):
        name, _, val = value.partition("=")
        out.setdefault(name, set()).add(val.strip("'\"`"))
    return out


def values_clash(a: str, b: str) -> bool:
    """Whether two pieces of advice set one argument to different values, with no value in
    common (``retries=3`` / ``retries=0``; not ``sep=';'`` / "not sep=',', use sep=';'")."""
    args_a, args_b = _arguments(a), _arguments(b)
    return any(args_a[name].isdisjoint(args_b[name]) for name in args_a.keys() & args_b.keys())


def _values_asked(text: str) -> frozenset[str]:
    """The concrete values advice asks for: terms it takes as +1 (``stance``) that are values
    (``utf-8-sig``, 5%, -16) or part of a value it names whole (``sep=';'``, ``LIMIT``)."""
    named = {t for value in _named_values(text) for t in _terms(value)}
    return frozenset(
        t
        for t, sign in stance(text).items()
        if sign > 0 and (_WEIGHTED_TERM_RE.search(t) or t in named)
    )


def values_agree(a: str, b: str) -> bool:
    """Whether two pieces of advice ask for the same concrete values, at least
    ``MIN_AGREEMENT`` of weight of them, and neither asks for a value (a number, a quoted or
    assigned one) the other does not: "retry 3 times" and "wait 3 seconds, retry 5 times" share
    a 3 and are not one lesson."""
    va, vb = _values_asked(a), _values_asked(b)
    if any(_WEIGHTED_TERM_RE.search(t) for t in va ^ vb):
        return False
    # A keyword in capitals (UTC, LIMIT) is a value two near lessons can share; with fewer words
    # in common it is as often the object both speak of ("stored in UTC").
    assigned = {t for value in _assigned_values(a) & _assigned_values(b) for t in _terms(value)}
    shared = sum(
        _term_weight(t) ** 2 for t in va & vb if t in assigned or _WEIGHTED_TERM_RE.search(t)
    )
    return shared >= MIN_AGREEMENT


# Stance-bearing words that come in opposite pairs (a direction, a switch, a fate), EN and ZH:
# (name, the words one way, the words the other way).
_POLES = (
    ("amount",
     re.compile(r"\b(?:more|higher|increas(?:e|es|ed|ing)|rais(?:e|es|ed|ing)|larger|bigger|longer|"
                r"extend(?:s|ed|ing)?)\b|增加|提高|加大|调高|调大|扩大|增大|延长|更多|更长|更高", re.I),
     re.compile(r"\b(?:less|fewer|lower(?:s|ed|ing)?|decreas(?:e|es|ed|ing)|reduc(?:e|es|ed|ing)|smaller|"
                r"shorter|shorten(?:s|ed|ing)?)\b|减少|降低|减小|调低|调小|缩小|缩短|更少|更短|更低", re.I)),
    ("switch",
     re.compile(r"\b(?:enabl(?:e|es|ed|ing)|(?:turn|switch)(?:s|ed|ing)?\s+on)\b|开启|打开|启用|开着", re.I),
     re.compile(r"\b(?:disabl(?:e|es|ed|ing)|(?:turn|switch)(?:s|ed|ing)?\s+off)\b|关闭|关掉|禁用|关上|关着", re.I)),
    ("fate",
     re.compile(r"\b(?:keep(?:s|ing)?|kept|retain(?:s|ed|ing)?|preserv(?:e|es|ed|ing))\b|保留|留着|留下", re.I),
     re.compile(r"\b(?:delet(?:e|es|ed|ing)|remov(?:e|es|ed|ing)|discard(?:s|ed|ing)?|purg(?:e|es|ed|ing)|"
                r"wip(?:e|es|ed|ing)|strip(?:s|ped|ping)?|trim(?:s|med|ming)?|truncat(?:e|es|ed|ing))\b"
                r"|删除|删掉|清除|移除|清空|丢弃|去掉|去除|剔除|截断", re.I)),
    ("include",
     re.compile(r"\b(?:includ(?:e|es|ed|ing)|inclusive)\b|包含|包括|带上|加上", re.I),
     re.compile(r"\b(?:exclud(?:e|es|ed|ing)|exclusive|leav(?:e|es|ing) out|left out)\b|排除|不含|不包括|不带", re.I)),
    ("hand",
     re.compile(r"\b(?:manual(?:ly)?|by hand)\b|手动|手工|人工", re.I),
     re.compile(r"\b(?:automatic(?:ally)?|auto|automated)\b|自动", re.I)),
    ("fresh",
     re.compile(r"\b(?:cach(?:e|es|ed|ing)|reus(?:e|es|ed|ing)|memoi[sz](?:e|es|ed|ing))\b|缓存|复用|重用", re.I),
     re.compile(r"\b(?:fresh|refresh(?:es|ed|ing)?|re-?fetch(?:es|ed|ing)?|each time|every time)\b"
                r"|实时|刷新|重新获取|重新查|每次都", re.I)),
    ("disclose",
     re.compile(r"\b(?:announc|disclos|reveal|publici[sz])(?:e|es|ed|ing)\b|公布|公开|告知|透露|宣布|披露", re.I),
     re.compile(r"\b(?:conceal(?:s|ed|ing)?|withh[oe]ld(?:s|ing)?|(?:keep(?:s|ing)?|kept)\s+(?:[\w'-]+\s+){0,3}?"
                r"(?:secret|confidential|private|hidden|under\s+wraps))\b|保密|隐瞒|瞒着", re.I)),
    ("sync",
     re.compile(r"\bsynchronous(?:ly)?\b|同步", re.I),
     re.compile(r"\basynchronous(?:ly)?\b|\basync\b|异步", re.I)),
    ("age",
     re.compile(r"\b(?:newest|latest|most\s+recent)\b|最新|最近的", re.I),
     re.compile(r"\b(?:oldest|earliest|least\s+recent)\b|最早|最旧|最老", re.I)),
    ("often",
     re.compile(r"\b(?:usually|often|frequently|mostly)\b|通常|经常|往往", re.I),
     re.compile(r"\b(?:rarely|seldom|hardly\s+ever)\b|很少|极少|几乎不", re.I)),
    # Acts and their undoing: an act done one way is the other undone.
    ("case",
     re.compile(r"\b(?:upper-?cas(?:e|es|ed|ing)|capitali[sz](?:e|es|ed|ing)|all\s+caps)\b|大写", re.I),
     re.compile(r"\blower-?cas(?:e|es|ed|ing)\b|小写", re.I)),
    ("escape",
     re.compile(r"\b(?:escap(?:e|es|ed|ing)|encod(?:e|es|ed|ing))\b|(?<![反去])转义|(?<!解)编码", re.I),
     re.compile(r"\b(?:unescap(?:e|es|ed|ing)|decod(?:e|es|ed|ing))\b|反转义|去转义|解码", re.I)),
    ("compress",
     # Not a bare "zip" (a zip code) nor "extract" (a date from a string).
     re.compile(r"\b(?:compress(?:es|ed|ing|ion)?|gzip(?:s|ped|ping)?)\b|(?<!解)压缩", re.I),
     re.compile(r"\b(?:decompress(?:es|ed|ing|ion)?|uncompress(?:es|ed|ing)?|unzip(?:s|ped|ping)?|"
                r"gunzip)\b|解压", re.I)),
    ("cipher",
     re.compile(r"\bencrypt(?:s|ed|ing|ion)?\b|加密", re.I),
     re.compile(r"\b(?:decrypt(?:s|ed|ing|ion)?|plain-?text)\b|解密|明文", re.I)),
    ("grade",
     re.compile(r"\bupgrad(?:e|es|ed|ing)\b|升级", re.I),
     re.compile(r"\bdowngrad(?:e|es|ed|ing)\b|降级|回退版本", re.I)),
    ("sort",
     re.compile(r"\bascending\b|升序|从小到大", re.I),
     re.compile(r"\bdescending\b|降序|从大到小", re.I)),
    ("round",
     re.compile(r"\bround(?:s|ed|ing)?\s+(?:[\w'-]+\s+){0,3}?up\b|向上取整|上取整", re.I),
     re.compile(r"\bround(?:s|ed|ing)?\s+(?:[\w'-]+\s+){0,3}?down\b|向下取整|下取整", re.I)),
    ("split",
     re.compile(r"\bsplit(?:s|ting)?\b|拆分|拆开|拆成", re.I),
     re.compile(r"\b(?:join(?:s|ed|ing)?|concatenat(?:e|es|ed|ing)|combin(?:e|es|ed|ing))\b|合并|拼接|拼成", re.I)),
    # A form changed, or left as it is: "flatten the nested JSON" / "keep it nested", "keep the
    # nested JSON as it is" ("nested" alone describes the data, and both sides say it).
    ("shape",
     re.compile(r"\b(?:flatten(?:s|ed|ing)?|un-?nest(?:s|ed|ing)?|normali[sz](?:e|es|ed|ing)|"
                r"reformat(?:s|ted|ting)?|restructur(?:e|es|ed|ing)|reshap(?:e|es|ed|ing))\b"
                r"|展平|扁平化|拍平|打平|铺平|规范化|重新格式化", re.I),
     re.compile(r"(?<![\w-])nest(?:s|ing)?\s+(?:the|them|it|each|every|all|these|those)\b"
                r"|\b(?:keep|leave)(?:s|ing)?\s+(?:[\w'-]+\s+){0,3}?(?:nested|unchanged|untouched|"
                r"as[- ]is|as\s+(?:it|they)\s+(?:is|are))\b"
                r"|\b(?:as[- ]is|unchanged|untouched|unmodified|verbatim)\b"
                r"|保持原样|原样|原封不动|保持嵌套|不做转换|不要转换", re.I)),
    # A flag or option passed or left off: "use the --dry-run flag" / "drop (omit, remove) it",
    # "加上 --force 参数" / "去掉 --force 参数". Omit and leave out are prohibitions already.
    ("flag",
     re.compile(r"\b(?:us(?:e|es|ed|ing)|pass(?:es|ed|ing)?|add(?:s|ed|ing)?|set(?:s|ting)?|"
                r"supply|supplie[sd]|supplying|provid(?:e|es|ed|ing)|append(?:s|ed|ing)?|with)\s+"
                r"(?:the\s+|a\s+|an\s+)?(?:-{1,2}[a-z][\w-]*|[\w-]+\s+(?:flag|option|switch))\b"
                r"|(?:加上|带上|加|带|使用|传入|传)\s*(?:-{1,2}[a-z][\w-]*|[^。；，,\s]{1,10}?(?:参数|选项|标志|开关))", re.I),
     re.compile(r"\b(?:drop(?:s|ped|ping)?|remov(?:e|es|ed|ing)|delet(?:e|es|ed|ing)|strip(?:s|ped|ping)?|"
                r"without)\s+(?:the\s+|a\s+|an\s+)?(?:-{1,2}[a-z][\w-]*|[\w-]+\s+(?:flag|option|switch))\b"
                r"|(?:去掉|去除|删掉|删除|移除|拿掉|不加|不带|不传)\s*(?:-{1,2}[a-z][\w-]*|[^。；，,\s]{1,10}?(?:参数|选项|标志|开关))", re.I)),
)  # fmt: skip


def poles(text: str) -> dict[str, frozenset[int]]:
    """Which way advice turns each pair of opposite words (``_POLES``): +1, -1 or both. A word
    after a prohibition or an exclusion in its clause turns the other way ("don't lower the
    timeout" raises it, "keep it instead of deleting it" keeps it)."""
    found: dict[str, set[int]] = {}
    last_end = 0
    clauses = _clauses(_plain(text))
    for i, (clause, asked) in enumerate(clauses):
        if _CONDITION_EN.match(clause) or _CONDITION_ZH.search(clause):
            continue  # "when more than 100 rows are queued", "并发数调高时": the situation
        # "Keep the cache? No.": the answer turns the question round.
        answer = _answer(clauses[i + 1][0]) if asked and i + 1 < len(clauses) else None
        clause = _asked(clause, answer is not None)
        turned = answer == -1.0
        spans = sorted(
            m.span() for p in (_FORBID_RE, _EXCLUDE_RE, _NEG_ZH) for m in p.finditer(clause)
        )
        negations: list[int] = []  # one per negation ("do not" is not two)
        for start, end in spans:
            if not negations or start >= last_end:
                negations.append(start)
                last_end = end
            last_end = max(last_end, end)
        words = sorted(
            (m.start(), name, sign)
            for name, one, other in _POLES
            for sign, pattern in ((1, one), (-1, other))
            for m in pattern.finditer(clause)
        )
        for at, name, sign in words:
            # A negation turns the first such word after it ("never disable the cache": the
            # switch, not the cache).
            flips = turned + sum(
                1 for n in negations if n < at and not any(n < w < at for w, _, _ in words)
            )
            found.setdefault(name, set()).add(sign * (-1) ** flips)
    return {name: frozenset(signs) for name, signs in found.items()}


def poles_flipped(a: str, b: str) -> bool:
    """Whether two pieces of advice turn a pair of opposite words (``_POLES``) opposite ways:
    one says only "more" (开, keep, manual, cached) where the other says only "less" (关, delete,
    automatic, fresh)."""
    pa, pb = poles(a), poles(b)
    return any(len(pa[k]) == len(pb[k]) == 1 and pa[k] != pb[k] for k in pa.keys() & pb.keys())


def _acts_opposed(a: str, b: str) -> bool:
    """One piece of advice takes an act of the concept lexicon (``xask``, ``xwait``...) that the
    other declines."""
    sa, sb = stance(a), stance(b)
    return any(sa[t] != sb[t] for t in sa.keys() & sb.keys() if t in _CONCEPT_TOKENS)


def _same_values(a: str, b: str) -> bool:
    """Both pieces of advice ask for the same concrete value (``utf-8-sig``, ``sep=';'``, 429)
    and one of them turns down a value of its own: the two choose between values ("don't read it
    as plain utf-8; pick utf-8-sig" / "read it with utf-8-sig"). A prohibition naming no value
    forbids an act, whatever value both name beside it ("there's no point letting the bed soak;
    start the moment it reaches 100 °C" / "heat it to 100 °C and let it soak")."""
    sa, sb = stance(a), stance(b)
    shared = any(
        sa[t] > 0 and sb[t] > 0 and _WEIGHTED_TERM_RE.search(t) for t in sa.keys() & sb.keys()
    )
    return shared and any(
        sign < 0 and _WEIGHTED_TERM_RE.search(t) for s in (sa, sb) for t, sign in s.items()
    )


def _action(value: dict[str, Any] | None) -> bytes | None:
    # ``variants`` lists the failed attempts of one run: two runs of one lesson differ there.
    if value is None:
        return None
    return _canon({k: v for k, v in value.items() if k != "variants"})


def _has_fix(lesson: Lesson | LessonDraft) -> bool:
    return lesson.structured is not None and lesson.structured.prefer is not None


def _is_pattern(structured: Structured | None) -> bool:
    return structured is not None and bool(structured.when.get("error_template"))


def _structured_relation(a: Structured | None, b: Structured | None) -> str | None:
    """``same``, ``conflict``, ``different`` or None (cannot tell) from the structured forms."""
    if a is not None and b is not None and _is_pattern(a) and _is_pattern(b):
        # Lessons of a batch review (``patterns.review_runs``): one per tool and error template.
        # The same pair is the same lesson with newer evidence; another pair never merges.
        key = ("tool", "error_template", "context")
        return "same" if all(a.when.get(k) == b.when.get(k) for k in key) else "different"
    if _is_pattern(a) != _is_pattern(b):
        # A pattern across runs and one run's lesson say different kinds of things: merging
        # would let one's text replace the other's (a recurring error vs a source's quirk).
        return "different"
    if a is None or b is None or _canon(a.when) != _canon(b.when):
        return None
    a_prefer, a_avoid, b_prefer, b_avoid = (
        _action(a.prefer),
        _action(a.avoid),
        _action(b.prefer),
        _action(b.avoid),
    )
    if (a_prefer is not None and a_prefer == b_avoid) or (
        a_avoid is not None and a_avoid == b_prefer
    ):
        return "conflict"
    if a_prefer is not None and b_prefer is not None:
        # Two fixes for one situation: different lessons (both may work), never one merged text.
        return "same" if a_prefer == b_prefer else "different"
    if a_avoid is not None and a_avoid == b_avoid:
        # Both avoid the same action; one may also name the fix: it says the same, and more.
        return "same"
    return None


def _wordings(lesson: Lesson) -> tuple[list[str], frozenset[str]]:
    """(the wordings the rules read a draft against: the advice and the rewordings merged into
    it, most recent first, ``MAX_VARIANTS`` at most; the wordings merged on the pair judge's
    word alone that no person has settled yet, which only a word-for-word repeat matches, and
    never rewrites the advice). A wording a person split back out is another lesson's now."""
    history = lesson.history
    pending = frozenset(history[i]["changes"]["merged_advice"] for i in _unsettled_judged(lesson))
    texts = [lesson.advice]
    for entry in reversed(history):
        changes = entry.get("changes") or {}
        text = changes.get("merged_advice")
        if (
            isinstance(text, str)
            and text not in texts
            and text not in pending
            and "split_into" not in changes
        ):
            texts.append(text)
            if len(texts) >= MAX_VARIANTS:
                break
    return texts, pending


def reading_key(lesson: Lesson) -> tuple[Any, ...]:
    """All that the rules read of a lesson when they compare it with another (``_relations``,
    with no judge): two lessons with equal keys read against each other as before, however
    many times their scores, counts or status changed meanwhile."""
    wordings, pending = _wordings(lesson)
    f = lesson.features
    return (
        lesson.lesson_id,
        tuple(wordings),
        pending,
        _canon(lesson.structured) if lesson.structured is not None else None,
        tuple(f.tools),
        f.step,
        f.error_type,
    )


def variants(lesson: Lesson) -> list[str]:
    """Every wording the lesson holds: its advice, the rewordings merged into it (most recent
    first), then those merged on the judge's word alone that wait for a person."""
    texts, pending = _wordings(lesson)
    return texts + sorted(pending.difference(texts))


def curate(
    draft: LessonDraft | Lesson,
    book: Sequence[Lesson],
    *,
    embedder: Any,
    now: datetime | None = None,
    validity: timedelta = DEFAULT_VALIDITY,
    merge_text: Callable[[str, str], str] | None = None,
    quality: str = "ok",
    judge: Callable[[str, str], str | None] | None = None,
) -> Change:
    """Decide what a new lesson does to the book: add it, merge it, or flag a conflict.

    Only lessons one recall may serve beside the draft are compared (``lesson_keys``: task types
    and scopes as recall matches them, case aside; a lesson of any task type or of the global
    scope is served with the others, one of a project beside one of a user), and only those of
    its own task type and scope take it in as a repeat. A draft repeats a lesson when
    their structured forms agree (same ``when``, same ``prefer``), when it is word for word one of
    the lesson's wordings, or when their advice is close (``text_similarity`` against every
    wording merged so far, above a threshold that is lower when both name the same step or error
    type), their scenarios do not differ and the rules can read that both say the same thing
    (``agreement_shown``). It contradicts a lesson when the structured forms swap prefer and
    avoid, when both set one argument to different values (``values_clash``), when one prefers
    what the other avoids (``stance_relation``, ``poles``), or when the advice is the same once
    negation words are removed but only one of the two is negated. Close advice the rules cannot
    read either way is held for a person (a conflict marked ``unsure``) unless a ``judge``
    settles it. Every contradicted lesson that is active or waiting in review is recorded
    (``Change.others``): recall keeps apart only the pairs recorded. A draft that repeats one
    lesson and contradicts another is merged, and the contradiction recorded between the two.
    A new lesson that contradicts one waits for review, unless every lesson it contradicts is
    of another owner's scope (``lesson_keys.scopes_apart``): then it is added, the pairs recorded.

    Args:
        draft: A reflector's draft, or a ``Lesson`` (imports) whose id, status and validity are
            kept if it is added.
        book: The lessons to compare with (any status, any task type: those recall never
            serves beside the draft are left out here; rejected ones absorb repeats and stay as
            they are, text and dates; expired ones are revived by a repeat unless a person
            expired them; a ``valid_until`` a person set is kept).
        embedder: An ``Embedder``: ``embed(texts) -> float32 array`` with L2-normalized rows.
        now: The curation time (tests pass a fixed one).
        validity: How long a new or refreshed lesson stays valid.
        merge_text: Optional ``(kept, new) -> merged`` advice writer (an LLM); its failure falls
            back to keeping the more specific text.
        quality: ``suspect`` when the draft came from an answer that could not be parsed cleanly;
            a new suspect lesson waits in review instead of going live.
        judge: Optional ``(kept, new) -> "same" | "opposite" | "different" | None`` (a model,
            ``llm.judge.PairJudge``), asked only about the pairs the rules leave open: close
            enough to matter, too far apart in words to merge, then (while nothing repeats the
            draft) lessons of its scenario and language too far apart in words for the rules to
            read at all; ``MAX_JUDGED`` at most. ``None`` keeps the rules' call.

    Returns:
        A ``Change``; save ``change.saves``.
    """
    now = now or utcnow()
    check_scope(draft.scope)
    if isinstance(draft, Lesson) and _is_dead(draft, now):
        # A rejected or expired lesson (an import, a restore) is kept as it is: it never lends
        # support to, revives or rewrites a lesson in the book, nor contradicts one.
        return Change(action="add", lesson=_new_lesson(draft, now=now, validity=validity))
    # Compared as recall matches them (``lesson_keys``): a lesson recall may serve beside the
    # draft is read for a contradiction; only one of the draft's own task type and scope may
    # take it in as a repeat (a repeat must not widen or narrow where a lesson applies).
    candidates = [
        lesson
        for lesson in book
        if lesson_keys.served_together(lesson, draft)
        and (not isinstance(draft, Lesson) or lesson.lesson_id != draft.lesson_id)
    ]
    best_same: tuple[float, Lesson] | None = None
    conflict_with: list[Lesson] = []
    unsure: set[str] = set()
    if candidates:
        same, conflicts, unsure, judged = _relations(
            draft, candidates, embedder=embedder, judge=judge, now=now
        )
        # The judge's word alone neither revives an expired lesson nor sinks the draft into a
        # rejected one: the draft goes in on its own.
        same = [
            (x, other)
            for x, other in same
            if not (other.lesson_id in judged and _is_dead(other, now))
            and lesson_keys.same_keys(other, draft)
        ]
        if same:
            # Among equal repeats one that is not dead wins: one a person merged away (rejected, "same
            # as" another) still matches its own text, and the one it went into holds it too.
            best_same = max(same, key=lambda pair: (pair[0], not _is_dead(pair[1], now)))
        # Every contradiction that recall could serve, now or once a person confirms it: a
        # lesson waiting in review goes live with no second look at the book.
        seen: set[str] = set()
        for other in conflicts:
            if other.lesson_id not in seen and may_go_live(other, now):
                seen.add(other.lesson_id)
                conflict_with.append(other)

    if best_same is not None:
        # A merge on the model's word alone adds support and the wording, never the text the
        # agent is told: a model that is wrong (an opposite it calls the same) must not rewrite it.
        merged = _merge(
            best_same[1],
            draft,
            now=now,
            validity=validity,
            merge_text=merge_text,
            judged=best_same[1].lesson_id in judged,
        )
        # What the draft contradicts, the lesson that now holds its words contradicts too: a
        # repeat of A that opposes B leaves A and B a pair recall must keep apart. Only the
        # contradictions the rules (or the judge) read: near text they could not read is held
        # for a person when it is a new lesson, and must not keep two live lessons apart.
        # A pair recorded already is left as it is.
        read = [
            other
            for other in conflict_with
            if other.lesson_id not in unsure
            and not (other.lesson_id in merged.conflicts and merged.lesson_id in other.conflicts)
        ]
        # A wording merged on the model's word may be split back out by a person: the pairs it
        # brought say so ("via"), to be read again then (``conflicts_via``).
        via = draft.advice.strip() if merged.lesson_id in judged else None
        others = (
            _record_conflicts(merged, read, set(), now=now, via=via)
            if may_go_live(merged, now)
            else []
        )
        if not best_same[1].is_live(now) and merged.is_live(now):
            # The repeat brought a lesson past its date (or expired by the machine) back: it was
            # never compared with the lessons that came while it was dead.
            recorded = {other.lesson_id for other in others}
            others += contradictions(
                merged,
                [x for x in candidates if x.lesson_id not in recorded],
                embedder=embedder,
                now=now,
            )
        return Change(action="merge", lesson=merged, others=others)

    lesson = _new_lesson(draft, now=now, validity=validity)
    if quality == "suspect":
        lesson.quality = "suspect"
        lesson.status = "needs_review"
    if not conflict_with:
        return Change(action="add", lesson=lesson)
    if all(lesson_keys.scopes_apart(other, draft) for other in conflict_with):
        # Only lessons of another owner's scope ("user:alice" against "project:web"): each may
        # be right for its owner, and recall keeps the two apart once the pair is recorded.
        return Change(
            action="add",
            lesson=lesson,
            others=_record_conflicts(lesson, conflict_with, unsure, now=now),
        )

    lesson.status = "needs_review"
    return Change(
        action="conflict",
        lesson=lesson,
        others=_record_conflicts(lesson, conflict_with, unsure, now=now),
    )


def _record_conflicts(
    lesson: Lesson,
    contradicted: Sequence[Lesson],
    unsure: set[str],
    *,
    now: datetime,
    via: str | None = None,
) -> list[Lesson]:
    """Record each contradicted lesson on both sides (``lesson`` in place); returns copies of
    those contradicted, to be saved. ``curate`` compares only lessons recall may serve beside
    the draft, whose keys ``lesson`` has. ``via``: the wording merged into ``lesson`` that
    brought the contradictions (on ``lesson``'s side of the history)."""
    others = []
    for other in contradicted:
        if other.lesson_id == lesson.lesson_id:
            continue
        lesson.conflicts = _merge_list(lesson.conflicts, [other.lesson_id])
        # "unsure": near text the rules could not read either way (a rewording or an opposite),
        # told apart in review from a contradiction they read.
        flag: dict[str, Any] = {"unsure": True} if other.lesson_id in unsure else {}
        lesson.history.append(
            _history(
                now,
                "curator",
                "conflict",
                {"conflicts": [other.lesson_id], **flag, **({"via": via} if via else {})},
            )
        )
        other = copy.deepcopy(other)
        other.conflicts = _merge_list(other.conflicts, [lesson.lesson_id])
        other.history.append(
            _history(now, "curator", "conflict", {"conflicts": [lesson.lesson_id], **flag})
        )
        others.append(other)
    return others


def conflicts_via(lesson: Lesson, wordings: Sequence[str]) -> set[str]:
    """The lessons recorded as contradicting ``lesson`` because of a wording merged into it on
    the model's word (``via``): the pairs to read again once a person splits it back out."""
    return {
        other_id
        for entry in lesson.history
        if entry.get("action") == "conflict" and (entry.get("changes") or {}).get("via") in wordings
        for other_id in (entry.get("changes") or {}).get("conflicts", [])
    }


def clear_stale_conflicts(
    before: Lesson,
    after: Lesson,
    others: Sequence[Lesson],
    *,
    embedder: Any,
    by: str,
    reason: str,
    read_before: Collection[str] | None = None,
    now: datetime | None = None,
) -> list[Lesson]:
    """Read a lesson whose words changed (a person reworded it, split a wording back out)
    against the lessons recorded as contradicting it (``others``): a pair the rules read as a
    contradiction ``before`` and no longer read ``after`` is cleared on both sides (``after``
    in place), or recall would keep apart two lessons that agree now. Only what the rules read
    beyond doubt: a pair a model or a person judged, or near text the rules cannot read, stays
    for a person to settle (a model asked again may not answer, or be asked about a few pairs only).
    ``read_before``: the pairs known to be read so before (those a wording split back out
    brought: a wording merged on the model's word is not read as the lesson's). Returns copies
    of the others cleared, to be saved."""
    now = now or utcnow()
    candidates = [
        other
        for other in others
        if other.lesson_id != after.lesson_id and other.lesson_id in after.conflicts
    ]
    if not candidates or reading_key(before) == reading_key(after):
        return []
    if read_before is None:
        was = _read_apart(before, candidates, embedder, now, sure=True)
    else:
        was = set(read_before)
    stale = was - _read_apart(after, candidates, embedder, now, sure=False)
    cleared = []
    for other in candidates:
        if other.lesson_id not in stale:
            continue
        other = copy.deepcopy(other)
        for one, two in ((after, other), (other, after)):
            one.conflicts = [x for x in one.conflicts if x != two.lesson_id]
            one.history.append(
                _history(now, by, "conflict_cleared", {"conflicts": [two.lesson_id]})
            )
            one.history[-1]["reason"] = reason
        cleared.append(other)
    return cleared


def _read_apart(
    lesson: Lesson, others: Sequence[Lesson], embedder: Any, now: datetime, *, sure: bool
) -> set[str]:
    """The ids of ``others`` the rules read as contradicting ``lesson``, from either side (each
    side's advice is read against the other's wordings); ``sure``: only the pairs they read
    beyond doubt, not near text they cannot read either way."""
    _, found, unsure, _ = _relations(lesson, others, embedder=embedder, now=now)
    ids = {x.lesson_id for x in found if not (sure and x.lesson_id in unsure)}
    for other in others:
        if other.lesson_id in ids:
            continue
        _, back, unsure, _ = _relations(other, [lesson], embedder=embedder, now=now)
        if back and not (sure and lesson.lesson_id in unsure):
            ids.add(other.lesson_id)
    return ids


def contradictions(
    lesson: Lesson,
    book: Sequence[Lesson],
    *,
    embedder: Any,
    now: datetime | None = None,
    gathered: bool = False,
) -> list[Lesson]:
    """Record what a lesson that goes live as it stands contradicts: one restored from an
    export, or one a person revived (a rejected or expired lesson confirmed) or reworded. It was
    never compared with the lessons that came while it was dead or elsewhere, and ``curate``
    compares only drafts. Nothing merges: its words and status are a person's (or the export's).
    Every live or waiting lesson recall may serve beside it that it contradicts is recorded on
    both sides (``lesson`` in place), so recall keeps the two apart and review shows the pair;
    a pair recorded already is left as it is, and near text the rules cannot read either way
    only for a lesson waiting for review. ``gathered``: ``book`` holds lessons that only a
    recall gathering lessons curation never compared serves beside ``lesson`` (no task type
    named, two users' scopes), which found the pair. Returns copies of the others, to be
    saved."""
    now = now or utcnow()
    if not may_go_live(lesson, now):
        return []
    candidates = [
        other
        for other in book
        if other.lesson_id != lesson.lesson_id
        and (gathered or lesson_keys.served_together(other, lesson))
        and may_go_live(other, now)
        and not (other.lesson_id in lesson.conflicts and lesson.lesson_id in other.conflicts)
    ]
    if not candidates:
        return []
    _, conflicts, unsure, _ = _relations(lesson, candidates, embedder=embedder, now=now)
    if lesson.is_live(now):
        # Near text the rules could not read either way must not keep two live lessons apart
        # (as in a merge); one waiting for review is shown beside it.
        conflicts = [other for other in conflicts if other.lesson_id not in unsure]
    unique = list({other.lesson_id: other for other in conflicts}.values())
    return _record_conflicts(lesson, unique, unsure, now=now)


def _relations(
    draft: LessonDraft | Lesson,
    candidates: Sequence[Lesson],
    *,
    embedder: Any,
    judge: Callable[[str, str], str | None] | None = None,
    now: datetime | None = None,
) -> tuple[list[tuple[float, Lesson]], list[Lesson], set[str], set[str]]:
    """Split candidates into those the draft repeats (with similarity) and those it contradicts,
    and name the conflicts that are only near text the rules could not read (``agreement_shown``)
    and the repeats only the judge found (its "same" on a pair the rules would not merge).
    ``now`` tells the dead lessons (rejected, expired) apart, which no far pair asks about."""
    texts = [draft.advice]
    spans: list[tuple[int, int]] = []  # which rows of ``texts`` hold each candidate's wordings
    pendings: list[frozenset[str]] = []  # each candidate's wordings the judge alone let in
    for lesson in candidates:
        wordings, pending = _wordings(lesson)
        spans.append((len(texts), len(texts) + len(wordings)))
        texts.extend(wordings)
        pendings.append(pending)
    matrix = np.asarray(embedder.embed(texts), dtype=np.float32)
    query = matrix[0]
    floor = cosine_floor(embedder)
    weight = MODEL_COSINE_WEIGHT if is_model_floor(floor) else 0.5

    draft_text = draft.advice.strip()
    draft_negative, draft_core = _polarity(draft.advice)
    draft_scenario = _scenario(draft)
    same: list[tuple[float, Lesson]] = []
    conflicts: list[Lesson] = []
    unsure: set[str] = set()
    polar: list[tuple[Lesson, str, float]] = []
    open_pairs: list[tuple[float, Lesson]] = []  # close, but below the merge threshold
    # Of one scenario and language but far apart in words: a judge's turn only after the open
    # pairs (``_judged``), since most are other advice for the same tool.
    far_pairs: list[tuple[float, Lesson]] = []
    draft_language = detect_language(draft.advice) if judge is not None else None
    # The pairs the rules would flag that go to the judge instead (lesson id: the lesson and
    # whether "unsure"): without its word on one (it failed, or its turn never came) the rules'
    # conflict stands.
    held: dict[str, tuple[Lesson, bool]] = {}
    now = now or utcnow()
    settled = False  # the rules found a repeat beyond doubt: nothing is left to ask about
    via_judged: set[str] = set()  # lessons matched through a wording merged on the judge's word
    for lesson, (start, stop), pending in zip(candidates, spans, pendings, strict=True):
        relation = _structured_relation(draft.structured, lesson.structured)
        if relation == "conflict":
            conflicts.append(lesson)
            continue
        if relation == "same":
            opposed, agreed = stance_relation(draft.advice, lesson.advice)
            if opposed >= MIN_OPPOSITION and opposed > agreed:
                # One form, words that say the opposite ("retry with gbk" / "never retry with
                # gbk", a hand-written line): on one side the form and the text disagree, and a
                # merge would let that text replace the other's. A person decides.
                conflicts.append(lesson)
                continue
            same.append((1.0, lesson))
            settled = True
            continue
        if relation == "different":
            continue
        if any(text.strip() == draft_text for text in texts[start:stop]):
            # Word for word a wording it holds (its text, a merged rewording, one a person said
            # was the same): a repeat, whatever the rules can read of it.
            same.append((1.0, lesson))
            settled = True
            continue
        if draft_text in pending:
            # Word for word a wording merged on the judge's word alone: a repeat on that word
            # too (it must not rewrite the advice, and it waits for the same person's look).
            same.append((1.0, lesson))
            settled = True
            via_judged.add(lesson.lesson_id)
            continue
        scenario = _scenario(lesson)
        agreement = _scenario_agreement(draft_scenario, scenario)
        if agreement == -2:
            continue  # different situations: neither a repeat nor a contradiction
        # Near a wording the judge let in is not enough to merge (those are not among the
        # texts read here): the stance rules below read the draft against the lesson's advice.
        sim = max(
            text_similarity(draft.advice, text, float(c), weight)
            for text, c in zip(
                texts[start:stop], rescale_cosines(matrix[start:stop] @ query, floor), strict=True
            )
        )
        threshold = _MERGE_THRESHOLDS[agreement]
        if sim < min(threshold, CONFLICT_MIN_SIMILARITY):
            if (
                judge is not None
                and draft_scenario["tools"] & scenario["tools"]  # a tool both name
                and (lesson.language or detect_language(lesson.advice)) == draft_language
                and not _is_dead(lesson, now)
            ):
                far_pairs.append((sim, lesson))
            continue
        if agreement >= 0 and values_clash(draft.advice, lesson.advice):
            # One argument set to two values ("retries=3" / "retries=0") in one situation: the
            # agent cannot follow both, and a merge would let one text replace the other's
            # value. (One naming an error the other does not may be a fallback: gbk on a codec
            # error, utf-8-sig otherwise.)
            conflicts.append(lesson)
            continue
        opposed, agreed = stance_relation(draft.advice, lesson.advice)
        if opposed >= MIN_OPPOSITION and (
            opposed >= agreed
            or _acts_opposed(draft.advice, lesson.advice)
            or (
                sim >= threshold - JUDGE_MARGIN
                and (
                    # The same steps in the other order share every value by construction
                    # ("先扩新版本再把旧版本缩到 0" / "先把旧版本缩到 0 再扩"): no excuse.
                    order_opposition(draft.advice, lesson.advice) >= MIN_OPPOSITION
                    or not _same_values(draft.advice, lesson.advice)
                    # A shared value does not excuse an act of the lexicon taken both ways
                    # ("100% matches: accept as-is, re-reviewing wastes time" / "deserve a
                    # second look"): asking or not, waiting or not is what the advice is.
                    or _acts_opposed(draft.advice, lesson.advice)
                )
            )
        ):
            # One prefers what the other avoids: never one lesson, whatever the similarity. When
            # they also agree on more than they oppose, near text is still a conflict for a
            # person to settle (a merge would keep one side's words and lose the other's),
            # unless both ask for the same concrete value ("don't read it as plain utf-8; pick
            # utf-8-sig" and "read it with utf-8-sig" prescribe one thing).
            conflicts.append(lesson)
            continue
        if sim >= threshold - JUDGE_MARGIN and poles_flipped(draft.advice, lesson.advice):
            # A small edit of the other lesson that turns one stance-bearing word round (more /
            # less, 开 / 关, keep / delete, manual / automatic, cached / fresh) with no word of
            # the same sense to explain it: opposite advice until a person (or the judge) says.
            if judge is None:
                conflicts.append(lesson)
            else:
                open_pairs.append((sim, lesson))
                held[lesson.lesson_id] = (lesson, False)
            continue
        if sim < threshold + JUDGE_MARGIN:
            # Close to the threshold on either side: the words alone do not settle it.
            open_pairs.append((sim, lesson))
        if sim < threshold:
            if (
                sim >= threshold - JUDGE_MARGIN
                and not opposed
                and values_agree(draft.advice, lesson.advice)
            ):
                # Fewer words in common, the same concrete values asked for and nothing read
                # against the other: a rewording ("open it to 5% of users first" / "begin the
                # staged rollout at 5%").
                same.append((sim, lesson))
            continue
        if not agreement_shown(draft.advice, lesson.advice):
            # Merge only what agrees: near text whose stance-bearing words differ ("太慢，不值得",
            # "默认…", "immediate retries get flagged") and share too little read the same way
            # may say the opposite in words the rules cannot read. A missed merge leaves a
            # duplicate; a wrong one loses a lesson: a person (or the judge) decides.
            if judge is None:
                conflicts.append(lesson)
                unsure.add(lesson.lesson_id)
            else:
                if not any(other is lesson for _, other in open_pairs):
                    open_pairs.append((sim, lesson))
                held[lesson.lesson_id] = (lesson, True)
            continue
        negative, core = _polarity(lesson.advice)
        if negative != draft_negative and opposed > 0:
            # Only when a term one forbids is one the other asks for: "不要立即重试" forbids the
            # haste, and "wait, then retry" says nothing the other way.
            polar.append((lesson, core, sim))
        else:
            same.append((sim, lesson))
            settled = settled or sim >= threshold + JUDGE_MARGIN

    if polar:
        # Close texts of opposite polarity: a contradiction if they match once the negation is
        # gone ("use X" / "never use X"), a rewording otherwise ("use X" / "X, not Y").
        cores = [draft_core] + [core for _, core, _ in polar]
        core_vecs = np.asarray(embedder.embed(cores), dtype=np.float32)
        for (lesson, core, sim), vec in zip(polar, core_vecs[1:], strict=True):
            cosine = float(rescale_cosines(np.asarray([vec @ core_vecs[0]]), floor)[0])
            if text_similarity(draft_core, core, cosine, weight) >= CONFLICT_THRESHOLD:
                conflicts.append(lesson)
            else:
                same.append((sim, lesson))
    verdicts: dict[str, str] = {}
    by_rules = {lesson.lesson_id for _, lesson in same}
    if judge is not None and (open_pairs or far_pairs) and not settled:
        same, conflicts, verdicts = _judged(
            draft, same, conflicts, open_pairs, far_pairs, judge, set(held)
        )
    for lesson_id, (lesson, is_unsure) in held.items():
        if lesson_id not in verdicts:  # no word from the judge: the rules' call
            conflicts.append(lesson)
            if is_unsure:
                unsure.add(lesson_id)
    repeats = {lesson.lesson_id for _, lesson in same}
    judged = (repeats - by_rules) | (repeats & via_judged)
    return same, conflicts, unsure, judged


def _judged(
    draft: LessonDraft | Lesson,
    same: list[tuple[float, Lesson]],
    conflicts: list[Lesson],
    open_pairs: list[tuple[float, Lesson]],
    far_pairs: list[tuple[float, Lesson]],
    judge: Callable[[str, str], str | None],
    held: set[str],
) -> tuple[list[tuple[float, Lesson]], list[Lesson], dict[str, str]]:
    """The model's word on the closest pairs the words left open, and the verdicts it gave
    (lesson id: "same", "opposite" or "different"; a pair without one keeps the rules' call).

    A near merge it calls different is kept apart, one it calls opposite is a conflict; a pair
    below the threshold it calls the same is merged. A contradiction the rules read is never
    asked about. The ``far_pairs`` (one scenario and language, few words shared) come after the
    open ones, closest first, and only while nothing is the draft's repeat or its opposite and
    no ``held`` pair (one the rules would flag) waits for a verdict: a far "same" must not
    override a conflict for a person. A rewording in other words ("keep them off the deep wrecks
    unless they hold an advanced card" / "book_dive deeper than 18 m only for Advanced Open
    Water") shares too few words for any threshold that keeps other advice of the same tool
    apart, and an opposite in other words too ("至少提前八周寄出" / "婚礼前三四周再发就够了").
    ``MAX_JUDGED`` requests at most, whichever they are.
    """
    same, conflicts = list(same), list(conflicts)
    ask = sorted(open_pairs, key=lambda p: -p[0]) + sorted(far_pairs, key=lambda p: -p[0])
    far_from = len(open_pairs)
    verdicts: dict[str, str] = {}
    asked = 0
    for at, (sim, lesson) in enumerate(ask):
        if asked >= MAX_JUDGED:
            break
        if lesson in conflicts:
            continue
        if at >= far_from and (same or conflicts or held.difference(verdicts)):
            break
        asked += 1
        try:
            verdict = judge(lesson.advice, draft.advice)
        except Exception:  # noqa: BLE001 - a judge's failure leaves the rules' call
            log.warning("hindsight: the pair judge failed", exc_info=True)
            verdict = None
        if verdict not in ("same", "opposite", "different"):
            continue
        merged = any(other is lesson for _, other in same)
        if verdict == "same" and not merged and len(_wordings(lesson)[1]) >= MAX_PENDING_JUDGED:
            # As many wordings as a person is asked about at once wait on this lesson: the
            # model's word alone adds no more (the rules' call stands) until one is settled.
            continue
        verdicts[lesson.lesson_id] = verdict
        if verdict == "same" and not merged:
            same.append((sim, lesson))
        elif verdict in ("different", "opposite") and merged:
            same = [(x, other) for x, other in same if other is not lesson]
        if verdict == "opposite":
            conflicts.append(lesson)
    return same, conflicts, verdicts


def may_go_live(lesson: Lesson, now: datetime | None = None) -> bool:
    """Live, or waiting for a person whose confirmation would make it live."""
    now = now or utcnow()
    return lesson.is_live(now) or (lesson.status == "needs_review" and not _is_dead(lesson, now))


def _is_dead(lesson: Lesson, now: datetime) -> bool:
    """Rejected, expired, or past its ``valid_until`` (unpinned)."""
    if lesson.status in {"rejected", "expired"}:
        return True
    return bool(not lesson.pinned and lesson.valid_until and parse_ts(lesson.valid_until) <= now)


#: Who changes lessons on their own; every other ``by`` is a person.
MACHINE_ACTORS = frozenset({"curator", "system", "feedback"})


def _vouched(lesson: Lesson) -> bool:
    """Whether a person edited or confirmed the lesson: its words are theirs to change."""
    return any(
        entry.get("by") not in MACHINE_ACTORS
        and (
            entry.get("action") == "confirm"
            or (entry.get("action") == "edit" and entry.get("changes"))
        )
        for entry in lesson.history
    )


def _last_change(lesson: Lesson, field: str) -> dict[str, Any] | None:
    """The latest history entry that changed ``field`` (``valid_until``, ``status``), if any."""
    return next((e for e in reversed(lesson.history) if field in (e.get("changes") or {})), None)


def _dated_by_machine(lesson: Lesson) -> bool:
    """Whether the lesson's ``valid_until`` is the machine's to move: no person chose it with an
    edit (a confirmation or an unpin only renews the default period, which a repeat may too)."""
    entry = _last_change(lesson, "valid_until")
    return entry is None or entry.get("by") in MACHINE_ACTORS or entry.get("action") != "edit"


def _expired_by_machine(lesson: Lesson) -> bool:
    """Whether the lesson ran out on its own (``expire_due``) rather than by a person's word."""
    entry = _last_change(lesson, "status")
    return entry is None or entry.get("by") in MACHINE_ACTORS


def _new_lesson(draft: LessonDraft | Lesson, *, now: datetime, validity: timedelta) -> Lesson:
    if isinstance(draft, LessonDraft):
        return draft_to_lesson(draft, now=now, validity=validity)
    lesson = copy.deepcopy(draft)
    lesson.created_at = lesson.created_at or iso(now)
    lesson.updated_at = lesson.updated_at or iso(now)
    if not lesson.pinned and not lesson.valid_until:
        lesson.valid_until = iso(now + validity)
    if not lesson.history:
        lesson.history.append(_history(now, "curator", "create", {}))
    lesson.value_score = value_score(lesson, now)
    return lesson


def _better(new_fix: bool, new_text: str, old_fix: bool, old_text: str) -> bool:
    """Whether a repeat's text should replace the kept one.

    Text from a lesson that names what to do instead beats text that only says what not to do;
    otherwise the more concrete text wins, by a margin so the text people see does not flip with
    every rewording.
    """
    if new_fix != old_fix:
        return new_fix
    return specificity(new_text) > specificity(old_text) + SPECIFICITY_MARGIN


def _merge(
    kept: Lesson,
    draft: LessonDraft | Lesson,
    *,
    now: datetime,
    validity: timedelta,
    merge_text: Callable[[str, str], str] | None,
    by: str = "curator",
    judged: bool = False,
) -> Lesson:
    """``kept`` with ``draft`` merged in. ``judged``: the pair judge's word alone made it a
    repeat: the draft's support, sources and wording go in, none of its text (as for a lesson a
    person vouched for), and the history says so."""
    lesson = copy.deepcopy(kept)
    old_advice = lesson.advice
    new_advice = draft.advice.strip()
    # A newer batch review of the same failure pattern (``patterns.review_runs``) counted it over
    # more runs: its text, counts and structured form replace the old ones whole, since mixing
    # the two would let the text and the structured form disagree; sources and support add up.
    pattern = _is_pattern(kept.structured) and _is_pattern(draft.structured)
    fix_new, fix_old = _has_fix(draft), _has_fix(kept)
    # A person who says two lessons are one has chosen which text stays; a model's word is
    # enough to count a repeat, not to change the advice. A rejected lesson stays as it was
    # rejected: it absorbs repeats (so they do not come back as new lessons) and nothing else.
    rejected = kept.status == "rejected"
    vouched = _vouched(kept) or by not in MACHINE_ACTORS or judged or rejected
    if vouched:
        # A person's words (or the text already served) stand: the repeat adds support and
        # sources, never its text.
        advice = old_advice
    elif pattern:
        advice = new_advice
    else:
        advice = new_advice if _better(fix_new, new_advice, fix_old, old_advice) else old_advice
    if merge_text is not None and new_advice != old_advice and not pattern and not vouched:
        try:
            merged = merge_text(old_advice, new_advice).strip()
        except Exception:  # noqa: BLE001 - an LLM failure must not lose the merge
            merged = ""
        advice = merged or advice
    lesson.advice = advice
    if advice != old_advice:
        lesson.language = detect_language(advice)
    if vouched:
        pass
    elif pattern:
        lesson.root_cause, lesson.general_rule = draft.root_cause, draft.general_rule
        lesson.suggestions = list(draft.suggestions)
        lesson.structured = copy.deepcopy(draft.structured)
        lesson.features = copy.deepcopy(draft.features)
    else:
        for name in ("root_cause", "general_rule"):
            mine, theirs = getattr(lesson, name), getattr(draft, name)
            if theirs and _better(fix_new, theirs, fix_old, mine):
                setattr(lesson, name, theirs)
        lesson.suggestions = _merge_list(lesson.suggestions, draft.suggestions, limit=5)
        f, g = lesson.features, draft.features
        f.tools = _merged_tools(f.tools, g.tools)
        f.keywords = _merge_list(f.keywords, g.keywords, limit=12)
        f.intent = f.intent or g.intent
        f.step = f.step or g.step
        f.error_type = f.error_type or g.error_type
        if draft.structured is not None and (lesson.structured is None or fix_new > fix_old):
            lesson.structured = copy.deepcopy(draft.structured)
    added_sources = [t for t in draft.source_task_ids if t not in lesson.source_task_ids]
    lesson.source_task_ids += added_sources
    dropped_sources = _bound_sources(lesson)
    # Support counts the runs that taught it: a run reviewed again (a local review, then the
    # full one; a review asked for by name) teaches nothing new, though it may word it better.
    # A line with no run behind it (hand-written, imported) word for word one the lesson holds
    # is that line imported again: it adds nothing either.
    if draft.source_task_ids:
        recounted = not added_sources
    else:
        recounted = _said(new_advice) in _texts_held(kept)
    support_added = 0 if recounted else draft.support if isinstance(draft, Lesson) else 1
    lesson.support += support_added
    lesson.updated_at = iso(now)
    changes: dict[str, Any] = {"support": lesson.support, "merged_advice": new_advice}
    if judged:
        # What the merge added, so a person who says the model was wrong can take it back out.
        changes["judged"] = True
        changes["support_added"] = support_added
    if added_sources:
        changes["source_task_ids"] = added_sources
    if advice != old_advice:
        changes["advice"] = {"from": old_advice, "to": advice}
    if kept.features.tools and not lesson.features.tools:
        changes["tools"] = {"from": kept.features.tools, "to": []}
    if not lesson.pinned and not rejected and _dated_by_machine(lesson):
        # Learned again: valid for another ``validity`` from now, never shorter than it was.
        renewed = now + validity
        if not lesson.valid_until or parse_ts(lesson.valid_until) < renewed:
            lesson.valid_until = iso(renewed)
    current = lesson.pinned or not lesson.valid_until or parse_ts(lesson.valid_until) > now
    if lesson.status == "expired" and current and _expired_by_machine(lesson):
        # The lesson was learned again: it is current once more (unless a person expired it,
        # or set a date that has passed: their word stands).
        lesson.status = "active"
        changes["status"] = {"from": "expired", "to": "active"}
    lesson.value_score = value_score(lesson, now)
    lesson.history.append(_history(now, by, "merge", changes))
    _compact_history(lesson, dropped_sources)
    return lesson


def _said(text: str) -> str:
    """A text as compared for "the same line again": case, spacing and a closing full stop
    aside."""
    return " ".join(text.casefold().split()).rstrip(".。!！;；")


def _texts_held(lesson: Lesson) -> set[str]:
    """Every text a lesson has held (``_said``): its advice, each wording merged into it and
    each advice a better wording replaced, as far back as its history goes (not only the
    ``MAX_VARIANTS`` the rules read: a file of ten rewordings imported again came back in
    turn)."""
    held = {_said(lesson.advice)}
    for entry in lesson.history:
        changes = entry.get("changes") or {}
        merged, advice = changes.get("merged_advice"), changes.get("advice")
        if isinstance(merged, str):
            held.add(_said(merged))
        if isinstance(advice, dict) and isinstance(advice.get("from"), str):
            held.add(_said(advice["from"]))
    return held


def _merged_tools(kept: list[str], new: list[str]) -> list[str]:
    """The tools of a lesson once a repeat naming ``new`` is merged in: the union, first seen
    first, while it names at most ``MAX_TOOLS`` tools; past that, none.

    Recall's rule stage serves a lesson without tools whatever tools a task has (``[]`` is "any
    tool"), so a lesson about any tool stays so (a repeat naming one must not narrow it), and a
    lesson repeated across more distinct tools than ``MAX_TOOLS`` becomes one: it is still served
    for its first tools, and its row stops growing with every new tool a repeat names.
    """
    if not kept:
        return []
    tools = _merge_list(kept, new)
    return [] if len({norm(t) for t in tools} - {""}) > MAX_TOOLS else tools


def same_as(
    absorbed: Lesson,
    kept: Lesson,
    *,
    by: str,
    now: datetime | None = None,
    validity: timedelta = DEFAULT_VALIDITY,
) -> tuple[Lesson, Lesson]:
    """A person says two lessons are one (a near pair the rules could not read held for review).

    ``kept`` keeps its text and takes ``absorbed``'s support, sources and wording (a variant, so
    later repeats of either text find it); ``absorbed`` is rejected with a note naming ``kept``,
    kept for the record. The conflict mark between them is lifted. Returns ``(kept, absorbed)``.
    """
    if absorbed.lesson_id == kept.lesson_id:
        raise ValueError("a lesson cannot be merged into itself")
    if not lesson_keys.same_keys(absorbed, kept):
        raise ValueError(
            f"{absorbed.lesson_id} ({absorbed.task_type}, {absorbed.scope}) and {kept.lesson_id} "
            f"({kept.task_type}, {kept.scope}) are of other task types or scopes"
        )
    now = now or utcnow()
    merged = _merge(kept, absorbed, now=now, validity=validity, merge_text=None, by=by)
    merged.conflicts = [c for c in merged.conflicts if c != absorbed.lesson_id]
    gone = reject(absorbed, by=by, now=now, reason=f"same as {kept.lesson_id}")
    gone.conflicts = [c for c in gone.conflicts if c != kept.lesson_id]
    return merged, gone


def _bound_sources(lesson: Lesson) -> int:
    """Keep a sample of ``MAX_SOURCE_SAMPLE`` source task ids (the first half and the most
    recent half); returns how many were dropped (counted in the merge summary)."""
    ids = lesson.source_task_ids
    if len(ids) <= MAX_SOURCE_SAMPLE:
        return 0
    lesson.source_task_ids = _sample(ids)
    return len(ids) - MAX_SOURCE_SAMPLE


def _sample(ids: list[str]) -> list[str]:
    """At most ``MAX_SOURCE_SAMPLE`` ids: the first half and the most recent half."""
    if len(ids) <= MAX_SOURCE_SAMPLE:
        return ids
    half = MAX_SOURCE_SAMPLE // 2
    return ids[:half] + ids[-(MAX_SOURCE_SAMPLE - half) :]


def _compact_history(lesson: Lesson, dropped_sources: int = 0) -> None:
    """Fold the curator's merges beyond the last ``MAX_MERGE_ENTRIES`` into one summary entry.

    People's actions, conflicts and feedback flags stay entry by entry; machine merges keep
    their most recent entries (the rewordings ``variants`` matches against) and a count, so a
    lesson learned two thousand times is as cheap to load and review as one learned once.
    """
    _join_judged_repeats(lesson)
    history = lesson.history
    # Merges on the judge's word alone wait for a person entry by entry (one per wording).
    waiting = set(_unsettled_judged(lesson))
    merges = [
        i
        for i, e in enumerate(history)
        if e.get("action") == "merge" and e.get("by") == "curator" and i not in waiting
    ]
    fold = set(merges[: max(0, len(merges) - MAX_MERGE_ENTRIES)])
    if not fold and not dropped_sources:
        return
    summary = next((e for e in history if e.get("action") == "merge_summary"), None)
    if summary is None:
        first = history[min(fold)] if fold else history[-1]
        summary = {"at": first["at"], "by": "curator", "action": "merge_summary", "changes": {}}
        at = min(fold) if fold else len(history) - 1
        history.insert(at, summary)
        fold = {i + 1 if i >= at else i for i in fold}
    counts = summary["changes"]
    for i in sorted(fold):
        entry = history[i]
        changes = entry.get("changes") or {}
        counts["merges"] = counts.get("merges", 0) + 1
        counts["last_at"] = entry.get("at")
        if "advice" in changes:
            counts["advice_changes"] = counts.get("advice_changes", 0) + 1
        if changes.get("judged") and "split_into" not in changes:  # still told apart
            counts["judged_merges"] = counts.get("judged_merges", 0) + 1
    counts["sources_not_sampled"] = counts.get("sources_not_sampled", 0) + dropped_sources
    counts["source_count"] = len(lesson.source_task_ids) + counts["sources_not_sampled"]
    lesson.history = [e for i, e in enumerate(history) if i not in fold]


def _join_judged_repeats(lesson: Lesson) -> None:
    """One history entry per wording merged on the judge's word alone that waits for a person:
    a wording merged again adds its counts to the latest entry of it (``_judged_counts``), so
    a wording the agent learns a thousand times stays one entry until a person looks."""
    history = lesson.history
    latest: dict[str, int] = {}
    drop: set[int] = set()
    for i in _unsettled_judged(lesson):
        changes = history[i]["changes"]
        earlier = latest.get(changes["merged_advice"])
        latest[changes["merged_advice"]] = i
        if earlier is None:
            continue
        before = history[earlier]["changes"]
        merges, support = _judged_counts(before)
        mine_merges, mine_support = _judged_counts(changes)
        changes["merges"] = merges + mine_merges
        changes["support_added"] = support + mine_support
        # Sampled as the lesson's own sources are: a split takes back the ids the lesson kept.
        joined = _merge_list(
            before.get("source_task_ids") or [], changes.get("source_task_ids") or []
        )
        if joined:
            changes["source_task_ids"] = _sample(joined)
        drop.add(earlier)
    if drop:
        lesson.history = [e for i, e in enumerate(history) if i not in drop]


def source_count(lesson: Lesson) -> int:
    """How many source tasks taught the lesson (``source_task_ids`` keeps only a sample)."""
    for entry in lesson.history:
        if entry.get("action") == "merge_summary":
            dropped = int((entry.get("changes") or {}).get("sources_not_sampled", 0))
            return len(lesson.source_task_ids) + dropped
    return len(lesson.source_task_ids)


# -- feedback -----------------------------------------------------------------------------------


def value_score(lesson: Lesson, now: datetime | None = None) -> float:
    """How much a lesson is worth injecting, in [0, 1].

    The Laplace-smoothed helpful rate ``(helpful + 1) / (helpful + harmful + 2)`` scaled by a
    factor in [0.5, 1] that grows with support (log-damped, full at 10 reflections) and recency
    (half-life ``RECENCY_HALF_LIFE_DAYS`` since the last update). Multiplying keeps a lesson that
    hurts low however often it was learned; a new lesson scores about 0.41.
    """
    now = now or utcnow()
    rate = (lesson.helpful + 1) / (lesson.helpful + lesson.harmful + 2)
    support = min(1.0, math.log1p(max(lesson.support, 1)) / math.log1p(10))
    stamp = lesson.updated_at or lesson.created_at
    days = max(0.0, (now - parse_ts(stamp)).total_seconds() / 86400) if stamp else 0.0
    recency = 0.5 ** (days / RECENCY_HALF_LIFE_DAYS)
    return round(rate * (0.5 + 0.25 * support + 0.25 * recency), 4)


def _counts_since_confirm(lesson: Lesson) -> tuple[int, int]:
    """Helpful and harmful counts since a person last confirmed the lesson."""
    for entry in reversed(lesson.history):
        if entry.get("action") == "confirm":
            base = entry.get("counts") or {}
            return (
                lesson.helpful - int(base.get("helpful", 0)),
                lesson.harmful - int(base.get("harmful", 0)),
            )
    return lesson.helpful, lesson.harmful


def keeps_hurting(lesson: Lesson) -> bool:
    """Hurt at least ``HARMFUL_MIN`` times, and more often than it helped, since last confirmed."""
    helpful, harmful = _counts_since_confirm(lesson)
    return harmful >= HARMFUL_MIN and harmful > helpful


def apply_outcome(
    lesson: Lesson,
    *,
    succeeded: bool,
    now: datetime | None = None,
    validity: timedelta = DEFAULT_VALIDITY,
    task_id: str | None = None,
    replaces: bool | None = None,
) -> Lesson:
    """Count the outcome of a task the lesson was injected into; flag it if it keeps hurting.

    A success counts as helpful and extends ``valid_until`` (a lesson that works stays; not a
    date a person set with an edit); a failure
    counts as harmful. A live lesson that keeps hurting goes to ``needs_review``: recall drops it
    and ``hindsight lessons review`` shows it.

    ``replaces``: the verdict an earlier report of the same task counted (True helpful, False
    harmful), now replaced: its count is taken back, so the task counts once. A date a success
    extended stays, and a flag stays for a person to clear. The caller knows what a task counted
    (``worker.Worker.settle``); None counts a task not counted before.
    """
    now = now or utcnow()
    out = copy.deepcopy(lesson)
    if replaces is True:
        out.helpful = max(0, out.helpful - 1)
    elif replaces is False:
        out.harmful = max(0, out.harmful - 1)
    if succeeded:
        out.helpful += 1
        # A date a person chose with an edit stays theirs (as a merge keeps it): a successful
        # task moved it 30 days on, and the lesson outlived the day the person had set.
        if not out.pinned and _dated_by_machine(out):
            extended = now + validity
            if not out.valid_until or parse_ts(out.valid_until) < extended:
                out.valid_until = iso(extended)
    else:
        out.harmful += 1
    out.updated_at = iso(now)
    out.value_score = value_score(out, now)
    if out.status == "active" and keeps_hurting(out):
        out.status = "needs_review"
        out.history.append(
            _history(
                now,
                "feedback",
                "flag_harmful",
                {
                    "status": {"from": "active", "to": "needs_review"},
                    "helpful": out.helpful,
                    "harmful": out.harmful,
                    **({"task_id": task_id} if task_id else {}),
                },
            )
        )
    return out


def expire_due(book: Sequence[Lesson], now: datetime | None = None) -> list[Lesson]:
    """The active, unpinned lessons past ``valid_until``, already marked ``expired``: save them.

    Expired lessons are kept (for review, export and revival by a repeat), never deleted.
    """
    now = now or utcnow()
    return [
        expire(lesson, by="system", now=now, reason="valid_until passed")
        for lesson in book
        if lesson.status == "active"
        and not lesson.pinned
        and lesson.valid_until
        and parse_ts(lesson.valid_until) < now
    ]


# -- people in charge ---------------------------------------------------------------------------

_LESSON_FIELDS = {f.name for f in dataclasses.fields(Lesson)}
_EDITABLE = (_LESSON_FIELDS | set(FEATURE_FIELDS)) - {"lesson_id", "history", "score", "features"}


def edit(
    lesson: Lesson, *, by: str, action: str = "edit", now: datetime | None = None, **changes: Any
) -> Lesson:
    """A copy of ``lesson`` with ``changes`` applied and one history entry saying who, when, what.

    ``changes`` are ``Lesson`` field names, or feature names (``tools``, ``intent``, ``step``,
    ``error_type``, ``keywords``). Values are checked; a change to nothing is not recorded.
    """
    now = now or utcnow()
    unknown = sorted(set(changes) - _EDITABLE)
    if unknown:
        raise ValueError(
            f"cannot edit {', '.join(map(repr, unknown))}; editable: {', '.join(sorted(_EDITABLE))}"
        )
    out = copy.deepcopy(lesson)
    record: dict[str, Any] = {}
    for name, value in changes.items():
        value = _check_field(name, value)
        target = out.features if name in FEATURE_FIELDS else out
        old = getattr(target, name)
        if old == value:
            continue
        setattr(target, name, value)
        record[name] = {"from": old, "to": value}
    if "advice" in record:
        out.language = detect_language(out.advice)
    if record or action != "edit":
        out.updated_at = iso(now)
        out.value_score = value_score(out, now)
        out.history.append(_history(now, by, action, record))
    return out


#: The longest text a lesson's field may hold: advice is a few sentences, and a megabyte of it
#: slowed every later curation of its task type to seconds and every recall that served it.
MAX_LESSON_TEXT = 4000
_TEXT_FIELDS = frozenset({"root_cause", "general_rule", "language", "quality"})
_OPTIONAL_TEXT_FIELDS = frozenset({"step", "error_type"})


def _check_field(name: str, value: Any) -> Any:
    if name in {"advice", "task_type"} and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{name!r} must be non-empty text")
    if name in _TEXT_FIELDS and not isinstance(value, str):
        raise ValueError(f"{name!r} must be text, got {type(value).__name__}")
    if name in _OPTIONAL_TEXT_FIELDS and value is not None and not isinstance(value, str):
        raise ValueError(f"{name!r} must be text or null, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_LESSON_TEXT:
        raise ValueError(f"{name!r} is {len(value):,} characters; at most {MAX_LESSON_TEXT:,}")
    # The lesson's words, read by people in review and by models in prompts: an edit or an
    # import holding a NUL or a bidi override is refused (models.check_lesson_text), as the
    # reflectors' words are cleared of them. Names matched against recorded runs (task type,
    # tools, step, error type) stay as the run recorded them; recall quotes them defused.
    if name in {"advice", "root_cause", "general_rule"} and isinstance(value, str):
        check_lesson_text(repr(name), value)
    if name == "advice":
        return value.strip()
    if name == "quality" and value not in {"ok", "suspect"}:
        raise ValueError(f"quality must be 'ok' or 'suspect', got {value!r}")
    if name == "value_score" and not (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ):
        raise ValueError(f"'value_score' must be a number, got {value!r}")
    if name == "scope":
        return check_scope(value)
    if name == "status" and value not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {value!r}")
    if name == "intent" and value is not None and value not in INTENTS:
        raise ValueError(f"intent must be one of {', '.join(INTENTS)}, got {value!r}")
    if name == "kind" and value not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {value!r}")
    if name in {"tools", "keywords", "suggestions", "source_task_ids", "conflicts"}:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not _is_text_list(value):
            raise ValueError(f"{name!r} must be a list of strings")
        if name == "suggestions":
            for i, item in enumerate(value, 1):
                check_lesson_text(f"'suggestions' item {i}", item)
        return list(dict.fromkeys(value))
    if name in {"created_at", "updated_at"} and value == "":
        return value  # not known: a restore dates it now
    if name in {"valid_until", "created_at", "updated_at"} and value is not None:
        return _check_date(name, value)
    if name == "pinned" and not isinstance(value, bool):
        raise ValueError(f"'pinned' must be true or false, got {value!r}")
    if name in {"support", "hit_count", "helpful", "harmful"} and (
        not isinstance(value, int) or isinstance(value, bool) or value < 0
    ):
        raise ValueError(f"{name!r} must be a whole number >= 0, got {value!r}")
    return value


def check_words(draft: LessonDraft | Lesson) -> None:
    """Refuse a lesson handed to the book in code (``Hindsight.add_lesson``) whose words hold
    what an edit or an import refuses (``models.check_lesson_text``), or whose names hold a
    lone surrogate, which no store can write (before: a TypeError from deep in the save).

    Raises:
        ValueError: naming the field, the character and where it is.
    """
    for name in ("advice", "root_cause", "general_rule"):
        check_lesson_text(repr(name), getattr(draft, name))
    for i, item in enumerate(draft.suggestions, 1):
        check_lesson_text(f"'suggestions' item {i}", item)
    f = draft.features
    names = [draft.task_type, draft.scope, f.step or "", f.error_type or "", *f.tools, *f.keywords]
    for name in names:
        if isinstance(name, str) and _SURROGATE_RE.search(name):
            raise ValueError(
                f"the lesson's names hold a lone surrogate ({name!r}), which no UTF-8 holds: "
                "decode the text it came from properly"
            )


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_date(name: str, value: Any) -> str:
    try:
        when = parse_ts(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"{name!r} must be an ISO date like 2025-01-31 or 2025-01-31T12:00:00Z, got {value!r}"
        ) from None
    try:
        return iso(when)
    except OverflowError:
        # "9999-12-31T23:00:00-05:00" is a valid date past the last instant UTC holds: it means
        # "for good" (as the year 1 with an offset east of UTC means "long ago").
        edge = datetime.max if when.year == datetime.max.year else datetime.min
        return iso(edge.replace(tzinfo=UTC))


def pin(lesson: Lesson, *, by: str, now: datetime | None = None) -> Lesson:
    """Pin a lesson: it never expires (``valid_until`` cleared)."""
    return edit(lesson, by=by, action="pin", now=now, pinned=True, valid_until=None)


def unpin(
    lesson: Lesson, *, by: str, now: datetime | None = None, validity: timedelta = DEFAULT_VALIDITY
) -> Lesson:
    """Unpin a lesson: it expires again, ``validity`` from now."""
    now = now or utcnow()
    return edit(
        lesson, by=by, action="unpin", now=now, pinned=False, valid_until=iso(now + validity)
    )


def reject(lesson: Lesson, *, by: str, now: datetime | None = None, reason: str = "") -> Lesson:
    """Reject a lesson: kept for the record (and to absorb repeats), never recalled."""
    out = edit(lesson, by=by, action="reject", now=now, status="rejected")
    if reason:
        out.history[-1]["reason"] = reason
    return out


def expire(lesson: Lesson, *, by: str, now: datetime | None = None, reason: str = "") -> Lesson:
    """Mark a lesson expired now (kept, not recalled)."""
    out = edit(lesson, by=by, action="expire", now=now, status="expired")
    if reason:
        out.history[-1]["reason"] = reason
    return out


def confirm(
    lesson: Lesson,
    *,
    by: str,
    now: datetime | None = None,
    validity: timedelta = DEFAULT_VALIDITY,
    settles_judged: bool = True,
) -> Lesson:
    """A person vouches for a lesson: active, quality ok, valid again if it had run out.

    Its helpful/harmful counts so far are recorded, so only failures after this confirmation can
    flag it as harmful again. Conflicts stay recorded; recall never injects both sides. It also
    says the wordings merged on the judge's word alone say the same (``judged_merges``), unless
    ``settles_judged`` is False (a conflict settled in its favour answers another question).
    """
    now = now or utcnow()
    changes: dict[str, Any] = {"status": "active", "quality": "ok"}
    if not lesson.pinned and (not lesson.valid_until or parse_ts(lesson.valid_until) <= now):
        changes["valid_until"] = iso(now + validity)
    out = edit(lesson, by=by, action="confirm", now=now, **changes)
    out.history[-1]["counts"] = {"helpful": out.helpful, "harmful": out.harmful}
    if not settles_judged:
        out.history[-1]["keeps_judged"] = True
    return out


def _unsettled_judged(lesson: Lesson) -> list[int]:
    """Where the history holds merges made on the pair judge's word alone that no person has
    settled: after the last confirmation by a person (but one that kept them open: a conflict
    settled answers another question), not split back out (``split_judged``), and not the
    advice now (a person's edit chose that wording)."""
    history = lesson.history
    settled = max(
        (
            i
            for i, e in enumerate(history)
            if e.get("action") == "confirm"
            and e.get("by") not in MACHINE_ACTORS
            and not e.get("keeps_judged")
        ),
        default=-1,
    )
    return [
        i
        for i in range(settled + 1, len(history))
        if history[i].get("action") == "merge"
        and (changes := history[i].get("changes") or {}).get("judged")
        and "split_into" not in changes
        and isinstance(wording := changes.get("merged_advice"), str)
        and wording != lesson.advice
    ]


def _judged_counts(changes: dict[str, Any]) -> tuple[int, int]:
    """(merges, support) one history entry of a merge on the judge's word stands for (a wording
    merged again is kept as one entry); 1 of support where an older entry does not say."""
    return max(1, int(changes.get("merges", 1))), max(0, int(changes.get("support_added", 1)))


def judged_merges(lesson: Lesson) -> list[dict[str, Any]]:
    """The wordings merged into ``lesson`` on the pair judge's word alone that no person has
    settled yet (confirming the lesson settles those merged before; ``split_judged`` takes them
    back out), each as ``{"wording", "at", "merges", "support", "source_task_ids"}``, oldest
    first (a wording merged more than once: every merge of it, ``at`` the latest)."""
    by_wording: dict[str, dict[str, Any]] = {}
    for i in _unsettled_judged(lesson):
        entry = lesson.history[i]
        changes = entry["changes"]
        merges, support = _judged_counts(changes)
        merge = by_wording.setdefault(
            changes["merged_advice"],
            {"wording": changes["merged_advice"], "merges": 0, "support": 0, "source_task_ids": []},
        )
        merge["at"] = entry.get("at")
        merge["merges"] += merges
        merge["support"] += support
        merge["source_task_ids"] = _merge_list(
            merge["source_task_ids"], changes.get("source_task_ids") or []
        )
    return list(by_wording.values())


def split_judged(
    lesson: Lesson, *, by: str, now: datetime | None = None, validity: timedelta = DEFAULT_VALIDITY
) -> tuple[Lesson, list[Lesson]]:
    """A person says the wordings merged into ``lesson`` on the pair judge's word alone
    (``judged_merges``) do not say what it says: each becomes a lesson of its own, waiting for
    review (confirm it, reject it, or merge it into another), with the support and sources its
    merges brought (those settled earlier too: the wording leaves the lesson whole) and
    ``lesson``'s task type, scope and features; ``lesson`` gives those back and never matches
    the wordings again. Returns ``(lesson, the new lessons)``; ``ValueError`` when there is no
    such merge to take back."""
    now = now or utcnow()
    out = copy.deepcopy(lesson)
    wordings = [m["wording"] for m in judged_merges(out)]
    if not wordings:
        raise ValueError(f"{lesson.lesson_id} holds no merge made on the model's word alone")
    support = dict.fromkeys(wordings, 0)
    sources: dict[str, list[str]] = {w: [] for w in wordings}
    entries = []
    for entry in out.history:
        changes = entry.get("changes") or {}
        wording = changes.get("merged_advice")
        if (
            entry.get("action") == "merge"
            and changes.get("judged")
            and isinstance(wording, str)
            and wording in support
            and "split_into" not in changes
        ):
            support[wording] += _judged_counts(changes)[1]
            sources[wording] = _merge_list(sources[wording], changes.get("source_task_ids") or [])
            entries.append(changes)
    parts: dict[str, Lesson] = {}
    for wording in wordings:
        part = Lesson(
            lesson_id=new_id("les"),
            task_type=out.task_type,
            advice=wording,
            features=copy.deepcopy(out.features),
            kind=out.kind,
            scope=out.scope,
            source_task_ids=list(sources[wording]),
            created_at=iso(now),
            updated_at=iso(now),
            valid_until=iso(now + validity),
            status="needs_review",
            support=max(1, support[wording]),
            language=detect_language(wording),
        )
        part.history.append(
            _history(
                now,
                by,
                "create",
                {"split_from": out.lesson_id, "source_task_ids": list(sources[wording])},
            )
        )
        part.history[-1]["reason"] = (
            f"merged into {out.lesson_id} on the model's word; {by} says it is not the same"
        )
        part.value_score = value_score(part, now)
        parts[wording] = part
        out.support = max(1, out.support - support[wording])
        out.source_task_ids = [t for t in out.source_task_ids if t not in sources[wording]]
    for changes in entries:  # marked: never listed, matched or split again
        changes["split_into"] = parts[changes["merged_advice"]].lesson_id
    out.updated_at = iso(now)
    out.value_score = value_score(out, now)
    new = list(parts.values())
    out.history.append(
        _history(
            now,
            by,
            "split",
            {"lessons": [p.lesson_id for p in new], "wordings": [p.advice for p in new]},
        )
    )
    return out, new


def review_reasons(lesson: Lesson, book: Mapping[str, Lesson] | None = None) -> list[str]:
    """Why a lesson needs a person's look: conflicts, suspect quality, harm (empty: it does not).

    With ``book`` (lessons by id), a conflict counts only while the other side is still live or
    waiting for review; rejected and expired lessons need nothing.
    """
    if lesson.status in {"rejected", "expired"}:
        return []
    reasons: list[str] = []
    open_conflicts = [
        cid
        for cid in lesson.conflicts
        if book is None or (cid in book and book[cid].status in {"active", "needs_review"})
    ]
    unsure = {
        cid
        for entry in lesson.history
        if entry.get("action") == "conflict" and (entry.get("changes") or {}).get("unsure")
        for cid in entry["changes"].get("conflicts", [])
    }
    read = [cid for cid in open_conflicts if cid not in unsure]
    unread = [cid for cid in open_conflicts if cid in unsure]
    if read:
        reasons.append("conflicts with " + ", ".join(read))
    if unread:
        reasons.append(
            "repeats or contradicts " + ", ".join(unread) + " (near text the rules cannot read)"
        )
    if lesson.quality == "suspect":
        reasons.append("suspect quality")
    if keeps_hurting(lesson):
        reasons.append(f"harmful: hurt {lesson.harmful} times, helped {lesson.helpful}")
    if judged := judged_merges(lesson):
        reasons.append(
            f"{len(judged)} wording{'s' if len(judged) > 1 else ''} merged on the model's word "
            "alone: do they say the same?"
        )
    split_from = next(
        (
            (e.get("changes") or {}).get("split_from")
            for e in lesson.history
            if e.get("action") == "create" and (e.get("changes") or {}).get("split_from")
        ),
        None,
    )
    if lesson.status == "needs_review" and split_from:
        reasons.append(f"split from {split_from}: the model called it the same, a person did not")
    if lesson.status == "needs_review" and not reasons:
        reasons.append("needs review")
    return reasons


# -- import and export --------------------------------------------------------------------------

_IMPORT_FIELDS = {
    "task_type", "advice", "tools", "intent", "scope", "keywords", "valid_until", "status",
    "pinned", "step", "error_type", "root_cause", "suggestions", "general_rule", "kind",
    "source_task_ids", "language", "structured",
}  # fmt: skip


def parse_import_line(obj: Any, *, now: datetime | None = None, by: str = "import") -> Lesson:
    """A lesson from one import line: an exported lesson, or a hand-written entry.

    A hand-written entry needs ``task_type`` and ``advice``; it may carry ``tools``, ``intent``,
    ``scope`` (``global``, ``project:NAME``, ``user:NAME``), ``keywords``, ``valid_until``,
    ``status``, ``pinned`` (and the other lesson texts: ``root_cause``, ``general_rule`` …).
    An exported lesson comes back as it was; a hand-written one gets a new id, 30 days of validity
    (unless pinned or given ``valid_until``) and a history entry by ``by``. Raises ``ValueError``
    saying what is wrong with the line.
    """
    now = now or utcnow()
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "lesson_id" in obj:
        return _parse_full(obj)
    unknown = sorted(set(obj) - _IMPORT_FIELDS)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(_IMPORT_FIELDS), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"unknown field {', '.join(hints)}; allowed: {', '.join(sorted(_IMPORT_FIELDS))}"
        )
    for name in ("task_type", "advice"):
        if not isinstance(obj.get(name), str) or not obj[name].strip():
            raise ValueError(f"missing {name!r}: every line needs 'task_type' and 'advice' as text")
    fields: dict[str, Any] = {}
    features: dict[str, Any] = {}
    for name, value in obj.items():
        if name == "structured":
            fields[name] = _parse_structured(value)
            continue
        checked = _check_field(name, value)
        if name in {"step", "error_type", "root_cause", "general_rule", "language"} and not (
            checked is None or isinstance(checked, str)
        ):
            raise ValueError(f"{name!r} must be text")
        (features if name in FEATURE_FIELDS else fields)[name] = checked
    pinned = fields.get("pinned", False)
    if pinned:
        fields["valid_until"] = None
    elif not fields.get("valid_until"):
        fields["valid_until"] = iso(now + DEFAULT_VALIDITY)
    fields.setdefault("language", detect_language(fields["advice"]))
    lesson = Lesson(
        lesson_id=new_id("les"),
        features=Features(**features),
        created_at=iso(now),
        updated_at=iso(now),
        history=[_history(now, by, "import", {})],
        **fields,
    )
    lesson.value_score = value_score(lesson, now)
    return lesson


def _parse_structured(value: Any) -> Structured | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("when", {}), dict):
        raise ValueError('\'structured\' must be an object like {"when": {...}, "prefer": {...}}')
    unknown = set(value) - {"when", "prefer", "avoid"}
    if unknown:
        raise ValueError(
            f"'structured' allows only 'when', 'prefer', 'avoid'; got {sorted(unknown)}"
        )
    if any(
        value.get(k) is not None and not isinstance(value[k], dict) for k in ("prefer", "avoid")
    ):
        raise ValueError("'structured': 'prefer' and 'avoid' must be objects like {\"tool\": ...}")
    return Structured(
        when=value.get("when") or {}, prefer=value.get("prefer"), avoid=value.get("avoid")
    )


def _parse_full(obj: dict[str, Any]) -> Lesson:
    if not isinstance(obj["lesson_id"], str) or not obj["lesson_id"].strip():
        raise ValueError("'lesson_id' must be non-empty text")
    for name in ("task_type", "advice"):
        if not isinstance(obj.get(name), str) or not obj[name].strip():
            raise ValueError(f"missing {name!r}: every line needs 'task_type' and 'advice' as text")
    if obj.get("features") is not None and not isinstance(obj["features"], dict):
        raise ValueError("'features' must be an object")
    # The shapes later reads rely on: a text where a list goes was stored as its characters
    # (a tool named "read_csv" became r, e, a, d …), and a history that is not a list of
    # objects broke every later review of the lesson.
    lists = [(name, obj.get(name)) for name in ("conflicts", "source_task_ids")]
    lists += [(f"features.{n}", (obj.get("features") or {}).get(n)) for n in ("tools", "keywords")]
    for name, value in lists:
        if value is not None and not _is_text_list(value):
            raise ValueError(f"{name!r} must be a list of strings, got {value!r}"[:200])
    _check_history(obj.get("history"))
    try:
        lesson = Lesson.from_dict({**obj, "structured": _parse_structured(obj.get("structured"))})
    except TypeError as exc:
        raise ValueError(f"not a lesson: {exc}") from None
    # Every field as an edit checks it, and kept as checked: a valid_until of 0 (1970) read as
    # "no date" and never expired; a value_score of "high" broke every recall that reached it.
    for name in sorted(
        _LESSON_FIELDS - {"lesson_id", "features", "structured", "history", "score"}
    ):
        setattr(lesson, name, _check_field(name, getattr(lesson, name)))
    for name in FEATURE_FIELDS:
        setattr(lesson.features, name, _check_field(name, getattr(lesson.features, name)))
    lesson.score = None
    return lesson


#: Counts and lists the history's readers take from an entry's ``changes``.
_HISTORY_NUMBERS = ("merges", "support", "support_added", "sources_not_sampled", "source_count")
_HISTORY_LISTS = ("conflicts", "lessons", "source_task_ids")


def _check_history(history: Any) -> None:
    """Refuse a restored history whose shape its readers (review, split, source counts) would
    trip on: one bad entry broke every later review of the whole book."""
    if history is None:
        return
    if not isinstance(history, list) or not all(isinstance(e, dict) for e in history):
        raise ValueError("'history' must be a list of objects")
    for i, entry in enumerate(history):
        changes, counts = entry.get("changes", {}), entry.get("counts", {})
        if not isinstance(changes, dict) or not isinstance(counts, dict):
            raise ValueError(f"history entry {i}: 'changes' and 'counts' must be objects")
        numbers = [changes.get(n) for n in _HISTORY_NUMBERS] + list(counts.values())
        if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in numbers):
            raise ValueError(f"history entry {i}: counts must be whole numbers")
        for name in _HISTORY_LISTS:
            value = changes.get(name)
            if value is not None and not _is_text_list(value):
                raise ValueError(f"history entry {i}: {name!r} must be a list of strings")


def export_jsonl(lessons: Sequence[Lesson]) -> str:
    """The lessons in their wire form, one JSON object a line (``import`` reads it back)."""
    lines = []
    for lesson in lessons:
        body = lesson.to_dict()
        body.pop("score", None)
        lines.append(orjson.dumps(body).decode())
    return "".join(line + "\n" for line in lines)


def export_markdown(lessons: Sequence[Lesson]) -> str:
    """The lessons as knowledge-base entries: one section per lesson, grouped by task type."""
    out = ["# Lessons", ""]
    if not lessons:
        out.append("_No lessons._")
        return "\n".join(out) + "\n"
    by_type: dict[str, list[Lesson]] = {}
    for lesson in lessons:
        by_type.setdefault(lesson.task_type, []).append(lesson)
    for task_type in sorted(by_type):
        out += [f"## {task_type}", ""]
        for lesson in by_type[task_type]:
            out += _markdown_entry(lesson)
    return "\n".join(out).rstrip() + "\n"


def _markdown_entry(lesson: Lesson) -> list[str]:
    f = lesson.features
    title = lesson.advice.splitlines()[0] if lesson.advice else lesson.lesson_id
    if len(title) > 80:
        title = title[:79] + "…"
    lines = [f"### {title}", ""]
    if title != lesson.advice:
        lines += [f"> {line}" for line in lesson.advice.splitlines()] + [""]
    meta = [
        ("id", f"`{lesson.lesson_id}`"),
        ("status", lesson.status + (" (pinned)" if lesson.pinned else "")),
        ("scope", lesson.scope),
        ("tools", ", ".join(f"`{t}`" for t in f.tools)),
        ("intent", f.intent or ""),
        ("step", f.step or ""),
        ("error type", f.error_type or ""),
        ("keywords", ", ".join(f.keywords)),
        ("support", str(lesson.support)),
        ("helpful / harmful", f"{lesson.helpful} / {lesson.harmful}"),
        ("value", f"{lesson.value_score:.2f}"),
        ("valid until", lesson.valid_until or ("never" if lesson.pinned else "")),
        ("conflicts", ", ".join(f"`{c}`" for c in lesson.conflicts)),
        ("sources", ", ".join(f"`{t}`" for t in lesson.source_task_ids)),
    ]
    lines += [f"- **{k}**: {v}" for k, v in meta if v]
    lines.append("")
    if lesson.root_cause:
        lines += [f"**Root cause.** {lesson.root_cause}", ""]
    if lesson.general_rule:
        lines += [f"**General rule.** {lesson.general_rule}", ""]
    if lesson.suggestions:
        lines += ["**Suggestions.**", ""] + [f"1. {s}" for s in lesson.suggestions] + [""]
    if lesson.structured:
        st = lesson.structured
        parts = [f"when `{orjson.dumps(st.when).decode()}`"]
        if st.prefer is not None:
            parts.append(f"prefer `{orjson.dumps(st.prefer).decode()}`")
        if st.avoid is not None:
            parts.append(f"avoid `{orjson.dumps(st.avoid).decode()}`")
        lines += [f"**Rule.** {', '.join(parts)}", ""]
    return lines


__all__ = [
    "Change",
    "apply_outcome",
    "check_scope",
    "confirm",
    "curate",
    "draft_to_lesson",
    "edit",
    "expire",
    "expire_due",
    "export_jsonl",
    "export_markdown",
    "keeps_hurting",
    "parse_import_line",
    "pin",
    "reject",
    "review_reasons",
    "source_count",
    "specificity",
    "stance",
    "stance_relation",
    "unpin",
    "value_score",
    "variants",
]
