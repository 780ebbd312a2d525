"""A lesson's words (advice, root cause, general rule, suggestions) never hold a character that
hides or reorders text: a person's edit or import holding one is refused with the same message
on every way in (library, CLI, HTTP), the reflectors' words are cleared of them, and Chinese,
right-to-left text, joiners, tabs and newlines stay as written."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client
from typer.testing import CliRunner

from hindsight_loop import Features, Hindsight, LessonDraft
from hindsight_loop.cli import app
from hindsight_loop.lessons import edit, export_jsonl, parse_import_line
from hindsight_loop.mcp.server import build_server
from hindsight_loop.models import Lesson, check_lesson_text

TOKEN = "test-token-not-secret"
HINDSIGHT = str(Path(sys.executable).with_name("hindsight"))
runner = CliRunner()

#: Advice with a character that hides or reorders text, and the code point the refusal names.
HIDDEN = [
    ("Read the file \x00 with gbk.", "U+0000 (a control character)"),
    ("Use encoding='\u202egbk' for these files.", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("Call \u2066read_csv\u2069 with sep=';'.", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("Read with gbk.\U000e0049\U000e0047\U000e004e", "U+E0049 TAG LATIN CAPITAL LETTER I"),
    ("Colour \x1b[31mred\x1b[0m means a failed read.", "U+001B (a control character)"),
    ("Next line\x85 then gbk.", "U+0085 (a control character)"),
    ("Half a pair \ud800 of surrogates.", "U+D800 (a lone surrogate)"),
]
#: Text that must stay as written.
WRITTEN = [
    "读取 GBK 编码的文件时，请使用 encoding='gbk'。\n\t然后检查列名。",
    "Read the file with gbk.\r\nThen check the column names.",
    "فایل‌ها را با gbk بخوانید.",  # Persian: a zero-width non-joiner
    "קרא את הקובץ עם \u200fgbk.",  # Hebrew with a right-to-left mark
    "Done 👩\u200d💻 when the columns line up.",
]


def _lesson() -> Lesson:
    return Lesson(
        lesson_id="les_text",
        task_type="csv_cleaning",
        advice="Read files from the old ERP with encoding='gbk'.",
        created_at="2026-01-01T00:00:00.000Z",
        valid_until="2099-01-01T00:00:00.000Z",
    )


def _refusal(fn: Any) -> str:
    with pytest.raises(ValueError) as caught:
        fn()
    return str(caught.value)


def _import(db: Path, tmp_path: Path, rows: list[dict[str, Any]]) -> Any:
    path = tmp_path / "lessons.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return runner.invoke(app, ["lessons", "import", str(path), "--db", str(db), "--json"])


@pytest.mark.parametrize(("advice", "named"), HIDDEN)
def test_every_way_in_refuses_the_same_hidden_character(
    advice: str, named: str, db_path: Path, tmp_path: Path
) -> None:
    lesson = _lesson()
    said = _refusal(lambda: edit(lesson, by="ana", advice=advice))
    assert said.startswith(f"'advice' holds {named} at character ")
    assert "remove it" in said
    hand_written = {"task_type": "csv_cleaning", "advice": advice}
    assert _refusal(lambda: parse_import_line(hand_written)) == said
    exported = {**lesson.to_dict(), "advice": advice}
    assert _refusal(lambda: parse_import_line(exported)) == said
    draft = LessonDraft(task_type="csv_cleaning", advice=advice)
    with Hindsight(db_path, background=False) as hs:
        assert _refusal(lambda: hs.add_lesson(draft)) == said  # the API, as the CLI
        assert _refusal(lambda: hs.curate(draft)) == said
        assert hs.lessons() == []
    if named != "U+D800 (a lone surrogate)":  # no UTF-8 file can hold one
        result = _import(db_path, tmp_path, [hand_written])
        assert result.exit_code != 0 and said in result.output
        with Hindsight(db_path, background=False) as hs:
            assert hs.lessons() == []  # nothing imported


def test_the_other_words_of_a_lesson_are_checked_too() -> None:
    lesson = _lesson()
    bad = "Because the \u202efile was GBK."
    for name in ("root_cause", "general_rule"):
        said = _refusal(lambda name=name: edit(lesson, by="ana", **{name: bad}))
        assert said.startswith(f"'{name}' holds U+202E"), said
    said = _refusal(lambda: edit(lesson, by="ana", suggestions=["Check first.", bad]))
    assert said.startswith("'suggestions' item 2 holds U+202E"), said
    line = {"task_type": "csv_cleaning", "advice": "Use gbk.", "suggestions": ["ok", bad]}
    assert _refusal(lambda: parse_import_line(line)) == said


def test_a_lone_surrogate_in_a_lessons_names_is_a_clear_error(db_path: Path) -> None:
    # Before: a TypeError from deep inside the store's save.
    draft = LessonDraft(
        task_type="csv_cleaning", advice="Use gbk.", features=Features(tools=["read\udce9csv"])
    )
    with Hindsight(db_path, background=False) as hs:
        said = _refusal(lambda: hs.add_lesson(draft))
        assert "lone surrogate" in said and "read\\udce9csv" in said
        assert hs.lessons() == []


@pytest.mark.parametrize("advice", WRITTEN)
def test_text_as_people_write_it_is_kept(advice: str, db_path: Path, tmp_path: Path) -> None:
    assert edit(_lesson(), by="ana", advice=advice).advice == advice.strip()
    result = _import(db_path, tmp_path, [{"task_type": "csv_cleaning", "advice": advice}])
    assert result.exit_code == 0, result.output
    with Hindsight(db_path, background=False) as hs:
        assert [x.advice for x in hs.lessons()] == [advice.strip()]


@pytest.fixture
def served(tmp_path: Path, http_process: Any) -> Any:
    pytest.importorskip("starlette")
    pytest.importorskip("jinja2")
    db = tmp_path / "serve.db"
    with Hindsight(db, background=False) as hs:
        hs.save_lesson(_lesson())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HINDSIGHT_TOKEN": TOKEN}
    http_process(HINDSIGHT, ["serve", "--db", str(db), "--port", str(port)], port, env=env)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=headers) as agent:
        yield agent


def test_http_edit_refuses_hidden_characters_and_keeps_written_text(served: Any) -> None:
    agent = served
    before = agent.get("/api/lessons/les_text").json()
    for advice, _ in HIDDEN[:-1]:  # a lone surrogate is refused by the JSON reader already
        said = _refusal(lambda advice=advice: edit(_lesson(), by="ana", advice=advice))
        answer = agent.post(
            "/api/lessons/les_text/edit", json={"by": "ana", "changes": {"advice": advice}}
        )
        assert answer.status_code == 400, answer.text
        assert said in answer.json()["error"]
    assert agent.get("/api/lessons/les_text").json() == before
    for advice in WRITTEN:
        answer = agent.post(
            "/api/lessons/les_text/edit", json={"by": "ana", "changes": {"advice": advice}}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["advice"] == advice.strip()


# A run whose own text carries the characters: the reflector's lesson quotes its error type.
SMUGGLED = "Encoding\u202eError\U000e0049\U000e0047\x00"
RUN: list[dict[str, Any]] = [
    {"type": "task_start", "task_type": "csv_cleaning", "goal": "clean", "tools": ["read_csv"]},
    *[
        {
            "type": "action_executed",
            "input": {"tool": "read_csv", "args": {"path": "sales.csv"}},
            "result": {
                "status": "failed",
                "error_type": SMUGGLED,
                "error_message": "can't \u202edecode\x1b[0m byte 0xed",
            },
        }
        for _ in range(3)
    ],
    {"type": "task_end", "result": {"status": "failed"}},
]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_lessons_reflected_over_mcp_hold_none_and_import_back(
    tmp_path: Path, anyio_backend: str
) -> None:
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        async with Client(build_server(hs)) as client:
            recorded = await client.call_tool("record_event", {"events": RUN})
            assert not recorded.is_error
            task_id = recorded.structured_content["task_id"]  # type: ignore[index]
            reflected = await client.call_tool("reflect_task", {"task_id": task_id})
            assert not reflected.is_error
        lessons = hs.lessons()
        assert lessons
        for lesson in lessons:
            for text in [
                lesson.advice,
                lesson.root_cause,
                lesson.general_rule,
                *lesson.suggestions,
            ]:
                check_lesson_text("a reflected lesson", text)
        exported = tmp_path / "book.jsonl"
        exported.write_text(export_jsonl(lessons), encoding="utf-8")
    result = runner.invoke(
        app, ["lessons", "import", str(exported), "--db", str(tmp_path / "b.db"), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(orjson.loads(result.output)["restored"]) == len(lessons)
