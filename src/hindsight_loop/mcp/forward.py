"""Forwarding of everything besides tool calls: resources, prompts, completions, logging, and the
requests a server sends its client (sampling, elicitation, roots).

The gateway exists to record tool calls, but a client that has to choose between recording and
the rest of MCP would not put it in front of its servers: everything a client can do with a
server directly must work through the gateway. None of this is recorded (it is not an action of
the agent); it is passed through as the upstream or the client sent it.

What the gateway offers mirrors its upstreams: a request kind is only served (and so only
declared in the gateway's capabilities) when at least one connected upstream declares it. With
several upstreams, each request goes where its name or URI came from: prompts by name (prefixed
on a clash, like tools), resources by the upstream that listed the URI (a URI no listing named,
as from a template, is tried on each upstream in order), completions by the prompt or resource
their reference names.

Server-to-client requests go the other way: the gateway's connection to each upstream declares
what its client declared of sampling, elicitation and roots (``Gateway.declared``), and relays
each request to the client whose call is in flight on that upstream, answering with the client's
result or error. So a server that offers some tools only to clients able to answer its requests
lists the same tools through the gateway as directly, and never asks a client that cannot
answer. Over stdio the one client's declaration is adopted before the upstreams start; over
HTTP each client is served by connections told its own declaration (``mcp.pools``). A client
that did not declare a capability a server asks for anyway gets the answer an SDK client without
that callback gives: ``INVALID_REQUEST`` "... not supported".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.shared.message import ServerMessageMetadata
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from hindsight_loop.mcp.config import PREFIX_SEPARATOR

if TYPE_CHECKING:
    from hindsight_loop.mcp.proxy import Gateway, Upstream

logger = logging.getLogger("hindsight_loop.mcp.forward")

#: How long a server-to-client request waits for a client to connect (an upstream may ask for
#: roots as soon as the gateway connects to it, before the client has connected to the gateway).
CLIENT_WAIT_S = 60.0
_MAX_PAGES = 100

_READ_RESULT: TypeAdapter[types.ReadResourceResult | types.InputRequiredResult] = TypeAdapter(
    types.ReadResourceResult | types.InputRequiredResult
)
_PROMPT_RESULT: TypeAdapter[types.GetPromptResult | types.InputRequiredResult] = TypeAdapter(
    types.GetPromptResult | types.InputRequiredResult
)
_RELAYED_NOTIFICATIONS = (
    types.ResourceUpdatedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
    types.ToolListChangedNotification,
    types.TaskStatusNotification,
)


class GatewayServer(Server[Any]):
    """The SDK's low-level server, with list-changed flags that mirror the upstreams'.

    The SDK derives capabilities from the registered handlers, except the ``listChanged`` flags,
    which every transport asks for with no options; these come from the upstreams here.
    """

    notification_options: NotificationOptions | None = None
    tasks_capability: types.ServerTasksCapability | None = None
    """Declared to 2025-era clients when set: the upstream's, served by the raw relay."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(
            notification_options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )
        if self.tasks_capability is not None and protocol_version not in MODERN_PROTOCOL_VERSIONS:
            caps = caps.model_copy(update={"tasks": self.tasks_capability})
        return caps

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        return super().create_initialization_options(
            notification_options or self.notification_options,
            experimental_capabilities,
            extensions,
        )


class Forwarder:
    """Serves the non-tool requests of a gateway and relays its upstreams' requests to clients."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.prompt_routes: dict[str, tuple[str, str]] = {}
        """Exposed prompt name -> (upstream, the upstream's own name)."""
        self.resource_owners: dict[str, str] = {}
        """Resource URI or URI template -> the upstream that listed it."""
        self.inflight: dict[str, list[ServerRequestContext[Any, Any]]] = {}
        """Upstream -> the client requests being forwarded to it, most recent last."""
        self.last_session: dict[str, ServerSession] = {}
        """Upstream -> the client session that last sent it something."""
        self.client_session: ServerSession | None = None
        """The client session that last sent the gateway anything."""
        self.client_connected: anyio.Event | None = None

    # -- which upstreams serve what ------------------------------------------------------------

    def _serving(self, kind: str) -> list[Upstream]:
        """Connected upstreams that declare the capability ``kind`` (``resources``, ...)."""
        ups = []
        for up in self.gateway.upstreams.values():
            if up.client is None:
                continue
            caps = up.client.session.server_capabilities
            if caps is not None and getattr(caps, kind, None) is not None:
                ups.append(up)
        return ups

    def register(self, server: Server[Any]) -> None:
        """Serve each request kind at least one connected upstream declares (called once connected)."""
        self.client_connected = anyio.Event()
        add = server.add_request_handler
        caps = [
            up.client.session.server_capabilities
            for up in self.gateway.upstreams.values()
            if up.client is not None and up.client.session.server_capabilities is not None
        ]
        resources = [c.resources for c in caps if c.resources is not None]
        prompts = [c.prompts for c in caps if c.prompts is not None]
        if resources:
            add("resources/list", types.PaginatedRequestParams, self._list_resources)
            add("resources/templates/list", types.PaginatedRequestParams, self._list_templates)
            add("resources/read", types.ReadResourceRequestParams, self._read_resource)
            if any(r.subscribe for r in resources):
                add("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
                add("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        if prompts:
            add("prompts/list", types.PaginatedRequestParams, self._list_prompts)
            add("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        if any(c.completions is not None for c in caps):
            add("completion/complete", types.CompleteRequestParams, self._complete)
        if any(c.logging is not None for c in caps):
            # Registered directly: the constructor's ``on_set_logging_level`` warns that logging is
            # deprecated at 2026-07-28, but the upstreams still offer it to 2025-era clients.
            add("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )
        server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        if isinstance(server, GatewayServer):
            server.notification_options = NotificationOptions(
                prompts_changed=any(p.list_changed for p in prompts),
                resources_changed=any(r.list_changed for r in resources),
                tools_changed=any(c.tools is not None and c.tools.list_changed for c in caps),
            )

    # -- client sessions -------------------------------------------------------------------

    def note_client(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """Remember the client session a request came from (server requests go back there)."""
        self.client_session = ctx.session
        if self.client_connected is not None and not self.client_connected.is_set():
            self.client_connected.set()

    async def note_requests(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        """Server middleware: every request but the handshake marks its client as connected."""
        if ctx.method != "initialize":
            self.note_client(ctx)
        return await call_next(ctx)

    async def _initialized(
        self, ctx: ServerRequestContext[Any, Any], params: types.NotificationParams
    ) -> None:
        self.note_client(ctx)

    @asynccontextmanager
    async def calling(
        self, up: Upstream, ctx: ServerRequestContext[Any, Any]
    ) -> AsyncIterator[None]:
        """Mark a client request as in flight on ``up`` (its server requests go to that client)."""
        stack = self.inflight.setdefault(up.name, [])
        stack.append(ctx)
        self.last_session[up.name] = ctx.session
        try:
            yield
        finally:
            stack.remove(ctx)

    def _caller(self, upstream: str) -> tuple[ServerSession | None, types.RequestId | None]:
        """The client session a request or notification of ``upstream`` belongs to."""
        stack = self.inflight.get(upstream)
        if stack:
            return stack[-1].session, stack[-1].request_id
        return self.last_session.get(upstream) or self.client_session, None

    async def _wait_caller(
        self, upstream: str
    ) -> tuple[ServerSession | None, types.RequestId | None]:
        session, request_id = self._caller(upstream)
        if session is None and self.client_connected is not None:
            with anyio.move_on_after(CLIENT_WAIT_S):
                await self.client_connected.wait()
            session, request_id = self._caller(upstream)
        return session, request_id

    # -- the upstream client's callbacks ---------------------------------------------------

    def client_callbacks(self, upstream: str) -> dict[str, Any]:
        """Callbacks for the gateway's ``Client`` of ``upstream``: they relay to the client."""

        async def sampling(context: Any, params: types.CreateMessageRequestParams) -> Any:
            result_type: Any = (
                types.CreateMessageResultWithTools
                if params.tools or params.tool_choice
                else types.CreateMessageResult
            )
            return await self._relay(
                upstream,
                "sampling",
                "Sampling not supported",
                types.CreateMessageRequest(params=params),
                result_type,
            )

        async def elicitation(context: Any, params: types.ElicitRequestParams) -> Any:
            return await self._relay(
                upstream,
                "elicitation",
                "Elicitation not supported",
                types.ElicitRequest(params=params),
                types.ElicitResult,
            )

        async def list_roots(context: Any) -> Any:
            return await self._relay(
                upstream,
                "roots",
                "List roots not supported",
                types.ListRootsRequest(),
                types.ListRootsResult,
            )

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            await self._notify(upstream, types.LoggingMessageNotification(params=params))

        async def on_message(message: Any) -> None:
            if isinstance(message, _RELAYED_NOTIFICATIONS):
                await self._notify(upstream, message)

        # A callback given is a capability declared; its parts exactly as the client declared
        # them (``proxy._UpstreamClient``).
        declared = self.gateway.declared
        return {
            "sampling_callback": sampling if declared.sampling else None,
            "sampling_capabilities": declared.sampling,
            "elicitation_callback": elicitation if declared.elicitation else None,
            "list_roots_callback": list_roots if declared.roots else None,
            "declared": declared,
            "logging_callback": on_log,
            "message_handler": on_message,
        }

    async def _relay(
        self, upstream: str, capability: str, unsupported: str, request: Any, result_type: Any
    ) -> Any:
        """Ask the calling client ``request``; its result or error is the upstream's answer."""
        session, request_id = await self._wait_caller(upstream)
        caps = session.client_capabilities if session is not None else None
        if session is None or caps is None or getattr(caps, capability, None) is None:
            return types.ErrorData(code=INVALID_REQUEST, message=unsupported)
        metadata = ServerMessageMetadata(related_request_id=request_id) if request_id else None
        try:
            return await session.send_request(request, result_type, metadata=metadata)
        except MCPError as exc:
            return exc.error
        except Exception as exc:  # the client is gone or its answer is unreadable
            logger.warning("relaying %s to the client failed: %s", request.method, exc)
            return types.ErrorData(code=INTERNAL_ERROR, message=f"{type(exc).__name__}: {exc}")

    async def _notify(self, upstream: str, notification: Any) -> None:
        """Pass an upstream's notification on to the client it concerns; never raises."""
        session, request_id = self._caller(upstream)
        if session is None:
            return
        try:
            await session.send_notification(notification, related_request_id=request_id)
        except Exception as exc:  # a client that went away must not break the upstream link
            logger.debug("relaying %s failed: %s", notification.method, exc)

    async def _roots_changed(
        self, ctx: ServerRequestContext[Any, Any], params: types.NotificationParams
    ) -> None:
        self.note_client(ctx)
        for up in self.gateway.upstreams.values():
            if up.client is not None:
                try:
                    await up.client.session.send_notification(types.RootsListChangedNotification())
                except Exception as exc:
                    logger.debug("roots/list_changed to %r failed: %s", up.name, exc)

    # -- forwarding --------------------------------------------------------------------------

    async def _send(
        self,
        up: Upstream,
        request: Any,
        result_type: Any,
        ctx: ServerRequestContext[Any, Any],
    ) -> Any:
        """Send one request upstream on behalf of the client; errors pass through as they are."""
        from hindsight_loop.mcp.proxy import _for_client_era, _forwarded_meta, _unavailable

        if up.client is None:
            raise _unavailable(up)
        meta, wants_progress = _forwarded_meta(ctx.meta)
        if request.params is not None:
            request = request.model_copy(
                update={"params": request.params.model_copy(update={"meta": meta})}
            )
        on_progress = None
        if wants_progress:

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                await ctx.session.report_progress(progress, total, message)

        async with self.calling(up, ctx):
            result = await up.client.session.send_request(
                request, result_type, progress_callback=on_progress
            )
        return _for_client_era(result, ctx.protocol_version)

    async def _all_pages(
        self,
        up: Upstream,
        make: Callable[[types.PaginatedRequestParams | None], Any],
        result_type: Any,
        field: str,
        ctx: ServerRequestContext[Any, Any],
    ) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):  # a paginator that never ends must not hang the client
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._send(up, make(params), result_type, ctx)
            items.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                break
        return items

    async def _list(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.PaginatedRequestParams,
        request_cls: Any,
        result_type: Any,
        field: str,
        key: str,
    ) -> Any:
        """A resource listing: one upstream's as it sent it (cursor and all), or all merged."""
        ups = self._serving("resources")
        if len(ups) == 1:
            result = await self._send(ups[0], request_cls(params=params), result_type, ctx)
            for item in getattr(result, field):
                self.resource_owners.setdefault(getattr(item, key), ups[0].name)
            return result
        merged: list[Any] = []
        for up in ups:
            try:
                items = await self._all_pages(
                    up, lambda p: request_cls(params=p), result_type, field, ctx
                )
            except Exception as exc:  # one broken upstream must not hide the others' listings
                logger.warning("listing %s of %r failed: %s", field, up.name, exc)
                continue
            for item in items:
                self.resource_owners[getattr(item, key)] = up.name
            merged.extend(items)
        return result_type(**{field: merged})

    async def _list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> types.ListResourcesResult:
        return await self._list(
            ctx, params, types.ListResourcesRequest, types.ListResourcesResult, "resources", "uri"
        )

    async def _list_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> types.ListResourceTemplatesResult:
        return await self._list(
            ctx,
            params,
            types.ListResourceTemplatesRequest,
            types.ListResourceTemplatesResult,
            "resource_templates",
            "uri_template",
        )

    async def _by_uri(
        self, uri: str, ctx: ServerRequestContext[Any, Any], request: Any, result_type: Any
    ) -> Any:
        """Send a request about ``uri`` to its owner, or else to each upstream in turn."""
        ups = self._serving("resources")
        owner = self.resource_owners.get(uri)
        if owner is not None and owner in self.gateway.upstreams:
            return await self._send(self.gateway.upstreams[owner], request, result_type, ctx)
        if not ups:
            raise MCPError(INVALID_PARAMS, f"Resource not found: {uri}")
        first: MCPError | None = None
        for up in ups:
            try:
                return await self._send(up, request, result_type, ctx)
            except MCPError as exc:  # not this upstream's, perhaps the next one's
                first = first or exc
        assert first is not None
        raise first

    async def _read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> Any:
        request = types.ReadResourceRequest(params=params)
        return await self._by_uri(params.uri, ctx, request, _READ_RESULT)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> Any:
        request = types.SubscribeRequest(params=params)
        return await self._by_uri(params.uri, ctx, request, types.EmptyResult)

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> Any:
        request = types.UnsubscribeRequest(params=params)
        return await self._by_uri(params.uri, ctx, request, types.EmptyResult)

    # -- prompts ---------------------------------------------------------------------------------

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> types.ListPromptsResult:
        ups = self._serving("prompts")
        if len(ups) == 1 and self.gateway.config.tool_naming == "auto":
            # One upstream and its own names: its listing as it sent it, cursor and all.
            result = await self._send(
                ups[0], types.ListPromptsRequest(params=params), types.ListPromptsResult, ctx
            )
            for prompt in result.prompts:
                self.prompt_routes[prompt.name] = (ups[0].name, prompt.name)
            return result
        listed: list[tuple[Upstream, types.Prompt]] = []
        for up in ups:
            try:
                prompts = await self._all_pages(
                    up,
                    lambda p: types.ListPromptsRequest(params=p),
                    types.ListPromptsResult,
                    "prompts",
                    ctx,
                )
            except Exception as exc:  # one broken upstream must not hide the others' prompts
                logger.warning("listing prompts of %r failed: %s", up.name, exc)
                continue
            listed.extend((up, p) for p in prompts)
        owners: dict[str, int] = {}
        for _, prompt in listed:
            owners[prompt.name] = owners.get(prompt.name, 0) + 1
        routes: dict[str, tuple[str, str]] = {}
        exposed_prompts = []
        for up, prompt in listed:
            prefixed = self.gateway.config.tool_naming == "prefixed" or owners[prompt.name] > 1
            exposed = f"{up.name}{PREFIX_SEPARATOR}{prompt.name}" if prefixed else prompt.name
            routes[exposed] = (up.name, prompt.name)
            exposed_prompts.append(
                prompt if exposed == prompt.name else prompt.model_copy(update={"name": exposed})
            )
        self.prompt_routes = routes
        return types.ListPromptsResult(prompts=exposed_prompts)

    def _prompt_route(self, name: str) -> tuple[Upstream, str] | None:
        route = self.prompt_routes.get(name)
        if route is not None:
            return self.gateway.upstreams[route[0]], route[1]
        ups = self._serving("prompts")
        # Not listed yet (a client may get a prompt it knows without listing): with one
        # upstream, its own answer to the name; with several, the first one's.
        return (ups[0], name) if ups else None

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> Any:
        route = self._prompt_route(params.name)
        if route is None:
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {params.name}")
        up, name = route
        request = types.GetPromptRequest(params=params.model_copy(update={"name": name}))
        return await self._send(up, request, _PROMPT_RESULT, ctx)

    # -- completions and logging -------------------------------------------------------------

    async def _complete(
        self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        ref = params.ref
        request = types.CompleteRequest(params=params)
        if isinstance(ref, types.PromptReference):
            route = self._prompt_route(ref.name)
            if route is not None:
                up, name = route
                ref = ref.model_copy(update={"name": name})
                request = types.CompleteRequest(params=params.model_copy(update={"ref": ref}))
                return await self._send(up, request, types.CompleteResult, ctx)
        else:
            owner = self.resource_owners.get(ref.uri)
            if owner is not None and owner in self.gateway.upstreams:
                up = self.gateway.upstreams[owner]
                return await self._send(up, request, types.CompleteResult, ctx)
        ups = self._serving("completions")
        if not ups:
            raise MCPError(INVALID_PARAMS, "No MCP server offers completions")
        return await self._send(ups[0], request, types.CompleteResult, ctx)

    async def _set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        ups = self._serving("logging")
        if len(ups) == 1:
            return await self._send(
                ups[0], types.SetLevelRequest(params=params), types.EmptyResult, ctx
            )
        for up in ups:
            try:
                await self._send(up, types.SetLevelRequest(params=params), types.EmptyResult, ctx)
            except Exception as exc:  # the level still applies to the other upstreams
                logger.warning("logging/setLevel on %r failed: %s", up.name, exc)
        return types.EmptyResult()


__all__ = ["CLIENT_WAIT_S", "Forwarder", "GatewayServer"]
