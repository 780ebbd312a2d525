"""``hindsight serve``: the HTTP API for agents in any language and the web page for people.

One process, one store: agents record runs, recall lessons and report outcomes over JSON; people
read runs with their key nodes, keep the lesson book (confirm, edit, reject, pin, settle
conflicts) and watch success rates move. Every change goes through the ``Hindsight`` facade,
the same verbs the CLI uses.

Behind the ``server`` extra (Starlette, uvicorn, Jinja2); importing this package without them
raises an ``ImportError`` that names the install command.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the core-install test
    raise ImportError(
        f"hindsight serve needs the server extra ({exc.name} is missing): "
        "pip install 'hindsight-loop[server]'"
    ) from exc

from hindsight_loop.serve.app import build_app

__all__ = ["build_app"]
