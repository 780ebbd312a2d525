"""The one ASGI app of ``hindsight serve``: the JSON API, the pages, the static files, guarded.

Errors are answered in the caller's language: JSON ``{"error": ...}`` under ``/api``, a page
elsewhere. A request the server refuses (``BadInput``) changed nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from hindsight_loop.serve.access import Access, Guard
from hindsight_loop.serve.api import Api, error
from hindsight_loop.serve.book import BadInput, BookCache, NotFound
from hindsight_loop.serve.pages import Pages

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from hindsight_loop.hindsight import Hindsight

STATIC = Path(__file__).parent / "static"


def build_app(hs: Hindsight, *, token: str, bound_loopback: bool = True) -> ASGIApp:
    """The guarded app over one open facade (the caller opens and closes it).

    Args:
        hs: The store to serve.
        token: What writes, and reads from other machines, must present.
        bound_loopback: The server listens on loopback only: refuse foreign Host headers.
    """
    access = Access(token=token, bound_loopback=bound_loopback)
    cache = BookCache()
    api = Api(hs, cache)
    pages = Pages(hs, cache, access)

    def answer(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api") or request.url.path == "/openapi.json":
            return error(status, message)
        return pages.problem(request, status, message)

    async def bad_input(request: Request, exc: Exception) -> Response:
        return answer(request, 400, str(exc))

    async def not_found(request: Request, exc: Exception) -> Response:
        return answer(request, 404, str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = (
                f"nothing at {request.url.path}; see /openapi.json for the API, /runs for the page"
            )
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return answer(request, exc.status_code, message)

    app = Starlette(
        routes=[
            *api.routes(),
            *pages.routes(),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={BadInput: bad_input, NotFound: not_found, HTTPException: http_error},
    )
    return Guard(app, access)
