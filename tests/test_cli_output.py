"""The CLI prints recorded text safely: never as rich markup, never a control character raw.

Goals, arguments, error messages and advice come from agents and models. They are recorded here
through the real library, full of markup, escape sequences and bidi overrides, and every read
command must show them literally, exit 0, and write nothing a terminal would act on.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import orjson
import pytest
from click.testing import Result
from typer.testing import CliRunner

from hindsight_loop import Features, Hindsight, LessonDraft
from hindsight_loop.cli import app
from hindsight_loop.cli.common import clean
from hindsight_loop.lessons import draft_to_lesson
from hindsight_loop.llm import LLMError
from hindsight_loop.llm.reflector import LLMReflector, RetryPolicy
from hindsight_loop.testing.llm import ScriptedLLM

runner = CliRunner()

MARKUP = "[/a-z]+ [bold red]x[/] [link=file:///etc/passwd]y[/link]"
CHINESE = "清洗销售数据"
NASTY = (
    f"{CHINESE} {MARKUP} \x1b[31mred\x1b[0m \x1b]8;;http://x\x07link\x1b]8;;\x07 a\rb\x00c"
    f" \u202eevil\u202c tab\there \x85\u2028\x7f \U000e0001 \\"
)
# What must show literally, whatever the terminal width (none of them holds a space).
VISIBLE = ("[/a-z]+", "[/]", "[link=file:///etc/passwd]y[/link]", CHINESE)


def _assert_safe(text: str) -> None:
    bad = [
        (i, hex(ord(c)))
        for i, c in enumerate(text)
        if c != "\n" and unicodedata.category(c) in {"Cc", "Cf", "Cs", "Zl", "Zp"}
    ]
    assert not bad, f"control characters printed: {bad[:10]}\n{text}"


def _run(*args: str) -> Result:
    # No FORCE_COLOR: a forced terminal would add the CLI's own colour codes.
    # Wide enough for what each test reads, however long ids grow in a long test session.
    result = runner.invoke(app, list(args), env={"FORCE_COLOR": None, "COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    _assert_safe(result.stdout)
    _assert_safe(result.stderr)
    return result


@pytest.fixture
def nasty_db(db_path: Path, tmp_path: Path) -> dict[str, str]:
    """A store with a task, reviews and lessons all full of NASTY text; names -> ids."""
    with Hindsight(db_path, background=False) as hs:
        with hs.task("t", goal=NASTY, tools=["tool"]) as t:
            t.record_action(
                "tool", {"pattern": NASTY}, status="failed", error_type="E", error_message=NASTY
            )
            t.record_action("tool", {"pattern": "ok"}, output=NASTY)
        hs.drain()
        task_id = t.task_id
        offline = hs.reflect(task_id, reflector=hs.offline_reflector)
        # A model that fails with a nasty message, and one that answers nasty text.
        retry = RetryPolicy(attempts=1, parse_retries=0)
        failing = LLMReflector(ScriptedLLM([LLMError(NASTY)]), retry=retry)
        hs.reflect(task_id, reflector=failing)
        hs.reflect(task_id, reflector=LLMReflector(ScriptedLLM([NASTY]), retry=retry))
    # Another task type, so that curation does not merge it into the review's lesson.
    line = {"task_type": "u", "advice": NASTY, "tools": ["tool"], "keywords": [MARKUP]}
    (tmp_path / "nasty.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    # An import refuses such advice now, saying where (and printing nothing raw) ...
    refused = runner.invoke(
        app,
        ["lessons", "import", str(tmp_path / "nasty.jsonl"), "--db", str(db_path)],
        env={"FORCE_COLOR": None, "COLUMNS": "160"},
    )
    assert refused.exit_code == 1 and "U+001B" in refused.output
    _assert_safe(refused.output)
    # ... but a book an older version wrote may hold it: it must show literally too.
    with Hindsight(db_path, background=False) as hs:
        draft = LessonDraft(
            task_type="u", advice=NASTY, features=Features(tools=["tool"], keywords=[MARKUP])
        )
        # ``add_lesson`` refuses it too (``lessons.check_words``): stored as an older one was.
        with pytest.raises(ValueError, match="U\\+001B"):
            hs.add_lesson(draft)
        lesson = draft_to_lesson(draft)
        hs.save_lesson(lesson)
        lesson_id = lesson.lesson_id
    return {"task": task_id, "lesson": lesson_id, "offline": offline.reflection_id}


def test_clean_makes_controls_visible_and_keeps_the_rest() -> None:
    assert clean("a\x1b[31mb\x00\r\x07") == "a␛[31mb␀␍␇"
    assert clean("\u202eabc\x85") == "\\u202eabc\\x85"
    assert clean("one\ntwo") == "one␊two" and clean("x\ty") == "x   y"
    assert clean("one\r\ntwo\n", multiline=True) == "one\ntwo\n"
    assert clean(f"{MARKUP} {CHINESE}\u3000") == f"{MARKUP} {CHINESE}\u3000"
    _assert_safe(clean(NASTY))
    _assert_safe(clean(NASTY, multiline=True))


def test_tasks_and_replay_show_nasty_text_literally(
    db_path: Path, nasty_db: dict[str, str]
) -> None:
    db = str(db_path)
    listed = _run("tasks", "--db", db).stdout
    assert nasty_db["task"] in listed and "[/a-z]+" in listed
    replayed = _run("replay", nasty_db["task"], "--db", db).stdout
    for text in VISIBLE:
        assert text in replayed
    assert "␛[31mred" in replayed and "key nodes" in replayed
    _run("replay", nasty_db["task"], "--no-steps", "--db", db)


def test_reflections_and_reflect_show_nasty_errors_literally(
    db_path: Path, nasty_db: dict[str, str]
) -> None:
    db = str(db_path)
    listed = _run("reflections", "--db", db).stdout
    assert nasty_db["offline"] in listed and "failed" in listed
    assert "[/a-z]+" in listed  # the failed review's error, from the model's message
    _run("reflections", nasty_db["task"], "--db", db)
    reflected = _run("reflect", nasty_db["task"], "--offline", "--db", db).stdout
    assert "reflection" in reflected


def test_lessons_commands_show_nasty_advice_literally(
    db_path: Path, nasty_db: dict[str, str]
) -> None:
    db = str(db_path)
    listed = _run("lessons", "list", "--db", db).stdout
    assert nasty_db["lesson"] in listed and "[/a-z]+" in listed and CHINESE in listed
    shown = _run("lessons", "show", nasty_db["lesson"], "--db", db).stdout
    for text in VISIBLE:
        assert text in shown
    assert "history" in shown
    for lesson in orjson.loads(_run("lessons", "list", "--db", db, "--json").stdout):
        _run("lessons", "show", lesson["lesson_id"], "--db", db)
    _run("lessons", "review", "--db", db)
    recalled = _run("recall", "--task-type", "u", "--tool", "tool", "--db", db).stdout
    assert nasty_db["lesson"] in recalled
    prompt = _run("recall", "--task-type", "u", "--tool", "tool", "--prompt", "--db", db).stdout
    assert "[/a-z]+" in prompt and CHINESE in prompt


def test_json_output_stays_exact(db_path: Path, nasty_db: dict[str, str]) -> None:
    db = str(db_path)
    [task] = orjson.loads(_run("tasks", "--db", db, "--json").stdout)
    assert task["goal"] == NASTY
    lesson = orjson.loads(_run("lessons", "show", nasty_db["lesson"], "--db", db, "--json").stdout)
    assert lesson["advice"] == NASTY
    chronicle = orjson.loads(_run("replay", nasty_db["task"], "--db", db, "--json").stdout)
    assert chronicle["task"]["goal"] == NASTY
    for command in (["reflections"], ["lessons", "list"], ["lessons", "review"]):
        orjson.loads(_run(*command, "--db", db, "--json").stdout)


def test_errors_go_to_stderr_with_the_fix_and_stay_safe(db_path: Path) -> None:
    with Hindsight(db_path, background=False) as hs, hs.task("t", goal="g") as t:
        t.record_action("tool", {})
    result = runner.invoke(app, ["replay", f"tsk_{NASTY}", "--db", str(db_path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: no task") and "hindsight tasks" in result.stderr
    _assert_safe(result.stderr)


def test_import_reports_nasty_problems_on_stderr(db_path: Path, tmp_path: Path) -> None:
    events = [
        {"type": "task_start", "task_id": "tsk_n", "task_type": "t", "goal": NASTY},
        {"type": NASTY, "task_id": "tsk_n"},
        {"type": "task_end", "task_id": "tsk_n", "result": {"status": "failed"}},
    ]
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    result = runner.invoke(
        app, ["import", str(path), "--db", str(db_path)], env={"FORCE_COLOR": None}
    )
    assert result.exit_code == 1  # a refused line is reported, and so is the exit code
    assert "Traceback" not in result.output
    _assert_safe(result.stdout)
    _assert_safe(result.stderr)
    assert "imported 2 events" in result.stdout
    assert "skipped" in result.stderr and "[/a-z]+" in result.stderr
    assert "[/a-z]+" in _run("tasks", "--db", str(db_path)).stdout
