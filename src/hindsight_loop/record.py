"""Recording from the agent's hot path.

The agent's thread does as little as possible: it takes a sequence number and a timestamp and
appends a tuple to a deque (both atomic under the GIL, no lock, no I/O, no serialization). A
background writer turns batches into rows (sanitizing, cutting long text, redacting secrets) and
writes each batch with one SQL statement. ``flush()`` returns once everything accepted before it
is durable. A batch the store refuses goes, with the reason, to a dead-letter file next to the
database, so nothing accepted is lost silently.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import re
import sqlite3
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import count, islice
from pathlib import Path
from typing import Any

import orjson

from hindsight_loop.models import EVENT_BODY_FIELDS, WIRE_SCALARS, new_id, parse_ts

log = logging.getLogger("hindsight_loop")

DEFAULT_MAX_TEXT = 500
DEFAULT_QUEUE_BOUND = 50_000
BATCH_SIZE = 10_000


class HindsightWarning(UserWarning):
    """Something the agent handed Hindsight was changed or could not be used as it was."""


def warn(message: str) -> None:
    """Warn without ever raising into the caller (even when warnings are turned into errors)."""
    log.debug(message)
    # A warnings filter set to "error" must not break the agent.
    with contextlib.suppress(Exception):
        warnings.warn(message, HindsightWarning, stacklevel=3)


# -- secrets ----------------------------------------------------------------------------------

_SECRET_WORDS = (
    r"password|passwd|pwd|secret|api[_\-. ]?key|apikey|access[_\-. ]?token|auth[_\-. ]?token"
    r"|token|authorization|private[_\-. ]?key|cookie|credential"
)
_SECRET_WORDS_ZH = "密码|口令|密钥|令牌|秘钥"
# A JSON value: a string, a number, a literal, or a flat list (a list of tokens is secret too).
_JSON_VALUE = rb'(?:"(?:[^"\\]|\\.)*"|-?\d[\d.eE+\-]*|true|false|null|\[[^\[\]]*\])'

_SECRET_PATTERNS: list[tuple[re.Pattern[bytes], bytes]] = [
    # "password": …, "db.password": …, "API Key": … and friends: keep the key, drop the value.
    (
        re.compile(
            rb'("[^"\\]{0,80}?(?:'
            + _SECRET_WORDS.encode()
            + rb')[^"\\]{0,80}"\s*:\s*)'
            + _JSON_VALUE,
            re.IGNORECASE,
        ),
        rb'\1"[REDACTED]"',
    ),
    (re.compile(rb"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/\-]{8,}=*"), rb"\1 [REDACTED]"),
    (re.compile(rb"\b(sk|pk|rk)-(?:[A-Za-z0-9_\-]{2,}-)?[A-Za-z0-9_\-]{16,}"), b"[REDACTED]"),
    (re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), b"[REDACTED]"),
    (
        re.compile(rb"\b(?:ghp|gho|ghs|ghu|github_pat|xox[abpr]|glpat)[_\-][A-Za-z0-9_\-]{16,}"),
        b"[REDACTED]",
    ),
    # In free text: password=x, password: x, X-Api-Key: x, token is x, password='x' (a repr),
    # 密码：x, 我的密码是 x. The value may sit in (escaped) quotes.
    (
        re.compile(
            rb"(?i)((?:"
            + _SECRET_WORDS.encode()
            + rb"|"
            + _SECRET_WORDS_ZH.encode()
            + rb")\s*(?:[:=]|\xef\xbc\x9a|\s+is\s+|\xe6\x98\xaf|\xe4\xb8\xba)\s*(?:\\?[\"'])?)"
            + rb"(?!\[REDACTED\])[^\s\"'\\,;&]+"
        ),
        rb"\1[REDACTED]",
    ),
    (re.compile(rb"(://[^/\s:@\"]+:)[^@\s/\"]+@"), rb"\1[REDACTED]@"),
    (
        re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
        b"[REDACTED PRIVATE KEY]",
    ),
]
# Running every pattern over every event is slow (Python's ``re`` tries each alternative at
# each position) and most events hold no secret. So each pattern runs only when a cheap test (substring search on the lowercased event, a literal-
# prefixed ``re`` scan) finds something that all of its matches contain. Each guard is a
# superset of its pattern, so the result is exactly that of running every pattern.
_SECRET_KEY = re.compile(rf"(?:{_SECRET_WORDS})", re.I)
_BEARER = re.compile(rb"b(?:earer|asic)")  # on the lowercased event (2x faster than (?i) here)
_VENDOR_KEY = re.compile(rb"k-")
_AWS = re.compile(rb"A[KS]IA")
_GITHUB = re.compile(rb"g(?:h[opsu]|ithub_pat|lpat)")  # one literal prefix each: fast scans
_SLACK = re.compile(rb"xox")
# Literal cores of the secret words: every match of the key and text patterns contains one.
# One regex over the lowercased event beats a substring test per core (one scan, not many).
_WORD_CORES = re.compile(
    b"pass|pwd|secret|key|token|auth|cookie|credential|" + "密码|口令|密钥|令牌|秘钥".encode()
)


def _has_secret_word(blob: bytes) -> bool:
    return _WORD_CORES.search(blob.lower()) is not None


def _may_assign(blob: bytes) -> bool:
    """Whether some string value may hold ``word: value``, ``word=value`` or ``word is value``.

    For ASCII events a few C-level scans answer it (orjson writes no space after a key's colon,
    so a colon not right after a quote is inside a string). Text with Chinese in it may use
    ：/是/为, which are too common to pre-scan for: it always goes on to the word test.
    """
    if not blob.isascii():
        return True
    return b"=" in blob or blob.count(b":") > blob.count(b'":') or b" is " in blob


def _key_guard(blob: bytes) -> bool:
    return _has_secret_word(blob)


def _text_guard(blob: bytes) -> bool:
    return _may_assign(blob) and _has_secret_word(blob)


_GUARDS: tuple[Callable[[bytes], bool], ...] = (
    _key_guard,
    lambda b: _BEARER.search(b.lower()) is not None,
    lambda b: _VENDOR_KEY.search(b) is not None,
    lambda b: _AWS.search(b) is not None,
    lambda b: _GITHUB.search(b) is not None or _SLACK.search(b) is not None,
    _text_guard,
    lambda b: b"@" in b and b"://" in b,
    lambda b: b"PRIVATE KEY-----" in b,
)


def redact(blob: bytes, *, secret_key: bool | None = None) -> bytes:
    """Remove secrets from serialized JSON; an event with no secret is only scanned by guards.

    ``secret_key``: whether some key of the event names a secret (``"api_key"``), when the
    caller already knows (the writer learns it while sanitizing); None looks in ``blob``.
    """
    for (pattern, repl), guard in zip(_SECRET_PATTERNS, _GUARDS, strict=True):
        known = guard is _key_guard and secret_key is not None
        if secret_key if known else guard(blob):
            blob = pattern.sub(repl, blob)
    return blob


# Keys known not to name a secret: agents use few distinct keys, so one set lookup per dict
# replaces a pattern match per key. Keys made from data must not grow it forever: it is
# cleared past a bound.
_PLAIN_KEYS: set[str] = set()
_PLAIN_KEYS_BOUND = 10_000


def _names_secret(key: str) -> bool:
    if len(_PLAIN_KEYS) > _PLAIN_KEYS_BOUND:
        _PLAIN_KEYS.clear()
    return _SECRET_KEY.search(key) is not None


# -- sanitizing -------------------------------------------------------------------------------


class _Sanitizer:
    """Makes any Python value storable JSON, cutting long text; collects what it had to change."""

    __slots__ = ("max_text", "problems", "secret_key")

    def __init__(self, max_text: int) -> None:
        self.max_text = max_text
        self.problems: list[str] = []
        self.secret_key = False  # some key names a secret: redact() must look at the keys

    def reset(self) -> None:
        """Ready for the next event (one sanitizer serves a batch: fewer objects for the GC)."""
        if self.problems:
            self.problems = []
        self.secret_key = False

    def text(self, s: str) -> str:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates: bytes smuggled in by surrogateescape come back as U+FFFD.
            try:
                raw = s.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = s.encode("utf-8", "surrogatepass")
            s = raw.decode("utf-8", "replace")
            self.problems.append("invalid UTF-8 replaced")
        if len(s) > self.max_text:
            s = f"{s[: self.max_text]}…[cut {len(s) - self.max_text} chars]"
        return s

    def value(self, v: Any, depth: int = 0) -> Any:
        """``v`` as storable JSON: ``v`` itself (not a copy) when nothing in it had to change.

        Copying every event cost the writer ~15 µs per 1 KB event; most events are plain JSON
        already, so dicts and lists are checked in place and copied only from the first change.
        """
        t = type(v)
        if t is str:
            return v if len(v) <= self.max_text and v.isascii() else self.text(v)
        if depth <= 20:
            if t is dict:
                return self._dict(v, depth)
            if t is list and len(v) <= self.max_text:
                return self._list(v, depth)
        return self._other(v, depth)

    def _dict(self, d: dict[Any, Any], depth: int) -> dict[str, Any]:
        # One C-level subset test clears all the keys of a dict seen before.
        keys_ok = _PLAIN_KEYS.issuperset(d)
        if not keys_ok:
            self._learn_keys(d)
        out: dict[str, Any] | None = None
        kept = 0
        for k, x in d.items():
            t = type(x)
            if t is str:
                y = x if len(x) <= self.max_text and x.isascii() else self.text(x)
            elif t is int or t is bool or x is None:
                y = x
            elif t is dict and depth < 20:
                y = self._dict(x, depth + 1)
            else:
                y = self.value(x, depth + 1)
            if out is None:
                if y is x and (keys_ok or type(k) is str):
                    kept += 1
                    continue
                out = dict(islice(d.items(), kept))
            out[k if isinstance(k, str) else str(k)] = y
        return d if out is None else out

    def _learn_keys(self, d: dict[Any, Any]) -> None:
        for k in d:
            if _names_secret(str(k)):
                self.secret_key = True
            elif type(k) is str:
                _PLAIN_KEYS.add(k)

    def _list(self, items: list[Any], depth: int) -> list[Any]:
        # The same per-value dispatch as _dict, inlined rather than shared: it runs once per
        # value in the writer's hottest loop, where a function call per value shows.
        out: list[Any] | None = None
        for i, x in enumerate(items):
            t = type(x)
            if t is str:
                y = x if len(x) <= self.max_text and x.isascii() else self.text(x)
            elif t is int or t is bool or x is None:
                y = x
            elif t is dict and depth < 20:
                y = self._dict(x, depth + 1)
            else:
                y = self.value(x, depth + 1)
            if out is None:
                if y is x:
                    continue
                out = items[:i]
            out.append(y)
        return items if out is None else out

    def _other(self, v: Any, depth: int) -> Any:
        """Everything but plain str, dict and list: the general rules."""
        if v is None or v is True or v is False or isinstance(v, int):
            return v
        if isinstance(v, str):
            return self.text(v) if len(v) > self.max_text or not v.isascii() else v
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            self.problems.append(f"{v!r} stored as null")
            return None
        if depth > 20:
            self.problems.append("nesting deeper than 20 levels cut")
            return self.text(repr(v))
        if isinstance(v, dict):
            out = {
                (k if isinstance(k, str) else str(k)): self.value(x, depth + 1)
                for k, x in v.items()
            }
            if any(_names_secret(k) for k in out):
                self.secret_key = True
            return out
        if isinstance(v, (list, tuple, set, frozenset)):
            items = list(v)
            if len(items) > self.max_text:
                self.problems.append(f"list of {len(items)} items cut to {self.max_text}")
                items = items[: self.max_text]
            return [self.value(x, depth + 1) for x in items]
        if isinstance(v, (bytes, bytearray)):
            self.problems.append("bytes stored as text")
            return self.text(bytes(v).decode("utf-8", "replace"))
        if isinstance(v, datetime):
            return v.isoformat()
        self.problems.append(f"{type(v).__name__} is not JSON: stored as its repr")
        try:
            return self.text(repr(v))
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break recording
            return f"<unrepresentable {type(v).__name__}>"


def _big_ints_as_text(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _big_ints_as_text(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_big_ints_as_text(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
        return str(v)
    return v


# -- the recorder -----------------------------------------------------------------------------

# A queued item: (task_id, seq, timestamp (ns int, or caller's value), type, payload, event_id)
Item = tuple[str, int, Any, str, dict[str, Any], str | None]
Row = tuple[str, str, int, str, str, bytes]
# A batch on its way to the store: how many events, their rows, and, if they could not be
# prepared, the raw items and why. The items themselves are not kept once prepared: as Python
# objects an event takes several times the memory of its row.
# (items, rows, raw items if they could not be prepared, the problem, sanitized payloads)
_Batch = tuple[int, list[Row] | None, list[Item] | None, str, list[Any]]
#: Event types whose sanitized payload is handed to ``on_batch`` (the live anomaly rules read
#: them), so the hook does not parse the JSON it was just made from.
WATCHED_TYPES = frozenset({"action_executed", "feedback", "user_input"})


class Recorder:
    """Accepts events from any thread without blocking and writes them in batches."""

    def __init__(
        self,
        write: Callable[[list[Row]], list[str] | None],
        *,
        dead_letter: str | Path,
        max_text: int = DEFAULT_MAX_TEXT,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        on_batch: Callable[[list[Row], list[Any]], None] | None = None,
        block_seconds: float = 2.0,
    ) -> None:
        self._write = write
        self.dead_letter = Path(dead_letter)
        self.max_text = max_text
        self.queue_bound = queue_bound
        self.block_seconds = block_seconds
        self._on_batch = on_batch
        self._queue: deque[Item] = deque()
        self._seq = count(1)
        self._flush_marks = 0  # seqs taken by flush() itself rather than by an event
        self._mark_lock = threading.Lock()
        self._done = 0  # items handled by the writer (written or dead-lettered)
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self.stats = {"written": 0, "dead_lettered": 0, "spilled": 0, "warnings": 0}
        self._stamp = (-1, "")
        self._in_flight = 0  # taken from the queue by the writer, not yet durable
        self._commits: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="hindsight-writer", daemon=True)
        self._committer = threading.Thread(
            target=self._commit, name="hindsight-committer", daemon=True
        )
        self._thread.start()
        self._committer.start()

    # -- hot path --------------------------------------------------------------------------
    def emit(
        self,
        task_id: str,
        etype: str,
        payload: dict[str, Any],
        *,
        timestamp: Any = None,
        event_id: str | None = None,
        seq: int | None = None,
    ) -> int:
        """Accept one event; returns its seq. Never blocks on I/O except under overload.

        ``seq`` is the caller's own sequence number (imports); by default the recorder's.
        """
        own = next(self._seq)
        if self._stop:
            self._after_close(task_id, own, timestamp, etype, payload, event_id)
            return own
        q = self._queue
        if len(q) >= self.queue_bound:
            self._overload()
        q.append(
            (
                task_id,
                own if seq is None else seq,
                timestamp or time.time_ns(),
                etype,
                payload,
                event_id,
            )
        )
        return own

    def _after_close(self, *item: Any) -> None:
        """An event recorded after close(): nothing will write it, so keep it in the dead letter."""
        reason = "recorded after close(): not written to the store"
        try:
            row = self._row(item, None)  # type: ignore[arg-type]
            self._dead_letter([row], reason)
        except Exception:  # noqa: BLE001
            self._dead_letter_raw([item], reason)  # type: ignore[list-item]

    def _overload(self) -> None:
        """The queue is full: wait briefly for the writer, then spill to the dead-letter file.

        Memory stays bounded; what is spilled is kept (``hindsight import`` reads it back).
        """
        self._wake.set()
        deadline = time.monotonic() + self.block_seconds
        while len(self._queue) >= self.queue_bound and time.monotonic() < deadline:
            time.sleep(0.001)
        if len(self._queue) < self.queue_bound:
            return
        spill = []
        for _ in range(min(BATCH_SIZE, len(self._queue))):
            try:
                spill.append(self._queue.popleft())
            except IndexError:
                break
        sanitizer = _Sanitizer(self.max_text)
        self._dead_letter(
            (self._row(item, sanitizer) for item in spill),
            "queue full: spilled by the agent's thread under overload",
        )
        self.stats["spilled"] += len(spill)
        with self._cond:
            self._done += len(spill)
            self._cond.notify_all()

    # -- writer ----------------------------------------------------------------------------
    def _iso(self, ns: int) -> str:
        """Nanoseconds since the epoch as the wire timestamp, the seconds part cached (formatting it
        is most of an event's timestamp cost)."""
        secs, rem = divmod(ns, 1_000_000_000)
        cached, prefix = self._stamp  # one tuple: the spilling agent thread may call this too
        if secs != cached:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
            self._stamp = (secs, prefix)
        return f"{prefix}.{rem // 1_000_000:03d}Z"

    def _row(
        self, item: Item, sanitizer: _Sanitizer | None = None, keep: list[Any] | None = None
    ) -> Row:
        """Turn a queued item into a row; with ``keep``, also collect its sanitized payload
        (not redacted: only for the in-process hook, never stored)."""
        task_id, seq, ts, etype, payload, event_id = item
        if sanitizer is None:
            sanitizer = _Sanitizer(self.max_text)
        else:
            sanitizer.reset()
        clean = None
        try:
            clean = sanitizer.value(payload)
            if "type" in clean or "task_id" in clean:
                # A wire-format event handed over whole: its scalars are columns, not body.
                clean = {k: v for k, v in clean.items() if k not in WIRE_SCALARS}
            try:
                body = orjson.dumps(clean)
            except orjson.JSONEncodeError:
                # orjson stops at 64-bit integers: keep bigger ones as text (rare, so it is
                # handled here rather than checked on every integer).
                clean = _big_ints_as_text(clean)
                body = orjson.dumps(clean)
                sanitizer.problems.append("integer beyond 64 bits stored as text")
        except Exception as exc:  # noqa: BLE001 - never lose the event for its content
            clean = None
            body = orjson.dumps({"unserializable": sanitizer.text(repr(exc))})
            sanitizer.problems.append(f"could not be stored as JSON ({exc!r}): kept as its error")
        if keep is not None:
            keep.append(clean if etype in WATCHED_TYPES else None)
        body = redact(body, secret_key=sanitizer.secret_key)
        if isinstance(ts, int) and ts > 10**17:
            stamp = self._iso(ts)
        else:
            try:
                stamp = self._iso(int(parse_ts(ts).timestamp() * 1e9))
            except (ValueError, TypeError, OverflowError):
                sanitizer.problems.append(f"timestamp {ts!r} unreadable: replaced by now")
                stamp = self._iso(time.time_ns())
        if sanitizer.problems:
            self.stats["warnings"] += 1
            warn(f"event {seq} of task {task_id!r}: " + "; ".join(sorted(set(sanitizer.problems))))
        return (event_id or new_id("evt"), task_id, seq, stamp, etype, body)

    def _run(self) -> None:
        """Prepare batches (sanitize, cut, redact) and hand them to the committer thread.

        Preparing is Python and holds the GIL; the store's write is SQLite and releases it. In
        two threads the next batch is prepared while the store writes this one, so their times
        overlap instead of adding up.
        """
        try:
            while True:
                # Take nothing from the queue while a prepared batch still waits for the
                # committer: at most two batches are out of the queue (one being written, one
                # ready), so queue_bound alone bounds the memory.
                self._commits.join()
                if not self._queue:
                    if self._stop:
                        return
                    # Poll rather than have the agent signal every event: setting an Event costs
                    # the agent's thread more than the whole append.
                    self._wake.wait(0.005)
                    self._wake.clear()
                    continue
                items = []
                q = self._queue
                for _ in range(min(BATCH_SIZE, len(q))):
                    try:
                        items.append(q.popleft())
                    except IndexError:
                        break
                with self._cond:
                    self._in_flight += len(items)
                try:
                    sanitizer = _Sanitizer(self.max_text)
                    cleans: list[Any] = []
                    keep = cleans if self._on_batch is not None else None
                    rows = [self._row(item, sanitizer, keep) for item in items]
                    batch: _Batch = (len(items), rows, None, "", cleans)
                except Exception as exc:  # noqa: BLE001 - keep the writer alive whatever happens
                    log.exception("hindsight: could not prepare a batch")
                    batch = (len(items), None, items, f"could not prepare: {exc!r}", [])
                del items
                self._commits.put(batch)
        finally:
            self._commits.put(None)

    def _commit(self) -> None:
        """Write prepared batches in order; what the store refuses goes to the dead letter."""
        while (batch := self._commits.get()) is not None:
            self._commits.task_done()  # taken: the writer may prepare the next batch
            n, rows, raw, problem, cleans = batch
            del batch
            try:
                if raw is not None:
                    self._dead_letter_raw(raw, problem)
                elif rows:
                    self._write_batch(rows, cleans)
            except Exception:  # noqa: BLE001 - this thread must outlive any one batch
                log.exception("hindsight: committing a batch failed")
            del rows, raw, cleans
            with self._cond:
                self._in_flight -= n
                self._done += n
                self._cond.notify_all()

    def _write_batch(self, rows: list[Row], cleans: list[Any]) -> None:
        try:
            unknown = self._write(rows)
        except sqlite3.OperationalError as exc:
            # Locked, full or unreadable: the whole batch waits in the dead letter.
            self._dead_letter(rows, f"store refused the batch: {exc!r}")
            return
        except Exception as exc:  # noqa: BLE001
            if len(rows) == 1:
                self._dead_letter(rows, f"store refused the event: {exc!r}")
                return
            # Something in the data: write row by row so one bad event does not take the
            # batch's thousands of good ones to the dead letter.
            for i, row in enumerate(rows):
                self._write_batch([row], cleans[i : i + 1])
            return
        self.stats["written"] += len(rows)
        if unknown:
            self.stats["warnings"] += 1
            warn(
                f"events for unknown task id(s) {', '.join(map(repr, unknown[:5]))}: "
                "kept under a placeholder task; start tasks with hs.task() or a "
                "task_start event"
            )
        if self._on_batch is not None:
            try:
                self._on_batch(rows, cleans)
            except Exception:  # noqa: BLE001
                log.exception("hindsight: batch hook failed")

    def _dead_letter(self, rows: Iterable[Row], reason: str) -> None:
        def line(row: Row) -> bytes:
            event_id, task_id, seq, ts, etype, body = row
            try:
                event = orjson.loads(body)
                event.update(event_id=event_id, task_id=task_id, seq=seq, timestamp=ts, type=etype)
                return orjson.dumps({**event, "_dead_letter_reason": reason}, default=str)
            except Exception:  # noqa: BLE001 - the dead letter must take anything
                return orjson.dumps({"row": repr(row)[:100_000], "_dead_letter_reason": reason})

        self._append_dead_letter(map(line, rows), reason)

    def _dead_letter_raw(self, items: list[Item], reason: str) -> None:
        lines = (
            orjson.dumps(
                {
                    "task_id": i[0],
                    "seq": i[1],
                    "type": i[3],
                    "repr": repr(i[4])[:10_000],
                    "_dead_letter_reason": reason,
                }
            )
            for i in items
        )
        self._append_dead_letter(lines, reason)

    def keep_refused(self, thing: Any, reason: str) -> None:
        """Dead-letter something refused before it became an event (not an event at all, or
        an event that fails the wire check), kept whole under ``refused`` with the reason."""
        try:
            line = orjson.dumps(
                {"refused": thing, "_dead_letter_reason": reason},
                default=repr,
                option=orjson.OPT_NON_STR_KEYS,
            )
        except Exception:  # noqa: BLE001 - the dead letter must take anything
            line = orjson.dumps({"refused": repr(thing)[:10_000], "_dead_letter_reason": reason})
        self._append_dead_letter([line], reason)

    def _append_dead_letter(self, lines: Iterable[bytes], reason: str) -> None:
        # Written a thousand lines at a time: building a whole batch's lines first (and its
        # events as dicts) would take memory at the moment it is tightest, the spill.
        written = 0
        try:
            with self.dead_letter.open("ab") as fh:
                chunk: list[bytes] = []
                for one in lines:
                    chunk.append(one)
                    if len(chunk) == 1000:
                        fh.write(b"\n".join(chunk) + b"\n")
                        written += len(chunk)
                        chunk = []
                if chunk:
                    fh.write(b"\n".join(chunk) + b"\n")
                    written += len(chunk)
                fh.flush()
            self.stats["dead_lettered"] += written
            warn(f"{written} events written to {self.dead_letter} ({reason})")
        except OSError as exc:
            self.stats["dead_lettered"] += written
            log.error(
                "hindsight: LOST events after %d: %s; dead-letter failed: %s", written, reason, exc
            )

    # -- control ---------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event accepted so far is durable (or dead-lettered)."""
        # Taking a seq here counts every emit() that took one before us: the items the
        # writer must have handled are the seqs issued so far minus those flush() took.
        with self._mark_lock:
            mark = next(self._seq)
            self._flush_marks += 1
            target = mark - self._flush_marks
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done < target:
                if not (self._thread.is_alive() and self._committer.is_alive()):
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    @property
    def backlog(self) -> int:
        """Events waiting in the queue (the part ``queue_bound`` limits)."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Events accepted and not yet durable: the queue plus the batches being written."""
        return len(self._queue) + self._in_flight

    def close(self) -> None:
        self.flush()
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._committer.join(timeout=5)


__all__ = [
    "DEFAULT_MAX_TEXT",
    "EVENT_BODY_FIELDS",
    "HindsightWarning",
    "Recorder",
    "redact",
    "warn",
]
