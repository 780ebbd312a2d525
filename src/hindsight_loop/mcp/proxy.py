"""The recording gateway: an MCP server that stands in front of a client's MCP servers.

Most agents reach their tools over MCP, so recording at that boundary captures every tool call of
any agent, in any language or framework, without touching its code. The client launches (stdio)
or connects to (streamable HTTP) the gateway in place of its servers; the gateway connects to each
upstream, offers their tools side by side, forwards every call untouched and records it as one
``action_executed`` event in a Hindsight task per client session.

What the client sees does not change: tool listings and results are passed through as the
upstream sent them, JSON-RPC errors keep their code, message and data. The one exception is
opt-in: with ``advise=True`` a failed call gets the most relevant recalled lessons appended as a
text block marked ``[Hindsight advice]``.

Everything else a server offers (resources, prompts, completions, logging) and the requests it
sends back (sampling, elicitation, roots) is passed through unrecorded by ``forward.py``. A
stdio upstream that dies is restarted on the next call (with backoff).

Recording stays off the hot path: ``Hindsight.record`` only enqueues (a writer thread does the
I/O), and the only extra work per call is building one dict. Over stdio, a tool call that needs
nothing of the SDK is relayed as bytes past both SDK sessions (``fastpath.py``). Recall for advice runs in a worker
thread and only after a call has failed.

Tool names: in ``auto`` naming a tool keeps its upstream name unless two upstreams offer the same
name; then each clashing tool is offered as ``<server>__<tool>``. ``prefixed`` naming always uses
``<server>__<tool>`` so names stay stable when servers are added.

Both protocol eras are handled on both sides: upstreams are reached with the SDK's ``auto`` mode
(``server/discover`` at 2026-07-28, falling back to the 2025 ``initialize`` handshake), and the
gateway serves 2025-era and 2026-era clients from the same server, except that in front of a
server that speaks only the 2025 era it speaks only that era too (``era.py``), as the server
would directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp_types import (
    CLIENT_INFO_META_KEY,
    CONNECTION_CLOSED,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    SERVER_INFO_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from hindsight_loop.mcp import era, upstream
from hindsight_loop.mcp.config import PREFIX_SEPARATOR, GatewayConfig, UpstreamConfig
from hindsight_loop.mcp.events import (
    ErrorType,
    action_event,
    advice_text,
    classify_jsonrpc_error,
    classify_result_error,
    summarize_content,
)
from hindsight_loop.mcp.fastpath import RawRelay, UpstreamLink
from hindsight_loop.mcp.forward import Forwarder, GatewayServer
from hindsight_loop.mcp.pools import Pools, declared
from hindsight_loop.mcp.presence import SESSIONLESS_LINGER_S, Presence
from hindsight_loop.models import MAX_LESSONS, new_id

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from hindsight_loop.hindsight import Hindsight

logger = logging.getLogger("hindsight_loop.mcp.proxy")
_R = TypeVar("_R")

GATEWAY_NAME = "hindsight-gateway"
#: HTTP sessions end when their client's connections are gone (``presence.py``), at the latest
#: after this long without a call (where the HTTP server does not report connections).
DEFAULT_SESSION_IDLE = 600.0
#: Sessions ended because their client went away, kept so a client that comes back with the
#: same session id gets a task that names the one it continues (at most this many).
_ENDED_KEPT = 1024
_RECALL_BUDGET_S = 2.0
_RESERVED_META_PREFIX = "io.modelcontextprotocol/"
_PROGRESS_KEYS = ("progress_token", "progressToken")
_NO_IS_ERROR = "hindsight-gateway/no-isError"
#: A lost stdio upstream is restarted on the next call, then at most every 0.5 s, 1 s, 2 s, ...
#: up to 30 s while it keeps failing; a call that succeeds resets the backoff.
_RESTART_BACKOFF_S = 0.5
_RESTART_BACKOFF_MAX_S = 30.0


@dataclass(kw_only=True, slots=True)
class Route:
    """Where a tool name the client uses leads."""

    exposed: str
    """The name the client sees."""
    upstream: str
    """The upstream server's name in the config."""
    tool: types.Tool
    """The upstream's own definition (with its own name)."""
    validator: Any = None
    """Compiled input-schema validator, built on the first failed call."""


@dataclass(kw_only=True, slots=True)
class Upstream:
    """One configured server and its live connection."""

    config: UpstreamConfig
    client: Client | None = None
    tools: list[types.Tool] = field(default_factory=list)
    instructions: str | None = None
    error: str | None = None
    """Why it is not connected, when it is not."""
    ready: anyio.Event | None = None
    """Set once the connection attempt is over (made when the gateway starts: events need a loop)."""
    lost: anyio.Event | None = None
    """Set when the live connection broke, to close it."""
    wake: anyio.Event | None = None
    """Set by a call to reconnect after the connection was lost."""
    restarts: int = 0
    """Reconnections since the last call that succeeded (drives the backoff)."""
    retry_at: float = 0.0
    """``time.monotonic()`` before which no reconnection is tried."""

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(kw_only=True, slots=True)
class SessionTask:
    """The Hindsight task recording one client session."""

    key: str
    task_id: str
    task_type: str
    client: str
    last_seen: float
    http: bool
    calls: int = 0
    failed_calls: int = 0
    last_failed: bool = False


class Gateway:
    """A recording MCP gateway in front of the servers of one config.

    Use as an async context manager (it connects the upstreams and, on exit, ends the recorded
    sessions and closes the upstreams), then serve ``gateway.server`` over any transport:
    ``await gateway.serve_stdio()``, ``gateway.http_app()``, or in tests ``Client(gateway.server)``.

    Args:
        hs: The Hindsight facade events are recorded through.
        config: Upstreams and options (see ``hindsight_loop.mcp.config``).
        task_type: Overrides the config's task type; ``None`` and none in the config uses the
            client's name (``clientInfo.name``).
        advise: Overrides the config's ``advise``.
        max_output: Bound of the result summary kept in each event.
        session_idle: Seconds without a call after which an HTTP session's task ends.
        one_client: The gateway serves one client (``serve_stdio``): its upstreams are
            connected when the client's first message arrives, told only the client
            capabilities (sampling, elicitation, roots) that client declares, so they offer it
            what they would offer it directly, and asked its protocol era. Otherwise they are
            connected on entering and told none of the three; over HTTP (``http_app``) a client
            that declares some is served by upstream connections told exactly those
            (``mcp.pools``).
    """

    def __init__(
        self,
        hs: Hindsight,
        config: GatewayConfig,
        *,
        task_type: str | None = None,
        advise: bool | None = None,
        max_output: int = 500,
        session_idle: float = DEFAULT_SESSION_IDLE,
        one_client: bool = False,
    ) -> None:
        self.hs = hs
        self.config = config
        self.task_type = task_type or config.task_type
        self.advise = config.advise if advise is None else advise
        self.max_output = max_output
        self.session_idle = session_idle
        self.upstreams: dict[str, Upstream] = {
            up.name: Upstream(config=up) for up in config.upstreams
        }
        self.routes: dict[str, Route] = {}
        self.sessions: dict[str, SessionTask] = {}
        self.ended: dict[str, SessionTask] = {}
        """2025-era HTTP sessions whose client went away (see ``_client_gone``)."""
        self.presence = Presence(self._client_gone)
        """Which HTTP connections each session uses (reported by the CLI's HTTP server)."""
        self.one_client = one_client
        self.declared = types.ClientCapabilities()
        """The client capabilities declared to the upstreams (sampling, elicitation, roots)."""
        self.pools: Pools | None = None
        """Over HTTP: the upstream connections of clients declaring capabilities."""
        self._closing: anyio.Event | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._connected = False
        self.upstream_mode = "auto"
        """The protocol era asked of the upstreams (see ``connect_upstreams``)."""
        self.forward = Forwarder(self)
        self.raw = RawRelay(self)
        self.server: Server[Any] = GatewayServer(
            GATEWAY_NAME,
            version=_version(),
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
            get_tool_input_schema=self._input_schema,
        )
        self.server.middleware.append(_keep_is_error_absent)
        self.server.middleware.append(self.forward.note_requests)
        self.server.middleware.append(self._note_connection)
        self.server.middleware.append(self.raw.relay_tasks)

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Gateway:
        closing = self._closing = anyio.Event()
        async with AsyncExitStack() as stack:
            tg = self._tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(closing.set)  # runs before the task group waits for the holders
            if not self.one_client:  # one client is waited for (``serve_stdio``)
                await self.connect_upstreams()
            tg.start_soon(self._sweep_idle, closing)
            self._stack = stack.pop_all()
        return self

    async def connect_upstreams(self, mode: str = "auto") -> None:
        """Connect every upstream (once; later calls return at once).

        ``mode`` is the protocol era asked of them: ``auto`` (2026-07-28, falling back to the
        2025 handshake) or ``legacy`` (the 2025 handshake; a server that refuses it is asked
        ``auto`` next). A one-client gateway asks its client's era, so the two sides speak the
        same one and tool calls take the raw relay (``mcp.fastpath``) rather than the SDK's
        translation between the eras.
        """
        if self._connected or self._tg is None or self._closing is None:
            return
        self._connected = True
        self.upstream_mode = mode
        for up in self.upstreams.values():
            up.ready = anyio.Event()
            self._tg.start_soon(self._hold, up, self._closing, up.ready)
        for up in self.upstreams.values():
            assert up.ready is not None
            await up.ready.wait()
        self._rebuild_routes()
        self.forward.register(self.server)
        self.server.instructions = _join_instructions(self.upstreams.values())
        for up in self.upstreams.values():
            if up.error:
                logger.warning("upstream %r is unavailable: %s", up.name, up.error)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.presence.close()
        self.end_sessions("gateway stopped")
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.__aexit__(exc_type, exc, tb)

    async def _hold(self, up: Upstream, closing: anyio.Event, ready: anyio.Event) -> None:
        """Own one upstream connection for the gateway's lifetime, reconnecting when asked.

        Each connection is entered and left in its own task (the SDK's transports are bound to
        the task that opened them), which also lets the upstreams start concurrently. After a
        connection is lost (``Upstream.lost``), the next attempt waits until a call asks for
        one (``Upstream.wake``, see ``_revive``), so a server that keeps crashing is not
        restarted in a loop.
        """
        mode = self.upstream_mode
        while True:
            up.lost = anyio.Event()
            opened = retry = False
            try:
                async with AsyncExitStack() as stack:
                    callbacks = self.forward.client_callbacks(up.name)
                    link = self.raw.link(up.name)
                    client = await stack.enter_async_context(
                        await _open_client(up.config, stack, callbacks, link, mode)
                    )
                    opened = True
                    up.tools = await _list_all_tools(client)
                    up.instructions = client.instructions
                    up.client, up.error = client, None
                    self.raw.links[up.name] = link
                    ready.set()
                    try:
                        await _first(closing, up.lost)
                    finally:
                        if self.raw.links.get(up.name) is link:
                            del self.raw.links[up.name]
                    up.client = None
            except Exception as exc:  # a server that fails to start must not take the others down
                up.client = None
                up.error = _describe(exc)
                # Refused the client's era: ask as a client would by default.
                retry = not opened and mode != "auto" and not closing.is_set()
                mode = "auto" if retry else mode
            finally:
                if not retry:
                    ready.set()
            if retry:
                continue
            if closing.is_set():
                return
            if up.wake is None:
                up.wake = anyio.Event()
            await _first(closing, up.wake)
            up.wake = None
            if closing.is_set():
                return
            assert up.ready is not None  # made by ``_revive`` before it woke this task
            ready = up.ready

    async def adopt_client_capabilities(self, capabilities: Any) -> None:
        """Declare to the upstreams what the one client declares (see ``one_client``).

        The declaration is part of the upstream's handshake, so an upstream told something else
        is reconnected (a fresh process for stdio) before the client's handshake is answered.
        """
        if not self.one_client:
            return
        wanted = declared(capabilities)
        if wanted == self.declared:
            return
        self.declared = wanted
        async with anyio.create_task_group() as tg:
            for up in self.upstreams.values():
                if up.client is not None:
                    tg.start_soon(self._reconnect, up, up.client)
        self._rebuild_routes()

    async def _reconnect(self, up: Upstream, client: Client) -> None:
        """Close ``up``'s connection and open a new one (with what is declared now)."""
        self._lost(up, client)
        ready = up.ready = anyio.Event()
        assert up.wake is not None  # made by ``_lost``
        up.wake.set()
        with anyio.move_on_after(self.config.call_timeout or 30.0):
            await ready.wait()

    async def _revive(self, up: Upstream) -> None:
        """Reconnect a lost stdio upstream for a call, at most once per backoff interval."""
        now = time.monotonic()
        if up.config.transport != "stdio" or up.wake is None or now < up.retry_at:
            return
        up.retry_at = now + min(_RESTART_BACKOFF_MAX_S, _RESTART_BACKOFF_S * 2**up.restarts)
        up.restarts += 1
        ready = up.ready = anyio.Event()
        up.wake.set()
        with anyio.move_on_after(self.config.call_timeout or 30.0):
            await ready.wait()
        if up.client is not None:
            self._rebuild_routes()
            logger.warning("upstream %r restarted", up.name)

    def _lost(self, up: Upstream, client: Client) -> None:
        """The connection ``client`` of ``up`` is broken: close it; the next call restarts it."""
        if up.client is client and up.lost is not None:
            up.client = None
            # Made now, not once the old connection is closed, so the next call can already ask.
            up.wake = anyio.Event()
            up.lost.set()

    async def _sweep_idle(self, closing: anyio.Event) -> None:
        while not closing.is_set():
            with anyio.move_on_after(min(30.0, max(self.session_idle / 4, 0.05))):
                await closing.wait()
            now = time.monotonic()
            for key, session in list(self.sessions.items()):
                if session.http and now - session.last_seen > self.session_idle:
                    self._client_gone(key, "idle")

    # -- serving ---------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve one client over this process's stdin/stdout until it disconnects."""
        from hindsight_loop.mcp.stdio import stdio_streams

        async with stdio_streams(self.raw, self) as (read_stream, write_stream):
            if self.raw.out is None:  # the SDK's transport serves: nothing was read yet
                await self.connect_upstreams()
            if self.raw.out is not None and isinstance(self.server, GatewayServer):
                # Task-augmented calls are relayed by the raw relay alone (pipes, same era).
                self.server.tasks_capability = self.raw.tasks_capability()
            await self.server.run(
                read_stream, write_stream, self.server.create_initialization_options()
            )

    def http_app(self, *, host: str = "127.0.0.1", keep_alive: int | None = None) -> ASGIApp:
        """A Starlette app serving streamable HTTP at ``/mcp`` (both protocol eras).

        Binds the SDK's DNS-rebinding protection to ``host``; a 2025-era client's ``DELETE``
        of its session ends that session's task, and so does a client whose connections are
        gone, where the HTTP server reports them to ``presence`` (``presence.protocol_class``).
        ``keep_alive``: the seconds the server keeps an idle connection, told to clients in a
        ``Keep-Alive`` header so they keep theirs as long (see ``presence.py``).
        """
        self.pools = Pools(self, host)
        return _SessionEndWatcher(self.streamable_app(host=host), self, keep_alive)

    def streamable_app(self, *, host: str = "127.0.0.1") -> ASGIApp:
        """The SDK's streamable HTTP app of ``self.server`` (one pool's, see ``mcp.pools``)."""
        if isinstance(self.server, GatewayServer):
            # Task-augmented calls are relayed as bytes to stdio upstreams (see mcp.fastpath).
            self.server.tasks_capability = self.raw.tasks_capability()
        return self.server.streamable_http_app(host=host)

    # -- sessions --------------------------------------------------------------------------

    def session_for(self, ctx: ServerRequestContext[Any, Any]) -> SessionTask:
        """The task of the client session this request belongs to (started on first use)."""
        client_name = _client_name(ctx)
        key = _session_key(ctx, client_name)
        return self.session(key, client_name, ctx.protocol_version, http=key != "local")

    async def _note_connection(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        """Server middleware: the HTTP connection of each request belongs to its session."""
        request = ctx.request
        if ctx.method != "initialize" and getattr(request, "headers", None) is not None:
            assert request is not None
            key = _session_key(ctx, _client_name(ctx))
            if not key.startswith("http:"):  # a named session's connections are bound below
                self.presence.bind(key, request.scope.get("client"), SESSIONLESS_LINGER_S)
        return await call_next(ctx)

    def _client_gone(self, key: str, reason: str = "client disconnected") -> None:
        """No connection of an HTTP session's client is open any more (or it was idle too long):
        its task ends; a 2025-era session is kept so a return names the task it continues."""
        session = self.sessions.get(key)
        if session is None:
            return
        self.end_session(key, reason)
        if key.startswith("http:"):
            self.ended[key] = session
            while len(self.ended) > _ENDED_KEPT:
                del self.ended[next(iter(self.ended))]

    def session(
        self, key: str, client_name: str, protocol_version: str, *, http: bool
    ) -> SessionTask:
        """The task of the client session ``key`` (started on first use)."""
        session = self.sessions.get(key)
        now = time.monotonic()
        if session is None:
            # A client that comes back with its session id after its connections were gone
            # (its task ended then, and may have been reviewed since): a new task, which names
            # the one it continues. A task ends once.
            resumed = self.ended.pop(key, None)
            session = SessionTask(
                key=key,
                task_id=new_id("tsk"),
                task_type=resumed.task_type
                if resumed is not None
                else self.task_type or _task_type_from(client_name),
                client=client_name,
                last_seen=now,
                http=http,
            )
            self.sessions[key] = session
            source: dict[str, Any] = {
                "kind": "mcp_gateway",
                "client": client_name,
                "protocol_version": protocol_version,
                "upstreams": sorted(self.upstreams),
            }
            goal = f"MCP session of {client_name} through the Hindsight gateway"
            if resumed is not None:
                source["continues"] = resumed.task_id
                goal += " (resumed)"
            self.hs.record(
                {
                    "type": "task_start",
                    "task_id": session.task_id,
                    "timestamp": time.time_ns(),
                    "task_type": session.task_type,
                    "goal": goal,
                    "tools": sorted(self.routes),
                    "scope": "global",
                    "source": source,
                }
            )
        session.last_seen = now
        return session

    def end_session(self, key: str, reason: str = "session closed") -> None:
        """Record the end of one session's task (no-op for an unknown key)."""
        session = self.sessions.pop(key, None)
        if session is None:
            return
        # The gateway cannot see whether the user's goal was met; a session whose last call
        # failed ended on an error the agent did not recover from, which is the best signal here.
        self.hs.record(
            {
                "type": "task_end",
                "task_id": session.task_id,
                "timestamp": time.time_ns(),
                "result": {
                    "status": "failed" if session.last_failed else "succeeded",
                    "reason": reason,
                    "calls": session.calls,
                    "failed_calls": session.failed_calls,
                },
            }
        )

    def end_sessions(self, reason: str = "gateway stopped") -> None:
        """End every open session's task (the gateway is shutting down)."""
        for key in list(self.sessions):
            self.end_session(key, reason)

    # -- tools -----------------------------------------------------------------------------

    def _rebuild_routes(self) -> None:
        owners: dict[str, int] = {}
        for up in self.upstreams.values():
            for tool in up.tools:
                owners[tool.name] = owners.get(tool.name, 0) + 1
        routes: dict[str, Route] = {}
        for up in self.upstreams.values():
            for tool in up.tools:
                prefixed = self.config.tool_naming == "prefixed" or owners[tool.name] > 1
                exposed = f"{up.name}{PREFIX_SEPARATOR}{tool.name}" if prefixed else tool.name
                old = self.routes.get(exposed)
                keep = old is not None and old.upstream == up.name and old.tool == tool
                routes[exposed] = (
                    old
                    if keep and old is not None
                    else Route(exposed=exposed, upstream=up.name, tool=tool)
                )
        self.routes = routes

    async def refresh_tools(self) -> None:
        """Re-list every connected upstream's tools (tools can change at run time)."""

        async def one(up: Upstream) -> None:
            if up.client is None:
                return
            try:
                up.tools = await _list_all_tools(up.client)
            except Exception as exc:  # keep the last listing; the call path reports the outage
                logger.warning("listing tools of %r failed: %s", up.name, _describe(exc))

        async with anyio.create_task_group() as tg:
            for up in self.upstreams.values():
                tg.start_soon(one, up)
        self._rebuild_routes()

    def _clashes(self, name: str) -> bool:
        """Whether ``name`` is an upstream tool name hidden behind prefixed names."""
        return any(r.tool.name == name and r.exposed != name for r in self.routes.values())

    def _first_upstream(self) -> Upstream:
        """The upstream that answers calls no upstream claims: the first connected one."""
        ups = list(self.upstreams.values())
        return next((up for up in ups if up.client is not None), ups[0])

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        route = self.routes.get(name)
        return route.tool.input_schema if route is not None else None

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self.refresh_tools()
        tools = [
            r.tool if r.exposed == r.tool.name else r.tool.model_copy(update={"name": r.exposed})
            for r in self.routes.values()
        ]
        return types.ListToolsResult(tools=tools)

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        session = self.session_for(ctx)
        name = params.name
        route = self.routes.get(name)
        if route is None and len(self.upstreams) > 1:
            await self.refresh_tools()  # a tool may have appeared since the last listing
            route = self.routes.get(name)
        call = _Call(
            session=session, tool=name, arguments=params.arguments, known=route is not None
        )
        if route is not None:
            up, call.upstream_tool = self.upstreams[route.upstream], route.tool.name
        elif len(self.upstreams) == 1 or not self._clashes(name):
            # The client gets exactly the answer a server gives to an unknown name (its own
            # error or isError result, in its own era's shape): with several upstreams, the
            # first connected one's, as if it were the only server.
            up, call.upstream_tool = self._first_upstream(), name
        else:
            # A name offered by several upstreams is only reachable by its prefixed names.
            message = f"Unknown tool: {name}"
            raise await self._fail(call, "unknown_tool", message, INVALID_PARAMS)
        call.server = up.name
        if up.client is None:
            await self._revive(up)
        if up.client is None:
            message = f"MCP server '{up.name}' is unavailable: {up.error or 'not connected'}"
            raise await self._fail(call, "upstream_unavailable", message, INTERNAL_ERROR)

        client = up.client
        try:
            with anyio.fail_after(self.config.call_timeout):
                async with self.forward.calling(up, ctx):
                    result = await _forward(client, call.upstream_tool, params, ctx)
        except anyio.get_cancelled_exc_class():
            # The client cancelled (or the gateway is stopping): the call still happened.
            call.done()
            self._record(call, error_type="cancelled", message="cancelled before it answered")
            raise
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost(up, client)
            etype = classify_jsonrpc_error(exc.code, exc.message, known_tool=call.known)
            raise await self._fail(call, etype, exc.message, exc.code, original=exc) from None
        except TimeoutError:
            message = f"Tool '{name}' did not answer within {self.config.call_timeout:g}s"
            raise await self._fail(call, "timeout", message, REQUEST_TIMEOUT) from None
        except Exception as exc:  # transport failures: the server died or is unreachable
            self._lost(up, client)
            message = f"MCP server '{up.name}' is unavailable: {_describe(exc)}"
            raise await self._fail(call, "upstream_unavailable", message, INTERNAL_ERROR) from exc
        call.done()
        up.restarts = 0
        if isinstance(result, types.InputRequiredResult):
            self.record_result(call, route, input_requests=result.input_requests or {})
            return result
        result = _for_client_era(result, ctx.protocol_version)
        typed = result
        output = self.record_result(call, route, is_error=result.is_error, model=lambda: typed)
        if not result.is_error:
            return _mark_is_error_absent(result)
        if self.advise:
            lessons = await self._recall(session, name, output)
            if lessons:
                block = types.TextContent(type="text", text=advice_text(lessons))
                result = result.model_copy(update={"content": [*result.content, block]})
        return result

    def record_result(
        self,
        call: _Call,
        route: Route | None,
        *,
        is_error: bool = False,
        model: Callable[[], types.CallToolResult] | None = None,
        summary: str | None = None,
        input_requests: Iterable[str] | None = None,
    ) -> str:
        """Record a call the upstream answered with a result; returns the output summary.

        The one place a tool result becomes an event, for the SDK path (a typed result) and
        the raw relay (a parsed dict, see ``mcp.fastpath``): ``model`` builds the typed result
        only when it is needed (a failure to classify, or no ``summary`` given), so the relay's
        successes never build one.

        Args:
            call: The call.
            route: Where the tool name led (its input schema tells invalid arguments apart).
            is_error: The result's ``isError``.
            model: The result as the SDK's model (called at most once).
            summary: The output summary when the caller already has it.
            input_requests: A 2026-era ``input_required`` result's request names: the client
                answers and calls again with the request state (forwarded like any call);
                this round is recorded as such.
        """
        if input_requests is not None:
            output = f"[input required: {', '.join(input_requests)}]"
            self._record(call, output=output)
            return output
        result = model() if model is not None and (is_error or summary is None) else None
        if summary is None:
            summary = summarize_content(result, self.max_output) if result is not None else ""
        if not is_error:
            self._record(call, output=summary)
            return summary
        etype = classify_result_error(
            result or types.CallToolResult(content=[], is_error=True),
            known_tool=call.known,
            arguments_fit=_arguments_fit(route, call.arguments),
        )
        self._record(call, output=summary, is_error=True, error_type=etype, message=summary)
        return summary

    def _record(
        self,
        call: _Call,
        *,
        output: str | None = None,
        is_error: bool = False,
        error_type: ErrorType | None = None,
        message: str | None = None,
        code: int | None = None,
    ) -> None:
        """One ``action_executed`` event for the call (non-blocking: the recorder only enqueues)."""
        session = call.session
        session.calls += 1
        session.last_failed = error_type is not None
        session.failed_calls += error_type is not None
        self.hs.record(
            action_event(
                task_id=session.task_id,
                tool=call.tool,
                arguments=call.arguments,
                server=call.server,
                timestamp=call.timestamp,
                latency_ms=call.latency_ms,
                output=output,
                is_error=is_error,
                error_type=error_type,
                error_message=message[: self.max_output] if message is not None else None,
                error_code=code,
                upstream_tool=call.upstream_tool,
            )
        )

    async def _fail(
        self,
        call: _Call,
        error_type: ErrorType,
        message: str,
        code: int,
        *,
        original: MCPError | None = None,
    ) -> MCPError:
        """Record a call that ended in a JSON-RPC error, and build the error the client gets.

        The client gets the upstream's own error untouched; only with ``advise`` are lessons
        added to the message (the one text an error carries).
        """
        call.done()
        self._record(call, error_type=error_type, message=message, code=code)
        suffix = ""
        if self.advise:
            lessons = await self._recall(call.session, call.tool, message)
            suffix = "\n\n" + advice_text(lessons) if lessons else ""
        if original is not None and not suffix:
            return original
        return MCPError(code, message + suffix, original.data if original is not None else None)

    async def _recall(self, session: SessionTask, tool: str, error: str) -> list[Any]:
        """Lessons for a failed call (at most 3); never raises, never waits long."""

        def recall() -> list[Any]:
            return self.hs.recall(
                task_type=session.task_type, tools=[tool], query=error, limit=MAX_LESSONS
            )

        try:
            with anyio.move_on_after(_RECALL_BUDGET_S):
                return list_or_set(await anyio.to_thread.run_sync(recall, abandon_on_cancel=True))
        except Exception:  # advice is a bonus; a broken recall must not break the tool call
            logger.exception("recall for advice failed")
        return []


@dataclass(kw_only=True, slots=True)
class _Call:
    """One tools/call on its way through the gateway."""

    session: SessionTask
    tool: str
    arguments: dict[str, Any] | None
    known: bool
    """Whether an upstream listed the tool."""
    server: str | None = None
    upstream_tool: str | None = None
    timestamp: int = field(default_factory=time.time_ns)
    started: float = field(default_factory=time.perf_counter)
    latency_ms: float = 0.0

    def done(self) -> None:
        self.latency_ms = (time.perf_counter() - self.started) * 1000


def list_or_set(value: Any) -> list[Any]:
    """Keep a ``LessonSet`` as is (it renders itself), turn anything else into a list."""
    return value if isinstance(value, list) else list(value or [])


def _mark_is_error_absent(result: types.CallToolResult) -> types.CallToolResult:
    """Flag a result whose upstream sent no ``isError``, for ``_keep_is_error_absent``.

    The SDK's server re-serializes every result from its model, where ``isError`` defaults to
    false, so the field would appear on results that never had it. The flag rides in ``_meta``
    (the one open map that survives that step) and is taken off again on the way out.
    """
    if "is_error" in result.model_fields_set:
        return result
    meta = {**(result.meta or {}), _NO_IS_ERROR: True}
    return result.model_copy(update={"meta": meta})


async def _keep_is_error_absent(ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
    """Server middleware: drop the ``isError: false`` the SDK added where the upstream sent none."""
    result = await call_next(ctx)
    if ctx.method != "tools/call" or not isinstance(result, dict):
        return result
    meta = result.get("_meta")
    if not isinstance(meta, dict) or _NO_IS_ERROR not in meta:
        return result
    result = dict(result)
    rest = {k: v for k, v in meta.items() if k != _NO_IS_ERROR}
    if rest:
        result["_meta"] = rest
    else:
        del result["_meta"]
    if result.get("isError") is False:
        del result["isError"]
    return result


class _SessionEndWatcher:
    """ASGI wrapper: a 2025-era client's ``DELETE /mcp`` ends its session's task.

    Every request naming a session (its GET stream too, which no handler sees) ties its
    connection to that session (``Gateway.presence``); with ``keep_alive`` each response tells
    the client how long the server keeps an idle connection.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway, keep_alive: int | None = None) -> None:
        self.app = app
        self.gateway = gateway
        self.hint = (b"keep-alive", f"timeout={keep_alive}".encode()) if keep_alive else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if era.modern_http(scope) and era.legacy_only(self.gateway):
            await era.refuse_http(self.gateway, scope, receive, send)  # the client falls back
            return
        sid = None
        for name, value in scope.get("headers", []):
            if name == b"mcp-session-id":
                sid = value.decode("latin-1")
                self.gateway.presence.bind(f"http:{sid}", scope.get("client"))
        app = self.app
        pools = self.gateway.pools
        if pools is not None:  # the upstreams told what this client declared
            app, receive, send = await pools.route(scope, receive, send, sid, app)
        hint = self.hint
        if hint is not None:
            inner = send

            async def send(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), hint]}
                await inner(message)

        await app(scope, receive, send)
        if sid is not None and scope.get("method") == "DELETE":
            self.gateway.end_session(f"http:{sid}", "session closed")


# -- helpers -------------------------------------------------------------------------------


@dataclass
class _UpstreamClient(Client):
    """The SDK's client, declaring exactly the client capabilities it is given.

    The SDK declares a capability from the callback given for it, in a fixed form (elicitation
    as form and URL, roots with list changes), and servers act on the parts: server-everything
    offers its URL-elicitation tool only to a client that declares ``elicitation.url``.
    """

    declared: types.ClientCapabilities | None = field(default=None, kw_only=True)

    async def _build_session(self, exit_stack: AsyncExitStack) -> Any:
        session = await super()._build_session(exit_stack)
        declared = self.declared
        build = getattr(session, "_build_capabilities", None)
        if declared is None or build is None:  # another SDK: its own declaration stands
            return session

        def exact(version: str) -> types.ClientCapabilities:
            caps = build(version)
            parts = {"sampling": declared.sampling, "elicitation": declared.elicitation}
            return caps.model_copy(update={**parts, "roots": declared.roots})

        session._build_capabilities = exact  # type: ignore[method-assign]
        return session


async def _open_client(
    config: UpstreamConfig,
    stack: AsyncExitStack,
    callbacks: dict[str, Any],
    link: UpstreamLink | None = None,
    mode: str = "auto",
) -> Client:
    """A client for one upstream; ``callbacks`` relay its server-to-client traffic to clients.

    ``link`` carries the hot tool calls past the SDK (see ``mcp.fastpath``) on the gateway's
    own stdio transport; ``mode`` is the protocol era asked (``Client``'s ``mode``).
    """
    info = types.Implementation(name=GATEWAY_NAME, version=_version())
    callbacks = {**callbacks, "mode": mode}
    if config.transport == "stdio":
        assert config.command is not None
        params = StdioServerParameters(
            command=config.command, args=config.args, env=config.env or None, cwd=config.cwd
        )
        if upstream.can_serve():  # its process is the gateway's to stop (see mcp.upstream)
            transport = upstream.upstream_stdio(params, link=link)
            return _UpstreamClient(transport, client_info=info, **callbacks)
        return _UpstreamClient(params, client_info=info, **callbacks)
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert config.url is not None
    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers=config.headers, timeout=httpx2.Timeout(30.0, read=300.0))
    )
    transport = streamable_http_client(config.url, http_client=http)
    return _UpstreamClient(transport, client_info=info, **callbacks)


_CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)


async def _forward(
    client: Client,
    name: str,
    params: types.CallToolRequestParams,
    ctx: ServerRequestContext[Any, Any],
) -> types.CallToolResult | types.InputRequiredResult:
    """Send one tools/call upstream and return its result as the server sent it.

    ``Client.call_tool`` would also check structured content against the tool's output schema
    and resolve input requests itself; a gateway must do neither. The client behind it does its
    own checking (and answers its own input requests), so a result that the client would reject
    from the server directly is rejected by it here too, and the check is not paid twice.
    """
    meta, wants_progress = _forwarded_meta(ctx.meta)
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(
            name=name,
            arguments=params.arguments,
            input_responses=params.input_responses,
            request_state=params.request_state,
            _meta=meta,
        )
    )
    on_progress = None
    if wants_progress:
        # The upstream reports against the gateway's own token; the client hears it against its own.
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

    send = client.session.send_request
    try:
        return await send(request, _CALL_RESULT, progress_callback=on_progress)
    except MCPError as exc:
        if exc.code != HEADER_MISMATCH:
            raise
        # 2026-07-28: the upstream's schema changed since we listed it; re-list, resend once.
        await client.list_tools(cache_mode="refresh")
        return await send(request, _CALL_RESULT, progress_callback=on_progress)


def _forwarded_meta(meta: Any) -> tuple[Any, bool]:
    """The client's request ``_meta`` as it goes upstream, and whether it asked for progress.

    Everything the client put there travels (tracing ids, vendor keys) except what belongs to
    the hop: the progress token (the gateway's session issues its own and relays the
    notifications) and the reserved ``io.modelcontextprotocol/`` keys (client info, protocol
    version and capabilities, which the gateway's session stamps for itself).
    """
    if not meta:
        return None, False
    # Parsed request meta names the token in Python (``progress_token``); raw meta in JSON.
    wants_progress = any(meta.get(k) is not None for k in _PROGRESS_KEYS)
    kept = {
        k: v
        for k, v in meta.items()
        if k not in _PROGRESS_KEYS and not k.startswith(_RESERVED_META_PREFIX)
    }
    return kept or None, wants_progress


async def _list_all_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a paginator that never ends must not hang startup
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _unavailable(up: Upstream) -> MCPError:
    return MCPError(
        INTERNAL_ERROR, f"MCP server '{up.name}' is unavailable: {up.error or 'not connected'}"
    )


def _for_client_era(result: _R, version: str) -> _R:
    """Drop the upstream's 2026-era ``serverInfo`` stamp when the client speaks the 2025 era.

    The stamp is part of a 2026 response envelope; a 2025 client talking to the server directly
    would never see it. A 2026 client keeps it, exactly as the upstream sent it.
    """
    meta = getattr(result, "meta", None)
    if not meta or SERVER_INFO_META_KEY not in meta or version in MODERN_PROTOCOL_VERSIONS:
        return result
    rest = {k: v for k, v in meta.items() if k != SERVER_INFO_META_KEY}
    return result.model_copy(update={"meta": rest or None})  # type: ignore[attr-defined, no-any-return]


def _arguments_fit(route: Route | None, arguments: dict[str, Any] | None) -> bool | None:
    """Whether the arguments validate against the tool's input schema (``None``: can't tell)."""
    if route is None or not route.tool.input_schema:
        return None
    try:
        if route.validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(route.tool.input_schema)
            route.validator = cls(route.tool.input_schema)
        return bool(route.validator.is_valid(arguments or {}))
    except Exception:  # a schema the validator cannot read says nothing about the call
        return None


def _client_name(ctx: ServerRequestContext[Any, Any]) -> str:
    params = ctx.session.client_params
    if params is not None and params.client_info.name:
        return params.client_info.name
    info = (ctx.meta or {}).get(CLIENT_INFO_META_KEY) if isinstance(ctx.meta, dict) else None
    if isinstance(info, dict) and isinstance(info.get("name"), str) and info["name"]:
        return info["name"]
    return "mcp-client"


def _session_key(ctx: ServerRequestContext[Any, Any], client_name: str) -> str:
    """Which client session a request belongs to.

    Over HTTP a 2025-era client names its session; a 2026-era client has none, so its runs are
    told apart by client name and host, one run at a time: a run ends when its connections are
    gone (``presence.py``), and the next call starts the next run's task.
    """
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        # stdio (and in-process): one gateway process serves exactly one client.
        return "local"
    sid = headers.get("mcp-session-id")
    if sid:
        return f"http:{sid}"
    peer = getattr(getattr(request, "client", None), "host", None) or "?"
    return f"http-client:{client_name}@{peer}"


def _task_type_from(client_name: str) -> str:
    slug = "".join(ch if ch.isalnum() else "_" for ch in client_name.strip().lower()).strip("_")
    return f"mcp:{slug or 'client'}"


def _join_instructions(upstreams: Iterable[Upstream]) -> str | None:
    """The upstreams' instructions; each labelled with its server when there are several."""
    given = [up for up in upstreams if up.instructions]
    if len(given) == 1:
        return given[0].instructions
    return "\n\n".join(f"[{up.name}] {up.instructions}" for up in given) or None


async def _first(*events: anyio.Event) -> None:
    """Wait until any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("hindsight-loop")
    except Exception:
        return "0"


__all__ = ["DEFAULT_SESSION_IDLE", "GATEWAY_NAME", "Gateway", "Route", "SessionTask"]
