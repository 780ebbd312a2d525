"""The shared store: one PostgreSQL database for many agent processes on many hosts.

Same ``Store`` protocol and the same numbered migrations as SQLite. Three things differ because
many processes write at once:

- the recorder's batches go in with ``COPY`` (one round trip for the events of a batch);
- jobs are claimed with ``FOR UPDATE SKIP LOCKED``, so any number of workers share the queue, and
  leases are timed by the database server's clock, not each host's;
- ``transaction()`` takes a transaction-scoped advisory lock on the lesson book: what SQLite's
  ``BEGIN IMMEDIATE`` gives for free. Curation reads the book, decides and writes inside it, so two
  workers learning the same lesson at the same moment merge it (support 2), never add it twice.

psycopg is imported here only: ``import hindsight_loop`` works without the ``[postgres]`` extra.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import orjson

from hindsight_loop.lesson_keys import RuleFilter, ScoreBound, recall_keys
from hindsight_loop.models import Event, Lesson, Reflection, Task, TaskScores, iso, utcnow
from hindsight_loop.replay import StoredRun, no_gc
from hindsight_loop.store import EventRow, Job, JobOwner, ThreadConnections
from hindsight_loop.store.pg_migrations import (
    MIGRATIONS,
    applied,
    check_schema,
    has_vec_column,
    migrate,
)
from hindsight_loop.store.sqlite import (
    JOB_LEASE,
    MAX_ATTEMPTS,
    _dumps,
    _event_of,
    _task_from_start,
    job_row,
    row_projection,
)

_ENQUEUE = """INSERT INTO jobs(task_id, kind, trigger, "window", use_llm, created_at, queued_by)
              VALUES (%s, %s, %s, %s, %s, %s, %s)"""

try:
    import psycopg
    from psycopg import pq
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "the PostgreSQL store needs psycopg: pip install 'hindsight-loop[postgres]'"
    ) from exc

#: Key of the advisory lock that serializes writes to the lesson book (curation, outcomes,
#: expiry): any constant no other code uses.
BOOK_LOCK = 0x48534C42  # "HSLB"

# Server clock in epoch seconds: leases compare claims from many hosts against one clock.
_NOW = "extract(epoch from clock_timestamp())"


def _redact_url(url: str) -> str:
    """The URL without its password, for messages and ``meta()``."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url.split("@")[-1]
    user = info.get("user") or ""
    host = info.get("host") or ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{'@' if user else ''}{host}{port}/{info.get('dbname') or ''}"


def lesson_key_values(lesson: Lesson) -> tuple[tuple[Any, ...], list[str]]:
    """The recall columns of m006 for a lesson (in their UPDATE order), and its BM25 terms."""
    k = recall_keys(lesson)
    values = (
        k.task_key,
        k.scope_key,
        k.intent_key,
        k.step_key,
        k.error_key,
        k.valid_epoch,
        k.tools,
        k.tokens,
        k.value,
    )
    return values, k.tokens


def term_counts(db: Any, delta: dict[str, int]) -> None:
    """Add ``delta`` to the book's document frequencies (a term at 0 stays, unseen by BM25)."""
    db.execute(
        """INSERT INTO lesson_terms(term, df) SELECT * FROM unnest(%s::text[], %s::int[])
           ON CONFLICT (term) DO UPDATE SET df = lesson_terms.df + excluded.df""",
        (list(delta), list(delta.values())),
    )


def ensure_hnsw(db: Any, dim: int) -> None:
    """The HNSW index over the vectors of one dimension (inner product: recall's cosine of
    unit vectors). The dimension is written into the statement, not bound: the planner
    matches a partial index's predicate only against a constant."""
    dim = int(dim)
    # The graph is built in memory when it fits; spilling to disk is many times slower.
    db.execute("SET LOCAL maintenance_work_mem = '256MB'")
    db.execute(
        f"""CREATE INDEX IF NOT EXISTS lessons_hnsw_{dim} ON lessons
            USING hnsw ((vec::vector({dim})) vector_ip_ops) WHERE vector_dims(vec) = {dim}"""
    )


def _f8(x: float) -> str:
    """A float constant for generated SQL: typed, or PostgreSQL computes it as ``numeric``."""
    return f"{float(x)!r}::float8"


#: Query terms whose BM25 bound is tested one by one (see ``recall_bounded``).
_BOUND_TERMS = 5

#: Columns the candidate stage reads per lesson (``recall.StoreStage`` unpacks them in order).
RECALL_COLUMNS = (
    "id, lesson_id, task_key, tools, step_key, error_key, value, tokens, embedding, embed_model, "
    "intent_key"
)


class PostgresStore(JobOwner, ThreadConnections):
    """A ``Store`` on a PostgreSQL database (``postgresql://user@host/db``)."""

    def __init__(self, url: str, *, readonly: bool = False) -> None:
        self.dsn = url
        self.url = _redact_url(url)
        self.readonly = readonly
        self._init_connections()
        self._closed = False
        JobOwner.__init__(self)
        try:
            self._open()
        except BaseException:
            self.close()  # a refused database leaves no connection behind
            raise

    def _open(self) -> None:
        db = self._db
        check_schema(db, self.url)
        if self.readonly:
            missing = [name for name, _ in MIGRATIONS if name not in applied(db)]
            if missing:
                raise ValueError(
                    f"{self.url!r} has no Hindsight store or an older one (missing "
                    f"{missing[0]!r}); open it once with a write command to create or upgrade it"
                )
        else:
            migrate(db)
        #: Whether pgvector is there: without it recall loads the book into memory.
        self.has_vectors = has_vec_column(db)
        self._hnsw_dims: set[int] | None = None

    # -- connections -----------------------------------------------------------------------
    @property
    def _db(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is None or db.closed:
            if self._closed:
                raise RuntimeError(f"store {self.url!r} is closed")
            # Autocommit: a statement outside transaction() is its own transaction, as with
            # SQLite in autocommit mode; transaction() opens an explicit one.
            kwargs: dict[str, Any] = {"autocommit": True}
            if self.readonly:
                kwargs["options"] = "-c default_transaction_read_only=on"
            try:
                db = psycopg.connect(self.dsn, **kwargs)
            except psycopg.OperationalError as exc:
                raise ConnectionError(
                    f"cannot connect to {self.url!r}: {str(exc).strip()}; check --db / HINDSIGHT_DB"
                ) from None
            self._local.db = db
            self._keep(db)
        return db

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), {}
        for db in conns:
            with contextlib.suppress(Exception):
                db.close()
        self._local = threading.local()

    def _in_transaction(self, db: Any) -> bool:
        return db.info.transaction_status != pq.TransactionStatus.IDLE

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction for this thread, holding the book's advisory lock (released at
        commit or rollback); writes inside it join it."""
        db = self._db
        if self._in_transaction(db):
            yield
            return
        self._local.next_version = None
        self._local.term_delta = {}
        self._local.new_dims = set()
        try:
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (BOOK_LOCK,))
                yield
                # The book's version moves once per transaction, not once per saved lesson:
                # each UPDATE of one row in a transaction adds a row version that the next
                # must walk past, so re-embedding a large book would slow quadratically. Every
                # lesson saved in it is stamped with the version it commits (``_next_version``).
                if self._local.next_version is not None:
                    db.execute(
                        "UPDATE meta SET value = %s WHERE key='book_version'",
                        (str(self._local.next_version),),
                    )
                # The document frequencies likewise: summed over the transaction's saves and
                # written once (a common term would otherwise be updated once per lesson).
                delta = {t: d for t, d in self._local.term_delta.items() if d}
                if delta:
                    term_counts(db, delta)
                for dim in sorted(self._local.new_dims):
                    ensure_hnsw(db, dim)
                    if self._hnsw_dims is not None:
                        self._hnsw_dims.add(dim)
        finally:
            self._local.new_dims = set()
            self._local.next_version = None
            self._local.term_delta = {}

    def _next_version(self, db: Any) -> int:
        """The version this transaction will commit the book at (read under the book's lock,
        so no other writer can take it)."""
        if self._local.next_version is None:
            self._local.next_version = self.book_version() + 1
        return int(self._local.next_version)

    @contextlib.contextmanager
    def _unit(self) -> Iterator[Any]:
        """A transaction without the book's lock (event batches, job claims), or the caller's."""
        db = self._db
        if self._in_transaction(db):
            yield db
            return
        with db.transaction():
            yield db

    # -- events ----------------------------------------------------------------------------
    def write_event_batch(self, rows: Sequence[EventRow]) -> list[str]:
        if not rows:
            return []
        with self._unit() as db:
            # COPY: one round trip for the batch's events, however many, each with its replay
            # projection beside the body.
            with db.cursor().copy(
                "COPY events(event_id, task_id, seq, ts, type, body, projection) FROM STDIN"
            ) as copy:
                for r in rows:
                    projection = row_projection(r)
                    copy.write_row(
                        (
                            r[0],
                            r[1],
                            r[2],
                            r[3],
                            r[4],
                            r[5].decode(),
                            projection and projection.decode(),
                        )
                    )
            unknown = self._adopt_unknown_tasks(db, rows)
            self._apply_task_events(db, rows)
        return unknown

    def _adopt_unknown_tasks(self, db: Any, rows: Sequence[EventRow]) -> list[str]:
        """Events for a task nobody started are kept, under a placeholder task, and reported."""
        first_ts: dict[str, str] = {}
        started = set()
        for _eid, task_id, _seq, ts, etype, *_ in rows:
            if etype == "task_start":
                started.add(task_id)
            elif task_id not in first_ts or ts < first_ts[task_id]:
                first_ts[task_id] = ts
        for task_id in started:
            first_ts.pop(task_id, None)
        if not first_ts:
            return []
        # ON CONFLICT DO NOTHING: another host's writer may create the task meanwhile; only
        # the placeholders this batch made are reported.
        made = db.execute(
            """INSERT INTO tasks(task_id, task_type, started_at)
               SELECT t, 'unknown', s FROM unnest(%s::text[], %s::text[]) AS u(t, s)
               ON CONFLICT (task_id) DO NOTHING RETURNING task_id""",
            (list(first_ts), list(first_ts.values())),
        ).fetchall()
        return sorted(r[0] for r in made)

    def _apply_task_events(self, db: Any, rows: Sequence[EventRow]) -> None:
        """Create tasks from their ``task_start`` and close them on ``task_end``."""
        for _event_id, task_id, _seq, ts, etype, body, *_ in rows:
            if etype == "task_start":
                fields = orjson.loads(body)
                db.execute(
                    """INSERT INTO tasks(task_id, task_type, goal, scope, tools, intent, injected,
                                         started_at)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                       ON CONFLICT(task_id) DO UPDATE SET task_type=excluded.task_type,
                         goal=excluded.goal, scope=excluded.scope, tools=excluded.tools,
                         intent=excluded.intent, injected=excluded.injected,
                         started_at=excluded.started_at""",
                    _task_from_start(task_id, ts, fields),
                )
                if fields.get("injected_lesson_ids"):
                    self._bump_hits(db, fields["injected_lesson_ids"])
            elif etype == "task_end":
                from hindsight_loop.models import task_outcome

                result = orjson.loads(body).get("result") or {}
                db.execute(
                    "UPDATE tasks SET status=%s, outcome=%s, ended_at=%s WHERE task_id=%s",
                    (task_outcome(result.get("status")), _dumps(result), ts, task_id),
                )

    def event_ids(self, task_id: str) -> set[str]:
        return {
            r[0]
            for r in self._db.execute("SELECT event_id FROM events WHERE task_id=%s", (task_id,))
        }

    def event_keys(self, task_id: str) -> set[tuple[str, int]]:
        sql = "SELECT event_id, seq FROM events WHERE task_id=%s"
        return {(row[0], row[1]) for row in self._db.execute(sql, (task_id,))}

    def runs_with(self, task_type: str, fragment: str, *, besides: str) -> int:
        row = self._db.execute(
            """SELECT count(DISTINCT e.task_id) FROM events e JOIN tasks t USING (task_id)
               WHERE t.task_type = %s AND e.type = 'action_executed' AND e.task_id != %s
                 AND (strpos(e.body, %s) > 0 OR strpos(e.body, %s) > 0)""",
            # followed by the next key or the object's end: "page":1 is not "page":10
            (task_type, besides, fragment + ",", fragment + "}"),
        ).fetchone()
        return int(row[0])

    def events(self, task_id: str) -> list[Event]:
        with no_gc():  # thousands of decoded bodies, all kept: see replay.no_gc
            return [
                _event_of(*row)
                for row in self._db.execute(
                    "SELECT event_id, task_id, seq, ts, type, body FROM events "
                    "WHERE task_id=%s ORDER BY ts, seq, id",
                    (task_id,),
                )
            ]

    def stored_run(self, task_id: str) -> StoredRun:
        # The same order as events().
        with no_gc():
            rows = self._db.execute(
                "SELECT id, type, projection FROM events WHERE task_id=%s ORDER BY ts, seq, id",
                (task_id,),
            ).fetchall()
            run = StoredRun.from_rows(rows, partial(self._events_by_key, task_id))
            del rows  # freed while collection is paused: see SQLiteStore.stored_run
        return run

    def _events_by_key(self, task_id: str, keys: list[int]) -> dict[int, Event]:
        """The events of these row ids of one task (the bodies a replay shows)."""
        out = {}
        for key, event_id, seq, ts, etype, body in self._db.execute(
            "SELECT id, event_id, seq, ts, type, body FROM events WHERE id = ANY(%s)", (keys,)
        ):
            out[key] = _event_of(event_id, task_id, seq, ts, etype, body)
        return out

    def event_count(self, task_id: str | None = None) -> int:
        if task_id is None:
            return self._db.execute("SELECT count(*) FROM events").fetchone()[0]
        return self._db.execute(
            "SELECT count(*) FROM events WHERE task_id=%s", (task_id,)
        ).fetchone()[0]

    # -- tasks -----------------------------------------------------------------------------
    def upsert_task(self, task: Task) -> None:
        self._db.execute(
            """INSERT INTO tasks(task_id, task_type, goal, scope, tools, intent, status, outcome,
                                 injected, started_at, ended_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
            f"SELECT {self._TASK_COLS} FROM tasks t WHERE t.task_id=%s", (task_id,)
        ).fetchone()
        return self._task_row(row) if row else None

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        return {
            row[0]: self._task_row(row)
            for row in self._db.execute(
                f"SELECT {self._TASK_COLS} FROM tasks t WHERE t.task_id = ANY(%s)",
                (list(dict.fromkeys(task_ids)),),
            )
        }

    def list_tasks(
        self, *, limit: int = 50, task_type: str | None = None, status: str | None = None
    ) -> list[Task]:
        where: list[str] = []
        args: list[Any] = []
        if task_type:
            where.append("t.task_type=%s")
            args.append(task_type)
        if status:
            where.append("t.status=%s")
            args.append(status)
        sql = f"SELECT {self._TASK_COLS} FROM tasks t"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY t.started_at DESC, t.id DESC LIMIT %s"
        args.append(limit)
        return [self._task_row(r) for r in self._db.execute(sql, args)]

    def task_scores(self, task_id: str) -> TaskScores | None:
        row = self._db.execute("SELECT scores FROM tasks WHERE task_id=%s", (task_id,)).fetchone()
        return TaskScores.from_dict(orjson.loads(row[0])) if row and row[0] else None

    def save_task_scores(self, task_id: str, scores: TaskScores) -> None:
        self._db.execute(
            "UPDATE tasks SET scores=%s WHERE task_id=%s", (_dumps(scores.to_dict()), task_id)
        )

    # -- lessons ---------------------------------------------------------------------------
    def save_lesson(
        self, lesson: Lesson, *, embedding: bytes | None = None, embed_model: str | None = None
    ) -> None:
        body = lesson.to_dict()
        body.pop("score", None)
        values, tokens = lesson_key_values(lesson)
        vec = None
        dim = 0
        if embedding is not None and self.has_vectors and len(embedding) % 4 == 0 and embedding:
            # pgvector's text form: psycopg's list dumping costs more than the rest of a save.
            values32 = np.frombuffer(embedding, np.float32)
            vec, dim = "[" + ",".join(map(str, values32.tolist())) + "]", values32.size
        with self.transaction():
            db = self._db
            stamp = self._next_version(db)
            # The terms it held before, read in the same statement: the book's document
            # frequencies move by the difference.
            row = db.execute(
                """WITH old AS (SELECT tokens FROM lessons WHERE lesson_id = %s),
                   up AS (
                   INSERT INTO lessons(lesson_id, task_type, status, scope, updated_at, body,
                                       embedding, embed_model, task_key, scope_key, intent_key,
                                       step_key, error_key, valid_epoch, tools, tokens, value,
                                       saved_version{vec_col})
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                           %s{vec_val})
                   ON CONFLICT(lesson_id) DO UPDATE SET task_type=excluded.task_type,
                     status=excluded.status, scope=excluded.scope,
                     updated_at=excluded.updated_at, body=excluded.body,
                     embedding=coalesce(excluded.embedding, lessons.embedding),
                     embed_model=coalesce(excluded.embed_model, lessons.embed_model),
                     task_key=excluded.task_key, scope_key=excluded.scope_key,
                     intent_key=excluded.intent_key, step_key=excluded.step_key,
                     error_key=excluded.error_key, valid_epoch=excluded.valid_epoch,
                     tools=excluded.tools, tokens=excluded.tokens, value=excluded.value,
                     saved_version=excluded.saved_version{vec_set}
                   RETURNING 1)
                   SELECT (SELECT tokens FROM old), (SELECT count(*) FROM up)""".format(
                    vec_col=", vec" if self.has_vectors else "",
                    vec_val=", %s::vector" if self.has_vectors else "",
                    vec_set=", vec=coalesce(excluded.vec, lessons.vec)" if self.has_vectors else "",
                ),
                (
                    lesson.lesson_id,
                    lesson.lesson_id,
                    lesson.task_type,
                    lesson.status,
                    lesson.scope,
                    lesson.updated_at or iso(utcnow()),
                    _dumps(body),
                    embedding,
                    embed_model,
                    *values,
                    stamp,
                    *([vec] if self.has_vectors else []),
                ),
            ).fetchone()
            delta = self._local.term_delta
            for term in set(tokens):
                delta[term] = delta.get(term, 0) + 1
            for term in set(row[0] or ()):
                delta[term] = delta.get(term, 0) - 1
            if vec is not None:
                if self._hnsw_dims is None:
                    self._hnsw_dims = self._indexed_dims(db)
                if dim not in self._hnsw_dims:
                    # Made at commit, after the transaction's rows: an index built over many
                    # rows at once is far cheaper than one grown a row at a time.
                    self._local.new_dims.add(dim)

    def get_lesson(self, lesson_id: str) -> Lesson | None:
        row = self._db.execute(
            "SELECT body FROM lessons WHERE lesson_id=%s", (lesson_id,)
        ).fetchone()
        return Lesson.from_dict(orjson.loads(row[0])) if row else None

    def list_lessons(
        self, *, status: str | None = None, task_type: str | None = None
    ) -> list[Lesson]:
        where, args = [], []
        if status:
            where.append("status=%s")
            args.append(status)
        if task_type:
            where.append("task_type=%s")
            args.append(task_type)
        sql = "SELECT body FROM lessons"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id"
        return [Lesson.from_dict(orjson.loads(r[0])) for r in self._db.execute(sql, args)]

    def lesson_embeddings(self) -> dict[str, tuple[str, bytes]]:
        return {
            r[0]: (r[1], bytes(r[2]))
            for r in self._db.execute(
                "SELECT lesson_id, embed_model, embedding FROM lessons WHERE embedding IS NOT NULL"
            )
        }

    def lessons_since(self, version: int) -> tuple[int, list[Lesson]]:
        """The book's version and the lessons saved after ``version`` (see SQLiteStore's)."""
        before = self.book_version()
        rows = self._db.execute(
            """SELECT (SELECT value FROM meta WHERE key='book_version'), body FROM lessons
               WHERE saved_version > %s ORDER BY id""",
            (version,),
        ).fetchall()
        if not rows:
            return before, []
        return int(rows[0][0]), [Lesson.from_dict(orjson.loads(r[1])) for r in rows]

    # -- recall's store-side candidate stage (recall.StoreStage) ---------------------------
    @staticmethod
    def _indexed_dims(db: Any) -> set[int]:
        names = db.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename='lessons' "
            "AND indexname LIKE 'lessons_hnsw_%%'"
        ).fetchall()
        return {int(n[0].rsplit("_", 1)[1]) for n in names}

    def recall_stats(self) -> tuple[int, int, int]:
        """Lessons in the book, their BM25 terms in all, and the smallest document frequency
        of a term (BM25's corpus statistics, whatever the lessons' status)."""
        n, total = self._db.execute(
            "SELECT count(*), coalesce(sum(cardinality(tokens)), 0) FROM lessons"
        ).fetchone()
        min_df = self._db.execute("SELECT min(df) FROM lesson_terms WHERE df > 0").fetchone()[0]
        return int(n), int(total), int(min_df or 0)

    def term_frequencies(self, terms: Sequence[str]) -> dict[str, int]:
        """Document frequency of each of ``terms`` that some lesson holds."""
        return {
            t: int(df)
            for t, df in self._db.execute(
                "SELECT term, df FROM lesson_terms WHERE term = ANY(%s) AND df > 0", (list(terms),)
            )
        }

    @staticmethod
    def _rule_sql(rules: RuleFilter) -> tuple[str, list[Any]]:
        where = ["status = 'active'", "valid_epoch > %s", "scope_key = ANY(%s)"]
        args: list[Any] = [rules.now, ["global", *rules.scope_keys]]
        if rules.task_key is not None:
            where.append("task_key IN (%s, '')")
            args.append(rules.task_key)
        if rules.intent_key is not None:
            where.append("intent_key IN (%s, '')")
            args.append(rules.intent_key)
        if rules.tools is not None:
            where.append("(cardinality(tools) = 0 OR tools && %s::text[])")
            args.append(rules.tools)
        return " AND ".join(where), args

    def recall_counts(self) -> dict[str, int]:
        """Active lessons per task type key: how many rows the rule stage's index yields."""
        return {
            k: int(n)
            for k, n in self._db.execute(
                "SELECT task_key, count(*) FROM lessons WHERE status='active' GROUP BY task_key"
            )
        }

    def recall_nearest(
        self, rules: RuleFilter, vector: Sequence[float], model: str, k: int, *, hnsw: bool
    ) -> list[tuple[Any, ...]]:
        """The ``k`` lessons passing ``rules`` whose ``model`` vectors are nearest ``vector``.

        ``hnsw``: through the HNSW index with an iterative scan (the filters do not starve
        it), for rule stages that keep many lessons; else exactly, over the rows the rule
        index yields (the distance is written so that it does not match the HNSW index's
        expression), which is cheaper when they are few: an index scan must pass over about
        ``k`` / (the share of lessons that pass) graph nodes.
        """
        dim = len(vector)
        where, args = self._rule_sql(rules)
        distance = (
            f"vec::vector({dim}) <#> %s::float4[]::vector({dim})"
            if hnsw
            else "vec <#> %s::float4[]::vector"
        )
        sql = f"""SELECT {RECALL_COLUMNS} FROM lessons
                  WHERE {where} AND embed_model = %s AND vector_dims(vec) = {dim}
                  ORDER BY {distance} LIMIT %s"""
        if not hnsw:
            return self._db.execute(sql, [*args, model, list(vector), k]).fetchall()
        with self._unit() as db:
            db.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            db.execute(f"SET LOCAL hnsw.ef_search = {max(40, int(k))}")
            return db.execute(sql, [*args, model, list(vector), k]).fetchall()

    def recall_bounded(
        self, rules: RuleFilter, bound: ScoreBound, *, top: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The lessons passing ``rules`` whose score bound reaches ``bound.at_least`` (every
        other lesson provably scores below it), each row ending with its bound; with ``top``,
        only the ``top`` highest bounds, highest first."""
        where, args = self._rule_sql(rules)
        b = bound
        # The query's values come in once, as one row joined to every lesson (a parameter
        # cast in the expression itself would be cast again for every row).
        terms = sorted(b.term_weights, key=lambda t: -b.term_weights[t])
        query = "(SELECT %s::float4[]::vector AS qv, %s::text[] AS qt, %s::text AS model, "
        query += "%s::text AS step, %s::text AS err) AS q"
        q_args = [b.vector or [0.0], terms, b.model, b.step_key, b.error_key]
        specific = "(task_key <> '')::int::float8" if b.specific_counts else "1::float8"
        scenario = f"0.5 * {specific} + 0.5 * {_f8(b.tool_fit_max)}"
        relevance = f"(({scenario})"
        if b.vector is not None:
            relevance = f"({_f8(b.scenario_weight)} * ({scenario})"
            dim = len(b.vector)
            cos = "greatest(-(vec <#> q.qv), 0)"
            if b.cos_floor is not None:
                f = float(b.cos_floor)
                cos = f"greatest({cos} - {_f8(f)}, 0) / {_f8(1.0 - f)}"
            cos = (
                f"CASE WHEN embed_model = q.model AND vector_dims(vec) = {dim} THEN {cos} "
                "ELSE 1::float8 END"
            )
            # BM25 is bounded by the query terms a lesson holds, each adding at most its
            # weight: the heaviest few one by one, the rest as one group (any of them present
            # counts them all) - a looser bound, one array test instead of one per term.
            bm = ["0::float8"]
            for i, term in enumerate(terms[:_BOUND_TERMS], start=1):
                bm.append(f"{_f8(b.term_weights[term])} * (tokens && q.qt[{i}:{i}])::int")
            rest = sum(b.term_weights[t] for t in terms[_BOUND_TERMS:])
            if rest:
                bm.append(f"{_f8(rest)} * (tokens && q.qt[{_BOUND_TERMS + 1}:])::int")
            total = float(b.vector_weight + b.bm25_weight)
            relevance += (
                f" + {_f8(1.0 - b.scenario_weight)} * ({_f8(b.vector_weight)} * ({cos})"
                f" + {_f8(b.bm25_weight)} * least(1, {' + '.join(bm)})) / {_f8(total)}"
            )
        relevance += ")"
        if b.step_key:
            relevance += f" + {_f8(b.step_boost)} * (step_key = q.step)::int"
        if b.error_key:
            relevance += f" + {_f8(b.error_boost)} * (error_key = q.err)::int"
        score = f"({relevance}) * ({_f8(b.value_floor)} + {_f8(b.value_span)} * value)"
        sql = f"""SELECT * FROM (SELECT {RECALL_COLUMNS}, {score} AS bound
                      FROM lessons, {query} WHERE {where}) AS c
                  WHERE bound >= %s"""
        if top is None:
            return self._db.execute(sql, [*q_args, *args, b.at_least]).fetchall()
        return self._db.execute(
            sql + " ORDER BY bound DESC LIMIT %s", [*q_args, *args, b.at_least, top]
        ).fetchall()

    def lesson_bodies(self, lesson_ids: Sequence[str]) -> dict[str, Lesson]:
        return {
            r[0]: Lesson.from_dict(orjson.loads(r[1]))
            for r in self._db.execute(
                "SELECT lesson_id, body FROM lessons WHERE lesson_id = ANY(%s)", (list(lesson_ids),)
            )
        }

    def bump_hits(self, lesson_ids: Sequence[str]) -> None:
        self._bump_hits(self._db, lesson_ids)

    @staticmethod
    def _bump_hits(db: Any, lesson_ids: Sequence[str]) -> None:
        # Hit counts do not change the book's version: recall does not rank on them, and a
        # recall must not invalidate the index it was served from.
        if not lesson_ids:
            return
        db.execute(
            """UPDATE lessons SET body = jsonb_set(body::jsonb, '{hit_count}',
                   to_jsonb(coalesce((body::jsonb->>'hit_count')::bigint, 0) + 1))::text
               WHERE lesson_id = ANY(%s)""",
            ([str(x) for x in lesson_ids],),
        )

    def book_version(self) -> int:
        return int(
            self._db.execute("SELECT value FROM meta WHERE key='book_version'").fetchone()[0]
        )

    # -- reflections and jobs --------------------------------------------------------------
    def save_reflection(self, reflection: Reflection) -> None:
        self._db.execute(
            """INSERT INTO reflections(reflection_id, task_id, status, created_at, body)
               VALUES (%s, %s, %s, %s, %s)
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
                "SELECT body FROM reflections WHERE task_id=%s ORDER BY created_at, id LIMIT %s",
                (task_id, limit),
            )
        else:
            rows = self._db.execute(
                "SELECT body FROM reflections ORDER BY created_at DESC, id DESC LIMIT %s",
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
        values = job_row(self.owner, task_id, kind, trigger, window, use_llm, now=iso(utcnow()))
        row = self._db.execute(_ENQUEUE + " RETURNING job_id", values).fetchone()
        return int(row[0])

    def enqueue_jobs(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        if not jobs:
            return
        now = iso(utcnow())
        with self._unit() as db:  # not the book's lock: no lesson is written
            db.cursor().executemany(_ENQUEUE, [job_row(self.owner, now=now, **job) for job in jobs])

    def claim_job(self, *, lease: float = JOB_LEASE) -> Job | None:
        # A job still 'running' past its lease belongs to a process that died mid-review: take
        # it back. One that has been claimed MAX_ATTEMPTS times is given up as failed instead.
        # SKIP LOCKED: a job another worker is claiming right now is passed over, not waited
        # for, so any number of workers drain the queue without taking a job twice.
        with self._unit() as db:
            db.execute(
                f"""UPDATE jobs SET status='failed', error='given up after repeated crashes',
                       finished_at=%s
                   WHERE status='running' AND claimed_at < {_NOW} - %s AND attempts >= %s""",
                (iso(utcnow()), lease, MAX_ATTEMPTS),
            )
            row = db.execute(
                f"""WITH next AS (
                       SELECT job_id FROM jobs
                       WHERE status='pending' OR (status='running' AND claimed_at < {_NOW} - %s)
                       ORDER BY job_id LIMIT 1 FOR UPDATE SKIP LOCKED)
                   UPDATE jobs j SET status='running', attempts=j.attempts+1,
                       claimed_at={_NOW}, claimed_by=%s
                   FROM next WHERE j.job_id = next.job_id
                   RETURNING j.job_id, j.task_id, j.kind, j.trigger, j."window", j.attempts,
                             j.use_llm""",
                (lease, self.owner),
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
            "UPDATE jobs SET status=%s, error=%s, finished_at=%s WHERE job_id=%s",
            (status, error, iso(utcnow()), job_id),
        )

    def has_pending_job(self, task_id: str, *, kind: str) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM jobs WHERE task_id=%s AND kind=%s AND status='pending' LIMIT 1",
                (task_id, kind),
            ).fetchone()
            is not None
        )

    def queued_job_kinds(self, task_id: str, *, trigger: str, since: str | None = None) -> set[str]:
        sql = "SELECT DISTINCT kind FROM jobs WHERE task_id=%s AND trigger=%s"
        args: tuple[str, ...] = (task_id, trigger)
        if since is not None:
            sql += " AND created_at >= %s"
            args += (since,)
        return {row[0] for row in self._db.execute(sql, args)}

    def pending_jobs(self, *, mine: bool = False) -> int:
        """Jobs waiting or running; with ``mine``, only those this store object queued or is
        running (another process's jobs, or one left behind when it died, are not ours)."""
        if mine:
            return self._db.execute(
                f"""SELECT count(*) FROM jobs WHERE (status='pending' AND queued_by=%s)
                    OR (status='running' AND (claimed_by=%s
                        OR (queued_by=%s AND claimed_at > {_NOW} - %s)))""",
                (self.owner, self.owner, self.owner, JOB_LEASE),
            ).fetchone()[0]
        return self._db.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')"
        ).fetchone()[0]

    def jobs(self, *, limit: int = 100) -> list[dict[str, Any]]:
        cols = ("job_id", "task_id", "kind", "trigger", "status", "attempts", "error", "created_at")
        rows = self._db.execute(
            f"SELECT {', '.join(cols)} FROM jobs ORDER BY job_id DESC LIMIT %s", (limit,)
        )
        return [dict(zip(cols, r, strict=True)) for r in rows]

    # -- misc ------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "migrations": applied(self._db),
            "book_version": self.book_version(),
            "events": self.event_count(),
        }
