"""Commands about the store itself: ``hindsight migrate SRC DST`` copies one store into another.

It works on stores, not on the loop: there is no facade verb for copying a database, so it opens
both stores directly and copies through the ``Store`` protocol.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from hindsight_loop.cli.common import JsonOption, fail, print_json, print_table, say


def migrate(
    src: Annotated[str, typer.Argument(help="Store to copy from: a SQLite file or a URL.")],
    dst: Annotated[
        str,
        typer.Argument(help="Store to copy into: 'postgresql://user@host/db', a file or a URL."),
    ],
    json: JsonOption = False,
) -> None:
    """Copy a store into another (SQLite into PostgreSQL and back); running it twice changes
    nothing. Tasks, events, lessons with their embeddings and reflections are copied; queued
    jobs stay with the source."""
    from hindsight_loop.store import open_store
    from hindsight_loop.store.transfer import copy_store

    if "://" not in src and not Path(src).exists():
        raise fail(f"no store at {src!r}: pass an existing SQLite file or a store URL as SRC")
    if src == dst:
        raise fail("SRC and DST are the same store: pass another DST")
    try:
        source = open_store(src, readonly=True)
    except (ValueError, OSError, ImportError, sqlite3.Error) as exc:
        raise fail(f"cannot open the source {src!r}: {exc}") from None
    try:
        try:
            target = open_store(dst)
        except (ValueError, OSError, ImportError, sqlite3.Error) as exc:
            raise fail(f"cannot open the destination {dst!r}: {exc}") from None
        try:
            copied = copy_store(source, target)
        finally:
            target.close()
    finally:
        source.close()
    counts = dataclasses.asdict(copied)
    if json:
        print_json({"src": source.url, "dst": target.url, **counts})
        return
    say(f"copied {source.url} into {target.url} (events already there were skipped)")
    print_table(["copied", "count"], list(counts.items()))


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate)
