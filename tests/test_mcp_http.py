"""Every MCP HTTP surface requires a bearer token and checks the Host header; a busy port is one line.

Real subprocesses (``hindsight mcp serve`` and ``hindsight mcp proxy``), a real MCP client, and
plain ``httpx`` for the requests an attacker would send.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from hindsight_loop.mcp.http import TOKEN_ENV, is_loopback, listen, resolve_token

pytestmark = pytest.mark.anyio

CLI = "from hindsight_loop.cli import main; main()"
REPO = Path(__file__).resolve().parents[1]

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env.update(extra)
    return env


@pytest.fixture
def started(http_process: Any) -> Any:
    """``http_process`` for this CLI, run by the test's own Python."""

    def start(args: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return http_process(sys.executable, ["-c", CLI, *args], port, env=env)

    return start


@asynccontextmanager
async def authorized(
    url: str, token: str, *, terminate_on_close: bool = True, **kwargs: Any
) -> AsyncIterator[Client]:
    """An SDK client that sends the bearer token (the SDK leaves a given HTTP client open).

    ``terminate_on_close=False``: leaving sends no ``DELETE`` (as many clients do not).
    """
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=300.0)
        ) as http,
        Client(
            streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close),
            **kwargs,
        ) as client,
    ):
        yield client


def _refusals(url: str, token: str) -> None:
    """What a process without the token, or a DNS-rebinding page, gets."""
    with httpx.Client(timeout=10) as http:
        bare = http.post(url, json=INIT, headers=MCP_HEADERS)
        assert bare.status_code == 401
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert TOKEN_ENV in bare.json()["error"]
        wrong = http.post(
            url, json=INIT, headers={**MCP_HEADERS, "authorization": f"Bearer {token}x"}
        )
        assert wrong.status_code == 401
        basic = http.post(url, json=INIT, headers={**MCP_HEADERS, "authorization": token})
        assert basic.status_code == 401
        # The right token from a page whose name resolves to 127.0.0.1 (DNS rebinding).
        rebound = http.post(
            url,
            json=INIT,
            headers={
                **MCP_HEADERS,
                "authorization": f"Bearer {token}",
                "host": f"evil.example:{url.split(':')[2].split('/')[0]}",
            },
        )
        assert rebound.status_code == 421
        ok = http.post(url, json=INIT, headers={**MCP_HEADERS, "authorization": f"Bearer {token}"})
        assert ok.status_code == 200, ok.text


async def test_serve_generates_prints_and_requires_a_token(tmp_path: Path, started: Any) -> None:
    port = _free_port()
    args = [
        "mcp",
        "serve",
        "--transport",
        "http",
        "--port",
        str(port),
        "--db",
        str(tmp_path / "m.db"),
    ]
    proc = started(args, port, _env())
    assert proc.stderr is not None
    notice = [proc.stderr.readline().decode() for _ in range(5)]
    [header] = [line for line in notice if "Authorization: Bearer " in line]
    token = header.split("Authorization: Bearer ", 1)[1].strip()
    assert len(token) >= 32 and TOKEN_ENV in "".join(notice)
    url = f"http://127.0.0.1:{port}/mcp"

    _refusals(url, token)
    for mode in ("legacy", "auto"):
        async with authorized(url, token, mode=mode) as client:
            result = await client.call_tool("recall_lessons", {"task_type": "x"})
            assert not result.is_error
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    rest = proc.stderr.read().decode()
    assert token not in rest  # printed once
    assert "Traceback" not in rest


async def test_proxy_requires_the_token_from_the_environment(tmp_path: Path, started: Any) -> None:
    fake = tmp_path / "echo_server.py"
    fake.write_text(
        "from mcp.server.mcpserver import MCPServer\n"
        "server = MCPServer('echo')\n"
        "@server.tool()\n"
        "def echo(text: str) -> str:\n"
        "    '''Echo.'''\n"
        "    return text\n"
        "server.run()\n"
    )
    config = tmp_path / "servers.json"
    config.write_bytes(
        orjson.dumps({"mcpServers": {"echo": {"command": sys.executable, "args": [str(fake)]}}})
    )
    port, token = _free_port(), "s3cret-token-from-env"
    args = ["mcp", "proxy", "--config", str(config), "--db", str(tmp_path / "g.db")]
    proc = started(
        [*args, "--transport", "http", "--port", str(port)], port, _env(**{TOKEN_ENV: token})
    )
    url = f"http://127.0.0.1:{port}/mcp"
    _refusals(url, token)
    info = types.Implementation(name="agent", version="1")
    async with authorized(url, token, client_info=info) as client:
        result = await client.call_tool("echo", {"text": "hi"})
        assert result.content[0].text == "hi"  # type: ignore[union-attr]
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert token not in err and "generated" not in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_a_busy_port_is_one_line_naming_the_option(tmp_path: Path, command: str) -> None:
    config = tmp_path / "servers.json"
    config.write_bytes(orjson.dumps({"mcpServers": {"x": {"command": "/nonexistent"}}}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--config", str(config)] if command == "proxy" else []
        proc = subprocess.run(
            [sys.executable, "-c", CLI, "mcp", command, *extra, "--transport", "http"]
            + ["--port", str(port), "--db", str(tmp_path / "x.db")],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            check=False,
        )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--port" in lines[0] and str(port) in lines[0] and "in use" in lines[0]
    assert "Traceback" not in proc.stderr


def test_token_sources_and_loopback_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    a, b = resolve_token(None), resolve_token(None)
    assert a.generated and b.generated and a.value != b.value
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(None).value == "from-env" and not resolve_token(None).generated
    assert resolve_token("from-flag").value == "from-flag"
    assert all(is_loopback(h) for h in ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.5"])
    assert not any(is_loopback(h) for h in ["0.0.0.0", "evil.example", "192.168.1.2", "::"])


def test_the_served_connections_send_without_waiting_for_acks() -> None:
    """A connection the HTTP surfaces accept has Nagle off, as on a port uvicorn binds itself.

    The surfaces serve a socket bound by ``listen`` (so a busy port is reported first);
    asyncio turns on TCP_NODELAY only for sockets that name their protocol. Without it each
    answer written in two parts waited for the client's delayed ACK.
    """
    import asyncio

    async def main() -> int:
        accepted: list[int] = []

        def made() -> asyncio.Protocol:
            class Seen(asyncio.Protocol):
                def connection_made(self, transport: Any) -> None:
                    sock = transport.get_extra_info("socket")
                    accepted.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                    transport.close()

            return Seen()

        sock = listen("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(made, sock=sock)
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        while not accepted:
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()
        return accepted[0]

    assert asyncio.run(main()) != 0
