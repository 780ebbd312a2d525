"""The recording gateway end to end: real MCP servers, real clients, a real store.

The upstream is the published ``mcp-server-time`` from PyPI, installed by
``scripts/setup-mcp-time.sh`` into venvs of its own (so its SDK pin cannot clash with ours): the
2026-era release (SDK 2.x, both protocol eras) and a 2025-era release (SDK 1.x, handshake only).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import orjson
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import INVALID_PARAMS, REQUEST_TIMEOUT
from test_mcp_http import authorized

from hindsight_loop import Hindsight
from hindsight_loop.mcp import Gateway
from hindsight_loop.mcp.config import parse_config
from hindsight_loop.mcp.events import ADVICE_MARKER
from hindsight_loop.models import Event

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup-mcp-time.sh"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _install(*args: str) -> str:
    """Run the setup script; skip only when the package registry cannot be reached (never in CI)."""
    proc = subprocess.run(
        ["bash", str(SETUP), *args], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode == 0:
        return proc.stdout.strip().splitlines()[-1]
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "mcp-server-time"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(
            f"the package registry is unreachable, so mcp-server-time cannot be installed: "
            f"{probe.stderr.strip()[-300:]}"
        )
    pytest.fail(f"scripts/setup-mcp-time.sh {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


@pytest.fixture(scope="session")
def time_server() -> str:
    """``mcp-server-time`` 2026.10.19 (SDK 2.x): serves both protocol eras."""
    return _install()


@pytest.fixture(scope="session")
def legacy_time_server() -> str:
    """``mcp-server-time`` 2025.9.25 on SDK 1.x: the 2025 ``initialize`` handshake only."""
    return _install("--legacy")


TIME_ARGS = ["--local-timezone", "UTC"]
TOKEN = "test-token"

# The calls every comparison makes: a success, bad arguments (wrong type, missing), a tool error,
# and an unknown tool.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
    ("get_current_time", {"timezone": 5}),
    ("get_current_time", {}),
    ("get_current_time", {"timezone": "Mars/Base"}),
    ("no_such_tool", {"x": 1}),
]


async def _drive(client: Client) -> dict[str, Any]:
    """List the tools and make CALLS; errors are part of what the client sees."""
    seen: dict[str, Any] = {"tools": (await client.list_tools()).tools, "calls": []}
    for name, args in CALLS:
        try:
            seen["calls"].append(await client.call_tool(name, args))
        except MCPError as exc:
            seen["calls"].append(("error", exc.code, exc.message, exc.data))
    return seen


def _dump(seen: dict[str, Any], *, keep_meta: bool = True) -> dict[str, Any]:
    def one(x: Any) -> Any:
        if isinstance(x, tuple):
            return x
        data = x.model_dump(by_alias=True, exclude_none=True)
        if not keep_meta:
            data.pop("_meta", None)
        return data

    return {
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in seen["tools"]],
        "calls": [one(c) for c in seen["calls"]],
    }


def _gateway_cmd(config: Path, db: Path, *extra: str) -> tuple[str, list[str]]:
    # The checkout's code, not the installed package's: the SDK passes no PYTHONPATH to a child.
    code = f"import sys; sys.path.insert(0, {str(REPO / 'src')!r}); from hindsight_loop.cli import main; main()"
    return sys.executable, [
        "-c",
        code,
        "mcp",
        "proxy",
        "--config",
        str(config),
        "--db",
        str(db),
        *extra,
    ]


def _write_config(path: Path, servers: dict[str, Any], **options: Any) -> Path:
    data: dict[str, Any] = {"mcpServers": servers}
    if options:
        data["hindsight"] = options
    path.write_bytes(orjson.dumps(data))
    return path


def _events(db: Path) -> list[tuple[Any, list[Event]]]:
    with Hindsight(db, background=False) as hs:
        tasks = sorted(hs.store.list_tasks(), key=lambda t: t.started_at)
        return [(t, hs.store.events(t.task_id)) for t in tasks]


def _actions(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "action_executed"]


def _check_recorded_calls(actions: list[Event], server: str, error_types: list[str | None]) -> None:
    """One event per call, in order, with its arguments, result summary and error type."""
    assert [(e.input or {}).get("tool") for e in actions] == [name for name, _ in CALLS]
    assert [(e.input or {}).get("args") for e in actions] == [args for _, args in CALLS]
    assert all((e.input or {}).get("server") == server for e in actions)
    assert [(e.result or {}).get("error_type") for e in actions] == error_types
    for e, expected in zip(actions, error_types, strict=True):
        result = e.result or {}
        assert result["status"] == ("succeeded" if expected is None else "failed")
        assert result["latency_ms"] >= 0
        if expected not in (None, "unknown_tool"):
            assert result["is_error"] is True and result["error_message"]
    assert "+9.0h" in actions[0].result["output"]  # type: ignore[index]
    assert "Mars/Base" in actions[3].result["error_message"]  # type: ignore[index]


# -- the judged end-to-end test: published server, gateway as a subprocess over stdio -------------


async def test_gateway_over_stdio_is_transparent_and_records_every_call(
    time_server: str, tmp_path: Path
) -> None:
    direct = StdioServerParameters(command=time_server, args=TIME_ARGS)
    async with Client(direct) as client:
        assert client.protocol_version == "2026-07-28"
        expected = _dump(await _drive(client))

    config = _write_config(
        tmp_path / "servers.json", {"time": {"command": time_server, "args": TIME_ARGS}}
    )
    db = tmp_path / "gateway.db"
    command, args = _gateway_cmd(config, db, "--task-type", "time_questions")
    async with Client(StdioServerParameters(command=command, args=args)) as client:
        assert client.server_info is not None and client.server_info.name == "hindsight-gateway"
        through = _dump(await _drive(client))

    # The client sees exactly what the server itself answers, errors included.
    assert through["tools"] == expected["tools"]
    assert through["calls"] == expected["calls"]
    assert through["calls"][-1] == ("error", INVALID_PARAMS, "Unknown tool: no_such_tool", None)

    [(task, events)] = _events(db)
    assert task.task_type == "time_questions" and task.status == "failed"
    assert task.tools == ["convert_time", "get_current_time"]
    assert [e.type for e in events] == ["task_start", *["action_executed"] * len(CALLS), "task_end"]
    _check_recorded_calls(
        _actions(events),
        "time",
        [None, "invalid_arguments", "invalid_arguments", "tool_error", "unknown_tool"],
    )
    assert _actions(events)[-1].result["error_code"] == INVALID_PARAMS  # type: ignore[index]


#: Sits between the gateway and a server, keeping every line the gateway sends it.
TEE = textwrap.dedent(
    """
    import subprocess, sys
    log = open(sys.argv[1], "ab", buffering=0)
    server = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE)  # answers to our stdout
    for line in sys.stdin.buffer:
        log.write(line)
        server.stdin.write(line)
        server.stdin.flush()
    server.stdin.close()
    sys.exit(server.wait())
    """
)


async def _never(ctx: Any, params: Any) -> Any:
    raise AssertionError("the server asked for nothing here")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_over_stdio_the_server_is_started_once_in_the_clients_era(
    time_server: str, tmp_path: Path, mode: str
) -> None:
    # The gateway reads its client's first message before starting the servers: each starts
    # once, told what the client declares (sampling here) and asked the client's era, so a
    # 2025-era client in front of a server that speaks both eras talks 2025 end to end.
    tee, log = tmp_path / "tee.py", tmp_path / "upstream.jsonl"
    tee.write_text(TEE)
    servers = {
        "time": {"command": sys.executable, "args": [str(tee), str(log), time_server, *TIME_ARGS]}
    }
    config = _write_config(tmp_path / "servers.json", servers)
    command, args = _gateway_cmd(config, tmp_path / "gateway.db")
    params = StdioServerParameters(command=command, args=args)
    async with Client(params, mode=mode, sampling_callback=_never) as client:
        result = await client.call_tool(*CALLS[0])
        assert result.structured_content["time_difference"] == "+9.0h"  # type: ignore[index]
    sent = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    handshakes = [m for m in sent if m.get("method") in ("initialize", "server/discover")]
    if mode == "legacy":
        [hello] = handshakes  # one start, no second one for the declared capability
        assert hello["method"] == "initialize"
        assert "sampling" in hello["params"]["capabilities"]
    else:
        assert handshakes[0]["method"] == "server/discover"
        assert len([m for m in sent if m.get("method") == "initialize"]) == 0
    [call] = [m for m in sent if m.get("method") == "tools/call"]
    assert call["params"]["name"] == CALLS[0][0]
    [(task, events)] = _events(tmp_path / "gateway.db")
    assert len(_actions(events)) == 1 and task.status == "succeeded"


# -- in process: both client eras, a 2025-era upstream ---------------------------------------------


@asynccontextmanager
async def _gateway(hs: Hindsight, servers: dict[str, Any], **kwargs: Any) -> AsyncIterator[Gateway]:
    options = {k: kwargs.pop(k) for k in ("toolNames", "timeout") if k in kwargs}
    config = parse_config({"mcpServers": servers, "hindsight": options})
    async with Gateway(hs, config, **kwargs) as gateway:
        yield gateway


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_gateway_serves_both_client_eras(time_server: str, hs: Hindsight, mode: str) -> None:
    async with Client(StdioServerParameters(command=time_server, args=TIME_ARGS), mode=mode) as c:
        expected = _dump(await _drive(c))
    async with (
        _gateway(hs, {"time": {"command": time_server, "args": TIME_ARGS}}) as gateway,
        Client(gateway.server, mode=mode) as client,
    ):
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        through = _dump(await _drive(client))
    assert through == expected
    hs.flush()
    [task] = hs.store.list_tasks()
    assert task.task_type == "mcp:mcp"  # no task type given: the client's name ("mcp")
    _check_recorded_calls(
        _actions(hs.store.events(task.task_id)),
        "time",
        [None, "invalid_arguments", "invalid_arguments", "tool_error", "unknown_tool"],
    )


async def test_gateway_in_front_of_a_2025_era_server(
    legacy_time_server: str, hs: Hindsight
) -> None:
    params = StdioServerParameters(command=legacy_time_server, args=TIME_ARGS)
    async with Client(params) as client:
        assert client.protocol_version == "2025-11-25"  # discover refused: fell back to initialize
        expected = _dump(await _drive(client), keep_meta=False)
    async with (
        _gateway(hs, {"time": {"command": legacy_time_server, "args": TIME_ARGS}}) as gateway,
        Client(gateway.server) as client,
    ):
        assert client.protocol_version == "2026-07-28"
        through = _dump(await _drive(client), keep_meta=False)
    assert through == expected
    hs.flush()
    [task] = hs.store.list_tasks()
    actions = _actions(hs.store.events(task.task_id))
    # This server reports every failure, unknown tools included, as an isError result.
    assert [(e.result or {}).get("is_error") for e in actions] == [False, True, True, True, True]
    assert [(e.result or {}).get("error_type") for e in actions] == [
        None,
        "invalid_arguments",
        "invalid_arguments",
        "tool_error",
        "unknown_tool",
    ]


# -- streamable HTTP ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_gateway_over_http_one_task_per_client_session(
    time_server: str, tmp_path: Path, http_process: Any
) -> None:
    config = _write_config(
        tmp_path / "servers.json", {"time": {"command": time_server, "args": TIME_ARGS}}
    )
    db, port = tmp_path / "gateway.db", _free_port()
    command, args = _gateway_cmd(
        config, db, "--transport", "http", "--port", str(port), "--token", TOKEN
    )
    proc = http_process(command, args, port)
    url = f"http://127.0.0.1:{port}/mcp"
    for mode in ("legacy", "auto"):
        async with authorized(
            url,
            TOKEN,
            mode=mode,
            client_info=types.Implementation(name=f"agent-{mode}", version="1"),
        ) as c:
            result = await c.call_tool(*CALLS[0])
            assert result.structured_content["time_difference"] == "+9.0h"
            with pytest.raises(MCPError, match="Unknown tool"):
                await c.call_tool(*CALLS[-1])
        # Leaving a 2025-era session sends DELETE, a 2026-era client closes its connections:
        # either way its task ends now, not at shutdown.
        await _ended(db, 1 if mode == "legacy" else 2, timeout=20)
    proc.terminate()
    assert proc.wait(timeout=30) == 0

    recorded = {t.task_type: (t, events) for t, events in _events(db)}
    assert sorted(recorded) == ["mcp:agent_auto", "mcp:agent_legacy"]
    assert recorded["mcp:agent_legacy"][0].outcome["reason"] == "session closed"  # type: ignore[index]
    # A 2026-era client has no session to close: its task ends when its connections are gone.
    assert recorded["mcp:agent_auto"][0].outcome["reason"] == "client disconnected"  # type: ignore[index]
    for task, events in recorded.values():
        assert [e.type for e in events] == [
            "task_start",
            "action_executed",
            "action_executed",
            "task_end",
        ]
        assert task.status == "failed"  # the session ended on the failed call


async def _ended(db: Path, count: int, timeout: float = 15.0) -> list[tuple[Any, list[Event]]]:
    """The recorded tasks once ``count`` of them have ended (a few seconds at most)."""
    with anyio.fail_after(timeout):
        while True:
            tasks = _events(db)
            if sum(t.status != "running" for t, _ in tasks) >= count:
                return tasks
            await anyio.sleep(0.1)


async def _post(http: httpx.AsyncClient, url: str, message: dict[str, Any], sid: str | None) -> Any:
    """One JSON-RPC message to a 2025-era streamable HTTP endpoint; the answer, if any."""
    headers = {"accept": "application/json, text/event-stream"}
    if sid is not None:
        headers |= {"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    response = await http.post(url, json=message, headers=headers)
    assert response.status_code in (200, 202), response.text
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return (orjson.loads(data[0]), response.headers.get("mcp-session-id")) if data else None


async def test_http_clients_that_leave_without_delete_end_their_tasks(
    time_server: str, tmp_path: Path, http_process: Any
) -> None:
    # Many clients (the MCP Inspector CLI among them) just close their connections when done.
    config = _write_config(
        tmp_path / "servers.json", {"time": {"command": time_server, "args": TIME_ARGS}}
    )
    db, port = tmp_path / "gateway.db", _free_port()
    command, args = _gateway_cmd(
        config, db, "--transport", "http", "--port", str(port), "--token", TOKEN
    )
    proc = http_process(command, args, port)
    url = f"http://127.0.0.1:{port}/mcp"
    info = types.Implementation(name="漫游 agent", version="1")

    # A 2025-era session left without DELETE.
    async with authorized(
        url, TOKEN, mode="legacy", client_info=info, terminate_on_close=False
    ) as c:
        await c.call_tool(*CALLS[0])
    [(first, _)] = await _ended(db, 1)
    assert first.outcome["reason"] == "client disconnected"  # type: ignore[index]

    # Two runs of one 2026-era client (no session id) are two tasks; within a run, a pause
    # longer than the HTTP client's idle-connection expiry (httpx: 5 s) is not an end.
    for run in range(2):
        async with authorized(url, TOKEN, mode="auto", client_info=info) as c:
            await c.call_tool(*CALLS[0])
            if run == 1:
                await anyio.sleep(6)
                with pytest.raises(MCPError, match="Unknown tool"):
                    await c.call_tool(*CALLS[-1])
        await _ended(db, 2 + run)

    # A 2025-era client whose connections all closed, coming back with its session id later,
    # gets a new task naming the one it continues: each task ends once (a task that ended may
    # have been reviewed already).
    auth = {"authorization": f"Bearer {TOKEN}"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": CALLS[0][0]}}
    call["params"]["arguments"] = CALLS[0][1]  # type: ignore[index]
    async with httpx.AsyncClient(headers=auth, timeout=30) as http:
        _, sid = await _post(http, url, init, None)
        await _post(http, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        answer, _ = await _post(http, url, {**call, "id": 2}, sid)
        assert "+9.0h" in str(answer["result"])
    await _ended(db, 4)
    async with httpx.AsyncClient(headers=auth, timeout=30) as http:
        answer, _ = await _post(http, url, {**call, "id": 3}, sid)
        assert "+9.0h" in str(answer["result"])
    await _ended(db, 5)

    proc.terminate()
    assert proc.wait(timeout=30) == 0
    tasks = _events(db)
    assert [len(_actions(events)) for _, events in tasks] == [1, 1, 2, 1, 1]
    (raw, raw_events), (resumed, resumed_events) = tasks[-2:]
    assert resumed_events[0].extra["source"]["continues"] == raw.task_id
    assert "continues" not in raw_events[0].extra["source"]
    assert resumed.task_type == raw.task_type == "mcp:raw"
    assert {t.task_type for t, _ in tasks[:3]} == {"mcp:漫游_agent"}
    assert [t.status for t, _ in tasks] == ["succeeded", "succeeded", "failed"] + ["succeeded"] * 2
    for task, events in tasks:
        assert task.outcome["reason"] == "client disconnected"  # type: ignore[index]
        assert [e.type for e in events] == [
            "task_start",
            *["action_executed"] * len(_actions(events)),
            "task_end",
        ]


async def test_an_idle_http_session_that_comes_back_is_a_new_task_naming_the_old(
    time_server: str, tmp_path: Path
) -> None:
    """Served by an ASGI server that reports no connections, a session ends after its idle
    time; its client coming back with the session id gets a new task, and each ends once."""
    import uvicorn

    db, port = tmp_path / "gateway.db", _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "idler", "version": "1"},
        },
    }
    call = {"jsonrpc": "2.0", "method": "tools/call"}
    call["params"] = {"name": CALLS[0][0], "arguments": CALLS[0][1]}
    with Hindsight(db) as hs:
        servers = {"time": {"command": time_server, "args": TIME_ARGS}}
        async with _gateway(hs, servers, session_idle=0.5) as gateway:
            config = uvicorn.Config(gateway.http_app(), port=port, log_level="warning")
            server = uvicorn.Server(config)
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve)
                with anyio.fail_after(30):
                    while not server.started:
                        await anyio.sleep(0.05)
                async with httpx.AsyncClient(timeout=30) as http:
                    _, sid = await _post(http, url, init, None)
                    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                    await _post(http, url, initialized, sid)
                    await _post(http, url, {**call, "id": 2}, sid)
                    with anyio.fail_after(15):
                        while gateway.sessions:
                            await anyio.sleep(0.1)
                    await _post(http, url, {**call, "id": 3}, sid)
                    await _post(http, url, {"jsonrpc": "2.0", "method": "ping", "id": 4}, sid)
                server.should_exit = True
    first, second = _events(db)
    assert [e.type for e in first[1]] == ["task_start", "action_executed", "task_end"]
    assert first[0].outcome["reason"] == "idle"  # type: ignore[index]
    assert [e.type for e in second[1]] == ["task_start", "action_executed", "task_end"]
    assert second[1][0].extra["source"]["continues"] == first[0].task_id
    assert second[0].outcome["reason"] == "gateway stopped"  # type: ignore[index]


# -- several upstreams, timeouts, outages ------------------------------------------------------

FAKE_SERVER = textwrap.dedent(
    '''
    """A second MCP server: one tool name clashes with mcp-server-time, one tool is slow."""
    import anyio
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("fake")

    @server.tool()
    def get_current_time(timezone: str) -> str:
        """Pretend time."""
        return f"teatime in {timezone}"

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep a while."""
        await anyio.sleep(seconds)
        return "awake"

    anyio.run(server.run_stdio_async)
    '''
)


async def test_several_upstreams_side_by_side(
    time_server: str, hs: Hindsight, tmp_path: Path
) -> None:
    fake = tmp_path / "fake_server.py"
    fake.write_text(FAKE_SERVER)
    servers = {
        "time": {"command": time_server, "args": TIME_ARGS},
        "fake": {"command": sys.executable, "args": [str(fake)]},
    }
    async with (
        _gateway(hs, servers, timeout=1.0, task_type="multi") as gateway,
        Client(gateway.server) as client,
    ):
        names = sorted(t.name for t in (await client.list_tools()).tools)
        # Only the clashing name is prefixed; unique names stay as the servers call them.
        assert names == [
            "convert_time",
            "fake__get_current_time",
            "sleep",
            "time__get_current_time",
        ]
        real = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert real.structured_content["timezone"] == "UTC"
        pretend = await client.call_tool("fake__get_current_time", {"timezone": "UTC"})
        assert pretend.content[0].text == "teatime in UTC"  # type: ignore[union-attr]
        with pytest.raises(MCPError) as timed_out:
            await client.call_tool("sleep", {"seconds": 30})
        assert timed_out.value.code == REQUEST_TIMEOUT
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("get_current_time", {"timezone": "UTC"})  # ambiguous name
        assert (unknown.value.code, unknown.value.message) == (
            INVALID_PARAMS,
            "Unknown tool: get_current_time",
        )
    hs.flush()
    [task] = hs.store.list_tasks()
    actions = _actions(hs.store.events(task.task_id))
    assert [
        (e.input["tool"], e.input["server"], e.input.get("upstream_tool")) for e in actions
    ] == [  # type: ignore[index]
        ("time__get_current_time", "time", "get_current_time"),
        ("fake__get_current_time", "fake", "get_current_time"),
        ("sleep", "fake", None),
        ("get_current_time", None, None),
    ]
    assert [e.result["error_type"] if e.failed else None for e in actions] == [  # type: ignore[index]
        None,
        None,
        "timeout",
        "unknown_tool",
    ]
    assert 900 <= actions[2].result["latency_ms"] < 10_000  # type: ignore[index]


async def test_prefixed_names_and_a_server_that_does_not_start(
    time_server: str, hs: Hindsight
) -> None:
    servers = {
        "time": {"command": time_server, "args": TIME_ARGS},
        "broken": {"command": "/nonexistent/mcp-server"},
    }
    async with _gateway(hs, servers, toolNames="prefixed") as gateway:
        assert gateway.upstreams["broken"].error
        async with Client(gateway.server) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            assert names == ["time__convert_time", "time__get_current_time"]
            result = await client.call_tool("time__convert_time", CALLS[0][1])
            assert not result.is_error


async def test_an_upstream_that_goes_away_is_recorded_as_unavailable(
    hs: Hindsight, tmp_path: Path, http_process: Any
) -> None:
    # The upstream is Hindsight's own MCP server over streamable HTTP, in another process.
    port = _free_port()
    code = "from hindsight_loop.cli import main; main()"
    args = [
        "-c",
        code,
        "mcp",
        "serve",
        "--transport",
        "http",
        "--port",
        str(port),
        "--db",
        str(tmp_path / "upstream.db"),
        "--token",
        TOKEN,
    ]
    upstream = http_process(sys.executable, args, port)
    memory = {
        "url": f"http://127.0.0.1:{port}/mcp",
        "headers": {"Authorization": f"Bearer {TOKEN}"},
    }
    async with (
        _gateway(hs, {"memory": memory}) as gateway,
        Client(gateway.server) as client,
    ):
        ok = await client.call_tool("recall_lessons", {"task_type": "x"})
        assert not ok.is_error
        upstream.terminate()
        upstream.wait(timeout=30)
        with pytest.raises(MCPError, match="unavailable|closed|Connect"):
            await client.call_tool("recall_lessons", {"task_type": "x"})
    hs.flush()
    [task] = hs.store.list_tasks()
    actions = _actions(hs.store.events(task.task_id))
    assert [(e.input or {}).get("server") for e in actions] == ["memory", "memory"]
    assert actions[1].result["error_type"] == "upstream_unavailable"  # type: ignore[index]


# -- advice at the boundary --------------------------------------------------------------------


async def test_advise_appends_recalled_lessons_only_to_failed_calls(
    time_server: str, hs: Hindsight
) -> None:
    servers = {"time": {"command": time_server, "args": TIME_ARGS}}
    bad = {"source_timezone": "UTC", "time": "25:99", "target_timezone": "Asia/Tokyo"}
    good = {**bad, "time": "12:00"}
    # A first session fails, recovers, and is reviewed into a lesson.
    async with (
        _gateway(hs, servers, task_type="time_questions") as gateway,
        Client(gateway.server) as client,
    ):
        plain_failure = await client.call_tool("convert_time", bad)
        assert plain_failure.is_error
        assert not (await client.call_tool("convert_time", good)).is_error
    hs.flush()  # the writer makes the session's events durable in its own time
    [task] = hs.store.list_tasks()
    reflection = hs.reflect(task.task_id)
    assert reflection.lesson_ids, reflection

    async with (
        _gateway(hs, servers, task_type="time_questions", advise=True) as gateway,
        Client(gateway.server) as client,
    ):
        advised = await client.call_tool("convert_time", bad)
        untouched = await client.call_tool("convert_time", good)
    assert advised.is_error
    # The tool's own answer is unchanged; one text block marked as Hindsight advice follows it.
    assert advised.content[:-1] == plain_failure.content
    advice = advised.content[-1]
    assert isinstance(advice, types.TextContent) and advice.text.startswith(ADVICE_MARKER)
    assert "convert_time" in advice.text
    assert not untouched.is_error and all(
        ADVICE_MARKER not in getattr(block, "text", "") for block in untouched.content
    )


async def test_cli_rejects_a_bad_config_with_the_fix(tmp_path: Path) -> None:
    command, args = _gateway_cmd(tmp_path / "missing.json", tmp_path / "x.db")
    proc = await anyio.run_process([command, *args], check=False)
    assert proc.returncode == 1
    assert b"--config" in proc.stderr and b"mcpServers" in proc.stderr
