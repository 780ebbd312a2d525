"""What every benchmark here shares: the machine line, run statistics, realistic events, the CLI.

Each benchmark measures its subject beside a baseline in the same process, interleaved, over at
least five runs, and prints one JSON object with ``--json`` so ``bench/run.py`` can build the
table. This machine's speed drifts by 15-50% within minutes: ratios between a subject and its
baseline measured side by side are the numbers to trust, absolute figures only roughly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and software versions, for the head of BENCHMARKS.md."""
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cores": cores,
        "memory_gb": round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def redact_guards() -> str:
    """How the recorder's redaction guards run here: ``hyperscan`` (the extra) or ``python``."""
    from hindsight_loop import record

    return record.guards_in_use()


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range over runs (each value is one run's figure)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile of already sorted values (nearest rank)."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def rss_bytes() -> int:
    """Resident memory of this process now (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (VmHWM: ru_maxrss survives exec on Linux,
    so a child started by a big parent would report the parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timer_floor_ns(n: int = 20_000) -> int:
    """Median cost of one pair of ``perf_counter_ns`` calls: included in every per-call figure."""
    pc = time.perf_counter_ns
    samples = []
    for _ in range(n):
        a = pc()
        b = pc()
        samples.append(b - a)
    samples.sort()
    return samples[len(samples) // 2]


# -- realistic events -------------------------------------------------------------------------

_WORDS = [
    "the",
    "file",
    "sales",
    "report",
    "quarter",
    "revenue",
    "rows",
    "column",
    "encoding",
    "parse",
    "clean",
    "header",
    "value",
    "customer",
    "order",
    "region",
    "north",
    "south",
    "total",
    "missing",
    "date",
    "format",
    "error",
    "retry",
    "user",
    "asked",
    "agent",
    "tool",
    "result",
    "output",
    "table",
    "merge",
    "duplicate",
    "invoice",
    "amount",
    "currency",
    "summary",
    "check",
    "销售",
    "报表",
    "文件",
    "编码",
    "客户",
    "订单",
    "日期",
    "格式",
    "错误",
    "重试",
]
TOOLS = ("read_csv", "clean_rows", "write_parquet", "search_docs", "sql_query", "http_get")
STEPS = ("load", "parse", "clean", "validate", "export")


def text(rng: random.Random, n_chars: int) -> str:
    """Agent-like prose of about ``n_chars`` characters (English with some Chinese)."""
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(_WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def action_payload(rng: random.Random, size: int = 1000) -> tuple[str, dict, dict, str]:
    """(tool, args, output, step) of an ``action_executed`` whose input + result is ~``size`` B."""
    tool = rng.choice(TOOLS)
    args = {
        "path": f"/data/raw/sales_{rng.randint(2019, 2025)}_{rng.randint(1, 999)}.csv",
        "encoding": rng.choice(("utf-8", "utf-8-sig", "gbk")),
        "query": text(rng, size * 3 // 10),
    }
    output = {
        "rows": rng.randint(0, 100_000),
        "columns": ["date", "region", "amount", "currency"],
        "preview": text(rng, size * 5 // 10),
    }
    return tool, args, output, rng.choice(STEPS)


def action_pool(
    seed: int, n: int = 1000
) -> tuple[list[tuple[str, dict, dict, str]], list[tuple[str, str]]]:
    """``n`` distinct ~1 KB tool calls (``action_payload``) and, for OpenTelemetry, each one's
    arguments and result as JSON strings prepared beforehand (which favours OpenTelemetry)."""
    import orjson

    rng = random.Random(seed)
    pool = [action_payload(rng) for _ in range(n)]
    strings = [(orjson.dumps(a).decode(), orjson.dumps(o).decode()) for _t, a, o, _s in pool]
    return pool, strings


# -- the OpenTelemetry baseline ---------------------------------------------------------------


def otel_tracer() -> tuple[Any, Any]:
    """(provider, tracer): the OpenTelemetry SDK with a ``BatchSpanProcessor`` and an exporter
    that drops everything (the cheapest honest tracer: its export thread runs, nothing is sent).
    ``provider.force_flush()`` waits for the export thread; ``provider.shutdown()`` ends it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DropExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    return provider, provider.get_tracer("hindsight-bench")


def otel_tool_span(tracer: Any, tool: str, args_json: str, result_json: str, step: str) -> None:
    """One tool call as a span with 5 attributes (the GenAI names), built in the call as the
    subjects build their events."""
    with tracer.start_as_current_span(
        tool,
        attributes={
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.arguments": args_json,
            "gen_ai.tool.call.result": result_json,
            "tool.status": "succeeded",
            "agent.step": step,
        },
    ):
        pass


def mixed_events(rng: random.Random, task_id: str, n: int) -> list[dict[str, Any]]:
    """A trajectory's events in the wire format: mostly tool calls, some decisions and input.

    The mix (per 10 events: 4 tool calls of ~1 KB, 3 decisions, 1 user input, 1 state change,
    1 feedback) averages about 500 bytes of body per event.
    """
    events: list[dict[str, Any]] = []
    for i in range(n):
        k = i % 10
        if k in (0, 2, 5, 7):
            tool, args, output, step = action_payload(rng)
            failed = rng.random() < 0.1
            result: dict[str, Any] = {"status": "failed" if failed else "succeeded"}
            if failed:
                result |= {"error_type": "EncodingError", "error_message": text(rng, 80)}
            else:
                result["output"] = output
            ev = {
                "type": "action_executed",
                "input": {"tool": tool, "args": args},
                "result": result,
                "agent_state": {"current_step": step},
            }
        elif k in (1, 4, 8):
            ev = {
                "type": "llm_decision",
                "agent_state": {"current_step": rng.choice(STEPS)},
                "decision": {
                    "chosen_action": rng.choice(TOOLS),
                    "alternatives": list(rng.sample(TOOLS, 2)),
                    "confidence": round(rng.random(), 2),
                    "reasoning": text(rng, 120),
                },
            }
        elif k == 3:
            ev = {"type": "user_input", "input": {"text": text(rng, 150)}}
        elif k == 6:
            ev = {
                "type": "state_change",
                "agent_state": {"current_step": rng.choice(STEPS), "context_count": i},
            }
        else:
            ev = {
                "type": "feedback",
                "input": {"text": text(rng, 60), "score": rng.choice((-1, 0, 1))},
            }
        ev["task_id"] = task_id
        events.append(ev)
    return events


# -- command line -----------------------------------------------------------------------------


def cli(
    doc: str,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """``--quick`` for a short run, ``--json`` for the runner; otherwise a readable summary."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs (smoke test)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(render(result))
