"""Real agent runs for the benchmarks: τ-bench's published trajectories, imported as Hindsight runs.

τ-bench (github.com/sierra-research/tau-bench) publishes the runs of real models on its tasks in
``historical_trajectories/``: a JSON list of trials, each ``{"task_id": <task index>, "trial": n,
"reward": 0.0|1.0, "info": {...}, "traj": [OpenAI chat messages]}``. ``load_tau`` maps them with
Hindsight's generic OpenAI import only: nothing here knows the domain.

Get the file (it is not committed here)::

    git clone --depth 1 https://github.com/sierra-research/tau-bench /tmp/tau-bench
    mkdir -p /tmp/tau && cp /tmp/tau-bench/historical_trajectories/gpt-4o-airline.json /tmp/tau/

or point ``HINDSIGHT_TAU_FILE`` at any of the files in that folder. Then::

    python bench/real_runs_data.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hindsight_loop.ingest import Run, runs_from

DEFAULT_FILE = Path("/tmp/tau/gpt-4o-airline.json")
TASK_TYPE = "airline_support"


def tau_file() -> Path:
    """Where the trajectories are: ``$HINDSIGHT_TAU_FILE`` or ``/tmp/tau/gpt-4o-airline.json``."""
    path = Path(os.environ.get("HINDSIGHT_TAU_FILE") or DEFAULT_FILE)
    if not path.is_file():
        raise FileNotFoundError(
            f"no τ-bench trajectories at {path}. Get them with:\n"
            "  git clone --depth 1 https://github.com/sierra-research/tau-bench /tmp/tau-bench\n"
            "  mkdir -p /tmp/tau && cp /tmp/tau-bench/historical_trajectories/gpt-4o-airline.json /tmp/tau/\n"
            "or set HINDSIGHT_TAU_FILE to one of the files in historical_trajectories/."
        )
    return path


def tau_runs(trials: list[dict[str, Any]], *, name: str = "tau") -> list[Any]:
    """τ-bench trials as import runs: messages, reward, and the task index and trial in metadata.

    ``info`` is left out on purpose: it holds the grader's expected actions and the simulated
    user's instructions, which the agent never saw and a lesson must not learn from.
    """
    runs = []
    for trial in trials:
        index, number = trial["task_id"], trial.get("trial", 0)
        runs.append(
            {
                # One Hindsight task per trial; the τ-bench task index is shared by its trials.
                "task_id": f"{name}_t{index}_r{number}",
                "messages": trial["traj"],
                "reward": trial.get("reward"),
                "metadata": {"tau_task_index": index, "trial": number, "dataset": name},
            }
        )
    return runs


def load_tau(path: str | os.PathLike[str] | None = None) -> list[Run]:
    """The trajectories of a τ-bench ``historical_trajectories`` file as Hindsight runs."""
    path = Path(path) if path is not None else tau_file()
    with open(path, encoding="utf-8") as fh:
        trials = json.load(fh)
    return runs_from(tau_runs(trials, name=f"tau-{path.stem}"), "openai", task_type=TASK_TYPE)


def task_index(run: Run) -> int:
    """The τ-bench task index of a run (its trials share it): split train/test by this."""
    return run.events[0]["context"]["metadata"]["tau_task_index"]


def main() -> int:
    try:
        path = tau_file()
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        with open(path, encoding="utf-8") as fh:
            trials = json.load(fh)
    except json.JSONDecodeError as exc:
        print(f"{path} is not a τ-bench trajectories JSON file ({exc})", file=sys.stderr)
        return 1
    name = f"tau-{path.stem}"
    prepared = tau_runs(trials, name=name)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        runs = runs_from(prepared, "openai", task_type=TASK_TYPE)
        timings.append(time.perf_counter() - started)

    events = [e for r in runs for e in r.events]
    actions = [e for e in events if e["type"] == "action_executed"]
    failed = [e for e in actions if e["result"]["status"] == "failed"]
    missing = [e for e in actions if e["result"]["status"] == "unknown"]
    first_words = Counter(
        (e["result"]["error_message"].split() or [""])[0] for e in failed
    ).most_common(10)
    openings = Counter(
        " ".join(e["result"]["error_message"].split()[:3]) for e in failed
    ).most_common(10)
    outcomes = Counter(r.events[-1]["result"]["status"] for r in runs)
    runs_with_failure = sum(
        any(e["type"] == "action_executed" and e["result"]["status"] == "failed" for e in r.events)
        for r in runs
    )

    print(f"file                     {path}")
    print(f"runs                     {len(runs)} ({len({task_index(r) for r in runs})} tasks)")
    print(f"outcomes                 {dict(outcomes)}")
    print(f"events                   {len(events)}")
    print(f"tool calls               {len(actions)}")
    print(f"tool calls failed        {len(failed)} (in {runs_with_failure} runs)")
    print(f"tool calls no result     {len(missing)}")
    print("first words of failed results:")
    for word, count in first_words:
        print(f"  {count:5d}  {word}")
    print("most common openings of failed results (3 words):")
    for opening, count in openings:
        print(f"  {count:5d}  {opening}")
    print(
        f"time to map all runs     median {statistics.median(timings) * 1000:.1f} ms "
        f"(min {min(timings) * 1000:.1f}, max {max(timings) * 1000:.1f}, 5 runs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
