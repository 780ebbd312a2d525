"""The demo: generated exports, the sample agent's real tools, both rounds, and the command."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app
from hindsight_loop.demo.agent import BUDGET, TOOLS, CsvAgent
from hindsight_loop.demo.data import SOURCES, generate_batch
from hindsight_loop.demo.run import run_demo
from hindsight_loop.demo.tools import (
    HeaderMismatchError,
    MojibakeError,
    RaggedRowsError,
    Table,
    fix_rows,
    read_csv,
    validate,
)
from hindsight_loop.models import Lesson, Structured

runner = CliRunner()
SOURCE = {s.name: s for s in SOURCES}


def _batch(tmp_path: Path, seed: int = 3, files: int = 12):
    return generate_batch(tmp_path / f"n{seed}", seed=seed, files=files)


# -- data -------------------------------------------------------------------------------------


def test_a_batch_is_reproducible_and_another_seed_is_another_night(tmp_path: Path) -> None:
    a = _batch(tmp_path / "a")
    b = _batch(tmp_path / "b")
    c = _batch(tmp_path / "c", seed=4)
    assert [f.path.read_bytes() for f in a] == [f.path.read_bytes() for f in b]
    assert [f.rows for f in a] != [f.rows for f in c]
    assert sorted(f.source for f in a) == sorted(f.source for f in c)  # same kinds of trouble


def test_each_file_decodes_to_its_ground_truth_with_its_sources_quirks(tmp_path: Path) -> None:
    batch = _batch(tmp_path, files=24)
    assert {f.source for f in batch} == set(SOURCE)
    multiline = ragged = 0
    for f in batch:
        src = SOURCE[f.source]
        raw = f.path.read_bytes()
        records = list(
            csv.reader(io.StringIO(raw.decode(src.encoding), newline=""), delimiter=src.delimiter)
        )
        assert records[0] == f.columns
        widths = {len(r) for r in records[1:]}
        ragged += widths != {len(f.columns)}
        multiline += any("\n" in cell for row in f.rows for cell in row)
        padded = [r + [""] * (len(f.columns) - len(r)) for r in records[1:]]
        assert padded == f.rows
        if f.source == "webstore":
            assert raw.startswith(b"\xef\xbb\xbf")
        if f.source == "crm":
            assert raw.startswith(b"\xff\xfe")
        if f.source in ("erp_cn", "eu_shop"):
            with pytest.raises(UnicodeDecodeError):
                raw.decode("utf-8")
        if f.source == "eu_shop":
            assert b";" in raw.splitlines()[0]
    assert ragged >= 1 and multiline >= 1


# -- tools ------------------------------------------------------------------------------------


def _one(tmp_path: Path, source: str):
    return next(f for f in _batch(tmp_path, files=24) if f.source == source)


def test_read_csv_fails_the_way_a_real_reader_does(tmp_path: Path) -> None:
    gbk = _one(tmp_path, "erp_cn")
    with pytest.raises(UnicodeDecodeError):
        read_csv(gbk.path, encoding="utf-8", delimiter=",", columns=gbk.columns)
    with pytest.raises((MojibakeError, HeaderMismatchError)):
        read_csv(gbk.path, encoding="latin-1", delimiter=",", columns=gbk.columns)
    table = read_csv(gbk.path, encoding="gbk", delimiter=",", columns=gbk.columns)
    assert table.rows == gbk.rows

    bom = _one(tmp_path, "webstore")
    with pytest.raises(HeaderMismatchError):
        read_csv(bom.path, encoding="utf-8", delimiter=",", columns=bom.columns)

    eu = _one(tmp_path, "eu_shop")
    with pytest.raises(HeaderMismatchError) as exc:
        read_csv(eu.path, encoding="latin-1", delimiter=",", columns=eu.columns)
    assert len(exc.value.header) == 1 and ";" in exc.value.header[0]
    with pytest.raises(MojibakeError):
        read_csv(_one(tmp_path, "crm").path, encoding="latin-1", delimiter=",", columns=eu.columns)


def test_validate_refuses_ragged_rows_until_fix_rows_pads_them(tmp_path: Path) -> None:
    table = Table(columns=["a", "b", "c"], rows=[["1", "x"], ["2", "y", "z"], ["3", "q", "", ""]])
    with pytest.raises(RaggedRowsError):
        validate(table, columns=table.columns)
    fixed = fix_rows(table, columns=table.columns)
    assert fixed.rows == [["1", "x", ""], ["2", "y", "z"], ["3", "q", ""]]
    assert validate(fixed, columns=table.columns) == 3
    with pytest.raises(RaggedRowsError):
        fix_rows(Table(columns=["a"], rows=[["1", "data"]]), columns=["a"])


# -- the agent --------------------------------------------------------------------------------


@dataclass
class _Lessons:
    """Only what ``CsvAgent.read_plan`` reads from a task: its recalled lessons."""

    lessons: list[Lesson] = field(default_factory=list)


def _lesson(source: str, *, prefer: dict | None = None, avoid: dict | None = None) -> Lesson:
    return Lesson(
        lesson_id=f"les_{source}",
        task_type="csv_cleaning",
        advice="…",
        structured=Structured(
            when={
                "tool": "read_csv",
                "step": "parse",
                "error_type": "UnicodeDecodeError",
                "context": {"source": source},
            },
            prefer=prefer,
            avoid=avoid,
        ),
    )


def test_the_cold_plan_is_the_careful_default_order() -> None:
    plan = CsvAgent().read_plan(_Lessons(), {"source": "crm"}, [])
    assert [p["encoding"] for p in plan] == ["utf-8", "utf-8-sig", "utf-16", "gbk", "latin-1"]
    assert {p["delimiter"] for p in plan} == {","}


def test_the_warm_plan_applies_matching_lessons_only() -> None:
    crm = _lesson("crm", prefer={"tool": "read_csv", "args": {"encoding": "utf-16"}})
    other = _lesson("erp_cn", prefer={"tool": "read_csv", "args": {"encoding": "gbk"}})
    applied: list[str] = []
    plan = CsvAgent().read_plan(_Lessons([other, crm]), {"source": "crm"}, applied)
    assert plan[0] == {"encoding": "utf-16", "delimiter": ","}
    assert applied == ["les_crm"]


def test_partial_lessons_compose_avoid_and_prefer() -> None:
    # One lesson says which encodings failed, another (learned later) which delimiter worked.
    avoid = _lesson(
        "eu_shop",
        avoid={
            "tool": "read_csv",
            "args": {"encoding": "utf-8"},
            "variants": [{"encoding": e} for e in ("utf-8", "utf-8-sig", "utf-16", "gbk")],
        },
    )
    delim = _lesson(
        "eu_shop",
        prefer={"tool": "read_csv", "args": {"delimiter": ";"}},
        avoid={"tool": "read_csv", "args": {"delimiter": ","}},
    )
    plan = CsvAgent().read_plan(_Lessons([delim, avoid]), {"source": "eu_shop"}, [])
    assert plan == [{"encoding": "latin-1", "delimiter": ";"}]


def test_the_agent_records_every_call_and_never_hands_over_an_unvalidated_table(
    tmp_path: Path,
) -> None:
    batch = _batch(tmp_path, files=24)
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        agent = CsvAgent(use_lessons=False)
        for f in batch:
            with hs.task("csv_cleaning", goal=f"clean {f.name}", tools=TOOLS, recall=False) as task:
                out = agent.clean(task, f)
            assert out.tool_calls <= BUDGET
            if out.table is not None:
                assert out.table.rows == f.rows and out.calls[-1] == "validate() -> ok"
            hs.flush()
            events = hs.store.events(task.task_id)
            actions = [e for e in events if e.type == "action_executed"]
            assert len(actions) == out.tool_calls
            assert all(e.context == {"source": f.source} for e in actions)
        clean = next(f for f in batch if f.source == "pos_us")
        with hs.task("csv_cleaning", goal="clean", tools=TOOLS, recall=False) as task:
            assert agent.clean(task, clean).tool_calls == 2  # no detour on a clean file


# -- both rounds ------------------------------------------------------------------------------


def test_the_warm_round_cleans_25_points_more_with_fewer_calls(tmp_path: Path) -> None:
    report = run_demo(tmp_path / "demo.db", seed=7, files=24)
    cold, warm = report.rounds
    assert (cold.name, warm.name) == ("cold", "warm")
    assert cold.tasks == warm.tasks == 24
    assert warm.rate - cold.rate >= 0.25, (cold.to_dict(), warm.to_dict())
    assert warm.tool_calls < cold.tool_calls
    # Cold is not built to fail: the sources a default order handles are cleaned.
    assert {f.source for f in cold.files if f.correct} >= {
        "pos_us",
        "webstore",
        "crm",
        "legacy_pos",
    }
    # What made the difference are lessons recalled for each troubled file and applied.
    for f in warm.files:
        if f.source != "pos_us":
            assert f.lessons_applied, f
    assert report.lessons and all(x.structured is not None for x in report.lessons)
    again = run_demo(tmp_path / "again.db", seed=7, files=24)
    assert [r.to_dict() for r in again.rounds] == [r.to_dict() for r in report.rounds]


def test_a_second_demo_on_the_same_store_still_wins(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run_demo(db, seed=7, files=12)
    cold, warm = run_demo(db, seed=8, files=12).rounds
    assert warm.rate - cold.rate >= 0.25 and warm.tool_calls < cold.tool_calls


# -- the command ------------------------------------------------------------------------------


def test_demo_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--json", "--db", str(tmp_path / "d.db"), "--files", "12"])
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.stdout)
    assert [r["name"] for r in out["rounds"]] == ["cold", "warm"]
    cold, warm = out["rounds"]
    assert set(cold) == {"name", "tasks", "succeeded", "tool_calls"}
    assert cold["tasks"] == warm["tasks"] == 12
    assert warm["succeeded"] > cold["succeeded"] and warm["tool_calls"] < cold["tool_calls"]
    assert out["lessons"] and all("advice" in x and "structured" in x for x in out["lessons"])


def test_demo_prints_rounds_and_lessons_and_says_the_agent_is_a_plain_program(
    tmp_path: Path,
) -> None:
    db = tmp_path / "d.db"
    result = runner.invoke(app, ["demo", "--db", str(db), "--files", "6", "--seed", "1"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "plain Python program" in text and "structured form" in text
    assert "cold" in text and "warm" in text and "Lessons learned" in text
    assert "hindsight replay" in text
    replayed = runner.invoke(
        app, ["replay", text.split("hindsight replay ")[1].split()[0], "--db", str(db)]
    )
    assert replayed.exit_code == 0 and "key nodes" in replayed.stdout


def test_demo_llm_without_a_model_says_how_to_configure_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PROVIDER", "MODEL", "BASE_URL"):
        monkeypatch.delenv(f"HINDSIGHT_LLM_{name}", raising=False)
    result = runner.invoke(app, ["demo", "--llm", "--db", str(tmp_path / "d.db")])
    assert result.exit_code == 1
    assert "HINDSIGHT_LLM_MODEL" in result.output


def test_demo_has_help() -> None:
    result = runner.invoke(app, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--json", "--db", "--seed", "--files", "--llm"):
        assert option in result.stdout
