"""The protocol era the gateway speaks to a client: the one its servers speak.

MCP has two eras on the wire: the 2025 ``initialize`` handshake, and the 2026-07-28 protocol where
every request carries its own ``_meta`` envelope and a client opens with ``server/discover``. A
client in ``auto`` mode probes with ``server/discover`` and falls back to the handshake when the
server does not take it. Facing a 2025-era server directly, such a client therefore speaks
2025, and with it what only that era has: tasks (SEP-1686, 2025-11-25; at 2026-07-28 they are an
extension the gateway cannot serve from a 2025-era server), logging levels, subscriptions.

So the gateway answers a 2026-era request as its servers would when one of them speaks only the
2025 era: with that server's own answer to the SDK's ``server/discover`` probe (kept by
``mcp.upstream`` on the upstream's link), and the client falls back exactly as it does directly.
When every connected server speaks 2026, both eras are served (the SDK translates for a 2025-era
client). A gateway with no server connected serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from mcp_types import INVALID_REQUEST, METHOD_NOT_FOUND, PROTOCOL_VERSION_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from hindsight_loop.mcp.proxy import Gateway

#: What a 2025-era connection of the SDK says to an enveloped request other than the probe.
_NOT_THIS_ERA = (
    "this connection serves the handshake protocol era; requests carrying the 2026-07-28 "
    "envelope are not accepted on it"
)
#: The answer a server gives to a method it does not have (the probe, when no upstream's own
#: answer was kept: an upstream over HTTP).
_NO_DISCOVER = {"code": METHOD_NOT_FOUND, "message": "Method not found"}


def is_modern_request(msg: Any) -> bool:
    """Whether ``msg`` is a 2026-era request (a request whose ``_meta`` names its version)."""
    if not isinstance(msg, dict) or "id" not in msg or msg.get("method") == "initialize":
        return False
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta


def legacy_only(gateway: Gateway) -> bool:
    """Whether a connected upstream speaks only the 2025 era (then so does the gateway)."""
    for up in gateway.upstreams.values():
        client = up.client
        if client is not None and client.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return True
    return False


def refusal(gateway: Gateway, msg: dict[str, Any]) -> dict[str, Any]:
    """The answer (a JSON-RPC message with ``msg``'s id) a 2025-era server gives ``msg``.

    For ``server/discover``: the first such upstream's own answer to the gateway's probe.
    """
    answer: dict[str, Any] = {"error": _NO_DISCOVER}
    if msg.get("method") != "server/discover":
        answer = {"error": {"code": INVALID_REQUEST, "message": _NOT_THIS_ERA}}
    else:
        for up in gateway.upstreams.values():
            client, link = up.client, gateway.raw.links.get(up.name)
            if client is None or client.session.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue
            kept = parse(link.discover_answer) if link is not None else None
            if isinstance(kept, dict) and ("error" in kept or "result" in kept):
                answer = {k: v for k, v in kept.items() if k in ("error", "result")}
            break
    return {"jsonrpc": "2.0", "id": msg.get("id"), **answer}


def parse(line: bytes | None) -> Any:
    """A JSON-RPC message's bytes as data; None for no line or one that is not JSON."""
    if line is None:
        return None
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


#: Where a 2026-era request carries its client's capabilities.
CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"


def client_capabilities(msg: Any) -> Any:
    """What a client message declares: a 2025 ``initialize``'s capabilities, or a 2026 request's
    ``_meta`` (None when it declares nothing)."""
    params = msg.get("params") if isinstance(msg, dict) else None
    if not isinstance(params, dict):
        return None
    if msg.get("method") == "initialize":
        return params.get("capabilities")
    meta = params.get("_meta")
    return meta.get(CAPABILITIES_META_KEY) if isinstance(meta, dict) else None


async def refuse_http(gateway: Gateway, scope: Any, receive: Any, send: Any) -> None:
    """Answer a 2026-era HTTP request as ``refusal`` does, at the status the SDK maps it to."""
    from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

    body = b""
    if scope.get("method") == "POST":
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    msg = parse(body)
    if not isinstance(msg, dict):
        msg = {"id": None, "method": None}
    answer = refusal(gateway, msg)
    error = answer.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = 200 if error is None else ERROR_CODE_HTTP_STATUS.get(code, 400)  # type: ignore[arg-type]
    payload = orjson.dumps(answer)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def modern_http(scope: Any) -> bool:
    """Whether an HTTP request names a 2026-era protocol version (its era's own header)."""
    for name, value in scope.get("headers", ()):
        if name == b"mcp-protocol-version":
            return value.decode("latin-1") in MODERN_PROTOCOL_VERSIONS
    return False


__all__ = ["is_modern_request", "legacy_only", "modern_http", "refusal", "refuse_http"]
