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
from typing import Any

#: Longest line read (the SDK's own transport has no bound; a result with images can be large).
_LINE_LIMIT = 1 << 30


class _Lines:
    """The read side, as the SDK iterates it: one text line per message."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self.reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _Out:
    """The write side, as the SDK writes it: ``write`` then ``flush`` per message."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` for ``Server.run`` over this process's stdin/stdout."""
    from mcp.server.stdio import stdio_server

    async with AsyncExitStack() as stack:
        pipes = await stack.enter_async_context(_pipes()) if _can_pipe() else None
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
async def _pipes() -> AsyncIterator[tuple[Any, Any] | None]:
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
    try:
        yield _Lines(reader), _Out(writer)
    finally:
        with suppress(Exception):  # the client is gone; nothing left to deliver
            await writer.drain()
        for transport in transports:
            transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
