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
    """Refuse a schema Hindsight did not create, or one written by a newer Hindsight."""
    if not _has_table(db, "_migrations"):
        clash = sorted(t for t in _OURS if _has_table(db, t))
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
