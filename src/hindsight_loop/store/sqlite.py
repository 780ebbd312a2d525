"""The embedded default store: one SQLite file in WAL mode.

Each thread gets its own connection (the recorder's writer, the review worker and the caller
all use the store at once); WAL lets readers proceed while the writer commits.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from hindsight_loop.models import (
    Event,
    Lesson,
    Reflection,
    Task,
    TaskScores,
    iso,
    task_outcome,
    utcnow,
)
from hindsight_loop.replay import StoredRun, no_gc, project_body, wire_timestamp
from hindsight_loop.store import (
    STORE_CALLS,
    EventRow,
    Job,
    JobOwner,
    ThreadConnections,
    through_store_calls,
)
from hindsight_loop.store.migrations import MIGRATIONS, SchemaError, check_schema, migrate

#: Seconds a claimed job may run before another worker takes it back (a reflection with
#: retries takes a few minutes at most).
JOB_LEASE = 600.0
#: Claims of one job before it is given up (it kept killing its worker).
MAX_ATTEMPTS = 3
#: Task ids the event writer remembers as stored, at most (past it, it starts over).
KNOWN_TASKS_BOUND = 100_000
#: WAL pages the event writer lets build up before it checkpoints (SQLite's own default), and
#: how many times that past which a flush waits for the checkpoint rather than stop it.
CHECKPOINT_PAGES = 1000
CHECKPOINT_CAP = 4
_CAP_PAGES = CHECKPOINT_CAP * CHECKPOINT_PAGES
#: Bytes of events per WAL page, for counting the pages a batch adds (a 4 KB page holds about
#: three 1 KB events with their index entries; ``checkpoint`` reads the exact count).
_BYTES_PER_PAGE = 3000


# One statement per batch: a writer that makes many small calls gives up the GIL on each and is
# starved by a CPU-busy agent thread; a single INSERT … SELECT over a JSON array is not. The
# bodies travel as one BLOB cut out by (offset, length): only the small index array goes through
# SQLite's JSON parser, not every body twice (json_each, then ->>). Each event's replay
# projection follows its body in the BLOB the same way ('' when it has none): as text inside the
# index it cost SQLite an unescaping pass, measurably more per event.
_INSERT_BATCH = """
INSERT INTO events(event_id, task_id, seq, ts, type, body, projection)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4,
       CAST(substr(?2, value->>5, value->>6) AS TEXT),
       CAST(substr(?2, value->>7, value->>8) AS TEXT)
FROM json_each(?1)
"""
# SQLite's ``->>`` ends a text at its first NUL character: a batch whose ids hold one takes
# these statements, a row at a time (the same columns, stored the same way).
_INSERT_ROWS = """
INSERT INTO events(event_id, task_id, seq, ts, type, body, projection)
VALUES (?, ?, ?, ?, ?, CAST(? AS TEXT), CAST(? AS TEXT))
"""
_NUL = b"\\u0000"  # a NUL character as orjson writes it in a JSON text
#: The rows of a batch of events go in multi-row INSERTs of these many rows, largest first,
#: each size once and at most ``_VALUES_STATEMENTS`` of them (seven values a row: within the
#: 32,766 SQLite allows; each compiled once per connection, in a few milliseconds, and kept in
#: its statement cache); what is left, through the JSON index (``_INSERT_BATCH``). A batch of
#: the writer process (~1,600 events) goes almost whole in two; a deep queue's 10,000 in the
#: writer thread mostly through the index: every statement lets go of the GIL, and retaking it
#: beside a CPU-busy agent thread may cost a switch interval.
_VALUES_SIZES = (1024, 512, 256, 128)
_VALUES_STATEMENTS = 2
_VALUES_MIN = _VALUES_SIZES[-1]
_INSERT_VALUES = {
    size: "INSERT INTO events(event_id, task_id, seq, ts, type, body, projection) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?, CAST(? AS TEXT), CAST(? AS TEXT))"] * size)
    for size in _VALUES_SIZES
}
_INT64 = (-(2**63), 2**63 - 1)


def _plain_columns(row: EventRow) -> bool:
    """Whether a row's columns are text, a 64-bit integer seq and a body of bytes: then
    binding them stores what ``_INSERT_BATCH`` reads from the JSON index (an integer past 64
    bits, a float, a caller's odd id take that statement, as they always did)."""
    seq = row[2]
    return (
        type(seq) is int
        and _INT64[0] <= seq <= _INT64[1]
        and type(row[0]) is str
        and type(row[1]) is str
        and type(row[3]) is str
        and type(row[4]) is str
        and type(row[5]) is bytes
    )


_NO_PROJECTION = frozenset({bytes, type(None)})


def _indices(values: list[Any], value: Any) -> Iterator[int]:
    """Where ``value`` is in ``values``, in order."""
    i = -1
    with contextlib.suppress(ValueError):
        while True:
            i = values.index(value, i + 1)
            yield i


def _usual_values(rows: Sequence[EventRow]) -> list[Any] | None:
    """The values the multi-row INSERTs bind for ``rows``, seven a row, as the per-row way
    gives them (``(*r[:6], row_projection(r) or b"")``), or None where it must decide: the
    writer's usual batch, every row seven plain columns (``_plain_columns``) with a wire
    timestamp (``wire_timestamp``), is checked and laid out a column at a time in C: the same
    checks and tuples row by row were a few Python calls per event on the committer's thread.

    Bodies and projections are bound as ``bytearray``: ``sqlite3`` binds any buffer the same
    way, but it first asks every ``bytes`` value whether an adapter converts it (a failed
    attribute lookup that words an error message and drops it), which cost more than a copy."""
    n = len(rows)
    if set(map(len, rows)) != {7}:
        return None
    values: list[Any] = list(chain.from_iterable(rows))
    seqs, stamps, projections = values[2::7], values[3::7], values[6::7]
    if (
        set(map(type, chain(values[0::7], values[1::7], stamps, values[4::7]))) != {str}
        or set(map(type, seqs)) != {int}
        or not _INT64[0] <= min(seqs) <= max(seqs) <= _INT64[1]
        or set(map(type, values[5::7])) != {bytes}
        or not set(map(type, projections)) <= _NO_PROJECTION
        or set(map(len, stamps)) != {24}
    ):
        return None
    joined = "".join(stamps)  # wire_timestamp of each: "." at 19, "Z" at 23
    if joined[19::24] != "." * n or joined[23::24] != "Z" * n:
        return None
    values[5::7] = map(bytearray, values[5::7])
    values[6::7] = [bytearray(p) if p else bytearray() for p in projections]
    return values


# A task's events in replay's order (rows tied on (ts, seq) in insertion order, which the index
# gives for free: its entries end with the row id).
# A body read as its UTF-8 bytes: orjson parses them as they are, where a text value would be
# decoded into a str first (and encoded back to UTF-8 by orjson for any non-ASCII body).
_BODY = "CAST(body AS BLOB)"
#: Each connection's page cache, in KiB as SQLite takes it (a negative size).
CACHE_KIB = -16_384
_PROJECTIONS = "SELECT id, type, projection FROM events WHERE task_id=? ORDER BY ts, seq, id"
# A batch's task starts and ends, each in one statement like its events. A statement per task
# held the event writer's committer 0.1-0.2 ms of wall time for 25-56 µs of its CPU: after
# each, it waits for the GIL the thread preparing the next batch holds. With tasks of 100
# events the writer ingests 5-8% more this way (bench/ingest.py's short tasks).
_TASK_STARTED = (
    "INSERT INTO tasks(task_id, task_type, goal, scope, tools, intent, injected, started_at)"
)
_TASK_RESTARTED = """ON CONFLICT(task_id) DO UPDATE SET task_type=excluded.task_type,
  goal=excluded.goal, scope=excluded.scope, tools=excluded.tools, intent=excluded.intent,
  injected=excluded.injected, started_at=excluded.started_at"""
_START_TASKS = f"""{_TASK_STARTED}
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7
FROM json_each(?) WHERE true {_TASK_RESTARTED}"""
_START_TASK = f"{_TASK_STARTED} VALUES (?, ?, ?, ?, ?, ?, ?, ?) {_TASK_RESTARTED}"
_END_TASKS = """
UPDATE tasks SET status = e.value->>1, outcome = e.value->>2, ended_at = e.value->>3
FROM json_each(?) AS e WHERE tasks.task_id = e.value->>0
"""
_END_TASK = "UPDATE tasks SET status = ?2, outcome = ?3, ended_at = ?4 WHERE task_id = ?1"


def writer_checkpoints(store: object) -> SQLiteStore | None:
    """The store whose checkpoints its event writer runs (``Recorder(checkpoints=)``): an
    SQLite store; None for any other, which checkpoints (or vacuums) as it always did."""
    return store if isinstance(store, SQLiteStore) else None


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()


_ENQUEUE = """INSERT INTO jobs(task_id, kind, trigger, window, use_llm, created_at, queued_by)
              VALUES (?, ?, ?, ?, ?, ?, ?)"""
# Several jobs in one statement (atomic alone: no BEGIN, no COMMIT), in the array's order.
_ENQUEUE_ALL = """INSERT INTO jobs(task_id, kind, trigger, window, use_llm, created_at, queued_by)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6
FROM json_each(?)"""


def job_row(
    owner: str,
    task_id: str,
    kind: str = "full",
    trigger: str = "task_end",
    window: list[int] | None = None,
    use_llm: bool = True,
    *,
    now: str,
) -> tuple[Any, ...]:
    """A queued job's values, in the order of the jobs table's insert (both stores)."""
    return (task_id, kind, trigger, _dumps(window) if window else None, int(use_llm), now, owner)


def row_projection(row: EventRow) -> bytes | None:
    """A row's replay projection: the one it came with, else worked out from its body (rows
    from callers other than the recorder); none beside a timestamp out of the wire format, so
    the store's order of the rows with one is replay's (``replay.StoredRun``)."""
    if not wire_timestamp(row[3]):
        return None
    return row[6] if len(row) > 6 else project_body(row[4], row[5])


def _event_of(event_id: str, task_id: str, seq: int, ts: str, etype: Any, body: Any) -> Event:
    """An ``Event`` from a row's columns; the decoded body, its parts taken out, is its extra.

    Replay decodes thousands of bodies per run: taking the five parts out of the decoded dict
    leaves the other fields in their order without copying them into a new one, and the
    fields are set one by one (``Event(**…)`` parses its keywords: ~4x the cost).
    ``tests/test_replay_projection.py`` checks that every field is set.
    """
    data = orjson.loads(body)
    pop = data.pop
    ev = _new_event(Event)
    ev.event_id = event_id
    ev.task_id = task_id
    ev.seq = seq
    ev.timestamp = ts
    ev.type = etype
    ev.agent_state = pop("agent_state", None)
    ev.context = pop("context", None)
    ev.input = pop("input", None)
    ev.decision = pop("decision", None)
    ev.result = pop("result", None)
    ev.extra = data
    return ev


_new_event = object.__new__


def _task_from_start(task_id: str, ts: str, body: dict[str, Any]) -> tuple:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        tools = [str(tools)]
    return (
        task_id,
        str(body.get("task_type") or "unknown"),
        str(body.get("goal") or ""),
        str(body.get("scope") or "global"),
        _dumps([str(t) for t in tools]),
        body.get("intent"),
        _dumps(body.get("injected_lesson_ids") or []),
        ts,
    )


def _file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None for an in-memory store or no file."""
    if path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@through_store_calls("__init__", "_events_by_key")  # a fork waits for the calls under way
class SQLiteStore(JobOwner, ThreadConnections):
    """A ``Store`` on one SQLite file."""

    def __init__(
        self, path: str | Path, *, synchronous: str = "NORMAL", readonly: bool = False
    ) -> None:
        # Absolute: each thread connects on first use, and a relative path would be read
        # from the working directory of that moment (an agent that changed it since wrote to
        # another, empty file).
        self.path = str(path) if str(path) == ":memory:" else os.path.abspath(path)
        self.url = f"sqlite:///{self.path}"
        self._synchronous = synchronous
        #: Opened for reading only (read commands; a store on read-only media): nothing is
        #: written, not even WAL mode or a migration.
        self.readonly = readonly
        self._uri: str | None = None
        self._init_connections()
        self._closed = False
        JobOwner.__init__(self)
        #: Task ids known to be in the tasks table (``write_event_batch`` skips looking).
        self._known_tasks: set[str] = set()
        # The event writer's own checkpoints (``defer_checkpoints``): its connection, the WAL
        # pages written since the last checkpoint, and the connection a checkpoint that may be
        # stopped runs on.
        self._deferred: sqlite3.Connection | None = None
        self._wal_pages = 0
        self._checkpoint_lock = threading.Lock()
        self._stoppable: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        if readonly:
            self._open_readonly()
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            if Path(self.path).exists():
                # Read the file as it is before anything (WAL mode, a migrations table) is
                # written into it: another application's database or a newer store stays as is.
                probe = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
                try:
                    check_schema(probe, self.path)
                finally:
                    probe.close()
        migrate(self._db)
        self._identity = _file_identity(self.path)  # the file written: see ``_check_file``

    def _check_file(self) -> None:
        """Refuse to write into a file no longer at the store's path (deleted, or replaced by
        a move): SQLite writes on into the open file, every write succeeds, and all of it is
        gone once the last connection closes. A stat a batch, about a microsecond."""
        if self._identity is not None and _file_identity(self.path) != self._identity:
            raise sqlite3.OperationalError(
                f"the store file {self.path} was deleted or replaced while in use"
            )

    def _forked(self) -> None:
        if self.path == ":memory:":
            return  # no file, no lock: the child's copy of the database is its own
        super()._forked()
        self._checkpoint_lock = threading.Lock()
        self._deferred = self._stoppable = None
        self._wal_pages = 0

    def _open_readonly(self) -> None:
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"no store at {self.path!r}")
        base = f"file:{quote(os.path.abspath(self.path))}"
        # mode=ro reads a WAL store like any reader (it sees what writers commit); on read-only
        # media, where SQLite cannot create the shared-memory file a WAL reader needs, the file
        # is read as immutable (nobody can be writing it there).
        for uri in (f"{base}?mode=ro", f"{base}?immutable=1"):
            self._uri = uri
            try:
                check_schema(self._db, self.path)
                done = _applied(self._db)
                pending = [name for name, _ in MIGRATIONS if name not in done]
                break
            except sqlite3.OperationalError:
                self._drop_thread_connection()
        else:
            raise sqlite3.OperationalError(f"cannot read {self.path!r}")
        if pending and os.access(self.path, os.W_OK) and os.access(Path(self.path).parent, os.W_OK):
            # An older store where it can be written: upgraded once, then read as asked.
            self._drop_thread_connection()
            upgrade = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            try:
                migrate(upgrade)
            finally:
                upgrade.close()
            pending = []
        if pending:
            raise SchemaError(
                f"{self.path!r} was written by an older Hindsight (missing {pending[0]!r}); "
                "open it once with a write command to upgrade it"
            )

    def _drop_thread_connection(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            with self._lock:
                self._conns.pop(db, None)
            db.close()

    # -- connections -----------------------------------------------------------------------
    @property
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            if self._closed:
                raise RuntimeError(f"store {self.path!r} is closed")
            if self._uri is not None:
                db = sqlite3.connect(
                    self._uri, uri=True, isolation_level=None, check_same_thread=False
                )
                db.execute("PRAGMA busy_timeout=30000")
                self._local.db = db
                self._keep(db)
                return db
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives the process being killed (it is in the OS's
            # page cache); only a power loss can take the last transactions.
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            db.execute("PRAGMA busy_timeout=30000")
            # Up to 16 MB of pages kept per connection (SQLite's default is 2 MB): a replay of
            # a long task reads its rows' pages again each time from the OS, a syscall each,
            # when they do not fit. Memory is taken only as pages are read.
            db.execute(f"PRAGMA cache_size={CACHE_KIB}")
            self._local.db = db
            self._keep(db)
        return db

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), {}
        for db in conns:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._local = threading.local()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE) for this thread; writes inside it join it.
        A fork waits for it whole (``STORE_CALLS``): a call inside it that waited for a fork
        would keep the transaction's lock from another thread's call the fork waits for."""
        with STORE_CALLS:
            db = self._db
            if db.in_transaction:
                yield
                return
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                # SQLite may have rolled back already (a full disk does): a second ROLLBACK
                # would replace the real error with "no transaction is active".
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- events ----------------------------------------------------------------------------
    def write_event_batch(self, rows: Sequence[EventRow]) -> list[str]:
        if not rows:
            return []
        # Chunks of the rows as bound values, the rest through the JSON index (one
        # statement): SQLite 3.40 parses a row's index entry again for each of its nine
        # ``->>``, a sixth of the events' insert. Bound values store what ``->>`` reads for
        # plain columns (text, 64-bit integers), so only batches of such rows take them.
        whole = 0
        sizes: list[int] = []
        usual = _usual_values(rows) if len(rows) >= _VALUES_MIN else None
        if usual is not None or (len(rows) >= _VALUES_MIN and all(map(_plain_columns, rows))):
            for size in _VALUES_SIZES:
                if len(rows) - whole >= size and len(sizes) < _VALUES_STATEMENTS:
                    sizes.append(size)
                    whole += size
        chunks = []
        start = 0
        for size in sizes:
            if usual is not None:
                chunks.append(usual[7 * start : 7 * (start + size)])
            else:
                each = rows[start : start + size]
                chunks.append(
                    list(chain.from_iterable((*r[:6], row_projection(r) or b"") for r in each))
                )
            start += size
        rest = rows[whole:]
        index = []
        parts = []
        offset = 1  # substr() counts from 1, in bytes on a BLOB
        for r in rest:
            body = r[5]
            size = len(body)
            projection = row_projection(r)
            extra = projection or b""
            index.append((r[0], r[1], r[2], r[3], r[4], offset, size, offset + size, len(extra)))
            parts.append(body)
            parts.append(extra)
            offset += size + len(extra)
        listed = orjson.dumps(index)
        db = self._db
        self._check_file()
        db.execute("BEGIN IMMEDIATE")
        try:
            for size, values in zip(sizes, chunks, strict=True):
                db.execute(_INSERT_VALUES[size], values)
            if not rest:
                pass
            elif _NUL not in listed:
                db.execute(_INSERT_BATCH, (listed, b"".join(parts)))
            else:
                db.executemany(  # each row's body and projection, as ``parts`` holds them
                    _INSERT_ROWS,
                    [(*r[:5], parts[2 * k], parts[2 * k + 1]) for k, r in enumerate(rest)],
                )
            # The batch's task ids and types, a column each (from the bound values when the
            # batch is the usual one: no pass over the rows in Python).
            task_ids = usual[1::7] if usual is not None else [r[1] for r in rows]
            types = usual[4::7] if usual is not None else [r[4] for r in rows]
            unknown = self._adopt_unknown_tasks(db, rows, task_ids)
            self._apply_task_events(db, rows, types)
            db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk does): a second ROLLBACK would
            # replace the real error with "no transaction is active".
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if db is self._deferred:
            bodies = usual[5::7] if usual is not None else [r[5] for r in rows]
            self._wal_pages += sum(map(len, bodies)) // _BYTES_PER_PAGE + 1
        # Committed: every task of the batch is in the table now (started, or adopted).
        if len(self._known_tasks) > KNOWN_TASKS_BOUND:
            self._known_tasks.clear()
        self._known_tasks.update(task_ids)
        return unknown

    # -- the event writer's checkpoints ----------------------------------------------------
    # SQLite checkpoints in the COMMIT that takes the WAL past 1,000 pages: copying them into
    # the database file and syncing both (10-30 ms here) before that COMMIT returns, so a
    # flush that came meanwhile waited for it (a flush after 2,000 steps took 2 ms, or 20).
    # The writer checkpoints after it has said what is durable instead, while no batch waits,
    # and a flush stops a checkpoint under way (the next one does its work again).

    def defer_checkpoints(self) -> None:
        """The calling thread's connection leaves checkpoints to ``checkpoint``: for the one
        thread that writes events (``Recorder``'s committer)."""
        db = self._db
        db.execute("PRAGMA wal_autocheckpoint=0")
        self._deferred = db

    def checkpoint_due(self, *, idle: bool) -> bool:
        """Whether the WAL has grown enough for a checkpoint: at ``CHECKPOINT_PAGES`` when
        nothing waits to be written (``idle``), past ``CHECKPOINT_CAP`` times that whatever
        waits (a writer that never idles must not grow the WAL without end)."""
        pages = self._wal_pages
        return pages >= CHECKPOINT_PAGES and (idle or pages >= _CAP_PAGES)

    def checkpoint(self) -> bool:
        """Copy the WAL into the database (PASSIVE: readers and writers go on); False when
        ``stop_checkpoint`` stopped it. Past ``CHECKPOINT_CAP`` it cannot be stopped."""
        db = self._db
        stoppable = self._wal_pages < _CAP_PAGES
        with self._checkpoint_lock:
            self._stoppable = db if stoppable else None
        try:
            row = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.OperationalError as exc:
            if "interrupt" not in str(exc):
                raise
            return False
        finally:
            with self._checkpoint_lock:
                self._stoppable = None
        # (busy, frames in the WAL, frames copied): a reader on an older snapshot keeps the
        # rest in the WAL, counted for the next checkpoint.
        _busy, frames, copied = row
        self._wal_pages = max(0, frames - copied)
        return True

    def stop_checkpoint(self) -> None:
        """Stop a checkpoint under way (from any thread): a flush is waiting."""
        with self._checkpoint_lock:
            # Under the lock: the checkpoint's connection starts nothing else meanwhile, and
            # an interrupt once it is done is a no-op (SQLite: no statement is running).
            if self._stoppable is not None:
                self._stoppable.interrupt()

    def _adopt_unknown_tasks(
        self, db: sqlite3.Connection, rows: Sequence[EventRow], task_ids: list[str]
    ) -> list[str]:
        """Events for a task nobody started are kept, under a placeholder task, and reported
        (``task_ids``: each row's)."""
        # A task once in the table stays there (nothing deletes tasks): a batch of known
        # tasks' events, the usual one, needs neither the loop below nor its SELECT; nor does
        # one whose other tasks start in it (short tasks: most batches), found with two passes
        # in C rather than one in Python over every row.
        new = set(task_ids)
        new.difference_update(self._known_tasks)
        if not new:
            return []
        new.difference_update([r[1] for r in rows if r[4] == "task_start"])
        if not new:
            return []
        first_ts: dict[str, str] = {}
        for r in rows:
            task_id, ts = r[1], r[3]
            if task_id in new and (task_id not in first_ts or ts < first_ts[task_id]):
                first_ts[task_id] = ts
        known = {
            r[0]
            for r in db.execute(
                "SELECT task_id FROM tasks WHERE task_id IN (SELECT value FROM json_each(?))",
                (_dumps(list(first_ts)),),
            )
        }
        unknown = sorted(set(first_ts) - known)
        for task_id in unknown:
            db.execute(
                "INSERT INTO tasks(task_id, task_type, started_at) VALUES (?, 'unknown', ?)",
                (task_id, first_ts[task_id]),
            )
        return unknown

    def _apply_task_events(
        self, db: sqlite3.Connection, rows: Sequence[EventRow], types: list[str]
    ) -> None:
        """Create tasks from their ``task_start`` and close them on ``task_end``: a task's last
        start and last end in the batch count, the end applied after the start (an end written
        before its start in one batch ends the task, as it would across two batches).
        ``types``: each row's; the starts and ends are found in it by ``list.index`` (C), not
        by a look at every row in Python."""
        starts: dict[str, tuple] = {}
        ends: dict[str, tuple] = {}
        for i in _indices(types, "task_start"):
            r = rows[i]
            task_id = r[1]
            fields = orjson.loads(r[5])
            starts[task_id] = _task_from_start(task_id, r[3], fields)
            # Lessons count a hit when they are injected into a task (recall only reads).
            if fields.get("injected_lesson_ids"):
                self._bump_hits(db, fields["injected_lesson_ids"])
        for i in _indices(types, "task_end"):
            r = rows[i]
            task_id = r[1]
            result = orjson.loads(r[5]).get("result") or {}
            ends[task_id] = (task_id, task_outcome(result.get("status")), _dumps(result), r[3])
        for many, one, tasks in (
            (_START_TASKS, _START_TASK, starts),
            (_END_TASKS, _END_TASK, ends),
        ):
            if tasks:
                listed = orjson.dumps(list(tasks.values()))
                if _NUL not in listed:
                    db.execute(many, (listed,))
                else:
                    db.executemany(one, tasks.values())

    def event_ids(self, task_id: str) -> set[str]:
        return {
            row[0]
            for row in self._db.execute("SELECT event_id FROM events WHERE task_id=?", (task_id,))
        }

    def event_keys(self, task_id: str) -> set[tuple[str, int]]:
        sql = "SELECT event_id, seq FROM events WHERE task_id=?"
        return {(row[0], row[1]) for row in self._db.execute(sql, (task_id,))}

    def runs_with(self, task_type: str, fragment: str, *, besides: str) -> int:
        # A scan of the task type's tool calls: run by the worker off the hot path, only for the
        # few values a one-run lesson would quote.
        row = self._db.execute(
            """SELECT count(DISTINCT e.task_id) FROM events e JOIN tasks t USING (task_id)
               WHERE t.task_type = ? AND e.type = 'action_executed' AND e.task_id != ?
                 AND (instr(e.body, ?) > 0 OR instr(e.body, ?) > 0)""",
            # followed by the next key or the object's end: "page":1 is not "page":10
            (task_type, besides, fragment + ",", fragment + "}"),
        ).fetchone()
        return int(row[0])

    def events(self, task_id: str) -> list[Event]:
        with no_gc():  # thousands of decoded bodies, all kept: see replay.no_gc
            return [
                _event_of(*row)
                for row in self._db.execute(
                    f"SELECT event_id, task_id, seq, ts, type, {_BODY} FROM events "
                    "WHERE task_id=? ORDER BY ts, seq, id",
                    (task_id,),
                )
            ]

    def stored_run(self, task_id: str) -> StoredRun:
        with no_gc():
            rows = self._db.execute(_PROJECTIONS, (task_id,)).fetchall()
            run = StoredRun.from_rows(rows, partial(self._events_by_key, task_id))
            # The row tuples freed while collection is paused: the collection its end sets off
            # would otherwise walk all of them.
            del rows
        return run

    def _events_by_key(self, task_id: str, keys: list[int]) -> dict[int, Event]:
        """The events of these row ids of one task (the bodies a replay shows)."""
        out = {}
        for key, event_id, seq, ts, etype, body in self._db.execute(
            f"SELECT id, event_id, seq, ts, type, {_BODY} FROM events "
            "WHERE id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(keys),),
        ):
            out[key] = _event_of(event_id, task_id, seq, ts, etype, body)
        return out

    def event_count(self, task_id: str | None = None) -> int:
        if task_id is None:
            return self._db.execute("SELECT count(*) FROM events").fetchone()[0]
        return self._db.execute(
            "SELECT count(*) FROM events WHERE task_id=?", (task_id,)
        ).fetchone()[0]

    # -- tasks -----------------------------------------------------------------------------
    def upsert_task(self, task: Task) -> None:
        self._db.execute(
            """INSERT INTO tasks(task_id, task_type, goal, scope, tools, intent, status, outcome,
                                 injected, started_at, ended_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(task_id) DO UPDATE SET task_type=excluded.task_type,
                 goal=excluded.goal, scope=excluded.scope, tools=excluded.tools,
                 intent=excluded.intent, status=excluded.status, outcome=excluded.outcome,
                 injected=excluded.injected, started_at=excluded.started_at,
                 ended_at=excluded.ended_at""",
            (
                task.task_id,
                task.task_type,
                task.goal,
                task.scope,
                _dumps(task.tools),
                task.intent,
                task.status,
                _dumps(task.outcome) if task.outcome is not None else None,
                _dumps(task.injected_lesson_ids),
                task.started_at or iso(utcnow()),
                task.ended_at,
            ),
        )

    _TASK_COLS = (
        "t.task_id, t.task_type, t.goal, t.scope, t.tools, t.intent, t.status, t.outcome, "
        "t.injected, t.started_at, t.ended_at, "
        "(SELECT count(*) FROM events e WHERE e.task_id = t.task_id)"
    )

    @staticmethod
    def _task_row(row: tuple) -> Task:
        return Task(
            task_id=row[0],
            task_type=row[1],
            goal=row[2],
            scope=row[3],
            tools=orjson.loads(row[4]),
            intent=row[5],
            status=row[6],
            outcome=orjson.loads(row[7]) if row[7] else None,
            injected_lesson_ids=orjson.loads(row[8]),
            started_at=row[9],
            ended_at=row[10],
            event_count=row[11],
        )

    def get_task(self, task_id: str) -> Task | None:
        row = self._db.execute(
            f"SELECT {self._TASK_COLS} FROM tasks t WHERE t.task_id=?", (task_id,)
        ).fetchone()
        return self._task_row(row) if row else None

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        listed = orjson.dumps(list(dict.fromkeys(task_ids)))
        if _NUL in listed:  # json_each would cut such an id at its NUL: one read each
            return {t: task for t in task_ids if (task := self.get_task(t)) is not None}
        return {
            row[0]: self._task_row(row)
            for row in self._db.execute(
                f"SELECT {self._TASK_COLS} FROM tasks t "
                "WHERE t.task_id IN (SELECT value FROM json_each(?))",
                (listed,),
            )
        }

    def list_tasks(
        self, *, limit: int = 50, task_type: str | None = None, status: str | None = None
    ) -> list[Task]:
        where: list[str] = []
        args: list[Any] = []
        if task_type:
            where.append("t.task_type=?")
            args.append(task_type)
        if status:
            where.append("t.status=?")
            args.append(status)
        sql = f"SELECT {self._TASK_COLS} FROM tasks t"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY t.started_at DESC, t.rowid DESC LIMIT ?"
        args.append(limit)
        return [self._task_row(r) for r in self._db.execute(sql, args)]

    def task_scores(self, task_id: str) -> TaskScores | None:
        row = self._db.execute("SELECT scores FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        return TaskScores.from_dict(orjson.loads(row[0])) if row and row[0] else None

    def save_task_scores(self, task_id: str, scores: TaskScores) -> None:
        self._db.execute(
            "UPDATE tasks SET scores=? WHERE task_id=?", (_dumps(scores.to_dict()), task_id)
        )

    # -- lessons ---------------------------------------------------------------------------
    def save_lesson(
        self, lesson: Lesson, *, embedding: bytes | None = None, embed_model: str | None = None
    ) -> None:
        body = lesson.to_dict()
        body.pop("score", None)
        with self.transaction():
            self._db.execute(
                "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key='book_version'"
            )
            # Stamped with the version this save makes (lessons_since reads by it).
            self._db.execute(
                """INSERT INTO lessons(lesson_id, task_type, status, scope, updated_at, body,
                                       embedding, embed_model, saved_version)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?,
                           (SELECT CAST(value AS INTEGER) FROM meta WHERE key='book_version'))
                   ON CONFLICT(lesson_id) DO UPDATE SET task_type=excluded.task_type,
                     status=excluded.status, scope=excluded.scope,
                     updated_at=excluded.updated_at, body=excluded.body,
                     embedding=coalesce(excluded.embedding, lessons.embedding),
                     embed_model=coalesce(excluded.embed_model, lessons.embed_model),
                     saved_version=excluded.saved_version""",
                (
                    lesson.lesson_id,
                    lesson.task_type,
                    lesson.status,
                    lesson.scope,
                    lesson.updated_at or iso(utcnow()),
                    _dumps(body),
                    embedding,
                    embed_model,
                ),
            )

    def lessons_since(self, version: int) -> tuple[int, list[Lesson]]:
        """The book's version and the lessons saved after ``version``.

        The version is read with the lessons, in one statement (one snapshot); when none
        changed, the version read before them is returned, so a save landing in between is
        never skipped: it is read again next time, not lost.
        """
        before = self.book_version()
        rows = self._db.execute(
            """SELECT (SELECT CAST(value AS INTEGER) FROM meta WHERE key='book_version'), body
               FROM lessons WHERE saved_version > ? ORDER BY rowid""",
            (version,),
        ).fetchall()
        if not rows:
            return before, []
        return int(rows[0][0]), [Lesson.from_dict(orjson.loads(r[1])) for r in rows]

    def get_lesson(self, lesson_id: str) -> Lesson | None:
        row = self._db.execute(
            "SELECT body FROM lessons WHERE lesson_id=?", (lesson_id,)
        ).fetchone()
        return Lesson.from_dict(orjson.loads(row[0])) if row else None

    def list_lessons(
        self, *, status: str | None = None, task_type: str | None = None
    ) -> list[Lesson]:
        where, args = [], []
        if status:
            where.append("status=?")
            args.append(status)
        if task_type:
            where.append("task_type=?")
            args.append(task_type)
        sql = "SELECT body FROM lessons"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY rowid"
        return [Lesson.from_dict(orjson.loads(r[0])) for r in self._db.execute(sql, args)]

    def lesson_embeddings(self) -> dict[str, tuple[str, bytes]]:
        return {
            r[0]: (r[1], r[2])
            for r in self._db.execute(
                "SELECT lesson_id, embed_model, embedding FROM lessons WHERE embedding IS NOT NULL"
            )
        }

    def bump_hits(self, lesson_ids: Sequence[str]) -> None:
        self._bump_hits(self._db, lesson_ids)

    @staticmethod
    def _bump_hits(db: sqlite3.Connection, lesson_ids: Sequence[str]) -> None:
        # Hit counts do not change the book's version: recall does not rank on them, and a
        # recall must not invalidate the index it was served from.
        if not lesson_ids:
            return
        db.execute(
            """UPDATE lessons SET body = json_set(body, '$.hit_count',
                   coalesce(json_extract(body, '$.hit_count'), 0) + 1)
               WHERE lesson_id IN (SELECT value FROM json_each(?))""",
            (_dumps([str(x) for x in lesson_ids]),),
        )

    def book_version(self) -> int:
        return int(
            self._db.execute("SELECT value FROM meta WHERE key='book_version'").fetchone()[0]
        )

    # -- reflections and jobs --------------------------------------------------------------
    def save_reflection(self, reflection: Reflection) -> None:
        self._db.execute(
            """INSERT INTO reflections(reflection_id, task_id, status, created_at, body)
               VALUES (?, ?, ?, ?, ?)
               ON CONFLICT(reflection_id) DO UPDATE SET status=excluded.status,
                 body=excluded.body""",
            (
                reflection.reflection_id,
                reflection.task_id,
                reflection.status,
                reflection.created_at or iso(utcnow()),
                _dumps(reflection.to_dict()),
            ),
        )

    def reflections(self, task_id: str | None = None, *, limit: int = 100) -> list[Reflection]:
        if task_id:
            rows = self._db.execute(
                "SELECT body FROM reflections WHERE task_id=? ORDER BY created_at, rowid LIMIT ?",
                (task_id, limit),
            )
        else:
            rows = self._db.execute(
                "SELECT body FROM reflections ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (limit,),
            )
        return [Reflection.from_dict(orjson.loads(body)) for (body,) in rows]

    def enqueue_job(
        self,
        task_id: str,
        *,
        kind: str = "full",
        trigger: str = "task_end",
        window: list[int] | None = None,
        use_llm: bool = True,
    ) -> int:
        row = job_row(self.owner, task_id, kind, trigger, window, use_llm, now=iso(utcnow()))
        cur = self._db.execute(_ENQUEUE, row)
        return int(cur.lastrowid or 0)

    def enqueue_jobs(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        if not jobs:
            return
        now = iso(utcnow())
        rows = [job_row(self.owner, now=now, **job) for job in jobs]
        listed = orjson.dumps(rows)
        if _NUL in listed:  # ``->>`` would cut a text at its NUL: a row at a time
            with self.transaction():
                self._db.executemany(_ENQUEUE, rows)
            return
        # One statement rather than BEGIN, the inserts and COMMIT: the event writer's committer
        # queues a batch's reviews, and waits for the GIL after each statement.
        self._db.execute(_ENQUEUE_ALL, (listed,))

    def claim_job(self, *, lease: float = JOB_LEASE) -> Job | None:
        # A job still 'running' past its lease belongs to a process that died mid-review: take
        # it back. One that has been claimed MAX_ATTEMPTS times is given up as failed instead.
        now = time.time()
        db = self._db
        with self.transaction():
            db.execute(
                """UPDATE jobs SET status='failed', error='given up after repeated crashes',
                       finished_at=? WHERE status='running' AND claimed_at < ? AND attempts >= ?""",
                (iso(utcnow()), now - lease, MAX_ATTEMPTS),
            )
            row = db.execute(
                """UPDATE jobs SET status='running', attempts=attempts+1, claimed_at=?,
                       claimed_by=?
                   WHERE job_id = (SELECT job_id FROM jobs
                                   WHERE status='pending'
                                      OR (status='running' AND claimed_at < ?)
                                   ORDER BY job_id LIMIT 1)
                   RETURNING job_id, task_id, kind, trigger, window, attempts, use_llm""",
                (now, self.owner, now - lease),
            ).fetchone()
        if row is None:
            return None
        return Job(
            job_id=row[0],
            task_id=row[1],
            kind=row[2],
            trigger=row[3],
            window=orjson.loads(row[4]) if row[4] else None,
            attempts=row[5],
            use_llm=bool(row[6]),
        )

    def finish_job(self, job_id: int, *, status: str, error: str | None = None) -> None:
        self._db.execute(
            "UPDATE jobs SET status=?, error=?, finished_at=? WHERE job_id=?",
            (status, error, iso(utcnow()), job_id),
        )

    def has_pending_job(self, task_id: str, *, kind: str) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM jobs WHERE task_id=? AND kind=? AND status='pending' LIMIT 1",
                (task_id, kind),
            ).fetchone()
            is not None
        )

    def queued_job_kinds(self, task_id: str, *, trigger: str, since: str | None = None) -> set[str]:
        sql = "SELECT DISTINCT kind FROM jobs WHERE task_id=? AND trigger=?"
        args: tuple[str, ...] = (task_id, trigger)
        if since is not None:
            sql += " AND created_at >= ?"
            args += (since,)
        return {row[0] for row in self._db.execute(sql, args)}

    def pending_jobs(self, *, mine: bool = False) -> int:
        """Jobs waiting or running; with ``mine``, only those this store object queued or is
        running (another process's jobs, or one left behind when it died, are not ours to wait
        for)."""
        if mine:
            sql = (
                "SELECT count(*) FROM jobs WHERE (status='pending' AND queued_by=?) "
                "OR (status='running' AND (claimed_by=? OR (queued_by=? AND claimed_at>?)))"
            )
            fresh = time.time() - JOB_LEASE
            args = (self.owner, self.owner, self.owner, fresh)
            return self._db.execute(sql, args).fetchone()[0]
        return self._db.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')"
        ).fetchone()[0]

    def jobs(self, *, limit: int = 100) -> list[dict[str, Any]]:
        cols = ("job_id", "task_id", "kind", "trigger", "status", "attempts", "error", "created_at")
        rows = self._db.execute(
            f"SELECT {', '.join(cols)} FROM jobs ORDER BY job_id DESC LIMIT ?", (limit,)
        )
        return [dict(zip(cols, r, strict=True)) for r in rows]

    # -- misc ------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        from hindsight_loop.store.migrations import applied

        return {
            "url": self.url,
            "migrations": applied(self._db),
            "book_version": self.book_version(),
            "events": self.event_count(),
        }


def _applied(db: sqlite3.Connection) -> set[str]:
    """The migrations a store has, read without creating anything."""
    return {row[0] for row in db.execute("SELECT name FROM _migrations")}
