"""The guard in front of every Hindsight HTTP surface: a bearer token, and the Host header.

An MCP endpoint on a port is reachable by every local process and, through DNS rebinding, by any
web page the user opens. Anything that can reach it can plant events that later become advice in
an agent's prompt, so no request is served without the token, wherever the surface is bound.
Bound to loopback, the Host header must also name loopback: a rebinding page sends its own
domain there.

Kept free of the MCP SDK (plain ASGI) so any HTTP surface can wrap its app in the same guard.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_ENV = "HINDSIGHT_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(kw_only=True, frozen=True, slots=True)
class Token:
    """The bearer token an HTTP surface requires."""

    value: str
    """The secret itself."""
    generated: bool
    """Whether it was made for this run (neither ``--token`` nor ``HINDSIGHT_TOKEN`` was set)."""


def resolve_token(given: str | None) -> Token:
    """The token from ``--token``, else ``HINDSIGHT_TOKEN``, else a fresh random one."""
    for value in (given, os.environ.get(TOKEN_ENV)):
        if value and value.strip():
            return Token(value=value.strip(), generated=False)
    return Token(value=secrets.token_urlsafe(32), generated=True)


def token_notice(token: Token, url: str) -> str:
    """What to tell the user about a generated token (printed once, to stderr)."""
    return (
        f"No token was set (--token or {TOKEN_ENV}): generated one for this run.\n"
        f"  Clients must send the header: Authorization: Bearer {token.value}\n"
        f"  To keep it across restarts: export {TOKEN_ENV}='{token.value}'\n"
        f"  Endpoint: {url}"
    )


def is_loopback(host: str) -> bool:
    """Whether a bind address (or a Host header's name) only reaches this machine."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8765`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class BearerGuard:
    """ASGI middleware: 401 without ``Authorization: Bearer <token>``, 421 for a foreign Host.

    Args:
        app: The app to protect.
        token: The token every request must carry.
        loopback_only: Refuse requests whose Host header does not name loopback (DNS rebinding);
            set when the server is bound to a loopback address.
    """

    def __init__(self, app: ASGIApp, *, token: str, loopback_only: bool) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan passes; websockets are not served
            await self.app(scope, receive, send)
            return
        auth = host = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                auth = value
            elif name == b"host":
                host = value
        if self.loopback_only and not is_loopback(_host_name(host.decode("latin-1"))):
            await _refuse(send, 421, "Host header does not name this loopback server", {})
            return
        # Constant time: the comparison must not tell an attacker how much of a guess was right.
        if not hmac.compare_digest(auth, self._expected):
            await _refuse(
                send,
                401,
                f"missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                f"(the server's --token or {TOKEN_ENV})",
                {b"www-authenticate": b'Bearer realm="hindsight"'},
            )
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str, headers: dict[bytes, bytes]) -> None:
    body = b'{"error": "' + message.replace('"', "'").encode() + b'"}'
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers.items(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, made before anything else starts.

    Binding first means a taken port is reported at once, in one line, rather than after the
    upstreams have started and from deep inside the HTTP server.

    Raises:
        BindError: The address cannot be bound; its message names the option to change.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they
    # are TCP, and accepted sockets inherit the listener's proto. Left at 0, every answer written
    # in two parts (headers, then body: each 2026-era JSON answer) waited for the client's
    # delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BindError(
                f"port {port} on {host} is already in use: stop what listens there or pick "
                f"another with --port"
            ) from None
        raise BindError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --port or --host"
        ) from None
    return sock


class BindError(Exception):
    """An HTTP surface could not bind its address (the message says which option to change)."""


__all__ = [
    "LOOPBACK_NAMES",
    "TOKEN_ENV",
    "BearerGuard",
    "BindError",
    "Token",
    "is_loopback",
    "listen",
    "resolve_token",
    "token_notice",
]
