"""How fast ``hindsight serve``'s pages open on a big store: 10,000 runs and 10,000 lessons.

A person reviewing lessons opens the runs page, the lesson book and the review queue over and
over; each must stay well under 300 ms however much the store holds. This writes a store of
``--runs`` recorded runs (five events each, over 60 days, a fifth failed) and ``--lessons``
lessons (a few needing review, some in conflicting pairs) through the facade, starts the real
``hindsight serve`` on it, and times GETs over real HTTP from a keep-alive client.

Baseline, interleaved request by request: GET of a static file (the stylesheet) and of
``/api/health`` from the same server: what the HTTP stack alone costs on this machine.

Run: ``python bench/serve_page.py`` (``--runs 10000 --lessons 10000 --requests 40``;
``--quick`` for a smoke run, ``--json`` for ``bench/run.py``). Building the store takes most
of the time (about a minute).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli, machine, spread, text  # noqa: E402  (also puts src/ on the path)

from hindsight_loop import Hindsight  # noqa: E402
from hindsight_loop.models import Features, Lesson, iso  # noqa: E402

SEED = 20251201
START = datetime(2025, 10, 1, tzinfo=UTC)
TOKEN = "bench-token"
PAGES = {
    "runs page": "/runs",
    "lessons page": "/lessons",
    "review page": "/review",
    "runs page 50": "/runs?page=50",
    "lessons search": "/lessons?q=gbk",
    "trends page": "/trends",
}
COLD = "lessons page, book just changed"
ELSEWHERE = "lessons page, one lesson changed by another process"
FULL_READ = "whole book read and parsed (what that page paid before lessons_since)"
BASELINES = {"static file": "/static/style.css", "health (JSON)": "/api/health"}


def build(db: Path, n_runs: int, n_lessons: int) -> dict[str, float]:
    rng = random.Random(SEED)
    types = [f"task_type_{i:02d}" for i in range(12)]
    t0 = time.perf_counter()
    with Hindsight(db, background=False, triggers=False) as hs:
        for i in range(n_runs):
            task_id = f"tsk_bench_{i:06d}"
            at = START + timedelta(minutes=i * 60 * 24 * 60 / n_runs)
            failed = rng.random() < 0.2
            tool = rng.choice(("read_csv", "sql_query", "http_get"))
            events = [
                {
                    "type": "task_start",
                    "task_type": rng.choice(types),
                    "goal": text(rng, 60),
                    "tools": [tool],
                },
                {"type": "llm_decision", "decision": {"chosen_action": tool, "confidence": 0.7}},
                {
                    "type": "action_executed",
                    "input": {"tool": tool, "args": {"q": text(rng, 40)}},
                    "result": {
                        "status": "failed" if failed else "succeeded",
                        **({"error_type": "EncodingError"} if failed else {}),
                    },
                },
                {"type": "user_input", "input": {"text": text(rng, 40)}},
                {"type": "task_end", "result": {"status": "failed" if failed else "succeeded"}},
            ]
            for seq, event in enumerate(events):
                hs.record(
                    {
                        **event,
                        "task_id": task_id,
                        "seq": seq,
                        "timestamp": iso(at + timedelta(seconds=seq)),
                    }
                )
        hs.flush()
        recorded = time.perf_counter() - t0
        for i in range(n_lessons):
            review = i % 50 == 0
            other = f"les_bench_{i + 1:06d}" if review and i + 1 < n_lessons else None
            hs.save_lesson(
                Lesson(
                    lesson_id=f"les_bench_{i:06d}",
                    task_type=rng.choice(types),
                    advice="You should " + text(rng, 120),
                    features=Features(
                        tools=[rng.choice(("read_csv", "sql_query", "http_get"))],
                        keywords=["gbk"] if i % 7 == 0 else [],
                    ),
                    status="needs_review" if review else "active",
                    conflicts=[other] if other else [],
                    source_task_ids=[f"tsk_bench_{rng.randrange(n_runs):06d}"],
                    created_at=iso(START + timedelta(minutes=i * 5)),
                    valid_until=iso(START + timedelta(days=400)),
                    helpful=rng.randrange(5),
                    harmful=rng.randrange(2),
                    value_score=rng.random(),
                )
            )
    return {"record_s": recorded, "build_s": time.perf_counter() - t0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(db: Path, requests: int, runs: int) -> dict[str, Any]:
    import httpx

    port = free_port()
    hindsight = str(Path(sys.executable).with_name("hindsight"))
    command = [hindsight, "serve", "--db", str(db), "--port", str(port)]
    if not Path(hindsight).exists():
        command = [sys.executable, "-m", "hindsight_loop.cli", *command[1:]]
    proc = subprocess.Popen(
        command, env={**os.environ, "HINDSIGHT_TOKEN": TOKEN}, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("hindsight serve did not start") from None
                time.sleep(0.05)
        targets = {**BASELINES, **PAGES}
        per_run: dict[str, list[float]] = {name: [] for name in targets}
        sizes: dict[str, int] = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for path in targets.values():  # warm: first parse of the book, template compile
                client.get(path).raise_for_status()
            for _ in range(runs):
                times: dict[str, list[float]] = {name: [] for name in targets}
                for _ in range(requests):
                    for name, path in targets.items():  # interleaved
                        t = time.perf_counter()
                        response = client.get(path)
                        times[name].append((time.perf_counter() - t) * 1000)
                        response.raise_for_status()
                        sizes[name] = len(response.content)
                # Right after a review action: the book changed, so the page parses it anew.
                cold: list[float] = []
                for k in range(max(3, requests // 4)):
                    action = "pin" if k % 2 == 0 else "unpin"
                    client.post(
                        f"/api/lessons/les_bench_000001/{action}",
                        json={"by": "bench"},
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    ).raise_for_status()
                    t = time.perf_counter()
                    client.get("/lessons").raise_for_status()
                    cold.append((time.perf_counter() - t) * 1000)
                times[COLD] = cold
                # Another process (a worker, a second server) changes one lesson: the server
                # reads only what was saved since its book version.
                elsewhere: list[float] = []
                from hindsight_loop import Hindsight
                from hindsight_loop import lessons as book_ops

                with Hindsight(db, background=False) as other:
                    for k in range(max(3, requests // 4)):
                        change = book_ops.pin if k % 2 == 0 else book_ops.unpin
                        other.change_lesson(
                            "les_bench_000002",
                            lambda x, change=change: change(x, by="bench-elsewhere"),
                        )
                        t = time.perf_counter()
                        client.get("/lessons").raise_for_status()
                        elsewhere.append((time.perf_counter() - t) * 1000)
                    full: list[float] = []
                    for _ in range(3):
                        t = time.perf_counter()
                        other.lessons()
                        full.append((time.perf_counter() - t) * 1000)
                times[ELSEWHERE] = elsewhere
                times[FULL_READ] = full
                for name, values in times.items():
                    values.sort()
                    per_run.setdefault(name, []).append(values[len(values) // 2])
                    sizes.setdefault(name, sizes.get("lessons page", 0))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "ms": {name: spread(values) for name, values in per_run.items()},
        "bytes": sizes,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    n_runs, n_lessons, requests, runs = args.runs, args.lessons, args.requests, 5
    if args.quick:
        n_runs, n_lessons, requests, runs = 2000, 2000, 10, 3
    tmp = Path(tempfile.mkdtemp(prefix="hs-serve-bench-"))
    try:
        db = tmp / "big.db"
        built = build(db, n_runs, n_lessons)
        result = measure(db, requests, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = result["ms"]["static file"]["median"]
    return {
        "benchmark": "serve_page",
        "machine": machine(),
        "runs": n_runs,
        "lessons": n_lessons,
        "requests": requests,
        "rounds": runs,
        **built,
        **result,
        "ratio_vs_static": {name: result["ms"][name]["median"] / base for name in result["ms"]},
    }


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"hindsight serve pages — {m['cpu']}, {m['cores']} cores, Python {m['python']} — "
        f"{m['date']}",
        f"{r['runs']:,} runs, {r['lessons']:,} lessons; {r['requests']} GETs per page per round, "
        f"{r['rounds']} rounds, interleaved; median of the rounds' medians (min–max), ms",
        "",
        "| GET | ms | vs static file | bytes |",
        "|---|---:|---:|---:|",
    ]
    for name, s in r["ms"].items():
        lines.append(
            f"| {name} | {s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f}) | "
            f"{r['ratio_vs_static'][name]:.1f}x | {r['bytes'][name]:,} |"
        )
    lines.append("")
    lines.append(f"store written in {r['build_s']:.0f} s (runs recorded in {r['record_s']:.0f} s)")
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=10_000, help="recorded runs in the store")
    parser.add_argument("--lessons", type=int, default=10_000, help="lessons in the book")
    parser.add_argument("--requests", type=int, default=40, help="GETs per page per round")


if __name__ == "__main__":
    cli(__doc__, run, render, _options)
