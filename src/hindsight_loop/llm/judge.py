"""A model's word on two lessons the curation rules cannot settle: the same advice, or opposite?

Curation decides most pairs by rules (structured forms, stance, text similarity). What is left is
a band of pairs close enough to matter and too far apart in words to call: Chinese rewordings that
share few characters ("调用天气接口前，先向用户确认城市" / "查询天气之前，先问清楚用户是哪个城市"),
synonyms the offline embedder does not know; and, when nothing repeats a new lesson, the lessons
of its tool and language it shares almost no words with (a rewording or an opposite in other
words). When a model is configured, it is asked about those pairs only (two per new lesson at
most), one short JSON answer each; any failure leaves the rules' decision as it was.
"""

from __future__ import annotations

import logging
from typing import Literal

from hindsight_loop.llm import LLM, LLMError
from hindsight_loop.llm.parse import extract_json

log = logging.getLogger("hindsight_loop.llm.reflector")

Relation = Literal["same", "opposite", "different"]
RELATIONS: tuple[str, ...] = ("same", "opposite", "different")

#: Tokens an answer may take (``{"relation": "same"}`` and a short reason).
MAX_TOKENS = 120

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


class PairJudge:
    """Asks a model whether two lessons say the same thing; ``None`` when it cannot tell."""

    def __init__(self, llm: LLM, *, model: str | None = None) -> None:
        self.llm = llm
        self.model = model
        self.asked = 0
        """Pairs sent to the model (each is one request)."""

    def __call__(self, a: str, b: str) -> Relation | None:
        self.asked += 1
        try:
            answer = self.llm.complete(
                PROMPT.format(a=_quote(a), b=_quote(b)),
                system=SYSTEM,
                model=self.model,
                json_mode=True,
                temperature=0.0,
                max_tokens=MAX_TOKENS,
            )
        except LLMError as exc:
            log.warning("hindsight: judging a pair of lessons failed: %s", exc)
            return None
        data = extract_json(answer.text) or {}
        relation = str(data.get("relation", "")).strip().lower()
        return relation if relation in RELATIONS else None  # type: ignore[return-value]


def _quote(text: str) -> str:
    """A lesson's text on one line, bounded: it is data in the prompt, not instructions."""
    return '"' + " ".join(text.split())[:600].replace('"', "'") + '"'


__all__ = ["RELATIONS", "PairJudge", "Relation"]
