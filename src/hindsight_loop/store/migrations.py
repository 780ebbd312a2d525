"""Numbered schema migrations, applied in order when a store opens.

Each migration is a named function in an ordered registry; each runs in its own transaction and
leaves its name in ``_migrations``. The schema version is read from that table, never guessed
from which columns exist.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from hindsight_loop.models import iso, utcnow

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_core(db: sqlite3.Connection) -> None:
    # Events keep their scalar fields in columns (for ordering and lookup) and everything else
    # in one JSON body, so a batch is written by a single INSERT … SELECT FROM json_each().
    db.execute(
        """CREATE TABLE tasks (
            task_id TEXT PRIMARY KEY,
            task_type TEXT NOT NULL,
            goal TEXT NOT NULL DEFAULT '',
            scope TEXT NOT NULL DEFAULT 'global',
            tools TEXT NOT NULL DEFAULT '[]',
            intent TEXT,
            status TEXT NOT NULL DEFAULT 'running',
            outcome TEXT,
            injected TEXT NOT NULL DEFAULT '[]',
            started_at TEXT NOT NULL,
            ended_at TEXT
        )"""
    )
    db.execute("CREATE INDEX tasks_by_type ON tasks(task_type, started_at)")
    db.execute("CREATE INDEX tasks_by_start ON tasks(started_at)")
    db.execute(
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            event_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts TEXT NOT NULL,
            type TEXT NOT NULL,
            body TEXT NOT NULL
        )"""
    )
    # Replay reads one task's events in (timestamp, seq) order: this index serves it directly.
    db.execute("CREATE INDEX events_by_task ON events(task_id, ts, seq)")
    db.execute(
        """CREATE TABLE lessons (
            lesson_id TEXT PRIMARY KEY,
            task_type TEXT NOT NULL,
            status TEXT NOT NULL,
            scope TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            body TEXT NOT NULL,
            embedding BLOB,
            embed_model TEXT
        )"""
    )
    db.execute("CREATE INDEX lessons_by_status ON lessons(status, task_type)")
    db.execute(
        """CREATE TABLE reflections (
            reflection_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            body TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX reflections_by_task ON reflections(task_id, created_at)")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta(key, value) VALUES ('book_version', '0')")


@migration
def m002_review_queue(db: sqlite3.Connection) -> None:
    # Reviews run off the agent's hot path: a worker thread or a `hindsight worker` process
    # claims jobs from this table, so a crash between queueing and reviewing loses nothing.
    db.execute(
        """CREATE TABLE review_jobs (
            job_id INTEGER PRIMARY KEY,
            task_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            trigger TEXT NOT NULL,
            window TEXT,
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
def m003_review_claims(db: sqlite3.Connection) -> None:
    # Who claimed a job and when: a job left 'running' by a process that died is taken back
    # after a lease, and a process waits only for the jobs it runs itself.
    db.execute("ALTER TABLE review_jobs ADD COLUMN claimed_at REAL")
    db.execute("ALTER TABLE review_jobs ADD COLUMN claimed_by TEXT")


@migration
def m004_jobs(db: sqlite3.Connection) -> None:
    # The queue holds reflections and outcome scoring alike: "review" now means only what a
    # person reviews (lessons that need review), so the queue is named for what it holds.
    db.execute("ALTER TABLE review_jobs RENAME TO jobs")
    db.execute("DROP INDEX review_jobs_pending")
    db.execute("CREATE INDEX jobs_pending ON jobs(status, job_id)")


@migration
def m005_job_owners(db: sqlite3.Connection) -> None:
    # Who queued a job: drain() waits for the reviews of this process's runs, not for every
    # process sharing the store.
    db.execute("ALTER TABLE jobs ADD COLUMN queued_by TEXT")


@migration
def m006_recall_index(db: sqlite3.Connection) -> None:
    """Nothing to do in SQLite: its recall index lives in memory (``recall.LessonIndex``).

    The PostgreSQL store adds here the columns and the pgvector HNSW index its store-side
    candidate stage reads; the two registries keep the same names so stores can be compared.
    """


@migration
def m008_lesson_versions(db: sqlite3.Connection) -> None:
    # The book version a lesson was last saved at: a reader holding the book at version N
    # reads only the lessons saved since (``lessons_since``), not the whole book again.
    db.execute("ALTER TABLE lessons ADD COLUMN saved_version INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX lessons_by_version ON lessons(saved_version)")


@migration
def m009_replay_projection(db: sqlite3.Connection) -> None:
    # What replay's key-node detectors read of each event (``replay.project``: status, tool,
    # step, call signature, error type …) as a small JSON array beside the body, filled at
    # write time from the payload the recorder already holds, so a replay decodes only the
    # bodies of the steps it shows. Rows written before stay NULL and replay decodes them as
    # it always did (the same chronicle): a backfill here would hold every process opening a
    # large store for the time it takes to decode all its events.
    db.execute("ALTER TABLE events ADD COLUMN projection TEXT")


@migration
def m010_jobs_by_task(db: sqlite3.Connection) -> None:
    # A writer taking over from a dead one asks, for each task end it skips as stored, which
    # reviews were queued for that task (``queued_job_kinds``): without an index that is a scan
    # of every job ever queued, per task (a million old jobs held a flush 24 s).
    db.execute("CREATE INDEX jobs_by_task ON jobs(task_id, trigger)")


@migration
def m011_task_scores(db: sqlite3.Connection) -> None:
    # What a task's run has counted in the lessons injected into it (``models.TaskScores`` as
    # JSON): a second task_end, a retried report or a rating of the same run then replaces the
    # verdict counted instead of counting the task again. Its own column, written only by the
    # scoring (``save_task_scores``): a task_start or task_end the writer stores leaves it.
    db.execute("ALTER TABLE tasks ADD COLUMN scores TEXT")


class SchemaError(ValueError):
    """The file is not a store this version of Hindsight can open."""


def check_schema(db: sqlite3.Connection, path: str) -> None:
    """Refuse, before writing anything, a file that is another application's database or a
    store written by a newer Hindsight (its migrations are unknown here)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return  # a new file
    if "_migrations" not in tables:
        raise SchemaError(
            f"{path!r} is an SQLite database that Hindsight did not create (tables: "
            f"{', '.join(sorted(tables)[:5])}); left untouched. Pass another path with --db or "
            "HINDSIGHT_DB"
        )
    known = {name for name, _ in MIGRATIONS}
    newer = [r[0] for r in db.execute("SELECT name FROM _migrations") if r[0] not in known]
    if newer:
        raise SchemaError(
            f"{path!r} was written by a newer Hindsight (schema {newer[-1]!r}); upgrade with "
            "'pip install -U hindsight-loop' to open it"
        )


def applied(db: sqlite3.Connection) -> list[str]:
    db.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    return [row[0] for row in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def migrate(db: sqlite3.Connection, *, upto: str | None = None) -> list[str]:
    """Apply every migration not yet applied (or up to and including ``upto``); return their names."""
    done = set(applied(db))
    ran = []
    for name, fn in MIGRATIONS:
        if name not in done:
            # BEGIN IMMEDIATE: two processes opening the same new file must not both migrate.
            db.execute("BEGIN IMMEDIATE")
            try:
                if name in set(applied(db)):
                    db.execute("COMMIT")
                    continue
                fn(db)
                db.execute(
                    "INSERT INTO _migrations(name, applied_at) VALUES (?, ?)", (name, iso(utcnow()))
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            ran.append(name)
        if name == upto:
            break
    return ran
