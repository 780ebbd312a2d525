"""Replay of one 10,000-event task: ms to build its chronicle from the store, warm and cold.

Subject: ``hs.replay(task_id)``, i.e. read the task and its events' projections from SQLite
(``store.stored_run``: what the key-node detectors read, kept beside each body at write time),
find the key nodes, compress to 500 steps and decode only the bodies of the steps kept.

Baseline, interleaved call by call: the raw read of the same rows, ``SELECT ... ORDER BY ts,
seq`` fetched as tuples without decoding: the floor set by SQLite itself. Beside it, for
reference: decoding every event (``store.events``, what replay read before the projection) and
reading the projections alone.

Warm: the same process and connection, repeated.

``--compare SRC`` (e.g. ``/work/main/src``) also measures another checkout's replay on the same
store, in child processes alternating with children running this checkout's code, each child
timing its replay interleaved call by call with the raw read: two codes, one run, one baseline. Cold: a fresh process and a fresh connection
for each measurement (the time from opening the store to the chronicle, imports excluded),
after asking the kernel to drop its page cache (``/proc/sys/vm/drop_caches``); the result says
whether that worked here (it needs root and a writable /proc/sys) or whether "cold" only means
a new process with a new connection, the file still in the OS cache.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli, mixed_events, percentile, spread  # noqa: E402

RAW = "SELECT event_id, task_id, seq, ts, type, body FROM events WHERE task_id=? ORDER BY ts, seq"


def _build(db: Path, n: int) -> str:
    from hindsight_loop import Hindsight

    rng = random.Random(3)
    hs = Hindsight(db, background=False, triggers=False)
    try:
        with hs.task("csv_cleaning", goal="clean the sales files", recall=False) as task:
            for ev in mixed_events(rng, task.task_id, n - 2):
                hs.record(ev)
        hs.flush()
        return task.task_id
    finally:
        hs.close()


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _cold_child(db: str, task_id: str) -> dict[str, float]:
    from hindsight_loop import Hindsight  # imports are not part of the figure

    t0 = time.perf_counter()
    hs = Hindsight(db, background=False, triggers=False)
    chronicle = hs.replay(task_id)
    subject = time.perf_counter() - t0
    hs.close()
    assert chronicle.steps
    return {"subject_ms": subject * 1e3}


def _cold_raw_child(db: str, task_id: str) -> dict[str, float]:
    import sqlite3

    t0 = time.perf_counter()
    con = sqlite3.connect(db)
    rows = con.execute(RAW, (task_id,)).fetchall()
    elapsed = time.perf_counter() - t0
    con.close()
    assert rows
    return {"baseline_ms": elapsed * 1e3}


def _warm_child(db: str, task_id: str, reps: int) -> dict[str, float]:
    """Warm replays of one task interleaved with the raw read, in this process (whose code is
    the checkout first on ``sys.path``)."""
    import hindsight_loop
    from hindsight_loop import Hindsight

    hs = Hindsight(db, background=False, triggers=False)
    con = hs.store._db  # type: ignore[attr-defined]
    for _ in range(3):
        hs.replay(task_id)
    subj, base, subj_cpu, base_cpu = [], [], [], []
    wall, cpu = time.perf_counter, time.thread_time
    for _ in range(reps):
        t0, c0 = wall(), cpu()
        hs.replay(task_id)
        subj.append((wall() - t0) * 1e3)
        subj_cpu.append((cpu() - c0) * 1e3)
        t0, c0 = wall(), cpu()
        con.execute(RAW, (task_id,)).fetchall()
        base.append((wall() - t0) * 1e3)
        base_cpu.append((cpu() - c0) * 1e3)
    hs.close()
    for xs in (subj, base, subj_cpu, base_cpu):
        xs.sort()
    return {
        "p50": percentile(subj, 50),
        "base_p50": percentile(base, 50),
        # CPU time of the measuring thread: less moved by other processes on a shared machine.
        "cpu_p50": percentile(subj_cpu, 50),
        "base_cpu_p50": percentile(base_cpu, 50),
        "code": str(Path(hindsight_loop.__file__).parent),
    }


def _compare(db: Path, task_id: str, other: str, runs: int, reps: int) -> dict[str, Any]:
    """This checkout's warm replay vs ``other``'s (a ``src`` folder), alternating children."""
    got: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for r in range(runs):
        order = ("this", "other") if r % 2 == 0 else ("other", "this")
        for who in order:
            src = str(Path(__file__).resolve().parent.parent / "src") if who == "this" else other
            got[who].append(_child("warm", db, task_id, src, str(reps)))
    out: dict[str, Any] = {}
    for who, rows in got.items():
        out[who] = {
            "code": rows[0]["code"],
            "p50_ms": spread([w["p50"] for w in rows]),
            "raw_p50_ms": spread([w["base_p50"] for w in rows]),
            "ratio": spread([w["p50"] / w["base_p50"] for w in rows]),
            "cpu_p50_ms": spread([w["cpu_p50"] for w in rows]),
            "raw_cpu_p50_ms": spread([w["base_cpu_p50"] for w in rows]),
            "cpu_ratio": spread([w["cpu_p50"] / w["base_cpu_p50"] for w in rows]),
        }
    return out


def _child(kind: str, db: Path, task_id: str, *extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(db), task_id, *extra],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hindsight_loop import Hindsight

    runs = 3 if args.quick else max(5, args.runs)
    reps = min(args.reps, 10) if args.quick else args.reps
    tmp = Path(tempfile.mkdtemp(prefix="hs-replay-"))
    try:
        db = tmp / "replay.db"
        task_id = _build(db, args.events)
        hs = Hindsight(db, background=False, triggers=False)
        con = hs.store._db  # type: ignore[attr-defined]  # the same connection replay uses
        n_events = hs.store.event_count(task_id)
        chronicle = hs.replay(task_id)
        warm = []
        for _ in range(runs):
            subj, base, load, proj = [], [], [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                hs.replay(task_id)
                subj.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                con.execute(RAW, (task_id,)).fetchall()
                base.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                hs.store.events(task_id)
                load.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                hs.store.stored_run(task_id).projections()
                proj.append((time.perf_counter() - t0) * 1e3)
            subj.sort()
            base.sort()
            load.sort()
            proj.sort()
            warm.append(
                {
                    "p50": percentile(subj, 50),
                    "p99": percentile(subj, 99),
                    "base_p50": percentile(base, 50),
                    "load_p50": percentile(load, 50),
                    "proj_p50": percentile(proj, 50),
                }
            )
        hs.close()

        compared = _compare(db, task_id, args.compare, runs, reps) if args.compare else None

        dropped = _drop_caches()
        cold = []
        for r in range(runs):
            pair = ("subject", "raw") if r % 2 == 0 else ("raw", "subject")
            got: dict[str, float] = {}
            for kind in pair:
                dropped = _drop_caches() and dropped
                got |= _child(kind, db, task_id)
            cold.append(got)
        return {
            "bench": "replay_speed",
            "runs": runs,
            "reps_per_run": reps,
            "events": n_events,
            "steps": len(chronicle.steps),
            "key_nodes": len(chronicle.key_nodes),
            "db_mb": db.stat().st_size / 2**20,
            "warm_p50_ms": spread([w["p50"] for w in warm]),
            "warm_p99_ms": spread([w["p99"] for w in warm]),
            "warm_raw_p50_ms": spread([w["base_p50"] for w in warm]),
            "warm_load_p50_ms": spread([w["load_p50"] for w in warm]),
            "warm_projection_p50_ms": spread([w["proj_p50"] for w in warm]),
            "warm_ratio": spread([w["p50"] / w["base_p50"] for w in warm]),
            "cold_ms": spread([c["subject_ms"] for c in cold]),
            "cold_raw_ms": spread([c["baseline_ms"] for c in cold]),
            "cold_ratio": spread([c["subject_ms"] / c["baseline_ms"] for c in cold]),
            "page_cache_dropped": dropped,
            "compared": compared,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    w, c = r["warm_p50_ms"], r["cold_ms"]
    lines = []
    for who, m in (r.get("compared") or {}).items():
        p = m["p50_ms"]
        lines.append(
            f"{who} ({m['code']}): warm p50 {p['median']:.1f} ms ({p['min']:.1f}-{p['max']:.1f}); "
            f"raw read {m['raw_p50_ms']['median']:.1f} ms; ratio {m['ratio']['median']:.2f} "
            f"({m['ratio']['min']:.2f}-{m['ratio']['max']:.2f}); thread CPU "
            f"{m['cpu_p50_ms']['median']:.1f} ms vs raw {m['raw_cpu_p50_ms']['median']:.1f} ms, "
            f"ratio {m['cpu_ratio']['median']:.2f}"
        )
    return "\n".join(
        [
            f"{r['events']:,}-event task -> {r['steps']} steps, {r['key_nodes']} key nodes",
            f"warm p50 {w['median']:.1f} ms ({w['min']:.1f}-{w['max']:.1f}), p99 "
            f"{r['warm_p99_ms']['median']:.1f}; raw read {r['warm_raw_p50_ms']['median']:.1f} ms; "
            f"decode all {r['warm_load_p50_ms']['median']:.1f} ms; projections "
            f"{r['warm_projection_p50_ms']['median']:.1f} ms; ratio {r['warm_ratio']['median']:.1f}",
            f"cold {c['median']:.1f} ms ({c['min']:.1f}-{c['max']:.1f}); raw read "
            f"{r['cold_raw_ms']['median']:.1f} ms; page cache dropped: {r['page_cache_dropped']}",
            *lines,
        ]
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--reps", type=int, default=20, help="warm replays per run")
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument(
        "--compare",
        metavar="SRC",
        help="also measure the replay of another checkout's src folder (e.g. /work/main/src), "
        "in child processes alternating with this checkout's",
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, db, task_id = sys.argv[2:5]
        if kind == "warm":
            src, reps = sys.argv[5:7]
            sys.path.insert(0, src)  # before hindsight_loop is imported: that code is measured
            print(json.dumps(_warm_child(db, task_id, int(reps))))
        else:
            fn = _cold_child if kind == "subject" else _cold_raw_child
            print(json.dumps(fn(db, task_id)))
    else:
        cli(__doc__ or "", run, render, _extra)
