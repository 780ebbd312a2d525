"""Redaction's guards in one pass over the event, with Hyperscan (the ``[hyperscan]`` extra).

``record.redact`` runs each secret pattern only where a cheap guard finds something all of the
pattern's matches contain. In pure Python the guards are a dozen C-level scans of the event, the
larger part of the writer's redaction time; Hyperscan runs them all in a single pass. The guards
here are the same tests written as Hyperscan expressions, each matching wherever its pure-Python
twin is true (tests/test_redact_guards.py holds both against every pattern run unguarded).
``Scanner.scan_many`` looks at many events in one call (the writer thread: each call lets go of
the GIL, which beside a CPU-busy agent's thread may cost the writer a switch interval).

Without the package (or on a CPU Hyperscan does not run on), ``SCANNER`` is None and redaction
uses its own scans: the core install does not depend on it.

Compiling the two databases takes 130-280 ms, paid by every process that redacts (each writer
process, on its first event): they are kept compiled in the user's cache directory
(``$XDG_CACHE_HOME/hindsight``, else ``~/.cache/hindsight``; a directory only the user can
write, since a database that matched less would let secrets through) and loaded in
microseconds, then checked against a probe every guard must find.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from collections.abc import Collection, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

#: After each event's body in a batch scan: orjson's output never holds a raw control
#: character, and no guard matches this one but as the byte before the match proper (the
#: ``[^"]`` of ``(?:^|[^"]):``), where it stands for the body's start (``^``).
SEPARATOR = b"\n"

# Guard ids, in the order of ``_EXPRESSIONS``.
PEM, DASHES, EQUALS, INNER_COLON, ESCAPED_KEY, IS, ZH_ASSIGN = range(7)
WORDS, AUTHORIZATION, BEARER, VENDOR, AT, SCHEME, CARD, SQL_PASSWORD, COMMAND = range(7, 16)

#: A body where no guard holds (shared: most bodies, and nothing changes it).
NONE: frozenset[int] = frozenset()
#: Text every guard finds (``Scanner.check``): a loaded database must find them all.
PROBE = '-----BEGIN PRIVATE KEY----- a=b c:d \\":x y is z 密码：w password Authorization: Bearer x sk-x u@v.w http://h 4111 1111 curl'.encode()


def _expressions(word_cores: bytes, vendor: bytes) -> list[tuple[bytes, bool]]:
    """(expression, caseless) per guard id: each true where ``record.redact``'s test is, but
    ``vendor`` (the literal starts of the vendor keys' patterns), which holds in fewer events
    than the pure-Python guard's run of 16 and costs Hyperscan less (a bounded repeat over a
    class most text is made of was half of the scan)."""
    return [
        (rb"PRIVATE KEY-----", False),
        (rb"--", False),
        (rb"=", False),
        # a colon not right after a quote: blob.count(b":") > blob.count(b'":')
        (rb'(?:^|[^"]):', False),
        (rb'\\":', False),
        (rb" is ", False),
        ("：|是|为|密|令|秘".encode(), False),
        # bytes.lower() lowers ASCII letters only, as a caseless Hyperscan match does
        (word_cores, True),
        (rb"authorization", True),
        (rb"b(?:earer|asic)", True),
        (vendor, False),
        (rb"@", False),
        (rb"://", False),
        (rb"[0-9]{4}(?:[0-9]{9}|[ \-][0-9]{4})", False),
        (rb"assword|ASSWORD|dentified|DENTIFIED", False),  # record._may_set_sql_password
        (rb"mysql|mariadb|sshpass|redis-cli|login|curl", False),  # _may_pass_a_command_secret
    ]


def _batch_expressions(word_cores: bytes, vendor: bytes) -> list[tuple[bytes, bool]]:
    """The guards for one scan of many bodies, each followed by ``SEPARATOR``.

    Each guard is followed by the rest of its body and the separator after it: all its
    matches in a body end at that separator, which Hyperscan reports once (it reports each
    end offset of a pattern once). So a body costs at most one match report per guard, as
    ``HS_FLAG_SINGLEMATCH`` gives one event's scan (a report is a Python call that retakes
    the GIL; reporting every match cost three times as many on the tests' events). A match
    cannot run on into the next body (``[^\\n]*`` stops at the separator), and it starts in
    its body but for the ``[^"]`` that takes the separator before a body's first byte, where
    the body alone has the ``^`` it stands for: each guard holds in a body exactly where it
    holds in the body alone (tests/test_redact_guards.py holds them to it)."""
    return [(b"(?:" + e + rb")[^\n]*\n", c) for e, c in _expressions(word_cores, vendor)]


def _found(guard: int, _start: int, end: int, _flags: int, found: list[tuple[int, int]]) -> None:
    found.append((guard, end))


def _hit(guard: int, _start: int, _end: int, _flags: int, hits: list[int]) -> None:
    hits.append(guard)


def _compile(hyperscan: Any, word_cores: bytes, vendor: bytes) -> tuple[Any, Any]:
    """The single-event database and the batch one."""
    single = hyperscan.HS_FLAG_SINGLEMATCH
    dbs = []
    for expressions, flag in (
        (_expressions(word_cores, vendor), single),
        (_batch_expressions(word_cores, vendor), 0),
    ):
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(
            expressions=[e for e, _ in expressions],
            ids=list(range(len(expressions))),
            elements=len(expressions),
            flags=[flag | (hyperscan.HS_FLAG_CASELESS if c else 0) for _, c in expressions],
        )
        dbs.append(db)
    return dbs[0], dbs[1]


class Scanner:
    """Every guard of an event in one Hyperscan pass (each reported at most once)."""

    def __init__(self, hyperscan: Any, db: Any, batch_db: Any) -> None:
        self._hs = hyperscan
        self._db = db
        self._batch_db = batch_db
        self._prototype = hyperscan.Scratch(self._db)
        self._batch_prototype = hyperscan.Scratch(self._batch_db)
        # A scratch space per thread: the writer, a spilling agent thread and a gateway may
        # redact at once, and a scratch serves one scan at a time.
        self._local = threading.local()

    def scan(self, blob: bytes) -> list[int]:
        """The ids of the guards ``blob`` holds."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._prototype.clone()
        hits: list[int] = []
        self._db.scan(blob, match_event_handler=_hit, context=hits, scratch=scratch)
        return hits

    def scan_many(self, blobs: Sequence[bytes]) -> list[Collection[int]]:
        """The ids of the guards each of ``blobs`` (orjson's output) holds, in one pass over
        all of them: ``scan``'s answer for each, with one release of the GIL per batch rather
        than per event (beside a CPU-busy agent's thread each release may cost a switch).
        A body where no guard holds gets ``NONE``."""
        if not blobs:
            return []
        scratch = getattr(self._local, "batch_scratch", None)
        if scratch is None:
            scratch = self._local.batch_scratch = self._batch_prototype.clone()
        parts = list(blobs)
        parts.append(b"")  # the separator after the last body too, in the same join
        joined = SEPARATOR.join(parts)
        found: list[tuple[int, int]] = []
        self._batch_db.scan(joined, match_event_handler=_found, context=found, scratch=scratch)
        hits: list[Collection[int]] = [NONE] * len(blobs)
        # Each body's end: just past the separator after it (where its matches end).
        if found:
            body_at = {end: i for i, end in enumerate(accumulate(len(b) + 1 for b in blobs))}
            for guard, end in found:
                i = body_at[end]
                got = hits[i]
                if got is NONE:
                    hits[i] = {guard}
                else:
                    got.add(guard)  # type: ignore[attr-defined]
        return hits

    def check(self) -> bool:
        """Whether both databases find every guard in ``PROBE``, alone and between others."""
        every = set(range(COMMAND + 1))
        return set(self.scan(PROBE)) == every and [
            set(h) for h in self.scan_many([b"probe", PROBE, b"probe"])
        ] == [set(), every, set()]


def _only_ours(path: Path) -> bool:
    """Whether ``path`` is this user's and nobody else may write it."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _cache_dir() -> Path | None:
    """The user's own cache directory for compiled databases, or None where there is none
    that only the user can write (a database planted there could let secrets through)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "hindsight"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path if _only_ours(path) else None
    except OSError:
        return None


def _cache_file(hyperscan: Any, word_cores: bytes, vendor: bytes) -> Path | None:
    """Where the databases for these expressions, this Hyperscan and this machine are kept."""
    folder = _cache_dir()
    if folder is None:
        return None
    key = repr(
        (
            _expressions(word_cores, vendor),
            getattr(hyperscan, "__version__", ""),
            platform.machine(),
            platform.python_implementation(),
        )
    )
    return folder / f"guards-{hashlib.sha256(key.encode()).hexdigest()[:24]}.hsdb"


def _load_cached(hyperscan: Any, path: Path) -> Scanner | None:
    try:
        if not _only_ours(path):
            return None
        data = path.read_bytes()
        size = int.from_bytes(data[:8], "little")
        db = hyperscan.loadb(data[8 : 8 + size], hyperscan.HS_MODE_BLOCK)
        batch_db = hyperscan.loadb(data[8 + size :], hyperscan.HS_MODE_BLOCK)
        for loaded in (db, batch_db):  # as compile() leaves it: a scan may omit its scratch
            loaded.scratch = hyperscan.Scratch(loaded)
        scanner = Scanner(hyperscan, db, batch_db)
    except Exception:  # noqa: BLE001 - absent, cut short, another CPU's: compile instead
        return None
    return scanner if scanner.check() else None


def _store(hyperscan: Any, path: Path, db: Any, batch_db: Any) -> None:
    try:
        single = hyperscan.dumpb(db)
        data = len(single).to_bytes(8, "little") + single + hyperscan.dumpb(batch_db)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # whole or not at all, for processes loading it at once
    except Exception:  # noqa: BLE001 - a cache that cannot be written is only slower
        return


def load(word_cores: bytes, vendor: bytes) -> Scanner | None:
    """A scanner, or None without the ``hyperscan`` package or where it cannot run."""
    try:
        import hyperscan
    except ImportError:
        return None
    path = _cache_file(hyperscan, word_cores, vendor)
    if path is not None and (scanner := _load_cached(hyperscan, path)) is not None:
        return scanner
    try:
        db, batch_db = _compile(hyperscan, word_cores, vendor)
        scanner = Scanner(hyperscan, db, batch_db)
        if not scanner.check():
            return None
    except Exception:  # noqa: BLE001 - an unsupported CPU: the pure-Python guards serve
        return None
    if path is not None:
        _store(hyperscan, path, db, batch_db)
    return scanner
