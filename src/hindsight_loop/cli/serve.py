"""``hindsight serve``: the HTTP API for agents and the web page for people, in one process."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from hindsight_loop.cli.common import DbOption, fail, open_hs


def serve(
    db: DbOption = "hindsight.db",
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Anything but loopback exposes the service to the "
            "network (the token is then needed for every request)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="Token for writes and for reads from other machines (Authorization: Bearer "
            "<token>; browsers log in with it at /login). When neither this nor "
            "HINDSIGHT_TOKEN is set, one is generated and printed.",
        ),
    ] = None,
) -> None:
    """Serve the JSON API (see /openapi.json) and the review page (runs, lessons, trends).

    Reads from this machine need no token; recording, recall by POST, outcomes and every
    review action do.
    """
    try:
        import uvicorn

        from hindsight_loop.serve import build_app
    except ImportError as exc:
        raise fail(f"{exc}") from None
    from hindsight_loop.mcp.http import BindError, is_loopback, listen, resolve_token

    try:
        sock = listen(host, port)  # first: a taken port is reported before anything starts
    except BindError as exc:
        raise fail(str(exc)) from None
    # Accepted connections inherit it (Linux): without it a keep-alive client (a browser) waits
    # out the delayed ACK of a response written in two parts, tens of ms per request.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    resolved = resolve_token(token)
    name = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else name}:{port}"
    with open_hs(db, create=True, background=True) as hs:
        app = build_app(hs, token=resolved.value, bound_loopback=is_loopback(host))
        server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        typer.echo(
            f"Hindsight on {url}  (store: {db}; API description: {url}/openapi.json)", err=True
        )
        if resolved.generated:
            typer.echo(
                "No token was set (--token or HINDSIGHT_TOKEN): generated one for this run.\n"
                f"  Agents send: Authorization: Bearer {resolved.value}\n"
                f"  People log in to review: {url}/login?token={resolved.value}\n"
                f"  To keep it across restarts: export HINDSIGHT_TOKEN='{resolved.value}'",
                err=True,
            )
        else:
            typer.echo(f"  Log in to review at {url}/login with your token.", err=True)
        server.run(sockets=[sock])


class _Server:
    """uvicorn's server, stopping on SIGTERM/SIGINT without re-raising the signal afterwards:
    uvicorn would, and the process would die before the store is flushed and closed."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                def stop(signum: int, frame: Any) -> None:
                    if self.should_exit:  # a second signal: stop now
                        self.force_exit = True
                    self.should_exit = True

                old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
                try:
                    yield
                finally:
                    for s, handler in old.items():
                        signal.signal(s, handler)

        return Server(config)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
