"""The rows the writer process stores for a fixed stream of agent lines, byte for byte.

The writer's hot path has several routes to the same row (a payload's bytes taken from the
agent's line or serialized again, guards scanned per event or per piece, the projection handed
to the live rules as a value or read back from its JSON). Whatever route a change takes, the
same lines must give the same events table and the same review jobs: this stream (short tasks,
the benchmark's mix, secrets of every kind the redaction tests know, odd timestamps, text to
cut, failures that fire the live rules) is written by ``python -m hindsight_loop.writer`` and
compared with the rows the event-by-event reference path prepares (Python guards, one event
at a time), and with a digest of what the code stored when the test was written.
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_redact_guards import FRAGMENTS, SHAPES, _value

from hindsight_loop import Hindsight
from hindsight_loop.record import Recorder, _Sanitizer
from hindsight_loop.writer import _OPT, _datetime_text, frame_item

SESSION = "evt_rows"
T0 = 1_765_000_000_000_000_000  # ns: every timestamp fixed, so rows compare across runs
TOOLS = ["read_csv", "parse_with_pandas", "sql_query", "write_parquet", "search_docs"]
#: sha256 of the events and jobs tables this stream gave when the test was written (see
#: ``_digest``). A change that alters what is stored must say so here, on purpose.
DIGEST = "f50b2471df2bfdb777ec748404df6d8f53de5caac451842b911c665d6f5d7e12"


def _payloads(rng: random.Random, n: int) -> list[tuple[str, dict[str, Any]]]:
    """(type, payload) of a task's events after its start: tool calls (some failing, some
    repeated: the live rules fire), decisions, user turns (some unhappy), feedback, states."""
    pool = FRAGMENTS + SHAPES
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        k = rng.randrange(10)
        if k < 4:
            tool = rng.choice(TOOLS[:2]) if rng.random() < 0.5 else rng.choice(TOOLS)
            failed = rng.random() < 0.3
            result: dict[str, Any] = {"status": "failed" if failed else "succeeded"}
            if failed:
                result |= {"error_type": "EncodingError", "error_message": rng.choice(pool)}
            else:
                result["output"] = _value(rng, 1, pool)
            args = {"path": f"/data/{i % 3}.csv", "note": _value(rng, 2, pool)}
            out.append(
                (
                    "action_executed",
                    {
                        "input": {"tool": tool, "args": args},
                        "result": result,
                        "agent_state": {"current_step": rng.choice(["parse", "load", "plan"])},
                    },
                )
            )
        elif k < 6:
            out.append(
                (
                    "llm_decision",
                    {
                        "agent_state": {"current_step": "plan"},
                        "decision": {
                            "chosen_action": rng.choice(TOOLS),
                            "alternatives": rng.sample(TOOLS, 2),
                            "confidence": round(rng.random(), 2),
                            "reasoning": rng.choice(pool),
                        },
                    },
                )
            )
        elif k == 6:
            text = rng.choice(["this is wrong, stop", "不对，重新来", rng.choice(pool)])
            out.append(("user_input", {"input": {"text": text}}))
        elif k == 7:
            score = rng.choice((-1, 0, 1))
            out.append(("feedback", {"input": {"text": rng.choice(pool), "score": score}}))
        elif k == 8:
            out.append(("state_change", {"agent_state": {"current_step": "x", "n": i}}))
        else:
            keys = ["password", "api_key", "max_tokens", "note", "db.password", "说明"]
            out.append(("action_executed", {rng.choice(keys): _value(rng, 0, pool)}))
    return out


def stream(seed: int = 41, tasks: int = 40) -> list[bytes]:
    """The agent's lines (``ProcessRecorder.emit``'s layout) for ``tasks`` short tasks."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    own = 0

    def line(task_id: str, etype: str, payload: Any, *, seq: Any = None, ts: Any = None) -> None:
        nonlocal own
        own += 1
        event_id = f"evt_given_{own}" if own % 7 == 0 else None
        stamp = T0 + own * 1_000_003 if ts is None else ts
        lines.append(
            orjson.dumps(
                (task_id, own, seq, stamp, etype, event_id, payload),
                option=_OPT,
                default=_datetime_text,
            )
        )

    for t in range(tasks):
        task_id = f"tsk_rows_{t}"
        start = {"task_type": "rows", "goal": f"goal {t}", "tools": TOOLS[: t % 4]}
        line(task_id, "task_start", {**start, "scope": "global", "intent": None})
        for etype, payload in _payloads(rng, rng.randint(5, 60)):
            line(task_id, etype, payload)
        if t % 5 == 0:  # odd timestamps: a caller's text, one that is unreadable
            line(task_id, "state_change", {"agent_state": {}}, ts="2024-11-20T14:32:10.882+08:00")
            line(task_id, "state_change", {"agent_state": {}}, ts="not a time", seq=3)
        status = "failed" if t % 3 == 0 else "succeeded"
        line(task_id, "task_end", {"result": {"status": status}})
    return lines


def _config(db: Path, tmp_path: Path) -> dict[str, Any]:
    return {
        "db": str(db),
        "dead_letter": str(tmp_path / "dead.jsonl"),
        "fallback_dir": str(tmp_path),
        "max_text": 500,
        "review_min_events": 10,
        "live": True,
        "session": SESSION,
    }


def write(lines: list[bytes], db: Path, tmp_path: Path, src: str | None = None) -> None:
    """Feed ``lines`` to a writer process (of the checkout at ``src``) on a fresh store."""
    Hindsight(db, background=False).close()  # the schema
    data = orjson.dumps(_config(db, tmp_path)) + b"\n" + b"\n".join(lines) + b"\n"
    src = src or str(Path(__file__).parents[1] / "src")
    done = subprocess.run(
        [sys.executable, "-m", "hindsight_loop.writer"],
        input=data,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": src},
        timeout=120,
        check=True,
    )
    assert b'"done"' in done.stdout


def stored(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The events table (its row ids aside: they follow the order) and the review jobs
    (their ids and times aside)."""
    con = sqlite3.connect(db)
    try:
        events = con.execute(
            "SELECT event_id, task_id, seq, ts, type, CAST(body AS BLOB), projection "
            "FROM events ORDER BY id"
        ).fetchall()
        jobs = con.execute(
            "SELECT task_id, kind, trigger, window, use_llm FROM jobs ORDER BY task_id, job_id"
        ).fetchall()
    finally:
        con.close()
    return events, jobs


def _digest(events: list[tuple[Any, ...]], jobs: list[tuple[Any, ...]]) -> str:
    # "not a time" becomes the time it was written: its rows' ts column is left out.
    h = hashlib.sha256()
    for row in events:
        ts = row[3] if row[2] != 3 or row[4] != "state_change" else None
        h.update(orjson.dumps([*row[:3], ts, row[4], row[5].decode(), row[6]]))
    h.update(orjson.dumps(jobs))
    return h.hexdigest()


def _reference_rows(lines: list[bytes], tmp_path: Path) -> list[tuple[Any, ...]]:
    """The rows of ``lines`` prepared one event at a time with the Python guards."""
    rec = Recorder(
        lambda rows: None, dead_letter=tmp_path / "ref.jsonl", start=False, batch_guards=False
    )
    rows = []
    for raw_line in lines:
        raws: list[bytes | None] = []
        item = frame_item(raw_line, SESSION, raws)
        rows.append(rec._row(item, _Sanitizer(rec.max_text), raw=raws[0]))
    return rows


@pytest.mark.filterwarnings("ignore::hindsight_loop.record.HindsightWarning")
def test_the_writer_process_stores_the_reference_rows(tmp_path: Path) -> None:
    """The writer process's rows are the event-by-event reference path's, and the events
    and jobs tables are those of the digest taken when the test was written."""
    lines = stream()
    db = tmp_path / "w.db"
    write(lines, db, tmp_path)
    events, jobs = stored(db)
    assert len(events) == len(lines)
    reference = _reference_rows(lines, tmp_path)
    for got, want in zip(events, reference, strict=True):
        projection = (want[6] or b"").decode()  # none is stored empty
        assert got[:3] + got[4:] == (*want[:3], *want[4:6], projection), got
        assert got[3] == want[3] or got[2] == 3  # "not a time": now, when each was prepared
    assert any(kind == "local" for _, kind, *_ in jobs)  # the live rules fired
    assert sum(b"[REDACTED" in row[5] for row in events) > 100
    assert _digest(events, jobs) == DIGEST


@pytest.mark.parametrize(
    "odd",
    [
        "plain",
        "float seq",
        "NUL in an id",
        "seq past 64 bits",
        "seven columns",
        "seven columns, a caller's timestamp",
    ],
)
def test_a_batch_stores_the_rows_its_events_stored_one_by_one(tmp_path: Path, odd: str) -> None:
    """A batch large enough for bound multi-row INSERTs stores, column by column and type by
    type, what the same rows written in small batches (through the JSON index) store. With
    seven columns to every row the batch takes the column-wise way (``_usual_values``), save
    where a row is not the recorder's usual one."""
    from hindsight_loop.store.sqlite import SQLiteStore

    rows: list[tuple[Any, ...]] = []
    for i in range(1700):
        seq: Any = i
        task_id = "tsk_a"
        if i == 900 and odd == "float seq":
            seq = 900.0
        if i in (5, 1650) and odd == "NUL in an id":
            task_id = "tsk_a\x00b"
        if i == 7 and odd == "seq past 64 bits":
            seq = 2**63 + 5
        body = orjson.dumps({"i": i, "text": "é中 \x00 [REDACTED]", "n": 1.5})
        projection = b"[1]" if i % 3 else None
        ts = f"2025-01-01T00:00:00.{i % 1000:03d}Z"
        if i == 1000 and odd == "seven columns, a caller's timestamp":
            ts = "2025-01-01T08:00:00.000+08:00"
        rows.append((f"evt_{i}", task_id, seq, ts, "x", body))
        if i % 2 or odd.startswith("seven columns"):
            rows[-1] += (projection,)
    tables = []
    for name, size in (("whole", len(rows)), ("small", 100)):
        store = SQLiteStore(tmp_path / f"{name}.db")
        for start in range(0, len(rows), size):
            store.write_event_batch(rows[start : start + size])  # type: ignore[arg-type]
        store.close()
        con = sqlite3.connect(tmp_path / f"{name}.db")
        tables.append(
            con.execute(
                "SELECT event_id, typeof(event_id), task_id, seq, typeof(seq), ts, type, "
                "CAST(body AS BLOB), typeof(body), projection, typeof(projection) "
                "FROM events ORDER BY id"
            ).fetchall()
        )
        con.close()
    assert tables[0] == tables[1]
    assert len(tables[0]) == len(rows)
