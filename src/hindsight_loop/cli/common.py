"""Options and output shared by every ``hindsight`` sub-command.

Everything a command prints goes through :func:`say`, :func:`heading`, :func:`print_table` or
:func:`fail`, so every command looks the same and none can be broken by what it prints. Goals,
arguments, error messages and advice come from agents and models: they may hold rich markup
(``[/a-z]+``) or terminal escape sequences. So nothing is ever parsed as markup, and
:func:`clean` turns every control character into a visible placeholder before it is printed.
``--json`` output is exact JSON instead (:func:`print_json`); the encoder escapes controls.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="HINDSIGHT_DB",
        help="Store to use: a SQLite file path, 'sqlite:///path.db' or 'postgresql://user@host/db' "
        "(env: HINDSIGHT_DB).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


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
    except ImportError as exc:  # a store behind an extra that is not installed
        raise fail(str(exc)) from None
    except (ValueError, sqlite3.Error, OSError) as exc:
        raise fail(
            f"cannot open the store {db!r}: {exc}; pass --db with a Hindsight .db file"
        ) from None


# What a terminal would act on instead of showing: C0/C1 controls and DEL (cursor moves, colours,
# OSC 8 links, bells), format characters (bidi overrides that reorder the line, zero-width ones),
# line and paragraph separators, and lone surrogates (which would not even encode).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _placeholder(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: \x1b -> ␛, \x00 -> ␀, \r -> ␍
    if code == 0x7F:
        return "\u2421"  # ␡
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(text: object, *, multiline: bool = False) -> str:
    """Make recorded text safe to print: every control character becomes visible.

    C0 controls show as their Control Pictures (``\\x1b`` -> ``␛``, ``\\r`` -> ``␍``), other
    controls and format characters as an escape (``\\u202e``), tabs as spaces. A newline is kept
    only where the field is meant to span lines (``multiline``, with ``\\r\\n`` read as one);
    elsewhere it shows as ``␊`` so one record stays on one line.
    """
    value = str(text)
    if value.isprintable():  # the usual case, Chinese included
        return value
    if multiline:
        value = value.replace("\r\n", "\n")
    value = value.expandtabs(4)
    return "".join(
        _placeholder(char)
        if unicodedata.category(char) in _UNSAFE_CATEGORIES and not (multiline and char == "\n")
        else char
        for char in value
    )


def console(*, err: bool = False) -> Console:
    """The console every command prints with: no markup, emoji codes or highlighting, ever.

    Made per call so that it writes to the current stdout/stderr and reads COLUMNS then.
    """
    return Console(
        file=sys.stderr if err else sys.stdout, markup=False, emoji=False, highlight=False
    )


Part = str | tuple[str, str]
"""A piece of a printed line: text, or (text, rich style) for emphasis."""


def say(*parts: Part, err: bool = False, multiline: bool = False) -> None:
    """Print one line made of parts, each cleaned and printed literally (never as markup).

    Args:
        *parts: Text, or ``(text, style)`` pairs such as ``(status, "red")``.
        err: Write to stderr (notes and problems) instead of stdout.
        multiline: Keep the newlines in the text (a field meant to span lines).
    """
    line = Text()
    for part in parts:
        text, style = part if isinstance(part, tuple) else (part, "")
        line.append(clean(text, multiline=multiline), style=style)
    # soft_wrap: a long line is left for the terminal to wrap, not cut into lines at 80 columns.
    console(err=err).print(line, soft_wrap=True)


def heading(text: str) -> None:
    """Print a section heading."""
    say((text, "bold"))


def print_table(
    columns: Sequence[str | Column], rows: Iterable[Sequence[object]], *, title: str | None = None
) -> None:
    """Print a table; every cell is cleaned and printed literally."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(Text(clean(cell)) for cell in row))
    console().print(table)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    high, low = divmod(code - 0x10000, 0x400)  # JSON spells astral characters as a pair
    return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}"


def print_json(obj: Any) -> None:
    """Write JSON to stdout (pretty, UTF-8, non-ASCII kept so Chinese stays readable).

    The encoder escapes C0 controls; the other characters a terminal acts on (DEL, C1, bidi
    overrides, separators) are escaped here too. Only inside strings can they occur, and a
    ``\\uXXXX`` escape decodes to the same value, so the JSON is unchanged.
    """
    text = orjson.dumps(
        obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str
    ).decode()
    if not (text.isascii() and "\x7f" not in text):
        text = "".join(
            _json_escape(char)
            if char >= "\x7f" and unicodedata.category(char) in _UNSAFE_CATEGORIES
            else char
            for char in text
        )
    typer.echo(text)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error that tells the user the fix (to stderr), and return the exit to raise."""
    say(("Error:", "bold red"), " ", message, err=True)
    return typer.Exit(code)
