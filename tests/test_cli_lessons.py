"""``hindsight lessons …``: review, change, export and import the lesson book from the command line."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app
from hindsight_loop.lessons import apply_outcome

runner = CliRunner()

SEED = [
    {"task_type": "csv_cleaning", "advice": "Use encoding='utf-8-sig' when reading CSV files with read_csv.",
     "tools": ["read_csv"], "keywords": ["bom"]},
    {"task_type": "csv_cleaning", "advice": "When reading CSV files with read_csv, use encoding='utf-8-sig'.",
     "tools": ["read_csv"]},
    {"task_type": "weather_query", "advice": "调用 get_weather 前先向用户确认城市。", "tools": ["get_weather"],
     "intent": "query", "scope": "user:alice"},
    {"task_type": "weather_query", "advice": "Retry get_weather once on timeout before telling the user.",
     "tools": ["get_weather"], "pinned": True},
]  # fmt: skip


def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
    result = runner.invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.output


def run_json(*args: str) -> object:
    return orjson.loads(run(*args, "--json"))


def write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def seeded(db_path: Path, tmp_path: Path) -> dict[str, str]:
    """The SEED lines imported; advice -> lesson id."""
    out = run_json(
        "lessons", "import", str(write_lines(tmp_path / "seed.jsonl", SEED)), "--db", str(db_path)
    )
    assert {k: len(v) for k, v in out.items()} == {
        "added": 3,
        "merged": 1,
        "conflicts": 0,
        "restored": 0,
        "kept": 0,
    }
    lessons = run_json("lessons", "list", "--db", str(db_path))
    return {x["advice"]: x["lesson_id"] for x in lessons}


def test_every_lessons_command_has_help() -> None:
    assert "Review and curate the lesson book" in run("lessons", "--help")
    for command in ("list", "show", "review", "confirm", "merge", "split", "reject", "pin", "unpin", "expire", "edit",
                    "export", "import"):  # fmt: skip
        out = run("lessons", command, "--help")
        assert "Usage:" in out and "--db" in out


def test_import_curates_hand_written_lines(db_path: Path, seeded: dict[str, str]) -> None:
    lessons = {x["advice"]: x for x in run_json("lessons", "list", "--db", str(db_path))}
    assert len(lessons) == 3
    merged = lessons[SEED[0]["advice"]]
    assert merged["support"] == 2 and merged["features"]["keywords"] == ["bom"]
    zh = lessons[SEED[2]["advice"]]
    assert (
        zh["scope"] == "user:alice"
        and zh["features"]["intent"] == "query"
        and zh["language"] == "zh"
    )
    pinned = lessons[SEED[3]["advice"]]
    assert pinned["pinned"] and pinned["valid_until"] is None
    table = run("lessons", "list", "--db", str(db_path))
    assert "user:alice" in table and "pinned" in table


def test_the_same_lines_imported_again_add_no_support(
    db_path: Path, seeded: dict[str, str], tmp_path: Path
) -> None:
    before = {x["advice"]: x["support"] for x in run_json("lessons", "list", "--db", str(db_path))}
    again = write_lines(tmp_path / "again.jsonl", SEED)
    for _ in range(2):
        out = run_json("lessons", "import", str(again), "--db", str(db_path))
        assert len(out["merged"]) == 4 and not out["added"]
    # The same lines in other case and spacing, or without the full stop.
    retyped = [
        {**row, "advice": "  " + str(row["advice"]).upper().rstrip(".。") + " "} for row in SEED
    ]
    run(
        "lessons",
        "import",
        str(write_lines(tmp_path / "retyped.jsonl", retyped)),
        "--db",
        str(db_path),
    )
    after = {x["advice"]: x["support"] for x in run_json("lessons", "list", "--db", str(db_path))}
    assert after == before  # before the fix: support 2 -> 4 and 1 -> 3, from one file
    # A line in words of its own is another person's say: it counts.
    reworded = {**SEED[0], "advice": "Pass encoding='utf-8-sig' to read_csv for CSV files."}
    run(
        "lessons",
        "import",
        str(write_lines(tmp_path / "new.jsonl", [reworded])),
        "--db",
        str(db_path),
    )
    lessons = run_json("lessons", "list", "--db", str(db_path))
    assert {x["advice"]: x["support"] for x in lessons}[SEED[0]["advice"]] == 3


def test_import_reports_every_bad_line_and_imports_nothing(db_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "# seeded by the data team\n"
        + orjson.dumps(SEED[0]).decode() + "\n"
        + "\n"
        + '{"task_type": "csv_cleaning"}\n'
        + "{not json\n"
        + '{"task_type": "t", "advice": "x", "scope": "org:data"}\n'
        + '{"task_type": "t", "advice": "x", "tool": ["read_csv"]}\n',
        encoding="utf-8",
    )  # fmt: skip
    result = runner.invoke(app, ["lessons", "import", str(path), "--db", str(db_path)])
    assert result.exit_code == 1
    out = result.output
    assert "line 4: missing 'advice'" in out
    assert "line 5: not valid JSON" in out
    assert "line 6: invalid scope 'org:data': use 'global', 'project:NAME', 'user:NAME'" in out
    assert "line 7: unknown field 'tool' (did you mean 'tools'?)" in out
    assert "nothing imported" in out and "fix the 4 line(s) above" in out
    assert not db_path.exists()  # nothing imported: not even an empty store was made


def test_import_of_a_missing_file_says_so(db_path: Path, tmp_path: Path) -> None:
    out = run("lessons", "import", str(tmp_path / "nope.jsonl"), "--db", str(db_path), code=1)
    assert "cannot read" in out and "nope.jsonl" in out


def test_import_from_stdin(db_path: Path) -> None:
    line = orjson.dumps({"task_type": "t", "advice": "Check the delimiter first."}).decode()
    result = runner.invoke(app, ["lessons", "import", "-", "--db", str(db_path)], input=line + "\n")
    assert result.exit_code == 0, result.output
    assert "1 added" in result.output


def test_show_with_history(db_path: Path, seeded: dict[str, str]) -> None:
    lesson_id = seeded[SEED[0]["advice"]]
    data = run_json("lessons", "show", lesson_id, "--db", str(db_path))
    assert data["lesson_id"] == lesson_id and data["support"] == 2
    assert [h["action"] for h in data["history"]] == ["import", "merge"]
    text = run("lessons", "show", lesson_id, "--db", str(db_path))
    assert SEED[0]["advice"] in text and "history" in text and "curator: merge" in text


def test_unknown_ids_say_how_to_list(db_path: Path, seeded: dict[str, str]) -> None:
    for command in ("show", "pin", "unpin", "reject", "confirm", "expire"):
        out = run("lessons", command, "les_nope", "--db", str(db_path), code=1)
        assert "no lesson 'les_nope'" in out and "hindsight lessons list --db" in out
    out = run("lessons", "edit", "les_nope", "--advice", "x", "--db", str(db_path), code=1)
    assert "no lesson 'les_nope'" in out


def test_list_filters(db_path: Path, seeded: dict[str, str]) -> None:
    weather = run_json("lessons", "list", "--db", str(db_path), "--task-type", "weather_query")
    assert len(weather) == 2
    alice = run_json("lessons", "list", "--db", str(db_path), "--scope", "user:alice")
    assert [x["advice"] for x in alice] == [SEED[2]["advice"]]
    assert run_json("lessons", "list", "--db", str(db_path), "--status", "rejected") == []
    out = run("lessons", "list", "--db", str(db_path), "--status", "dead", code=1)
    assert "unknown status 'dead'" in out and "needs_review" in out


def test_changes_are_recorded_with_who_made_them(db_path: Path, seeded: dict[str, str]) -> None:
    db = str(db_path)
    lesson_id = seeded[SEED[0]["advice"]]
    run("lessons", "pin", lesson_id, "--db", db, "--by", "alice")
    assert run_json("lessons", "show", lesson_id, "--db", db)["pinned"] is True
    run("lessons", "unpin", lesson_id, "--db", db, env={"HINDSIGHT_USER": "bob"})
    edited = run_json(
        "lessons", "edit", lesson_id, "--db", db, "--by", "carol",
        "--advice", "Read CSV files with read_csv(path, encoding='utf-8-sig').",
        "--tool", "read_csv", "--tool", "open", "--scope", "project:billing", "--error-type", "UnicodeDecodeError",
    )  # fmt: skip
    assert edited["advice"] == "Read CSV files with read_csv(path, encoding='utf-8-sig')."
    assert (
        edited["features"]["tools"] == ["read_csv", "open"] and edited["scope"] == "project:billing"
    )
    assert edited["features"]["error_type"] == "UnicodeDecodeError"
    run("lessons", "reject", lesson_id, "--db", db, "--by", "dave", "--reason", "wrong for SAP")
    run("lessons", "confirm", lesson_id, "--db", db, "--by", "erin")
    history = run_json("lessons", "show", lesson_id, "--db", db)["history"]
    assert [(h["action"], h["by"]) for h in history[2:]] == [
        ("pin", "alice"), ("unpin", "bob"), ("edit", "carol"), ("reject", "dave"), ("confirm", "erin"),
    ]  # fmt: skip
    assert history[4]["changes"]["scope"] == {"from": "global", "to": "project:billing"}
    assert history[5]["reason"] == "wrong for SAP"
    assert all(h["at"].endswith("Z") for h in history)


def test_edit_errors_name_the_fix(db_path: Path, seeded: dict[str, str]) -> None:
    lesson_id = seeded[SEED[0]["advice"]]
    out = run("lessons", "edit", lesson_id, "--db", str(db_path), code=1)
    assert "nothing to change: pass --advice" in out
    out = run("lessons", "edit", lesson_id, "--db", str(db_path), "--scope", "org:x", code=1)
    assert "use 'global', 'project:NAME', 'user:NAME', 'agent:ROLE' or 'team:NAME'" in out
    out = run("lessons", "edit", lesson_id, "--db", str(db_path), "--valid-until", "soon", code=1)
    assert "ISO date" in out


def test_expire_by_id_and_when_due(db_path: Path, seeded: dict[str, str]) -> None:
    db = str(db_path)
    assert "name the lessons to expire, or pass --due" in run(
        "lessons", "expire", "--db", db, code=1
    )
    lesson_id = seeded[SEED[2]["advice"]]
    [expired] = run_json("lessons", "expire", lesson_id, "--db", db)
    assert expired["status"] == "expired" and expired["history"][-1]["action"] == "expire"
    assert run_json("lessons", "expire", "--due", "--db", db) == []
    # A lesson past its date is expired by --due; a pinned one never is.
    with Hindsight(db_path, background=False) as hs:
        for lesson in hs.store.list_lessons():
            if lesson.status == "active":
                lesson.valid_until = "2000-01-01T00:00:00.000Z"
                hs.save_lesson(lesson)
    due = run_json("lessons", "expire", "--due", "--db", db)
    assert [x["lesson_id"] for x in due] == [seeded[SEED[0]["advice"]]]
    statuses = {x["advice"]: x["status"] for x in run_json("lessons", "list", "--db", db)}
    assert statuses[SEED[3]["advice"]] == "active"  # pinned


def test_review_lists_conflicts_and_suspect_and_harmful(db_path: Path, tmp_path: Path) -> None:
    db = str(db_path)
    Hindsight(db_path, background=False).close()  # an empty store
    assert "Nothing needs review." in run("lessons", "review", "--db", db)
    rows = [
        {"task_type": "csv_cleaning", "advice": "Use utf-8-sig encoding when reading CSV files."},
        {
            "task_type": "csv_cleaning",
            "advice": "Do not use utf-8-sig encoding when reading CSV files.",
        },
    ]
    out = run_json("lessons", "import", str(write_lines(tmp_path / "c.jsonl", rows)), "--db", db)
    assert len(out["added"]) == 1 and len(out["conflicts"]) == 1
    [new_id], [old_id] = out["conflicts"], out["added"]
    queue = {x["lesson_id"]: x for x in run_json("lessons", "review", "--db", db)}
    assert queue[new_id]["reasons"] == [f"conflicts with {old_id}"]
    assert queue[new_id]["status"] == "needs_review"
    text = run("lessons", "review", "--db", db)
    assert f"vs {old_id} [active]" in text and "hindsight lessons reject ID" in text
    # Confirming the new one leaves both live: the CLI says how to settle it.
    out = run("lessons", "confirm", new_id, "--db", db)
    assert f"conflicts with {old_id} (active)" in out
    # Rejecting one side settles the conflict.
    run("lessons", "reject", old_id, "--db", db)
    assert "Nothing needs review." in run("lessons", "review", "--db", db)

    with Hindsight(db_path, background=False) as hs:
        lesson = hs.store.get_lesson(new_id)
        for _ in range(3):
            lesson = apply_outcome(lesson, succeeded=False)
        hs.save_lesson(lesson)
    [harmful] = run_json("lessons", "review", "--db", db)
    assert harmful["reasons"] == ["harmful: hurt 3 times, helped 0"]


def test_a_near_pair_the_rules_cannot_read_waits_and_a_person_merges_it(
    db_path: Path, tmp_path: Path
) -> None:
    db = str(db_path)
    rows = [
        {"task_type": "web", "advice": "fetch_url 连续两次超时就停止，并告诉用户。",
         "tools": ["fetch_url"]},
        # The same advice; the rules read no value or act both take the same way: it waits.
        # (The LIMIT pair once here is read now: a LIMIT both name, the purpose after "so".)
        {"task_type": "web", "advice": "如果 fetch_url 两次都超时，不要一直重试，直接告知用户。",
         "tools": ["fetch_url"]},
    ]  # fmt: skip
    out = run_json("lessons", "import", str(write_lines(tmp_path / "r.jsonl", rows)), "--db", db)
    [old_id], [new_id] = out["added"], out["conflicts"]
    queue = {x["lesson_id"]: x for x in run_json("lessons", "review", "--db", db)}
    assert queue[new_id]["reasons"] == [
        f"repeats or contradicts {old_id} (near text the rules cannot read)"
    ]
    assert "hindsight lessons merge ID --into OTHER" in run("lessons", "review", "--db", db)
    run("lessons", "merge", new_id, "--into", new_id, "--db", db, code=1)
    refused = run(
        "lessons", "merge", new_id, "--into", old_id, "--db", db, "--by", "curator", code=1
    )
    assert "--by names a person" in refused
    run("lessons", "merge", new_id, "--into", "les_nope", "--db", db, code=1)
    said = run("lessons", "merge", new_id, "--into", old_id, "--db", db, "--by", "alice")
    assert f"{old_id} now holds {new_id} (support 2)" in said
    assert "Nothing needs review." in run("lessons", "review", "--db", db)
    kept = run_json("lessons", "show", old_id, "--db", db)
    assert kept["advice"] == rows[0]["advice"] and kept["status"] == "active"
    assert kept["conflicts"] == [] and kept["history"][-1]["by"] == "alice"
    gone = run_json("lessons", "show", new_id, "--db", db)
    assert gone["status"] == "rejected" and gone["history"][-1]["reason"] == f"same as {old_id}"
    # The merged wording is now a variant of the kept lesson: the same text again lands there.
    again = write_lines(tmp_path / "again.jsonl", [rows[1]])
    out = run_json("lessons", "import", str(again), "--db", db)
    assert out["merged"] == [old_id]
    # ... as the same line imported again: no more support than it had.
    assert run_json("lessons", "show", old_id, "--db", db)["support"] == 2
    # Lessons of other task types are not one lesson.
    other = write_lines(
        tmp_path / "o.jsonl", [{"task_type": "email", "advice": "Check the To line."}]
    )
    [email_id] = run_json("lessons", "import", str(other), "--db", db)["added"]
    said = run("lessons", "merge", email_id, "--into", old_id, "--db", db, code=1)
    assert "other task types" in said


def test_a_lesson_that_hurts_five_tasks_leaves_recall_and_shows_in_review(
    db_path: Path, tmp_path: Path
) -> None:
    db = str(db_path)
    line = {"task_type": "csv_cleaning", "advice": "Use encoding='latin-1' when reading CSV files.",
            "tools": ["read_csv"]}  # fmt: skip
    [lesson_id] = run_json(
        "lessons", "import", str(write_lines(tmp_path / "l.jsonl", [line])), "--db", db
    )["added"]
    injected = []
    with Hindsight(db_path, background=False) as hs:
        for _ in range(5):
            with hs.task("csv_cleaning", goal="read the CSV file", tools=["read_csv"]) as task:
                injected.append([x.lesson_id for x in task.lessons] == [lesson_id])
                task.fail("garbled text")
            hs.drain()  # the task's outcome reaches its injected lessons
        found = hs.recall(task_type="csv_cleaning", tools=["read_csv"], query="read the CSV file")
    # Flagged after the third failure in a row: the next tasks no longer get it.
    assert injected == [True, True, True, False, False]
    assert found == []
    [flagged] = run_json("lessons", "review", "--db", db)
    assert flagged["lesson_id"] == lesson_id and flagged["status"] == "needs_review"
    assert flagged["reasons"][0].startswith("harmful")


def test_export_markdown_and_jsonl_and_import_them_back(
    db_path: Path, tmp_path: Path, seeded: dict[str, str]
) -> None:
    db = str(db_path)
    md = run("lessons", "export", "--db", db)
    assert md.startswith("# Lessons") and "## weather_query" in md and SEED[2]["advice"] in md
    out_file = tmp_path / "book.md"
    result = runner.invoke(
        app, ["lessons", "export", "--db", db, "--format", "md", "-o", str(out_file)]
    )
    assert result.exit_code == 0 and "wrote 3 lessons" in result.output
    assert out_file.read_text(encoding="utf-8") == md

    jsonl = tmp_path / "book.jsonl"
    run("lessons", "export", "--db", db, "--format", "jsonl", "--output", str(jsonl))
    assert len(jsonl.read_text(encoding="utf-8").splitlines()) == 3
    other_db = str(tmp_path / "other.db")
    out = run_json("lessons", "import", str(jsonl), "--db", other_db)
    assert len(out["restored"]) == 3
    before = run_json("lessons", "list", "--db", db)
    after = run_json("lessons", "list", "--db", other_db)
    assert sorted(before, key=lambda x: x["lesson_id"]) == sorted(
        after, key=lambda x: x["lesson_id"]
    )
    # Importing the export again changes nothing: the book's copies are kept.
    out = run_json("lessons", "import", str(jsonl), "--db", other_db)
    assert len(out["kept"]) == 3 and not out["restored"]
    assert len(run_json("lessons", "list", "--db", other_db)) == 3

    out = run("lessons", "export", "--db", db, "--format", "csv", code=1)
    assert "use --format md or --format jsonl" in out
    out = run("lessons", "export", "--db", db, "--status", "live", code=1)
    assert "unknown status 'live'" in out
    assert (
        len(run("lessons", "export", "--db", db, "-f", "jsonl", "--status", "active").splitlines())
        == 3
    )


def test_empty_book(db_path: Path) -> None:
    db = str(db_path)
    # A mistyped --db is an error that says how to fix it, not an empty book.
    assert "no store at" in run("lessons", "list", "--db", db, code=1)
    assert not db_path.exists()
    Hindsight(db_path, background=False).close()
    assert "No lessons yet" in run("lessons", "list", "--db", db)
    assert "No lessons match." in run("lessons", "list", "--db", db, "--status", "active")
    assert "_No lessons._" in run("lessons", "export", "--db", db)
    assert run("lessons", "export", "--db", db, "--format", "jsonl") == ""


CITY_ASK = "Ask the user which city before you call get_weather; do not assume a city."
CITY_ASSUME = (
    "When no city is given, call get_weather for Beijing right away without asking the user."
)


def _weather(advice: str) -> dict[str, object]:
    return {"task_type": "weather_query", "advice": advice, "tools": ["get_weather"]}


def test_an_old_export_never_writes_over_what_a_person_did_since(
    db_path: Path, tmp_path: Path, seeded: dict[str, str]
) -> None:
    db = str(db_path)
    jsonl = tmp_path / "book.jsonl"
    run("lessons", "export", "--db", db, "--format", "jsonl", "--output", str(jsonl))
    rejected, edited = seeded[SEED[0]["advice"]], seeded[SEED[3]["advice"]]
    run("lessons", "reject", rejected, "--db", db, "--by", "ana")
    run(
        "lessons", "edit", edited, "--db", db, "--by", "ana", "--advice", "Retry get_weather twice."
    )
    before = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}

    out = run("lessons", "import", str(jsonl), "--db", db)
    assert "3 line(s) name lessons the book holds" in out
    after = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}
    # Before, the export came back over the book: the rejected lesson was served again, the
    # edit and both history entries were gone.
    assert after == before
    assert after[rejected]["status"] == "rejected"
    assert after[edited]["advice"] == "Retry get_weather twice."
    assert [e["action"] for e in after[edited]["history"]][-1] == "edit"


def test_a_restored_lesson_that_contradicts_the_book_is_flagged_not_served_beside_it(
    db_path: Path, tmp_path: Path
) -> None:
    db, other_db = str(db_path), str(tmp_path / "other.db")
    run(
        "lessons",
        "import",
        str(write_lines(tmp_path / "a.jsonl", [_weather(CITY_ASK)])),
        "--db",
        db,
    )
    run(
        "lessons", "import", str(write_lines(tmp_path / "b.jsonl", [_weather(CITY_ASSUME)])),
        "--db", other_db,
    )  # fmt: skip
    jsonl = tmp_path / "other.jsonl"
    run("lessons", "export", "--db", other_db, "--format", "jsonl", "--output", str(jsonl))

    out = run_json("lessons", "import", str(jsonl), "--db", db)
    [restored] = out["conflicts"]
    book = {x["advice"]: x for x in run_json("lessons", "list", "--db", db)}
    ask, assume = book[CITY_ASK], book[CITY_ASSUME]
    # Kept as exported (its id, its status) and never merged; the pair recorded on both sides.
    assert assume["lesson_id"] == restored and assume["status"] == "active"
    assert ask["conflicts"] == [restored] and assume["conflicts"] == [ask["lesson_id"]]
    [queued] = [x for x in run_json("lessons", "review", "--db", db) if x["lesson_id"] == restored]
    assert queued["reasons"] == [f"conflicts with {ask['lesson_id']}"]
    with Hindsight(db_path, background=False) as hs:
        found = hs.recall(task_type="weather_query", tools=["get_weather"], query="weather today")
    assert len(found) == 1  # before: both, one telling the agent to ask and one not to


def test_a_revived_or_reworded_lesson_is_read_against_the_book(
    db_path: Path, tmp_path: Path
) -> None:
    db = str(db_path)
    out = run_json(
        "lessons", "import", str(write_lines(tmp_path / "a.jsonl", [_weather(CITY_ASK)])),
        "--db", db,
    )  # fmt: skip
    [ask] = out["added"]
    run("lessons", "reject", ask, "--db", db)
    # While it is rejected its opposite comes in: a dead lesson contradicts nothing.
    out = run_json(
        "lessons", "import", str(write_lines(tmp_path / "b.jsonl", [_weather(CITY_ASSUME)])),
        "--db", db,
    )  # fmt: skip
    [assume] = out["added"]

    out = run("lessons", "confirm", ask, "--db", db)
    assert f"conflicts with {assume} (active)" in out
    book = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}
    assert book[ask]["conflicts"] == [assume] and book[assume]["conflicts"] == [ask]
    with Hindsight(db_path, background=False) as hs:
        found = hs.recall(task_type="weather_query", tools=["get_weather"], query="weather today")
    assert len(found) == 1

    # A person rewording a lesson into the opposite of another: read again too.
    out = run_json(
        "lessons", "import",
        str(write_lines(tmp_path / "c.jsonl", [_weather("Retry get_weather once on timeout.")])),
        "--db", db,
    )  # fmt: skip
    [retry] = out["added"]
    out = run_json(
        "lessons", "import",
        str(write_lines(tmp_path / "d.jsonl", [_weather("Show the forecast in Celsius.")])),
        "--db", db,
    )  # fmt: skip
    [units] = out["added"]
    run("lessons", "edit", units, "--db", db, "--advice", "Never retry get_weather on timeout.")
    book = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}
    assert retry in book[units]["conflicts"] and units in book[retry]["conflicts"]


def _past_due(advice: str) -> dict[str, object]:
    return {**_weather(advice), "valid_until": "2020-01-01"}


def _served_together(db_path: Path, *ids: str) -> bool:
    with Hindsight(db_path, background=False) as hs:
        found = hs.recall(task_type="weather_query", tools=["get_weather"], query="weather today")
    return set(ids) <= {x.lesson_id for x in found}


def test_a_success_that_renews_a_past_due_lesson_reads_it_against_the_book(
    db_path: Path, tmp_path: Path
) -> None:
    db = str(db_path)
    [ask] = run_json(
        "lessons", "import", str(write_lines(tmp_path / "a.jsonl", [_past_due(CITY_ASK)])), "--db", db
    )["added"]  # fmt: skip
    [assume] = run_json(
        "lessons", "import", str(write_lines(tmp_path / "b.jsonl", [_weather(CITY_ASSUME)])), "--db", db
    )["added"]  # fmt: skip
    with Hindsight(db_path, background=False) as hs:
        with hs.task("weather_query", goal="weather in Paris") as task:
            task_id = task.task_id
            # Recalled for the task by a client (a rating counts only for such a lesson).
            hs.credit_lessons(task_id, [ask])
        # The client rates the lesson helpful: the success renews it for 30 days.
        assert hs.report_outcome(task_id, "succeeded", rated={ask: True}) == [ask]
        renewed = hs.lesson(ask)
        assert renewed is not None and renewed.is_live()
        assert renewed.conflicts == [assume]
    assert not _served_together(db_path, ask, assume)  # before: both served, nothing recorded


def test_a_repeat_or_a_person_merging_into_a_past_due_lesson_reads_it_against_the_book(
    db_path: Path, tmp_path: Path
) -> None:
    db = str(db_path)

    def add(name: str, line: dict[str, object]) -> str:
        out = run_json("lessons", "import", str(write_lines(tmp_path / name, [line])), "--db", db)
        [lesson_id] = out["added"] + out["merged"] + out["conflicts"]
        return lesson_id

    # A repeat of a past-due lesson renews it: the opposite that came meanwhile is recorded.
    ask = add("a.jsonl", _past_due(CITY_ASK))
    assume = add("b.jsonl", _weather(CITY_ASSUME))
    assert (
        add("c.jsonl", _weather("Before calling get_weather, ask which city the user means."))
        == ask
    )
    book = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}
    assert book[ask]["status"] == "active" and book[ask]["conflicts"] == [assume]
    assert not _served_together(db_path, ask, assume)  # before: both served, nothing recorded

    # A person merging a lesson into a past-due one renews it too.
    db = str(tmp_path / "second.db")
    held = add("d.jsonl", {**_weather("Confirm the user's city, then call get_weather."),
                           "status": "needs_review"})  # fmt: skip
    ask = add("e.jsonl", _past_due(CITY_ASK))
    assume = add("f.jsonl", _weather(CITY_ASSUME))
    run("lessons", "merge", held, "--into", ask, "--db", db)
    book = {x["lesson_id"]: x for x in run_json("lessons", "list", "--db", db)}
    assert book[ask]["status"] == "active" and assume in book[ask]["conflicts"]
    assert ask in book[assume]["conflicts"]


def test_a_teammates_export_of_advice_a_person_rejected_is_not_served_again(
    db_path: Path, tmp_path: Path
) -> None:
    db, mate = str(db_path), str(tmp_path / "mate.db")
    retry = {"task_type": "scrape", "advice": "Retry fetch_page immediately when it returns 503.",
             "tools": ["fetch_page"]}  # fmt: skip
    [mine] = run_json(
        "lessons", "import", str(write_lines(tmp_path / "a.jsonl", [retry])), "--db", db
    )["added"]
    run("lessons", "reject", mine, "--db", db, "--by", "ann", "--reason", "hammers the site")
    run("lessons", "import", str(write_lines(tmp_path / "b.jsonl", [retry])), "--db", mate)
    exported = tmp_path / "mate.jsonl"
    run("lessons", "export", "--db", mate, "--format", "jsonl", "--output", str(exported))

    out = run_json("lessons", "import", str(exported), "--db", db)
    # Before: restored as a live lesson of its own id, the rejected advice served again.
    assert out["merged"] == [mine] and not out["restored"]
    book = run_json("lessons", "list", "--db", db)
    assert [(x["lesson_id"], x["status"]) for x in book] == [(mine, "rejected")]
    with Hindsight(db_path, background=False) as hs:
        assert (
            hs.recall(task_type="scrape", tools=["fetch_page"], query="503 from fetch_page") == []
        )


def test_a_conflict_a_person_settles_by_rewording_is_cleared(db_path: Path, tmp_path: Path) -> None:
    """A person reworded one lesson of a conflicting pair so the two agree: the pair stayed
    recorded, and recall kept serving one of two lessons that agree. It is read again now."""
    db = str(db_path)
    rows = [_weather("Ask the user which city they mean before you call get_weather."),
            _weather("Never ask the user which city they mean before you call get_weather.")]  # fmt: skip
    out = run_json("lessons", "import", str(write_lines(tmp_path / "c.jsonl", rows)), "--db", db)
    [ask_id], [never_id] = out["added"], out["conflicts"]
    reworded = "Ask the user which city they mean, and the units, before you call get_weather."
    run("lessons", "edit", never_id, "--advice", reworded, "--db", db, "--by", "alice")
    ask, never = (run_json("lessons", "show", x, "--db", db) for x in (ask_id, never_id))
    assert ask["conflicts"] == [] and never["conflicts"] == []
    assert never["history"][-1]["action"] == "conflict_cleared"
    assert never["history"][-1]["by"] == "alice"
    run("lessons", "confirm", never_id, "--db", db, "--by", "alice")
    with Hindsight(db_path, background=False) as hs:
        served = hs.recall(
            task_type="weather_query",
            tools=["get_weather"],
            query="ask the user which city they mean before get_weather",
        )
        assert sorted(served.ids) == sorted([ask_id, never_id])
    # A rewording that still contradicts keeps the pair.
    again = "Do not ask the user which city or units they mean before you call get_weather."
    run("lessons", "edit", never_id, "--advice", again, "--db", db, "--by", "alice")
    assert run_json("lessons", "show", ask_id, "--db", db)["conflicts"] == [never_id]
