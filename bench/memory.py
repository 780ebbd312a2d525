"""Peak memory of a process holding a 100k-lesson book open for recall, in bytes per lesson.

A store is filled once with ``--lessons`` lessons (with their embeddings stored, as the facade
keeps them) drawn from the synthetic deployment of ``bench/recall_speed.py`` (task types with a
skewed popularity, tools, scopes, statuses, English and Chinese advice): a few thousand distinct
lessons, each copied with its own id and text so that no two lessons share their strings.

Each run is a fresh process that opens the store with the facade and answers one recall, which
loads the book and builds the index exactly as an agent's first recall does. Reported: the
resident memory after the recall and the peak, minus the same process's memory after the same
imports with an empty book (the baseline, measured interleaved in its own fresh process), per
lesson; beside it the size of a lesson in its wire JSON, for scale.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli, peak_rss_bytes, rss_bytes, spread  # noqa: E402


def _fill(db: Path, n: int) -> float:
    """Write n lessons with embeddings straight into the store's table; returns JSON bytes each."""
    import numpy as np
    import orjson
    from recall_speed import SEED, World

    from hindsight_loop import Hindsight
    from hindsight_loop.embed import lesson_text
    from hindsight_loop.models import Lesson

    base = World(np.random.default_rng(SEED)).book(min(n, 3000))
    hs = Hindsight(db, background=False, triggers=False)
    emb = hs.embedder
    rows, total = [], 0
    for i in range(n):
        d = base[i % len(base)].to_dict()
        d.pop("score", None)
        d["lesson_id"] = f"les_mem_{i}"
        d["advice"] = f"{d['advice']} (#{i})"
        lesson = Lesson.from_dict(d)
        body = orjson.dumps(d)
        total += len(body)
        rows.append((lesson, body))
    vectors = emb.embed([lesson_text(x) for x, _ in rows]).astype(np.float32)
    con = hs.store._db  # type: ignore[attr-defined]  # bulk load: save_lesson is one txn each
    con.execute("BEGIN")
    con.executemany(
        "INSERT INTO lessons(lesson_id, task_type, status, scope, updated_at, body, embedding,"
        " embed_model) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                x.lesson_id,
                x.task_type,
                x.status,
                x.scope,
                x.updated_at or "2025-01-01T00:00:00.000Z",
                b.decode(),
                vectors[k].tobytes(),
                emb.name,
            )
            for k, (x, b) in enumerate(rows)
        ],
    )
    con.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key='book_version'")
    con.execute("COMMIT")
    hs.close()
    return total / n


def _child(db: str) -> dict[str, Any]:
    from hindsight_loop import Hindsight

    hs = Hindsight(db, background=False, triggers=False)
    import hindsight_loop.recall  # noqa: F401  # imports are part of the baseline too

    before = rss_bytes()
    t0 = time.perf_counter()
    found = hs.recall(task_type="csv_cleaning", tools=["read_csv"], query="encoding error")
    elapsed = time.perf_counter() - t0
    after = rss_bytes()
    peak = peak_rss_bytes()
    index = hs.recall_cache._index  # noqa: SLF001 - a benchmark looks inside
    lessons = len(index.lessons) if index is not None else 0
    hs.close()
    return {
        "rss_before": before,
        "rss_after": after,
        "peak": peak,
        "lessons": lessons,
        "load_s": elapsed,
        "found": len(found),
    }


def _spawn(db: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(db)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import hindsight_loop.recall  # noqa: F401
    except ImportError as exc:
        return {"bench": "memory", "skipped": f"hindsight_loop.recall is not available ({exc})"}
    runs = 3 if args.quick else max(5, args.runs)
    n = 10_000 if args.quick else args.lessons
    tmp = Path(tempfile.mkdtemp(prefix="hs-memory-"))
    try:
        from hindsight_loop import Hindsight

        full, empty = tmp / "book.db", tmp / "empty.db"
        json_bytes = _fill(full, n)
        Hindsight(empty, background=False, triggers=False).close()
        book, blank = [], []
        for r in range(runs):
            for which in (full, empty) if r % 2 == 0 else (empty, full):
                (book if which == full else blank).append(_spawn(which))
        per_lesson = [
            (b["rss_after"] - e["rss_after"]) / b["lessons"]
            for b, e in zip(book, blank, strict=True)
        ]
        peak_per_lesson = [
            (b["peak"] - e["peak"]) / b["lessons"] for b, e in zip(book, blank, strict=True)
        ]
        return {
            "bench": "memory",
            "runs": runs,
            "lessons": book[0]["lessons"],
            "json_bytes_per_lesson": json_bytes,
            "peak_rss_mb": spread([b["peak"] / 2**20 for b in book]),
            "baseline_peak_rss_mb": spread([e["peak"] / 2**20 for e in blank]),
            "bytes_per_lesson": spread(per_lesson),
            "peak_bytes_per_lesson": spread(peak_per_lesson),
            "ratio_to_json": spread([p / json_bytes for p in per_lesson]),
            "first_recall_s": spread([b["load_s"] for b in book]),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    return "\n".join(
        [
            f"{r['lessons']:,} lessons, {r['runs']} runs: peak RSS {r['peak_rss_mb']['median']:.0f} MB "
            f"(empty book {r['baseline_peak_rss_mb']['median']:.0f} MB)",
            f"{r['bytes_per_lesson']['median']:,.0f} B per lesson held (peak "
            f"{r['peak_bytes_per_lesson']['median']:,.0f}); wire JSON {r['json_bytes_per_lesson']:,.0f} "
            f"B per lesson; first recall {r['first_recall_s']['median']:.1f} s",
        ]
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--lessons", type=int, default=100_000)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2])))
    else:
        cli(__doc__ or "", run, render, _extra)
