"""What the replay projection costs the writer: CPU µs per event, with and without it.

Subject: the recorder's writer work for a batch of the trajectory mix (``mixed_events``: per 10
events 4 ~1 KB tool calls, 3 decisions, a user input, a state change, a feedback), in tasks of
100 events: ``Recorder._prepare`` (sanitize, redact, work out the projection) then
``_write_batch`` (SQLite ``write_event_batch`` and the live triggers, which read the projection
instead of working it out), on a fresh SQLite file per run. Baseline, interleaved run by run in
the same process: the same with ``record.project_json`` replaced by one that gives none (the
store then keeps '' and the triggers work the projection out themselves, as before it existed).
Times are the writer thread's CPU time (``time.thread_time``): on a machine shared with other
work, wall time moved more than the difference measured.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli, mixed_events, spread  # noqa: E402


def _items(n: int) -> list[tuple[Any, ...]]:
    t0 = time.time_ns()
    items: list[tuple[Any, ...]] = []
    for t in range(n // 100):
        task_id = f"tsk_{t}"
        events = mixed_events(random.Random(t), task_id, 100)
        items += [
            (task_id, i, t0 + (t * 100 + i) * 1000, e["type"], e, None)
            for i, e in enumerate(events)
        ]
    return items


def _one(tmp: Path, name: str, items: list[tuple[Any, ...]], triggers: bool) -> float:
    from hindsight_loop.models import Task
    from hindsight_loop.record import BATCH_SIZE, Recorder
    from hindsight_loop.store.sqlite import SQLiteStore
    from hindsight_loop.triggers import Triggers

    store = SQLiteStore(tmp / f"{name}.db")
    try:
        for task_id in sorted({it[0] for it in items}):
            store.upsert_task(Task(task_id=task_id, task_type="bench"))
        hook = None
        if triggers:
            hook = Triggers(store, review_min_events=10, live=True, wake=lambda: None).on_batch
        rec = Recorder(
            store.write_event_batch, dead_letter=tmp / "dead.jsonl", start=False, on_batch=hook
        )
        t = time.thread_time()
        for k in range(0, len(items), BATCH_SIZE):
            keep: list[Any] = []
            rows, _raw = rec._prepare(items[k : k + BATCH_SIZE], keep if triggers else None)
            rec._write_batch(rows, keep)
        return (time.thread_time() - t) * 1e6 / len(items)
    finally:
        store.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import hindsight_loop.record as record

    real = record.project_json
    runs = 3 if args.quick else max(5, args.runs)
    items = _items(4_000 if args.quick else args.events)
    tmp = Path(tempfile.mkdtemp(prefix="hs-projection-"))
    out: dict[str, Any] = {"bench": "projection_cost", "runs": runs, "events": len(items)}
    try:
        for triggers in (True, False):
            got: dict[str, list[float]] = {"with": [], "without": []}
            for r in range(runs):
                order = [("with", real), ("without", lambda etype, payload: None)]
                for name, fn in order if r % 2 else order[::-1]:
                    record.project_json = fn  # type: ignore[assignment]
                    got[name].append(_one(tmp, f"{name}{r}{triggers}", items, triggers))
            record.project_json = real
            key = "triggers_on" if triggers else "triggers_off"
            out[key] = {
                "with_us": spread(got["with"]),
                "without_us": spread(got["without"]),
                "cost_us": statistics.median(got["with"]) - statistics.median(got["without"]),
                "cost_min_us": min(got["with"]) - min(got["without"]),
            }
    finally:
        record.project_json = real
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['events']:,} events x {r['runs']} runs, writer CPU µs per event"]
    for key in ("triggers_on", "triggers_off"):
        x = r[key]
        lines.append(
            f"{key.replace('_', ' ')}: with the projection {x['with_us']['median']:.2f} "
            f"({x['with_us']['min']:.2f}-{x['with_us']['max']:.2f}), without "
            f"{x['without_us']['median']:.2f} ({x['without_us']['min']:.2f}-"
            f"{x['without_us']['max']:.2f}); cost {x['cost_us']:.2f} (of the minima "
            f"{x['cost_min_us']:.2f})"
        )
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--events", type=int, default=20_000)


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
