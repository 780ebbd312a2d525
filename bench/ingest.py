"""Sustained ingest into SQLite through the recorder, and the backlog under a CPU-busy agent.

Ingest: events per second from the first record to ``flush()`` returning, for a trajectory mix
of events (per 10: 4 tool calls of ~1 KB, 3 decisions, a user input, a state change, a
feedback; ~500 B of body on average), recorded with ``TaskRun`` calls on the agent's thread
(``record_action``, ``decision``, ``user_input``, ``state``, ``feedback``). Each run appends to
the same store, so the last run ends at ``--events`` x runs rows: the rate must hold as the
table grows. Subjects: the writer process (``writer="process"``: the agent's process serializes,
another sanitizes, redacts, writes and runs the live triggers; the default where one can start)
and the writer thread (``writer="thread"``), each with the live triggers on; the thread also
with them off, and both writers with the events in tasks of 100 (the live rules stop reading a
task that used up its local reviews, which the one long task does early; short tasks keep them at
work, and each task end reads the task and queues its review).
Baseline, interleaved run by run: a naive synchronous logger on the agent's thread that
serializes each event with orjson and writes it to the same schema with ``executemany``, one
transaction per 10,000 events, without sanitizing or redacting: roughly what this disk and SQLite
can take.

Busy agent, with the default writer: the agent's thread computes (pure Python, ~20 µs of work
per event, calibrated) and records one event per unit of work; the number of accepted events not
yet durable (queue plus batches being written) is sampled after every event. The writer must
keep up: the maximum stays within two batches. Baseline: the same work without recording, for
the agent's slowdown.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from _common import cli, mixed_events, redact_guards, spread  # noqa: E402


def _replay_onto(task: Any, events: list[dict[str, Any]]) -> None:
    """Record wire-shaped events through the facade's per-event calls (the agent's path)."""
    for ev in events:
        t = ev["type"]
        if t == "action_executed":
            inp, res = ev["input"], ev["result"]
            task.record_action(
                inp["tool"],
                inp["args"],
                output=res.get("output"),
                status=res["status"],
                error_type=res.get("error_type"),
                error_message=res.get("error_message"),
                step=ev["agent_state"]["current_step"],
            )
        elif t == "llm_decision":
            d = ev["decision"]
            task.decision(
                d["chosen_action"],
                alternatives=d["alternatives"],
                confidence=d["confidence"],
                reasoning=d["reasoning"],
                step=ev["agent_state"]["current_step"],
            )
        elif t == "user_input":
            task.user_input(ev["input"]["text"])
        elif t == "state_change":
            task.state(**ev["agent_state"])
        else:
            task.feedback(ev["input"]["text"], score=ev["input"]["score"])


def _subject(
    db: Path,
    events: list[dict[str, Any]],
    triggers: bool = True,
    writer: str = "thread",
    per_task: int = 0,
) -> tuple[float, int]:
    """The recorder as users get it (live anomaly triggers on), or with the triggers off.

    ``per_task``: the events go to tasks of this many (each started and ended in the timed
    region) rather than to one task. The live rules stop reading a task once it has used up
    its local reviews, which one long task of this mix does within its first events: short
    tasks keep them reading every watched event."""
    from hindsight_loop import Hindsight

    hs = Hindsight(db, background=False, triggers=triggers, writer=writer)  # type: ignore[arg-type]
    try:
        if per_task:
            # The writer process starts with the first event, and the first task loads what
            # tasks use: once per agent, not part of the rate (as for the one long task below).
            with hs.task("ingest", goal="warm-up", recall=False):
                pass
            hs.flush()
            t0 = time.perf_counter()
            for i in range(0, len(events), per_task):
                with hs.task("ingest", goal="short", recall=False) as task:
                    _replay_onto(task, events[i : i + per_task])
            hs.flush()
            return time.perf_counter() - t0, hs.store.event_count()
        with hs.task("ingest", goal="bulk", recall=False) as task:
            hs.flush()  # the writer process starts: once per agent, not part of the rate
            t0 = time.perf_counter()
            _replay_onto(task, events)
            hs.flush()
            elapsed = time.perf_counter() - t0
        hs.flush()
        return elapsed, hs.store.event_count()
    finally:
        hs.close()


def _baseline(db: Path, events: list[dict[str, Any]]) -> float:
    from hindsight_loop.store.sqlite import SQLiteStore

    SQLiteStore(db).close()  # the same schema and pragmas
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    sql = "INSERT INTO events(event_id, task_id, seq, ts, type, body) VALUES (?,?,?,?,?,?)"
    tid = f"tsk_base{db.stat().st_mtime_ns}"
    t0 = time.perf_counter()
    batch = []
    for i, ev in enumerate(events):
        body = {k: v for k, v in ev.items() if k not in ("type", "task_id")}
        ts = time.time_ns()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts // 10**9))
        batch.append(
            (
                f"evt_{ts:x}{i:x}",
                tid,
                i,
                f"{stamp}.{ts // 10**6 % 1000:03d}Z",
                ev["type"],
                orjson.dumps(body).decode(),
            )
        )
        if len(batch) == 10_000:
            con.execute("BEGIN")
            con.executemany(sql, batch)
            con.execute("COMMIT")
            batch = []
    if batch:
        con.execute("BEGIN")
        con.executemany(sql, batch)
        con.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    con.close()
    return elapsed


def _work_unit(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def _calibrate(target_us: float) -> int:
    n = 100
    while True:
        t0 = time.perf_counter()
        for _ in range(200):
            _work_unit(n)
        per = (time.perf_counter() - t0) / 200 * 1e6
        if per >= target_us * 0.8:
            return max(1, int(n * target_us / per))
        n *= 2


def _busy(db: Path, events: list[dict[str, Any]], work: int, record: bool) -> dict[str, float]:
    from hindsight_loop import Hindsight
    from hindsight_loop.record import BATCH_SIZE

    hs = Hindsight(db, background=False, triggers=False)  # the default writer
    rec = hs.recorder
    pending_max = 0
    try:
        with hs.task("busy", goal="compute", recall=False) as task:
            t0 = time.perf_counter()
            for i in range(0, len(events), 10):
                chunk = events[i : i + 10]
                for _ev in chunk:
                    _work_unit(work)
                if record:
                    _replay_onto(task, chunk)
                    pending_max = max(pending_max, rec.pending)
            elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        hs.flush()
        drain = time.perf_counter() - t1
        return {
            "elapsed": elapsed,
            "pending_max": pending_max,
            "drain_s": drain,
            "batch": BATCH_SIZE,
            # after the run: a writer process that could not start or died falls back to a thread
            "writer": getattr(rec, "mode", "thread"),
        }
    finally:
        hs.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = 3 if args.quick else max(5, args.runs)
    n = 20_000 if args.quick else args.events
    busy_n = 20_000 if args.quick else args.busy_events
    rng = random.Random(7)
    tmp = Path(tempfile.mkdtemp(prefix="hs-ingest-"))
    try:
        events = mixed_events(rng, "x", n)
        avg_body = sum(
            len(orjson.dumps({k: v for k, v in e.items() if k not in ("type", "task_id")}))
            for e in events[:10_000]
        ) / min(n, 10_000)
        subj, prop, base, proc, short, proc_short, rows, proc_rows = [], [], [], [], [], [], 0, 0
        for r in range(0 if args.busy_only else runs):
            for which in [(3, 5, 0, 4, 1, 2), (2, 4, 1, 5, 0, 3), (1, 3, 2, 0, 4, 5)][r % 3]:
                if which == 5:
                    elapsed, _ = _subject(
                        tmp / "process_short_tasks.db", events, writer="process", per_task=100
                    )
                    proc_short.append(n / elapsed)
                elif which == 4:
                    elapsed, _ = _subject(tmp / "short_tasks.db", events, per_task=100)
                    short.append(n / elapsed)
                elif which == 3:
                    elapsed, proc_rows = _subject(tmp / "process.db", events, writer="process")
                    proc.append(n / elapsed)
                elif which == 0:
                    elapsed, rows = _subject(tmp / "subject.db", events)
                    subj.append(n / elapsed)
                elif which == 1:
                    elapsed, _ = _subject(tmp / "no_triggers.db", events, triggers=False)
                    prop.append(n / elapsed)
                else:
                    base.append(n / _baseline(tmp / "baseline.db", events))
        expected_rows = runs * (n + 2)

        work = _calibrate(20.0)
        busy_events = mixed_events(rng, "x", busy_n)
        busy_runs = 3 if args.quick else runs
        busy, idle = [], []
        for r in range(busy_runs):
            for which in (0, 1) if r % 2 == 0 else (1, 0):
                db = tmp / f"busy{r}{which}.db"
                if which == 0:
                    busy.append(_busy(db, busy_events, work, True))
                else:
                    idle.append(_busy(db, busy_events, work, False))
        busy_out = {
            "busy_events": busy_n,
            "busy_work_us": 20.0,
            "busy_pending_max": spread([b["pending_max"] for b in busy]),
            "busy_batch_size": busy[0]["batch"],
            "busy_writer": "/".join(sorted({b["writer"] for b in busy})),
            "busy_events_per_s": spread([busy_n / b["elapsed"] for b in busy]),
            "busy_drain_s": spread([b["drain_s"] for b in busy]),
            "busy_agent_slowdown": spread(
                [b["elapsed"] / i["elapsed"] for b, i in zip(busy, idle, strict=True)]
            ),
            # The same up to the flush that makes the last event durable: a writer that falls
            # behind slows the agent less while it runs and leaves the rest for the flush.
            "busy_agent_slowdown_to_durable": spread(
                [
                    (b["elapsed"] + b["drain_s"]) / i["elapsed"]
                    for b, i in zip(busy, idle, strict=True)
                ]
            ),
        }
        if args.busy_only:
            return {"bench": "ingest", "redact_guards": redact_guards(), **busy_out}
        return {
            "bench": "ingest",
            "redact_guards": redact_guards(),
            "runs": runs,
            "events_per_run": n,
            "avg_body_bytes": avg_body,
            "rows_at_end": rows,
            "process_rows_at_end": proc_rows,
            "process_events_per_s": spread(proc),
            "process_last_run_events_per_s": proc[-1],
            "ratio_process_over_baseline": spread([p / b for p, b in zip(proc, base, strict=True)]),
            "ratio_process_over_thread": spread([p / s for p, s in zip(proc, subj, strict=True)]),
            "rows_expected": expected_rows,
            "subject_events_per_s": spread(subj),
            "baseline_events_per_s": spread(base),
            "subject_last_run_events_per_s": subj[-1],
            "no_triggers_events_per_s": spread(prop),
            "short_tasks_events_per_s": spread(short),
            "process_short_tasks_events_per_s": spread(proc_short),
            "ratio_process_short_tasks_over_baseline": spread(
                [p / b for p, b in zip(proc_short, base, strict=True)]
            ),
            "ratio_short_tasks_over_baseline": spread(
                [p / b for p, b in zip(short, base, strict=True)]
            ),
            "ratio_no_triggers_over_baseline": spread(
                [p / b for p, b in zip(prop, base, strict=True)]
            ),
            "ratio_subject_over_baseline": spread([s / b for s, b in zip(subj, base, strict=True)]),
            **busy_out,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _render_busy(r: dict[str, Any]) -> str:
    return (
        f"busy agent: max pending {r['busy_pending_max']['max']:,.0f} "
        f"(median of runs {r['busy_pending_max']['median']:,.0f}; batch "
        f"{r['busy_batch_size']:,}), {r['busy_events_per_s']['median']:,.0f} events/s, "
        f"agent slowdown x{r['busy_agent_slowdown']['median']:.2f} "
        f"(x{r['busy_agent_slowdown_to_durable']['median']:.2f} to the last event durable), "
        f"drain {r['busy_drain_s']['median']:.2f} s (default writer, "
        f"{r.get('busy_writer', '?')}: "
        + (
            "redaction guards in one Hyperscan scan per 100 events)"
            if r.get("redact_guards") == "hyperscan"
            else "Python redaction guards)"
        )
    )


def render(r: dict[str, Any]) -> str:
    if "subject_events_per_s" not in r:
        return _render_busy(r)
    s, b, q = (
        r["subject_events_per_s"],
        r["baseline_events_per_s"],
        r["ratio_subject_over_baseline"],
    )
    return "\n".join(
        [
            f"{r['runs']} runs x {r['events_per_run']:,} events (~{r['avg_body_bytes']:.0f} B body), "
            f"store ends at {r['rows_at_end']:,} rows (expected {r['rows_expected']:,}); "
            f"redaction guards: {r.get('redact_guards', 'python')}",
            f"writer process (triggers on) {r['process_events_per_s']['median']:,.0f} events/s "
            f"({r['process_events_per_s']['min']:,.0f}-{r['process_events_per_s']['max']:,.0f}), "
            f"last run (store at {r['process_rows_at_end']:,} rows) "
            f"{r['process_last_run_events_per_s']:,.0f}; / baseline "
            f"{r['ratio_process_over_baseline']['median']:.2f}, / writer thread "
            f"{r['ratio_process_over_thread']['median']:.2f}",
            f"recorder (defaults, triggers on) {s['median']:,.0f} events/s ({s['min']:,.0f}-{s['max']:,.0f})",
            f"with the live triggers off {r['no_triggers_events_per_s']['median']:,.0f} events/s",
            f"triggers on, tasks of 100 events {r['short_tasks_events_per_s']['median']:,.0f} "
            f"events/s (writer process "
            f"{r['process_short_tasks_events_per_s']['median']:,.0f})",
            f"naive executemany logger {b['median']:,.0f} events/s ({b['min']:,.0f}-{b['max']:,.0f})",
            f"ratio {q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f})",
            _render_busy(r),
        ]
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument(
        "--events",
        type=int,
        default=200_000,
        help="events per run (the store grows by this much each run)",
    )
    p.add_argument("--busy-events", type=int, default=100_000)
    p.add_argument(
        "--busy-only", action="store_true", help="only the CPU-busy agent case (its backlog)"
    )


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
