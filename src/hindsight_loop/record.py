"""Recording from the agent's hot path.

The agent's thread does as little as possible: it takes a sequence number and a timestamp and
appends a tuple to a deque (both atomic under the GIL, no lock, no I/O, no serialization). A
background writer turns batches into rows (sanitizing, cutting long text, redacting secrets) and
writes each batch with one SQL statement. ``flush()`` returns once everything accepted before it
is durable. A batch the store refuses goes, with the reason, to a dead-letter file next to the
database, so nothing accepted is lost silently.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import count
from pathlib import Path
from typing import Any

import orjson

from hindsight_loop.models import EVENT_BODY_FIELDS, iso_from_ns, new_id, parse_ts

log = logging.getLogger("hindsight_loop")

DEFAULT_MAX_TEXT = 500
DEFAULT_QUEUE_BOUND = 200_000
BATCH_SIZE = 10_000


class HindsightWarning(UserWarning):
    """Something the agent handed Hindsight was changed or could not be used as it was."""


def warn(message: str) -> None:
    """Warn without ever raising into the caller (even when warnings are turned into errors)."""
    log.debug(message)
    try:
        warnings.warn(message, HindsightWarning, stacklevel=3)
    except Exception:  # noqa: BLE001 - a warnings filter set to "error" must not break the agent
        pass


# -- secrets ----------------------------------------------------------------------------------

_SECRET_PATTERNS: list[tuple[re.Pattern[bytes], bytes]] = [
    # "password": "…", "api_key": "…" and friends: keep the key, drop the value.
    (
        re.compile(
            rb'("(?:[A-Za-z_\-]*(?:password|passwd|pwd|secret|api[_\-]?key|apikey|access[_\-]?token'
            rb'|auth[_\-]?token|token|authorization|private[_\-]?key|cookie)[A-Za-z_\-]*)"\s*:\s*)'
            rb'"(?:[^"\\]|\\.)*"',
            re.IGNORECASE,
        ),
        rb'\1"[REDACTED]"',
    ),
    (re.compile(rb"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/\-]{8,}=*"), rb"\1 [REDACTED]"),
    (re.compile(rb"\b(sk|pk|rk)-(?:[A-Za-z0-9_\-]{2,}-)?[A-Za-z0-9_\-]{16,}"), b"[REDACTED]"),
    (re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), b"[REDACTED]"),
    (re.compile(rb"\b(?:ghp|gho|ghs|ghu|github_pat|xox[abpr]|glpat)[_\-][A-Za-z0-9_\-]{16,}"), b"[REDACTED]"),
    (re.compile(rb"(?i)((?:password|passwd|pwd|api_key|apikey|token|secret)=)[^\s&\"']+"), rb"\1[REDACTED]"),
    (re.compile(rb"(://[^/\s:@\"]+:)[^@\s/\"]+@"), rb"\1[REDACTED]@"),
]
_SECRET_HINT = re.compile(
    rb"(?i)password|passwd|pwd|secret|api[_\-]?key|token|authorization|bearer|basic |cookie"
    rb"|private|sk-|pk-|rk-|AKIA|ASIA|ghp_|gho_|ghs_|ghu_|github_pat|xox|glpat|://[^\"]*@"
)


def redact(blob: bytes) -> bytes:
    """Remove secrets from serialized JSON. A cheap pre-check skips clean events."""
    if not _SECRET_HINT.search(blob):
        return blob
    for pattern, repl in _SECRET_PATTERNS:
        blob = pattern.sub(repl, blob)
    return blob


# -- sanitizing -------------------------------------------------------------------------------

class _Sanitizer:
    """Makes any Python value storable JSON, cutting long text; collects what it had to change."""

    def __init__(self, max_text: int) -> None:
        self.max_text = max_text
        self.problems: list[str] = []

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
            return {
                (k if isinstance(k, str) else str(k)): self.value(x, depth + 1) for k, x in v.items()
            }
        if isinstance(v, list | tuple | set | frozenset):
            items = list(v)
            if len(items) > self.max_text:
                self.problems.append(f"list of {len(items)} items cut to {self.max_text}")
                items = items[: self.max_text]
            return [self.value(x, depth + 1) for x in items]
        if isinstance(v, bytes | bytearray):
            self.problems.append("bytes stored as text")
            return self.text(bytes(v).decode("utf-8", "replace"))
        if isinstance(v, datetime):
            return v.isoformat()
        self.problems.append(f"{type(v).__name__} is not JSON: stored as its repr")
        try:
            return self.text(repr(v))
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break recording
            return f"<unrepresentable {type(v).__name__}>"


# -- the recorder -----------------------------------------------------------------------------

# A queued item: (task_id, seq, timestamp (ns int, or caller's value), type, payload, event_id)
Item = tuple[str, int, Any, str, dict[str, Any], str | None]
Row = tuple[str, str, int, str, str, bytes]


class Recorder:
    """Accepts events from any thread without blocking and writes them in batches."""

    def __init__(
        self,
        write: Callable[[list[Row]], list[str] | None],
        *,
        dead_letter: str | Path,
        max_text: int = DEFAULT_MAX_TEXT,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        on_batch: Callable[[list[Row]], None] | None = None,
        block_seconds: float = 0.5,
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
        self._thread = threading.Thread(target=self._run, name="hindsight-writer", daemon=True)
        self._thread.start()

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
        q = self._queue
        if len(q) >= self.queue_bound:
            self._overload()
        q.append((task_id, own if seq is None else seq, timestamp or time.time_ns(), etype,
                  payload, event_id))
        return own

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
        rows = [self._row(item) for item in spill]
        self._dead_letter(rows, "queue full: spilled by the agent's thread under overload")
        self.stats["spilled"] += len(rows)
        with self._cond:
            self._done += len(spill)
            self._cond.notify_all()

    # -- writer ----------------------------------------------------------------------------
    def _row(self, item: Item) -> Row:
        task_id, seq, ts, etype, payload, event_id = item
        sanitizer = _Sanitizer(self.max_text)
        try:
            body = orjson.dumps(sanitizer.value(payload))
        except Exception as exc:  # noqa: BLE001 - never lose the event for its content
            body = orjson.dumps({"unserializable": sanitizer.text(repr(exc))})
        body = redact(body)
        if isinstance(ts, int) and ts > 10**17:
            stamp = iso_from_ns(ts)
        else:
            try:
                stamp = iso_from_ns(int(parse_ts(ts).timestamp() * 1e9))
            except (ValueError, TypeError, OverflowError):
                sanitizer.problems.append(f"timestamp {ts!r} unreadable: replaced by now")
                stamp = iso_from_ns(time.time_ns())
        if sanitizer.problems:
            self.stats["warnings"] += 1
            warn(f"event {seq} of task {task_id!r}: " + "; ".join(sorted(set(sanitizer.problems))))
        return (event_id or new_id("evt"), task_id, seq, stamp, etype, body)

    def _run(self) -> None:
        while True:
            if not self._queue:
                if self._stop:
                    return
                # Poll rather than have the agent signal every event: setting an Event costs the
                # agent's thread more than the whole append.
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
            try:
                rows = [self._row(item) for item in items]
            except Exception as exc:  # noqa: BLE001 - keep the writer alive whatever happens
                log.exception("hindsight: could not prepare a batch")
                rows = []
                self._dead_letter_raw(items, f"could not prepare: {exc!r}")
            if rows:
                try:
                    unknown = self._write(rows)
                    self.stats["written"] += len(rows)
                    if unknown:
                        self.stats["warnings"] += 1
                        warn(
                            f"events for unknown task id(s) {', '.join(map(repr, unknown[:5]))}: "
                            "kept under a placeholder task; start tasks with hs.task() or a "
                            "task_start event"
                        )
                except Exception as exc:  # noqa: BLE001
                    self._dead_letter(rows, f"store refused the batch: {exc!r}")
                else:
                    if self._on_batch is not None:
                        try:
                            self._on_batch(rows)
                        except Exception:  # noqa: BLE001
                            log.exception("hindsight: batch hook failed")
            with self._cond:
                self._done += len(items)
                self._cond.notify_all()

    def _dead_letter(self, rows: Iterable[Row], reason: str) -> None:
        lines = []
        for event_id, task_id, seq, ts, etype, body in rows:
            event = orjson.loads(body)
            event.update(event_id=event_id, task_id=task_id, seq=seq, timestamp=ts, type=etype)
            lines.append(orjson.dumps({**event, "_dead_letter_reason": reason}))
        self._append_dead_letter(lines, reason)

    def _dead_letter_raw(self, items: list[Item], reason: str) -> None:
        lines = [
            orjson.dumps(
                {"task_id": i[0], "seq": i[1], "type": i[3], "repr": repr(i[4])[:10_000],
                 "_dead_letter_reason": reason}
            )
            for i in items
        ]
        self._append_dead_letter(lines, reason)

    def _append_dead_letter(self, lines: list[bytes], reason: str) -> None:
        try:
            with self.dead_letter.open("ab") as fh:
                fh.write(b"\n".join(lines) + b"\n")
                fh.flush()
            self.stats["dead_lettered"] += len(lines)
            warn(f"{len(lines)} events written to {self.dead_letter} ({reason})")
        except OSError as exc:
            log.error("hindsight: LOST %d events: %s; dead-letter failed: %s", len(lines), reason, exc)

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
                if not self._thread.is_alive():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self.flush()
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)


def event_payload(event: dict[str, Any]) -> dict[str, Any]:
    """The part of a wire-format event that goes into the body column."""
    return {
        k: v
        for k, v in event.items()
        if k not in ("event_id", "task_id", "seq", "timestamp", "type")
    }


__all__ = [
    "DEFAULT_MAX_TEXT",
    "EVENT_BODY_FIELDS",
    "HindsightWarning",
    "Recorder",
    "event_payload",
    "redact",
    "warn",
]
