"""Options and helpers shared by every ``hindsight`` sub-command."""

from __future__ import annotations

import os
from typing import Annotated, Any

import orjson
import typer

DEFAULT_DB = "hindsight.db"

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="HINDSIGHT_DB",
        help="Store to use: a SQLite file path or 'sqlite:///path.db' (env: HINDSIGHT_DB).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def db_default() -> str:
    return os.environ.get("HINDSIGHT_DB", DEFAULT_DB)


def open_hs(db: str, *, create: bool = False, **kwargs: Any):  # noqa: ANN201 - lazy import
    """Open the facade for one CLI command (no background reviews: commands are short-lived).

    Read commands do not create a store: a mistyped --db would otherwise show an empty one.
    Errors are printed with their fix and exit 1, never as a traceback.
    """
    import sqlite3
    from pathlib import Path

    from hindsight_loop.hindsight import Hindsight

    kwargs.setdefault("background", False)
    path = db[len("sqlite:///") :] if db.startswith("sqlite:///") else db
    if not create and "://" not in db and not Path(path).exists():
        raise fail(
            f"no store at {db!r}: check --db / HINDSIGHT_DB, or make one with "
            f"'hindsight demo --db {db}' or 'hindsight import FILE --db {db}'"
        )
    try:
        return Hindsight(db, **kwargs)
    except (ValueError, sqlite3.Error, OSError) as exc:
        raise fail(
            f"cannot open the store {db!r}: {exc}; pass --db with a Hindsight .db file"
        ) from None


def print_json(obj: Any) -> None:
    """Write JSON to stdout (pretty, UTF-8, non-ASCII kept so Chinese stays readable)."""
    typer.echo(
        orjson.dumps(
            obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str
        ).decode()
    )


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error that tells the user the fix, and return the exit to raise."""
    typer.echo(f"Error: {message}", err=True)
    return typer.Exit(code)
