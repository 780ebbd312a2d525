"""What only the shared PostgreSQL store has to get right: many processes at once.

Every test runs against a real PostgreSQL cluster started for the session (tests/pg.py); the
processes are real processes, each with its own connections.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hindsight_loop import Hindsight, LessonDraft
from hindsight_loop.models import Features, Lesson, Task, iso, utcnow
from hindsight_loop.store import open_store
from hindsight_loop.store.migrations import SchemaError

SPAWN = multiprocessing.get_context("spawn")

ZH_ADVICE = "读取 GBK 编码的 CSV 文件时，你应该先用 encoding='gbk' 调用 read_csv。"


# -- curation under concurrency -------------------------------------------------------------
def _learn(url: str, barrier: Any, queue: Any) -> None:
    hs = Hindsight(url, background=False, triggers=False)
    try:
        hs.embedder.embed(["warm up"])  # both processes ready before the race starts
        draft = LessonDraft(
            task_type="csv_cleaning",
            advice="When read_csv fails with UnicodeDecodeError, you should pass encoding='gbk'.",
            features=Features(tools=["read_csv"], error_type="UnicodeDecodeError"),
            source_task_ids=[f"tsk_{os.getpid()}"],
        )
        barrier.wait(timeout=60)
        queue.put(hs.curator.add(draft).action)
    finally:
        hs.close()


@pytest.mark.parametrize("attempt", range(3))
def test_two_workers_learning_the_same_lesson_at_once_give_one_lesson_with_support_2(
    pg_url: str, attempt: int
) -> None:
    del attempt  # the race is rerun: each time both processes read the book at the barrier
    barrier = SPAWN.Barrier(2)
    queue = SPAWN.Queue()
    procs = [SPAWN.Process(target=_learn, args=(pg_url, barrier, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    actions = sorted(queue.get(timeout=10) for _ in procs)
    store = open_store(pg_url)
    try:
        lessons = store.list_lessons(task_type="csv_cleaning")
        assert len(lessons) == 1, [x.advice for x in lessons]
        assert lessons[0].support == 2
        assert actions == ["add", "merge"]
        assert len(lessons[0].source_task_ids) == 2
    finally:
        store.close()


# -- many processes creating one store ----------------------------------------------------------
def _open_each(urls: list[str], barrier: Any, delays: list[float], out: Any) -> None:
    for url, delay in zip(urls, delays, strict=True):
        barrier.wait(timeout=60)
        time.sleep(delay)  # spread over the time the first one takes to create the store
        try:
            open_store(url).close()
            out.put("ok")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out.put(repr(exc))


def test_processes_opening_one_fresh_database_at_once_all_get_the_store(pg_server: str) -> None:
    """Workers started together on an empty database: one creates the store while the others
    look at it. None may take the store being created for tables of someone else's."""
    import psycopg

    rng = random.Random(3)
    base = pg_server.rsplit("/", 1)[0]
    names = [f"hs_race_{uuid.uuid4().hex[:10]}" for _ in range(12)]
    with psycopg.connect(pg_server, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE DATABASE {name}")
    try:
        urls = [f"{base}/{name}" for name in names]
        workers = 5
        barrier = SPAWN.Barrier(workers)
        out = SPAWN.Queue()
        procs = [
            SPAWN.Process(
                target=_open_each,
                args=(urls, barrier, [rng.uniform(0, 0.12) for _ in urls], out),
            )
            for _ in range(workers)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in range(workers * len(urls))]
        for p in procs:
            p.join(60)
        assert results == ["ok"] * len(results), [r for r in results if r != "ok"]
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- many recorders into one database -----------------------------------------------------------
def _record(url: str, worker: int, barrier: Any, out: Any) -> None:
    store = open_store(url)
    adopted = []
    try:
        barrier.wait(timeout=60)
        for round_ in range(10):
            rows = []
            for t in range(20):  # every process writes into the same 20 tasks
                task_id = f"tsk_{t:02d}"
                if worker == 0 and round_ == 5:
                    body: dict[str, Any] = {"task_type": "shared", "goal": f"目标 {t}"}
                    etype = "task_start"
                else:
                    body, etype = {"input": {"text": f"第 {round_} 轮"}}, "user_input"
                ts = f"2025-01-01T00:00:{round_:02d}.{worker:03d}Z"
                rows.append((f"e_{worker}_{round_}_{t}", task_id, round_, ts, etype, _dumps(body)))
            adopted += store.write_event_batch(rows)
    finally:
        store.close()
    out.put(adopted)


def _dumps(body: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(body)


def test_four_recorder_processes_write_into_the_same_tasks_and_lose_nothing(pg_url: str) -> None:
    open_store(pg_url).close()
    barrier = SPAWN.Barrier(4)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_record, args=(pg_url, w, barrier, out)) for w in range(4)]
    for p in procs:
        p.start()
    adopted = [task_id for _ in procs for task_id in out.get(timeout=120)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    store = open_store(pg_url)
    try:
        assert store.event_count() == 4 * 10 * 20
        tasks = store.list_tasks(limit=100)
        assert len(tasks) == 20
        # a placeholder made by one writer is reported once, and its task_start fills it in
        assert len(adopted) == len(set(adopted)) <= 20
        assert {t.task_type for t in tasks} == {"shared"}
        assert store.get_task("tsk_07").goal == "目标 7"
        assert all(t.event_count == 40 for t in tasks)
    finally:
        store.close()


# -- the job queue -------------------------------------------------------------------------
def _drain(url: str, out: Any, ready: Any) -> None:
    store = open_store(url)
    done = []
    try:
        # Start together: on a loaded machine the first worker up could drain all 400 jobs
        # before the others had connected, and the test is about sharing the queue.
        ready.wait(60)
        while (job := store.claim_job()) is not None:
            done.append(job.job_id)
            store.finish_job(job.job_id, status="done")
    finally:
        store.close()
    out.put(done)


def test_four_worker_processes_drain_the_queue_each_job_exactly_once(pg_url: str) -> None:
    store = open_store(pg_url)
    try:
        store.upsert_task(Task(task_id="tsk_1", task_type="t"))
        queued = [store.enqueue_job("tsk_1") for _ in range(400)]
        out = SPAWN.Queue()
        ready = SPAWN.Barrier(4)
        procs = [SPAWN.Process(target=_drain, args=(pg_url, out, ready)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        claimed = [job_id for r in results for job_id in r]
        assert sorted(claimed) == queued  # none lost, none twice
        assert sum(1 for r in results if r) >= 2  # the queue was shared, not drained by one
        assert store.pending_jobs() == 0
        assert {j["status"] for j in store.jobs(limit=1000)} == {"done"}  # type: ignore[attr-defined]
        assert {j["attempts"] for j in store.jobs(limit=1000)} == {1}  # type: ignore[attr-defined]
    finally:
        store.close()


_CLAIM_AND_DIE = """
import os, sys
from hindsight_loop.store import open_store
store = open_store(sys.argv[1])
job = store.claim_job()
print(job.job_id, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_job_whose_worker_was_killed_is_taken_back_after_its_lease(pg_url: str) -> None:
    alive = open_store(pg_url)
    try:
        alive.upsert_task(Task(task_id="tsk_1", task_type="t"))
        job_id = alive.enqueue_job("tsk_1")
        proc = subprocess.run(
            [sys.executable, "-c", _CLAIM_AND_DIE, pg_url], capture_output=True, timeout=60
        )
        assert proc.returncode == -signal.SIGKILL
        assert int(proc.stdout) == job_id
        assert alive.claim_job() is None  # still within the dead worker's lease
        taken = alive.claim_job(lease=0.0)  # type: ignore[call-arg]
        assert taken is not None and taken.job_id == job_id and taken.attempts == 2
        alive.finish_job(job_id, status="done")
        assert alive.claim_job(lease=0.0) is None  # type: ignore[call-arg]
    finally:
        alive.close()


# -- the whole loop, text in both languages ------------------------------------------------
def test_record_drain_recall_on_postgres(pg_url: str) -> None:
    from test_loop import _failing_then_recovering_task

    hs = Hindsight(pg_url, background=False)
    try:
        first = _failing_then_recovering_task(hs)
        assert hs.drain()
        assert [r.status for r in hs.store.reflections(first)] == ["ok"]
        lessons = hs.store.list_lessons(task_type="csv_cleaning")
        assert len(lessons) == 1 and "gbk" in lessons[0].advice
        assert hs.store.event_count(first) == hs.store.get_task(first).event_count > 10
        found = hs.recall(task_type="csv_cleaning", tools=["read_csv"], query="erp_cn export")
        assert [x.lesson_id for x in found] == [lessons[0].lesson_id]
    finally:
        hs.close()


def test_a_chinese_lesson_and_run_round_trip(pg_url: str) -> None:
    hs = Hindsight(pg_url, background=False)
    try:
        with (
            hs.task("数据清洗", goal="清洗来自华东仓库的每晚导出", tools=["read_csv"]) as task,
            task.action("read_csv", {"path": "销售.csv"}, step="解析") as call,
        ):
            call.result({"rows": 3, "说明": "成功"})
        hs.flush()
        events = hs.store.events(task.task_id)
        assert events[0].type == "task_start"
        assert hs.store.get_task(task.task_id).goal == "清洗来自华东仓库的每晚导出"
        assert any(e.input == {"tool": "read_csv", "args": {"path": "销售.csv"}} for e in events)
        lesson = Lesson(
            lesson_id="les_zh",
            task_type="数据清洗",
            advice=ZH_ADVICE,
            features=Features(tools=["read_csv"], keywords=["编码"]),
            language="zh",
            valid_until=iso(utcnow()),
        )
        hs.store.save_lesson(lesson)
        assert hs.store.get_lesson("les_zh") == lesson
        hs.store.bump_hits(["les_zh"])  # a JSON update in SQL must keep the text as it was
        assert hs.store.get_lesson("les_zh").advice == ZH_ADVICE
    finally:
        hs.close()


# -- migrate between stores ------------------------------------------------------------------
def _rows(url: str) -> dict[str, Any]:
    store = open_store(url, readonly=True)
    try:
        tasks = store.list_tasks(limit=10_000)
        return {
            "tasks": tasks,
            "events": {t.task_id: store.events(t.task_id) for t in tasks},
            "lessons": store.list_lessons(),
            "embeddings": store.lesson_embeddings(),
            "reflections": store.reflections(limit=10_000),
        }
    finally:
        store.close()


def _hindsight(*args: str) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).with_name("hindsight"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def test_migrate_copies_sqlite_into_postgres_and_back_idempotently(
    pg_url: str, tmp_path: Path
) -> None:
    src = tmp_path / "demo.db"
    assert _hindsight("demo", "--db", str(src)).returncode == 0
    first = _hindsight("migrate", str(src), pg_url, "--json")
    assert first.returncode == 0, first.stderr
    assert '"events": 0' not in first.stdout
    again = _hindsight("migrate", str(src), pg_url, "--json")
    assert again.returncode == 0 and '"events": 0' in again.stdout
    original = _rows(str(src))
    assert original["lessons"] and original["reflections"]
    assert _rows(pg_url) == original
    back = tmp_path / "back.db"
    for _ in range(2):
        assert _hindsight("migrate", pg_url, str(back)).returncode == 0
    assert _rows(str(back)) == original


def test_migrate_says_what_is_wrong(tmp_path: Path) -> None:
    missing = _hindsight("migrate", str(tmp_path / "nope.db"), "postgresql://x@127.0.0.1:1/db")
    assert missing.returncode == 1 and "no store at" in missing.stderr
    (tmp_path / "a.db").touch()
    down = _hindsight("migrate", str(tmp_path / "a.db"), "postgresql://x@127.0.0.1:1/db")
    assert down.returncode == 1 and "cannot" in down.stderr


# -- opening -------------------------------------------------------------------------------
def test_a_database_with_foreign_tables_is_left_untouched(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("CREATE TABLE lessons (x int)")
    with pytest.raises(SchemaError, match="did not create"):
        open_store(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as db:
        assert db.execute("SELECT to_regclass('_migrations')").fetchone()[0] is None


def test_an_unreachable_server_names_the_fix() -> None:
    with pytest.raises(ConnectionError, match="HINDSIGHT_DB"):
        open_store("postgresql://nobody:secret@127.0.0.1:1/db")
    try:
        open_store("postgresql://nobody:secret@127.0.0.1:1/db")
    except ConnectionError as exc:
        assert "secret" not in str(exc)


def test_a_readonly_store_writes_nothing(pg_url: str) -> None:
    with pytest.raises(ValueError, match="write command"):
        open_store(pg_url, readonly=True)  # an empty database: not created by a read
    open_store(pg_url).close()
    reader = open_store(pg_url, readonly=True)
    try:
        assert reader.list_lessons() == []
        with pytest.raises(Exception, match="read-only"):
            reader.upsert_task(Task(task_id="tsk_1", task_type="t"))
    finally:
        reader.close()


def test_worker_processes_share_the_review_queue_of_agents_on_postgres(pg_url: str) -> None:
    from test_loop import _failing_then_recovering_task

    hs = Hindsight(pg_url, background=False)  # reviews are queued, not run, by the agent
    try:
        tasks = [_failing_then_recovering_task(hs, source=f"erp_{i}") for i in range(6)]
        hs.flush()
        assert hs.store.pending_jobs() == 6
    finally:
        hs.close()
    exe = str(Path(sys.executable).with_name("hindsight"))
    workers = [
        subprocess.Popen(
            [exe, "worker", "--once", "--db", pg_url], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    ran = 0
    for w in workers:
        out, _ = w.communicate(timeout=300)
        assert w.returncode == 0
        ran += int(out.split()[1])  # "ran N reviews"
    assert ran == 6
    store = open_store(pg_url)
    try:
        assert store.pending_jobs() == 0
        assert all([r.status for r in store.reflections(t)] == ["ok"] for t in tasks)
        assert store.list_lessons(task_type="csv_cleaning")
    finally:
        store.close()


def test_a_database_servers_dead_letter_goes_to_the_users_state_folder(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with Hindsight(pg_url, background=False) as hs:
        assert hs.record({"type": "no_such_type", "task_id": "t"}) is False
        dead = hs.recorder.dead_letter
    assert dead.parent == tmp_path / "state" / "hindsight"
    assert dead.name.endswith(".deadletter.jsonl") and "postgresql" in dead.name
    assert "no_such_type" in dead.read_text(encoding="utf-8")


def _hnsw_book(n: int) -> list[Lesson]:
    """A book past STORE_STAGE_MIN with every rule-stage field varied (EN and ZH advice)."""
    import random
    from datetime import timedelta

    rng = random.Random(16)
    words = [
        "read",
        "csv",
        "encoding",
        "retry",
        "timeout",
        "login",
        "token",
        "page",
        "date",
        "parse",
        "flight",
        "weather",
    ]
    zh = ["编码", "读取", "重试", "超时", "登录", "页面", "日期", "解析", "航班", "天气"]
    now = utcnow()
    book = []
    for i in range(n):
        chinese = rng.random() < 0.2
        text = "".join(rng.choices(zh, k=6)) if chinese else " ".join(rng.choices(words, k=8))
        r = rng.random()
        book.append(
            Lesson(
                lesson_id=f"les_{i:05d}",
                task_type=rng.choice(["csv", "csv", "web", "travel", "*"]),
                advice=f"You should {text}." if not chinese else f"你应该{text}。",
                language="zh" if chinese else "en",
                features=Features(
                    tools=rng.sample(
                        ["read_csv", "http_get", "search", "login"], rng.randint(0, 2)
                    ),
                    intent=rng.choice([None, "query", "operation"]),
                    step=rng.choice([None, "parse", "fetch"]),
                    error_type=rng.choice([None, "Timeout", "UnicodeDecodeError"]),
                ),
                scope=rng.choice(["global", "global", "project:web", "user:alice"]),
                status="active" if r < 0.8 else rng.choice(["needs_review", "rejected", "expired"]),
                pinned=rng.random() < 0.05,
                valid_until=iso(now + timedelta(days=rng.uniform(-10, 30))),
                value_score=rng.uniform(0.2, 0.9),
                conflicts=[f"les_{rng.randrange(n):05d}"] if rng.random() < 0.02 else [],
            )
        )
    return book


@pytest.mark.parametrize("hnsw_min_rows", [0, 10**9], ids=["hnsw", "rule-index"])
def test_recall_through_the_hnsw_stage_returns_what_sqlite_returns(
    pg_url: str, tmp_path: Path, hnsw_min_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hindsight_loop import recall
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.recall import STORE_STAGE_MIN, RecallCache, RecallQuery

    # Both ways of finding the first candidates: the HNSW index, and the rule stage's index
    # when it yields fewer rows than the setting.
    monkeypatch.setattr(recall, "HNSW_MIN_ROWS", hnsw_min_rows)

    embedder = HashEmbedder()
    from datetime import timedelta

    book = _hnsw_book(STORE_STAGE_MIN + 500)
    # Lessons whose tool is named for what a request speaks of (uploading) but whose advice
    # shares no word with it: only that makes them strong rule matches.
    book += [
        Lesson(
            lesson_id=f"les_up{i}",
            task_type="web",
            advice=f"You should check the {word} before you call it.",
            features=Features(tools=["upload_file", "http_get"][: i + 1]),
            valid_until=iso(utcnow() + timedelta(days=30)),
        )
        for i, word in enumerate(("key", "quota"))
    ]
    # English lessons of one call for a Chinese request sharing nothing with them: none
    # reaches its floor, and the one offered on its rules alone (``Ranking.unjudged``) is read
    # past the stage's bound.
    book += [
        Lesson(
            lesson_id=f"les_pickup{i}",
            task_type="courier",
            advice=f"Before you call schedule_pickup, ask for the {word}.",
            features=Features(tools=["schedule_pickup"]),
            value_score=value,
            valid_until=iso(utcnow() + timedelta(days=30)),
        )
        for i, (word, value) in enumerate((("gate code", 0.55), ("box weight", 0.6)))
    ]
    # Remedies (advice for when a call went wrong) and advice about later dates: they rank
    # lower for a request that shows no failure / speaks only of today (``Ranking.remedy_miss``,
    # ``time_miss``), which the store's stage reads from the advice, as the index does.
    book += [
        Lesson(
            lesson_id=f"les_cond{i}",
            task_type="ops",
            advice=advice,
            features=Features(tools=["deploy"]),
            valid_until=iso(utcnow() + timedelta(days=30)),
        )
        for i, advice in enumerate(
            (
                "When deploy fails with a timeout, roll back to the last good release first.",
                "部署报超时错误时，先回滚到上一个能用的版本。",
                "Check tomorrow's change freeze before you deploy the release.",
                "Check the release notes before you deploy the release.",
            )
        )
    ]
    vectors = embedder.embed([x.advice for x in book])  # any stored vectors of the model
    stores = {"sqlite": open_store(str(tmp_path / "book.db")), "postgres": open_store(pg_url)}
    for store in stores.values():
        with store.transaction():
            for lesson, vec in zip(book, vectors, strict=True):
                store.save_lesson(lesson, embedding=vec.tobytes(), embed_model=embedder.name)
    caches = {k: RecallCache(s, lambda: embedder) for k, s in stores.items()}
    caches["postgres"].keep_index = False  # the store's stage alone, never the index in memory
    queries = [
        RecallQuery(task_type="csv", tools=["read_csv"], query="read the csv with its encoding"),
        RecallQuery(task_type="csv", query="encoding", scope="user:alice"),
        RecallQuery(task_type="web", tools=["login"], query="login token timeout", step="fetch"),
        RecallQuery(task_type="travel", query="flight date", intent="query", error_type="Timeout"),
        RecallQuery(task_type="csv", query="读取 编码 重试", scope=["project:web", "user:alice"]),
        RecallQuery(query="weather page retry"),
        RecallQuery(task_type="web", tools=["http_get"]),  # no text: scenario and value only
        RecallQuery(task_type="nobody", query="parse"),
        # The second lesson is close behind and kept for a word the first does not hold.
        RecallQuery(task_type="web", query="date weather read"),
        # Named for what the request speaks of: strong rule matches by their tool alone.
        RecallQuery(task_type="web", tools=["upload_file"], query="put report.pdf in the bucket"),
        # An error named in the request: lessons learned on another one rank lower.
        RecallQuery(task_type="csv", tools=["read_csv"], query="read failed: UnicodeDecodeError"),
        # No intent given, the request reads as a lookup: lessons for an operation rank lower.
        RecallQuery(task_type="csv", tools=["read_csv"], query="which encoding is the csv in?"),
        # Nothing in the request's language fits: the best rule match in the other one.
        RecallQuery(task_type="courier", tools=["schedule_pickup"], query="明早让师傅上门取件"),
        # No failure shown, only today: the remedies and the later-date advice rank lower.
        RecallQuery(task_type="ops", tools=["deploy"], query="deploy the release today"),
        RecallQuery(task_type="ops", tools=["deploy"], query="deploy failed with a timeout"),
        RecallQuery(task_type="ops", tools=["deploy"], query="今天部署新版本"),
    ]
    nonempty = 0
    for q in queries:
        got = {k: c.search(q, limit=3) for k, c in caches.items()}
        assert got["postgres"].ids == got["sqlite"].ids, q
        assert [x.score for x in got["postgres"]] == [x.score for x in got["sqlite"]], q
        nonempty += bool(got["sqlite"])
        # The filters held: nothing returned is dead, out of scope or of another task type.
        for x in got["postgres"]:
            assert x.is_live() and x.task_type in (q.task_type, "*") or q.task_type is None
    assert nonempty >= 6
    courier = next(q for q in queries if q.task_type == "courier")
    assert caches["postgres"].search(courier, limit=3).ids == ["les_pickup1"]
    today = next(q for q in queries if q.query == "deploy the release today")
    failed = next(q for q in queries if q.query == "deploy failed with a timeout")
    # Today and nothing wrong: the plain advice, not the remedies or tomorrow's freeze; a
    # failure named: the remedy.
    assert caches["postgres"].search(today, limit=3).ids == ["les_cond3"]
    assert caches["postgres"].search(failed, limit=3).ids[0] == "les_cond0"
    pg_cache = caches["postgres"]
    assert pg_cache._stage is not None and pg_cache._index is None  # the store's stage served
    plan = (
        stores["postgres"]
        ._db.execute(  # type: ignore[attr-defined]
            "EXPLAIN SELECT id FROM lessons WHERE vector_dims(vec) = 256 "
            "ORDER BY vec::vector(256) <#> %s::float4[]::vector(256) LIMIT 10",
            (vectors[0].tolist(),),
        )
        .fetchall()
    )
    assert "lessons_hnsw_256" in " ".join(r[0] for r in plan)

    # A lesson written after the index exists is found, on both stores alike; a rejected one
    # is gone at once.
    fresh = Lesson(
        lesson_id="les_fresh",
        task_type="csv",
        advice="You should sniff the delimiter with csv.Sniffer before parsing semicolons.",
        features=Features(tools=["read_csv"]),
        value_score=0.9,
        valid_until=iso(utcnow().replace(year=utcnow().year + 1)),
    )
    q = RecallQuery(task_type="csv", tools=["read_csv"], query="sniff the delimiter semicolons")
    for store in stores.values():
        store.save_lesson(
            fresh, embedding=embedder.embed([fresh.advice])[0].tobytes(), embed_model=embedder.name
        )
    # (SQLite's in-memory index of a book this large is rebuilt in the background: a new
    # cache reads the book as it is now.)
    caches["sqlite"] = RecallCache(stores["sqlite"], lambda: embedder)
    got = {k: c.search(q, limit=3) for k, c in caches.items()}
    assert got["postgres"].ids[0] == "les_fresh" == got["sqlite"].ids[0]
    assert got["postgres"].ids == got["sqlite"].ids
    fresh.status = "rejected"
    for store in stores.values():
        store.save_lesson(fresh)
    assert "les_fresh" not in caches["postgres"].search(q, limit=3).ids
    for store in stores.values():
        store.close()


#: Opposite lessons no recall of one task type and one scope per kind serves together, so
#: curation never compared them: (id, task type, scope, tool, advice).
UNCOMPARED_PAIRS = [
    ("ask_en", "weather_query", "global", "get_weather",
     "You should ask the user for the city before calling get_weather."),
    ("noask_en", "trip_planning", "global", "get_weather",
     "You should not ask the user for the city before calling get_weather."),
    ("ask_zh", "weather_query", "global", "get_weather",
     "调用 get_weather 之前，你应该先问用户是哪个城市。"),
    ("noask_zh", "trip_planning", "global", "get_weather",
     "调用 get_weather 之前，你不要问用户是哪个城市。"),
    ("gbk_alice", "csv", "user:alice", "read_csv",
     "Always pass encoding='gbk' to read_csv for erp_cn exports."),
    ("gbk_bob", "csv", "user:bob", "read_csv",
     "Never pass encoding='gbk' to read_csv for erp_cn exports."),
]  # fmt: skip


@pytest.mark.parametrize("hnsw_min_rows", [0, 10**9], ids=["hnsw", "rule-index"])
def test_the_store_stage_keeps_apart_lessons_curation_never_compared(
    pg_url: str, tmp_path: Path, hnsw_min_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall of no task type, or of two users, through PostgreSQL's candidate stage reads
    the pairs it gathers that curation never compared, as SQLite's index does."""
    from datetime import timedelta

    from hindsight_loop import recall
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.recall import STORE_STAGE_MIN, RecallCache, RecallQuery

    monkeypatch.setattr(recall, "HNSW_MIN_ROWS", hnsw_min_rows)
    embedder = HashEmbedder()
    now = utcnow()
    book = _hnsw_book(STORE_STAGE_MIN + 100)
    book += [
        Lesson(
            lesson_id=lesson_id,
            task_type=task_type,
            scope=scope,
            advice=advice,
            language="zh" if "调用" in advice else "en",
            features=Features(tools=[tool]),
            created_at=iso(now - timedelta(minutes=10 - i)),
            valid_until=iso(now + timedelta(days=30)),
        )
        for i, (lesson_id, task_type, scope, tool, advice) in enumerate(UNCOMPARED_PAIRS)
    ]
    vectors = embedder.embed([x.advice for x in book])
    stores = {"sqlite": open_store(str(tmp_path / "book.db")), "postgres": open_store(pg_url)}
    for store in stores.values():
        with store.transaction():
            for lesson, vec in zip(book, vectors, strict=True):
                store.save_lesson(lesson, embedding=vec.tobytes(), embed_model=embedder.name)
    caches = {k: RecallCache(s, lambda: embedder) for k, s in stores.items()}
    caches["postgres"].keep_index = False  # the store's stage alone
    cases = [
        (RecallQuery(tools=["get_weather"], query="ask the city before get_weather"), "_en"),
        (
            RecallQuery(task_type="*", tools=["get_weather"], query="问用户哪个城市 get_weather"),
            "_zh",
        ),
        (
            RecallQuery(
                task_type="csv",
                tools=["read_csv"],
                query="gbk erp_cn exports",
                scope=["user:alice", "user:bob"],
            ),
            "gbk_",
        ),
    ]
    for q, pair in cases:
        got = {k: c.search(q, limit=3) for k, c in caches.items()}
        assert got["postgres"].ids == got["sqlite"].ids, q
        assert [x.score for x in got["postgres"]] == [x.score for x in got["sqlite"]], q
        assert len([x for x in got["postgres"].ids if pair in x]) == 1, (q, got["postgres"].ids)
    pg_cache = caches["postgres"]
    assert pg_cache._stage is not None and pg_cache._index is None  # the store's stage served
    for store in stores.values():
        store.close()


# -- one task counts once, however many workers settle it --------------------------------------
def _settle(url: str, task_id: str, barrier: Any, queue: Any) -> None:
    hs = Hindsight(url, background=False, triggers=False)
    try:
        barrier.wait(timeout=60)
        queue.put(sum(hs.worker.apply_outcome(task_id) for _ in range(3)))
    finally:
        hs.close()


def test_workers_settling_one_task_at_once_count_it_once(pg_url: str) -> None:
    with Hindsight(pg_url, background=False, triggers=False) as hs:
        lesson = hs.add_lesson(
            LessonDraft(
                task_type="csv_cleaning",
                advice="Read files exported by the old ERP with encoding='gbk'.",
                features=Features(tools=["read_csv"]),
            )
        )
        hs.record(
            {
                "type": "task_start",
                "task_id": "tsk_raced",
                "task_type": "csv_cleaning",
                "injected_lesson_ids": [lesson.lesson_id],
            }
        )
        hs.record({"type": "task_end", "task_id": "tsk_raced", "result": {"status": "failed"}})
        hs.flush()
    barrier = SPAWN.Barrier(2)
    queue = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_settle, args=(pg_url, "tsk_raced", barrier, queue)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(queue.get(timeout=10) for _ in procs) == [0, 1]  # one moved it, once
    store = open_store(pg_url)
    try:
        stored = store.get_lesson(lesson.lesson_id)
        assert stored is not None and (stored.helpful, stored.harmful) == (0, 1)  # before: (0, 6)
    finally:
        store.close()
