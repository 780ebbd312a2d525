"""Overload: record faster than the disk can take; memory stays flat and nothing is lost silently.

The recorder's queue has a bound (``queue_bound``) and a stated policy: when it is full the
agent's thread waits up to ``block_seconds`` for the writer, then spills the oldest batch to the
dead-letter file next to the database (``hindsight import`` reads it back). So at any time
every accepted event is in the queue, in a batch being written, in the store, or in the
dead-letter file.

The agent's thread records ~1 KB tool calls, each with its own payload objects, in a tight loop
(a million a second if nothing pushed back) while the disk is made slow: every batch write
first sleeps ``--disk-delay`` seconds (a disk taking that long per 10,000 rows), so the writer
falls behind and the queue fills. The resident memory of the process is sampled every 20 ms.
At the end: rows in the store + lines in the dead-letter file must equal the events accepted,
and memory must stop growing once the queue is full.

With the writer process (``writer="process"``) the slow disk is another connection holding the
database's write lock ``--disk-delay`` seconds at a time (the writer process is not patched): the
writer waits, stops reading its ring, the ring fills, the lines waiting in the agent (beyond
the ring) reach the bound and spill. Memory is then sampled in both processes (the agent's, the writer's).

Baseline, interleaved run by run: the same workload with the bound lifted (``queue_bound`` of
10^9), which is what an unbounded in-memory queue would do: its memory grows with the backlog.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import action_payload, cli, rss_bytes, spread  # noqa: E402


def _rss_of(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * 4096
    except (OSError, ValueError):
        return 0


def _one(
    db: Path, n: int, bound: int, delay: float, block_seconds: float, writer: str = "thread"
) -> dict[str, Any]:
    import sqlite3

    from hindsight_loop import Hindsight, HindsightWarning

    hs = Hindsight(db, background=False, triggers=False, queue_bound=bound, writer=writer)  # type: ignore[arg-type]
    hs.recorder.block_seconds = block_seconds
    done = threading.Event()
    if writer == "thread":
        write = hs.recorder._write

        def slow_disk(rows: list) -> Any:
            time.sleep(delay)
            return write(rows)

        hs.recorder._write = slow_disk
    else:

        def hold_lock() -> None:  # a slow disk for a process we do not patch
            con = sqlite3.connect(db, isolation_level=None, timeout=60)
            while not done.is_set():
                con.execute("BEGIN IMMEDIATE")
                time.sleep(delay)
                con.execute("COMMIT")
                time.sleep(0.01)
            con.close()

        threading.Thread(target=hold_lock, daemon=True).start()
    rng = random.Random(11)
    templates = [action_payload(rng) for _ in range(200)]
    marks: list[int] = []  # resident memory after each twentieth of the events
    step = max(1, n // 20)
    peak = [0]
    writer_peak = [0]
    writer_marks: list[int] = []
    sampling = threading.Event()

    def sample() -> None:  # the peak between marks (a spill or a batch can spike it)
        while not sampling.is_set():
            peak[0] = max(peak[0], rss_bytes())
            writer_peak[0] = max(writer_peak[0], _rss_of(getattr(hs.recorder, "pid", None)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    rss0 = rss_bytes()
    accepted = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)  # spills warn; counted below instead
        task = hs.task("overload", recall=False).__enter__()
        accepted += 1
        sampler.start()
        t0 = time.perf_counter()
        for i in range(n):
            tool, args, output, step_name = templates[i % 200]
            # Fresh objects per event, as a real agent's: shared ones would hide the queue's size.
            task.record_action(
                tool,
                dict(args, i=i),
                output=dict(output, preview=output["preview"] + f" #{i}"),
                step=step_name,
            )
            accepted += 1
            if i % step == step - 1:
                marks.append(rss_bytes())
                writer_marks.append(_rss_of(getattr(hs.recorder, "pid", None)))
        t_emit = time.perf_counter() - t0
        task.__exit__(None, None, None)
        accepted += 1
        done.set()  # the disk is fast again: what is left drains
        hs.flush()
        sampling.set()
        sampler.join()
    rows = hs.store.event_count()
    stats = dict(hs.recorder.stats)
    dead_path = hs.recorder.dead_letter
    hs.close()
    dead = 0
    if dead_path.exists():
        with open(dead_path, "rb") as f:
            dead = sum(1 for line in f if line.strip())
    half = len(marks) // 2
    return {
        "accepted": accepted,
        "rows": rows,
        "dead_letter_lines": dead,
        "lost": accepted - rows - dead,
        "spilled": stats["spilled"],
        "peak_rss_mb": (max(peak[0], *marks) - rss0) / 2**20,
        # Growth over the second half of the events: zero once the queue is full.
        "rss_growth_second_half_mb": (marks[-1] - marks[half]) / 2**20,
        "rss_growth_first_half_mb": (marks[half] - rss0) / 2**20,
        "emit_s": t_emit,
        "writer_peak_rss_mb": writer_peak[0] / 2**20,
        "writer_rss_growth_second_half_mb": (writer_marks[-1] - writer_marks[half]) / 2**20,
    }


def _child(db: Path, n: int, bound: int, delay: float, block: float, writer: str) -> dict[str, Any]:
    """One measurement in a fresh process, so memory freed by an earlier one cannot hide growth."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(db),
        str(n),
        str(bound),
        str(delay),
        str(block),
        writer,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The queue must fill and stay full for a while (bound + ~3 batches) before memory can be
    # seen to stay flat, so even a quick run needs ~50k events: one run pair only.
    runs = 1 if args.quick else max(5, args.runs)
    n = 50_000 if args.quick else args.events
    bound = args.bound
    tmp = Path(tempfile.mkdtemp(prefix="hs-overload-"))
    try:
        bounded, unbounded = [], []
        for r in range(runs):
            for which in (0, 1) if r % 2 == 0 else (1, 0):
                db = tmp / f"o{r}{which}.db"
                if which == 0:
                    bounded.append(_child(db, n, bound, args.disk_delay, args.block, args.writer))
                else:
                    unbounded.append(_child(db, n, 10**9, args.disk_delay, args.block, args.writer))
        return {
            "bench": "overload",
            "runs": runs,
            "events": n,
            "queue_bound": bound,
            "disk_delay_s": args.disk_delay,
            "lost_total": sum(x["lost"] for x in bounded + unbounded),
            "accepted_total": sum(x["accepted"] for x in bounded),
            "rows_total": sum(x["rows"] for x in bounded),
            "dead_letter_total": sum(x["dead_letter_lines"] for x in bounded),
            "spilled": spread([x["spilled"] for x in bounded]),
            "peak_rss_mb": spread([x["peak_rss_mb"] for x in bounded]),
            "second_half_growth_mb": spread([x["rss_growth_second_half_mb"] for x in bounded]),
            "first_half_growth_mb": spread([x["rss_growth_first_half_mb"] for x in bounded]),
            "unbounded_peak_rss_mb": spread([x["peak_rss_mb"] for x in unbounded]),
            "unbounded_second_half_growth_mb": spread(
                [x["rss_growth_second_half_mb"] for x in unbounded]
            ),
            "emit_events_per_s": spread([n / x["emit_s"] for x in bounded]),
            "block_seconds": args.block,
            "writer": args.writer,
            "writer_process_peak_rss_mb": spread([x["writer_peak_rss_mb"] for x in bounded]),
            "writer_process_second_half_growth_mb": spread(
                [x["writer_rss_growth_second_half_mb"] for x in bounded]
            ),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"writer {r['writer']}: {r['runs']} runs x {r['events']:,} events, queue bound {r['queue_bound']:,}, disk "
            f"{r['disk_delay_s']} s per batch",
            f"accepted {r['accepted_total']:,} = rows {r['rows_total']:,} + dead letter "
            f"{r['dead_letter_total']:,}; lost {r['lost_total']}",
            f"bounded: peak +{r['peak_rss_mb']['median']:.0f} MB, growth over the second half "
            f"{r['second_half_growth_mb']['median']:+.1f} MB",
            f"unbounded: peak +{r['unbounded_peak_rss_mb']['median']:.0f} MB, growth over the second "
            f"half {r['unbounded_second_half_growth_mb']['median']:+.1f} MB",
            f"writer process (bounded runs): peak {r['writer_process_peak_rss_mb']['median']:.0f} MB"
            f" resident, growth over the second half "
            f"{r['writer_process_second_half_growth_mb']['median']:+.1f} MB",
        ]
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--bound", type=int, default=20_000)
    p.add_argument("--disk-delay", type=float, default=0.3)
    p.add_argument("--block", type=float, default=0.1, help="the recorder's block_seconds")
    p.add_argument("--writer", choices=("thread", "process"), default="thread")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        db, n, bound, delay, block, writer = sys.argv[2:8]
        print(json.dumps(_one(Path(db), int(n), int(bound), float(delay), float(block), writer)))
    else:
        cli(__doc__ or "", run, render, _extra)
