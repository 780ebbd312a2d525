"""Curation benchmark: do rewordings merge, do opposites stay apart as conflicts?

A labelled set of lesson pairs in English and Chinese (``pairs.jsonl``), each of one task type
and tool:

- ``rewording``: the same advice in other words; the second should merge into the first;
- ``opposite``: near text with opposite intent ("ask which city first" / "call it for Beijing
  without asking"); the second should be flagged as a conflict, and must never merge;
- ``unrelated``: different advice sharing words and a tool; the second should be added apart.

For each pair the first lesson is curated into an empty book, then the second (``curate`` as the
worker and ``hindsight lessons import`` call it). Reported per embedder:

- merge precision (merges that were rewordings) and merge recall (rewordings merged), EN and ZH;
- opposites merged (target 0) and conflicts flagged (share of opposite pairs; target >= 90%);
- false conflicts (rewordings or unrelated pairs flagged).

Also ``--book``: the 42 lessons of ``bench/retrieval`` curated one after another, where the
right answer is almost always "add" (they are distinct lessons), and the review cost of a lesson
merged into 1 vs 2,000 times (``--review``).

Eleven splits, each reported on its own (``--split`` picks): ``tuning`` (``pairs.jsonl``, what the
rules and thresholds were shaped on), ``heldout`` (``heldout.jsonl``, 32 pairs on other subjects
written before the 2026-12 changes), ``blind`` (``blind.jsonl``, 24 pairs written before the
concept lexicon and first run for the final measurement), ``blind2`` (``blind2.jsonl``,
written by another engineer without seeing the code, first run once the fourth session's code was
final), ``blind3`` (``blind3.jsonl``, the same, first run once the stance changes of
2026-12-01 were final) and ``blind4`` (``blind4.jsonl``, the same, first run once the second
stance round of 2026-12-01 was final) ``blind5`` (``blind5.jsonl``, the same, written before
the merge guard of 2026-12-01's fifth session), ``blind6`` (``blind6.jsonl``, the same, first
run once that session's curation code was final) and ``blind7`` (``blind7.jsonl``, written by
another engineer who never opened src/, first run once the seventh session's curation code was
final). A gain that shows on ``tuning`` only is not a gain.

Run: ``python bench/curation/run.py`` (``--embedder hash|concept|e5|st:MODEL|openai:MODEL``,
repeatable; ``--judge`` adds a run with the model of ``HINDSIGHT_LLM_*`` judging the pairs the
rules leave open, once it has answered the judge's six check pairs (``llm.judge.CANARIES``) right,
and says how it did on them; ``--unchecked`` with ``--judge`` counts its verdicts whatever it
answered there, to see what the check keeps out; ``--verbose`` lists every wrong decision; ``--json``).

``--oracle`` adds a run whose judge answers from the pair's label: not a model's figure, but the
ceiling of what any judge can add to the rules, since it shows which pairs reach the judge at
all (a pair the rules settle is never asked about, so a perfect model still misses it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))

from hindsight_loop.embed import (  # noqa: E402
    E5Embedder,
    Embedder,
    HashEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
)
from hindsight_loop.lessons import curate, review_reasons  # noqa: E402
from hindsight_loop.models import Features, Lesson, LessonDraft  # noqa: E402
from hindsight_loop.testing.embed import ConceptEmbedder  # noqa: E402

HERE = Path(__file__).parent
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def make_embedder(spec: str) -> Embedder:
    kind, _, arg = spec.partition(":")
    if kind == "hash":
        return HashEmbedder(int(arg)) if arg else HashEmbedder()
    if kind == "concept":
        return ConceptEmbedder()
    if kind == "e5":
        return E5Embedder()
    if kind == "st":
        return SentenceTransformerEmbedder(arg) if arg else SentenceTransformerEmbedder()
    if kind == "openai":
        return OpenAIEmbedder(arg) if arg else OpenAIEmbedder()
    raise SystemExit(f"unknown --embedder {spec!r}: use hash, concept, e5, st:MODEL, openai:MODEL")


#: ``tuning`` (``pairs.jsonl``): the pairs curation's rules and thresholds were shaped on.
#: ``heldout`` (``heldout.jsonl``): pairs on other subjects written before the 2026-12 changes to
#: the hashed embedder and the Chinese term matching, and never used to choose them.
#: ``blind`` (``blind.jsonl``): written after the held-out baseline was seen, before the concept
#: lexicon, and run only for the final measurement.
#: ``blind2`` (``blind2.jsonl``): written by another engineer without seeing the code, before the
#: 2026-12-01 (fourth session) changes to the merge decision, and run only once that code was final.
#: ``blind3`` (``blind3.jsonl``): written by another engineer without seeing the code, before the
#: 2026-12-01 stance changes (``order_opposition``, dismissals, consequences, ``agreement_shown``),
#: and first run once that code was final and committed.
#: ``blind4`` (``blind4.jsonl``): the same, written before the second stance round of 2026-12-01
#: (only / also, one by one, n't, order inside a clause, ``poles_flipped``), first run once it was
#: final and committed.
#: ``blind5`` (``blind5.jsonl``): the same, written before the merge guard of 2026-12-01's fifth
#: session (a near pair merges only when the rules show it says the same thing); run on the code
#: before that change (counts only) and once it was final.
#: ``blind6`` (``blind6.jsonl``): the same, first run once the fifth session's curation code was
#: final (its author saw the subject line of the last commit, not the code).
#: ``blind7`` (``blind7.jsonl``): written by another engineer who never opened src/, first run once
#: the seventh session's curation code was final.
#: ``blind8`` (``blind8.jsonl``): the same (never opened src/ or a benchmark), first run once the
#: ninth session's curation code was final.
#: ``blind9`` (``blind9.jsonl``): the same (48 pairs in 20 new task types, written by another
#: engineer who opened neither src/ nor any .py file), first run on the eleventh session's code,
#: whose curation had not changed since the ninth.
SPLITS = {
    "tuning": "pairs.jsonl",
    "heldout": "heldout.jsonl",
    "blind": "blind.jsonl",
    "blind2": "blind2.jsonl",
    "blind3": "blind3.jsonl",
    "blind4": "blind4.jsonl",
    "blind5": "blind5.jsonl",
    "blind6": "blind6.jsonl",
    "blind7": "blind7.jsonl",
    "blind8": "blind8.jsonl",
    "blind9": "blind9.jsonl",
}


def load_pairs(split: str = "tuning") -> list[dict]:
    lines = (HERE / SPLITS[split]).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


class LabelJudge:
    """A judge that is always right: the pair's label (``--oracle``). Anything but the pair
    being decided gets no answer, as from a model that failed."""

    label = "oracle judge"
    VERDICTS = {"rewording": "same", "opposite": "opposite", "unrelated": "different"}

    def __init__(self) -> None:
        self.asked = 0
        self.pair: dict | None = None

    def __call__(self, kept: str, new: str) -> str | None:
        self.asked += 1
        p = self.pair
        if p is None or (kept, new) != (p["a"], p["b"]):
            return None
        return self.VERDICTS[p["kind"]]


def decide(pair: dict, embedder: Embedder, judge: Any = None) -> str:
    """The action curation takes for the second lesson of a pair, the first already in the book."""
    if isinstance(judge, LabelJudge):
        judge.pair = pair

    def draft(text: str, task: str) -> LessonDraft:
        features = Features(tools=list(pair.get("tools", [])))
        return LessonDraft(
            task_type=pair["task_type"], advice=text, features=features, source_task_ids=[task]
        )

    first = curate(draft(pair["a"], "tsk_a"), [], embedder=embedder, now=NOW).lesson
    second = draft(pair["b"], "tsk_b")
    return curate(second, [first], embedder=embedder, now=NOW, judge=judge).action


def evaluate(
    pairs: list[dict], embedder: Embedder, judge: Any = None
) -> tuple[dict, list[tuple[dict, str]]]:
    decisions = [(pair, decide(pair, embedder, judge)) for pair in pairs]
    label = (getattr(judge, "label", None) or f"judge {judge.llm.name}") if judge else ""
    out: dict = {"embedder": embedder.name + (f" + {label}" if judge else "")}
    if judge is not None:
        out["judge_requests"] = judge.asked
        if hasattr(judge, "canary_requests"):  # a model's judge: how it did on the check pairs
            out["judge_check"] = {
                "trusted": judge.trusted,
                "requests": judge.canary_requests,
                "missed": [{"expected": want, "answered": got} for *_, want, got in judge.missed],
            }
    for lang in ("en", "zh", "all"):
        mine = [(p, a) for p, a in decisions if lang == "all" or p["lang"] == lang]
        count = Counter((p["kind"], a) for p, a in mine)
        kinds = Counter(p["kind"] for p, _ in mine)
        merges = sum(n for (_, a), n in count.items() if a == "merge")
        out[lang] = {
            "merge_precision": count["rewording", "merge"] / merges if merges else 1.0,
            "merge_recall": count["rewording", "merge"] / max(kinds["rewording"], 1),
            "opposites_merged": count["opposite", "merge"],
            "conflicts_flagged": count["opposite", "conflict"] / max(kinds["opposite"], 1),
            "false_conflicts": count["rewording", "conflict"] + count["unrelated", "conflict"],
            "unrelated_merged": count["unrelated", "merge"],
            "pairs": dict(kinds),
        }
    wrong = [
        (p, a)
        for p, a in decisions
        if a != {"rewording": "merge", "opposite": "conflict", "unrelated": "add"}[p["kind"]]
    ]
    return out, wrong


def book_run(embedder: Embedder) -> dict:
    """The retrieval benchmark's lessons curated one by one: how many merge or conflict."""
    lines = (HERE.parent / "retrieval" / "lessons.jsonl").read_text(encoding="utf-8").splitlines()
    book: list[Lesson] = []
    actions: Counter[str] = Counter()
    events = []
    for line in lines:
        if not line.strip():
            continue
        data = json.loads(line)
        lesson = Lesson.from_dict({**data, "valid_until": "2025-06-01T00:00:00.000Z"})
        change = curate(lesson, book, embedder=embedder, now=datetime(2025, 1, 15, tzinfo=UTC))
        actions[change.action] += 1
        if change.action != "add":
            other = change.other.lesson_id if change.other else change.lesson.lesson_id
            events.append(f"{change.action}: {data['lesson_id']} -> {other}")
        for saved in change.saves:
            book = [x for x in book if x.lesson_id != saved.lesson_id] + [saved]
    return {"actions": dict(actions), "events": events}


def _merged_lesson(embedder: Embedder, support: int) -> Lesson:
    """One lesson merged ``support - 1`` times with rewordings of itself, as curation leaves it."""
    texts = [
        "Use encoding='utf-8-sig' when reading CSV files with read_csv.",
        "When reading CSV files with read_csv, use encoding='utf-8-sig'.",
        "Always pass encoding='utf-8-sig' to read_csv for CSV files.",
        "For CSV files, call read_csv with encoding='utf-8-sig'.",
    ]
    lesson: Lesson | None = None
    for i in range(support):
        draft = LessonDraft(
            task_type="csv_cleaning",
            advice=texts[i % len(texts)],
            features=Features(tools=["read_csv"]),
            source_task_ids=[f"tsk_{i:06d}"],
        )
        change = curate(
            draft, [lesson] if lesson else [], embedder=embedder, now=NOW + timedelta(minutes=i)
        )
        lesson = change.lesson
    assert lesson is not None and lesson.support == support, lesson
    return lesson


def review_costs(embedder: Embedder, supports: tuple[int, ...] = (1, 2000)) -> list[dict]:
    """Seconds to load a book holding one lesson of each support in ``supports`` and list what
    needs review, through a real SQLite store (one per support), and the size of that row.

    The stores are timed turn about, one review each in a rotating order, so a change in the
    machine's load between them reaches every support alike (timed one after the other, the
    ratio of two ~20 µs medians moved from x1.2 to x2 between runs of the same code)."""
    from hindsight_loop.store.sqlite import SQLiteStore

    lessons = [_merged_lesson(embedder, k) for k in supports]
    with tempfile.TemporaryDirectory() as tmp:
        stores = []
        try:
            for i, lesson in enumerate(lessons):
                stores.append(SQLiteStore(str(Path(tmp) / f"book{i}.db")))
                stores[-1].save_lesson(lesson)
            timings: list[list[float]] = [[] for _ in stores]
            for r in range(2000):
                for i in range(len(stores)) if r % 2 == 0 else reversed(range(len(stores))):
                    start = time.perf_counter()
                    every = {x.lesson_id: x for x in stores[i].list_lessons()}
                    for x in every.values():
                        review_reasons(x, every)
                    timings[i].append(time.perf_counter() - start)
        finally:
            for store in stores:
                store.close()
    return [
        {
            "support": k,
            "review_s": statistics.median(t),
            "row_bytes": len(json.dumps(lesson.to_dict())),
        }
        for k, t, lesson in zip(supports, timings, lessons, strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--embedder", action="append", help="hash (default), concept, e5, st:MODEL, openai:MODEL"
    )
    parser.add_argument(
        "--split",
        action="append",
        choices=tuple(SPLITS),
        help="tuning, heldout, blind, blind2 ... blind9 (default: all, each reported on its own)",
    )
    parser.add_argument("--verbose", action="store_true", help="list every wrong decision")
    parser.add_argument("--book", action="store_true", help="also curate the retrieval book")
    parser.add_argument(
        "--review", action="store_true", help="also time review at support 1 vs 2,000"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable results")
    parser.add_argument(
        "--judge",
        action="store_true",
        help="also run each embedder with the model configured by HINDSIGHT_LLM_* as the judge "
        "of the pairs the rules leave open",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="also run each embedder with a judge that answers from the labels: the ceiling of "
        "what a model judging the pairs can add to the rules",
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="with --judge: count the model's verdicts even if it misses the judge's check pairs",
    )
    args = parser.parse_args(argv)
    splits = args.split or list(SPLITS)
    judge: Any = None
    if args.judge:
        from hindsight_loop.llm import from_env
        from hindsight_loop.llm.judge import PairJudge

        llm = from_env()
        if llm is None:
            raise SystemExit("--judge needs a model: set HINDSIGHT_LLM_PROVIDER and its settings")
        judge = PairJudge(llm)
        if args.unchecked:
            judge.trusted = True
    results = []
    runs = [(spec, None) for spec in args.embedder or ["hash"]]
    runs += [(spec, judge) for spec in args.embedder or ["hash"]] if judge else []
    runs += [(spec, LabelJudge()) for spec in args.embedder or ["hash"]] if args.oracle else []
    for spec, judging in runs:
        embedder = make_embedder(spec)
        for n, split in enumerate(splits):
            if judging is not None:
                judging.asked = 0
            res, wrong = evaluate(load_pairs(split), embedder, judging)
            res["split"] = split
            if args.book and n == 0:
                res["book"] = book_run(embedder)
            if args.review and n == 0:
                res["review"] = review_costs(embedder)
            res["wrong"] = [{"id": p["id"], "kind": p["kind"], "action": a} for p, a in wrong]
            results.append((res, wrong))
    if args.json:
        print(json.dumps([r for r, _ in results], indent=2, ensure_ascii=False))
        return 0
    for split in splits:
        pairs = load_pairs(split)
        kinds = Counter(p["kind"] for p in pairs)
        print(
            f"Curation benchmark, {split} split ({SPLITS[split]}): {len(pairs)} pairs "
            f"({kinds['rewording']} rewordings, {kinds['opposite']} opposites, "
            f"{kinds['unrelated']} unrelated with shared words; "
            f"{sum(p['lang'] == 'zh' for p in pairs)} Chinese)"
        )
    print(
        "\n| embedder | split | lang | merge precision | merge recall | opposites merged "
        "| conflicts flagged | false conflicts | unrelated merged |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for res, _ in results:
        for lang in ("en", "zh", "all"):
            r = res[lang]
            print(
                f"| {res['embedder']} | {res['split']} | {lang} | {r['merge_precision']:.2f} "
                f"| {r['merge_recall']:.2f} | {r['opposites_merged']} "
                f"| {r['conflicts_flagged']:.2f} | {r['false_conflicts']} "
                f"| {r['unrelated_merged']} |"
            )
    for res, wrong in results:
        if "book" in res:
            print(
                f"\n{res['embedder']}: retrieval book curated one by one: {res['book']['actions']}"
            )
            for event in res["book"]["events"]:
                print(f"  {event}")
        if "review" in res:
            one, many = res["review"]
            print(
                f"\n{res['embedder']}: review of a lesson at support 1: {one['review_s'] * 1e6:.1f} µs "
                f"({one['row_bytes']:,} B row); at support 2,000: {many['review_s'] * 1e6:.1f} µs "
                f"({many['row_bytes']:,} B row); ratio {many['review_s'] / one['review_s']:.2f}x"
            )
        if args.verbose and wrong:
            print(f"\n{res['embedder']}, {res['split']}: wrong decisions")
            for p, a in wrong:
                print(f"  {p['id']} {p['kind']} -> {a}\n    a: {p['a']}\n    b: {p['b']}")
    if judge is not None:
        print(f"\n{judge_report(judge, unchecked=args.unchecked)}")
    return 0


def judge_report(judge: Any, *, unchecked: bool) -> str:
    """How the model did on the judge's check pairs, and whether its verdicts counted."""
    name = f"judge {judge.llm.name}"
    if unchecked:
        return f"{name}: not put to the check pairs (--unchecked): every verdict counted"
    if judge.trusted is None:
        return f"{name}: {judge.outcome()} (the model did not answer)"
    verdicts = "its verdicts counted" if judge.trusted else "not used, the rules decided every pair"
    return f"{name}: {judge.outcome()}: {verdicts}"


if __name__ == "__main__":
    raise SystemExit(main())
