"""Recall: the right few lessons for the task at hand, rendered as advice to inject.

Vector similarity alone confuses lessons that are phrased alike but do not transfer ("confirm the
city before asking for the weather" and "confirm the departure airport before searching flights").
So recall is rules first, ranking second (DESIGN.md):

1. The rule stage keeps only lessons that can apply: active, not expired (pinned lessons never
   expire), in scope (global plus the caller's own project/user scopes), of the same task type
   (or a lesson for any task type), sharing a tool with the task (a lesson without tools fits any
   task), and of the same intent class when both are known.
2. The rank stage scores the survivors by a fusion of cosine similarity, BM25 over a CJK-aware
   tokenization and the lesson's value score, plus boosts for an exact step / error-type match
   (and less for a lesson learned on another error than the one the request names, for the
   other act than the one the request reads as: a lookup or a change, and for a lesson whose
   own condition the request does not show: a remedy for a call gone wrong when nothing has,
   advice for later dates when the request is about today). Below a minimum score
   nothing is returned: no advice is better than wrong advice. One exception: when the text
   cannot judge (the lessons of the very call are all in the other language than the request,
   which the hashed embedder and BM25 compare only through identifiers and a small lexicon),
   the best of them by the rules alone is offered.
3. At most one of two conflicting lessons is returned: a pair curation recorded, or, when a
   recall gathers lessons curation never compared (no task type named, or two scopes of one
   kind), a pair read as contradicting there and then (``PairReadings``).

``LessonIndex`` is built once per version of the lesson book and queried many times: it keeps
the lessons sorted by task type so a query only touches its own task type's slice (plus the
lessons for any task type), and holds every rule-stage field as a numpy array, the vectors as one
matrix and the BM25 weights (computed by ``bm25s``) both term-major and lesson-major, so scoring
a few hundred survivors never walks the whole book.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import bm25s
import numpy as np

from hindsight_loop import lesson_keys
from hindsight_loop.embed import (
    _FLOOR_MIN,
    Embedder,
    cosine_floor,
    lesson_text,
    matvec,
    rescale_cosines,
)
from hindsight_loop.models import MAX_LESSONS, Intent, Lesson, parse_ts, reset_in_forked_child
from hindsight_loop.text import (
    CONCEPT_MARK,
    QUOTE_MAX,
    concepts,
    defuse,
    detect_language,
    is_cjk,
    tokenize,
)

__all__ = [
    "LessonIndex",
    "LessonSet",
    "Ranking",
    "RecallQuery",
    "classify_intent",
    "inject",
]

_ANY_TASK_TYPES = lesson_keys.ANY_TASK_TYPES


@dataclass(kw_only=True, slots=True)
class RecallQuery:
    """What the agent is about to do, as recall matches it."""

    task_type: str | None = None
    """The task's type; ``None`` does not filter on it."""
    tools: list[str] = field(default_factory=list)
    """The tools the agent has; empty means unknown, so tools do not filter."""
    query: str = ""
    """Free text: the goal, the user's request, an error message (English or Chinese)."""
    intent: str | None = None
    """``query`` / ``operation`` / ``analysis``; ``None`` does not filter on it."""
    scope: str | Sequence[str] | None = None
    """The caller's own scope(s), e.g. ``"user:alice"`` or ``["project:web", "user:alice"]``.
    Global lessons are always in scope; ``None`` means global only."""
    step: str | None = None
    """The agent's current step label; an exact match ranks a lesson higher."""
    error_type: str | None = None
    """The error just met (``EncodingError``); an exact match ranks a lesson higher."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Ranking:
    """How the rank stage weighs its signals and where it cuts off."""

    vector: float = 0.5
    """Weight of cosine similarity in the text relevance."""
    bm25: float = 0.5
    """Weight of normalized BM25 in the text relevance."""
    scenario: float = 0.2
    """Share of relevance that comes from the scenario match (exact task type, tool overlap)
    rather than the text; all of it when the query has no text."""
    step_boost: float = 0.1
    """Added when the lesson's step equals the query's step."""
    error_boost: float = 0.15
    """Added when the lesson's error type equals the query's error type."""
    error_miss: float = 0.15
    """Taken off when the request is about an error (its error type, or an error it names:
    "failed with the same FileNotFoundError") and the lesson was learned on another one."""
    intent_miss: float = 0.15
    """Taken off when the caller gives no intent, the request reads as looking something up
    or as changing something (``intent_missed``), and the lesson was learned for the other of
    the two. Only a penalty, not the rule stage's filter: the reading is keyword rules and can
    be wrong. An analysis request (compare, explain) is held against no lesson: it often
    looks things up too ("compare flight prices")."""
    remedy_miss: float = 0.15
    """Taken off a lesson whose advice is a remedy for an outcome ("When read_csv fails with
    a codec error, …", "If search_flights returns no results, …", "…报错时，…") when the request
    reports no outcome (``reports_outcome``): nothing has gone wrong yet, so the advice's own
    condition does not hold. A precaution learned on an error ("Call X with … from the start")
    is not a remedy and is not held back."""
    time_miss: float = 0.15
    """Taken off a lesson about later dates ("for any date after today", "用户问明天或下周的天气时")
    when the request speaks of the present only ("today", "right now", 今天, 目前) and of no
    later time: the lesson's own condition does not hold."""
    condition: bool = True
    """Keep a remedy whose condition the request reports (``condition_kinds``: the same kind
    of failure, "times out" and "timed out", or a failure repeated, "fails twice" and "failed
    again, the 2nd time") against a better-scoring lesson: it needs only the floor of a strong
    rule match, not ``relative`` (or ``near``) of the best. The relative cut is there to drop
    the best lesson's neighbours; a lesson whose own condition holds speaks to another fact of
    the request (a general "stop retrying after the same error twice" next to the tool's own
    remedy for that error), and the text of a general lesson shares few words with any one
    request."""
    condition_boost: float = 0.15
    """Added to such a lesson (``condition``), as ``error_boost`` is to a lesson learned on the
    request's error type: its condition holds."""
    value_floor: float = 0.7
    """The score is relevance x (value_floor + value_span x value_score): a lesson's track
    record moves its rank, but cannot carry a lesson that does not match."""
    value_span: float = 0.6
    """See ``value_floor``: a value score of 0.5 leaves the relevance as it is."""
    min_score: float = 0.34
    """Below this, a lesson is a poor match and is not returned."""
    rule_slack: float = 0.1
    """A strong rule match (a lesson written for the query's task type that names a tool of the
    call and shares a word or concept with the request, or whose tool is named for what the
    request speaks of: "put it into the bucket" / ``upload_object``) needs ``min_score`` less
    this: the rules already say it is about this very situation, so a request sharing few words
    with its advice ("where is my package?" / "ask for the order number") does not cut it. A
    lesson the request shares nothing with still needs ``min_score`` ("fewer than 3 when
    nothing fits")."""
    relative: float = 0.75
    """A lesson scoring below this fraction of the best one is left out too."""
    near: float = 0.75
    """Off by default (equal to ``relative``: no zone). Set above ``relative`` (0.9 was tried),
    a lesson scoring below this fraction of the best one (but above ``relative``) is kept
    only when it matches a word or concept of the request that no lesson chosen before it
    matched: it speaks to another part of the request ("… in the spreadsheet and verify the
    output"). One that matches nothing the better ones did not is their neighbour: the same
    situation with other advice (forecast vs current weather, reading vs deduplicating a CSV),
    and the request has already found its lesson. With ``relative`` 0 it is off too.
    At 0.9 it raised the retrieval splits' precision (tuning .845 -> .885) but on real runs
    (``bench/real_runs.py``, τ-bench) it left out a tool's other error lessons, which warn of
    other failures of the same call: errors anticipated 78% -> 56% of seen patterns."""

    unjudged: bool = True
    """When no lesson reaches its floor, and the lessons the rules tie wholly to the call
    (written for its task type, every tool they name among the call's tools) are all in the
    other language than the request, offer the best of them by the rules alone (scenario,
    boosts and track record). The hashed embedder and BM25 compare English with Chinese only
    through identifiers and the concept lexicon, so there a low text score is no evidence
    against a lesson, as it is in the request's own language. One lesson at most; none when one
    of those lessons is in the request's language (the text could judge it and found it
    wanting: nothing fits), or when the best one's rule score is below ``unjudged_min``."""
    tied: bool = True
    """Keep a lesson the rules tie to the call as tightly as they can, in the other language
    than the request (``tied_across``): written for its task type, naming two or more tools,
    all of them among the call's, and learned for the very intent the caller gives. Across
    languages the hashed embedder and BM25 cannot judge it (its score is its scenario's);
    the rules say it is about this very situation, so it is not cut for its text alone: it
    needs no text floor and no relative cut, only the score of a whole scenario match with no
    text (``scenario``: a penalty the request earns, a remedy when nothing failed, still
    cuts it) and the track record ``unjudged`` asks for. One tool, or no intent from the
    caller, ties a lesson too loosely: neighbours of the same tool are many. A lesson that
    shares a word or a concept with the request is not kept so: its text could judge it."""
    unjudged_min: float = 1.0
    """The rule score (``_fuse`` without the text) a lesson offered on its rules alone needs:
    1.0 is a whole scenario match with a neutral track record (value score 0.5); a lesson that
    has been hurting its tasks is not offered without text to back it."""

    def __post_init__(self) -> None:
        if self.vector < 0 or self.bm25 < 0 or self.vector + self.bm25 <= 0:
            raise ValueError("Ranking needs non-negative vector and bm25 weights, not both 0")


# -- results and injection ----------------------------------------------------------------

_PROMPT = {
    "en": (
        "Advice from earlier runs of similar tasks (how to use the tools):",
        "These lessons come from past experience; where one does not fit the current "
        "situation, follow the actual situation.",
    ),
    "zh": (
        "以往类似任务总结的经验（工具使用建议）：",
        "以上经验来自过去的任务；如与当前实际情况不符，请以实际情况为准。",
    ),
}


def _language(lesson: Lesson) -> str:
    # The stored field defaults to "en"; the advice text itself is the better witness.
    return "zh" if lesson.language == "zh" else detect_language(lesson.advice)


class LessonSet(list[Lesson]):
    """The lessons recall returned, best first, each with ``score`` set."""

    @property
    def ids(self) -> list[str]:
        """The lesson ids, in order."""
        return [lesson.lesson_id for lesson in self]

    def as_prompt(self) -> str:
        """Render the lessons as tool-usage advice, one bullet each (``""`` when empty).

        The header and the closing line are in Chinese when most of the lessons are.
        """
        if not self:
            return ""
        zh = sum(_language(lesson) == "zh" for lesson in self)
        header, footer = _PROMPT["zh" if zh * 2 > len(self) else "en"]
        lines = [header]
        for lesson in self:
            # The last gate before a prompt: a lesson imported from a file or written before the
            # reflectors' words were defused still reaches the model without instructions in it.
            advice = " ".join(defuse(lesson.advice).split())
            tools = [" ".join(defuse(t).split())[:QUOTE_MAX] for t in lesson.features.tools]
            lines.append(f"- [{', '.join(tools)}] {advice}" if tools else f"- {advice}")
        lines.append(footer)
        return "\n".join(lines)


def inject(
    messages: Sequence[Mapping[str, Any]],
    lessons: Sequence[Lesson],
    *,
    mode: Literal["insert", "append"] = "insert",
) -> list[dict[str, Any]]:
    """Return a new OpenAI-style message list with the lessons' advice in it.

    The default, ``mode="insert"``, adds one system message right before the last user message:
    after the system prompt and tool descriptions, next to the request it is about, and leaving
    the system prompt byte-for-byte unchanged so providers' prompt caches still hit. Some local
    chat templates accept a single leading system message only; for them ``mode="append"`` adds
    the advice to the end of the first system message instead (or creates one).

    The input list and its messages are not modified. With no lessons, the messages come back
    unchanged (as a new list).

    Args:
        messages: ``[{"role": ..., "content": ...}, ...]``.
        lessons: What recall returned (a ``LessonSet`` or any sequence of lessons).
        mode: ``"insert"`` or ``"append"``, see above.
    """
    out = [dict(m) for m in messages]
    prompt = (lessons if isinstance(lessons, LessonSet) else LessonSet(lessons)).as_prompt()
    if not prompt:
        return out
    if mode == "append":
        for i, message in enumerate(out):
            if message.get("role") in ("system", "developer"):
                content = message.get("content")
                if isinstance(content, list):  # content parts
                    message["content"] = [*content, {"type": "text", "text": prompt}]
                else:
                    message["content"] = f"{content}\n\n{prompt}" if content else prompt
                out[i] = message
                return out
        return [{"role": "system", "content": prompt}, *out]
    if mode != "insert":
        raise ValueError(f"unknown inject mode {mode!r}: use 'insert' or 'append'")
    last_user = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
    at = len(out) if last_user is None else last_user
    out.insert(at, {"role": "system", "content": prompt})
    return out


# -- intent ---------------------------------------------------------------------------------


def _split(text: str, sep: str | None = None) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(sep) if w.strip())


# English words (matched whole, lowercased) and phrases or Chinese words (matched as substrings)
# that point to each intent.
_INTENT_WORDS: dict[str, frozenset[str]] = {
    "analysis": frozenset(
        _split("""analyze analyse analysis analyzing analysing compare comparison contrast trend
        why explain evaluate evaluation assess assessment summarize summarise summary insight
        correlation correlate statistic breakdown diagnose investigate reason cause impact
        distribution growth forecast predict pattern""")
    ),
    "operation": frozenset(
        _split("""create make add insert delete remove drop update change modify edit set send
        email book reserve cancel schedule install deploy run execute write save upload download
        convert move rename fix repair clean import export order buy purchase pay transfer post
        submit generate build apply merge commit push restart stop start enable disable
        configure translate publish reply""")
    ),
    "query": frozenset(
        _split("""what which who whom when where whether show list find look search get check
        tell lookup fetch retrieve count price weather status""")
    ),
}
_INTENT_PHRASES: dict[str, tuple[str, ...]] = {
    "analysis": _split(
        "root cause|how come|分析|比较|对比|趋势|为什么|原因|评估|总结|统计|报告|洞察|归因|占比|"
        "同比|环比|预测|影响|怎么回事",
        "|",
    ),
    "operation": _split(
        "创建|新建|添加|删除|修改|更新|设置|发送|发邮件|预订|预定|订一|订个|取消|安排|安装|部署|"
        "运行|执行|保存|上传|下载|转换|移动|重命名|修复|清洗|清理|导入|导出|购买|支付|转账|提交|"
        "生成|翻译|写一|帮我写|回复",
        "|",
    ),
    "query": _split(
        "how much|how many|is there|are there|什么|哪|谁|几点|多少|吗|查询|查一下|查查|看看|搜索|"
        "找一下|告诉我|是否|怎么样|天气",
        "|",
    ),
}
#: The phrases written in ASCII, per intent: all an ASCII request can hold (recall reads every
#: request's intent, so the Chinese phrases are not tried on English text).
_INTENT_PHRASES_ASCII = {
    intent: tuple(p for p in phrases if p.isascii()) for intent, phrases in _INTENT_PHRASES.items()
}
# Analysis words are the most specific, then operation verbs; question words alone say least.
_INTENT_WEIGHT = {"analysis": 1.5, "operation": 1.2, "query": 1.0}
_WORD_RE = re.compile(r"[a-z]+")
_INTENTS: tuple[Intent, ...] = ("query", "operation", "analysis")


def classify_intent(text: str, *, model: Callable[[str], str] | None = None) -> Intent:
    """Classify a request as ``query`` (look something up), ``operation`` (change something)
    or ``analysis`` (explain, compare, find a cause), in English or Chinese.

    Keyword rules, offline and in microseconds. ``model`` optionally asks something better
    (an LLM call, a classifier): it gets the text and should answer one of the three labels;
    any other answer, or an exception, falls back to the rules.

    Returns:
        The intent; ``query`` when nothing points elsewhere.
    """
    if model is not None:
        try:
            answer = str(model(text)).strip().lower()
        except Exception:  # the model is optional help; the rules still answer
            answer = ""
        for intent in _INTENTS:
            if answer.startswith(intent):
                return intent
    return _read_intent(text) or "query"


def _read_intent(text: str) -> Intent | None:
    """What ``classify_intent``'s rules read in a request; ``None`` when nothing points
    anywhere (its "query" then is a default, not a reading)."""
    low = (text or "").lower()
    words = set(_WORD_RE.findall(low))
    table = _INTENT_PHRASES_ASCII if low.isascii() else _INTENT_PHRASES
    scores: dict[Intent, float] = {}
    for intent in _INTENTS:
        hits = len(words & _INTENT_WORDS[intent])
        hits += sum([phrase in low for phrase in table[intent]])
        scores[intent] = hits * _INTENT_WEIGHT[intent]
    if low.rstrip().endswith(("?", "？")):
        scores["query"] += 0.5
    best = max(_INTENTS[::-1], key=lambda i: scores[i])  # ties go to the more specific class
    return best if scores[best] > 0 else None


#: Reading and changing: a request read as one is held against a lesson learned for the other
#: (``Ranking.intent_miss``).
_OTHER_ACT: dict[str, str] = {"query": "operation", "operation": "query"}


def intent_missed(q: RecallQuery) -> str | None:
    """The intent key a lesson must not have for ``q`` (``Ranking.intent_miss``): the other
    act than the one its text reads as, when the caller gives no intent; else ``None``."""
    if q.intent or not q.query:
        return None
    read = _read_intent(q.query)
    return _OTHER_ACT.get(read) if read else None


# -- the index ------------------------------------------------------------------------------


_norm = lesson_keys.norm
_epoch = lesson_keys.valid_epoch


class _Vocab(dict[str, int]):
    """Strings to small ids, 0 reserved for "none"."""

    def id(self, value: str) -> int:
        if not value:
            return 0
        got = self.get(value)
        if got is None:
            got = self[value] = len(self) + 1
        return got


class LessonIndex:
    """The lesson book prepared for recall: build once per book version, search many times.

    Args:
        lessons: The book (any status: the rule stage drops what must not be recalled).
        embedder: Embeds the queries, and the lessons that ``vectors`` does not cover.
        vectors: Stored vectors by lesson id (from the same embedder); missing or
            wrong-sized ones are computed.
        ranking: Weights and cut-offs of the rank stage.
    """

    def __init__(
        self,
        lessons: Sequence[Lesson],
        *,
        embedder: Embedder,
        vectors: Mapping[str, np.ndarray] | None = None,
        ranking: Ranking | None = None,
        pairs: PairReadings | None = None,
    ) -> None:
        self.embedder = embedder
        self.ranking = ranking or Ranking()
        # Sorting by task type makes each task type one contiguous slice of every array.
        keyed = sorted(
            ((self._task_key(les.task_type), les) for les in lessons), key=lambda kl: kl[0]
        )
        self.lessons: list[Lesson] = [les for _, les in keyed]
        n = len(self.lessons)
        self._slices: dict[str, tuple[int, int]] = {}
        for i, (key, _) in enumerate(keyed):
            start, _end = self._slices.get(key, (i, i))
            self._slices[key] = (start, i + 1)

        self._scopes, self._intents, self._tool_ids = _Vocab(), _Vocab(), _Vocab()
        self._steps, self._errors = _Vocab(), _Vocab()
        self._active = np.fromiter((les.status == "active" for les in self.lessons), bool, n)
        self._valid_until = np.fromiter((_epoch(les) for les in self.lessons), np.float64, n)
        self._scope = np.fromiter(
            (self._scopes.id(self._scope_key(les.scope)) for les in self.lessons), np.int32, n
        )
        self._global_scope = self._scopes.id("global")
        self._intent = np.fromiter(
            (self._intents.id(_norm(les.features.intent)) for les in self.lessons), np.int32, n
        )
        self._step = np.fromiter(
            (self._steps.id(_norm(les.features.step)) for les in self.lessons), np.int32, n
        )
        self._error = np.fromiter(
            (self._errors.id(_norm(les.features.error_type)) for les in self.lessons), np.int32, n
        )
        self._value = np.clip(
            np.nan_to_num(
                np.fromiter((les.value_score for les in self.lessons), np.float64, n), nan=0.5
            ),
            0.0,
            1.0,
        ).astype(np.float32)
        self._specific = np.fromiter(
            (key not in _ANY_TASK_TYPES for key, _ in keyed), np.float32, n
        )
        flags = [advice_flags(les.advice) for les in self.lessons]
        self._remedy = np.fromiter((f[0] for f in flags), bool, n)
        self._later = np.fromiter((f[1] for f in flags), bool, n)
        self._kinds = np.fromiter((f[2] for f in flags), np.int8, n)
        self._zh = np.fromiter((_language(les) == "zh" for les in self.lessons), bool, n)
        # Tools as postings: for each tool, the sorted positions of the lessons naming it.
        postings: dict[int, list[int]] = {}
        tool_count = np.zeros(n, np.int32)
        for i, les in enumerate(self.lessons):
            names = {_norm(t) for t in les.features.tools} - {""}
            tool_count[i] = len(names)
            for name in names:
                postings.setdefault(self._tool_ids.id(name), []).append(i)
        self._tool_count = tool_count
        self._tool_names = [_tool_key(les.features.tools) for les in self.lessons]
        self._tool_postings = {t: np.asarray(p, np.int32) for t, p in postings.items()}

        self._conflicts: dict[str, set[str]] = {}
        for les in self.lessons:
            for other in les.conflicts:
                self._conflicts.setdefault(les.lesson_id, set()).add(other)
                self._conflicts.setdefault(other, set()).add(les.lesson_id)

        # The readings of the index before (``pairs``) hold for the lessons read alike.
        self._pairs = (
            pairs if pairs is not None and pairs.embedder is embedder else PairReadings(embedder)
        )

        texts = [lesson_text(les) for les in self.lessons]
        self._vectors = self._build_vectors(texts, vectors)
        self._build_bm25(texts)

    # -- building -------------------------------------------------------------------------

    _task_key = staticmethod(lesson_keys.task_key)
    _scope_key = staticmethod(lesson_keys.scope_key)

    def _build_vectors(
        self, texts: list[str], stored: Mapping[str, np.ndarray] | None
    ) -> np.ndarray:
        dim = self.embedder.dim
        matrix = np.zeros((len(texts), dim), np.float32)
        missing: list[int] = []
        for i, les in enumerate(self.lessons):
            vec = stored.get(les.lesson_id) if stored else None
            if vec is not None:
                vec = np.asarray(vec, np.float32).reshape(-1)
            if vec is None or vec.shape[0] != dim:
                missing.append(i)
            else:
                matrix[i] = vec
        if missing:
            matrix[missing] = self.embedder.embed([texts[i] for i in missing])
        return matrix

    def _build_bm25(self, texts: list[str]) -> None:
        self._vocab: dict[str, int] = {}
        docs = [
            [
                self._vocab.setdefault(tok, len(self._vocab))
                for tok in tokenize(text, with_concepts=True)
            ]
            for text in texts
        ]
        size = len(self._vocab)
        self._k1 = 1.5
        if not size:
            self._bm25 = None
            return
        self._scratch = threading.local()
        bm25 = bm25s.BM25(method="lucene", k1=self._k1)
        # bm25s computes the per-(lesson, term) BM25 weights as a term-major (CSC) matrix;
        # scoring happens here rather than in bm25s.get_scores, which would score the whole
        # book: recall only needs the few lessons that passed the rule stage.
        csc = bm25.build_index_from_ids(
            unique_token_ids=list(range(size)), corpus_token_ids=docs, show_progress=False
        )
        data = np.asarray(csc["data"], np.float32)
        rows = np.asarray(csc["indices"], np.int32)
        col_ptr = np.asarray(csc["indptr"], np.int64)
        df = np.diff(col_ptr)
        self._idf = np.log1p((len(docs) - df + 0.5) / (df + 0.5))
        self._max_idf = float(self._idf.max())
        # The same weights lesson-major (CSR), for scoring a handful of survivors directly.
        cols = np.repeat(np.arange(size, dtype=np.int32), df)
        order = np.argsort(rows, kind="stable")
        row_ptr = np.zeros(len(docs) + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=len(docs)), out=row_ptr[1:])
        self._bm25 = _Bm25(
            col_ptr=col_ptr,
            col_rows=rows,
            col_data=data,
            row_ptr=row_ptr,
            row_terms=cols[order],
            row_data=data[order],
        )

    def __len__(self) -> int:
        return len(self.lessons)

    @property
    def nbytes(self) -> int:
        """Memory held by the index's arrays (the lessons themselves not counted)."""
        arrays = [self._vectors, self._active, self._valid_until, self._scope, self._intent]
        arrays += [self._step, self._error, self._value, self._specific, self._tool_count]
        arrays += list(self._tool_postings.values())
        if self._bm25 is not None:
            arrays += [*dataclasses.astuple(self._bm25), self._idf]
        return int(sum(a.nbytes for a in arrays))

    # -- searching ------------------------------------------------------------------------

    def _ranges(self, task_key: str | None) -> list[tuple[int, int]]:
        if task_key is None:
            return [(0, len(self.lessons))]
        return [self._slices[k] for k in (task_key, "") if k in self._slices]

    def _rule_stage(
        self,
        start: int,
        end: int,
        now: float,
        scope_ids: list[int],
        intent_id: int | None,
        tool_ids: list[int] | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions in ``[start, end)`` that pass the rules, and how many query tools each
        shares (``None`` when the query names no tools)."""
        keep = self._active[start:end] & (self._valid_until[start:end] > now)
        scope = self._scope[start:end]
        in_scope = scope == self._global_scope
        for sid in scope_ids:
            in_scope |= scope == sid
        keep &= in_scope
        if intent_id is not None:
            intent = self._intent[start:end]
            keep &= (intent == 0) | (intent == intent_id)
        shared = None
        if tool_ids is not None:
            shared = np.zeros(end - start, np.int32)
            for tid in tool_ids:
                post = self._tool_postings[tid]
                lo, hi = post.searchsorted((start, end))
                shared[post[lo:hi] - start] += 1  # a tool's postings hold each lesson once
            keep &= (shared > 0) | (self._tool_count[start:end] == 0)
        pos = np.flatnonzero(keep)
        return pos + start, (shared[pos] if shared is not None else None)

    def _bm25_scores(self, idx: np.ndarray, term_ids: list[int]) -> np.ndarray:
        """BM25 of the lessons at ``idx`` for the query terms, whichever way is cheaper:
        through the survivors' own terms (few survivors) or the terms' postings (many)."""
        bm = self._bm25
        assert bm is not None
        terms = np.asarray(term_ids, np.int64)
        row_start = bm.row_ptr[idx]
        row_len = bm.row_ptr[idx + 1] - row_start
        by_rows = int(row_len.sum())
        col_start = bm.col_ptr[terms]
        col_len = bm.col_ptr[terms + 1] - col_start
        by_cols = int(col_len.sum())
        if by_rows == 0 or by_cols == 0:
            return np.zeros(idx.size, np.float32)
        if by_rows <= by_cols:
            # A 0/1 weight per vocabulary term, kept per thread and reset after use: zeroing
            # a vocabulary-sized array on every call would cost more than the scoring.
            wanted = getattr(self._scratch, "wanted", None)
            if wanted is None:
                wanted = self._scratch.wanted = np.zeros(len(self._vocab), np.float32)
            wanted[terms] = 1.0
            at = _ranges_flat(row_start, row_len, by_rows)
            try:
                weights = bm.row_data[at] * wanted[bm.row_terms[at]]
            finally:
                wanted[terms] = 0.0
            # Sum each survivor's segment; reduceat needs in-range offsets, hence the pad,
            # and returns the next element for an empty segment, hence the mask.
            offsets = np.cumsum(row_len) - row_len
            sums = np.add.reduceat(np.append(weights, np.float32(0)), offsets)
            return np.where(row_len > 0, sums, np.float32(0))
        at = _ranges_flat(col_start, col_len, by_cols)
        full = np.bincount(bm.col_rows[at], weights=bm.col_data[at], minlength=len(self.lessons))
        return full[idx]

    def _cosine(
        self, ranges: list[tuple[int, int]], found: list[tuple[np.ndarray, Any]], qvec: np.ndarray
    ) -> np.ndarray:
        parts = []
        for (start, end), (pos, _) in zip(ranges, found, strict=True):
            if pos.size * 3 > end - start:
                # Many survivors: one pass over the contiguous slice beats gathering rows.
                parts.append(matvec(self._vectors[start:end], qvec)[pos - start])
            elif pos.size:
                parts.append(matvec(self._vectors[pos], qvec))
        return np.concatenate(parts)

    def search(
        self,
        q: RecallQuery,
        *,
        limit: int = MAX_LESSONS,
        now: datetime | None = None,
        min_score: float | None = None,
    ) -> LessonSet:
        """Recall the lessons that fit ``q``, best first; fewer than ``limit`` (or none) when
        nothing else is a good enough match.

        Args:
            q: The task at hand.
            limit: At most this many lessons.
            now: The time validity is checked against (default: now, UTC).
            min_score: Override the ranking's minimum score.

        Returns:
            Copies of the lessons with ``score`` set; the index's own lessons are untouched.
        """
        if limit <= 0 or not self.lessons:
            return LessonSet()
        rk = self.ranking
        at = parse_ts(now).timestamp()  # None is now; a naive datetime is taken as UTC
        scopes = [q.scope] if isinstance(q.scope, str) else list(q.scope or [])
        scope_keys = [self._scope_key(x) for x in scopes]
        scope_ids = [self._scopes[k] for k in scope_keys if k in self._scopes]
        intent_id = self._intents.get(_norm(q.intent), -1) if q.intent else None
        query_tools = {_norm(t) for t in q.tools} - {""}
        tool_ids = [self._tool_ids[t] for t in query_tools if t in self._tool_ids]

        # 1. Rules.
        # "", "*" and "any" name no task type in particular: like None, they do not filter.
        task_type = self._task_key(q.task_type) or None
        ranges = self._ranges(task_type)
        found = [
            self._rule_stage(s, e, at, scope_ids, intent_id, tool_ids if query_tools else None)
            for s, e in ranges
        ]
        idx = np.concatenate([f[0] for f in found]) if found else np.zeros(0, np.int64)
        if not idx.size:
            return LessonSet()

        # 2. Rank. Scenario match: a lesson written for this very task type, and the share of
        # its tools the task has, say it was learned in the same situation.
        specific = self._specific[idx] if task_type is not None else 1.0
        tool_fit: np.ndarray | float = 0.5  # tools unknown, or a lesson without tools
        strong: tuple[np.ndarray, np.ndarray] | None = None
        if query_tools:
            shared = np.concatenate([f[1] for f in found])  # type: ignore[misc]
            count = self._tool_count[idx]
            tool_fit = np.where(count > 0, shared / np.maximum(count, 1), 0.5)
            if task_type is not None:
                strong = self._specific[idx], shared
        scenario = 0.5 * specific + 0.5 * tool_fit

        text = q.query.strip()
        matched: Callable[[int], frozenset[Any]] | None = None
        if text:
            terms = list(dict.fromkeys(tokenize(text, with_concepts=True)))
            term_ids, cover = [], []
            for t in terms:
                if (term_id := self._vocab.get(t)) is not None:
                    term_ids.append(term_id)
                    if _covers(t):
                        cover.append(term_id)
            matched = self._matched(idx, cover)
            qvec = self.embedder.embed([text])[0]
            # A model embedder scores unrelated text well above 0: measured from its floor,
            # its cosines mean what the ranking's cut-offs expect (tuned on the hashed one).
            floor = cosine_floor(self.embedder)
            cosine: np.ndarray | None = rescale_cosines(
                np.maximum(self._cosine(ranges, found, qvec), 0.0), floor
            )
            bm25: np.ndarray | float | None = 0.0
            if term_ids:
                # Normalized by what a lesson of average length holding every query term once
                # would score (Lucene BM25 gives idf / (1 + k1) per term there). Terms no lesson
                # has count as the rarest known term: matching one word of a long request is a
                # weak match, not a perfect one.
                # Unknown terms are counted as words: a concept tag not at all (it is a second
                # view of words that count already), a Chinese bigram as half a word (a run of n
                # characters, about n/2 words, yields n - 1 bigrams) and a lone Chinese
                # character not at all (its bigrams count it); otherwise an unmatched Chinese
                # request would weigh three to four times an English one of the same words.
                reference = _bm25_reference(
                    float(self._idf[term_ids].sum()),
                    unknown_weight(t for t in terms if t not in self._vocab),
                    self._max_idf,
                    self._k1,
                )
                bm25 = np.minimum(self._bm25_scores(idx, term_ids) / reference, 1.0)
        else:
            cosine = bm25 = None
        step_hit = error_hit = None
        if q.step and (step_id := self._steps.get(_norm(q.step))):
            step_hit = self._step[idx] == step_id
        if q.error_type and (error_id := self._errors.get(_norm(q.error_type))):
            error_hit = self._error[idx] == error_id
        error_miss = None
        if named := errors_named(q):
            ids = [i for e, i in self._errors.items() if _error_stem(e) in named]
            error = self._error[idx]
            error_miss = (error != 0) & ~np.isin(error, ids)
        intent_miss = None
        if (other := intent_missed(q)) and (other_id := self._intents.get(other)):
            intent_miss = self._intent[idx] == other_id
        remedy_miss = None if reports_outcome(q) else self._remedy[idx]
        time_miss = self._later[idx] if reads_present(q) else None
        kinds = condition_kinds(q) if rk.condition else 0
        held = condition_held(self._kinds[idx], self._zh[idx], q, kinds) if kinds else None
        score = _fuse(
            rk,
            idx.size,
            scenario,
            cosine,
            bm25,
            step_hit,
            error_hit,
            self._value[idx],
            error_miss,
            intent_miss,
            remedy_miss,
            time_miss,
            held,
        )
        tool_hit = None
        if strong is not None and (tags := _query_tags(text)):
            # Only the lessons the rules already tie to the call can be strong: few.
            tool_hit = np.zeros(idx.size, bool)
            for j in np.flatnonzero((strong[0] > 0) & (strong[1] > 0)).tolist():
                tool_hit[j] = _tools_named(self._tool_names[idx[j]], tags)
        strong_match = full = None
        if strong is not None:
            strong_match = _strong(*strong, bm25, tool_hit)
            full = _full_match(strong[0], strong[1], self._tool_count[idx])
        tied = None
        if rk.tied and full is not None and strong_match is not None and intent_id:
            tied = tied_across(
                rk,
                full & ~strong_match,
                self._tool_count[idx],
                self._intent[idx] == intent_id,
                self._zh[idx],
                _rules_only(
                    rk,
                    np.ones(idx.size, bool),
                    scenario,
                    step_hit,
                    error_hit,
                    self._value[idx],
                    error_miss,
                ),
                text,
            )
        chosen = _choose(
            rk,
            score,
            lambda j: self.lessons[idx[j]],
            lambda les: self._conflicts.get(les.lesson_id),
            limit=limit,
            min_score=min_score,
            strong=strong_match,
            matched=matched,
            held=held,
            tied=tied,
            clash=(
                self._pairs.clash if lesson_keys.gathers_uncompared(task_type, scope_keys) else None
            ),
        )
        if chosen or full is None or cosine is None or not rk.unjudged:
            return chosen
        rules = _rules_only(
            rk,
            full,
            scenario,
            step_hit,
            error_hit,
            self._value[idx],
            error_miss,
        )
        return _unjudged(rk, score, rules, lambda j: self.lessons[idx[j]], text)

    def _matched(self, idx: np.ndarray, cover: list[int]) -> Callable[[int], frozenset[int]]:
        """The ``cover`` terms (ids) the survivor at position ``j`` of ``idx`` holds."""
        wanted = frozenset(cover)
        bm = self._bm25

        def matched(j: int) -> frozenset[int]:
            if bm is None or not wanted:
                return frozenset()
            p = int(idx[j])
            return wanted.intersection(bm.row_terms[bm.row_ptr[p] : bm.row_ptr[p + 1]].tolist())

        return matched


def _covers(term: str) -> bool:
    """Whether a query term says which part of a request a lesson speaks to (``Ranking.near``):
    any but a lone Chinese character (its bigrams say more)."""
    return len(term) > 1 or not is_cjk(term)


#: An error's name in a request: ``FileNotFoundError``, ``pandas.errors.ParserError``.
_ERROR_NAME_RE = re.compile(
    r"(?<![A-Za-z0-9_])[A-Z][A-Za-z0-9]*(?:Error|Exception)(?![A-Za-z0-9_])"
)
_ERROR_SUFFIX_RE = re.compile(r"(?:error|exception)$")


def _error_stem(key: str) -> str:
    """An error type as errors are compared: normalized, without "Error" / "Exception" at the
    end (a lesson learned on ``Timeout`` is about the request's ``TimeoutError``)."""
    return _ERROR_SUFFIX_RE.sub("", key) or key


def errors_named(q: RecallQuery) -> set[str]:
    """The errors a request is about (``_error_stem`` of each): its error type when the caller
    gives one, else the error names its text holds (none: the request is not about a particular
    error, and no lesson is held against its error type)."""
    if q.error_type:
        names = [_norm(q.error_type)]
    else:
        names = [_norm(m) for m in _ERROR_NAME_RE.findall(q.query)] if q.query else []
    return {_error_stem(n) for n in names if n}


#: What a request says when something has gone wrong: an error, a failure, a refusal, an empty
#: or missing result, a call that does not work. Read generously: a request taken to report an
#: outcome only keeps its remedies from being held back.
_OUTCOME_EN_RE = re.compile(
    r"(?:error|exception|fail)|\b(?:returned|returns|returning|timed? out|times out|timeout|"
    r"crash\w*|rejected|refused|denied|forbidden|broken|broke|not found|does ?n[o']t exist|"
    r"no results?|empty|stuck|hang(?:s|ing)?|can'?t|cannot|couldn'?t|unable|won'?t|"
    r"does ?n[o']t work|not working|invalid|wrong|bug|issue|problem|missing|"
    r"(?:http|status|code)\s*[45]\d\d)\b",
    re.IGNORECASE,
)
_OUTCOME_ZH_RE = re.compile(
    r"报错|报[^。；，,;]{0,8}错|出错|错误|失败|返回|超时|异常|拒绝|崩溃|不存在|找不到|为空|没有结果|"
    r"挂了|挂掉|宕机|不行|无法|没法|打不开|连不上|卡住|卡死|出问题|问题|不对|错了|无效|失效"
)


#: A time after today, as a lesson's condition names it. Dates only: words of sequence (after
#: the payment, 下单以后, 接下来) say "after an event", not "a later day".
_LATER_EN = re.compile(
    r"\b(?:tomorrow|after today|upcoming|future|next (?:week|month|year|weekend|days?|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)|coming (?:week|month|days))\b",
    re.IGNORECASE,
)
_LATER_ZH = re.compile(r"明天|明日|后天|下周|下星期|下个星期|下个?月|明年|未来|将来")
#: The present, as a request speaks of it ("now" and 现在 alone are left out: "now send it" is
#: not a time).
_PRESENT_EN = re.compile(
    r"\b(?:today|right now|currently|current|at the moment|as of now)\b", re.IGNORECASE
)
_PRESENT_ZH = re.compile(r"今天|今日|目前|当前|此刻|实时|眼下")


def speaks_of_later(text: str) -> bool:
    """Whether a text names a time after today ("tomorrow", "next week", 明天, 下周)."""
    return bool(_LATER_EN.search(text) or _LATER_ZH.search(text))


def reads_present(q: RecallQuery) -> bool:
    """Whether a request speaks of the present ("today", "right now", 今天) and of no later
    time (``Ranking.time_miss``)."""
    text = q.query or ""
    present = _PRESENT_EN.search(text) or _PRESENT_ZH.search(text)
    return bool(present) and not speaks_of_later(text)


@functools.lru_cache(maxsize=1 << 14)
def advice_flags(advice: str) -> tuple[bool, bool, int]:
    """What a lesson's advice says of its own condition, as both candidate stages read it:
    whether it is a remedy (``Ranking.remedy_miss``), whether it is about later dates
    (``Ranking.time_miss``), and the kinds of failure its remedy's condition names
    (``Ranking.condition``, a mask of ``_FAILURE_KINDS``; 0 for a precaution)."""
    remedy = lesson_keys.is_remedy(advice)
    kinds = 0
    if remedy:
        for clause in _clauses(advice):
            if lesson_keys.names_failure(clause):
                kinds |= _kinds_in(clause)
    return remedy, speaks_of_later(advice), kinds


def reports_outcome(q: RecallQuery) -> bool:
    """Whether a request is about something that went wrong: its error type, or words of an
    error, a failure or an empty result in its text (``Ranking.remedy_miss``)."""
    if q.error_type or errors_named(q):
        return True
    text = q.query or ""
    return bool(_OUTCOME_EN_RE.search(text) or _OUTCOME_ZH_RE.search(text))


#: The kinds of failure a remedy's condition names and a request reports, as a bit each
#: (``Ranking.condition``). A kind is how a call went wrong, in words any domain uses: it timed
#: out, it was rate limited, it came back empty, or it failed again.
_FAILURE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timeout",
        re.compile(r"time[sd]? ?out|timing out|timeout|超时|没有响应|无响应", re.IGNORECASE),
    ),
    (
        "ratelimit",
        re.compile(
            r"\b429\b|rate[ -]?limit\w*|too many requests|throttl\w*|限流|请求过多|频率限制|请求太频繁",
            re.IGNORECASE,
        ),
    ),
    (
        "empty",
        re.compile(
            r"\b(?:no (?:results?|matches|rows|data)|nothing|empty|zero results)\b"
            r"|无结果|没有结果|没结果|为空|空结果|返回空|查不到|搜不到",
            re.IGNORECASE,
        ),
    ),
    (
        "repeat",
        re.compile(
            r"\b(?:again|twice|repeatedly|still|keeps?|kept|over and over|in a row|more than once"
            r"|same error|(?:\d+|two|three|four|five|several|multiple|many) times"
            r"|\d+(?:st|nd|rd|th) time|(?:second|third) time)\b"
            r"|[两二三四五六七八九十几多]+次|屡次|连续|反复|一再|再次|又|一直|还是|仍然|依然|同样的错",
            re.IGNORECASE,
        ),
    ),
)
#: Where one clause of advice or of a request ends: its condition and its action are apart.
_CLAUSE_END = re.compile(r"(?<=[，。；：！？])|(?<=[,;:!?.])(?=\s|$)|\s[—–-]+\s")


def _clauses(text: str) -> list[str]:
    return [c for c in _CLAUSE_END.split(text) if c and c.strip()]


def _kinds_in(text: str) -> int:
    return sum(1 << i for i, (_, rx) in enumerate(_FAILURE_KINDS) if rx.search(text))


#: "again" of an act the request proposes ("try again?", "if I print it to PDF again will it go
#: through?", "just run the whole thing again"): a retry asked for, not a failure repeated
#: ("failed again", "hit the timeout again"), so no "repeat" condition for it.
_RETRY_ASKED_RE = re.compile(
    r"\b(?:(?:try|retry|re-?run|run|redo|do|send|resend|submit|upload|print|call)\b"
    r"|if\s+(?:i|we|you)\b|(?:should|can|could|shall)\s+(?:i|we|you)\b|let(?:'s|\s+me|\s+us)\b)"
    r"[^,;.?!]{0,40}?\bagain\b",
    re.IGNORECASE,
)


def condition_kinds(q: RecallQuery) -> int:
    """The kinds of failure a request reports (``Ranking.condition``), as a mask of
    ``_FAILURE_KINDS``: those its error type names, and those of each clause of its text that
    reports something gone wrong; when the caller gives an error type or the text names an
    error, every clause is about it ("DeviceOffline … I've tapped it five or six times").
    None for a request to look something up or analyse it ("how many timeout errors today?"):
    there the failures are what it asks about, not what happened to its own call."""
    if not reports_outcome(q):
        return 0
    text = q.query or ""
    if q.intent in ("query", "analysis") or (not q.intent and _read_intent(text) == "analysis"):
        return 0
    named = bool(q.error_type or errors_named(q))
    kinds = _kinds_in(q.error_type) if q.error_type else 0
    for clause in _clauses(text):
        if named or _OUTCOME_EN_RE.search(clause) or _OUTCOME_ZH_RE.search(clause):
            kinds |= _kinds_in(_RETRY_ASKED_RE.sub(lambda m: m[0][: -len("again")], clause))
    return kinds


def condition_held(
    lesson_kinds: np.ndarray, lesson_zh: np.ndarray, q: RecallQuery, kinds: int
) -> np.ndarray:
    """Which lessons' conditions the request reports (``Ranking.condition``), from the kinds
    their advice names (``advice_flags``) and whether each is in Chinese; ``kinds`` is
    ``condition_kinds(q)``, read once per request by the caller. One condition is often
    written in both languages: then only the request's own language is held, the other is left
    to the ranking (the same advice twice is one lesson's worth)."""
    held = (np.asarray(lesson_kinds) & kinds) != 0 if kinds else np.zeros(len(lesson_kinds), bool)
    if held.any():
        own = np.asarray(lesson_zh) == (detect_language(q.query or "") == "zh")
        if (held & own).any():
            held &= own
    return held


def _strong(
    specific: np.ndarray | float,
    shared: np.ndarray,
    bm25: np.ndarray | float | None,
    tool_hit: np.ndarray | None = None,
) -> np.ndarray:
    """The survivors that are strong rule matches: written for the query's task type (not for
    any), naming a tool of the call, and sharing at least a word or a concept with the request
    (a hashed vector's character n-grams alone are no evidence: "translate this birthday card"
    scores a little against any English advice), or naming a tool whose name the request
    speaks of (``tool_hit``: "put report.pdf into the backups bucket" and ``upload_object``)."""
    strong = (np.asarray(specific) > 0) & (np.asarray(shared) > 0)
    if bm25 is not None:
        evidence = np.asarray(bm25) > 0
        if tool_hit is not None:
            evidence = evidence | tool_hit
        strong &= evidence
    return strong


def _full_match(specific: np.ndarray | float, shared: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The survivors the rules tie wholly to the call: written for its task type (not for
    any), naming at least one tool and every tool they name among the call's."""
    count = np.asarray(count)
    return (np.asarray(specific) > 0) & (count > 0) & (np.asarray(shared) == count)


def _rules_only(
    rk: Ranking,
    full: np.ndarray,
    scenario: np.ndarray | float,
    step_hit: np.ndarray | None,
    error_hit: np.ndarray | None,
    value: np.ndarray,
    error_miss: np.ndarray | None,
) -> np.ndarray | None:
    """What the rules alone say of the ``full`` matches (``_fuse`` without the text; ``-inf``
    for the other survivors), or ``None`` when there is none. ``Ranking.intent_miss`` is left
    out: it is read from the request's words by keyword rules, a guess that should not decide
    what the text cannot ("can you get it running?" reads as a question)."""
    if not full.any():
        return None
    n = full.size
    rules = _fuse(rk, n, scenario, None, None, step_hit, error_hit, value, error_miss)
    return np.where(full, rules, -np.inf)


def _unjudged(
    rk: Ranking,
    score: np.ndarray,
    rules: np.ndarray | None,
    lesson_at: Callable[[int], Lesson],
    query: str,
) -> LessonSet:
    """The lesson offered when none reached its floor (``Ranking.unjudged``): the best by
    ``rules`` (then by ``score``) of the full rule matches, when all of them are in the other
    language than the request."""
    if rules is None:
        return LessonSet()
    full = np.flatnonzero(np.isfinite(rules)).tolist()
    # Best first; equal keys keep the survivors' order, as every candidate stage has it.
    full.sort(key=lambda j: (-float(rules[j]), -float(score[j])))
    language = detect_language(query)
    if any(_language(lesson_at(j)) == language for j in full):
        return LessonSet()  # the text could compare it with the request, and did: nothing fits
    best = full[0]
    if float(rules[best]) < rk.unjudged_min - 1e-6:
        return LessonSet()
    return LessonSet([_with_score(lesson_at(best), round(float(score[best]), 4))])


def tied_across(
    rk: Ranking,
    full: np.ndarray,
    tool_count: np.ndarray,
    same_intent: np.ndarray,
    zh: np.ndarray,
    rules: np.ndarray | None,
    query: str,
) -> np.ndarray | None:
    """The survivors ``Ranking.tied`` keeps whatever their text: ``full`` rule matches naming
    two or more tools, learned for the caller's intent, in the other language than the
    request, with a rules-only score of at least ``unjudged_min``; ``None`` when there is none.
    The callers leave out of ``full`` the strong rule matches (``_strong``): a lesson sharing
    a word or a concept with the request was judged by its text, across languages too."""
    tied = full & (np.asarray(tool_count) >= 2) & np.asarray(same_intent)
    if not tied.any() or rules is None:
        return None
    tied &= np.asarray(zh) != (detect_language(query) == "zh")
    tied &= np.asarray(rules) >= rk.unjudged_min - 1e-6
    return tied if tied.any() else None


def _tool_key(tools: Iterable[str]) -> tuple[str, ...]:
    """A lesson's tool names as both candidate stages hold them: normalized, sorted, once."""
    return tuple(sorted({_norm(t) for t in tools} - {""}))


def _query_tags(text: str) -> frozenset[str]:
    return frozenset(concepts(text)) if text else frozenset()


@functools.lru_cache(maxsize=1 << 12)
def _tool_tags(tools: tuple[str, ...]) -> frozenset[str]:
    """The concept tags of what a lesson's tools are named for: ``upload_object`` is
    ``~upload``, ``list_dir`` ``~list`` and ``~file`` (``text.concepts`` of the names' parts)."""
    return frozenset(concepts(" ".join(" ".join(tokenize(t, drop_stopwords=False)) for t in tools)))


def _tools_named(tools: tuple[str, ...], tags: frozenset[str]) -> bool:
    """Whether a request speaking of ``tags`` names what one of these tools does: among the
    tools of the call, it says which one it is about, in words the lesson's advice may not use
    ("where are the files in this folder?" and ``list_dir``)."""
    return bool(tools) and not tags.isdisjoint(_tool_tags(tools))


def _bm25_reference(known_idf: float, unknown: float, max_idf: float, k1: float) -> float:
    """What BM25 scores are divided by: see ``LessonIndex.search``."""
    return (known_idf + unknown * max_idf) / (1.0 + k1)


def _fuse(
    rk: Ranking,
    n: int,
    scenario: np.ndarray | float,
    cosine: np.ndarray | None,
    bm25: np.ndarray | float | None,
    step_hit: np.ndarray | None,
    error_hit: np.ndarray | None,
    value: np.ndarray,
    error_miss: np.ndarray | None = None,
    intent_miss: np.ndarray | None = None,
    remedy_miss: np.ndarray | None = None,
    time_miss: np.ndarray | None = None,
    condition_hit: np.ndarray | None = None,
) -> np.ndarray:
    """The rank stage's score of ``n`` survivors from their signals (``cosine`` is ``None``
    when the query has no text). One function for every candidate stage, so an index in
    memory and one in a database rank alike."""
    if cosine is not None:
        assert bm25 is not None
        text_fit = (rk.vector * cosine + rk.bm25 * bm25) / (rk.vector + rk.bm25)
        relevance = rk.scenario * scenario + (1.0 - rk.scenario) * text_fit
    else:
        relevance = np.broadcast_to(scenario, (n,)).astype(np.float64)
    if step_hit is not None:
        relevance = relevance + rk.step_boost * step_hit
    if error_hit is not None:
        relevance = relevance + rk.error_boost * error_hit
    if error_miss is not None:
        relevance = relevance - rk.error_miss * error_miss
    if intent_miss is not None:
        relevance = relevance - rk.intent_miss * intent_miss
    if remedy_miss is not None:
        relevance = relevance - rk.remedy_miss * remedy_miss
    if time_miss is not None:
        relevance = relevance - rk.time_miss * time_miss
    if condition_hit is not None:
        relevance = relevance + rk.condition_boost * condition_hit
    return relevance * (rk.value_floor + rk.value_span * value)


def _floors(rk: Ranking, min_score: float | None) -> tuple[float, float]:
    """The minimum score of (any survivor, a strong rule match)."""
    floor = rk.min_score if min_score is None else min_score
    return floor, floor - rk.rule_slack


def _tied_floor(rk: Ranking) -> float:
    """What a lesson ``Ranking.tied`` keeps must score: a whole scenario match with a neutral
    track record and no text, less a margin for rounding."""
    return rk.scenario - 1e-3


def _cutoff(rk: Ranking, best: float, min_score: float | None) -> float:
    """The lowest score any survivor may have and still be chosen next to the ``best``."""
    return max(min(_floors(rk, min_score)), best * rk.relative)


def _choose(
    rk: Ranking,
    score: np.ndarray,
    lesson_at: Callable[[int], Lesson],
    conflicts_of: Callable[[Lesson], set[str] | None],
    *,
    limit: int,
    min_score: float | None,
    strong: np.ndarray | None = None,
    matched: Callable[[int], frozenset[Any]] | None = None,
    held: np.ndarray | None = None,
    tied: np.ndarray | None = None,
    clash: Callable[[Lesson, Lesson], bool] | None = None,
) -> LessonSet:
    """Cut off, order, and keep conflicting lessons apart: the best ``limit`` of ``score``.

    ``strong`` marks the strong rule matches (``_strong``): their floor is ``rule_slack`` lower;
    every lesson still needs ``relative`` of the best one's score. ``matched`` gives the query
    terms a survivor holds (``None``: the query has no text): one below ``near`` of the best
    needs a term no lesson chosen before it holds. ``held`` marks the lessons whose condition
    the request reports (``Ranking.condition``): the floor of a strong match, and no relative
    cut. ``tied`` marks the lessons ``Ranking.tied`` keeps: the score of a whole scenario
    match without text, and no relative cut. ``clash`` tells whether a lesson contradicts
    one chosen before it though no conflict is recorded (``PairReadings.clash``; ``None``:
    the recall gathers only lessons curation compared, and reads no pair)."""
    floor, strong_floor = _floors(rk, min_score)
    bar = floor if strong is None else np.where(strong, strong_floor, floor)
    if held is not None:
        bar = np.where(held, strong_floor, bar)
    if tied is not None:
        bar = np.where(tied, _tied_floor(rk), bar)
        held = tied if held is None else held | tied
    good = np.flatnonzero(score >= bar)
    if not good.size:
        return LessonSet()
    head_size = max(64, 4 * limit)  # only the head is needed; conflicts skip only a few
    if good.size > head_size:
        good = good[np.argpartition(-score[good], head_size - 1)[:head_size]]
    order = good[np.argsort(-score[good], kind="stable")]
    best = float(score[order[0]])
    cutoff = best * rk.relative
    # ``relative=0`` asks for no relative cut at all: the near zone goes with it.
    near = best * rk.near if matched is not None and rk.relative > 0 else cutoff
    chosen = LessonSet()
    chosen_ids: set[str] = set()
    chosen_at: list[int] = []
    covered: set[Any] | None = None  # the terms the chosen lessons hold, once a lesson needs it
    for j in order.tolist():
        if held is not None and held[j]:
            pass  # its own condition holds: not a neighbour of the best
        elif score[j] < cutoff:
            if held is None:
                break
            continue
        elif score[j] < near:
            assert matched is not None
            if covered is None:
                covered = set().union(*map(matched, chosen_at))
            if matched(j) <= covered:
                continue  # a neighbour of a better lesson, adding nothing the request asks
        lesson = lesson_at(j)
        conflicts = conflicts_of(lesson)
        if conflicts and not conflicts.isdisjoint(chosen_ids):
            continue  # two contradicting lessons are never injected together
        if clash is not None and any(clash(other, lesson) for other in chosen):
            continue  # nor two that curation never compared and that contradict
        chosen.append(_with_score(lesson, round(float(score[j]), 4)))
        chosen_ids.add(lesson.lesson_id)
        chosen_at.append(j)
        if covered is not None:
            assert matched is not None
            covered |= matched(j)
        if len(chosen) == limit:
            break
    return chosen


#: Pair verdicts ``PairReadings`` keeps; past this many it starts afresh.
PAIR_VERDICTS_MAX = 4096


class PairReadings:
    """Contradictions between lessons curation never compared, read when one recall would
    return both; one reading per pair as the two read (``lessons.reading_key``), kept while
    the book changes around them (a score, a count, another lesson: a reading took 1-7 ms a
    pair, and every outcome reported changes the book).

    Curation compares a new lesson only with the lessons one recall may serve beside it
    (``lesson_keys.served_together``) and records the contradictions on both sides, which
    recall keeps apart. A recall that names no task type, or two scopes of one kind
    (``lesson_keys.gathers_uncompared``), may still gather two lessons never compared: "ask
    the user for the city before get_weather" (weather_query) and "do not ask for the city"
    (trip_planning). Such a pair is read here by curation's own rules (``lessons._relations``,
    as ``lessons.contradictions`` reads a lesson going live: the later lesson against the
    earlier, and near text the rules cannot read either way does not keep two live lessons
    apart). No judge is asked: a recall waits on no model.

    Args:
        embedder: Recall's embedder (curation's rules weigh the cosine of the two texts).
        on_clash: Called with the two lesson ids (earlier, later) of each pair read as
            contradicting, once until ``unreported`` says recording it failed, to record it (a
            recall writes nothing itself): review then shows the pair to a person. It must not
            wait on the store (``RecallCache`` hands the pair to a thread); an exception it
            raises is logged, never raised into the recall.
    """

    def __init__(
        self, embedder: Embedder, on_clash: Callable[[str, str], None] | None = None
    ) -> None:
        self.embedder = embedder
        self.on_clash = on_clash
        self._verdicts: dict[tuple[Any, Any], bool] = {}
        # Each lesson's reading key, with the lesson object it was read from (the same
        # object: the same key; the index's lessons are read once, not at every recall).
        self._keys: dict[str, tuple[Lesson, tuple[Any, ...]]] = {}
        self._reported: set[tuple[str, str]] = set()

    def clash(self, a: Lesson, b: Lesson) -> bool:
        """Whether ``a`` and ``b``, which curation never compared, contradict; ``False`` for
        a pair it did compare (a conflict it found is recorded on the lessons)."""
        if lesson_keys.served_together(a, b):
            return False
        earlier, later = sorted((a, b), key=lambda x: (x.created_at, x.lesson_id))
        # Imported here: curation's rules load (a fraction of a second of regexes) only when
        # a recall first meets such a pair, not with recall.
        from hindsight_loop.lessons import _relations, reading_key

        keys = self._keys
        pair = []
        for lesson in (earlier, later):
            known = keys.get(lesson.lesson_id)
            if known is None or known[0] is not lesson:
                if len(keys) >= PAIR_VERDICTS_MAX:
                    keys.clear()
                known = keys[lesson.lesson_id] = (lesson, reading_key(lesson))
            pair.append(known[1])
        key = (pair[0], pair[1])
        verdicts = self._verdicts
        verdict = verdicts.get(key)
        if verdict is None:
            try:
                _, found, unsure, _ = _relations(later, [earlier], embedder=self.embedder)
            except Exception:  # noqa: BLE001 - a reading that fails must not fail the recall
                logging.getLogger("hindsight_loop").exception(
                    "hindsight: reading lessons %s and %s for a contradiction failed",
                    earlier.lesson_id,
                    later.lesson_id,
                )
                found, unsure = [], set()
            verdict = bool(found) and earlier.lesson_id not in unsure
            if len(verdicts) >= PAIR_VERDICTS_MAX:
                verdicts = self._verdicts = {}
            verdicts[key] = verdict
        ids = (earlier.lesson_id, later.lesson_id)
        if verdict and self.on_clash is not None and ids not in self._reported:
            self._reported.add(ids)
            try:
                self.on_clash(*ids)
            except Exception:  # noqa: BLE001 - recording it must not fail the recall
                self._reported.discard(ids)
                logging.getLogger("hindsight_loop").exception(
                    "hindsight: recording the contradiction of %s and %s failed", *ids
                )
        return verdict

    def unreported(self, earlier_id: str, later_id: str) -> None:
        """Recording the pair failed: the next recall that reads it hands it over again."""
        self._reported.discard((earlier_id, later_id))


def unknown_weight(terms: Iterable[str]) -> float:
    """How many words the query terms no lesson has count for (see ``LessonIndex.search``)."""
    return sum(_unknown_weight(t) for t in terms)


def _unknown_weight(term: str) -> float:
    if term[0] == CONCEPT_MARK:
        return 0.0
    if is_cjk(term[0]):
        return 0.5 if len(term) == 2 else 0.0
    return 1.0


@dataclass(slots=True)
class _Bm25:
    """BM25 weights of every (lesson, term) pair, term-major and lesson-major."""

    col_ptr: np.ndarray
    col_rows: np.ndarray
    col_data: np.ndarray
    row_ptr: np.ndarray
    row_terms: np.ndarray
    row_data: np.ndarray


def _ranges_flat(starts: np.ndarray, lengths: np.ndarray, total: int) -> np.ndarray:
    """Concatenate ``arange(s, s + n)`` for every (s, n) pair without a Python loop."""
    shift = starts - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total)


_LESSON_FIELDS = tuple(f.name for f in dataclasses.fields(Lesson))


def _with_score(lesson: Lesson, score: float) -> Lesson:
    # A slot copy, not dataclasses.replace: that re-runs __init__ over every field, per result.
    copy = object.__new__(Lesson)
    for name in _LESSON_FIELDS:
        object.__setattr__(copy, name, getattr(lesson, name))
    copy.score = score
    return copy


# -- the candidate stage of a store that can filter and search vectors itself ----------------------

#: A book of at least this many lessons is recalled through its store's own candidate stage
#: (PostgreSQL with pgvector) whenever the in-memory index is not built or not current. Below
#: it a whole-book index builds in a fraction of a second, so recall simply waits for it; above
#: it the load grows with the book (tens of seconds at 100k lessons), and the stage answers
#: from the first call, with the same results, until the index is ready. The index, once
#: current, is faster per call (the stage reads every lesson that passes the rule index's
#: filters when cosines do not separate them; see bench/postgres.py).
STORE_STAGE_MIN = 2_000
#: Lessons asked of the vector index first: their scores set the bar the rest must clear.
STORE_STAGE_K = 100
#: The HNSW index finds the nearest lessons when the rule stage's index (status, task type)
#: yields at least this many rows; for fewer, reading those rows is cheaper than the index's
#: iterative scan, which passes over about ``STORE_STAGE_K`` / (share passing) graph nodes.
HNSW_MIN_ROWS = 5_000
#: BM25 as ``LessonIndex`` builds it (bm25s' defaults for the Lucene variant).
_BM25_K1, _BM25_B = 1.5, 0.75


class StoreStage:
    """Recall with the rule stage and the candidate search in the store; the same ranking.

    The results are those of a ``LessonIndex`` over the same book, not an approximation:

    1. The rule stage's filters (status, validity, scope, task type, intent, tools) run in SQL.
    2. The HNSW index gives the ``STORE_STAGE_K`` nearest lessons that pass them, scored here
       exactly; the score of the last lesson that would be returned (or the cut-off, when fewer
       would be) is the bar.
    3. The store returns every other lesson passing the rules whose score *bound* reaches the
       bar: cosine, scenario, boosts and value exactly (computed in SQL), BM25 bounded by the
       query terms the lesson holds (a term adds at most its idf). A lesson left out provably
       scores below the bar, so it could not have been returned.
    4. The candidates of 2 and 3 are ranked here by the very functions ``LessonIndex`` uses,
       with BM25's corpus statistics (lesson count, average length, document frequencies) read
       from the store, which keeps them over the whole book as ``LessonIndex`` computes them.

    Why a bound and not the index alone: an approximate nearest-neighbour list misses lessons
    that BM25, the scenario or the value score carry into the top three; the bound finds them.
    """

    def __init__(
        self,
        store: Any,
        embedder: Embedder,
        ranking: Ranking | None = None,
        pairs: PairReadings | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.ranking = ranking or Ranking()
        self.version = -1
        self._stats: tuple[int, int, int] = (0, 0, 0)
        self._counts: dict[str, int] = {}
        #: ``advice_flags`` by lesson id for this book version (the rows carry no advice), and
        #: whether the lesson is in Chinese.
        self._flags: dict[str, tuple[tuple[bool, bool, int], bool]] = {}
        self._pairs = pairs if pairs is not None else PairReadings(embedder)

    def refresh(self, version: int) -> int:
        """Read the book's BM25 statistics for ``version``; return the number of lessons."""
        if version != self.version:
            self._stats = self.store.recall_stats()
            self._counts = self.store.recall_counts()
            self._flags = {}
            self.version = version
        return self._stats[0]

    def search(
        self,
        q: RecallQuery,
        *,
        limit: int = MAX_LESSONS,
        now: datetime | None = None,
        min_score: float | None = None,
    ) -> LessonSet:
        """As ``LessonIndex.search`` over the store's book."""
        n_book, total_tokens, min_df = self._stats
        if limit <= 0 or not n_book:
            return LessonSet()
        rk = self.ranking
        scopes = [q.scope] if isinstance(q.scope, str) else list(q.scope or [])
        query_tools = sorted({_norm(t) for t in q.tools} - {""})
        task = lesson_keys.task_key(q.task_type) or None
        rules = lesson_keys.RuleFilter(
            now=parse_ts(now).timestamp(),
            task_key=task,
            scope_keys=[lesson_keys.scope_key(x) for x in scopes],
            intent_key=_norm(q.intent) if q.intent else None,
            tools=query_tools or None,
        )
        # The lowest floor any lesson may meet (a strong rule match's): the store's bound must
        # not leave out a lesson that ``_choose`` would keep.
        floor = min(_floors(rk, min_score))
        text = q.query.strip()
        # A lesson ``Ranking.tied`` keeps needs a lower score still, and no relative cut.
        may_tie = bool(rk.tied and text and task is not None and q.intent and len(query_tools) > 1)
        if may_tie:
            floor = min(floor, _tied_floor(rk))
        qvec: np.ndarray | None = None
        idf32: dict[str, np.float32] = {}
        reference = 1.0
        weights: dict[str, float] = {}
        cos_floor = None
        if text:
            terms = list(dict.fromkeys(tokenize(text, with_concepts=True)))
            df = self.store.term_frequencies(terms) if terms else {}
            known = [t for t in terms if t in df]
            qvec = np.asarray(self.embedder.embed([text])[0], np.float32)
            cos_floor = cosine_floor(self.embedder)
            if known:
                dfs = np.asarray([df[t] for t in known], np.float64)
                idf = np.log1p((n_book - dfs + 0.5) / (dfs + 0.5))
                max_idf = math.log1p((n_book - min_df + 0.5) / (min_df + 0.5))
                reference = _bm25_reference(
                    float(idf.sum()),
                    unknown_weight(t for t in terms if t not in df),
                    max_idf,
                    _BM25_K1,
                )
                for t in known:  # bm25s keeps idf in float32
                    idf32[t] = np.float32(math.log(1 + (n_book - df[t] + 0.5) / (df[t] + 0.5)))
                weights = {t: float(v) / reference for t, v in zip(known, idf, strict=True)}
        avgdl = np.float64(total_tokens) / n_book if n_book else np.float64(1.0)

        cover = frozenset(t for t in idf32 if _covers(t)) if text else None
        # A lesson whose condition the request reports gains ``condition_boost``, which the
        # store's bound does not hold (it needs the advice): every bound is lowered by the
        # most it can add, so it stays a bound. Such a lesson is kept at the lowest floor,
        # whatever the best one scores (``Ranking.condition``).
        kinds = condition_kinds(q) if rk.condition else 0
        boost = rk.condition_boost * (rk.value_floor + rk.value_span) if kinds else 0.0
        clash = (
            self._pairs.clash
            if lesson_keys.gathers_uncompared(rules.task_key, rules.scope_keys)
            else None
        )

        def scored(
            rows: list[tuple[Any, ...]],
        ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
            return self._score(
                rows, q, task, query_tools, qvec, cos_floor, idf32, reference, avgdl, kinds
            )

        def score(
            rows: list[tuple[Any, ...]],
        ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
            got = scored(rows)
            return got[0], got[1], got[3]

        def bound(at_least: float) -> lesson_keys.ScoreBound:
            return lesson_keys.ScoreBound(
                model=self.embedder.name,
                vector=qvec.tolist() if qvec is not None else None,
                cos_floor=cos_floor if cos_floor is not None and cos_floor >= _FLOOR_MIN else None,
                term_weights=weights,
                specific_counts=task is not None,
                tool_fit_max=1.0 if query_tools else 0.5,
                step_key=_norm(q.step),
                error_key=_norm(q.error_type),
                vector_weight=rk.vector,
                bm25_weight=rk.bm25,
                scenario_weight=rk.scenario,
                step_boost=rk.step_boost,
                error_boost=rk.error_boost,
                value_floor=rk.value_floor,
                value_span=rk.value_span,
                # Below the bar by a margin for rounding (SQL's float8 against numpy's
                # float32, and the 4 decimals returned scores are rounded to).
                at_least=at_least - 1e-3 - boost,
            )

        def choose(rows: list[tuple[Any, ...]]) -> LessonSet:
            """What recall returns of ``rows`` alone."""
            return self._choose(
                rows,
                *score(rows),
                limit=limit,
                min_score=min_score,
                cover=cover,
                kinds=kinds,
                q=q,
                clash=clash,
            )

        def bar_of(rows: list[tuple[Any, ...]]) -> float:
            """What a lesson must score to change the result of ranking ``rows`` alone."""
            found = choose(rows)
            if not found:
                return floor
            if len(found) == limit:
                return min(x.score or 0.0 for x in found)
            if kinds or may_tie:
                return floor
            return _cutoff(rk, max(x.score or 0.0 for x in found), min_score)

        keys = (task, "") if task is not None else tuple(self._counts)
        rows: list[tuple[Any, ...]]
        if qvec is not None and sum(self._counts.get(k, 0) for k in keys) >= HNSW_MIN_ROWS:
            # Many lessons pass the rule index: the HNSW index gives near ones to set the bar,
            # then every lesson whose bound reaches it.
            rows = self.store.recall_nearest(
                rules, qvec.tolist(), self.embedder.name, STORE_STAGE_K, hnsw=True
            )
            rows.sort(key=self._tie_order(task))
            more = self.store.recall_bounded(rules, bound(bar_of(rows) if rows else floor))
        else:
            # Few: one pass over them, highest bound first; the rest only if one of them
            # might still reach the bar of the first ``STORE_STAGE_K``.
            rows = self.store.recall_bounded(rules, bound(floor), top=STORE_STAGE_K)
            more = []
            if len(rows) == STORE_STAGE_K:
                last = float(rows[-1][-1])
                rows.sort(key=self._tie_order(task))
                bar = bar_of(rows)
                if last >= bar - 1e-3:
                    more = self.store.recall_bounded(rules, bound(bar))
        seen = {r[1] for r in rows}
        rows += [r for r in more if r[1] not in seen]
        if rows:
            rows.sort(key=self._tie_order(task))
            found = choose(rows)
            if found:
                return found
        if not (text and task is not None and query_tools and rk.unjudged):
            return LessonSet()
        # Nothing reached its floor: the lesson offered on its rules alone (``_unjudged``) may
        # score anywhere, so every lesson passing the rules is read (rare: only then).
        seen = {r[1] for r in rows}
        rows += [r for r in self.store.recall_bounded(rules, bound(0.0)) if r[1] not in seen]
        if not rows:
            return LessonSet()
        rows.sort(key=self._tie_order(task))
        all_scores, _, rules_score, _ = scored(rows)
        bodies = self.store.lesson_bodies(
            [rows[j][1] for j in np.flatnonzero(np.isfinite(rules_score)).tolist()]
            if rules_score is not None
            else []
        )
        return _unjudged(rk, all_scores, rules_score, lambda j: bodies[rows[j][1]], text)

    @staticmethod
    def _tie_order(task: str | None) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
        # LessonIndex's order of survivors: the task type's own lessons, then those for any
        # task type (or, with no task type, by task type), each in the book's order; its sort
        # is stable, so equal scores keep this order.
        if task is None:
            return lambda r: (r[2], r[0])
        return lambda r: (r[2] == "", r[0])

    def _score(
        self,
        rows: list[tuple[Any, ...]],
        q: RecallQuery,
        task: str | None,
        query_tools: list[str],
        qvec: np.ndarray | None,
        cos_floor: float | None,
        idf32: dict[str, np.float32],
        reference: float,
        avgdl: np.float64,
        kinds: int,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """The rows' scores (``_fuse``), which are strong rule matches (``_strong``), what
        the rules alone say of the full matches (``_rules_only``), and which are kept whatever
        their text (``tied_across``)."""
        n = len(rows)
        rk = self.ranking
        specific = (
            np.fromiter((r[2] != "" for r in rows), np.float32, n) if task is not None else 1.0
        )
        tool_fit: np.ndarray | float = 0.5
        strong: tuple[np.ndarray, np.ndarray] | None = None
        count = np.zeros(n, np.int32)
        if query_tools:
            wanted = set(query_tools)
            shared = np.fromiter((len(wanted.intersection(r[3])) for r in rows), np.int32, n)
            count = np.fromiter((len(r[3]) for r in rows), np.int32, n)
            tool_fit = np.where(count > 0, shared / np.maximum(count, 1), 0.5)
            if task is not None:
                strong = np.broadcast_to(specific, (n,)), shared
        scenario = 0.5 * specific + 0.5 * tool_fit
        cosine: np.ndarray | None = None
        bm25: np.ndarray | float | None = None
        if qvec is not None:
            assert cos_floor is not None
            cosine = rescale_cosines(np.maximum(matvec(self._vectors(rows), qvec), 0.0), cos_floor)
            bm25 = 0.0
            if idf32:
                k1, b = _BM25_K1, _BM25_B
                sums = np.zeros(n, np.float32)
                for i, r in enumerate(rows):
                    tokens = r[7]
                    have = [t for t in idf32 if t in tokens]
                    if not have:
                        continue
                    dl = len(tokens)
                    norm_len = k1 * ((1 - b) + b * dl / avgdl)
                    tfs = np.asarray([tokens.count(t) for t in have], np.float32)
                    idfs = np.asarray([idf32[t] for t in have], np.float32)
                    sums[i] = (idfs * (tfs / (norm_len + tfs))).astype(np.float32).sum()
                bm25 = np.minimum(sums / reference, 1.0)
        step_hit = error_hit = None
        if q.step and (step := _norm(q.step)):
            step_hit = np.fromiter((r[4] == step for r in rows), bool, n)
        if q.error_type and (error := _norm(q.error_type)):
            error_hit = np.fromiter((r[5] == error for r in rows), bool, n)
        error_miss = None
        if named := errors_named(q):
            error_miss = np.fromiter(
                (r[5] != "" and _error_stem(r[5]) not in named for r in rows), bool, n
            )
        value = np.fromiter((r[6] for r in rows), np.float32, n)
        intent_miss = None
        if other := intent_missed(q):
            intent_miss = np.fromiter((r[10] == other for r in rows), bool, n)
        remedy_miss = time_miss = None
        present, calm = reads_present(q), not reports_outcome(q)
        if present or calm:
            flags = self._advice_flags(rows)
            if calm:
                remedy_miss = np.fromiter((f[0] for f in flags), bool, n)
            if present:
                time_miss = np.fromiter((f[1] for f in flags), bool, n)
        held = self._held(rows, q, kinds) if kinds else None
        score = _fuse(
            rk,
            n,
            scenario,
            cosine,
            bm25,
            step_hit,
            error_hit,
            value,
            error_miss,
            intent_miss,
            remedy_miss,
            time_miss,
            held,
        )
        if strong is None:
            return score, None, None, None
        tool_hit = None
        if tags := _query_tags(q.query.strip()):
            tool_hit = np.fromiter((_tools_named(_tool_key(r[3]), tags) for r in rows), bool, n)
        full = _full_match(*strong, count)
        rules = _rules_only(rk, full, scenario, step_hit, error_hit, value, error_miss)
        strong_match = _strong(*strong, bm25, tool_hit)
        tied = None
        if rk.tied and qvec is not None and q.intent and (intent := _norm(q.intent)):
            same = np.fromiter((r[10] == intent for r in rows), bool, n)
            candidates = full & ~strong_match & (count > 1) & same
            if candidates.any():
                # Only these few need their language, read with their advice.
                subset = [rows[j] for j in np.flatnonzero(candidates).tolist()]
                self._advice_flags(subset)
                zh = np.fromiter(
                    (
                        bool(c) and self._flags[r[1]][1]
                        for r, c in zip(rows, candidates, strict=True)
                    ),
                    bool,
                    n,
                )
                every = np.ones(n, bool)
                tied = tied_across(
                    rk,
                    candidates,
                    count,
                    same,
                    zh,
                    _rules_only(rk, every, scenario, step_hit, error_hit, value, error_miss),
                    q.query,
                )
        return score, strong_match, rules, tied

    def _held(
        self, rows: list[tuple[Any, ...]], q: RecallQuery | None, kinds: int
    ) -> np.ndarray | None:
        """``condition_held`` for the rows' lessons (``kinds``: ``condition_kinds(q)``)."""
        if q is None:
            return None
        flags = self._advice_flags(rows)
        lesson_kinds = np.fromiter((f[2] for f in flags), np.int8, len(rows))
        zh = np.fromiter((self._flags[r[1]][1] for r in rows), bool, len(rows))
        return condition_held(lesson_kinds, zh, q, kinds)

    def _advice_flags(self, rows: list[tuple[Any, ...]]) -> list[tuple[bool, bool, int]]:
        """``advice_flags`` of the rows' lessons, read once per lesson and book version."""
        missing = [r[1] for r in rows if r[1] not in self._flags]
        if missing:
            bodies = self.store.lesson_bodies(missing)
            for lesson_id in missing:
                body = bodies.get(lesson_id)
                self._flags[lesson_id] = (
                    (advice_flags(body.advice), _language(body) == "zh")
                    if body
                    else ((False, False, 0), False)
                )
        return [self._flags[r[1]][0] for r in rows]

    def _vectors(self, rows: list[tuple[Any, ...]]) -> np.ndarray:
        """The rows' stored vectors; one missing or of another model is embedded here, in
        memory, as ``LessonIndex`` does (storing it is ``Curator.reembed``'s job)."""
        dim = self.embedder.dim
        matrix = np.zeros((len(rows), dim), np.float32)
        missing = []
        for i, r in enumerate(rows):
            blob, model = r[8], r[9]
            if blob is not None and model == self.embedder.name and len(blob) == 4 * dim:
                matrix[i] = np.frombuffer(blob, np.float32)
            else:
                missing.append(i)
        if missing:
            bodies = self.store.lesson_bodies([rows[i][1] for i in missing])
            texts = [lesson_text(bodies[rows[i][1]]) for i in missing]
            matrix[missing] = self.embedder.embed(texts)
        return matrix

    def _choose(
        self,
        rows: list[tuple[Any, ...]],
        score: np.ndarray,
        strong: np.ndarray | None,
        tied: np.ndarray | None,
        *,
        limit: int,
        min_score: float | None,
        cover: frozenset[str] | None,
        kinds: int = 0,
        q: RecallQuery | None = None,
        clash: Callable[[Lesson, Lesson], bool] | None = None,
    ) -> LessonSet:
        # Lessons are read from the store only as the choice reaches them (a few), with the
        # conflicts each records; a conflict recorded on either side keeps the two apart.
        held = self._held(rows, q, kinds) if kinds else None
        bodies: dict[str, Lesson] = {}
        order = np.argsort(-score, kind="stable").tolist()

        def lesson_at(j: int) -> Lesson:
            lesson_id = rows[j][1]
            if lesson_id not in bodies:
                at = order.index(j)
                wanted = [rows[k][1] for k in order[at : at + limit + 8]]
                bodies.update(self.store.lesson_bodies(wanted))
            return bodies[lesson_id]

        named_by: dict[str, set[str]] = {}  # lesson id -> the lessons seen naming it

        def conflicts_of(lesson: Lesson) -> set[str]:
            clash = set(lesson.conflicts) | named_by.get(lesson.lesson_id, set())
            for other in lesson.conflicts:
                named_by.setdefault(other, set()).add(lesson.lesson_id)
            return clash

        return _choose(
            self.ranking,
            score,
            lesson_at,
            conflicts_of,
            limit=limit,
            min_score=min_score,
            strong=strong,
            matched=None if cover is None else lambda j: cover.intersection(rows[j][7]),
            held=held,
            tied=tied,
            clash=clash,
        )


# -- the index kept for a store -----------------------------------------------------------------

#: Books smaller than this are re-indexed on the spot when they change (a fraction of a second);
#: larger ones in the background while the previous index keeps serving recall.
SYNC_REBUILD_MAX = 2_000


#: The recall caches of this process, reset in a child forked from it (``RecallCache._forked``).
_CACHES: weakref.WeakSet[RecallCache] = weakref.WeakSet()
reset_in_forked_child(_CACHES, "recall cache")


class RecallCache:
    """The recall index of one store, rebuilt when the book changes; recall reads, never writes.

    A small book is re-indexed at once when it changes. A large one is re-indexed in a background
    thread while recall keeps serving the previous index, so no recall on the agent's path pays
    for a rebuild; lessons found by a stale index are re-checked against the book. Lessons whose
    stored embedding is missing or from another model are embedded in memory only (storing them
    is ``Curator.reembed``'s job, a write).

    Args:
        store: The lesson book (``list_lessons``, ``lesson_embeddings``, ``book_version``,
            ``get_lesson``).
        embedder: Returns the embedder (resolved lazily: a model is loaded on first use).
        on_clash: Records a contradiction between two lessons curation never compared, found
            by a recall (``PairReadings``), so review shows it.
    """

    def __init__(
        self,
        store: Any,
        embedder: Callable[[], Embedder],
        on_clash: Callable[[str, str], None] | None = None,
    ) -> None:
        self.store = store
        self._embedder = embedder
        self.on_clash = on_clash
        self._pairs: PairReadings | None = None
        # Pairs to record, handed to a thread that lives while there are some: a recall must
        # not wait for the store's write lock (another process writing held one for 30 s).
        self._to_record: collections.deque[tuple[str, str]] = collections.deque()
        self._recorder: threading.Thread | None = None
        self._recorder_lock = threading.Lock()
        self._index: LessonIndex | None = None
        self.version = -1
        self._lock = threading.Lock()
        self.closed = False
        self._stage: StoreStage | None = None
        self._stage_lock = threading.Lock()
        #: With a store stage: also build the in-memory index in the background and answer
        #: from it while it is current (memory for speed; False keeps only the stage).
        self.keep_index = True
        _CACHES.add(self)

    def _forked(self) -> None:
        """In a forked child: locks of its own. A fork while a thread of the parent rebuilt
        the index left the lock held in the child, whose recall then waited for good (1 of
        40 children recalling beside an agent at work)."""
        self._lock = threading.Lock()
        self._stage_lock = threading.Lock()
        self._recorder_lock = threading.Lock()
        self._recorder = None  # the parent's thread: not in this process

    def search(self, query: RecallQuery, *, limit: int) -> LessonSet:
        """The best lessons for ``query`` from the current book."""
        stage = self._store_stage()
        if stage is not None:
            # The in-memory index answers fastest once it is built and current; until then
            # (a new process, a book just changed) the store's stage answers, exactly and from
            # the book as it is, while the index is (re)built in the background.
            index = self._index
            if index is not None and self.version == stage.version:
                return index.search(query, limit=limit)
            if self.keep_index and not self._lock.locked():
                threading.Thread(target=self._rebuild_in_background, daemon=True).start()
            return stage.search(query, limit=limit)
        index, behind = self._current()
        found = index.search(query, limit=limit)
        if behind and found:
            # The index may predate a reject, an expiry or a conflict: check the few lessons
            # returned against the book itself.
            live = {
                x.lesson_id
                for x in (self.store.get_lesson(i) for i in found.ids)
                if x is not None and x.is_live()
            }
            found = LessonSet(x for x in found if x.lesson_id in live)
        return found

    def _store_stage(self) -> StoreStage | None:
        """The store's own candidate stage, when it has one and the book is large enough
        (``STORE_STAGE_MIN``); it reads the book as it is, so it is never behind: a large
        book is recalled from the first call, without waiting for it to load."""
        if not getattr(self.store, "has_vectors", False):
            return None
        stage = self._stage
        if stage is None:
            embedder = self._embedder()
            stage = self._stage = StoreStage(self.store, embedder, pairs=self._readings(embedder))
        version = self.store.book_version()
        with self._stage_lock:
            size = stage.refresh(version)
        return stage if size >= STORE_STAGE_MIN else None

    def _current(self) -> tuple[LessonIndex, bool]:
        """The index and whether it may be behind the book."""
        version = self.store.book_version()
        index = self._index
        if index is not None and version == self.version:
            return index, False
        if index is None or len(index) < SYNC_REBUILD_MAX:
            with self._lock:
                if self._index is None or self.version != self.store.book_version():
                    self._rebuild()
                assert self._index is not None
                return self._index, False
        if not self._lock.locked():
            threading.Thread(target=self._rebuild_in_background, daemon=True).start()
        return index, True

    def _rebuild_in_background(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another rebuild is under way
        try:
            if self.store.book_version() != self.version and not self.closed:
                self._rebuild()
        except Exception:  # noqa: BLE001 - the old index keeps serving
            logging.getLogger("hindsight_loop").exception("hindsight: re-indexing failed")
        finally:
            self._lock.release()

    def _rebuild(self) -> None:
        """Build the index from the store (call with ``_lock`` held)."""
        embedder = self._embedder()
        version = self.store.book_version()
        lessons = self.store.list_lessons()
        vectors = {
            lesson_id: np.frombuffer(blob, dtype=np.float32)
            for lesson_id, (model, blob) in self.store.lesson_embeddings().items()
            if model == embedder.name and blob is not None
        }
        self._index = LessonIndex(
            lessons, embedder=embedder, vectors=vectors, pairs=self._readings(embedder)
        )
        self.version = version

    def _readings(self, embedder: Embedder) -> PairReadings:
        """The pair readings of the index and the store stage, kept across rebuilds: a pair
        is read again only when what the rules read of it changes."""
        pairs = self._pairs
        if pairs is None or pairs.embedder is not embedder:
            record = self._record_later if self.on_clash is not None else None
            pairs = self._pairs = PairReadings(embedder, record)
        return pairs

    def _record_later(self, earlier_id: str, later_id: str) -> None:
        """Hand a contradiction a recall found to the recording thread (``on_clash``)."""
        self._to_record.append((earlier_id, later_id))
        with self._recorder_lock:
            thread = self._recorder
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._record_pending, name="hindsight-recall-conflicts", daemon=True
                )
                self._recorder = thread
                thread.start()

    def _record_pending(self) -> None:
        """Record the pairs handed over until none is left, then end (no thread idles)."""
        record = self.on_clash
        while record is not None and not self.closed:
            with self._recorder_lock:
                if not self._to_record:
                    self._recorder = None
                    return
                pair = self._to_record.popleft()
            try:
                record(*pair)
            except Exception:  # noqa: BLE001 - a later recall of the pair hands it over again
                logging.getLogger("hindsight_loop").warning(
                    "hindsight: recording the contradiction of %s and %s failed",
                    *pair,
                    exc_info=True,
                )
                if self._pairs is not None:
                    self._pairs.unreported(*pair)

    def wait_recorded(self, timeout: float = 10.0) -> bool:
        """Wait until the contradictions recalls found are recorded (or ``timeout`` seconds);
        whether none is left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._recorder_lock:
                if not self._to_record and self._recorder is None:
                    return True
            time.sleep(0.005)
        return False
