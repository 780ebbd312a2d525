"""Recall latency over 1k / 10k / 100k lessons, beside brute-force vector search in the same run.

Recall sits before every task an agent starts, so it has to cost next to nothing as the book
grows. This builds synthetic lesson books with realistic tags — task types with a skewed
(Zipf) popularity, so the biggest type holds about a fifth of the book; a handful of tools per
task type; global / project / user scopes; every status; expired and pinned lessons; intents;
conflicts; advice text in English and Chinese drawn from a Zipf vocabulary — and times
``LessonIndex.search`` (rule stage, BM25 and vector fusion, top 3, query embedding included)
on queries shaped like a facade call.

Baseline, interleaved query by query: brute-force vector search (embed the query, one
matrix-vector product over the whole book, top 3), the core of most agent memories. Reported as
a ratio, since this machine's speed drifts by tens of percent within minutes.

Run: ``python bench/recall_speed.py`` (``--sizes 1000,10000,100000 --queries 2000 --runs 5``;
``--quick`` for a smoke run, ``--json`` for ``bench/run.py``). Takes about five minutes, mostly
building the 100k book.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import cli, machine, spread  # noqa: E402  (also puts src/ on the path)

from hindsight_loop.embed import HashEmbedder, matvec  # noqa: E402
from hindsight_loop.models import Features, Lesson, iso  # noqa: E402
from hindsight_loop.recall import LessonIndex, RecallQuery  # noqa: E402

NOW = datetime(2025, 1, 15, tzinfo=UTC)
SEED = 20250115


def zipf_weights(n: int, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


class World:
    """The vocabulary of a synthetic agent deployment: task types, tools, words, scopes."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.task_types = [f"task_type_{i:02d}" for i in range(80)]
        self.tt_weights = zipf_weights(len(self.task_types))
        self.tools = {
            tt: [f"{tt[-2:]}_tool_{j}" for j in range(int(rng.integers(4, 11)))]
            for tt in self.task_types
        }
        syllables = ["ka", "lo", "mi", "ner", "pu", "ra", "sto", "ti", "ve", "zan", "qu", "el"]
        words: set[str] = set()
        while len(words) < 3000:
            words.add("".join(rng.choice(syllables, size=int(rng.integers(2, 5)))))
        self.words = sorted(words)
        self.word_weights = zipf_weights(len(self.words), 1.05)
        self.han = [chr(0x4E00 + i) for i in range(0, 6000, 3)]  # 2000 common-ish characters
        self.han_weights = zipf_weights(len(self.han), 1.0)
        self.projects = [f"project:p{i}" for i in range(30)]
        self.users = [f"user:u{i}" for i in range(500)]
        self.steps = ["parse", "fetch", "validate", "plan", "write", "auth", "search"]
        self.errors = [
            "Timeout",
            "HTTP429",
            "HTTP404",
            "UnicodeDecodeError",
            "KeyError",
            "ValueError",
            "PermissionError",
            "InvalidDateFormat",
        ]

    def english(self, n: int) -> str:
        return " ".join(self.rng.choice(self.words, size=n, p=self.word_weights))

    def chinese(self, n: int) -> str:
        return "".join(self.rng.choice(self.han, size=n, p=self.han_weights))

    def text(self, zh: bool, lo: int, hi: int) -> str:
        n = int(self.rng.integers(lo, hi))
        return self.chinese(n * 2) if zh else self.english(n)

    def lesson(self, i: int) -> Lesson:
        rng = self.rng
        tt = self.task_types[rng.choice(len(self.task_types), p=self.tt_weights)]
        pool = self.tools[tt]
        tools = (
            []
            if rng.random() < 0.1
            else list(rng.choice(pool, size=int(rng.integers(1, 4)), replace=False))
        )
        r = rng.random()
        scope = (
            "global"
            if r < 0.7
            else (str(rng.choice(self.projects)) if r < 0.9 else str(rng.choice(self.users)))
        )
        r = rng.random()
        status = (
            "active"
            if r < 0.8
            else "needs_review"
            if r < 0.88
            else ("rejected" if r < 0.92 else "expired")
        )
        pinned = rng.random() < 0.05
        days = float(rng.uniform(-20, 60))  # about a third of unpinned lessons are past due
        zh = rng.random() < 0.2
        return Lesson(
            lesson_id=f"les_{i:06d}",
            task_type="*" if rng.random() < 0.03 else tt,
            advice=self.text(zh, 12, 30),
            general_rule=self.text(zh, 5, 12),
            features=Features(
                tools=tools,
                intent=str(rng.choice(["query", "operation", "analysis"]))
                if rng.random() < 0.6
                else None,
                step=str(rng.choice(self.steps)) if rng.random() < 0.3 else None,
                error_type=str(rng.choice(self.errors)) if rng.random() < 0.3 else None,
                keywords=(self.text(zh, 2, 5)).split() if not zh else [self.chinese(2)],
            ),
            scope=scope,
            status=status,  # type: ignore[arg-type]
            pinned=pinned,
            valid_until=None if pinned else iso(NOW + timedelta(days=days)),
            value_score=float(rng.uniform(0.2, 0.9)),
            language="zh" if zh else "en",
        )

    def book(self, n: int) -> list[Lesson]:
        lessons = [self.lesson(i) for i in range(n)]
        for les in lessons[: n // 100]:  # one lesson in a hundred is in a recorded conflict
            other = lessons[int(self.rng.integers(n))]
            les.conflicts.append(other.lesson_id)
        return lessons

    def query(self, book: Sequence[Lesson]) -> RecallQuery:
        rng = self.rng
        tt = self.task_types[rng.choice(len(self.task_types), p=self.tt_weights)]
        pool = self.tools[tt]
        zh = rng.random() < 0.2
        # Requests share words with the book: half of the text comes from a random lesson.
        seed = book[int(rng.integers(len(book)))].advice
        borrowed = seed[: len(seed) // 2]
        r = rng.random()
        scope = (
            None
            if r < 0.3
            else (str(rng.choice(self.projects)) if r < 0.7 else str(rng.choice(self.users)))
        )
        return RecallQuery(
            task_type=tt,
            tools=list(
                rng.choice(pool, size=int(rng.integers(1, min(5, len(pool)) + 1)), replace=False)
            ),
            query=f"{self.text(zh, 6, 16)} {borrowed}",
            intent=str(rng.choice(["query", "operation", "analysis"]))
            if rng.random() < 0.5
            else None,
            scope=scope,
            step=str(rng.choice(self.steps)) if rng.random() < 0.2 else None,
            error_type=str(rng.choice(self.errors)) if rng.random() < 0.2 else None,
        )


class BruteForceVector:
    """The baseline: embed the query, score every lesson by cosine, keep the top 3.

    It uses recall's blocked ``matvec``: a plain ``matrix @ query`` lets OpenBLAS spread the
    product over threads, which on a busy 2-core machine is many times slower, and the
    baseline should be a good brute-force search, not a straw man.
    """

    def __init__(self, index: LessonIndex) -> None:
        self.embedder = index.embedder
        self.matrix = index._vectors  # the same vectors recall uses

    def search(self, q: RecallQuery) -> np.ndarray:
        sims = matvec(self.matrix, self.embedder.embed([q.query])[0])
        top = np.argpartition(-sims, 3)[:3]
        return top[np.argsort(-sims[top])]


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def measure(size: int, n_queries: int, runs: int, rng: np.random.Generator) -> dict:
    world = World(rng)
    book = world.book(size)
    embedder = HashEmbedder()
    t0 = time.perf_counter()
    index = LessonIndex(book, embedder=embedder)
    build_s = time.perf_counter() - t0
    vectors = {les.lesson_id: index._vectors[i] for i, les in enumerate(index.lessons)}
    t0 = time.perf_counter()
    LessonIndex(book, embedder=embedder, vectors=vectors)
    build_stored_s = time.perf_counter() - t0
    baseline = BruteForceVector(index)
    queries = [world.query(book) for _ in range(n_queries)]
    for q in queries[:200]:  # warm up caches and numpy's code paths
        index.search(q, now=NOW)
        baseline.search(q)

    per_run = []
    returned = 0
    for _ in range(runs):
        rec, base = [], []
        gc.collect()  # start each run clean; collections during the run are part of the cost
        for q in queries:
            t = time.perf_counter_ns()
            got = index.search(q, now=NOW)
            rec.append((time.perf_counter_ns() - t) / 1e6)
            t = time.perf_counter_ns()
            baseline.search(q)
            base.append((time.perf_counter_ns() - t) / 1e6)
            returned += len(got)
        per_run.append(
            {
                "p50": percentile(rec, 50),
                "p99": percentile(rec, 99),
                "base_p50": percentile(base, 50),
                "base_p99": percentile(base, 99),
            }
        )

    def summary(key: str) -> dict[str, float]:
        return spread([r[key] for r in per_run])

    return {
        "lessons": size,
        "queries": n_queries,
        "runs": runs,
        "build_s": build_s,
        "build_with_stored_vectors_s": build_stored_s,
        "index_bytes_per_lesson": index.nbytes / size,
        "recall_p50_ms": summary("p50"),
        "recall_p99_ms": summary("p99"),
        "vector_p50_ms": summary("base_p50"),
        "vector_p99_ms": summary("base_p99"),
        "p50_ratio_vs_vector": spread([r["p50"] / r["base_p50"] for r in per_run]),
        "lessons_returned_per_query": returned / (runs * n_queries),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) for x in args.sizes.split(",") if x]
    queries, runs = args.queries, max(5, args.runs)
    if args.quick:
        sizes, queries, runs = [n for n in sizes if n <= 10_000], 300, 3
    results = [measure(n, queries, runs, np.random.default_rng(SEED)) for n in sizes]
    return {
        "benchmark": "recall",
        "machine": machine(),
        "numpy": np.__version__,
        "results": results,
    }


def render(r: dict[str, Any]) -> str:
    def fmt(d: dict[str, float]) -> str:
        return f"{d['median']:.3f} ({d['min']:.3f}–{d['max']:.3f})"

    m = r["machine"]
    first = r["results"][0]
    lines = [
        f"Recall latency — {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
        f"numpy {r['numpy']} — {m['date']}",
        f"{first['queries']} queries x {first['runs']} runs per size; median of the runs' "
        "percentiles (min–max across runs); ms per call, query embedding included",
        "",
        "| lessons | recall p50 | recall p99 | brute-force vector p50 | p50 ratio | build (s) | "
        "build, stored vectors (s) | index bytes/lesson | returned/query |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["results"]:
        lines.append(
            f"| {x['lessons']:,} | {fmt(x['recall_p50_ms'])} | {fmt(x['recall_p99_ms'])} | "
            f"{fmt(x['vector_p50_ms'])} | {x['p50_ratio_vs_vector']['median']:.2f} | "
            f"{x['build_s']:.1f} | {x['build_with_stored_vectors_s']:.1f} | "
            f"{x['index_bytes_per_lesson']:.0f} | {x['lessons_returned_per_query']:.2f} |"
        )
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1000,10000,100000", help="book sizes, comma-separated")
    parser.add_argument("--queries", type=int, default=2000, help="queries per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per size (at least 5)")


if __name__ == "__main__":
    cli(__doc__, run, render, _options)
