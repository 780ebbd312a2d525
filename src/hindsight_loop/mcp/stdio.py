"""The gateway's stdio transport: the SDK's, fed by event-loop pipes instead of worker threads.

The SDK's ``stdio_server`` reads and writes the standard streams through ``anyio.wrap_file``: a
worker-thread round trip for every line read, every write and every flush. A gateway pays that
on each tool call on top of the upstream's own hop, so here the same streams are served from
asyncio pipe transports (the line framing and JSON handling stay the SDK's, which takes such
streams as its ``stdin``/``stdout`` arguments).

As the SDK does, fds 0 and 1 are pointed at the null device and stderr while serving (so stray
prints of the process and its children miss the wire) and restored afterwards. Where pipes
cannot be used (stdin a regular file, a non-asyncio loop, Windows) the SDK's transport serves.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import orjson

from hindsight_loop.mcp import era

if TYPE_CHECKING:
    from hindsight_loop.mcp.fastpath import RawRelay
    from hindsight_loop.mcp.proxy import Gateway


#: Longest line read (the SDK's own transport has no bound; a result with images can be large).
_LINE_LIMIT = 1 << 30


class _Lines:
    """The read side, as the SDK iterates it: one text line per message.

    Lines the relay takes (the hot tool calls, see ``mcp.fastpath``) never reach the SDK.
    ``first`` is the line already read by ``_pipes`` (served first).
    """

    def __init__(
        self, reader: asyncio.StreamReader, relay: RawRelay | None, first: bytes | None
    ) -> None:
        self.reader = reader
        self.relay = relay
        self.first = first

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            line, self.first = (self.first, None) if self.first is not None else (None, None)
            if line is None:
                line = await self.reader.readline()
            if not line:
                raise StopAsyncIteration
            if self.relay is None or not self.relay.take_client(line):
                return line.decode("utf-8", "replace")


async def _meet(gateway: Gateway, relay: RawRelay | None, line: bytes) -> None:
    """Set the gateway up for its one client from the client's first message.

    The upstreams are told the client capabilities it declares and asked its protocol era
    (``Gateway.connect_upstreams``), before the SDK reads the message: they are started once,
    already as this client needs them.
    """
    first = era.parse(line)
    if relay is not None:
        relay.hello(first)
    await gateway.adopt_client_capabilities(era.client_capabilities(first))
    legacy = isinstance(first, dict) and first.get("method") == "initialize"
    await gateway.connect_upstreams("legacy" if legacy else "auto")


async def _refuse_modern(
    gateway: Gateway,
    relay: RawRelay | None,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    line: bytes,
) -> bytes:
    """Answer 2026-era requests as a 2025-era upstream does, until the client falls back.

    The SDK's server decides a connection's era from its first request, so those requests are
    answered here, before it reads any (see ``mcp.era``). Returns the first line it should
    read (empty: the client left).
    """
    msg = era.parse(line)
    if not era.is_modern_request(msg) or not era.legacy_only(gateway):
        return line
    while era.is_modern_request(msg):
        writer.write(orjson.dumps(era.refusal(gateway, msg)) + b"\n")
        line = await reader.readline()
        if not line:
            return line
        msg = era.parse(line)
    if isinstance(msg, dict) and msg.get("method") == "initialize":
        # The client's handshake: who it is and what it declares, in the era it now speaks.
        if relay is not None:
            relay.hello(msg)
        await gateway.adopt_client_capabilities(era.client_capabilities(msg))
    return line


class _Out:
    """The write side, as the SDK writes it: ``write`` then ``flush`` per message."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


@asynccontextmanager
async def stdio_streams(
    relay: RawRelay | None = None, gateway: Gateway | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` for ``Server.run`` over this process's stdin/stdout.

    ``relay`` serves the hot tool calls past the SDK while pipes are in use; ``gateway`` is
    set up for the client from its first message (``_meet``) before this yields.
    """
    from mcp.server.stdio import stdio_server

    async with AsyncExitStack() as stack:
        pipes = await stack.enter_async_context(_pipes(relay, gateway)) if _can_pipe() else None
        if pipes is None:
            streams = await stack.enter_async_context(stdio_server())
        else:
            streams = await stack.enter_async_context(stdio_server(*pipes))
        yield streams


def _can_pipe() -> bool:
    try:
        asyncio.get_running_loop()  # raises under another event loop (trio)
    except RuntimeError:
        return False
    return sys.platform != "win32"


@asynccontextmanager
async def _pipes(
    relay: RawRelay | None, gateway: Gateway | None
) -> AsyncIterator[tuple[Any, Any] | None]:
    loop = asyncio.get_running_loop()
    wire_in = os.fdopen(os.dup(0), "rb", buffering=0)
    wire_out = os.fdopen(os.dup(1), "wb", buffering=0)
    transports: list[asyncio.BaseTransport] = []
    try:
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), wire_in
        )
        transports.append(read_transport)
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, wire_out
        )
        transports.append(write_transport)
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    except (OSError, ValueError):  # not a pipe, socket or tty: the SDK's transport serves
        for transport in transports:
            transport.close()
        wire_in.close()
        wire_out.close()
        yield None
        return
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    if relay is not None:
        relay.out = writer
    try:
        first = None
        if gateway is not None:
            first = await reader.readline()
            if first:
                await _meet(gateway, relay, first)
                first = await _refuse_modern(gateway, relay, reader, writer, first)
        yield _Lines(reader, relay, first), _Out(writer)
    finally:
        if relay is not None:
            relay.close()
        with suppress(Exception):  # the client is gone; nothing left to deliver
            await writer.drain()
        for transport in transports:
            transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
