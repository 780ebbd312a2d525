"""The gateway's client transport to a stdio upstream, whose process the gateway can stop at once.

The SDK's ``stdio_client`` keeps the server process to itself, so the gateway could not act on
the signal its own client sends: a client stops a stdio server by closing its stdin, then
SIGTERM two seconds later, then SIGKILL (the TypeScript SDK, which the MCP Inspector uses, and
the Python SDK alike). Through the gateway the upstream only learnt of the first step: the SDK
waited out its own two seconds of grace, the client's SIGTERM then killed the gateway in the
middle of it, and the upstream (in a session of its own, so the signal never reached it) lived
on, holding the client's stderr pipe open; the client then hung until it died (server-everything:
60 s). Here the gateway sees each step through to its upstreams as a direct client would have
sent it: stdin closed when the client closes the gateway's, SIGTERM to the upstream's process
group as soon as the gateway gets one (``stop_now``), SIGKILL after the same grace.

The framing is the SDK's (one JSON-RPC message a line, parsed by the SDK's own adapter), read
and written on event-loop pipes. asyncio only: under another event loop the SDK's transport
serves (see ``proxy._open_client``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from hindsight_loop.mcp.stdio import _LINE_LIMIT

if TYPE_CHECKING:
    from hindsight_loop.mcp.fastpath import UpstreamLink

logger = logging.getLogger(__name__)

#: Seconds between closing an upstream's stdin and SIGTERM, then between SIGTERM and SIGKILL:
#: what the SDKs' own clients grant a server.
GRACE_S = 2.0

#: Process groups of the live upstreams, so a signal handler can stop them all at once.
_LIVE: dict[int, asyncio.Event] = {}


def can_serve() -> bool:
    """Whether this transport can run here (an asyncio loop on POSIX)."""
    try:
        asyncio.get_running_loop()  # raises under another event loop (trio)
    except RuntimeError:
        return False
    return sys.platform != "win32"


def stop_now() -> None:
    """SIGTERM every live upstream at once (the gateway got a SIGTERM or SIGINT itself)."""
    for pgid, asked in list(_LIVE.items()):
        asked.set()
        _signal_group(pgid, signal.SIGTERM)


@asynccontextmanager
async def upstream_stdio(
    server: StdioServerParameters, *, link: UpstreamLink | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` to a spawned stdio server, as ``Client`` takes them.

    With ``link``, lines the gateway writes itself go straight to the server's stdin and the
    answers to them are taken off the read side before the SDK parses anything (see
    ``mcp.fastpath``).
    """
    process = await asyncio.create_subprocess_exec(
        server.command,
        *server.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=None,  # the server's log goes where the gateway's goes, as it would directly
        env=get_default_environment() | (server.env or {}),
        cwd=server.cwd,
        start_new_session=True,  # its own process group: stopped as a whole, like the SDK does
        limit=_LINE_LIMIT,
    )
    asked = _LIVE[process.pid] = asyncio.Event()
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout
    if link is not None:
        link.attach(stdin.write)

    async def read() -> None:
        async with to_session:
            while line := await stdout.readline():
                if link is not None and link.take(line):
                    continue
                try:
                    item: SessionMessage | Exception = SessionMessage(
                        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    )
                except ValueError as exc:  # surfaced to the session, as the SDK does
                    item = exc
                if (
                    link is not None
                    and link.probe_id is not None
                    and isinstance(item, SessionMessage)
                ):
                    answered = getattr(item.message, "id", None)
                    if answered == link.probe_id and not hasattr(item.message, "method"):
                        link.discover_answer, link.probe_id = line, None
                try:
                    await to_session.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
            if link is not None:
                link.detach()
            # Drained to the end, so a server flushing output on its way out never blocks.
            while await stdout.read(1 << 16):
                pass

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    sent = message.message
                    if link is not None and getattr(sent, "method", None) == "server/discover":
                        # What the server says to a 2026-era client (see mcp.era).
                        link.probe_id = getattr(sent, "id", None)
                    body = sent.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write(body.encode("utf-8") + b"\n")
                    await stdin.drain()
        except (ConnectionError, OSError):
            await to_session.aclose()  # the session sees the connection end, not a hang

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    write_stream.close()
                    read_stream.close()
                    await _stop(process, asked)
                tg.cancel_scope.cancel()
    finally:
        if link is not None:
            link.detach()
        _LIVE.pop(process.pid, None)
        if process.returncode is None:  # cancelled before the stop ran: never leave it behind
            _signal_group(process.pid, signal.SIGKILL)


async def _stop(process: asyncio.subprocess.Process, asked: asyncio.Event) -> None:
    """stdin closed; SIGTERM to the group after the grace, or as soon as ``asked``; SIGKILL last."""
    assert process.stdin is not None
    with suppress(OSError):
        process.stdin.close()
    if not await _exited(process, GRACE_S, asked):
        _signal_group(process.pid, signal.SIGTERM)
        if not await _exited(process, GRACE_S, None):
            _signal_group(process.pid, signal.SIGKILL)
            await _exited(process, GRACE_S, None)
    # Members of the group that outlived their leader would keep pipes (and a client) waiting.
    _signal_group(process.pid, signal.SIGKILL)


async def _exited(
    process: asyncio.subprocess.Process, timeout: float, asked: asyncio.Event | None
) -> bool:
    """Whether ``process`` ended within ``timeout`` (``False`` at once when ``asked`` is set)."""
    waits = [asyncio.ensure_future(process.wait())]
    if asked is not None:
        waits.append(asyncio.ensure_future(asked.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return process.returncode is not None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
