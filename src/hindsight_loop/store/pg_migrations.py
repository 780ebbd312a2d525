"""The PostgreSQL schema: the same numbered migrations as SQLite's, in PostgreSQL's DDL.

The names are SQLite's (``m001_core`` … ``m005_job_owners``) so one store's ``_migrations`` can be
compared with the other's; each runs in its own transaction under an advisory lock, so many
processes opening a new database at once migrate it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hindsight_loop.store.migrations import MIGRATIONS as SQLITE_MIGRATIONS
from hindsight_loop.store.migrations import SchemaError

PgMigration = Callable[[Any], None]
MIGRATIONS: list[tuple[str, PgMigration]] = []

#: Key of the advisory lock held while migrating (any constant no other code uses).
MIGRATE_LOCK = 0x48534D47  # "HSMG"


def migration(fn: PgMigration) -> PgMigration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_core(db: Any) -> None:
    # Text columns hold the same strings as SQLite's: ISO timestamps order correctly as text,
    # but only byte-wise, so they are collated "C" whatever the database's locale. An ``id``
    # column stands in for SQLite's rowid where listings keep insertion order.
    db.execute(
        """CREATE TABLE tasks (
            id BIGSERIAL UNIQUE,
            task_id TEXT PRIMARY KEY,
            task_type TEXT NOT NULL,
            goal TEXT NOT NULL DEFAULT '',
            scope TEXT NOT NULL DEFAULT 'global',
            tools TEXT NOT NULL DEFAULT '[]',
            intent TEXT,
            status TEXT NOT NULL DEFAULT 'running',
            outcome TEXT,
            injected TEXT NOT NULL DEFAULT '[]',
            started_at TEXT COLLATE "C" NOT NULL,
            ended_at TEXT COLLATE "C"
        )"""
    )
    db.execute("CREATE INDEX tasks_by_type ON tasks(task_type, started_at)")
    db.execute("CREATE INDEX tasks_by_start ON tasks(started_at)")
    db.execute(
        """CREATE TABLE events (
            id BIGSERIAL PRIMARY KEY,
            event_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts TEXT COLLATE "C" NOT NULL,
            type TEXT NOT NULL,
            body TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX events_by_task ON events(task_id, ts, seq)")
    db.execute(
        """CREATE TABLE lessons (
            id BIGSERIAL UNIQUE,
            lesson_id TEXT PRIMARY KEY,
            task_type TEXT NOT NULL,
            status TEXT NOT NULL,
            scope TEXT NOT NULL,
            updated_at TEXT COLLATE "C" NOT NULL,
            body TEXT NOT NULL,
            embedding BYTEA,
            embed_model TEXT
        )"""
    )
    db.execute("CREATE INDEX lessons_by_status ON lessons(status, task_type)")
    db.execute(
        """CREATE TABLE reflections (
            id BIGSERIAL UNIQUE,
            reflection_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT COLLATE "C" NOT NULL,
            body TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX reflections_by_task ON reflections(task_id, created_at)")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta(key, value) VALUES ('book_version', '0')")


@migration
def m002_review_queue(db: Any) -> None:
    db.execute(
        """CREATE TABLE review_jobs (
            job_id BIGSERIAL PRIMARY KEY,
            task_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            trigger TEXT NOT NULL,
            "window" TEXT,
            use_llm INTEGER NOT NULL DEFAULT 1,
            status TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            created_at TEXT NOT NULL,
            finished_at TEXT
        )"""
    )
    db.execute("CREATE INDEX review_jobs_pending ON review_jobs(status, job_id)")


@migration
def m003_review_claims(db: Any) -> None:
    # claimed_at is the database server's clock (epoch seconds): workers on many hosts compare
    # leases against one clock, not each their own.
    db.execute("ALTER TABLE review_jobs ADD COLUMN claimed_at DOUBLE PRECISION")
    db.execute("ALTER TABLE review_jobs ADD COLUMN claimed_by TEXT")


@migration
def m004_jobs(db: Any) -> None:
    db.execute("ALTER TABLE review_jobs RENAME TO jobs")
    db.execute("DROP INDEX review_jobs_pending")
    db.execute("CREATE INDEX jobs_pending ON jobs(status, job_id)")


@migration
def m005_job_owners(db: Any) -> None:
    db.execute("ALTER TABLE jobs ADD COLUMN queued_by TEXT")


@migration
def m006_recall_index(db: Any) -> None:
    """What recall's store-side candidate stage reads (see ``recall.StoreStage``).

    - The rule stage's keys as columns (normalized by ``lesson_keys``, as the in-memory index
      normalizes them), so task type, scope, status, validity, intent and tools filter in SQL.
    - ``tokens``: the lesson's BM25 terms, and ``lesson_terms``: each term's document frequency
      over the whole book, kept by ``save_lesson``, so BM25 scores equal those of an index built
      over the whole book without reading it.
    - ``vec``: the embedding as a pgvector ``vector`` of no fixed size, beside the BYTEA copy
      that a full index load reads. HNSW needs a fixed dimension and embedders differ (the
      hashed default has 256, e5 384), so there is one partial expression index per dimension
      in use (``vec::vector(d)`` where ``vector_dims(vec) = d``), made when the first vector of
      that size is saved (``ensure_hnsw``): a book moving from one model to another is indexed
      for both while it is re-embedded, with no column per model and no table rewrite.
    """
    db.execute(
        """ALTER TABLE lessons ADD COLUMN task_key TEXT NOT NULL DEFAULT '',
               ADD COLUMN scope_key TEXT NOT NULL DEFAULT 'global',
               ADD COLUMN intent_key TEXT NOT NULL DEFAULT '',
               ADD COLUMN step_key TEXT NOT NULL DEFAULT '',
               ADD COLUMN error_key TEXT NOT NULL DEFAULT '',
               ADD COLUMN valid_epoch DOUBLE PRECISION NOT NULL DEFAULT 'Infinity',
               ADD COLUMN tools TEXT[] NOT NULL DEFAULT '{}',
               ADD COLUMN tokens TEXT[] NOT NULL DEFAULT '{}',
               ADD COLUMN value REAL NOT NULL DEFAULT 0.5"""
    )
    db.execute("CREATE INDEX lessons_rules ON lessons(status, task_key, id)")
    db.execute("CREATE TABLE lesson_terms (term TEXT PRIMARY KEY, df INTEGER NOT NULL)")
    # Recall reads the vectors and terms of a few thousand rows per query: kept in the row
    # (not TOASTed out of line, which costs a lookup per value); the JSON body, read only for
    # the lessons returned, goes out of line instead.
    db.execute("ALTER TABLE lessons ALTER COLUMN embedding SET STORAGE MAIN")
    db.execute("ALTER TABLE lessons ALTER COLUMN tokens SET STORAGE MAIN")
    if has_pgvector(db) or _create_pgvector(db):
        db.execute("ALTER TABLE lessons ADD COLUMN vec vector")
        db.execute("ALTER TABLE lessons ALTER COLUMN vec SET STORAGE MAIN")
    import orjson

    from hindsight_loop.models import Lesson
    from hindsight_loop.store.postgres import lesson_key_values, term_counts

    rows = db.execute("SELECT lesson_id, body, embedding FROM lessons").fetchall()
    df: dict[str, int] = {}
    for lesson_id, body, _embedding in rows:
        values, tokens = lesson_key_values(Lesson.from_dict(orjson.loads(body)))
        for term in set(tokens):
            df[term] = df.get(term, 0) + 1
        db.execute(
            """UPDATE lessons SET task_key=%s, scope_key=%s, intent_key=%s, step_key=%s,
                   error_key=%s, valid_epoch=%s, tools=%s, tokens=%s, value=%s
               WHERE lesson_id=%s""",
            (*values, lesson_id),
        )
    if df:
        term_counts(db, df)
    if has_vec_column(db):
        import numpy as np

        from hindsight_loop.store.postgres import ensure_hnsw

        dims = set()
        for lesson_id, _body, embedding in rows:
            if embedding is not None and len(embedding) % 4 == 0 and len(embedding):
                vec = np.frombuffer(bytes(embedding), np.float32)
                db.execute(
                    "UPDATE lessons SET vec = %s::float4[]::vector WHERE lesson_id=%s",
                    (vec.tolist(), lesson_id),
                )
                dims.add(vec.size)
        for dim in sorted(dims):
            ensure_hnsw(db, dim)


def has_pgvector(db: Any) -> bool:
    return db.execute("SELECT 1 FROM pg_extension WHERE extname='vector'").fetchone() is not None


def has_vec_column(db: Any) -> bool:
    return (
        db.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_name='lessons' "
            "AND column_name='vec' AND table_schema=current_schema()"
        ).fetchone()
        is not None
    )


def _create_pgvector(db: Any) -> bool:
    """Create the extension where this user may; without it recall loads the book in memory."""
    import psycopg

    try:
        with db.transaction():  # a savepoint: a refusal leaves the migration going
            db.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return True
    except psycopg.Error:
        return False


@migration
def m008_lesson_versions(db: Any) -> None:
    # The book version a lesson was last saved at (the version its transaction committed):
    # a reader holding the book at version N reads only the lessons saved since.
    db.execute("ALTER TABLE lessons ADD COLUMN saved_version BIGINT NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX lessons_by_version ON lessons(saved_version)")


@migration
def m009_replay_projection(db: Any) -> None:
    # replay.project of each event, kept beside its body at write time (see SQLite's m009);
    # rows written before stay NULL and are read from their bodies. Adding a nullable column
    # without a default rewrites nothing, however many events the table holds.
    db.execute("ALTER TABLE events ADD COLUMN projection TEXT")


@migration
def m010_jobs_by_task(db: Any) -> None:
    # The reviews queued for one task, read by a writer taking over (see SQLite's m010).
    db.execute("CREATE INDEX jobs_by_task ON jobs(task_id, trigger)")


@migration
def m011_task_scores(db: Any) -> None:
    # What a task's run has counted in its lessons (see SQLite's m011). Nullable, no default:
    # adding it rewrites no row.
    db.execute("ALTER TABLE tasks ADD COLUMN scores TEXT")


# One registry of names: a migration added to SQLite's must be added here too.
assert [n for n, _ in MIGRATIONS] == [n for n, _ in SQLITE_MIGRATIONS], "PG migrations drifted"

_OURS = {"tasks", "events", "lessons", "reflections", "meta", "jobs", "review_jobs"}


def applied(db: Any) -> list[str]:
    if not _has_table(db, "_migrations"):
        return []
    return [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY applied_at, name")]


def _has_table(db: Any, name: str) -> bool:
    return db.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def check_schema(db: Any, where: str) -> None:
    """Refuse a schema Hindsight did not create, or one written by a newer Hindsight.

    Our tables are looked for before ``_migrations``: another process creating the store
    commits both at once (``migrate``), so a look that finds its tables is followed by one
    that finds ``_migrations`` too. The other order took a store being created next door,
    seen between the two looks, for tables of someone else's."""
    clash = sorted(
        r[0]
        for r in db.execute(
            "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL",
            (sorted(_OURS),),
        )
    )
    if not _has_table(db, "_migrations"):
        if clash:
            raise SchemaError(
                f"{where!r} has tables Hindsight did not create ({', '.join(clash)}); left "
                "untouched. Pass another database with --db or HINDSIGHT_DB"
            )
        return
    known = {name for name, _ in MIGRATIONS}
    newer = [n for n in applied(db) if n not in known]
    if newer:
        raise SchemaError(
            f"{where!r} was written by a newer Hindsight (schema {newer[-1]!r}); upgrade with "
            "'pip install -U hindsight-loop' to open it"
        )


def migrate(conn: Any, *, upto: str | None = None) -> list[str]:
    """Apply every migration not yet applied (or up to and including ``upto``), each in its own
    transaction under an advisory lock; return their names."""
    ran = []
    for name, fn in MIGRATIONS:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            )
            done = {r[0] for r in conn.execute("SELECT name FROM _migrations")}
            if name not in done:
                fn(conn)
                conn.execute("INSERT INTO _migrations(name) VALUES (%s)", (name,))
                ran.append(name)
        if name == upto:
            break
    return ran
