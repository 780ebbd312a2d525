"""Lessons from real agent runs: τ-bench's 200 GPT-4o airline trajectories.

The runs (``historical_trajectories/gpt-4o-airline.json`` of sierra-research/tau-bench, 50 tasks
x 4 trials; pass ``--data``) are mapped from OpenAI messages (``real_runs_data.load_tau``) and split by task index with a fixed
seed (no task in both halves). The training half goes the way a user's runs go: imported with
``hs.import_transcript`` and reviewed by ``hs.drain()`` (each run's offline review, then the batch
review of what recurs across runs), into a real store. Baseline, on the same training runs: the
per-run ``OfflineReflector`` of before, unfiltered, into a second store. On the test half:

(a) lessons carrying a one-run identifier (a token with digits that occurs in exactly one
    training run) or a repr dump (``{'``, ``[{``, ``=[`` …), share of the book;
(b) test runs whose first tool error was anticipated: just before that call,
    ``hs.recall(task_type, tools=[that tool], query=<the user's first message>)`` returns a
    lesson whose error template is that error's; over the runs whose error pattern was seen in
    training (and over all runs with an error);
(c) lessons returned on test runs with no tool error: the same recall before each tool's first
    call, distinct lessons per run (and one recall at the start with every tool the run used);
(d) seconds to import all 200 runs and review them offline (the same path, another store);
(e) what an LLM reviewer would be sent for one run (``render_chronicle``): tokens (chars / 4),
    and whether the error message, the user's request and an agent reply are in it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli  # noqa: E402

TASK_TYPE = "airline_support"
DEFAULT_DATA = "/tmp/tau/gpt-4o-airline.json"
_IDENT = re.compile(r"[A-Za-z0-9_\-]*\d[A-Za-z0-9_\-]*")
#: A Python or JSON structure pasted into text: a dict or list literal.
_REPR = re.compile(r"\{'|\[\{|\{\"|=\[|=\{|': ")


def _load(path: str) -> list[dict[str, Any]]:
    """The runs as ``{task_index, task_id, goal, events}``, via the transcript import."""
    try:  # the benchmark's own loader when it is there
        from real_runs_data import load_tau, task_index  # type: ignore[import-not-found]

        return [
            {
                "task_index": task_index(r),
                "task_id": r.task_id,
                "events": r.events,
            }
            for r in load_tau(path)
        ]
    except ImportError:
        pass
    from hindsight_loop.ingest.openai import openai_events
    from hindsight_loop.ingest.wire import Overrides

    out = []
    for raw in json.loads(Path(path).read_text()):
        index = raw["task_id"]
        run = {
            "messages": raw["traj"],
            "task_id": f"tau_{index}_{raw.get('trial', 0)}",
            "reward": raw.get("reward"),
            "goal": (raw.get("info") or {}).get("task", {}).get("instruction"),
            "metadata": {"task_index": index, "trial": raw.get("trial")},
        }
        task_id, events = openai_events(run, Overrides(task_type=TASK_TYPE))
        out.append({"task_index": index, "task_id": task_id, "events": events})
    return out


def _first_user(events: list[dict[str, Any]]) -> str:
    for ev in events:
        if ev.get("type") == "user_input":
            return str((ev.get("input") or {}).get("text") or "")
    return ""


def _calls(events: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """``(tool, failed, error message)`` of each tool call, in order."""
    from hindsight_loop.models import is_failure

    out = []
    for ev in events:
        if ev.get("type") != "action_executed":
            continue
        tool = (ev.get("input") or {}).get("tool")
        result = ev.get("result") or {}
        if isinstance(tool, str):
            failed = is_failure(result.get("status"))
            out.append((tool, failed, str(result.get("error_message") or "")))
    return out


def _with_messages(chronicle: Any, events: list[dict[str, Any]]) -> Any:
    """Give each failed step its full error message when the chronicle's steps lack one."""
    from hindsight_loop.models import Step

    if "error_message" in getattr(Step, "__dataclass_fields__", {}):
        return chronicle
    by_id = {ev.get("event_id"): ev for ev in events}
    for step in chronicle.steps:
        ev = by_id.get(step.event_id) or {}
        message = (ev.get("result") or {}).get("error_message")
        if message and step.output is None:
            step.output = message
    return chronicle


def _lesson_text(lesson: Any) -> str:
    parts = [lesson.advice, lesson.root_cause, lesson.general_rule, *lesson.suggestions]
    parts += lesson.features.keywords
    if lesson.structured is not None:
        parts.append(json.dumps(lesson.structured.to_dict(), ensure_ascii=False))
    return "\n".join(parts)


def _dirty(lessons: list[Any], one_run: set[str]) -> tuple[int, int]:
    ident = sum(bool(set(_IDENT.findall(_lesson_text(x))) & one_run) for x in lessons)
    dumps = sum(bool(_REPR.search(x.advice)) for x in lessons)
    return ident, dumps


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = args.data
    if not Path(path).exists():
        return {"bench": "real_runs", "skipped": f"no data at {path} (see --help)"}
    from hindsight_loop import Hindsight
    from hindsight_loop.llm.templates import render_chronicle
    from hindsight_loop.reflect import OfflineReflector
    from hindsight_loop.text import error_template

    runs = _load(path)
    tasks = sorted({r["task_index"] for r in runs})
    random.Random(args.seed).shuffle(tasks)
    train_tasks = set(tasks[: len(tasks) // 2])
    train = [r for r in runs if r["task_index"] in train_tasks]
    test = [r for r in runs if r["task_index"] not in train_tasks]

    tmp = Path(tempfile.mkdtemp(prefix="hs-real-"))
    try:
        # (d) the whole product path on all 200 runs: import as a user would, then every queued
        # review (each run's own offline review, then the batch review of what recurs).
        every = Hindsight(tmp / "all.db", background=False)
        t0 = time.perf_counter()
        every.import_transcript([ev for r in runs for ev in r["events"]], format="wire")
        import_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        every.drain()
        review_s = time.perf_counter() - t0
        every.close()

        # The same path on the training half only: the book the test half is recalled from.
        hs = Hindsight(tmp / "real.db", background=False)
        hs.import_transcript([ev for r in train for ev in r["events"]], format="wire")
        hs.drain()
        book = [x for x in hs.lessons(status="active")]
        chronicles = [_with_messages(hs.replay(r["task_id"]), r["events"]) for r in train]

        # Baseline on the same runs: the per-run reflector, into its own store.
        base = Hindsight(tmp / "base.db", background=False, triggers=False)
        for c in chronicles:
            for d in OfflineReflector().drafts(c):
                base.add_lesson(d)
        base_book = [x for x in base.store.list_lessons() if x.status == "active"]

        # (a) one-run identifiers: digit tokens of exactly one training run.
        seen: Counter[str] = Counter()
        for r in train:
            seen.update(set(_IDENT.findall(json.dumps(r["events"], ensure_ascii=False))))
        one_run = {t for t, n in seen.items() if n == 1}
        ident, dumps = _dirty(book, one_run)
        b_ident, b_dumps = _dirty(base_book, one_run)
        # Stricter: the four trials of a task share its ids; a token of one task is as bad.
        by_task: dict[str, set[Any]] = {}
        for r in train:
            for tok in set(_IDENT.findall(json.dumps(r["events"], ensure_ascii=False))):
                by_task.setdefault(tok, set()).add(r["task_index"])
        one_task = {t for t, owners in by_task.items() if len(owners) == 1}
        task_ident, _ = _dirty(book, one_task)
        b_task_ident, _ = _dirty(base_book, one_task)

        # (b) anticipation, (c) quiet on runs without error.
        known = {
            (x.structured.when.get("tool"), x.structured.when.get("error_template"))
            for x in book
            if x.structured is not None
        }

        def recall(tool: list[str], query: str) -> list[Any]:
            return list(hs.recall(task_type=TASK_TYPE, tools=tool, query=query))

        anticipated = seen_pattern = with_error = 0
        quiet_per_call: list[int] = []
        quiet_start: list[int] = []
        for r in test:
            calls = _calls(r["events"])
            first = _first_user(r["events"])
            failure = next(((t, m) for t, f, m in calls if f), None)
            if failure is not None:
                with_error += 1
                tool, message = failure
                template = error_template(message)
                found = recall([tool], first)
                hit = any(
                    x.structured is not None and x.structured.when.get("error_template") == template
                    for x in found
                )
                anticipated += hit
                seen_pattern += (tool, template) in known
                continue
            tools = list(dict.fromkeys(t for t, _, _ in calls))
            ids: set[str] = set()
            for tool in tools:
                ids.update(x.lesson_id for x in recall([tool], first))
            quiet_per_call.append(len(ids))
            quiet_start.append(len(recall(tools, first)) if tools else 0)
        anticipated_seen = 0
        for r in test:
            calls = _calls(r["events"])
            failure = next(((t, m) for t, f, m in calls if f), None)
            if failure is None or (failure[0], error_template(failure[1])) not in known:
                continue
            found = recall([failure[0]], _first_user(r["events"]))
            anticipated_seen += any(
                x.structured is not None
                and x.structured.when.get("error_template") == error_template(failure[1])
                for x in found
            )

        # (e) what an LLM reviewer is sent for one run with an error.
        sample = next((r for r in train if any(f for _, f, _ in _calls(r["events"]))), train[0])
        text = render_chronicle(hs.replay(sample["task_id"]))
        messages = [m for _, f, m in _calls(sample["events"]) if f]
        replies = [
            str((ev.get("decision") or {}).get("message") or "")
            for ev in sample["events"]
            if ev.get("type") == "llm_decision"
        ]
        replies = [x for x in replies if len(x) > 20]
        first = _first_user(sample["events"])
        hs.close()
        base.close()
        return {
            "bench": "real_runs",
            "runs": len(runs),
            "train_runs": len(train),
            "test_runs": len(test),
            "lessons": len(book),
            "a_one_run_identifier_share": round(ident / max(len(book), 1), 3),
            "a_repr_dump_share": round(dumps / max(len(book), 1), 3),
            "a_one_task_identifier_share": round(task_ident / max(len(book), 1), 3),
            "a_baseline_one_task_identifier_share": round(b_task_ident / max(len(base_book), 1), 3),
            "a_baseline_lessons": len(base_book),
            "a_baseline_identifier_share": round(b_ident / max(len(base_book), 1), 3),
            "a_baseline_repr_share": round(b_dumps / max(len(base_book), 1), 3),
            "b_test_runs_with_error": with_error,
            "b_seen_pattern_runs": seen_pattern,
            "b_anticipated_seen": anticipated_seen,
            "b_anticipated_seen_share": round(anticipated_seen / max(seen_pattern, 1), 3),
            "b_anticipated_all_share": round(anticipated / max(with_error, 1), 3),
            "c_runs_without_error": len(quiet_per_call),
            "c_lessons_per_run_before_each_tool": round(
                sum(quiet_per_call) / max(len(quiet_per_call), 1), 2
            ),
            "c_lessons_per_run_at_start": round(sum(quiet_start) / max(len(quiet_start), 1), 2),
            "d_import_s": round(import_s, 2),
            "d_review_s": round(review_s, 2),
            "d_import_and_review_s": round(import_s + review_s, 2),
            "e_tokens": len(text) // 4,
            "e_has_error_message": bool(messages) and all(m[:60] in text for m in messages),
            "e_has_user_request": bool(first) and first[:60] in text,
            "e_has_agent_reply": bool(replies) and any(x[:60] in text for x in replies),
            "sample_lessons": [x.advice for x in book[:4]],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    rows = [
        (
            "lessons (Hindsight / per-run reflector of before)",
            f"{r['lessons']} / {r['a_baseline_lessons']}",
        ),
        (
            "(a) one-run identifier share (target 0)",
            f"{r['a_one_run_identifier_share']:.0%} (baseline {r['a_baseline_identifier_share']:.0%})",
        ),
        (
            "(a) one-task identifier share",
            f"{r['a_one_task_identifier_share']:.0%} "
            f"(baseline {r['a_baseline_one_task_identifier_share']:.0%})",
        ),
        (
            "(a) repr dump share (target 0)",
            f"{r['a_repr_dump_share']:.0%} (baseline {r['a_baseline_repr_share']:.0%})",
        ),
        (
            "(b) first error anticipated, seen patterns (>= 60%)",
            f"{r['b_anticipated_seen_share']:.0%} of {r['b_seen_pattern_runs']}",
        ),
        (
            "(b) first error anticipated, all runs with error",
            f"{r['b_anticipated_all_share']:.0%} of {r['b_test_runs_with_error']}",
        ),
        (
            "(c) lessons per error-free run, before each tool (<= 1)",
            f"{r['c_lessons_per_run_before_each_tool']} over {r['c_runs_without_error']} runs",
        ),
        ("(c) lessons per error-free run, at start", f"{r['c_lessons_per_run_at_start']}"),
        (
            "(d) import 200 runs + review them offline, s (< 30)",
            f"{r['d_import_and_review_s']} ({r['d_import_s']} + {r['d_review_s']})",
        ),
        (
            "(e) reviewer prompt: tokens / error / request / reply",
            f"{r['e_tokens']} / {r['e_has_error_message']} / {r['e_has_user_request']} / "
            f"{r['e_has_agent_reply']}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += ["", "sample lessons:"] + [f"- {x}" for x in r["sample_lessons"]]
    return "\n".join(lines)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=DEFAULT_DATA, help="gpt-4o-airline.json of tau-bench")
    p.add_argument("--seed", type=int, default=10)


if __name__ == "__main__":
    cli(__doc__ or "", run, render, _extra)
