"""Does recording on the agent's thread slow down while a reflection is in flight?

Issue 3 promises that an LLM reflection never slows the agent beyond its own calls. This measures
the caller-side cost of ``task.record_action`` (an ``action_executed`` with ~1 KB of input and
result) in three conditions, interleaved block by block in one process:

- idle: no review queued or running;
- waiting: an LLM reflection is in flight, its HTTP request waiting on the model (a local fake
  OpenAI-compatible server answering after 300 ms);
- streaming: the review worker is busy end to end (the model answers at once, so the worker
  parses, curates and embeds lesson after lesson while the agent records).

Prints medians and p99 per condition and the ratios against idle. Usage:

    python bench/reflection_inflight.py [--blocks 15] [--calls 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hindsight_loop import Hindsight
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.llm.reflector import LLMReflector, RetryPolicy
from hindsight_loop.testing.llm_server import LLMServer, answer

LESSON = {
    "task_goal": "clean the export",
    "execution_path": "read_csv failed, then gbk worked",
    "lesson": {
        "advice": "You should read the ERP export with encoding='gbk'.",
        "root_cause": "The ERP writes GBK, not UTF-8.",
        "suggestions": ["Use gbk for erp_cn", "Validate after reading", "Do not retry utf-8"],
        "general_rule": "Know a source's encoding before parsing it.",
        "tools": ["read_csv"],
        "error_type": "UnicodeDecodeError",
        "keywords": ["gbk", "encoding"],
    },
}
ARGS = {"path": "/data/raw/sales_2024.csv", "encoding": "utf-8", "note": "x" * 400}
OUTPUT = {"rows": 1200, "columns": ["date", "store", "amount"], "preview": "y" * 400}


def failed_task(hs: Hindsight, n: int) -> None:
    with hs.task("csv_cleaning", goal=f"clean export {n}", tools=["read_csv"], recall=False) as t:
        t.record_action(
            "read_csv",
            {"encoding": "utf-8"},
            status="failed",
            error_type="UnicodeDecodeError",
            error_message="bad byte",
        )
        t.fail("could not read")


def block(task, calls: int) -> list[int]:
    times = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        task.record_action("read_csv", ARGS, output=OUTPUT, step="parse")
        times.append(clock() - t0)
    return times


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()

    results: dict[str, list[list[int]]] = {"idle": [], "waiting": [], "streaming": []}
    with tempfile.TemporaryDirectory() as tmp, LLMServer([]) as server:
        llm = OpenAILLM("bench-model", base_url=server.openai_base_url, api_key="k", timeout=10)
        reflector = LLMReflector(llm, retry=RetryPolicy(attempts=1), owns_llm=True)
        hs = Hindsight(Path(tmp) / "bench.db", reflector=reflector, background=True, triggers=False)
        try:
            with hs.task("agent", goal="the agent's own task", recall=False) as agent:
                block(agent, 500)  # warm up
                for i in range(opts.blocks):
                    # idle: nothing queued
                    hs.drain()
                    results["idle"].append(block(agent, opts.calls))
                    # waiting: one reflection waiting on a slow model
                    before = len(server.requests)
                    server.add(answer(LESSON, delay=0.3))
                    failed_task(hs, 2 * i)
                    deadline = time.monotonic() + 5
                    while len(server.requests) == before and time.monotonic() < deadline:
                        time.sleep(0.001)
                    results["waiting"].append(block(agent, opts.calls))
                    hs.drain()
                    # streaming: the worker reviews one task after another, fast answers
                    server.add(*[answer(LESSON) for _ in range(20)])
                    for k in range(20):
                        failed_task(hs, 1000 * (i + 1) + k)
                    hs.flush()
                    time.sleep(0.01)
                    results["streaming"].append(block(agent, opts.calls))
                    hs.drain()
        finally:
            hs.close()

    summary = {}
    for name, blocks in results.items():
        p50s = [pct(b, 0.5) for b in blocks]
        p99s = [pct(b, 0.99) for b in blocks]
        summary[name] = {
            "p50_ns": statistics.median(p50s),
            "p99_ns": statistics.median(p99s),
            "p50_spread_ns": [min(p50s), max(p50s)],
        }
    for name in ("waiting", "streaming"):
        summary[name]["p50_ratio_vs_idle"] = summary[name]["p50_ns"] / summary["idle"]["p50_ns"]
        summary[name]["p99_ratio_vs_idle"] = summary[name]["p99_ns"] / summary["idle"]["p99_ns"]
    if opts.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return
    print(
        f"record_action cost on the agent's thread, {opts.blocks} interleaved blocks of {opts.calls} calls"
    )
    print(f"{'condition':<11} {'p50 ns':>8} {'p99 ns':>8} {'p50 x idle':>11} {'p99 x idle':>11}")
    for name, s in summary.items():
        r50 = s.get("p50_ratio_vs_idle", 1.0)
        r99 = s.get("p99_ratio_vs_idle", 1.0)
        print(f"{name:<11} {s['p50_ns']:>8.0f} {s['p99_ns']:>8.0f} {r50:>11.2f} {r99:>11.2f}")


if __name__ == "__main__":
    main()
