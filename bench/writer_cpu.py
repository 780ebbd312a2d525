"""The writer process's CPU per event, fed from a file: no agent beside it, the same lines every run.

``bench/agent_step.py`` reports the writer process's CPU while an agent runs beside it on the
same two cores; that figure moves by ±10% run to run on a shared machine. Here the agent's side
runs once: ``--events`` ~1 KB tool calls (``agent_step``'s pool) are recorded through
``Hindsight(writer="process")`` and every line its thread puts in the ring is kept. Then
``python -m hindsight_loop.writer`` is run on those bytes from a file, on a fresh store each
time: CPU (user + system, every thread) minus that of a run fed no event (its start-up: imports,
the store, compiling the redaction guards), per event. The writer reads everything as fast as it
can, as when it lags behind an agent.

``--compare SRC`` (e.g. ``/work/main/src``) runs another checkout's writer on the same bytes,
turn about with this one; medians over ``--runs``.

``--pace US``: the lines come as an agent's would instead, one every ``US`` µs of busy work
(``Hindsight(writer="process")`` in a fresh process per run, a flush every 2,000), so the
writer polls its ring, finds a few lines each time and commits them as it would beside a real
agent; the writer process's CPU (from /proc) over the run, per event. Turn about with
``--compare`` too.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from _common import action_pool, cli, spread  # noqa: E402

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _capture(events: int, tmp: Path) -> tuple[bytes, bytes]:
    """The writer's config line and the event lines an agent put in its ring, as put there
    (read back after each flush of a stretch shorter than the ring)."""
    from hindsight_loop import Hindsight

    pool, _ = action_pool(13)
    hs = Hindsight(tmp / "capture.db", background=False, triggers=True, writer="process")
    recorder: Any = hs.recorder
    lines: list[bytes] = []
    start = 0
    with hs.task("step", goal="measure", recall=False) as task:
        for i in range(events):
            tool, args, output, step = pool[i % len(pool)]
            task.record_action(tool, args, output=output, step=step)
            if i % 2000 == 1999:
                assert hs.flush()
                lines += recorder._ring_lines_between(start, recorder._head)
                start = recorder._head
    assert hs.flush()
    lines += recorder._ring_lines_between(start, recorder._head)  # the task's end
    head = orjson.dumps(recorder._config)
    hs.close()
    return head, b"".join(lines)


def _feed(src: str, head: bytes, lines: bytes, tmp: Path) -> tuple[float, float]:
    """CPU seconds and wall seconds of one writer process fed ``lines`` on a fresh store."""
    where = Path(tempfile.mkdtemp(dir=tmp))
    config = orjson.loads(head)
    config.update(db=str(where / "w.db"), dead_letter=str(where / "dead.jsonl"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hindsight_loop.writer"],
        input=orjson.dumps(config) + b"\n" + lines,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": src},
        check=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(where)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall


#: One run of ``--pace``: an agent's loop recording one ~1 KB call per step; prints the writer
#: process's CPU seconds over the timed steps.
_PACED = """
import os, sys, tempfile, time
sys.path.insert(0, {bench!r})
from _common import action_pool
from hindsight_loop import Hindsight
pool, _ = action_pool(13)
hs = Hindsight(tempfile.mkdtemp(dir={tmp!r}) + "/p.db", background=False, writer="process")
def cpu(pid):
    fields = open(f"/proc/{{pid}}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
with hs.task("step", goal="paced", recall=False) as task:
    task.record_action("warm_up", {{}})
    hs.flush()
    pid = hs.recorder.pid
    start = cpu(pid)
    for i in range({events}):
        tool, args, output, step = pool[i % len(pool)]
        task.record_action(tool, args, output=output, step=step)
        end = time.perf_counter() + {pace} / 1e6
        while time.perf_counter() < end:
            pass
        if i % 2000 == 1999:
            hs.flush()
    hs.flush()
    print(cpu(pid) - start)
hs.close()
"""


def _paced(src: str, events: int, pace: float, tmp: Path) -> float:
    """The writer process's CPU per event (µs) with lines coming every ``pace`` µs."""
    script = _PACED.format(
        bench=str(Path(__file__).resolve().parent), tmp=str(tmp), events=events, pace=pace
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": src},
        check=True,
    )
    return float(done.stdout.split()[-1]) / events * 1e6


def run(args: argparse.Namespace) -> dict[str, Any]:
    events = 5_000 if args.quick else args.events
    runs = 2 if args.quick else args.runs
    tmp = Path(tempfile.mkdtemp(prefix="hs-writer-cpu-"))
    if args.pace:
        return _run_paced(args, events, runs, tmp)
    try:
        head, lines = _capture(events, tmp)
        n = lines.count(b"\n")  # the task's start and end too
        trees = {"this": SRC, **({"compared": args.compare} if args.compare else {})}
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        wall: dict[str, list[float]] = {k: [] for k in trees}
        for r in range(runs):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for who in order:
                idle, _ = _feed(trees[who], head, b"", tmp)
                c, w = _feed(trees[who], head, lines, tmp)
                cpu[who].append((c - idle) / n * 1e6)
                wall[who].append(w)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {"bench": "writer_cpu", "events": n, "runs": runs}
    for who in trees:
        out[f"{who}_cpu_us_per_event"] = spread(cpu[who])
        out[f"{who}_wall_s"] = spread(wall[who])
    if args.compare:
        out["compared_src"] = args.compare
        out["ratio"] = statistics.median(cpu["this"]) / statistics.median(cpu["compared"])
    return out


def _run_paced(args: argparse.Namespace, events: int, runs: int, tmp: Path) -> dict[str, Any]:
    trees = {"this": SRC, **({"compared": args.compare} if args.compare else {})}
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    try:
        for r in range(runs):
            for who in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                cpu[who].append(_paced(trees[who], events, args.pace, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {
        "bench": "writer_cpu",
        "events": events,
        "runs": runs,
        "pace_us": args.pace,
    }
    for who in trees:
        out[f"{who}_cpu_us_per_event"] = spread(cpu[who])
    if args.compare:
        out["compared_src"] = args.compare
        out["ratio"] = statistics.median(cpu["this"]) / statistics.median(cpu["compared"])
    return out


def render(r: dict[str, Any]) -> str:
    if "pace_us" in r:
        lines = [
            f"writer process beside an agent recording one ~1 KB call every {r['pace_us']:g} µs, "
            f"{r['events']:,} events, {r['runs']} runs; its CPU per event, median (min-max)"
        ]
        for who in ("this", "compared"):
            if f"{who}_cpu_us_per_event" in r:
                c = r[f"{who}_cpu_us_per_event"]
                name = "this code" if who == "this" else r["compared_src"]
                lines.append(f"  {name}: {c['median']:.1f} µs ({c['min']:.1f}-{c['max']:.1f})")
        if "ratio" in r:
            lines.append(f"  this / compared: x{r['ratio']:.2f}")
        return "\n".join(lines)
    lines = [
        f"writer process fed {r['events']:,} lines from a file (~1 KB tool calls), {r['runs']} "
        "runs; CPU per event (start-up subtracted), median (min-max)"
    ]
    for who in ("this", "compared"):
        if f"{who}_cpu_us_per_event" in r:
            c, w = r[f"{who}_cpu_us_per_event"], r[f"{who}_wall_s"]
            name = "this code" if who == "this" else r["compared_src"]
            lines.append(
                f"  {name}: {c['median']:.1f} µs ({c['min']:.1f}-{c['max']:.1f}); "
                f"wall {w['median']:.2f} s"
            )
    if "ratio" in r:
        lines.append(f"  this / compared: x{r['ratio']:.2f}")
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--compare", help="another checkout's src directory, run turn about")
    p.add_argument(
        "--pace", type=float, default=0.0, help="µs of agent work between lines (0: from a file)"
    )


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
