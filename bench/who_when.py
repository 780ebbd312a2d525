"""Failure attribution on Who&When (Algorithm-Generated): which agent, which step.

The 126 AG2 group-chat logs of ``Who&When/Algorithm-Generated`` (ag2ai/Agents_Failure_Attribution;
every run failed, and each names its ``mistake_agent`` and ``mistake_step``) are imported with
the library's own ``ag2`` mapping (``ingest.runs_from``), replayed, and attributed with
``attribute.attribute``. A log's ``mistake_step`` is its index in ``history``: the importer keeps
one event per message, so that is the event's ``seq - 1``. The labels are removed by the importer
and never reach the method.

Printed beside the two baselines of the Who&When paper, computed here on the same logs: the
most active agent (most messages, the code executor not counted; ties to the earliest speaker)
and the first agent to speak. Agent-level accuracy is the share of logs whose agent is right,
step-level the share whose step is exactly right (a baseline's step is its agent's first
message). The offline rules were designed by reading
logs 1-63; "held out" is logs 64-126.

With ``HINDSIGHT_LLM_PROVIDER`` / ``HINDSIGHT_LLM_MODEL`` / ``HINDSIGHT_LLM_BASE_URL`` set (see
``hindsight_loop.llm``), or ``--base-url``/``--model``, the LLM path runs too (``--llm-method``
``all_at_once`` or ``binary_search``) and reports both accuracies and the tokens per log.

Data (not in this repository)::

    fetch github:ag2ai/Agents_Failure_Attribution  (or git clone it), then
    git --git-dir=<repo>/.git ls-tree -r HEAD --name-only | grep '^Who&When/Algorithm-Generated/' |
      while read p; do git --git-dir=<repo>/.git show "HEAD:$p" > /tmp/whowhen/$(basename "$p"); done
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cli  # noqa: E402

DEFAULT_DATA = "/tmp/whowhen"
EXECUTOR = "Computer_terminal"


def load(data: str) -> list[tuple[int, dict[str, Any]]]:
    """The logs as (number, log), in the number order of their file names."""
    files = sorted(Path(data).glob("*.json"), key=lambda p: (len(p.stem), p.stem))
    return [
        (int(p.stem) if p.stem.isdigit() else i, json.loads(p.read_text()))
        for i, p in enumerate(files, 1)
    ]


def most_active(log: dict[str, Any]) -> str | None:
    names = [m.get("name") for m in log["history"] if m.get("name") not in (None, EXECUTOR)]
    if not names:
        return None
    counts = Counter(names)
    top = max(counts.values())
    return next(n for n in names if counts[n] == top)


def first_speaker(log: dict[str, Any]) -> str | None:
    return next(
        (m.get("name") for m in log["history"] if m.get("name") not in (None, EXECUTOR)), None
    )


def _with_first_step(log: dict[str, Any], agent: str | None) -> tuple[str | None, int | None]:
    """A baseline's agent, and as its step that agent's first message."""
    names = [m.get("name") for m in log["history"]]
    return agent, names.index(agent) if agent in names else None


def attribution_of(
    log: dict[str, Any], llm: Any = None, method: str = "all_at_once"
) -> dict[str, Any]:
    """Import, replay and attribute one log; the step as a history index."""
    from hindsight_loop.attribute import attribute
    from hindsight_loop.ingest import runs_from
    from hindsight_loop.models import Event, Task
    from hindsight_loop.replay import replay

    run = runs_from(log, "ag2")[0]
    events = [Event.from_dict(e) for e in run.events]
    start = run.events[0]
    task = Task(task_id=run.task_id, task_type=start["task_type"], goal=start.get("goal", ""))
    chronicle = replay(task, events)
    found = attribute(chronicle, events=events, llm=llm, method=method)  # type: ignore[arg-type]
    seq = {e.event_id: e.seq for e in events}
    step = seq[found.event_id] - 1 if found.event_id in seq else None
    return {
        "agent": found.agent,
        "step": step,
        "method": found.method,
        "tokens": found.tokens_in + found.tokens_out,
        "calls": found.calls,
        "error": found.error,
    }


def score(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    def share(part: list[dict[str, Any]], what: str) -> float:
        return round(sum(r[f"{key}_{what}_ok"] for r in part) / len(part), 3) if part else 0.0

    held = [r for r in rows if r["held_out"]]
    return {
        "agent_all": share(rows, "agent"),
        "step_all": share(rows, "step"),
        "agent_held_out": share(held, "agent"),
        "step_held_out": share(held, "step"),
    }


def _llm(args: argparse.Namespace) -> Any:
    from hindsight_loop.llm import LLMConfig, connect, from_env

    if args.base_url and args.model:
        return connect(
            LLMConfig(
                provider="openai",
                model=args.model,
                base_url=args.base_url,
                api_key=os.environ.get("HINDSIGHT_LLM_API_KEY") or "none",
            )
        )
    return from_env()


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not Path(args.data).is_dir() or not any(Path(args.data).glob("*.json")):
        return {
            "bench": "who_when",
            "skipped": f"no Who&When logs at {args.data} (see the module docstring for how to "
            "fetch them, or pass --data DIR)",
        }
    logs = load(args.data)
    if args.quick:
        logs = logs[:10] + logs[len(logs) // 2 : len(logs) // 2 + 10]
    half = args.dev_until
    llm = _llm(args) if not args.offline_only else None
    rows: list[dict[str, Any]] = []
    methods = Counter()
    tokens: list[int] = []
    for number, log in logs:
        truth_agent, truth_step = log["mistake_agent"], int(log["mistake_step"])
        row: dict[str, Any] = {"log": number, "held_out": number > half}
        guesses: dict[str, tuple[str | None, int | None]] = {
            "most_active": _with_first_step(log, most_active(log)),
            "first_speaker": _with_first_step(log, first_speaker(log)),
        }
        offline = attribution_of(log)
        methods[offline["method"]] += 1
        guesses["offline"] = (offline["agent"], offline["step"])
        if llm is not None:
            found = attribution_of(log, llm, args.llm_method)
            guesses["llm"] = (found["agent"], found["step"])
            tokens.append(found["tokens"])
            row["llm_error"] = found["error"]
        for key, (agent, step) in guesses.items():
            row[f"{key}_agent_ok"] = agent == truth_agent
            row[f"{key}_step_ok"] = step == truth_step
        rows.append(row)
    result: dict[str, Any] = {
        "bench": "who_when",
        "logs": len(rows),
        "held_out_logs": sum(r["held_out"] for r in rows),
        "dev_until": half,
        "offline": score(rows, "offline"),
        "most_active": score(rows, "most_active"),
        "first_speaker": score(rows, "first_speaker"),
        "offline_rules": dict(methods.most_common()),
    }
    if llm is not None:
        result["llm"] = score(rows, "llm")
        result["llm_name"] = llm.name
        result["llm_method"] = args.llm_method
        result["llm_tokens_per_log"] = round(sum(tokens) / len(tokens)) if tokens else 0
        result["llm_fallbacks"] = sum(1 for r in rows if r.get("llm_error"))
    else:
        result["llm"] = "not run: no model configured (HINDSIGHT_LLM_* or --base-url/--model)"
    return result


def render(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    lines = [
        f"Who&When Algorithm-Generated: {r['logs']} logs "
        f"(rules designed on logs 1-{r['dev_until']}; held out: {r['held_out_logs']})",
        "",
        f"{'method':<28}{'agent (all)':>12}{'step (all)':>12}{'agent (held)':>14}{'step (held)':>13}",
    ]
    names: list[tuple[str, str]] = [
        ("most active agent (baseline)", "most_active"),
        ("first speaker (baseline)", "first_speaker"),
        ("Hindsight offline", "offline"),
    ]
    if isinstance(r.get("llm"), dict):
        names.append((f"LLM {r['llm_method']}", "llm"))
    for label, key in names:
        s = r[key]
        lines.append(
            f"{label:<28}{s['agent_all']:>12.1%}{s['step_all']:>12.1%}"
            f"{s['agent_held_out']:>14.1%}{s['step_held_out']:>13.1%}"
        )
    if isinstance(r.get("llm"), dict):
        lines.append(
            f"LLM {r['llm_name']}: {r['llm_tokens_per_log']} tokens per log, "
            f"{r['llm_fallbacks']} fell back to offline"
        )
    else:
        lines.append(f"LLM: {r['llm']}")
    lines.append(f"offline rules used: {r['offline_rules']}")
    return "\n".join(lines)


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", default=DEFAULT_DATA, help=f"directory of the logs ({DEFAULT_DATA})"
    )
    parser.add_argument(
        "--dev-until", type=int, default=63, help="last log of the design half (63)"
    )
    parser.add_argument("--offline-only", action="store_true", help="skip the LLM path")
    parser.add_argument(
        "--llm-method", default="all_at_once", choices=("all_at_once", "binary_search")
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (else HINDSIGHT_LLM_*)")
    parser.add_argument("--model", help="the model at --base-url")


main: Callable[[], None] = lambda: cli(__doc__ or "", run, render, _extra)  # noqa: E731

if __name__ == "__main__":
    main()
