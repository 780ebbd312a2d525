"""A model's word on two lessons the curation rules cannot settle: the same advice, or opposite?

Curation decides most pairs by rules (structured forms, stance, text similarity). What is left is
a band of pairs close enough to matter and too far apart in words to call: Chinese rewordings that
share few characters ("调用天气接口前，先向用户确认城市" / "查询天气之前，先问清楚用户是哪个城市"),
synonyms the offline embedder does not know; and, when nothing repeats a new lesson, the lessons
of its tool and language it shares almost no words with (a rewording or an opposite in other
words). When a model is configured, it is asked about those pairs only (two per new lesson at
most), one short JSON answer each; any failure leaves the rules' decision as it was.

A model's "same" merges lessons the rules would keep apart, so a model that says "same" to
everything would merge opposite advice (a real one did: SmolLM2-135M-Instruct through
llama.cpp's OpenAI-compatible server merged 32 of the benchmark's 154 opposite pairs). So before
its first verdict counts, the judge is put to ``CANARIES``: six pairs whose answer is beyond
doubt, in English and Chinese. A model that misses any of them is not used (a warning says
which it missed); curation then keeps the rules' decisions, as without a model.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Literal

from hindsight_loop.llm import LLM, LLMError
from hindsight_loop.llm.parse import extract_json

log = logging.getLogger("hindsight_loop.llm.reflector")

Relation = Literal["same", "opposite", "different"]
RELATIONS: tuple[str, ...] = ("same", "opposite", "different")

#: Tokens an answer may take (``{"relation": "same"}`` and a short reason).
MAX_TOKENS = 120
#: Answers with no verdict in them a check pair may get before that is its answer.
MAX_UNREADABLE = 3
#: The longest wait before the check is tried again after an attempt that did not finish.
MAX_RETRY_SECONDS = 600.0

SYSTEM = (
    "You compare two pieces of advice written for an AI agent that uses tools. "
    "Answer with JSON only."
)
PROMPT = """Two lessons for the same kind of task (English or Chinese; the language does not
matter, only what each tells the agent to do).

Lesson A: {a}
Lesson B: {b}

Answer with one JSON object: {{"relation": "...", "reason": "..."}} where relation is
- "same": B gives the same advice as A, in other words (one may be more specific);
- "opposite": B tells the agent to do what A tells it not to do, or the reverse;
- "different": they are about different things.
Keep the reason under 20 words."""

_INVOICE = "Before calling send_invoice, check that the customer's billing address is filled in."
_FLIGHT = "调用 book_flight 之前，先向用户确认出发日期。"

#: Pairs any model fit to judge answers right, each relation in both languages: (A, B, relation).
#: Of no subject the benchmark's pairs are about, and never used to decide a real pair.
CANARIES: tuple[tuple[str, str, Relation], ...] = (
    (_INVOICE, "Make sure the billing address is present before you send_invoice.", "same"),
    (
        "Always ask the user to confirm before calling delete_files.",
        "Call delete_files right away; never ask the user to confirm.",
        "opposite",
    ),
    (
        _INVOICE,
        "send_invoice sets the currency from its currency field; it defaults to USD.",
        "different",
    ),
    (_FLIGHT, "先问清楚用户哪天出发，再去调 book_flight。", "same"),
    (_FLIGHT, "不用问用户出发日期，直接按今天的日期调用 book_flight。", "opposite"),
    (_FLIGHT, "book_flight 返回超时错误时，等几秒再重试一次。", "different"),
)


class PairJudge:
    """Asks a model whether two lessons say the same thing; ``None`` when it cannot tell, or when
    the model missed one of the ``CANARIES`` (asked before its first verdict, once answered).

    The check is asked by one thread at a time; the others get ``None`` meanwhile (the rules
    decide), as they do between attempts when a request of the check failed: the next attempt
    comes ``check_retry_seconds`` later (doubling, up to ten minutes) and asks only the pairs
    not yet answered. An answer with no verdict in it counts as one only the third time.
    """

    def __init__(
        self, llm: LLM, *, model: str | None = None, check_retry_seconds: float = 30.0
    ) -> None:
        self.llm = llm
        self.model = model
        self.check_retry_seconds = check_retry_seconds
        self.asked = 0
        """Pairs sent to the model for curation (each is one request); the canaries apart."""
        self.canary_requests = 0
        """Requests spent putting the model to the canaries."""
        self.trusted: bool | None = None
        """Whether the model answered every canary right; None until it is known."""
        self.missed: list[tuple[str, str, str, str | None]] = []
        """The canaries the model got wrong: (A, B, expected, its answer)."""
        self._answers: dict[int, str | None] = {}  # canary index: its final answer
        self._unreadable: dict[int, int] = {}  # canary index: answers with no verdict in them
        self._failures = 0  # attempts in a row that ended without knowing
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def __call__(self, a: str, b: str) -> Relation | None:
        if not self.qualify():
            return None
        self.asked += 1
        try:
            return self._ask(a, b)
        except LLMError as exc:
            log.warning("hindsight: judging a pair of lessons failed: %s", exc)
            return None

    def _ask(self, a: str, b: str) -> Relation | None:
        answer = self.llm.complete(
            PROMPT.format(a=_quote(a), b=_quote(b)),
            system=SYSTEM,
            model=self.model,
            json_mode=True,
            temperature=0.0,
            max_tokens=MAX_TOKENS,
        )
        data = extract_json(answer.text) or {}
        relation = str(data.get("relation", "")).strip().lower()
        return relation if relation in RELATIONS else None  # type: ignore[return-value]

    def qualify(self) -> bool | None:
        """Put the model to the canaries; whether its verdicts may count, None while that is not
        known (the check is under way in another thread, or waits to be tried again)."""
        if self.trusted is not None:
            return self.trusted
        if time.monotonic() < self._retry_at or not self._lock.acquire(blocking=False):
            return None
        try:
            if self.trusted is None:
                self._check()
        finally:
            self._lock.release()
        return self.trusted

    def outcome(self) -> str:
        """How the model did on the canaries so far, in words ("4 of 6 check pairs right (…)")."""
        if self.trusted is None:
            return "the check pairs got no answer"
        total = len(CANARIES)
        head = f"{total - len(self.missed)} of {total} check pairs right"
        if not self.missed:
            return head
        return head + " (" + "; ".join(f"{w} answered {g!r}" for *_, w, g in self.missed) + ")"

    def _check(self) -> None:
        """One attempt at the canaries not yet answered (with the lock)."""
        for i, (a, b, _) in enumerate(CANARIES):
            if i in self._answers:
                continue
            self.canary_requests += 1
            try:
                got = self._ask(a, b)
            except LLMError as exc:
                log.warning("hindsight: the pair judge's check failed: %s", exc)
                break
            if got is None:
                self._unreadable[i] = self._unreadable.get(i, 0) + 1
                if self._unreadable[i] < MAX_UNREADABLE:
                    continue  # perhaps a glitch: asked again next attempt
            self._answers[i] = got
        self.missed = [
            (a, b, expected, self._answers[i])
            for i, (a, b, expected) in enumerate(CANARIES)
            if i in self._answers and self._answers[i] != expected
        ]
        if self.missed:
            self.trusted = False  # one wrong answer settles it
            log.warning(
                "hindsight: %s is not used to judge lesson pairs: it answered %d of %d check "
                "pairs wrong (%r / %r is %r, it said %r); curation keeps its rules' decisions",
                self.llm.name,
                len(self.missed),
                len(CANARIES),
                *self.missed[0],
            )
        elif len(self._answers) == len(CANARIES):
            self.trusted = True
        else:
            self._failures += 1
            delay = min(MAX_RETRY_SECONDS, self.check_retry_seconds * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay


def _quote(text: str) -> str:
    """A lesson's text on one line, bounded: it is data in the prompt, not instructions."""
    return '"' + " ".join(text.split())[:600].replace('"', "'") + '"'


__all__ = ["CANARIES", "RELATIONS", "PairJudge", "Relation"]
