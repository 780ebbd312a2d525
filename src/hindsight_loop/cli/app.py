"""The root ``hindsight`` app. Each noun registers itself from its own module."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="hindsight",
    help="Hindsight: experience memory for AI agents. Record, replay, reflect, recall.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module adds its commands with register(app). Kept as names so that a surface behind an
# extra (mcp) costs nothing until its command runs.
_MODULES = ("tasks", "lessons", "recall", "demo", "llm", "mcp", "attribute", "store", "serve")


def _register() -> None:
    for name in _MODULES:
        try:
            module = importlib.import_module(f"hindsight_loop.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"hindsight_loop.cli.{name}":
                continue  # that surface is not built in this version
            raise
        module.register(app)


_register()


def main() -> None:
    app()
