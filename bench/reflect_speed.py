"""Reflection throughput: tasks reviewed per second by the offline reflector.

Tasks of 30-60 events in the trajectory mix of ``bench/_common.py`` (tool failures with
recoveries, decisions, user input, feedback) are stored once. Subjects, task by task:

- full review: ``hs.reflect(task_id, reflector=OfflineReflector())``, what the background
  worker does for each queued review: replay from the store, reflect, curate the drafts into the
  lesson book (similarity against the book with the offline embedder) and save;
- reflector only: ``OfflineReflector().reflect(chronicle)`` on a chronicle already built.

Baseline, interleaved task by task: ``hs.replay(task_id)`` alone (reading and building the
chronicle), the part every review pays before any reflecting.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli, mixed_events, spread  # noqa: E402


def run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from hindsight_loop.reflect import OfflineReflector
    except ImportError as exc:
        return {"bench": "reflect_speed", "skipped": f"hindsight_loop.reflect missing ({exc})"}
    from hindsight_loop import Hindsight

    runs = 3 if args.quick else max(5, args.runs)
    n_tasks = 20 if args.quick else args.tasks
    rng = random.Random(5)
    tmp = Path(tempfile.mkdtemp(prefix="hs-reflect-"))
    try:
        hs = Hindsight(tmp / "reflect.db", background=False, triggers=False)
        ids = []
        for _ in range(runs):
            batch = []
            for _ in range(n_tasks):
                with hs.task(
                    "csv_cleaning",
                    goal="clean the sales files",
                    tools=["read_csv", "clean_rows", "write_parquet"],
                    recall=False,
                ) as task:
                    for ev in mixed_events(rng, task.task_id, rng.randint(30, 60)):
                        hs.record(ev)
                batch.append(task.task_id)
            ids.append(batch)
        hs.flush()
        reflector = OfflineReflector()
        full, only, base, lessons = [], [], [], 0
        for r in range(runs):
            t_full = t_only = t_base = 0.0
            for tid in ids[r]:
                t0 = time.perf_counter()
                chronicle = hs.replay(tid)
                t_base += time.perf_counter() - t0
                t0 = time.perf_counter()
                reflector.reflect(chronicle)
                t_only += time.perf_counter() - t0
                t0 = time.perf_counter()
                reflection = hs.reflect(tid, reflector=reflector)
                t_full += time.perf_counter() - t0
                lessons += len(reflection.lessons)
            full.append(n_tasks / t_full)
            only.append(n_tasks / t_only)
            base.append(n_tasks / t_base)
        book = len(hs.store.list_lessons())
        hs.close()
        return {
            "bench": "reflect_speed",
            "runs": runs,
            "tasks_per_run": n_tasks,
            "full_review_tasks_per_s": spread(full),
            "reflector_only_tasks_per_s": spread(only),
            "replay_only_tasks_per_s": spread(base),
            "drafts": lessons,
            "book_size": book,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    f, o, b = (
        r["full_review_tasks_per_s"],
        r["reflector_only_tasks_per_s"],
        r["replay_only_tasks_per_s"],
    )
    return (
        f"full review {f['median']:.0f} tasks/s ({f['min']:.0f}-{f['max']:.0f}); reflector "
        f"only {o['median']:.0f}/s; replay only {b['median']:.0f}/s; {r['drafts']} drafts, "
        f"book of {r['book_size']}"
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tasks", type=int, default=60)


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
