"""Replay's output, byte for byte, against a golden file made by the code before it was tuned.

Replay is tuned for speed (issue 13: a 10,000-event task in <= 50 ms); what it shows must not
move by a byte while it is. ``tests/data/replay_golden.json`` holds, per task and step limit, a
SHA-256 of everything a chronicle is shown as: its JSON (what ``hindsight replay --json`` and
the HTTP API print), each step's detail (the CLI and the web page), the text an LLM reviewer is
sent (``render_chronicle``) and the run's language. It was written by this module run as a
script (``python tests/test_replay_golden.py --write``) on main's code before the tuning
(8a275a0), and written again when a compressed chronicle began to fold repeated key nodes
(``replay._fold``), the one intended change: every chronicle that folds nothing was checked to
be as before but for the new ``KeyNode.repeats`` field. The test replays the same inputs on
SQLite and PostgreSQL, from the stored projections, from the decoded events and from bodies
alone (projections set to NULL, as rows written before them), and compares.

The inputs: the benchmark's 10,000-event task (``bench/replay_speed.py``'s mix and seed),
varied runs (every status spelling, loops, wavering, complaints in English and Chinese, several
agents), a call carrying a password (redacted, so stored without a projection), imported
OpenAI / Anthropic / Chinese transcripts, rows with timestamps out of the wire format, and real
runs: 16 τ-bench airline GPT-4o trajectories and 10 Who&When multi-agent logs
(``tests/data/replay_real_runs.jsonl.gz``, as ``bench/real_runs_data.py`` and
``bench/who_when.py`` import them; both datasets MIT-licensed: sierra-research/tau-bench,
ag2ai/Agents_Failure_Attribution).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))

from _common import mixed_events  # noqa: E402
from test_ingest import ANTHROPIC_RUN, CHINESE_RUN, OPENAI_RUN  # noqa: E402
from test_replay import T0  # noqa: E402
from test_replay_projection import varied_run  # noqa: E402

from hindsight_loop import Hindsight  # noqa: E402
from hindsight_loop.llm.templates import render_chronicle  # noqa: E402
from hindsight_loop.models import Chronicle, Task, iso  # noqa: E402
from hindsight_loop.replay import replay, run_language, step_detail  # noqa: E402

GOLDEN = HERE / "data" / "replay_golden.json"
REAL_RUNS = HERE / "data" / "replay_real_runs.jsonl.gz"
#: The default limit, a small one (heavy compression) and none.
STEP_LIMITS = (500, 60, 1 << 30)


def shown(chronicle: Chronicle) -> bytes:
    """Everything a chronicle is shown as, as bytes (see the module docstring)."""
    parts = [
        type(chronicle).__name__.encode(),
        orjson.dumps(chronicle.to_dict(), option=orjson.OPT_NON_STR_KEYS, default=str),
        "\x1e".join(step_detail(s) for s in chronicle.steps).encode(),
        render_chronicle(chronicle).encode(),
        run_language(chronicle).encode(),
    ]
    return b"\x1f".join(parts)


def digest(chronicle: Chronicle) -> dict[str, Any]:
    return {
        "sha256": hashlib.sha256(shown(chronicle)).hexdigest(),
        "steps": len(chronicle.steps),
        "key_nodes": len(chronicle.key_nodes),
    }


def _stamped(events: list[dict[str, Any]], prefix: str, start: int = 0) -> list[dict[str, Any]]:
    """Events with fixed ids and wire timestamps, so the stored run is the same every time."""
    return [
        {**e, "event_id": f"evt_{prefix}{i:05d}", "timestamp": iso(T0 + timedelta(milliseconds=i))}
        for i, e in enumerate(events, start)
    ]


def record_inputs(hs: Hindsight, tmp: Path) -> None:
    """Every input of the golden file, recorded into one store."""
    # The benchmark's task: task_start, 9,998 events of its mix, task_end.
    bench = [{"type": "task_start", "task_id": "tsk_bench", "task_type": "csv_cleaning"}]
    bench[0]["goal"] = "clean the sales files"
    bench += mixed_events(random.Random(3), "tsk_bench", 9998)
    bench.append({"type": "task_end", "task_id": "tsk_bench", "result": {"status": "succeeded"}})
    rng = random.Random(13)
    runs = [("bench", bench)]
    for n, agents in ((40, False), (400, False), (300, True), (1500, False)):
        tid = f"tsk_varied{n}"
        runs.append(
            (f"v{n}_", [{**e, "task_id": tid} for e in varied_run(rng, tid, n, agents=agents)])
        )
    # A password in a call's arguments: redacted, so stored without a projection.
    secret: list[dict[str, Any]] = [
        {"type": "task_start", "task_id": "tsk_secret", "task_type": "http"}
    ]
    for _ in range(5):
        call = {"tool": "http_get", "args": {"url": "/r", "note": "password=hunter2"}}
        secret.append(
            {
                "type": "action_executed",
                "task_id": "tsk_secret",
                "input": call,
                "result": {"status": "error"},
            }
        )
    secret.append({"type": "user_input", "task_id": "tsk_secret", "input": {"text": "又错了！"}})
    runs.append(("s_", secret))
    for prefix, events in runs:
        for event in _stamped(events, prefix):
            assert hs.record(event)
    for data, fmt in (
        (OPENAI_RUN, "openai"),
        (CHINESE_RUN, "openai"),
        (ANTHROPIC_RUN, "anthropic"),
    ):
        hs.import_transcript(data, format=fmt, task_type="imported")
    real = tmp / "real.jsonl"
    real.write_bytes(gzip.decompress(REAL_RUNS.read_bytes()))
    accepted, problems = hs.import_jsonl(real)
    assert accepted > 500 and not problems
    assert hs.flush()
    # A run written straight to the store with timestamps out of the wire format.
    odd = [
        (f"e{i}", "tsk_odd", i % 3, ts, "action_executed", body)
        for i, (ts, body) in enumerate(
            [
                (
                    "2024-11-20T14:32:10+08:00",
                    b'{"input":{"tool":"a"},"result":{"status":"failed"}}',
                ),
                ("2024-11-20T06:32:09.000Z", b'{"input":{"tool":"b"},"result":{"status":"ok"}}'),
                ("2024-11-20T06:32:09Z", b'{"input":{"tool":"a"},"result":{"status":"error"}}'),
            ]
        )
    ]
    hs.store.write_event_batch(odd)
    hs.store.upsert_task(Task(task_id="tsk_odd", task_type="odd", started_at=iso(T0)))


def chronicles(hs: Hindsight) -> dict[str, Chronicle]:
    """Each stored task's chronicle at each step limit, read as ``hs.replay`` reads it."""
    out = {}
    for task in sorted(hs.store.list_tasks(limit=1000), key=lambda t: t.task_id):
        for limit in STEP_LIMITS:
            out[f"{task.task_id}@{limit}"] = hs.replay(task.task_id, max_steps=limit)
    return out


def in_memory(hs: Hindsight) -> dict[str, Chronicle]:
    """The same chronicles from the decoded events (``replay(task, store.events(...))``)."""
    out = {}
    for task in sorted(hs.store.list_tasks(limit=1000), key=lambda t: t.task_id):
        events = hs.store.events(task.task_id)
        for limit in STEP_LIMITS:
            out[f"{task.task_id}@{limit}"] = replay(task, events, max_steps=limit)
    return out


def _forget_projections(hs: Hindsight) -> None:
    hs.store._db.execute("UPDATE events SET projection = NULL")  # type: ignore[attr-defined]


def _compare(got: dict[str, Chronicle], golden: dict[str, Any], how: str) -> None:
    assert sorted(got) == sorted(golden), how
    wrong = [case for case, c in got.items() if digest(c) != golden[case]]
    assert not wrong, f"{how}: {len(wrong)} chronicles differ from the golden file: {wrong[:8]}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_path: Any) -> str:
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_url"))


def test_replay_shows_what_the_golden_file_holds(store_url: str, tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    hs = Hindsight(store_url, background=False, triggers=False)
    try:
        record_inputs(hs, tmp_path)
        assert golden["tsk_bench@500"]["steps"] == 523  # the benchmark's task, as it measures
        _compare(chronicles(hs), golden, "from the stored projections")
        _compare(in_memory(hs), golden, "from the decoded events")
        _forget_projections(hs)
        _compare(chronicles(hs), golden, "from the bodies (projections NULL)")
    finally:
        hs.close()


def _write(path: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        hs = Hindsight(Path(tmp) / "golden.db", background=False, triggers=False)
        try:
            record_inputs(hs, Path(tmp))
            out = {case: digest(c) for case, c in chronicles(hs).items()}
        finally:
            hs.close()
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} chronicles -> {path}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_replay_golden.py --write  (on the reference code)")
    _write(GOLDEN)
