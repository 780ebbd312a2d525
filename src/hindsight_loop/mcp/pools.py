"""Over HTTP, each client's servers are told exactly the client capabilities that client declared.

A client declares what it can answer (sampling, elicitation, roots) in its handshake, and a
server acts on it: server-everything lists three more tools to a client that declares sampling or
elicitation, and sends those requests only to a client that can answer them. The declaration
belongs to the connection between the gateway and an upstream, made once; an HTTP gateway serves
many clients. So clients are grouped by what they declare: the clients of one declaration share
one set of upstream connections (a pool: a ``Gateway`` of its own, told that declaration), and
each HTTP request is handed to its client's pool. The gateway's own connections serve clients
that declare none of the three. A pool starts with the first client that needs it (its servers
start then, as they would for a client connecting to them directly) and lives as long as the
gateway.

Which pool a request belongs to: a 2025-era client declares in its ``initialize`` (then its
session id leads to the pool that answered it); a 2026-era client declares in the ``_meta`` of
every request. Sessions, their tasks and the connections that tell when a client has gone are
shared by all pools, so a session is recorded as one task whichever pool serves it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import orjson

from hindsight_loop.mcp.era import client_capabilities

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from hindsight_loop.mcp.proxy import Gateway

logger = logging.getLogger("hindsight_loop.mcp.pools")

#: Distinct declarations served with upstreams of their own; a client declaring yet another one
#: is served by the gateway's own connections (which declare nothing), with a warning.
MAX_POOLS = 8
#: Session ids remembered with the pool that opened them (the oldest are forgotten first).
_SESSIONS_KEPT = 4096


def declared(capabilities: Any) -> types.ClientCapabilities:
    """The part of a client's capabilities a server acts on: sampling, elicitation, roots."""
    try:
        caps = types.ClientCapabilities.model_validate(capabilities or {}, by_name=False)
    except ValueError:  # an unreadable declaration declares nothing
        caps = types.ClientCapabilities()
    return types.ClientCapabilities(
        sampling=caps.sampling, elicitation=caps.elicitation, roots=caps.roots
    )


def _key(caps: types.ClientCapabilities) -> bytes:
    return orjson.dumps(
        caps.model_dump(by_alias=True, exclude_none=True, mode="json"),
        option=orjson.OPT_SORT_KEYS,
    )


class _Pool:
    def __init__(self) -> None:
        self.app: ASGIApp | None = None
        self.ready = anyio.Event()
        self.error: str | None = None


class Pools:
    """The pools of one HTTP gateway, and the choice of pool for each request.

    Args:
        gateway: The gateway whose own connections declare no client capability.
        host: The host the HTTP apps bind their DNS-rebinding protection to.
    """

    def __init__(self, gateway: Gateway, host: str) -> None:
        self.gateway = gateway
        self.host = host
        self.own = _key(types.ClientCapabilities())
        self.pools: dict[bytes, _Pool] = {}
        self.by_session: dict[str, _Pool] = {}

    async def route(
        self, scope: Scope, receive: Receive, send: Send, sid: str | None, own: ASGIApp
    ) -> tuple[ASGIApp, Receive, Send]:
        """The app serving this request, with ``receive``/``send`` to give it."""
        if sid is not None:
            pool = self.by_session.get(sid)
            return (pool.app or own, receive, send) if pool is not None else (own, receive, send)
        if scope.get("method") != "POST":
            return own, receive, send
        body, receive = await _buffered(receive)
        try:
            msg = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            msg = None
        caps = declared(client_capabilities(msg))
        key = _key(caps)
        if key == self.own:
            return own, receive, send
        pool = await self._pool(key, caps)
        if pool is None or pool.app is None:
            return own, receive, send
        if isinstance(msg, dict) and msg.get("method") == "initialize":
            send = self._noting_session(send, pool)
        return pool.app, receive, send

    async def _pool(self, key: bytes, caps: types.ClientCapabilities) -> _Pool | None:
        pool = self.pools.get(key)
        if pool is None:
            tg = self.gateway._tg
            if tg is None or len(self.pools) >= MAX_POOLS:
                logger.warning(
                    "%d client capability declarations are served already: a client declaring "
                    "%s is served by upstreams told none",
                    len(self.pools),
                    key.decode(),
                )
                return None
            pool = self.pools[key] = _Pool()
            tg.start_soon(self._hold, pool, caps)
        await pool.ready.wait()
        return pool if pool.error is None else None

    async def _hold(self, pool: _Pool, caps: types.ClientCapabilities) -> None:
        """Run one pool (a gateway told ``caps``) until the gateway closes."""
        from hindsight_loop.mcp.proxy import Gateway

        parent = self.gateway
        sub = Gateway(
            parent.hs,
            parent.config,
            task_type=parent.task_type,
            advise=parent.advise,
            max_output=parent.max_output,
            session_idle=parent.session_idle,
        )
        sub.declared = caps
        # One record of sessions for all pools: a session is one task, ended once.
        sub.sessions, sub.ended, sub.presence = parent.sessions, parent.ended, parent.presence
        try:
            async with sub:
                app = sub.streamable_app(host=self.host)
                async with sub.server.session_manager.run():
                    pool.app = app
                    pool.ready.set()
                    assert parent._closing is not None
                    await parent._closing.wait()
        except Exception as exc:  # a pool that cannot start leaves its clients the own one
            logger.warning("serving clients declaring %s failed: %s", _key(caps).decode(), exc)
            pool.error = str(exc) or type(exc).__name__
        finally:
            pool.app = None
            pool.ready.set()

    def _noting_session(self, send: Send, pool: _Pool) -> Send:
        """``send`` that notes the session id a pool's ``initialize`` answer gives the client."""

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name.lower() == b"mcp-session-id":
                        self.by_session[value.decode("latin-1")] = pool
                        while len(self.by_session) > _SESSIONS_KEPT:
                            del self.by_session[next(iter(self.by_session))]
            await send(message)

        return noting


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body, and a ``receive`` that hands it over again before going on."""
    chunks: list[bytes] = []
    first: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            first.append(message)  # the client left: pass that on
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}, *first]

    async def again() -> Message:
        if replay:
            return replay.pop(0)
        return await receive()

    return body, again


__all__ = ["MAX_POOLS", "Pools", "declared"]
