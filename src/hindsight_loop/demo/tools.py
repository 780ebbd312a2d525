"""The sample agent's tools: real parsing with the standard library, and real checks.

Nothing here knows about the sources or the ground truth; a tool fails the way a real one does:
a strict decoder raises ``UnicodeDecodeError``, text that decoded into the wrong characters is
refused as mojibake, a header that is not the expected schema is refused, and rows of the wrong
width are refused until they are repaired.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HeaderMismatchError",
    "MojibakeError",
    "RaggedRowsError",
    "Table",
    "fix_rows",
    "read_csv",
    "validate",
]


class MojibakeError(ValueError):
    """The bytes decoded, but into characters they do not mean (wrong encoding)."""


class HeaderMismatchError(ValueError):
    """The header row is not the expected schema (wrong encoding, wrong delimiter …)."""

    def __init__(self, message: str, header: list[str]) -> None:
        super().__init__(message)
        self.header = header


class RaggedRowsError(ValueError):
    """Some rows do not have as many fields as the header."""


@dataclass(kw_only=True, slots=True)
class Table:
    """A parsed CSV: its header and data rows."""

    columns: list[str]
    rows: list[list[str]]


# Signs that text was decoded with the wrong codec:
# - U+FFFD (a decoder replaced what it could not read), NUL and other control characters
#   (UTF-16 read as a byte encoding, C1 controls from Latin-1 over UTF-8/GBK);
# - UTF-8 read as Latin-1: a lead byte (Ã, Â …) followed by a continuation byte;
# - Latin-1 read as GBK: a Han character wedged inside a Latin word ("M黮ler").
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_UTF8_AS_LATIN1_RE = re.compile("[\u00c2-\u00f4][\u0080-\u00bf]")
_HAN_IN_LATIN_WORD_RE = re.compile("[A-Za-z][\u3400-\u9fff]{1,2}[a-z]")


def _mojibake(text: str) -> str | None:
    for pattern, what in (
        (_CONTROL_RE, "control or replacement characters"),
        (_UTF8_AS_LATIN1_RE, "UTF-8 bytes read as Latin-1"),
        (_HAN_IN_LATIN_WORD_RE, "Han characters inside Latin words"),
    ):
        found = pattern.search(text)
        if found:
            return f"{what} near {text[max(0, found.start() - 8) : found.end() + 8]!r}"
    return None


def read_csv(path: str | Path, *, encoding: str, delimiter: str, columns: list[str]) -> Table:
    """Read a CSV file strictly and check it came out as the expected table.

    Raises:
        UnicodeDecodeError: the bytes are not valid in ``encoding``.
        MojibakeError: they decoded, but into the wrong characters.
        HeaderMismatchError: the header is not ``columns`` (often a wrong delimiter or a BOM).
    """
    text = Path(path).read_bytes().decode(encoding)
    problem = _mojibake(text)
    if problem:
        raise MojibakeError(f"decoding as {encoding} gives {problem}")
    # newline="" keeps line breaks inside quoted fields for the csv module to handle.
    records = [r for r in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter) if r]
    if not records:
        raise HeaderMismatchError("the file is empty", [])
    header, rows = records[0], records[1:]
    if header != columns:
        raise HeaderMismatchError(
            f"header {header[:3]!r}{'…' if len(header) > 3 else ''} ({len(header)} fields) "
            f"is not the expected {columns[:3]!r}… ({len(columns)} fields)",
            header,
        )
    return Table(columns=header, rows=rows)


def validate(table: Table, *, columns: list[str]) -> int:
    """Check a table against its schema; returns the number of rows.

    Raises:
        RaggedRowsError: rows whose width is not the header's.
        ValueError: an empty key in the first column.
    """
    width = len(columns)
    bad = [i for i, row in enumerate(table.rows, 1) if len(row) != width]
    if bad:
        widths = sorted({len(table.rows[i - 1]) for i in bad})
        raise RaggedRowsError(
            f"{len(bad)} of {len(table.rows)} rows have {widths} fields instead of {width} "
            f"(first: row {bad[0]})"
        )
    missing = [i for i, row in enumerate(table.rows, 1) if not row[0].strip()]
    if missing:
        raise ValueError(f"{len(missing)} rows have no {columns[0]!r} (first: row {missing[0]})")
    return len(table.rows)


def fix_rows(table: Table, *, columns: list[str], strategy: str = "pad") -> Table:
    """Repair ragged rows: pad short rows with empty fields, drop empty trailing extras.

    Raises:
        RaggedRowsError: a long row carries data past the last column (cannot be repaired
            without guessing).
        ValueError: an unknown strategy.
    """
    if strategy != "pad":
        raise ValueError(f"unknown strategy {strategy!r}; use 'pad'")
    width = len(columns)
    fixed: list[list[str]] = []
    for i, row in enumerate(table.rows, 1):
        if len(row) > width:
            if any(cell.strip() for cell in row[width:]):
                raise RaggedRowsError(f"row {i} has data past column {width}")
            row = row[:width]
        fixed.append(row + [""] * (width - len(row)))
    return Table(columns=list(table.columns), rows=fixed)
