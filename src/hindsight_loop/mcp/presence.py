"""When an HTTP client is gone: its connections closed, and none came back for a moment.

Over stdio a client's end is plain (its pipe closes). Over streamable HTTP there is no such
moment in the protocol: a 2025-era client may send ``DELETE`` (the MCP Inspector CLI does not),
and a 2026-era client has no session at all. Watched against the gateway, the Inspector opens a
GET stream and a few POST connections and, when done, closes them all; the Python SDK does the
same when its ``Client`` closes; a killed agent's kernel closes them for it. So the signal used
here is the TCP connections themselves: a client session is present while at least one
connection that carried its requests is open, and gone once none has been open for ``linger``
seconds (a client that reconnects within that time simply goes on). A session a 2025-era client
named lingers ``DEFAULT_LINGER_S`` (the SDKs reopen a dropped GET stream within about a second,
and a client that comes back later with its session id continues its task anyway); a 2026-era
client has no session to come back to, so two runs of one client are told apart by the gap
between them, and its lingers only ``SESSIONLESS_LINGER_S`` (an HTTP client that drops an
expired idle connection opens the next one for the request it is about to send).

ASGI tells an app nothing about connections between requests, so the HTTP server reports them:
``protocol_class`` wraps uvicorn's HTTP protocol to call ``opened``/``closed``. Where no server
reports connections (another ASGI server), nothing is tracked and sessions end as before (DELETE
or the idle timeout). For this to mean "the client is done", idle connections must not be closed
by a timer on either side while the agent thinks: the server keeps them for ``KEEP_ALIVE_S`` and
says so in a ``Keep-Alive`` header (Node's HTTP client closes idle sockets after 4 s unless the
server names a longer time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

Peer = tuple[str, int]
"""A connection, as ASGI names its client end: ``scope["client"]``."""

#: Seconds a client session may have no open connection before it counts as gone.
DEFAULT_LINGER_S = 2.0
#: The same for a client without a session id (2026 era), where the gap is all there is.
SESSIONLESS_LINGER_S = 0.5
#: Seconds the server keeps an idle connection open (and tells the client it may).
KEEP_ALIVE_S = 600


class Presence:
    """Which open connections carry each client session, and when a session has none left.

    Args:
        on_gone: Called with a session key once none of its connections has been open for the
            session's linger time (given to ``bind``).
    """

    def __init__(self, on_gone: Callable[[str], None]) -> None:
        self.on_gone = on_gone
        self.lingers: dict[str, float] = {}
        self.open: dict[Peer, set[str]] = {}
        """Open connections (as reported by the server) -> the session keys they carried."""
        self.keys: dict[str, set[Peer]] = {}
        """Session key -> its open connections."""
        self.timers: dict[str, asyncio.TimerHandle] = {}

    def opened(self, peer: Peer | None) -> None:
        if peer is not None:
            self.open.setdefault(peer, set())

    def closed(self, peer: Peer | None) -> None:
        keys = self.open.pop(peer, None) if peer is not None else None
        for key in keys or ():
            peers = self.keys.get(key)
            if peers is None:
                continue
            peers.discard(peer)  # type: ignore[arg-type]
            if not peers and key not in self.timers:
                linger = self.lingers.get(key, DEFAULT_LINGER_S)
                loop = asyncio.get_running_loop()
                self.timers[key] = loop.call_later(linger, self._expire, key)

    def bind(self, key: str, peer: Any, linger: float = DEFAULT_LINGER_S) -> None:
        """Note that connection ``peer`` carried a request of session ``key``.

        ``linger``: how long ``key`` may have no open connection before it counts as gone.
        """
        if peer is None:
            return
        peer = (peer[0], peer[1])
        keys = self.open.get(peer)
        if keys is None:
            return  # not a connection the server reported (or already closed)
        if key not in keys:
            keys.add(key)
            self.keys.setdefault(key, set()).add(peer)
            self.lingers[key] = linger
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()  # the client came back in time: its session goes on

    def _expire(self, key: str) -> None:
        self.timers.pop(key, None)
        if self.keys.get(key):
            return
        self.keys.pop(key, None)
        self.lingers.pop(key, None)
        self.on_gone(key)

    def close(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()


def protocol_class(presence: Presence) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, reporting each connection's open and close to ``presence``."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class Watched(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            presence.opened(self.client)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            presence.closed(self.client)

    return Watched


__all__ = [
    "DEFAULT_LINGER_S",
    "KEEP_ALIVE_S",
    "SESSIONLESS_LINGER_S",
    "Peer",
    "Presence",
    "protocol_class",
]
