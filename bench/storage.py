"""Bytes per event on disk, against storing each step's full context.

A trajectory logger that keeps, at every step, the context the model saw (system prompt, tool
descriptions, the user's request and every earlier tool call with its full output) stores a
context that grows with each step, so its size grows with the square of the run's length.
Hindsight stores each step once, as an event in the wire format of DESIGN.md (with the
``context`` fields goal / subtask / last user input on every event, as that format shows), long
text cut to 500 characters at record time.

Workload: tasks of ``--steps`` steps (a model decision and a tool call with a 0.5-3 KB output
each), in English and Chinese. Sizes are of the SQLite file after a WAL checkpoint, indexes
included, each store built in the same run with the same schema conventions:

- Hindsight: the events through ``hs.record``, as an agent or an import would send them;
- full context per step (baseline): one row per event whose body is the event plus the whole
  context at that step;
- raw events: the same events uncut and without the repeated ``context`` fields, for scale.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from _common import TOOLS, cli, spread, text  # noqa: E402

SYSTEM = "You are a data-cleaning agent. " * 50  # ~1.5 KB system prompt
TOOL_DOCS = [
    {
        "name": t,
        "description": f"{t}: " + "reads and writes tabular data " * 8,
        "parameters": {"path": "string", "encoding": "string"},
    }
    for t in TOOLS
]


def _task(rng: random.Random, i: int, steps: int) -> list[dict[str, Any]]:
    tid = f"tsk_storage_{i}"
    goal = text(rng, 200)
    user = text(rng, 300)
    events: list[dict[str, Any]] = [
        {
            "type": "task_start",
            "task_id": tid,
            "task_type": "csv",
            "goal": goal,
            "tools": list(TOOLS),
        },
        {"type": "user_input", "task_id": tid, "input": {"text": user}},
    ]
    ctx = {"goal": goal, "subtask": "", "last_user_input": user}
    for s in range(steps):
        tool = rng.choice(TOOLS)
        ctx = dict(ctx, subtask=text(rng, 100))
        events.append(
            {
                "type": "llm_decision",
                "task_id": tid,
                "context": ctx,
                "agent_state": {"current_step": f"step{s}", "context_count": 2 + 2 * s},
                "decision": {
                    "chosen_action": tool,
                    "alternatives": [rng.choice(TOOLS)],
                    "confidence": round(rng.random(), 2),
                    "reasoning": text(rng, 250),
                },
            }
        )
        failed = rng.random() < 0.15
        result: dict[str, Any] = {
            "status": "failed" if failed else "succeeded",
            "output": text(rng, rng.randint(500, 3000)),
        }
        if failed:
            result |= {"error_type": "EncodingError", "error_message": text(rng, 120)}
        events.append(
            {
                "type": "action_executed",
                "task_id": tid,
                "context": ctx,
                "agent_state": {"current_step": f"step{s}"},
                "input": {
                    "tool": tool,
                    "args": {"path": f"/data/{text(rng, 30)}.csv", "encoding": "utf-8"},
                },
                "result": result,
            }
        )
    events.append({"type": "task_end", "task_id": tid, "result": {"status": "succeeded"}})
    return events


def _size(db: Path) -> int:
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return db.stat().st_size


def _naive(db: Path, tasks: list[list[dict[str, Any]]], with_context: bool) -> int:
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL, "
        "task_id TEXT NOT NULL, seq INTEGER NOT NULL, ts TEXT NOT NULL, "
        "type TEXT NOT NULL, body TEXT NOT NULL)"
    )
    con.execute("CREATE INDEX events_by_task ON events(task_id, ts, seq)")
    con.execute("BEGIN")
    for events in tasks:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM, "tools": TOOL_DOCS}]
        for seq, ev in enumerate(events):
            body = {k: v for k, v in ev.items() if k not in ("type", "task_id", "context")}
            if ev["type"] == "user_input":
                messages.append({"role": "user", "content": ev["input"]["text"]})
            elif ev["type"] == "llm_decision":
                messages.append(
                    {
                        "role": "assistant",
                        "content": ev["decision"]["reasoning"],
                        "tool_call": ev["decision"]["chosen_action"],
                    }
                )
            elif ev["type"] == "action_executed":
                messages.append(
                    {
                        "role": "tool",
                        "content": ev["result"].get("output"),
                        "args": ev["input"]["args"],
                    }
                )
            if with_context:
                body["full_context"] = messages
            con.execute(
                "INSERT INTO events(event_id, task_id, seq, ts, type, body) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    f"evt_{ev['task_id']}_{seq}",
                    ev["task_id"],
                    seq,
                    "2024-11-20T14:32:10.882Z",
                    ev["type"],
                    orjson.dumps(body).decode(),
                ),
            )
    con.execute("COMMIT")
    con.close()
    return _size(db)


def _hindsight(db: Path, tasks: list[list[dict[str, Any]]]) -> int:
    import warnings

    from hindsight_loop import Hindsight, HindsightWarning

    hs = Hindsight(db, background=False, triggers=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        for events in tasks:
            for ev in events:
                hs.record(ev)
        hs.flush()
    hs.close()
    return _size(db)


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = 3 if args.quick else max(5, args.runs)
    n_tasks = 30 if args.quick else args.tasks
    tmp = Path(tempfile.mkdtemp(prefix="hs-storage-"))
    try:
        per = []
        for r in range(runs):
            rng = random.Random(100 + r)
            tasks = [_task(rng, i, args.steps) for i in range(n_tasks)]
            n = sum(len(t) for t in tasks)
            sizes = {}
            order = ["hindsight", "full_context", "raw"]
            for name in order[r % 3 :] + order[: r % 3]:
                db = tmp / f"{name}{r}.db"
                if name == "hindsight":
                    sizes[name] = _hindsight(db, tasks)
                else:
                    sizes[name] = _naive(db, tasks, with_context=name == "full_context")
            per.append({k: v / n for k, v in sizes.items()} | {"events": n})
        return {
            "bench": "storage",
            "runs": runs,
            "tasks": n_tasks,
            "steps_per_task": args.steps,
            "events_per_run": per[0]["events"],
            "hindsight_bytes_per_event": spread([p["hindsight"] for p in per]),
            "full_context_bytes_per_event": spread([p["full_context"] for p in per]),
            "raw_bytes_per_event": spread([p["raw"] for p in per]),
            "reduction_vs_full_context": spread(
                [1 - p["hindsight"] / p["full_context"] for p in per]
            ),
            "reduction_vs_raw": spread([1 - p["hindsight"] / p["raw"] for p in per]),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    h, f, w = (
        r["hindsight_bytes_per_event"],
        r["full_context_bytes_per_event"],
        r["raw_bytes_per_event"],
    )
    return "\n".join(
        [
            f"{r['runs']} runs x {r['tasks']} tasks x {r['steps_per_task']} steps "
            f"({r['events_per_run']} events)",
            f"hindsight {h['median']:,.0f} B/event; full context per step {f['median']:,.0f} B/event; "
            f"raw uncut events {w['median']:,.0f} B/event",
            f"reduction vs full context {r['reduction_vs_full_context']['median']:.1%}, "
            f"vs raw events {r['reduction_vs_raw']['median']:.1%}",
        ]
    )


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--steps", type=int, default=20)


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
