"""Direct vs through the gateway, against the reference ``@modelcontextprotocol/server-everything``.

The server comes from npm (``scripts/setup-mcp-npm.sh`` installs it into ``.mcp-servers/``); it
speaks the 2025 era on the TypeScript SDK, so it answers differently from the Python servers in
``test_mcp_gateway.py`` (unknown tools as ``isError`` results, results without ``isError``).
Each test makes the same calls directly and through ``hindsight mcp proxy`` (a subprocess over
stdio, as an MCP client launches it) and compares what the client sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client, StdioServerParameters

from hindsight_loop import Hindsight
from hindsight_loop.models import Event

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup-mcp-npm.sh"
# The SDK starts a stdio server with only a few environment variables (no PYTHONPATH), so the
# gateway would run the installed package; the checkout's own code is what is under test.
CLI = f"import sys; sys.path.insert(0, {str(REPO / 'src')!r}); from hindsight_loop.cli import main; main()"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def everything() -> str:
    """``mcp-server-everything`` from npm; skipped only when the npm registry is unreachable."""
    proc = subprocess.run(
        ["bash", str(SETUP)], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode == 0:
        return proc.stdout.strip().splitlines()[-1]
    probe = subprocess.run(
        ["npm", "ping"], capture_output=True, text=True, timeout=120, check=False
    )
    if probe.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(
            "the npm registry is unreachable, so @modelcontextprotocol/server-everything cannot "
            f"be installed by scripts/setup-mcp-npm.sh: {probe.stderr.strip()[-300:]}"
        )
    pytest.fail(f"scripts/setup-mcp-npm.sh failed:\n{proc.stderr[-2000:]}")


def _direct(exe: str) -> StdioServerParameters:
    return StdioServerParameters(command=exe, args=["stdio"])


def _gateway(config: Path, db: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-c", CLI, "mcp", "proxy", "--config", str(config), "--db", str(db)],
    )


def _config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_bytes(orjson.dumps({"mcpServers": servers}))
    return path


def _wire(result: Any, *, era_stamps: bool) -> dict[str, Any]:
    """What was on the wire: the fields the sender set (a default never sent stays out).

    ``era_stamps`` drops what a 2026-era session adds to every result (``resultType`` and the
    ``serverInfo`` stamp) when comparing with a 2025-era server.
    """
    data = result.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if era_stamps:
        data.pop("resultType", None)
        meta = {k: v for k, v in (data.pop("_meta", None) or {}).items() if k != SERVER_INFO}
        if meta:
            data["_meta"] = meta
    return data


def _tasks(db: Path) -> list[tuple[Any, list[Event]]]:
    with Hindsight(db, background=False) as hs:
        tasks = sorted(hs.store.list_tasks(), key=lambda t: t.started_at)
        return [(t, hs.store.events(t.task_id)) for t in tasks]


def _actions(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "action_executed"]


LONG = "trigger-long-running-operation"


async def _drive(client: Client) -> dict[str, Any]:
    """Calls whose answers must not change through the gateway, and the progress they report."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    era = client.protocol_version != "2025-11-25"
    seen: dict[str, Any] = {}
    long = await client.call_tool(
        LONG, {"duration": 0.3, "steps": 3}, progress_callback=on_progress
    )
    seen["long"] = _wire(long, era_stamps=era)
    seen["progress"] = progress
    seen["echo"] = _wire(await client.call_tool("echo", {"message": "hi"}), era_stamps=era)
    seen["sum"] = _wire(await client.call_tool("get-sum", {"a": 1, "b": 2}), era_stamps=era)
    seen["unknown"] = _wire(await client.call_tool("no-such-tool", {}), era_stamps=era)
    return seen


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_results_and_progress_are_the_servers_own(
    everything: str, tmp_path: Path, mode: str
) -> None:
    async with Client(_direct(everything)) as client:
        assert client.protocol_version == "2025-11-25"
        expected = await _drive(client)
    assert expected["progress"] == [(1.0, 3.0, None), (2.0, 3.0, None), (3.0, 3.0, None)]
    assert "isError" not in expected["echo"]  # this server leaves it out on success
    assert expected["unknown"]["isError"] is True  # and answers an unknown tool with a result

    config = _config(
        tmp_path / "s.json", {"everything": {"command": everything, "args": ["stdio"]}}
    )
    db = tmp_path / "g.db"
    async with Client(_gateway(config, db), mode=mode) as client:
        through = await _drive(client)
    # Progress notifications reach the client, and results carry exactly the server's fields.
    assert through == expected

    [(task, events)] = _tasks(db)
    actions = _actions(events)
    assert [e.input["tool"] for e in actions] == [LONG, "echo", "get-sum", "no-such-tool"]  # type: ignore[index]
    assert [e.result.get("error_type") for e in actions] == [None, None, None, "unknown_tool"]  # type: ignore[union-attr]


FAKE_SERVER = textwrap.dedent(
    '''
    """A second upstream (Python SDK): its unknown-tool answer is a protocol error."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("fake")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    server.run()
    '''
)


async def test_an_unknown_tool_with_two_upstreams_gets_a_servers_own_answer(
    everything: str, tmp_path: Path
) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_SERVER)
    async with Client(_direct(everything)) as client:
        expected = _wire(await client.call_tool("no-such-tool", {"x": 1}), era_stamps=True)
    servers = {
        "everything": {"command": everything, "args": ["stdio"]},
        "fake": {"command": sys.executable, "args": [str(fake)]},
    }
    db = tmp_path / "g.db"
    async with Client(_gateway(_config(tmp_path / "s.json", servers), db)) as client:
        unknown = await client.call_tool("no-such-tool", {"x": 1})
        shouted = await client.call_tool("shout", {"text": "hi"})
    # The answer a single server gives (here the first upstream's isError result), not the
    # gateway's own protocol error.
    assert _wire(unknown, era_stamps=True) == expected
    assert shouted.content[0].text == "HI"  # type: ignore[union-attr]
    [(_, events)] = _tasks(db)
    first, second = _actions(events)
    assert (first.input["server"], first.result["error_type"]) == ("everything", "unknown_tool")  # type: ignore[index]
    assert second.input["server"] == "fake" and not second.failed  # type: ignore[index]


async def test_a_call_the_client_cancelled_is_recorded(everything: str, tmp_path: Path) -> None:
    config = _config(
        tmp_path / "s.json", {"everything": {"command": everything, "args": ["stdio"]}}
    )
    db = tmp_path / "g.db"
    async with Client(_gateway(config, db)) as client:
        with anyio.move_on_after(1.0) as scope:
            await client.call_tool(LONG, {"duration": 30, "steps": 30})
        assert scope.cancelled_caught
        # The session goes on: the next call is answered and recorded after the cancelled one.
        assert not (await client.call_tool("echo", {"message": "after"})).is_error
    [(_, events)] = _tasks(db)
    cancelled, after = _actions(events)
    assert cancelled.input["tool"] == LONG and cancelled.failed  # type: ignore[index]
    assert cancelled.result["error_type"] == "cancelled"  # type: ignore[index]
    assert 900 <= cancelled.result["latency_ms"] < 20_000  # type: ignore[index]
    assert after.input["tool"] == "echo" and not after.failed  # type: ignore[index]
