"""What recording adds to an agent's step, background work included, against an OpenTelemetry span.

A call's own time is not what the agent pays when a thread of its process takes the GIL
afterwards to sanitize, redact and write. So this measures the agent's wall time: a loop of
steps, each ~50 µs of pure-Python work (calibrated) and one ~1 KB tool call recorded with
``TaskRun.record_action`` (1,000 distinct payloads, cycled); a block of steps is timed from its
first step to its flush (``hs.flush()``: the events durable; ``force_flush()`` for OpenTelemetry),
so the writer's work counts wherever it runs. Extra per step = (block time - the same block with
no recording) / steps.

Subjects: Hindsight with its writer in a separate process (``writer="process"``), Hindsight with
its writer thread in the agent's process (``writer="thread"``). Baselines: no recording, and an
OpenTelemetry SDK span per step (5 attributes: tool, arguments and result as JSON strings
prepared beforehand, which favours OpenTelemetry, status, step) through a ``BatchSpanProcessor``
with an exporter that drops everything. Each with 1 agent thread and with 4 (each thread its own
task, the steps shared out; the GIL makes their work take turns, as in an agent).

``--pin-agent CPUS`` (Linux) pins the agent's process to those CPUs first, as ``taskset`` or
``os.sched_setaffinity`` would: the writer process then runs on the others (``writer._writer_cpus``;
the spinning process below too), where before it ran on the agent's pinned CPUs, beside its threads.

All four run in one process, block by block in a rotating order, every run; medians over blocks.
The writer process is started and warmed before timing (its start-up is a once-per-agent cost,
not a per-step one: reported apart, as the first flush of a fresh ``Hindsight``).

Beside them, the machine's own price of a busy other core: the agent's steps recording nothing
while a process that only spins runs on the other core (resumed for its blocks alone), reported
per µs of that process's CPU; times the writer process's CPU per step, it is what the writer's
work costs the agent here through the hardware alone (caches, memory, a host's sibling threads),
whatever that work is.

Beside the wall time, the CPU each costs: the agent's process (every thread, over the same
block with no recording) and the writer process's own. When the writer needs more CPU per event
than the agent's step takes, it falls behind and the flush at the block's end waits for it: the
wall figure then reflects the writer's speed (and how busy the machine's other core is), the
agent-CPU figure what the agent's process itself does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    action_pool,
    cli,
    otel_tool_span,
    otel_tracer,
    redact_guards,
    spread,
)

WORK_US = 50.0


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


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread (what the agent's process pays)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _writer_cpu_s(hs: Any) -> float:
    """CPU seconds of the writer process so far (Linux), 0 when there is none.

    Summed over its threads from ``schedstat`` (nanoseconds): the clock ticks of ``stat``
    (10 ms) are as coarse as a whole block's writer time, so a per-step figure came out in
    steps of several µs."""
    pid = hs.recorder.pid
    if pid is None:
        return 0.0
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        return 0.0
    if total:
        return total / 1e9
    try:  # no schedstat (a kernel without it): clock ticks
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid_cpu_s(pid: int) -> float:
    """CPU seconds of another process so far (Linux ``schedstat``; 0 without it)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hindsight_loop import Hindsight

    rounds = 5 if args.quick else args.rounds
    steps = 1000 if args.quick else args.steps
    from hindsight_loop.writer import _writer_cpus, parse_cpus

    pinned = parse_cpus(args.pin_agent) if args.pin_agent else None
    if pinned:
        os.sched_setaffinity(0, pinned)  # before any thread or process starts: they inherit it
    pool, strings = action_pool(13)
    work = _calibrate(WORK_US)
    tmp = Path(tempfile.mkdtemp(prefix="hs-agent-step-"))
    thread_counts = (1, 4)
    try:
        t0 = time.perf_counter()
        hs_p = Hindsight(tmp / "process.db", background=False, triggers=True, writer="process")
        construct_s = time.perf_counter() - t0
        hs_t = Hindsight(tmp / "thread.db", background=False, triggers=True, writer="thread")
        tasks = {
            name: [
                hs.task("step", goal="measure", recall=False).__enter__()
                for _ in range(max(thread_counts))
            ]
            for name, hs in (("process", hs_p), ("thread", hs_t))
        }
        t0 = time.perf_counter()
        hs_p.flush()  # starts the writer process: once per agent
        first_flush_s = time.perf_counter() - t0
        provider, tracer = otel_tracer()

        def step_none(_i: int, _k: int) -> None:
            _work_unit(work)

        def make_hs(name: str) -> Any:
            def step(i: int, k: int) -> None:
                _work_unit(work)
                tool, a, o, s = pool[i % 1000]
                tasks[name][k].record_action(tool, a, output=o, step=s)

            return step

        def step_otel(i: int, _k: int) -> None:
            _work_unit(work)
            tool, _a, _o, s = pool[i % 1000]
            otel_tool_span(tracer, tool, *strings[i % 1000], s)

        # The machine's own cost of a busy other core, for reading the writer process's figure:
        # a process that only spins, run (SIGCONT) during its blocks alone, the agent's steps
        # recording nothing. On two cores it takes the core the writer process would, and what
        # it adds to the agent's step is what any work on that core costs the agent here
        # (caches, memory bandwidth, a host's sibling threads), per µs of that work's CPU.
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        if pinned and (writers := _writer_cpus()[0]):
            os.sched_setaffinity(hog.pid, writers)  # where the writer process runs
        os.kill(hog.pid, signal.SIGSTOP)

        subjects = {
            "none": (step_none, lambda: None),
            "hog": (step_none, lambda: None),
            "process": (make_hs("process"), hs_p.flush),
            "thread": (make_hs("thread"), hs_t.flush),
            "otel": (step_otel, provider.force_flush),
        }
        names = list(subjects)

        def block(name: str, threads: int, start: int) -> float:
            step, flush = subjects[name]
            per = steps // threads

            def loop(k: int) -> None:
                base = start + k * per
                for i in range(base, base + per):
                    step(i, k)

            c0 = _cpu_s()
            w0 = _writer_cpu_s(hs_p) if name == "process" else 0.0
            if name == "hog":
                h0 = _pid_cpu_s(hog.pid)
                os.kill(hog.pid, signal.SIGCONT)
            t0 = time.perf_counter()
            if threads == 1:
                loop(0)
            else:
                ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
            flush()
            wall = time.perf_counter() - t0
            if name == "hog":
                os.kill(hog.pid, signal.SIGSTOP)
                hog_cpu[threads].append(_pid_cpu_s(hog.pid) - h0)
            cpu[(name, threads)].append(_cpu_s() - c0)
            if name == "process":
                writer_cpu[threads].append(_writer_cpu_s(hs_p) - w0)
            return wall

        cpu: dict[tuple[str, int], list[float]] = {(n, t): [] for n in names for t in thread_counts}
        writer_cpu: dict[int, list[float]] = {t: [] for t in thread_counts}
        hog_cpu: dict[int, list[float]] = {t: [] for t in thread_counts}
        for name in names:  # warm every path
            for threads in thread_counts:
                block(name, threads, 0)
        cpu.clear()
        writer_cpu.clear()
        cpu.update({(n, t): [] for n in names for t in thread_counts})
        writer_cpu.update({t: [] for t in thread_counts})
        hog_cpu.update({t: [] for t in thread_counts})
        times: dict[tuple[str, int], list[float]] = {
            (n, t): [] for n in names for t in thread_counts
        }
        for r in range(rounds):
            for threads in thread_counts:
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    times[(name, threads)].append(block(name, threads, r * steps))
        for per_thread in tasks.values():
            for task in per_thread:
                task.__exit__(None, None, None)
        hs_p.flush()
        stored = hs_p.store.event_count()
        stats_p = dict(hs_p.recorder.stats)
        hs_p.close()
        hs_t.close()
        provider.shutdown()
        hog.kill()
        hog.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    out: dict[str, Any] = {
        "bench": "agent_step",
        "redact_guards": redact_guards(),
        "rounds": rounds,
        "steps_per_block": steps,
        "work_us": WORK_US,
        "construct_ms": construct_s * 1e3,
        "writer_start_first_flush_ms": first_flush_s * 1e3,
        "process_rows_stored": stored,
        "process_lost": stats_p["lost"],
    }
    if pinned:
        out["agent_pinned_to_cpus"] = ",".join(map(str, sorted(pinned)))
    for threads in thread_counts:
        base = times[("none", threads)]
        out[f"t{threads}_none_step_us"] = spread([b / steps * 1e6 for b in base])
        for name in ("process", "thread", "otel"):
            extra = [
                (s - b) / steps * 1e6 for s, b in zip(times[(name, threads)], base, strict=True)
            ]
            out[f"t{threads}_{name}_extra_us"] = spread(extra)
        base_cpu = cpu[("none", threads)]
        for name in ("process", "thread", "otel"):
            extra = [
                (s - b) / steps * 1e6 for s, b in zip(cpu[(name, threads)], base_cpu, strict=True)
            ]
            out[f"t{threads}_{name}_agent_cpu_us"] = spread(extra)
        out[f"t{threads}_writer_process_cpu_us"] = spread(
            [c / steps * 1e6 for c in writer_cpu[threads]]
        )
        hog_extra = [
            (s - b) / steps * 1e6 for s, b in zip(times[("hog", threads)], base, strict=True)
        ]
        out[f"t{threads}_busy_core_extra_us"] = spread(hog_extra)
        out[f"t{threads}_busy_core_cpu_us"] = spread([c / steps * 1e6 for c in hog_cpu[threads]])
        for name in ("process", "thread"):
            ratios = [
                (s - b) / (o - b) if o > b else float("nan")
                for s, o, b in zip(
                    times[(name, threads)], times[("otel", threads)], base, strict=True
                )
            ]
            out[f"t{threads}_{name}_over_otel"] = spread(
                [x for x in ratios if x == x] or [float("nan")]
            )
        out[f"t{threads}_process_over_otel_of_medians"] = statistics.median(
            out[f"t{threads}_process_extra_us"] and [out[f"t{threads}_process_extra_us"]["median"]]
        ) / max(out[f"t{threads}_otel_extra_us"]["median"], 1e-9)
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        f"{r['rounds']} rounds x {r['steps_per_block']} steps of ~{r['work_us']:.0f} µs work + one "
        f"~1 KB tool call; extra µs per step over no recording (flush included), median (min-max)",
        f"Hindsight() {r['construct_ms']:.0f} ms; first flush (writer process start) "
        f"{r['writer_start_first_flush_ms']:.0f} ms; redaction guards: "
        f"{r.get('redact_guards', 'python')}",
    ]
    if r.get("agent_pinned_to_cpus"):
        lines.append(f"the agent's process pinned to CPU {r['agent_pinned_to_cpus']}")
    for t in (1, 4):
        lines.append(f"{t} agent thread(s): step alone {r[f't{t}_none_step_us']['median']:.1f} µs")
        for name in ("process", "thread", "otel"):
            e = r[f"t{t}_{name}_extra_us"]
            c = r.get(f"t{t}_{name}_agent_cpu_us")
            lines.append(
                f"  {name:8s} +{e['median']:6.1f} µs ({e['min']:.1f}-{e['max']:.1f})"
                + (f"; agent process CPU +{c['median']:.1f} µs" if c else "")
            )
        w = r.get(f"t{t}_writer_process_cpu_us")
        if w:
            lines.append(f"  writer process CPU {w['median']:.1f} µs per step")
        h = r.get(f"t{t}_busy_core_extra_us")
        if h:
            hc = r[f"t{t}_busy_core_cpu_us"]["median"]
            per = h["median"] / hc if hc > 0 else float("nan")
            lines.append(
                f"  no recording, a spinning process on the other core: +{h['median']:.1f} µs "
                f"({h['min']:.1f}-{h['max']:.1f}) for its {hc:.1f} µs of CPU per step: "
                f"{per:.2f} µs per µs of work beside the agent"
                + (f" (x the writer's CPU: {per * w['median']:.1f} µs)" if w else "")
            )
        lines.append(
            f"  writer process / OTel span: x{r[f't{t}_process_over_otel_of_medians']:.2f} "
            f"(per block x{r[f't{t}_process_over_otel']['median']:.2f}); writer thread / OTel "
            f"x{r[f't{t}_thread_over_otel']['median']:.2f}"
        )
    lines.append(
        f"writer process: {r['process_rows_stored']:,} rows stored, lost {r['process_lost']}"
    )
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=2000, help="steps per timed block")
    p.add_argument(
        "--pin-agent",
        metavar="CPUS",
        help="pin the agent's process to these CPUs first (Linux; e.g. 0 or 0-2,5)",
    )


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
