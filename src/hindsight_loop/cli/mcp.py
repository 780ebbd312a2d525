"""``hindsight mcp``: the recording gateway (``proxy``) and Hindsight as an MCP server (``serve``).

The MCP SDK is an extra, so nothing here imports it until a command runs: ``hindsight --help``
stays fast and works without ``hindsight-loop[mcp]``.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from hindsight_loop.cli.common import DbOption, fail

mcp_app = typer.Typer(
    help="MCP: record every tool call of any MCP client, or offer Hindsight to MCP clients.",
    no_args_is_help=True,
)


class Transport(enum.StrEnum):
    stdio = "stdio"
    http = "http"


TransportOption = Annotated[
    Transport,
    typer.Option(
        "--transport",
        help="stdio: the MCP client launches this command; http: streamable HTTP at /mcp "
        "(on --host, 127.0.0.1 by default; every request needs the bearer token).",
    ),
]
HostOption = Annotated[
    str,
    typer.Option(
        "--host",
        help="Address to listen on with --transport http. Anything but loopback exposes the "
        "server to the network (the token is still required).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="HINDSIGHT_TOKEN",
        help="Bearer token clients must send with --transport http (Authorization: Bearer "
        "<token>). When neither this nor HINDSIGHT_TOKEN is set, one is generated and printed.",
        show_default=False,
    ),
]


def _sdk() -> None:
    """Fail with the install command when the MCP SDK is missing."""
    try:
        import hindsight_loop.mcp  # noqa: F401
    except ImportError as exc:
        raise fail(str(exc)) from None


def _quiet_logging() -> None:
    # stdout is the protocol on stdio: anything we log goes to stderr, and only what matters.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="hindsight: %(message)s")


@mcp_app.command("proxy")
def proxy(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help='The {"mcpServers": {...}} JSON file of the servers to put behind the gateway '
            "(the file your MCP client already uses works).",
        ),
    ],
    transport: TransportOption = Transport.stdio,
    port: Annotated[int, typer.Option(help="Port for --transport http.")] = 8766,
    host: HostOption = "127.0.0.1",
    token: TokenOption = None,
    advise: Annotated[
        bool | None,
        typer.Option(
            "--advise/--no-advise",
            help="Append recalled lessons to failed tool results, marked [Hindsight advice] "
            "(default: the config's hindsight.advise, else off).",
            show_default=False,
        ),
    ] = None,
    task_type: Annotated[
        str | None,
        typer.Option(
            "--task-type",
            help="Task type of the recorded sessions (default: the config's hindsight.taskType, "
            "else the client's name).",
        ),
    ] = None,
    db: DbOption = "hindsight.db",
) -> None:
    """Run the recording gateway in front of the MCP servers of a config file.

    Every tools/call passing through becomes one action_executed event, in one Hindsight task per client session. Results reach the client unchanged (except advice with --advise).
    """
    _sdk()
    from hindsight_loop.mcp.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    _quiet_logging()
    for note in cfg.skipped:
        logging.getLogger("hindsight_loop.mcp").warning("skipped server %s", note)
    http = _http_surface(transport, host, port, token, "gateway")
    _run(_gateway_main(cfg, db, http, advise, task_type))


@mcp_app.command("serve")
def serve(
    transport: TransportOption = Transport.stdio,
    port: Annotated[int, typer.Option(help="Port for --transport http.")] = 8765,
    host: HostOption = "127.0.0.1",
    token: TokenOption = None,
    db: DbOption = "hindsight.db",
) -> None:
    """Offer Hindsight to MCP clients: recall_lessons, record_event, report_outcome, reflect_task."""
    _sdk()
    _quiet_logging()
    http = _http_surface(transport, host, port, token, "server")
    _run(_serve_main(db, http))


@dataclass(kw_only=True, slots=True)
class _HttpSurface:
    """An HTTP surface's bound socket and the token it requires."""

    sock: socket.socket
    host: str
    port: int
    token: str
    what: str

    @property
    def url(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{name}:{self.port}/mcp"


def _http_surface(
    transport: Transport, host: str, port: int, token: str | None, what: str
) -> _HttpSurface | None:
    """Bind the port and settle the token before anything starts (``None`` on stdio)."""
    if transport is not Transport.http:
        return None
    from hindsight_loop.mcp.http import BindError, listen, resolve_token, token_notice

    try:
        sock = listen(host, port)
    except BindError as exc:
        raise fail(str(exc)) from None
    resolved = resolve_token(token)
    surface = _HttpSurface(sock=sock, host=host, port=port, token=resolved.value, what=what)
    if resolved.generated:
        typer.echo(token_notice(resolved, surface.url), err=True)
    return surface


def _run(main: Any) -> None:
    import anyio

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(main)


def _gateway_main(
    cfg: Any, db: str, http: _HttpSurface | None, advise: bool | None, task_type: str | None
) -> Any:
    async def main() -> None:
        import anyio

        from hindsight_loop.hindsight import Hindsight
        from hindsight_loop.mcp.proxy import Gateway
        from hindsight_loop.mcp.upstream import stop_now as stop_upstreams

        hs = Hindsight(db)
        try:
            if http is None:
                # The signals are watched until the upstreams are closed, not only while the
                # client is served: a client's SIGTERM comes while the gateway closes them (it
                # waits two seconds after closing stdin, and so does the gateway for each
                # upstream), and must stop them then rather than kill the gateway mid-way and
                # leave them running (see mcp.upstream).
                serving = anyio.CancelScope()

                def on_signal() -> None:
                    stop_upstreams()
                    serving.cancel()

                async def run() -> None:
                    async with Gateway(
                        hs, cfg, task_type=task_type, advise=advise, one_client=True
                    ) as gateway:
                        with serving:
                            await gateway.serve_stdio()

                await _until_signal(run, on_signal)
            else:
                from hindsight_loop.mcp.presence import KEEP_ALIVE_S

                async with Gateway(hs, cfg, task_type=task_type, advise=advise) as gateway:
                    app = gateway.http_app(host=http.host, keep_alive=KEEP_ALIVE_S)
                    await _serve_http(app, http, presence=gateway.presence)
        finally:
            hs.close()  # the sessions' task_end events are flushed before the process exits

    return main


def _serve_main(db: str, http: _HttpSurface | None) -> Any:
    async def main() -> None:
        from hindsight_loop.hindsight import Hindsight
        from hindsight_loop.mcp.server import build_server

        hs = Hindsight(db)
        try:
            server = build_server(hs)
            if http is None:
                await _until_signal(server.run_stdio_async)
            else:
                await _serve_http(server.streamable_http_app(host=http.host), http)
        finally:
            hs.close()

    return main


async def _until_signal(
    main: Callable[[], Awaitable[None]], on_signal: Callable[[], None] | None = None
) -> None:
    """Run ``main`` until it returns or SIGTERM/SIGINT arrives.

    A client stops a stdio server with SIGTERM when it does not exit on EOF; without this the
    process would die before the sessions' last events are written. ``on_signal`` asks ``main``
    to stop by itself (a second signal cancels it).
    """
    import anyio

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            asked = False
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    if on_signal is not None and not asked:
                        asked = True
                        on_signal()
                    else:
                        tg.cancel_scope.cancel()
                        return

        if sys.platform != "win32":
            tg.start_soon(watch)
        await main()
        tg.cancel_scope.cancel()


async def _serve_http(app: Any, http: _HttpSurface, presence: Any = None) -> None:
    """Serve ``app`` with uvicorn; ``presence`` (a gateway's) is told of every connection."""
    import uvicorn

    from hindsight_loop.mcp.http import BearerGuard, is_loopback

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # Signals are ours (see _until_signal): uvicorn would re-raise SIGTERM after a
            # graceful stop and kill the process before the store is flushed.
            yield

    guarded = BearerGuard(app, token=http.token, loopback_only=is_loopback(http.host))
    options: dict[str, Any] = {}
    if presence is not None:
        from hindsight_loop.mcp.presence import KEEP_ALIVE_S, protocol_class

        # A closed connection must mean a client that is done, not a timer: see mcp.presence.
        options = {"http": protocol_class(presence), "timeout_keep_alive": KEEP_ALIVE_S}
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on", **options)
    server = Server(config)
    typer.echo(f"Hindsight MCP {http.what} on {http.url}", err=True)
    await _until_signal(
        lambda: server.serve(sockets=[http.sock]),
        on_signal=lambda: setattr(server, "should_exit", True),
    )


def register(app: typer.Typer) -> None:
    app.add_typer(mcp_app, name="mcp")
