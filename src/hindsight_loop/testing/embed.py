"""A fake embedder whose similarities mean something, for testing agents offline.

``ConceptEmbedder`` maps keywords (English and Chinese) to concepts; a text's vector counts the
concepts it mentions, one dimension each. Two texts are similar exactly when they talk about the
same concepts, so a test can say "these two lessons are near-duplicates" or "this query is about
flights, not weather" and know what cosine similarity recall and curation will see, with no model
and no hashing noise. It also records every text it was asked to embed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from hindsight_loop.embed import normalize_rows

__all__ = ["DEFAULT_CONCEPTS", "ConceptEmbedder"]

#: A small default table: concept -> keywords that evoke it (lowercase; Chinese as substrings).
DEFAULT_CONCEPTS: dict[str, tuple[str, ...]] = {
    "weather": ("weather", "forecast", "temperature", "rain", "umbrella", "天气", "气温", "下雨"),
    "city": ("city", "cities", "town", "springfield", "portland", "城市", "重名"),
    "flight": ("flight", "flights", "fly", "plane", "airline", "航班", "机票", "飞机"),
    "airport": ("airport", "airports", "departure", "terminal", "机场", "出发"),
    "hotel": ("hotel", "room", "check-in", "checkout", "酒店", "入住"),
    "date": ("date", "dates", "tomorrow", "today", "weekend", "日期", "明天", "今天"),
    "confirm": ("confirm", "ask", "clarify", "verify", "确认", "询问", "核实"),
    "csv": ("csv", "spreadsheet", "read_csv", "表格"),
    "encoding": ("encoding", "utf-8", "utf-8-sig", "bom", "codec", "decode", "gbk", "编码", "乱码"),
    "duplicate": ("duplicate", "duplicates", "dedupe", "重复", "去重"),
    "sql": ("sql", "query", "select", "table", "database", "查询语句", "数据库"),
    "delete": ("delete", "drop", "remove", "truncate", "删除"),
    "backup": ("backup", "back up", "snapshot", "备份"),
    "email": ("email", "mail", "recipient", "邮件", "收件人"),
    "retry": ("retry", "timeout", "rate limit", "429", "重试", "超时"),
}


class ConceptEmbedder:
    """Embeds text as normalized counts of the concepts its keywords evoke.

    A text that evokes no concept gets a vector on a reserved "other" axis, so it is similar
    to other unknown texts and to nothing else (never an all-zero row).

    Args:
        concepts: Concept name -> keywords. Latin keywords match whole words (or phrases),
            CJK keywords match as substrings. Defaults to ``DEFAULT_CONCEPTS``.
    """

    def __init__(self, concepts: Mapping[str, Iterable[str]] | None = None) -> None:
        table = DEFAULT_CONCEPTS if concepts is None else concepts
        self.concepts: list[str] = list(table)
        self.name = "fake-concepts-" + str(len(self.concepts))
        self.dim = len(self.concepts) + 1
        self.calls: list[list[str]] = []
        """Every batch of texts ``embed`` was called with, in order."""
        self._matchers: list[tuple[int, re.Pattern[str]]] = []
        for axis, concept in enumerate(self.concepts):
            for word in table[concept]:
                word = word.lower()
                if re.search(r"[^\x00-\x7f]", word):
                    pattern = re.compile(re.escape(word))
                else:
                    pattern = re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")
                self._matchers.append((axis, pattern))

    def concepts_of(self, text: str) -> list[str]:
        """The concepts a text evokes (handy in test assertions)."""
        low = text.lower()
        hit = {axis for axis, pattern in self._matchers if pattern.search(low)}
        return [self.concepts[a] for a in sorted(hit)]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            low = (text or "").lower()
            for axis, pattern in self._matchers:
                out[row, axis] += len(pattern.findall(low))
            if not out[row].any():
                out[row, -1] = 1.0
        return normalize_rows(out)

    def __repr__(self) -> str:
        return f"ConceptEmbedder({len(self.concepts)} concepts)"
