"""Who may do what on ``hindsight serve``.

What is served becomes advice in agents' prompts, so writes are guarded everywhere:
- a read (GET/HEAD) from this machine, naming loopback in its Host header, needs nothing: a
  person on the machine opens the page; a DNS-rebinding page sends its own domain as Host and is
  refused;
- everything else needs the token: ``Authorization: Bearer <token>`` (agents), or the session
  cookie a person gets by logging in with the token (browsers);
- a write carried by the cookie must also carry the per-process CSRF token (a hidden form field,
  or the ``X-CSRF-Token`` header htmx sends): the cookie is ``SameSite=Strict`` and
  ``HttpOnly``, and the CSRF token is only ever written into pages served to a logged-in
  browser, never to a tokenless reader.
Bound to loopback, a request whose Host header does not name loopback is refused outright (421).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from hindsight_loop.mcp.http import TOKEN_ENV, is_loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "hindsight_session"
CSRF_HEADER = b"x-csrf-token"
CSRF_FIELD = "csrf"
READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(kw_only=True, frozen=True, slots=True)
class Access:
    """The secrets of one server process, derived from its token."""

    token: str
    """The bearer token (``--token``, ``HINDSIGHT_TOKEN`` or generated)."""
    bound_loopback: bool
    """Whether the server listens on loopback only (then the Host header must name it)."""

    def _derive(self, purpose: str) -> str:
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def session(self) -> str:
        """The cookie value of a logged-in browser (derived: the token itself is never stored)."""
        return self._derive("session")

    @property
    def csrf(self) -> str:
        """The CSRF token written into the forms of a logged-in browser's pages."""
        return self._derive("csrf")

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.strip().encode(), self.token.encode())


def host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8765`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware enforcing the rules in the module docstring.

    It sets ``scope["state"]["auth"]`` to ``"bearer"``, ``"session"`` or ``None`` for the pages
    (a page shows its review buttons and CSRF token only to a logged-in browser).
    """

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access
        self._bearer = f"Bearer {access.token}".encode()
        self._session = access.session.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.access.bound_loopback and not is_loopback(host):
            await _refuse(send, 421, "the Host header does not name this loopback server")
            return
        auth = None
        if hmac.compare_digest(headers.get(b"authorization", b""), self._bearer):
            auth = "bearer"
        elif self._cookie(headers.get(b"cookie", b"")):
            auth = "session"
        scope.setdefault("state", {})["auth"] = auth
        method = scope["method"]
        path = scope["path"]
        client = (scope.get("client") or ("", 0))[0]
        local_read = method in READ_METHODS and is_loopback(client) and is_loopback(host)
        # Logging in is how a browser proves it has the token: it must be reachable without one.
        if auth is None and not local_read and path != "/login":
            await _refuse(
                send,
                401,
                "this needs the server's token: send 'Authorization: Bearer <token>' "
                f"(the --token of 'hindsight serve' or {TOKEN_ENV}), or log in at /login",
            )
            return
        if auth == "session" and method not in READ_METHODS and path != "/login":
            await self._checked_write(scope, headers, receive, send)
            return
        await self.app(scope, receive, send)

    def _cookie(self, raw: bytes) -> bool:
        if not raw:
            return False
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw.decode("latin-1"))
        except Exception:  # noqa: BLE001 - a mangled cookie header is no session
            return False
        morsel = jar.get(SESSION_COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), self._session)

    async def _checked_write(
        self, scope: Scope, headers: dict[bytes, bytes], receive: Receive, send: Send
    ) -> None:
        """Run a cookie-carried write only if it carries the CSRF token; refuse it otherwise."""
        expected = self.access.csrf.encode()
        given = headers.get(CSRF_HEADER)
        if given is not None:
            if hmac.compare_digest(given, expected):
                await self.app(scope, receive, send)
            else:
                await _refuse(send, 403, "wrong CSRF token: reload the page and try again")
            return
        # A plain form post: read the body to find the field, then hand the same body on.
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        field = ""
        if headers.get(b"content-type", b"").startswith(b"application/x-www-form-urlencoded"):
            field = (parse_qs(body.decode("utf-8", "replace")).get(CSRF_FIELD) or [""])[0]
        if not hmac.compare_digest(field.encode(), expected):
            await _refuse(send, 403, "missing or wrong CSRF token: reload the page and try again")
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _refuse(send: Send, status: int, message: str) -> None:
    import orjson

    body = orjson.dumps({"error": message})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *([(b"www-authenticate", b'Bearer realm="hindsight"')] if status == 401 else []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
