"""The PostgreSQL store beside the SQLite store, in the same run: ingest, recall, the job queue.

Three figures, each measured on both stores on this machine:

- ingest: 4 processes write recorder batches (500 events of ~500 B of body each, the rows the
  recorder's writer thread hands to ``Store.write_event_batch``) into one database at once;
  events per second from the first write to the last commit, wall clock;
- recall: ``RecallCache.search`` (what ``Hindsight.recall`` calls: the book version check, the
  rule stage, BM25 + vector fusion, top 3, query embedding included) over a book of 100k
  synthetic lessons (bench/recall_speed.py's world) stored in each store; p50 / p99 per call,
  and whether both stores return the same lessons for every query. On PostgreSQL recall goes
  through the store's own candidate stage (``recall.StoreStage``: filters in SQL, pgvector
  HNSW, a score bound, the same ranking); SQLite loads the book into memory. The first recall
  (which on SQLite builds the index) is timed on each, and on PostgreSQL also with the
  in-memory index it used before the store stage existed, in the same run;
- queue: 4 processes drain 1,000 queued jobs (claim, finish); every job must be done exactly
  once and none lost; jobs per second.

PostgreSQL is the throwaway cluster of ``scripts/setup-postgres.sh start`` (fsync off: a bench
of the store's code, not of a disk), or the server named by ``HINDSIGHT_BENCH_PG``
(a URL whose user may create databases). SQLite files live in a temporary directory.

Run: ``python bench/postgres.py`` (``--quick`` for a smoke run, ``--json`` for bench/run.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import recall_speed  # noqa: E402
from _common import cli, machine, mixed_events  # noqa: E402  (also puts src/ on the path)

from hindsight_loop.store import open_store  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
ROOT = Path(__file__).resolve().parent.parent
WRITERS = 4
BATCH = 500


# -- where the stores live --------------------------------------------------------------------
def _pg_server() -> str:
    given = os.environ.get("HINDSIGHT_BENCH_PG")
    if given:
        return given
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-postgres.sh"), "start"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def _new_pg(server: str) -> str:
    import psycopg

    name = f"hs_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return f"{server.rsplit('/', 1)[0]}/{name}"


def _drop_pg(server: str, url: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


# -- ingest -----------------------------------------------------------------------------------
def _rows(worker: int, n_events: int) -> list[list[tuple[str, str, int, str, str, bytes]]]:
    """Recorder rows for ``n_events`` events in tasks of 100, cut into batches."""
    rng = random.Random(worker)
    rows = []
    for t in range(n_events // 100):
        task_id = f"tsk_{worker}_{t:05d}"
        events = mixed_events(rng, task_id, 100)
        events[0] = {"type": "task_start", "task_id": task_id, "task_type": "bench", "goal": "g"}
        events[-1] = {"type": "task_end", "task_id": task_id, "result": {"status": "succeeded"}}
        for seq, ev in enumerate(events):
            body = {k: v for k, v in ev.items() if k not in ("type", "task_id")}
            stamp = f"2025-01-15T10:{seq // 60:02d}:{seq % 60:02d}.000Z"
            rows.append(
                (f"evt_{task_id}_{seq}", task_id, seq, stamp, ev["type"], orjson.dumps(body))
            )
    return [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)]


def _writer(url: str, worker: int, n_events: int, barrier: Any, out: Any) -> None:
    batches = _rows(worker, n_events)
    store = open_store(url)
    try:
        barrier.wait(timeout=300)
        t0 = time.perf_counter()
        for batch in batches:
            store.write_event_batch(batch)
        out.put((t0, time.perf_counter(), sum(len(b) for b in batches)))
    finally:
        store.close()


def ingest(url: str, n_events: int) -> dict[str, Any]:
    open_store(url).close()  # migrated before the clock starts
    barrier = SPAWN.Barrier(WRITERS + 1)
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_writer, args=(url, w, n_events, barrier, out)) for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    results = [out.get(timeout=900) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    written = sum(r[2] for r in results)
    store = open_store(url)
    try:
        stored = store.event_count()
    finally:
        store.close()
    return {
        "events": written,
        "stored": stored,
        "seconds": wall,
        "events_per_s": written / wall,
    }


# -- recall -----------------------------------------------------------------------------------
def _load_book(url: str, lessons: list[Any], vectors: dict[str, np.ndarray], name: str) -> None:
    store = open_store(url)
    try:
        with store.transaction():
            for lesson in lessons:
                store.save_lesson(
                    lesson, embedding=vectors[lesson.lesson_id].tobytes(), embed_model=name
                )
    finally:
        store.close()


def recall(urls: dict[str, str], size: int, n_queries: int) -> dict[str, Any]:
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.recall import LessonIndex, RecallCache

    # The world's validity dates are relative to its NOW; recall checks them against the clock.
    recall_speed.NOW = datetime.now(UTC)
    rng = np.random.default_rng(recall_speed.SEED)
    world = recall_speed.World(rng)
    book = world.book(size)
    embedder = HashEmbedder()
    index = LessonIndex(book, embedder=embedder)
    vectors = {x.lesson_id: index._vectors[i] for i, x in enumerate(index.lessons)}
    queries = [world.query(book) for _ in range(n_queries)]
    out: dict[str, Any] = {"lessons": size, "queries": n_queries}
    caches, stores = {}, {}
    for kind, url in urls.items():
        t0 = time.perf_counter()
        _load_book(url, book, vectors, embedder.name)
        load_s = time.perf_counter() - t0
        stores[kind] = open_store(url, readonly=True)
        caches[kind] = RecallCache(stores[kind], lambda: embedder)
        t0 = time.perf_counter()
        caches[kind].search(queries[0], limit=3)  # the first recall builds the index
        out[kind] = {"load_s": load_s, "first_recall_s": time.perf_counter() - t0}
    # The store's stage alone (no in-memory index ever built), beside what a user gets.
    stage_only = RecallCache(stores["postgres"], lambda: embedder)
    stage_only.keep_index = False
    caches["postgres_stage"] = stage_only
    urls = {**urls, "postgres_stage": urls["postgres"]}
    times: dict[str, list[float]] = {k: [] for k in urls}
    same = 0
    for q in queries:  # interleaved: the machine's drift hits both stores alike
        got = {}
        for kind, cache in caches.items():
            t = time.perf_counter_ns()
            got[kind] = cache.search(q, limit=3).ids
            times[kind].append((time.perf_counter_ns() - t) / 1e6)
        same += len({tuple(v) for v in got.values()}) == 1
    for kind in urls:
        ts = sorted(times[kind])
        out.setdefault(kind, {})
        out[kind] |= {
            "p50_ms": statistics.median(ts),
            "p99_ms": float(np.percentile(ts, 99)),
        }
    for store in stores.values():
        store.close()
    out["same_results"] = same
    # Before the store stage: the whole book loaded from PostgreSQL into memory at first recall.
    import hindsight_loop.recall as recall_module

    kept = recall_module.STORE_STAGE_MIN
    recall_module.STORE_STAGE_MIN = 10**12
    try:
        store = open_store(urls["postgres"], readonly=True)
        cache = RecallCache(store, lambda: embedder)
        t0 = time.perf_counter()
        cache.search(queries[0], limit=3)
        out["postgres_in_memory_first_recall_s"] = time.perf_counter() - t0
        store.close()
    finally:
        recall_module.STORE_STAGE_MIN = kept
    return out


# -- the job queue ----------------------------------------------------------------------------
def _drainer(url: str, barrier: Any, out: Any) -> None:
    store = open_store(url)
    done = []
    try:
        barrier.wait(timeout=300)
        while (job := store.claim_job()) is not None:
            store.finish_job(job.job_id, status="done")
            done.append(job.job_id)
    finally:
        store.close()
    out.put(done)


def queue(url: str, n_jobs: int) -> dict[str, Any]:
    from hindsight_loop.models import Task

    store = open_store(url)
    store.upsert_task(Task(task_id="tsk_q", task_type="bench"))
    queued = [store.enqueue_job("tsk_q") for _ in range(n_jobs)]
    barrier = SPAWN.Barrier(WRITERS + 1)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_drainer, args=(url, barrier, out)) for _ in range(WRITERS)]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    results = [out.get(timeout=900) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    claimed = [j for r in results for j in r]
    statuses = {j["status"] for j in store.jobs(limit=n_jobs + 10)}  # type: ignore[attr-defined]
    store.close()
    return {
        "jobs": n_jobs,
        "done": len(claimed),
        "twice": len(claimed) - len(set(claimed)),
        "lost": len(set(queued) - set(claimed)),
        "per_worker": [len(r) for r in results],
        "statuses": sorted(statuses),
        "jobs_per_s": n_jobs / wall,
    }


# -- command line -----------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    n_events = 10_000 if args.quick else args.events
    size = 10_000 if args.quick else args.lessons
    n_queries = 200 if args.quick else args.queries
    server = _pg_server()
    tmp = Path(tempfile.mkdtemp(prefix="hindsight-bench-pg-"))
    made: list[str] = []

    def pg() -> str:
        made.append(_new_pg(server))
        return made[-1]

    try:
        import psycopg

        with psycopg.connect(server) as db:
            version = db.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        result: dict[str, Any] = {
            "benchmark": "postgres",
            "machine": machine(),
            "postgres": version,
            "psycopg": psycopg.__version__,
            "ingest": {
                "sqlite": ingest(str(tmp / "ingest.db"), n_events),
                "postgres": ingest(pg(), n_events),
            },
            "queue": {
                "sqlite": queue(str(tmp / "queue.db"), args.jobs),
                "postgres": queue(pg(), args.jobs),
            },
            "recall": recall({"sqlite": str(tmp / "recall.db"), "postgres": pg()}, size, n_queries),
        }
    finally:
        for url in made:
            _drop_pg(server, url)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def render(r: dict[str, Any]) -> str:
    m, i, q, rc = r["machine"], r["ingest"], r["queue"], r["recall"]
    lines = [
        f"PostgreSQL {r['postgres']} beside SQLite {m['sqlite']} — {m['cpu']}, {m['cores']} "
        f"cores, Python {m['python']}, psycopg {r['psycopg']} — {m['date']}",
        "",
        "| measure | SQLite | PostgreSQL | target (PostgreSQL) |",
        "|---|---:|---:|---|",
        f"| ingest, {WRITERS} processes, events/s | {i['sqlite']['events_per_s']:,.0f} | "
        f"{i['postgres']['events_per_s']:,.0f} | >= 30,000 |",
        f"| ingest: written / stored | {i['sqlite']['events']:,} / {i['sqlite']['stored']:,} | "
        f"{i['postgres']['events']:,} / {i['postgres']['stored']:,} | all stored |",
        f"| recall top-3 over {rc['lessons']:,} lessons, p50 ms | {rc['sqlite']['p50_ms']:.2f} | "
        f"{rc['postgres']['p50_ms']:.2f} | <= 15 |",
        f"| recall p99 ms | {rc['sqlite']['p99_ms']:.2f} | {rc['postgres']['p99_ms']:.2f} | |",
        f"| recall through the store stage alone (filters in SQL, HNSW, bound), p50 / p99 ms | | "
        f"{rc['postgres_stage']['p50_ms']:.2f} / {rc['postgres_stage']['p99_ms']:.2f} | |",
        f"| recall: load book s / first recall (index build) s | "
        f"{rc['sqlite']['load_s']:.1f} / {rc['sqlite']['first_recall_s']:.1f} | "
        f"{rc['postgres']['load_s']:.1f} / {rc['postgres']['first_recall_s']:.1f} | |",
        f"| recall: same lessons on both stores (and the stage alone) | {rc['same_results']} of "
        f"{rc['queries']} queries | | all |",
        "| recall: first recall on PostgreSQL with the whole book loaded in memory (before the "
        f"store stage), s | | {rc['postgres_in_memory_first_recall_s']:.1f} | |",
        f"| queue: {WRITERS} workers drain {q['sqlite']['jobs']:,} jobs, jobs/s | "
        f"{q['sqlite']['jobs_per_s']:,.0f} | {q['postgres']['jobs_per_s']:,.0f} | |",
        f"| queue: done / twice / lost | {q['sqlite']['done']} / {q['sqlite']['twice']} / "
        f"{q['sqlite']['lost']} | {q['postgres']['done']} / {q['postgres']['twice']} / "
        f"{q['postgres']['lost']} | each once, none lost |",
        f"| queue: jobs per worker | {q['sqlite']['per_worker']} | {q['postgres']['per_worker']} "
        "| |",
    ]
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=200_000, help="events per writer process")
    parser.add_argument("--lessons", type=int, default=100_000, help="lessons in the recall book")
    parser.add_argument("--queries", type=int, default=1000, help="recall queries")
    parser.add_argument("--jobs", type=int, default=1000, help="queued jobs to drain")


if __name__ == "__main__":
    cli(__doc__, run, render, _options)
