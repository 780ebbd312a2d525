"""The hot path over stdio: a tool call and its answer relayed as the bytes received.

Profiled per call (``mcp-server-time``, 1,500 calls), the gateway process spent ~1.05 ms of CPU
on each tool call, nearly all of it the SDK's per-message work on both of its sessions: parse
and validate the client's request into models, dispatch it through the server's middleware,
serialize it again for the upstream, parse and validate the upstream's answer, serialize it again
for the client. The gateway needs none of that to forward a call: here a ``tools/call`` from the
client is parsed once with orjson, given an id of the gateway's own (the upstream session has
its own ids in flight) and written to the upstream's stdin; the upstream's answer is recognised
by that id, given the client's id back and written to the client as the upstream sent it. The
parsed answer is what the call is recorded from, once, as ``Gateway._record`` records it.

Only calls the SDK path would forward unchanged take this path; everything else goes through
the SDK as before: an unknown tool, an upstream not yet connected or not on the gateway's own
stdio transport, a client and upstream speaking different protocol eras, a progress token (the
SDK relays progress against its own token), ``advise`` (it edits failed results) and a call
timeout. A cancellation the client sends for a relayed call is relayed too and the call recorded
as cancelled; an upstream that dies with relayed calls in flight answers each with the error the
SDK path gives (``Connection closed``).

Tasks (SEP-1686, 2025-11-25) are served here alone: when an upstream declares them the gateway
declares them too (to 2025-era clients over stdio pipes and streamable HTTP), a task-augmented
``tools/call`` is relayed and answered with the upstream's task, and ``tasks/get``,
``tasks/result``, ``tasks/list`` and ``tasks/cancel`` go to the upstream that runs the task.
Over HTTP the client's side is the SDK's server (``relay_tasks``, a middleware): the request is
written to the upstream's pipe as here and the parsed answer returned as the result. The call is
recorded once: at its ``tasks/result``, or as cancelled when ``tasks/cancel`` succeeds. Status
notifications come through the upstream's SDK session and are relayed with the other
notifications (``forward.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mcp_types as types
import orjson
from mcp import MCPError
from mcp_types import (
    CLIENT_INFO_META_KEY,
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from hindsight_loop.mcp.events import classify_jsonrpc_error

if TYPE_CHECKING:
    from hindsight_loop.mcp.proxy import Gateway, Route, SessionTask, Upstream, _Call

logger = logging.getLogger("hindsight_loop.mcp.fastpath")

_RESERVED_META_PREFIX = "io.modelcontextprotocol/"
_PROGRESS_KEYS = ("progressToken", "progress_token")
_ID_PREFIX = "hs-raw-"
_TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
#: Ids of relayed calls the client cancelled, kept so the upstream's late answers are dropped.
_DROPPED_MAX = 1024


class UpstreamLink:
    """The raw side of one upstream connection: how to write to it, and its answers to take."""

    def __init__(self, relay: RawRelay, upstream: str) -> None:
        self.relay = relay
        self.upstream = upstream
        self.send: Callable[[bytes], None] | None = None
        self.probe_id: Any = None
        """The id of the SDK's ``server/discover`` probe while its answer is awaited."""
        self.discover_answer: bytes | None = None
        """The server's own answer to that probe, as received (see ``mcp.era``)."""

    def attach(self, send: Callable[[bytes], None]) -> None:
        self.send = send

    def take(self, line: bytes) -> bool:
        """Whether ``line`` answered a relayed call (then it was handled here)."""
        return self.relay.take_upstream(self, line)

    def detach(self) -> None:
        """The connection ended: relayed calls still waiting get the SDK's closed-connection error."""
        self.send = None
        self.relay.upstream_closed(self)


@dataclass(slots=True)
class _Pending:
    call: _Call | None
    """The tool call recorded when this answers (``None``: a tasks request that records nothing)."""
    route: Route | None
    up: Upstream
    link: UpstreamLink
    client_id: Any
    client_key: bytes
    line: bytes
    """The request as sent upstream (resent once after a schema-change error)."""
    resent: bool = False
    stamp: Any = field(default=None)
    kind: str = "call"
    """``call``; ``task`` (a task-augmented call: answered with the task, recorded at its
    result); ``result`` (tasks/result: the task's call is recorded); ``cancel``; ``plain``."""
    task_id: str | None = None
    waiter: asyncio.Future[dict[str, Any]] | None = None
    """Over HTTP: gets the upstream's answer (parsed) instead of the stdio client."""


class RawRelay:
    """Relays hot tool calls between the gateway's stdio client and its stdio upstreams."""

    def __init__(self, gateway: Gateway) -> None:
        from hindsight_loop.mcp.proxy import _Call

        self.gateway = gateway
        self._call_cls = _Call
        self.out: asyncio.StreamWriter | None = None
        """The client's side (set while the gateway serves stdio on pipes)."""
        self.links: dict[str, UpstreamLink] = {}
        """Upstream -> the raw link of its live connection."""
        self.pending: dict[str, _Pending] = {}
        self.by_client: dict[bytes, str] = {}
        self.dropped: dict[str, None] = {}
        self._next = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.tasks: dict[str, _Pending] = {}
        """Task id -> the task-augmented call that created it, until its result is recorded."""
        self.client_name = "mcp-client"
        self.protocol_version = ""
        """The client's name and protocol version from its ``initialize`` (2025 era)."""

    def link(self, upstream: str) -> UpstreamLink:
        return UpstreamLink(self, upstream)

    def hello(self, msg: Any) -> None:
        """Note who the client is from its first message (a session may start on the raw path)."""
        params = msg.get("params") if isinstance(msg, dict) else None
        if not isinstance(params, dict):
            return
        info = params.get("clientInfo")
        if msg.get("method") != "initialize":
            meta = params.get("_meta")
            info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else None
            version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
        else:
            version = params.get("protocolVersion")
        if isinstance(info, dict) and isinstance(info.get("name"), str) and info["name"]:
            self.client_name = info["name"]
        if isinstance(version, str):
            self.protocol_version = version

    def tasks_capability(self) -> types.ServerTasksCapability | None:
        """The tasks capability of the first upstream that declares one and can be relayed."""
        for up in self.gateway.upstreams.values():
            caps = up.client.session.server_capabilities if up.client is not None else None
            if caps is not None and caps.tasks is not None and up.name in self.links:
                return caps.tasks
        return None

    def _session(self) -> SessionTask:
        return self.gateway.session("local", self.client_name, self.protocol_version, http=False)

    # -- tasks over HTTP -------------------------------------------------------------------

    async def relay_tasks(self, ctx: Any, call_next: Any) -> Any:
        """Server middleware (HTTP): task-augmented calls and ``tasks/*`` relayed as over stdio.

        The SDK's client session refuses a task as the answer to ``tools/call`` (its 2025
        surface has no tasks), so these requests go to the upstream's stdio pipe as bytes, the
        answer comes back parsed and is returned as the upstream sent it (a middleware that
        does not call on owns its result). Anything the relay cannot serve goes on to the SDK.
        """
        method = ctx.method
        params = ctx.params
        if (
            method not in _TASK_METHODS
            and not (method == "tools/call" and isinstance(params, dict) and "task" in params)
        ) or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        try:
            waiter = asyncio.get_running_loop().create_future()
        except RuntimeError:  # not on asyncio: nothing to relay with
            return await call_next(ctx)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": None, "method": method}
        if params is not None:
            msg["params"] = dict(params)
        gateway = self.gateway
        raw_id = (
            self._call(msg, lambda: gateway.session_for(ctx), waiter)
            if method == "tools/call"
            else self._task_request(msg, waiter)
        )
        if raw_id is None:
            return await call_next(ctx)
        try:
            answer = await waiter
        except asyncio.CancelledError:
            pending = self.pending.get(raw_id)
            if pending is not None:
                self._cancel_pending(raw_id, pending, {"requestId": raw_id})
            raise
        error = answer.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            message = error.get("message")
            raise MCPError(
                code if isinstance(code, int) else INTERNAL_ERROR,
                message if isinstance(message, str) else "",
                error.get("data"),
            )
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    # -- client -> upstream ----------------------------------------------------------------

    def take_client(self, line: bytes) -> bool:
        """Whether ``line`` from the client was relayed here (``False``: the SDK serves it)."""
        if self.out is None:
            return False
        if b'"tools/call"' in line:
            gw = self.gateway
            if gw.advise or gw.config.call_timeout is not None:
                return False
            msg = _parse(line)
            return msg is not None and self._call(msg, self._session) is not None
        if b'"tasks/' in line:
            msg = _parse(line)
            return msg is not None and self._task_request(msg) is not None
        if b'"notifications/cancelled"' in line and self.pending:
            return self._cancel(line)
        return False

    def _call(
        self,
        msg: Any,
        session: Callable[[], SessionTask],
        waiter: asyncio.Future[dict[str, Any]] | None = None,
    ) -> str | None:
        """Relay one tools/call; its relay id, or ``None`` when the SDK path must serve it."""
        gw = self.gateway
        if not isinstance(msg, dict) or msg.get("method") != "tools/call" or "id" not in msg:
            return None
        params = msg.get("params")
        if not isinstance(params, dict):
            return None
        name = params.get("name")
        if not isinstance(name, str):
            return None
        route = gw.routes.get(name)
        if route is None:
            return None
        up = gw.upstreams[route.upstream]
        client = up.client
        link = self.links.get(up.name)
        if client is None or link is None or link.send is None:
            return None
        if "task" in params and not _serves_tasks(up):
            return None  # the SDK path answers as a server without tasks does
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            return None
        if meta and any(meta.get(k) is not None for k in _PROGRESS_KEYS):
            return None
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return None
        client_modern = meta is not None and PROTOCOL_VERSION_META_KEY in meta
        upstream_modern = client.session.protocol_version in MODERN_PROTOCOL_VERSIONS
        if client_modern != upstream_modern:
            return None  # the SDK path translates between the eras
        stamp = getattr(client.session, "_stamp", None)
        if upstream_modern and stamp is None:
            return None

        out = dict(params)
        kept = {k: v for k, v in (meta or {}).items() if not k.startswith(_RESERVED_META_PREFIX)}
        if route.tool.name != name:
            out["name"] = route.tool.name
        self._next += 1
        raw_id = f"{_ID_PREFIX}{self._next}"
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": raw_id, "method": "tools/call"}
        if kept:
            out["_meta"] = kept
        else:
            out.pop("_meta", None)
        request["params"] = out
        if upstream_modern:
            # The upstream sees the gateway's own identity and capabilities, as on the SDK path.
            assert stamp is not None
            stamp(request, {})
        body = orjson.dumps(request) + b"\n"
        call = self._call_cls(
            session=session(), tool=name, arguments=arguments, known=True, server=up.name
        )
        call.upstream_tool = route.tool.name
        # Over HTTP the client's id is the SDK's business: the relay's own id stands in.
        client_key = orjson.dumps(msg["id"] if waiter is None else raw_id)
        self.pending[raw_id] = _Pending(
            call=call,
            route=route,
            up=up,
            link=link,
            client_id=msg["id"],
            client_key=client_key,
            line=body,
            stamp=stamp if upstream_modern else None,
            kind="task" if "task" in params else "call",
            waiter=waiter,
        )
        return self._send(raw_id, client_key, link, body)

    def _send(self, raw_id: str, client_key: bytes, link: UpstreamLink, body: bytes) -> str | None:
        self.by_client[client_key] = raw_id
        try:
            assert link.send is not None
            link.send(body)
        except (AssertionError, ConnectionError, OSError, RuntimeError):
            self.pending.pop(raw_id, None)
            self.by_client.pop(client_key, None)
            return None  # the SDK path reports the broken upstream as it always has
        return raw_id

    def _task_request(
        self, msg: Any, waiter: asyncio.Future[dict[str, Any]] | None = None
    ) -> str | None:
        """tasks/get, tasks/result, tasks/list, tasks/cancel: to the upstream that runs the task."""
        if not isinstance(msg, dict) or "id" not in msg:
            return None
        method = msg.get("method")
        if method not in _TASK_METHODS:
            return None
        params = msg.get("params")
        if params is not None and not isinstance(params, dict):
            return None
        task_id = (params or {}).get("taskId")
        origin = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if origin is not None:
            up, link = origin.up, origin.link
        else:  # a task this gateway did not see start (or a listing): the first upstream with tasks
            serving = [
                (u, self.links[u.name])
                for u in self.gateway.upstreams.values()
                if u.name in self.links and _serves_tasks(u)
            ]
            if not serving:
                return None
            up, link = serving[0]
        if up.client is None or link.send is None:
            return None
        self._next += 1
        raw_id = f"{_ID_PREFIX}{self._next}"
        body = orjson.dumps({**msg, "id": raw_id}) + b"\n"
        client_key = orjson.dumps(msg["id"] if waiter is None else raw_id)
        kind = {"tasks/result": "result", "tasks/cancel": "cancel"}.get(method, "plain")
        self.pending[raw_id] = _Pending(
            call=origin.call if origin is not None and kind != "plain" else None,
            route=origin.route if origin is not None else None,
            up=up,
            link=link,
            client_id=msg["id"],
            client_key=client_key,
            line=body,
            kind=kind,
            task_id=task_id if isinstance(task_id, str) else None,
            waiter=waiter,
        )
        return self._send(raw_id, client_key, link, body)

    def _cancel(self, line: bytes) -> bool:
        msg = _parse(line)
        params = msg.get("params") if isinstance(msg, dict) else None
        if not isinstance(params, dict) or msg.get("method") != "notifications/cancelled":
            return False
        raw_id = self.by_client.get(orjson.dumps(params.get("requestId")))
        pending = self.pending.get(raw_id) if raw_id is not None else None
        if raw_id is None or pending is None:
            return False
        self._cancel_pending(raw_id, pending, params)
        return True

    def _cancel_pending(self, raw_id: str, pending: _Pending, params: dict[str, Any]) -> None:
        """The client cancelled a relayed request: tell the upstream, record a cancelled call."""
        self._forget(raw_id, pending)
        self._drop_later(raw_id)
        notice: dict[str, Any] = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {**params, "requestId": raw_id},
        }
        if pending.stamp is not None:
            pending.stamp(notice, {})
        send = pending.link.send
        if send is not None:
            with suppress(ConnectionError, OSError, RuntimeError):  # the upstream is gone
                send(orjson.dumps(notice) + b"\n")
        call = pending.call
        if call is not None and pending.kind in ("call", "task"):
            call.done()
            self.gateway._record(
                call, error_type="cancelled", message="cancelled before it answered"
            )

    # -- upstream -> client ----------------------------------------------------------------

    def take_upstream(self, link: UpstreamLink, line: bytes) -> bool:
        if (not self.pending and not self.dropped) or b'"' + _ID_PREFIX.encode() not in line:
            return False
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            return False
        raw_id = msg.get("id") if isinstance(msg, dict) else None
        if not isinstance(raw_id, str) or "method" in msg:
            return False
        if raw_id in self.dropped:
            del self.dropped[raw_id]
            return True  # the answer to a call the client cancelled: it wants none
        pending = self.pending.get(raw_id)
        if pending is None or pending.link is not link:
            return False
        error = msg.get("error")
        mismatch = isinstance(error, dict) and error.get("code") == types.HEADER_MISMATCH
        if mismatch and not pending.resent:
            pending.resent = True
            self._tasks.add(task := asyncio.create_task(self._relist_and_resend(raw_id, pending)))
            task.add_done_callback(self._tasks.discard)
            return True
        self._forget(raw_id, pending)
        self._answer(pending, line, raw_id, msg)
        call = pending.call
        if call is None:
            return True  # a tasks request that records nothing
        result = msg.get("result")
        if not isinstance(result, dict):
            result = {}
        created = result.get("task")
        task_id = created.get("taskId") if isinstance(created, dict) else None
        if pending.kind == "task" and isinstance(task_id, str):
            # The task runs on: the call is recorded at its result (tasks/result).
            self.tasks[task_id] = pending
            return True
        if pending.kind in ("result", "cancel"):
            assert pending.task_id is not None
            origin = self.tasks.pop(pending.task_id, None)
            if origin is None:
                return True  # recorded already
            if pending.kind == "cancel" and isinstance(error, dict):
                self.tasks[pending.task_id] = origin  # not cancelled: still to be recorded
                return True
        if pending.kind == "cancel":
            call.done()
            self.gateway._record(call, error_type="cancelled", message="task cancelled")
            return True
        call.done()
        if isinstance(error, dict):
            code = error.get("code")
            message = error.get("message")
            code = code if isinstance(code, int) else 0
            message = message if isinstance(message, str) else ""
            if code == CONNECTION_CLOSED:
                self.gateway._lost(pending.up, pending.up.client)  # type: ignore[arg-type]
            etype = classify_jsonrpc_error(code, message, known_tool=True)
            self.gateway._record(call, error_type=etype, message=message, code=code)
            return True
        pending.up.restarts = 0
        self._record_result(pending, result)
        return True

    def _record_result(self, pending: _Pending, result: dict[str, Any]) -> None:
        call = pending.call
        assert call is not None
        gw = self.gateway
        if result.get("resultType") == "input_required":
            requests = result.get("inputRequests")
            gw.record_result(
                call, pending.route, input_requests=requests if isinstance(requests, dict) else ()
            )
            return
        is_error = result.get("isError") is True
        gw.record_result(
            call,
            pending.route,
            is_error=is_error,
            model=lambda: _model(result),
            # Text results are summarized from the parsed JSON, as the model would be.
            summary=None if is_error else _summary(result, gw.max_output),
        )

    def _answer(self, pending: _Pending, line: bytes, raw_id: str, msg: dict[str, Any]) -> None:
        """Write the upstream's answer to the client under the client's own id."""
        waiter = pending.waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(msg)
            return
        token = orjson.dumps(raw_id)
        if line.count(token) == 1:
            body = line.replace(token, pending.client_key)
            if not body.endswith(b"\n"):
                body += b"\n"
        else:  # the id's text also appears in the result: swap it in the parsed message
            msg["id"] = pending.client_id
            body = orjson.dumps(msg) + b"\n"
        self._write(body)

    def _write(self, body: bytes) -> None:
        out = self.out
        if out is None:
            return
        try:
            out.write(body)
        except (ConnectionError, OSError, RuntimeError) as exc:  # the client is gone
            logger.debug("answering the client failed: %s", exc)

    async def _relist_and_resend(self, raw_id: str, pending: _Pending) -> None:
        """2026-07-28: the upstream's schema changed since it was listed: re-list, resend once."""
        client = pending.up.client
        try:
            if client is not None:
                await client.list_tools(cache_mode="refresh")
        except Exception as exc:  # the resend gets the upstream's own answer either way
            logger.debug("re-listing tools of %r failed: %s", pending.up.name, exc)
        send = pending.link.send
        if raw_id not in self.pending or send is None:
            return
        try:
            send(pending.line)
        except (ConnectionError, OSError, RuntimeError):
            self._close_one(raw_id, pending)

    def _forget(self, raw_id: str, pending: _Pending) -> None:
        self.pending.pop(raw_id, None)
        if self.by_client.get(pending.client_key) == raw_id:
            del self.by_client[pending.client_key]

    def _drop_later(self, raw_id: str) -> None:
        self.dropped[raw_id] = None
        while len(self.dropped) > _DROPPED_MAX:
            del self.dropped[next(iter(self.dropped))]

    def upstream_closed(self, link: UpstreamLink) -> None:
        for raw_id, pending in list(self.pending.items()):
            if pending.link is link:
                self._close_one(raw_id, pending)

    def _close_one(self, raw_id: str, pending: _Pending) -> None:
        """Answer a relayed call whose upstream connection ended, as the SDK path does."""
        self._forget(raw_id, pending)
        message = "Connection closed"
        error = {"jsonrpc": "2.0", "id": pending.client_id}
        error["error"] = {"code": CONNECTION_CLOSED, "message": message}
        if pending.waiter is not None:
            if not pending.waiter.done():
                pending.waiter.set_result(error)
        else:
            self._write(orjson.dumps(error) + b"\n")
        call = pending.call
        if call is None or pending.kind == "plain":
            return
        task_id = pending.task_id
        if pending.kind in ("result", "cancel") and task_id and task_id not in self.tasks:
            return  # recorded already
        if task_id:
            self.tasks.pop(task_id, None)
        call.done()
        if pending.up.client is not None:
            self.gateway._lost(pending.up, pending.up.client)
        etype = classify_jsonrpc_error(CONNECTION_CLOSED, message, known_tool=True)
        self.gateway._record(call, error_type=etype, message=message, code=CONNECTION_CLOSED)

    def close(self) -> None:
        """The client is gone: calls still in flight are recorded as the SDK path records them."""
        self.out = None
        for raw_id, pending in list(self.pending.items()):
            if pending.waiter is not None:
                continue  # an HTTP client's: not this client's to end
            self._forget(raw_id, pending)
            call = pending.call
            if call is None or pending.kind not in ("call", "task"):
                continue
            call.done()
            self.gateway._record(
                call, error_type="cancelled", message="cancelled before it answered"
            )


def _parse(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


def _serves_tasks(up: Upstream) -> bool:
    """Whether ``up`` declared tasks (2025-11-25: task-augmented calls, tasks/get and so on)."""
    caps = up.client.session.server_capabilities if up.client is not None else None
    return caps is not None and getattr(caps, "tasks", None) is not None


def _summary(result: dict[str, Any], limit: int) -> str | None:
    """``summarize_content`` of a result of text blocks, from the parsed JSON (``None``: other)."""
    from hindsight_loop.mcp.events import _compact, _cut

    content = result.get("content")
    if not isinstance(content, list):
        return None
    parts: list[str] = []
    size = 0
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            return None
        text = block.get("text")
        if not isinstance(text, str):
            return None
        parts.append(text)
        size += len(text)
        if size > limit:
            break
    structured = result.get("structuredContent")
    if not parts and structured is not None:
        parts.append(_compact(structured))
    return _cut("\n".join(parts), limit)


def _model(result: dict[str, Any]) -> types.CallToolResult:
    """The result as the SDK path would have it (an unreadable one summarized as empty)."""
    try:
        return types.CallToolResult.model_validate(result, by_name=False)
    except ValueError:
        return types.CallToolResult(content=[], is_error=result.get("isError") is True)


__all__ = ["RawRelay", "UpstreamLink"]
