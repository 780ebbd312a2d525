"""``hindsight mcp serve`` driven by a real MCP client: the whole loop over the protocol."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from test_mcp_http import authorized
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app
from hindsight_loop.mcp.server import build_server

pytestmark = pytest.mark.anyio

CLI = "from hindsight_loop.cli import main; main()"
TOKEN = "test-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _serve(db: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-c", CLI, "mcp", "serve", "--db", str(db)]
    )


def _data(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


# A run that fails to read a GBK file as UTF-8 twice, then succeeds with gbk: a lesson to learn.
TRAJECTORY: list[dict[str, Any]] = [
    {
        "type": "task_start",
        "task_type": "csv_cleaning",
        "goal": "清洗 sales_2024.csv 并汇总",
        "tools": ["read_csv", "write_csv"],
    },
    {"type": "user_input", "input": {"text": "请清洗销售数据"}},
    {
        "type": "action_executed",
        "input": {"tool": "read_csv", "args": {"path": "sales_2024.csv", "encoding": "utf-8"}},
        "result": {
            "status": "failed",
            "error_type": "UnicodeDecodeError",
            "error_message": "'utf-8' codec can't decode byte 0xed in position 12",
        },
    },
    {
        "type": "action_executed",
        "input": {"tool": "read_csv", "args": {"path": "sales_2024.csv", "encoding": "utf-8"}},
        "result": {
            "status": "failed",
            "error_type": "UnicodeDecodeError",
            "error_message": "'utf-8' codec can't decode byte 0xed in position 12",
        },
    },
    {
        "type": "action_executed",
        "input": {"tool": "read_csv", "args": {"path": "sales_2024.csv", "encoding": "gbk"}},
        "result": {"status": "succeeded", "output": "1200 rows"},
    },
]


async def test_record_reflect_recall_over_the_protocol(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    async with Client(_serve(db)) as client:
        assert client.server_info is not None and client.server_info.name == "hindsight"
        assert client.instructions and "recall_lessons" in client.instructions
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert sorted(tools) == ["recall_lessons", "record_event", "reflect_task", "report_outcome"]
        for tool in tools.values():  # written for a model: a description and described arguments
            assert tool.description and len(tool.description) > 60
            for prop in tool.input_schema["properties"].values():
                assert prop.get("description")

        assert (
            _data(await client.call_tool("recall_lessons", {"task_type": "csv_cleaning"}))[
                "lessons"
            ]
            == []
        )

        recorded = _data(await client.call_tool("record_event", {"events": TRAJECTORY}))
        task_id = recorded["task_id"]
        assert recorded["recorded"] == len(TRAJECTORY) and recorded["task_ids"] == [task_id]

        ended = _data(
            await client.call_tool(
                "report_outcome",
                {"task_id": task_id, "status": "failed", "summary": "两次编码错误后才读出文件"},
            )
        )
        assert ended["status"] == "failed"

        review = _data(await client.call_tool("reflect_task", {"task_id": task_id}))
        assert review["status"] == "ok" and review["lessons"]
        assert "gbk" in review["root_cause"]
        lesson_ids = {x["lesson_id"] for x in review["lessons"]}

        recall = _data(
            await client.call_tool(
                "recall_lessons",
                {
                    "task_type": "csv_cleaning",
                    "tools": ["read_csv"],
                    "query": "读取 csv 文件时编码错误 UnicodeDecodeError",
                },
            )
        )
        assert recall["lessons"] and recall["lessons"][0]["lesson_id"] in lesson_ids
        assert "gbk" in recall["advice"] and "read_csv" in recall["lessons"][0]["tools"]

    with Hindsight(db, background=False) as hs:
        task = hs.store.get_task(task_id)
        assert task is not None and task.status == "failed" and task.task_type == "csv_cleaning"
        assert [e.type for e in hs.store.events(task_id)] == [
            "task_start",
            "user_input",
            "action_executed",
            "action_executed",
            "action_executed",
            "task_end",
        ]


async def test_outcome_feedback_reaches_the_lessons(tmp_path: Path) -> None:
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        async with Client(build_server(hs)) as client:
            first = _data(await client.call_tool("record_event", {"events": TRAJECTORY}))
            await client.call_tool(
                "report_outcome", {"task_id": first["task_id"], "status": "failed"}
            )
            [lesson] = _data(await client.call_tool("reflect_task", {"task_id": first["task_id"]}))[
                "lessons"
            ]

            # A second run recalls the lesson with its task id (credited automatically) ...
            start = {
                "type": "task_start",
                "task_id": "tsk_second",
                "task_type": "csv_cleaning",
                "goal": "again",
            }
            recall = _data(
                await client.call_tool(
                    "recall_lessons",
                    {
                        "task_type": "csv_cleaning",
                        "tools": ["read_csv"],
                        "query": "encoding",
                        "task_id": "tsk_second",
                    },
                )
            )
            assert [x["lesson_id"] for x in recall["lessons"]] == [lesson["lesson_id"]]
            assert _data(await client.call_tool("record_event", {"event": start}))["task_ids"] == [
                "tsk_second"
            ]
            task = hs.store.get_task("tsk_second")
            assert task is not None and task.injected_lesson_ids == [lesson["lesson_id"]]

            # ... and the model says explicitly that it helped: counted once, not twice.
            done = _data(
                await client.call_tool(
                    "report_outcome",
                    {
                        "task_id": "tsk_second",
                        "status": "succeeded",
                        "helpful_lesson_ids": [lesson["lesson_id"]],
                    },
                )
            )
            assert done["lessons_updated"] == [lesson["lesson_id"]]
        hs.drain()
        stored = hs.store.get_lesson(lesson["lesson_id"])
        assert stored is not None and (stored.helpful, stored.harmful) == (1, 0)


async def test_mistakes_come_back_as_tool_errors_with_the_fix(tmp_path: Path) -> None:
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        async with Client(build_server(hs)) as client:
            cases: list[tuple[dict[str, Any], str, str]] = [
                ({"event": {"type": "action_executed"}}, "record_event", "task_start"),
                ({}, "record_event", "exactly one"),
                ({"event": {"type": "nap", "task_id": "t"}}, "record_event", "unknown event type"),
                ({"task_id": "tsk_nope", "status": "failed"}, "report_outcome", "record_event"),
                ({"task_id": "tsk_nope"}, "reflect_task", "record it first"),
            ]
            for args, tool, fragment in cases:
                result = await client.call_tool(tool, args)
                assert result.is_error, (tool, args)
                text = result.content[0].text  # type: ignore[union-attr]
                assert fragment in text, text
            assert hs.store.list_tasks() == []


async def test_serve_over_streamable_http_both_eras(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "mcp",
            "serve",
            "--transport",
            "http",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "m.db"),
            "--token",
            TOKEN,
        ],
        stderr=subprocess.PIPE,
    )
    try:
        import anyio

        with anyio.fail_after(60):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    await anyio.sleep(0.05)
        for mode in ("legacy", "auto"):
            async with authorized(f"http://127.0.0.1:{port}/mcp", TOKEN, mode=mode) as client:
                recorded = _data(await client.call_tool("record_event", {"events": TRAJECTORY}))
                assert recorded["recorded"] == len(TRAJECTORY)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert f"http://127.0.0.1:{port}/mcp" in err and "Traceback" not in err
    with Hindsight(tmp_path / "m.db", background=False) as hs:
        assert len(hs.store.list_tasks()) == 2


def test_cli_help_for_every_mcp_command() -> None:
    runner = CliRunner()
    for args, fragment in [
        (["mcp", "--help"], "proxy"),
        (["mcp", "proxy", "--help"], "--advise"),
        (["mcp", "serve", "--help"], "recall_lessons"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert fragment in result.output


def test_missing_sdk_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "try:\n    import hindsight_loop.mcp\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'hindsight-loop[mcp]'" in out
