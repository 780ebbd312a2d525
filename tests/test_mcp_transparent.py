"""Everything a client can do with a server directly it can do through the gateway (issue 14).

Against the reference ``@modelcontextprotocol/server-everything`` from npm: each test does the
same things directly and through ``hindsight mcp proxy`` (a subprocess over stdio, as an MCP
client launches it) with a real SDK client, and compares what the client sees field by field:
tool listings, resources, prompts, completions, logging, progress, cancellation, the requests
the server sends back (sampling, elicitation, roots) and unknown tools. The store must hold each
tool call exactly once, and nothing for the rest (only tool calls are actions of the agent).
"""

from __future__ import annotations

import base64
import re
import socket
import sys
import textwrap
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.streams.text
import httpx2
import mcp_types as types
import orjson
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import CONNECTION_CLOSED

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_mcp_everything import (  # noqa: E402  (the shared helpers live beside the first suite)
    LONG,
    _actions,
    _config,
    _direct,
    _gateway,
    _tasks,
    _wire,
    anyio_backend,  # noqa: F401  (fixture)
    everything,  # noqa: F401  (fixture)
)
from test_mcp_http import authorized  # noqa: E402

pytestmark = pytest.mark.anyio

ROOTS = [types.Root(uri="file:///tmp/project", name="project")]


class Peer:
    """A client that answers the server's requests and keeps what it was asked and told."""

    def __init__(self, *, sampling: bool = True, elicitation: bool = True, roots: bool = True):
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.logs: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []
        self.sampling = sampling
        self.elicitation = elicitation
        self.roots = roots

    async def _sampling(self, ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        self.asked.append(("sampling", params.model_dump(by_alias=True, exclude_none=True)))
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="the model says hi"),
            model="fake-model",
            stop_reason="endTurn",
        )

    async def _elicitation(self, ctx: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append(("elicitation", params.model_dump(by_alias=True, exclude_none=True)))
        return types.ElicitResult(
            action="accept", content={"name": "Ada", "check": True, "integer": 3}
        )

    async def _roots(self, ctx: Any) -> Any:
        self.asked.append(("roots", {}))
        return types.ListRootsResult(roots=ROOTS)

    async def _log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params.model_dump(by_alias=True, exclude_none=True))

    async def _message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.notes.append(message.model_dump(by_alias=True, exclude_none=True))

    def client(self, server: Any, **kwargs: Any) -> Client:
        return Client(
            server,
            sampling_callback=self._sampling if self.sampling else None,
            elicitation_callback=self._elicitation if self.elicitation else None,
            list_roots_callback=self._roots if self.roots else None,
            logging_callback=self._log,
            message_handler=self._message,
            **kwargs,
        )


_CLOCK = re.compile(r"\d{1,2}:\d{2}:\d{2}\s?[AP]M")


def _untimed(value: Any) -> Any:
    """``value`` with wall-clock times (this server stamps its dynamic resources) made equal."""
    if isinstance(value, dict):
        out = {k: _untimed(v) for k, v in value.items()}
        if isinstance(out.get("blob"), str):
            raw = base64.b64decode(out["blob"]).decode("utf-8", "replace")
            out["blob"] = _CLOCK.sub("<time>", raw)
        return out
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return _CLOCK.sub("<time>", value) if isinstance(value, str) else value


@contextmanager
def _legacy() -> Iterator[None]:
    """Subscriptions, logging and roots are deprecated at 2026-07-28, yet 2025-era servers use them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        yield


def _servers(exe: str) -> dict[str, Any]:
    return {"everything": {"command": exe, "args": ["stdio"]}}


async def _wait_for(predicate: Any, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_tool_listing_is_the_servers_own(
    everything: str,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    async with Peer().client(_direct(everything), mode=mode) as client:
        expected = _wire(await client.list_tools(), era_stamps=True)
        capabilities = client.server_capabilities
        era = client.protocol_version
    names = [t["name"] for t in expected["tools"]]
    # The tools this server only offers to clients that can answer its requests are there.
    for name in ("trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"):
        assert name in names

    config = _config(tmp_path / "s.json", _servers(everything))
    async with Peer().client(_gateway(config, tmp_path / "g.db"), mode=mode) as client:
        through = _wire(await client.list_tools(), era_stamps=True)
        mirrored = client.server_capabilities
        through_era = client.protocol_version
    # A 2026-era client falls back to the 2025 era with this server, and through the gateway
    # too: so it sees each tool's 2025-11-25 ``execution`` (tasks) field, as directly.
    assert era == through_era == "2025-11-25"
    assert through == expected
    # The gateway serves what the server declares: resources, prompts, completions, logging.
    assert mirrored.resources is not None and mirrored.prompts is not None
    assert mirrored.completions is not None
    assert mirrored.logging is not None and capabilities.logging is not None
    assert mirrored.resources.subscribe is True
    assert mirrored.resources.list_changed is True and mirrored.prompts.list_changed is True
    assert mirrored.tasks == capabilities.tasks is not None


async def _browse(client: Client) -> dict[str, Any]:
    """Resources, prompts, completions and logging: everything but tools."""
    seen: dict[str, Any] = {}

    def wire(result: Any) -> dict[str, Any]:
        return _untimed(_wire(result, era_stamps=True))  # type: ignore[no-any-return]

    resources = await client.list_resources()
    seen["resources"] = wire(resources)
    seen["templates"] = wire(await client.list_resource_templates())
    first = resources.resources[0].uri
    seen["read"] = wire(await client.read_resource(first))
    seen["read_template"] = wire(await client.read_resource("demo://resource/dynamic/text/7"))
    seen["read_blob"] = wire(await client.read_resource("demo://resource/dynamic/blob/3"))
    try:
        await client.read_resource("demo://resource/no/such")
    except MCPError as exc:
        seen["read_missing"] = exc.error.model_dump(by_alias=True, exclude_none=True)
    with _legacy():
        seen["subscribe"] = wire(await client.subscribe_resource(first))
    with _legacy():
        seen["unsubscribe"] = wire(await client.unsubscribe_resource(first))
    seen["prompts"] = wire(await client.list_prompts())
    seen["simple"] = wire(await client.get_prompt("simple-prompt"))
    seen["args"] = wire(await client.get_prompt("args-prompt", {"city": "Oslo", "state": "N"}))
    seen["resource_prompt"] = wire(
        await client.get_prompt("resource-prompt", {"resourceType": "Text", "resourceId": "2"})
    )
    try:
        await client.get_prompt("no-such-prompt")
    except MCPError as exc:
        seen["prompt_missing"] = exc.error.model_dump(by_alias=True, exclude_none=True)
    seen["complete"] = wire(
        await client.complete(
            types.PromptReference(type="ref/prompt", name="completable-prompt"),
            {"name": "department", "value": "E"},
        )
    )
    seen["complete_resource"] = wire(
        await client.complete(
            types.ResourceTemplateReference(
                type="ref/resource", uri="demo://resource/dynamic/text/{resourceId}"
            ),
            {"name": "resourceId", "value": "1"},
        )
    )
    with _legacy():
        seen["set_level"] = wire(await client.set_logging_level("warning"))
    for value in seen.values():
        value.pop("ttlMs", None), value.pop("cacheScope", None)
    return seen


async def test_resources_prompts_completions_and_logging_pass_through(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with Peer().client(_direct(everything), mode="legacy") as client:
        expected = await _browse(client)
    assert expected["read_template"]["contents"][0]["uri"] == "demo://resource/dynamic/text/7"
    assert "blob" in expected["read_blob"]["contents"][0]
    assert "read_missing" in expected and "prompt_missing" in expected
    assert expected["complete"]["completion"]["values"]  # the server completes "E..."

    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    async with Peer().client(_gateway(config, db), mode="legacy") as client:
        through = await _browse(client)
    assert through == expected
    # None of this is a tool call: the gateway recorded no action (and so no task).
    assert all(not _actions(events) for _, events in _tasks(db))


async def _ask_back(client: Client, peer: Peer) -> dict[str, Any]:
    """The tools that make the server ask the client (sampling, elicitation, roots)."""
    seen: dict[str, Any] = {}
    sampled = await client.call_tool("trigger-sampling-request", {"prompt": "say hi"})
    seen["sampling"] = _wire(sampled, era_stamps=True)
    elicited = await client.call_tool("trigger-elicitation-request", {})
    seen["elicitation"] = _wire(elicited, era_stamps=True)
    # The server asks for the roots once the client is initialized; wait until it has them.
    await _wait_for(lambda: any(kind == "roots" for kind, _ in peer.asked))
    roots = await client.call_tool("get-roots-list", {})
    seen["roots"] = _wire(roots, era_stamps=True)
    seen["asked"] = sorted(peer.asked, key=lambda a: a[0])
    return seen


async def test_sampling_elicitation_and_roots_reach_the_client(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    peer = Peer()
    async with peer.client(_direct(everything), mode="legacy") as client:
        expected = await _ask_back(client, peer)
    assert "the model says hi" in str(expected["sampling"])
    assert "Ada" in str(expected["elicitation"])
    assert "file:///tmp/project" in str(expected["roots"])
    assert [kind for kind, _ in expected["asked"]] == ["elicitation", "roots", "sampling"]

    peer = Peer()
    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    async with peer.client(_gateway(config, db), mode="legacy") as client:
        through = await _ask_back(client, peer)
    # The client was asked the same things and the server answered it the same way.
    assert through == expected
    [(_, events)] = _tasks(db)
    actions = _actions(events)
    assert [e.input["tool"] for e in actions] == [  # type: ignore[index]
        "trigger-sampling-request",
        "trigger-elicitation-request",
        "get-roots-list",
    ]
    assert not any(e.failed for e in actions)


async def test_a_client_without_sampling_gets_what_a_direct_client_would_answer(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The server offers a client that cannot sample the same tools through the gateway."""

    async def drive(client: Client) -> dict[str, Any]:
        listed = [t.name for t in (await client.list_tools()).tools]
        try:
            answer: Any = _wire(
                await client.call_tool("trigger-sampling-request", {"prompt": "hi"}),
                era_stamps=True,
            )
        except MCPError as exc:
            answer = ("error", exc.code, exc.message)
        return {"tools": listed, "answer": answer}

    async with Client(_direct(everything), mode="legacy") as client:  # declares no sampling
        expected = await drive(client)
    assert "trigger-sampling-request" not in expected["tools"] and "echo" in expected["tools"]

    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    async with Client(_gateway(config, db), mode="legacy") as client:
        through = await drive(client)
    assert through == expected
    [(_, events)] = _tasks(db)
    [action] = _actions(events)
    assert action.input["tool"] == "trigger-sampling-request"  # type: ignore[index]
    assert action.result["error_type"] == "unknown_tool"  # type: ignore[index]


@asynccontextmanager
async def _http(url: str, token: str) -> AsyncIterator[Any]:
    """A streamable HTTP transport to ``url`` that sends the bearer token."""
    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=300.0)
    ) as http:
        yield streamable_http_client(url, http_client=http)


async def test_over_http_each_client_is_served_for_what_it_declared(
    everything: str,  # noqa: F811
    tmp_path: Path,
    http_process: Any,
) -> None:
    """Two clients of one HTTP gateway at once, one declaring sampling, elicitation and roots,
    one declaring none: each lists the tools and gets the answers it gets from the server
    directly, and only the first is asked anything (the server was told what each declared)."""

    async def drive_bare(client: Client) -> dict[str, Any]:
        listed = [t.name for t in (await client.list_tools()).tools]
        answer = await client.call_tool("trigger-sampling-request", {"prompt": "hi"})
        return {"tools": listed, "answer": _wire(answer, era_stamps=True)}

    async def drive_full(client: Client, peer: Peer) -> dict[str, Any]:
        listed = [t.name for t in (await client.list_tools()).tools]
        return {"tools": listed, **await _ask_back(client, peer)}

    full = Peer()
    async with full.client(_direct(everything), mode="legacy") as client:
        expected_full = await drive_full(client, full)
    bare = Peer(sampling=False, elicitation=False, roots=False)
    async with bare.client(_direct(everything), mode="legacy") as client:
        expected_bare = await drive_bare(client)
    assert "trigger-sampling-request" in expected_full["tools"]
    assert "trigger-sampling-request" not in expected_bare["tools"]
    assert expected_bare["answer"]["isError"] is True and not bare.asked

    db, port, token = tmp_path / "g.db", _free_port(), "caps-token"
    stdio = _gateway(_config(tmp_path / "s.json", _servers(everything)), db)
    proc = http_process(
        stdio.command,
        [*stdio.args, "--transport", "http", "--port", str(port), "--token", token],
        port,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    full, bare = Peer(), Peer(sampling=False, elicitation=False, roots=False)
    async with (
        _http(url, token) as to_full,
        _http(url, token) as to_bare,
        full.client(to_full, mode="legacy") as full_client,
        bare.client(to_bare, mode="legacy") as bare_client,
    ):
        through_bare = await drive_bare(bare_client)
        through_full = await drive_full(full_client, full)
        again_bare = await drive_bare(bare_client)
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert through_full == expected_full
    assert through_bare == again_bare == expected_bare
    assert not bare.asked
    tools = sorted(
        [e.input["tool"] for e in _actions(events)]  # type: ignore[index]
        for _, events in _tasks(db)
    )
    assert tools == [
        ["trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"],
        ["trigger-sampling-request", "trigger-sampling-request"],
    ]


FORM_ONLY = {"elicitation": {"form": {}}}


def _init(capabilities: dict[str, Any]) -> dict[str, Any]:
    info = {"name": "raw", "version": "1"}
    params = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": info}
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}


_INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


async def _raw_stdio_tools(command: list[str], capabilities: dict[str, Any]) -> list[str]:
    """The tool names a 2025-era client declaring exactly ``capabilities`` is offered (stdio)."""
    async with await anyio.open_process(command, stderr=None) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        lines = anyio.streams.text.TextReceiveStream(proc.stdout)
        buffer = ""

        async def answer(want: int) -> dict[str, Any]:
            nonlocal buffer
            while True:
                while "\n" not in buffer:
                    buffer += await lines.receive()
                line, buffer = buffer.split("\n", 1)
                msg = orjson.loads(line)
                if msg.get("id") == want and "method" not in msg:
                    return msg  # type: ignore[no-any-return]

        for message in (_init(capabilities), _INITIALIZED, _LIST):
            await proc.stdin.send(orjson.dumps(message) + b"\n")
            if "id" in message:
                result = await answer(message["id"])  # type: ignore[arg-type]
        await proc.stdin.aclose()
        with anyio.fail_after(30):
            await proc.wait()
    return [t["name"] for t in result["result"]["tools"]]


async def _raw_http_tools(url: str, token: str, capabilities: dict[str, Any]) -> list[str]:
    """The same over streamable HTTP (a 2025-era session)."""
    headers = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:

        async def post(message: dict[str, Any], sid: str | None) -> Any:
            extra = {"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"} if sid else {}
            response = await http.post(url, json=message, headers=extra)
            assert response.status_code in (200, 202), response.text
            data = [x[5:] for x in response.text.splitlines() if x.startswith("data:")]
            return (orjson.loads(data[-1]) if data else None), response.headers.get(
                "mcp-session-id"
            )

        _, sid = await post(_init(capabilities), None)
        await post(_INITIALIZED, sid)
        listed, _ = await post(_LIST, sid)
        await http.delete(url, headers={"mcp-session-id": sid})
    return [t["name"] for t in listed["result"]["tools"]]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_is_told_the_parts_of_a_capability_the_client_declared(
    everything: str,  # noqa: F811
    tmp_path: Path,
    http_process: Any,
    transport: str,
) -> None:
    """A client declaring form elicitation only is not offered the URL-elicitation tool,
    through the gateway as directly (the SDK's own client would declare both parts)."""
    expected = await _raw_stdio_tools([everything, "stdio"], FORM_ONLY)
    assert "trigger-elicitation-request" in expected
    assert "trigger-url-elicitation" not in expected
    db = tmp_path / "g.db"
    stdio = _gateway(_config(tmp_path / "s.json", _servers(everything)), db)
    if transport == "stdio":
        through = await _raw_stdio_tools([stdio.command, *stdio.args], FORM_ONLY)
    else:
        port, token = _free_port(), "parts-token"
        proc = http_process(
            stdio.command,
            [*stdio.args, "--transport", "http", "--port", str(port), "--token", token],
            port,
        )
        through = await _raw_http_tools(f"http://127.0.0.1:{port}/mcp", token, FORM_ONLY)
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert through == expected


DECLARED_SERVER = textwrap.dedent(
    '''
    """A 2026-era server (Python SDK) whose tool tells what the client declared to it."""
    import json

    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("declared")

    @server.tool()
    def declared(ctx: Context) -> str:
        """Which of sampling, elicitation and roots the client declared."""
        caps = ctx.client_capabilities
        return json.dumps(
            {k: getattr(caps, k, None) is not None for k in ("sampling", "elicitation", "roots")}
        )

    server.run()
    '''
)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_over_http_a_server_is_told_what_each_client_declared(
    tmp_path: Path, http_process: Any, mode: str
) -> None:
    """In both eras (2026: the declaration rides in each request's ``_meta``), the server sees
    through the HTTP gateway what it sees directly, for two clients at once."""
    script = tmp_path / "declared.py"
    script.write_text(DECLARED_SERVER)
    server = StdioServerParameters(command=sys.executable, args=[str(script)])

    async def told(client: Client) -> Any:
        result = await client.call_tool("declared", {})
        return (client.protocol_version, result.content[0].text)  # type: ignore[union-attr]

    full, bare = Peer(), Peer(sampling=False, elicitation=False, roots=False)
    async with full.client(server, mode=mode) as a, bare.client(server, mode=mode) as b:
        expected = [await told(a), await told(b)]
    assert expected[0][1] != expected[1][1]

    db, port, token = tmp_path / "g.db", _free_port(), "declared-token"
    upstream = {"command": sys.executable, "args": [str(script)]}
    stdio = _gateway(_config(tmp_path / "s.json", {"declared": upstream}), db)
    proc = http_process(
        stdio.command,
        [*stdio.args, "--transport", "http", "--port", str(port), "--token", token],
        port,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    async with (
        _http(url, token) as to_full,
        _http(url, token) as to_bare,
        # Named apart: two 2026-era clients of one name and host at once are one run to it.
        full.client(
            to_full, mode=mode, client_info=types.Implementation(name="a", version="1")
        ) as a,
        bare.client(
            to_bare, mode=mode, client_info=types.Implementation(name="b", version="1")
        ) as b,
    ):
        through = [await told(a), await told(b), await told(a)]
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert through == [*expected, expected[0]]
    assert sorted(len(_actions(events)) for _, events in _tasks(db)) == [1, 2]


async def test_log_messages_and_resource_updates_reach_the_client(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    peer = Peer(roots=False)
    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    async with peer.client(_gateway(config, db), mode="legacy") as client:
        uri = (await client.list_resources()).resources[0].uri
        with _legacy():
            await client.set_logging_level("debug")
            await client.subscribe_resource(uri)
        await client.call_tool("toggle-subscriber-updates", {})
        await client.call_tool("toggle-simulated-logging", {})
        # The server sends both every 5 seconds, outside any call.
        await _wait_for(lambda: peer.notes and peer.logs, timeout=20.0)
    assert peer.notes[0]["params"]["uri"] == uri
    assert {"level", "data"} <= set(peer.logs[-1])
    [(_, events)] = _tasks(db)
    assert len(_actions(events)) == 2  # the two toggles; notifications are not calls


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_calls_progress_cancellation_and_unknown_tools_record_once(
    everything: str,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    async def drive(client: Client) -> dict[str, Any]:
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, total, message))

        seen: dict[str, Any] = {}
        long = await client.call_tool(
            LONG, {"duration": 0.2, "steps": 2}, progress_callback=on_progress
        )
        seen["long"] = _wire(long, era_stamps=True)
        seen["progress"] = progress
        with anyio.move_on_after(0.5) as scope:
            await client.call_tool(LONG, {"duration": 30, "steps": 30})
        seen["cancelled"] = scope.cancelled_caught
        for name, args in [
            ("get-structured-content", {"location": "New York"}),
            ("get-tiny-image", {}),
            ("get-resource-links", {"count": 2}),
            ("get-resource-reference", {"resourceType": "Text", "resourceId": 1}),
            ("no-such-tool", {}),
        ]:
            seen[name] = _untimed(_wire(await client.call_tool(name, args), era_stamps=True))
        return seen

    async with Peer().client(_direct(everything), mode="legacy") as client:
        expected = await drive(client)
    assert expected["cancelled"] and expected["progress"] == [(1.0, 2.0, None), (2.0, 2.0, None)]

    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    async with Peer().client(_gateway(config, db), mode=mode) as client:
        through = await drive(client)
    assert through == expected
    [(_, events)] = _tasks(db)
    tools = [e.input["tool"] for e in _actions(events)]  # type: ignore[index]
    assert tools == [
        LONG,
        LONG,
        "get-structured-content",
        "get-tiny-image",
        "get-resource-links",
        "get-resource-reference",
        "no-such-tool",
    ]
    errors = [e.result.get("error_type") for e in _actions(events)]  # type: ignore[union-attr]
    assert errors == [None, "cancelled", None, None, None, None, "unknown_tool"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unstamped(value: Any) -> Any:
    """``value`` without what differs between two runs of one task (its id and clock times)."""
    if isinstance(value, dict):
        drop = {"taskId", "createdAt", "lastUpdatedAt"}
        return {k: _unstamped(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_unstamped(v) for v in value]
    return value


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_task_augmented_calls_run_as_tasks_through_the_gateway(
    everything: str,  # noqa: F811
    tmp_path: Path,
    http_process: Any,
    transport: str,
    mode: str,
) -> None:
    """SEP-1686 (2025-11-25): tools/call with params.task, tasks/get, list, result and cancel.

    The SDK's client has no task helpers, so the requests go out as raw JSON-RPC through its
    session; the gateway's answers must be the server's own, and each task-augmented call is
    recorded once (at its result, or when it is cancelled). Through the gateway over stdio (as
    a client launches it) and over streamable HTTP (``--transport http``), from a 2025-era
    client and from a 2026-era one (``auto``: refused by this 2025-era server's ``server/discover``,
    it falls back to 2025, directly and through the gateway alike).
    """
    call = {
        "name": "simulate-research-query",
        "arguments": {"topic": "蜜蜂 bees"},
        "task": {"ttl": 60000},
    }

    async def drive(client: Client) -> dict[str, Any]:
        send = client.session._dispatcher.send_raw_request
        seen: dict[str, Any] = {}
        created = await send("tools/call", call, {})
        task_id = created["task"]["taskId"]
        seen["created"] = created
        seen["get"] = await send("tasks/get", {"taskId": task_id}, {})
        seen["list"] = await send("tasks/list", None, {})
        seen["result"] = await send("tasks/result", {"taskId": task_id}, {})
        second = await send("tools/call", call, {})
        seen["cancel"] = await send("tasks/cancel", {"taskId": second["task"]["taskId"]}, {})
        return _unstamped(seen)

    async with Client(_direct(everything), mode=mode) as client:
        caps = client.server_capabilities
        era = client.protocol_version
        expected = await drive(client)
    assert era == "2025-11-25"
    assert caps is not None and caps.tasks is not None
    assert expected["created"]["task"]["status"] == "working"
    assert "Research Report: 蜜蜂 bees" in str(expected["result"])
    assert expected["cancel"]["status"] == "cancelled"

    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", _servers(everything))
    if transport == "stdio":
        async with Client(_gateway(config, db), mode=mode) as client:
            mirrored = client.server_capabilities
            through_era = client.protocol_version
            through = await drive(client)
    else:
        port, token = _free_port(), "tasks-token"
        stdio = _gateway(config, db)
        proc = http_process(
            stdio.command,
            [*stdio.args, "--transport", "http", "--port", str(port), "--token", token],
            port,
        )
        async with authorized(f"http://127.0.0.1:{port}/mcp", token, mode=mode) as client:
            mirrored = client.server_capabilities
            through_era = client.protocol_version
            through = await drive(client)
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert mirrored is not None and mirrored.tasks == caps.tasks
    assert through_era == era
    assert through == expected
    [(_, events)] = _tasks(db)
    actions = _actions(events)
    assert [a.input["tool"] for a in actions] == ["simulate-research-query"] * 2  # type: ignore[index]
    done, cancelled = actions
    assert not done.failed and "Research Report: 蜜蜂 bees" in done.result["output"]  # type: ignore[index]
    assert cancelled.result["error_type"] == "cancelled"  # type: ignore[index]


def test_the_gateway_serves_a_stdin_that_is_a_file(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Pipes are served from the event loop; a regular file falls back to the SDK's transport."""
    import subprocess

    import orjson

    lines = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "file-client", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    config = _config(tmp_path / "s.json", _servers(everything))
    gateway = _gateway(config, tmp_path / "g.db")
    with requests.open("rb") as stdin:
        proc = subprocess.run(
            [gateway.command, *gateway.args], stdin=stdin, capture_output=True, timeout=120
        )
    answers = [orjson.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    by_id = {a.get("id"): a for a in answers}
    # Only the handshake is checked: at the end of the file the SDK ends the session, racing
    # the answers to any later request.
    assert by_id[1]["result"]["serverInfo"]["name"] == "hindsight-gateway"
    assert proc.returncode == 0


def _bin(exe: str, name: str) -> str:
    return str(Path(exe).with_name(name))


async def _files(client: Client, root: Path) -> list[Any]:
    """A small edit session on the filesystem server, as an agent would run it."""
    base = str(root)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("list_allowed_directories", {}),
        ("write_file", {"path": f"{base}/notes.md", "content": "# Notes\nalpha\nbeta\n"}),
        ("create_directory", {"path": f"{base}/sub"}),
        ("write_file", {"path": f"{base}/sub/a.txt", "content": "a"}),
        ("read_text_file", {"path": f"{base}/notes.md", "head": 2}),
        (
            "edit_file",
            {"path": f"{base}/notes.md", "edits": [{"oldText": "beta", "newText": "gamma"}]},
        ),
        ("read_multiple_files", {"paths": [f"{base}/notes.md", f"{base}/sub/a.txt"]}),
        ("list_directory", {"path": base}),
        ("directory_tree", {"path": base}),
        ("search_files", {"path": base, "pattern": "*.txt"}),
        ("move_file", {"source": f"{base}/sub/a.txt", "destination": f"{base}/b.txt"}),
        ("read_text_file", {"path": f"{base}/missing.md"}),  # an error the server reports
        ("read_text_file", {"path": "/etc/hostname"}),  # outside the allowed directories
    ]
    return [_wire(await client.call_tool(name, args), era_stamps=True) for name, args in calls]


async def test_the_filesystem_server_answers_the_same_through_the_gateway(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    exe = _bin(everything, "mcp-server-filesystem")
    root = tmp_path / "work"
    root.mkdir()
    params = _direct(exe)
    params.args = [str(root)]
    async with Client(params, mode="legacy") as client:
        tools = _wire(await client.list_tools(), era_stamps=True)
        expected = await _files(client, root)
    assert [r.get("isError", False) for r in expected][-2:] == [True, True]

    for path in sorted(root.rglob("*"), reverse=True):  # the same starting point again
        path.rmdir() if path.is_dir() else path.unlink()
    db = tmp_path / "g.db"
    config = _config(tmp_path / "s.json", {"fs": {"command": exe, "args": [str(root)]}})
    async with Client(_gateway(config, db), mode="legacy") as client:
        assert _wire(await client.list_tools(), era_stamps=True) == tools
        through = await _files(client, root)
    assert through == expected
    [(_, events)] = _tasks(db)
    actions = _actions(events)
    assert len(actions) == len(expected)
    assert [e.failed for e in actions][-2:] == [True, True]


async def _graph(client: Client) -> list[Any]:
    """Knowledge-graph calls on the memory server."""
    calls: list[tuple[str, dict[str, Any]]] = [
        (
            "create_entities",
            {
                "entities": [
                    {"name": "Ada", "entityType": "person", "observations": ["writes programs"]},
                    {"name": "Engine", "entityType": "machine", "observations": []},
                ]
            },
        ),
        (
            "create_relations",
            {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
        ),
        (
            "add_observations",
            {"observations": [{"entityName": "Engine", "contents": ["analytical"]}]},
        ),
        ("search_nodes", {"query": "analytical"}),
        ("open_nodes", {"names": ["Ada"]}),
        (
            "delete_relations",
            {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
        ),
        ("read_graph", {}),
        ("add_observations", {"observations": [{"entityName": "Nobody", "contents": ["x"]}]}),
    ]
    return [_wire(await client.call_tool(name, args), era_stamps=True) for name, args in calls]


async def test_the_memory_server_answers_the_same_through_the_gateway(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    import os

    exe = _bin(everything, "mcp-server-memory")
    env = {"PATH": os.environ["PATH"], "MEMORY_FILE_PATH": str(tmp_path / "direct.jsonl")}
    params = _direct(exe)
    params.args, params.env = [], env
    async with Client(params, mode="legacy") as client:
        tools = _wire(await client.list_tools(), era_stamps=True)
        expected = await _graph(client)
    assert expected[-1].get("isError") is True  # no such entity

    db = tmp_path / "g.db"
    env = {**env, "MEMORY_FILE_PATH": str(tmp_path / "gateway.jsonl")}
    config = _config(tmp_path / "s.json", {"memory": {"command": exe, "env": env}})
    async with Client(_gateway(config, db), mode="legacy") as client:
        assert _wire(await client.list_tools(), era_stamps=True) == tools
        through = await _graph(client)
    assert through == expected
    [(_, events)] = _tasks(db)
    assert [e.input["tool"] for e in _actions(events)] == [  # type: ignore[index]
        "create_entities",
        "create_relations",
        "add_observations",
        "search_nodes",
        "open_nodes",
        "delete_relations",
        "read_graph",
        "add_observations",
    ]


PID_SERVER = textwrap.dedent(
    '''
    """An upstream that tells its process id, so a test can kill it."""
    import os

    from mcp.server.mcpserver import MCPServer

    server = MCPServer("pid")

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool()
    def die() -> str:
        """Ends this server in the middle of the call."""
        os._exit(3)

    server.run()
    '''
)


async def test_a_crashed_stdio_upstream_is_restarted_on_the_next_call(tmp_path: Path) -> None:
    import os
    import signal

    script = tmp_path / "pid_server.py"
    script.write_text(PID_SERVER)
    db = tmp_path / "g.db"
    config = _config(
        tmp_path / "s.json", {"pid": {"command": sys.executable, "args": [str(script)]}}
    )
    async with Client(_gateway(config, db)) as client:
        first = (await client.call_tool("pid", {})).content[0].text  # type: ignore[union-attr]
        os.kill(int(first), signal.SIGKILL)
        await anyio.sleep(0.3)
        # The call that meets the dead server fails (it may have had effects, so it is never
        # resent); the next one gets a fresh server.
        failed = 0
        with anyio.fail_after(30):
            while True:
                try:
                    result = await client.call_tool("pid", {})
                    break
                except MCPError:
                    failed += 1
        second = result.content[0].text  # type: ignore[union-attr]
    assert int(second) != int(first) and failed <= 1
    [(_, events)] = _tasks(db)
    actions = _actions(events)
    assert not actions[0].failed and not actions[-1].failed
    assert len(actions) == 2 + failed
    assert [a.result.get("error_type") for a in actions[1:-1]] == ["upstream_unavailable"] * failed  # type: ignore[union-attr]


async def test_an_upstream_that_dies_during_a_call_answers_as_it_would_directly(
    tmp_path: Path,
) -> None:
    """The call in flight gets the error a direct client gets; the next call a fresh server.

    Tool calls take the gateway's raw relay (``mcp.fastpath``) here: both sides speak the 2026
    era, so the in-flight call is answered by the relay when the upstream's pipe closes.
    """
    script = tmp_path / "pid_server.py"
    script.write_text(PID_SERVER)
    params = StdioServerParameters(command=sys.executable, args=[str(script)])

    async def drive(client: Client) -> tuple[str, tuple[int, str]]:
        first = (await client.call_tool("pid", {})).content[0].text  # type: ignore[union-attr]
        with pytest.raises(MCPError) as died:
            await client.call_tool("die", {})
        return first, (died.value.code, died.value.message)

    async with Client(params) as client:
        _, expected = await drive(client)
    db = tmp_path / "g.db"
    config = _config(
        tmp_path / "s.json", {"pid": {"command": sys.executable, "args": [str(script)]}}
    )
    async with Client(_gateway(config, db)) as client:
        first, through = await drive(client)
        with anyio.fail_after(30):
            second = (await client.call_tool("pid", {})).content[0].text  # type: ignore[union-attr]
    assert through == expected == (CONNECTION_CLOSED, "Connection closed")
    assert int(second) != int(first)
    [(_, events)] = _tasks(db)
    actions = _actions(events)
    assert [a.input["tool"] for a in actions] == ["pid", "die", "pid"]  # type: ignore[index]
    assert [a.result.get("error_type") for a in actions] == [None, "upstream_unavailable", None]  # type: ignore[union-attr]


TWIN_SERVER = textwrap.dedent(
    '''
    """A second upstream whose prompt name clashes with server-everything's."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("twin")

    @server.prompt(name="simple-prompt")
    def simple() -> str:
        """The twin's simple prompt."""
        return "from the twin"

    @server.resource("twin://note", name="note")
    def note() -> str:
        return "the twin's note"

    server.run()
    '''
)


async def test_prompts_and_resources_route_to_their_upstream(
    everything: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    twin = tmp_path / "twin.py"
    twin.write_text(TWIN_SERVER)
    # The twin comes first, so a URI it does not know is only found by trying the next upstream.
    servers = {"twin": {"command": sys.executable, "args": [str(twin)]}, **_servers(everything)}
    async with Peer().client(_direct(everything), mode="legacy") as client:
        simple = _wire(await client.get_prompt("simple-prompt"), era_stamps=True)
        text7 = _untimed(
            _wire(await client.read_resource("demo://resource/dynamic/text/7"), era_stamps=True)
        )
    config = _config(tmp_path / "s.json", servers)
    async with Peer().client(_gateway(config, tmp_path / "g.db"), mode="legacy") as client:
        names = [p.name for p in (await client.list_prompts()).prompts]
        # The clashing name is offered once per upstream, prefixed; the others keep their names.
        assert "everything__simple-prompt" in names and "twin__simple-prompt" in names
        assert "simple-prompt" not in names and "args-prompt" in names
        mine = _wire(await client.get_prompt("everything__simple-prompt"), era_stamps=True)
        theirs = await client.get_prompt("twin__simple-prompt")
        uris = [r.uri for r in (await client.list_resources()).resources]
        assert "twin://note" in uris and any(u.startswith("demo://") for u in uris)
        note = await client.read_resource("twin://note")
        # A URI no listing named (from a template) is tried on each upstream in turn.
        via_template = _untimed(
            _wire(await client.read_resource("demo://resource/dynamic/text/7"), era_stamps=True)
        )
    assert mine == simple
    assert "from the twin" in str(theirs.messages[0].content)
    assert "the twin's note" in str(note.contents[0])
    assert via_template == text7
