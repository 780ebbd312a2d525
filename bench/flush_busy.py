"""How long ``flush()`` takes when every core is busy, by the writer process's scheduling policy.

The writer process runs as batch work (``SCHED_BATCH``: its wake-ups never preempt the agent's
threads, ``bench/agent_step.py``), and under the default policy while a flush waits
(``writer._Urgency``). A batch thread's wake-up waits for the running thread's turn to end, and a
flush wakes the writer a few times (the bell, the commit, the answer): on a machine whose cores
are all taken that is where a flush could get slower. So, with one process spinning per core
(normal priority), an agent records bursts of ~1 KB tool calls (``agent_step``'s pool) and
flushes after each; between bursts it sleeps 20 ms, so the writer goes idle as between an
agent's tasks. Reported per policy: the flush's p50 and p90 over the bursts of a run, medians
over runs.

Policies (``HINDSIGHT_WRITER_SCHED``): ``batch`` (the default: batch work, the default policy
while a flush waits) and ``other`` (the default policy throughout, the baseline), each run in a
fresh process, turn about.

Run: ``python bench/flush_busy.py`` (``--runs``, ``--bursts``, ``--events``; ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import action_pool, cli, percentile, spread  # noqa: E402

POLICIES = ("batch", "other")


def child(bursts: int, events: int) -> dict[str, float]:
    """One run, in the process the policy was set for: flush times (ms) of its bursts."""
    from hindsight_loop import Hindsight

    pool, _ = action_pool(6)
    with tempfile.TemporaryDirectory(prefix="hs-flush-busy-") as tmp:
        hs = Hindsight(Path(tmp) / "h.db", background=False, triggers=True, writer="process")
        task = hs.task("bench", goal="flush on a busy machine", recall=False).__enter__()
        hs.flush()  # the writer process starts: once per agent, not a flush's cost
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)
        ]
        try:
            time.sleep(0.3)
            flushes = []
            for b in range(bursts):
                for i in range(events):
                    tool, a, o, s = pool[(b * events + i) % len(pool)]
                    task.record_action(tool, a, output=o, step=s)
                t0 = time.perf_counter()
                assert hs.flush(timeout=60)
                flushes.append((time.perf_counter() - t0) * 1e3)
                time.sleep(0.02)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        task.__exit__(None, None, None)
        lost = hs.stats["lost"]
        hs.close()
    flushes.sort()
    return {"p50_ms": percentile(flushes, 50), "p90_ms": percentile(flushes, 90), "lost": lost}


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = 2 if args.quick else args.runs
    bursts = 10 if args.quick else args.bursts
    got: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    for r in range(runs):
        for policy in POLICIES[r % 2 :] + POLICIES[: r % 2]:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(bursts), str(args.events)],
                env={**os.environ, "HINDSIGHT_WRITER_SCHED": policy},
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            got[policy].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {
        "bench": "flush_busy",
        "cores_busy": os.cpu_count(),
        "runs": runs,
        "bursts": bursts,
        "events_per_burst": args.events,
    }
    for policy in POLICIES:
        for key in ("p50_ms", "p90_ms"):
            out[f"{policy}_{key}"] = spread([g[key] for g in got[policy]])
        out[f"{policy}_lost"] = sum(g["lost"] for g in got[policy])
    for key in ("p50_ms", "p90_ms"):
        out[f"batch_over_other_{key}"] = (
            out[f"batch_{key}"]["median"] / out[f"other_{key}"]["median"]
        )
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        f"{r['runs']} runs x {r['bursts']} bursts of {r['events_per_burst']} events, "
        f"{r['cores_busy']} cores spinning; flush ms, median (min-max) over runs"
    ]
    for policy in POLICIES:
        p50, p90 = r[f"{policy}_p50_ms"], r[f"{policy}_p90_ms"]
        lines.append(
            f"{policy:6s} p50 {p50['median']:6.2f} ({p50['min']:.2f}-{p50['max']:.2f})  "
            f"p90 {p90['median']:6.2f} ({p90['min']:.2f}-{p90['max']:.2f})  "
            f"lost {r[f'{policy}_lost']}"
        )
    lines.append(
        f"batch / other: p50 x{r['batch_over_other_p50_ms']:.2f}, "
        f"p90 x{r['batch_over_other_p90_ms']:.2f}"
    )
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bursts", type=int, default=30)
    p.add_argument("--events", type=int, default=500, help="events recorded before each flush")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        cli(__doc__, run, render, _extra)
