"""Caller-side cost of recording one tool call, against an OpenTelemetry span, interleaved.

Recording sits on the agent's hot path, so what counts is the time the agent's own thread spends
in the call. Subjects, each an ``action_executed`` with ~1 KB of input and result (1,000
distinct payloads, cycled):

- ``record_action``: ``TaskRun.record_action(tool, args, output=..., step=...)``, the cheapest
  per-event call of the facade;
- ``hs.record``: the wire-format path, ``hs.record({...})``, building the event dict included.

Beside them, ``serialize_only``: the same payload dict built, serialized (orjson) with the
line's fields and copied into a page, with no Hindsight: the floor of the writer process's call,
timed block by block with the others (so from the same state of the caches).

Each with the writer process (``writer="process"``, the default where one can start: the call
serializes the event; the rest happens in another process) and with the writer thread in the
agent's process (``writer="thread"``).

Baseline: an OpenTelemetry SDK span with 5 attributes (tool name, arguments and result as JSON
strings, status, step; the strings prepared beforehand, which favours OpenTelemetry) through a
``BatchSpanProcessor`` with an exporter that drops everything, the attributes dict built in the
timed region as for the subjects. Hindsight's writer thread (sanitizing, redacting and writing
to SQLite), its writer process's overflow thread (when the ring is full) and OpenTelemetry's export thread all run during
the measurement.

Each run times every call with ``perf_counter_ns`` (its own ~50-100 ns included, reported as
"timer") in blocks of 1,000 calls, the subjects and the baseline taking turns block by block, in
a rotating order. The garbage collector is left on, as in an agent: its pauses are part of p99.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from _common import (  # noqa: E402
    action_pool,
    cli,
    otel_tool_span,
    otel_tracer,
    percentile,
    spread,
    timer_floor_ns,
)

BLOCK = 1000


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hindsight_loop import Hindsight

    runs = 3 if args.quick else max(5, args.runs)
    blocks = 8 if args.quick else args.blocks
    pool, strings = action_pool(6)
    body_bytes = [
        len(
            orjson.dumps(
                {"input": {"tool": t, "args": a}, "result": {"status": "succeeded", "output": o}}
            )
        )
        for t, a, o, _s in pool
    ]

    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-"))
    instances = {
        mode: Hindsight(tmp / f"{mode}.db", background=False, triggers=False, writer=mode)
        for mode in ("thread", "process")
    }
    provider, tracer = otel_tracer()
    tasks = {
        mode: h.task(
            "bench", goal="measure recording", tools=list({p[0] for p in pool}), recall=False
        ).__enter__()
        for mode, h in instances.items()
    }
    import time

    pc = time.perf_counter_ns

    def make_record_action(mode: str) -> Any:
        task = tasks[mode]

        def record_action(samples: list[int], start: int) -> None:
            for i in range(start, start + BLOCK):
                tool, a, o, step = pool[i % 1000]
                t0 = pc()
                task.record_action(tool, a, output=o, step=step)
                samples.append(pc() - t0)

        return record_action

    def make_wire_record(mode: str) -> Any:
        hs, tid = instances[mode], tasks[mode].task_id

        def wire_record(samples: list[int], start: int) -> None:
            for i in range(start, start + BLOCK):
                tool, a, o, step = pool[i % 1000]
                t0 = pc()
                hs.record(
                    {
                        "type": "action_executed",
                        "task_id": tid,
                        "input": {"tool": tool, "args": a},
                        "result": {"status": "succeeded", "output": o},
                        "agent_state": {"current_step": step},
                    }
                )
                samples.append(pc() - t0)

        return wire_record

    def otel_span(samples: list[int], start: int) -> None:
        for i in range(start, start + BLOCK):
            tool, _a, _o, step = pool[i % 1000]
            a_json, o_json = strings[i % 1000]
            t0 = pc()
            otel_tool_span(tracer, tool, a_json, o_json, step)
            samples.append(pc() - t0)

    page = bytearray(1 << 16)
    view = memoryview(page)
    opt = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE

    def serialize_only(samples: list[int], start: int) -> None:
        """What the process writer's call cannot do without: the payload dict built (as
        ``record_action`` builds it), serialized with the line's fields and copied into a page;
        no Hindsight involved. Its floor on this machine, from the same memory state."""
        used = 0
        for i in range(start, start + BLOCK):
            tool, a, o, step = pool[i % 1000]
            t0 = pc()
            payload = {
                "input": {"tool": tool, "args": a},
                "result": {"status": "succeeded", "output": o},
                "agent_state": {"current_step": step},
            }
            line = orjson.dumps(
                ("tsk_x", i, None, time.time_ns(), "action_executed", None, payload), option=opt
            )
            n = len(line)
            if used + n > len(page):
                used = 0
            view[used : used + n] = line
            used += n
            samples.append(pc() - t0)

    subjects = {
        "record_action": make_record_action("thread"),
        "hs.record": make_wire_record("thread"),
        "record_action/process": make_record_action("process"),
        "hs.record/process": make_wire_record("process"),
        "otel_span": otel_span,
        "serialize_only": serialize_only,
    }
    names = list(subjects)
    # Warm up every path (imports, caches, the writer's first batches, the writer process).
    for fn in subjects.values():
        fn([], 0)
    for h in instances.values():
        h.flush()

    # Page faults on the agent's thread per call: memory handed back to the system and faulted
    # in again is part of a call's cost (and of its p99) that per-call timers hide in noise.
    by_thread = getattr(resource, "RUSAGE_THREAD", None)
    faults = {n: 0 for n in names}
    per_run: list[dict[str, dict[str, float]]] = []
    backlog_max = 0
    for r in range(runs):
        samples: dict[str, list[int]] = {n: [] for n in names}
        for b in range(blocks):
            k = b % len(names)
            order = names[k:] + names[:k]  # rotate who goes first
            for n in order:
                f0 = resource.getrusage(by_thread).ru_minflt if by_thread is not None else 0
                subjects[n](samples[n], (r * blocks + b) * BLOCK)
                if by_thread is not None:
                    faults[n] += resource.getrusage(by_thread).ru_minflt - f0
            backlog_max = max(backlog_max, *(h.recorder.backlog for h in instances.values()))
        stats = {}
        for n, s in samples.items():
            s.sort()
            stats[n] = {
                "p50": percentile(s, 50),
                "p99": percentile(s, 99),
                "p999": percentile(s, 99.9),
            }
        per_run.append(stats)
        for h in instances.values():
            h.flush()  # between runs, untimed: each run starts with the writer caught up

    recorded = min(h.store.event_count(tasks[m].task_id) for m, h in instances.items())
    expected = 2 * (runs * blocks + 1) * BLOCK + 1
    for mode, h in instances.items():
        tasks[mode].__exit__(None, None, None)
        h.close()
    provider.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)

    out: dict[str, Any] = {
        "bench": "record_cost",
        "runs": runs,
        "calls_per_run": blocks * BLOCK,
        "timer_ns": timer_floor_ns(),
        "avg_body_bytes": sum(body_bytes) / 1000,
        "recorded": recorded,
        "expected": expected,
        "max_queue_seen": backlog_max,
    }
    for n in names:
        for q in ("p50", "p99", "p999"):
            out[f"{n}_{q}_ns"] = spread([s[n][q] for s in per_run])
    calls = runs * blocks * BLOCK
    for n in names:
        out[f"{n}_faults_per_1k_calls"] = (
            1000 * faults[n] / calls if by_thread is not None else None
        )
    for n in ("record_action", "hs.record", "record_action/process", "hs.record/process"):
        out[f"otel_over_{n}_p50"] = spread([s["otel_span"]["p50"] / s[n]["p50"] for s in per_run])
        out[f"otel_over_{n}_p99"] = spread([s["otel_span"]["p99"] / s[n]["p99"] for s in per_run])
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        f"{r['runs']} runs x {r['calls_per_run']} calls per subject; ns per call, "
        f"median (min-max) over runs; timer {r['timer_ns']} ns included; "
        f"~{r['avg_body_bytes']:.0f} B per event"
    ]
    for n in (
        "record_action",
        "hs.record",
        "record_action/process",
        "hs.record/process",
        "otel_span",
        "serialize_only",
    ):
        p50, p99 = r[f"{n}_p50_ns"], r[f"{n}_p99_ns"]
        lines.append(
            f"{n:22s} p50 {p50['median']:7.0f} ({p50['min']:.0f}-{p50['max']:.0f})  "
            f"p99 {p99['median']:7.0f} ({p99['min']:.0f}-{p99['max']:.0f})"
            + (
                f"  page faults {faults:.1f} per 1,000 calls"
                if (faults := r.get(f"{n}_faults_per_1k_calls")) is not None
                else ""
            )
        )
    for n in ("record_action", "hs.record", "record_action/process", "hs.record/process"):
        lines.append(
            f"OTel span / {n}: p50 x{r[f'otel_over_{n}_p50']['median']:.1f}, "
            f"p99 x{r[f'otel_over_{n}_p99']['median']:.1f}"
        )
    lines.append(f"events stored (each writer) {r['recorded']} of {r['expected']}")
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--blocks", type=int, default=40, help="blocks of 1,000 calls per run")


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
