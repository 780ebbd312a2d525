"""Recall keeps a lesson whose own condition the request reports, on a real SQLite book."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hindsight_loop import Hindsight, recall
from hindsight_loop.embed import HashEmbedder, lesson_text
from hindsight_loop.models import Features, Lesson, iso, utcnow
from hindsight_loop.recall import Ranking, RecallCache, RecallQuery
from hindsight_loop.store import open_store

EXPORT = Lesson(
    lesson_id="export",
    task_type="video_editing",
    advice="If export_video fails with OutOfDiskSpace, free space with clear_render_cache "
    "before trying the export again.",
    features=Features(tools=["export_video", "clear_render_cache"], error_type="OutOfDiskSpace"),
)
FPS = Lesson(
    lesson_id="fps",
    task_type="video_editing",
    advice="Export at the source frame rate: export_video defaults to 30 fps.",
    features=Features(tools=["export_video"], intent="operation"),
)
TWICE = Lesson(
    lesson_id="twice",
    task_type="*",
    advice="When a tool call fails twice with the same error, stop retrying it as is: change "
    "the arguments or ask the user.",
)
TWICE_ZH = Lesson(
    lesson_id="twice_zh",
    task_type="*",
    advice="同一个工具连续两次报同样的错时，不要原样重试：修改参数或询问用户。",
    language="zh",
)
TIMEOUT = Lesson(
    lesson_id="timeout",
    task_type="*",
    advice="When a call that changes something times out, check whether it went through "
    "before retrying; a retried submit can happen twice.",
)


def _recall(db: Path, ranking: Ranking | None = None, **q: Any) -> list[str]:
    with Hindsight(db, background=False) as hs:
        for les in (EXPORT, FPS, TWICE, TWICE_ZH, TIMEOUT):
            hs.store.save_lesson(les)
        if ranking is not None:
            index = hs.recall_cache._current()[0]
            index.ranking = ranking
        return hs.recall(task_type="video_editing", tools=["export_video"], **q).ids


def test_a_general_lesson_for_a_repeated_failure_is_kept_next_to_the_tools_own(
    db_path: Path,
) -> None:
    """The tool's own remedy scores far above the general "failed twice" lesson, whose text
    shares few words with the request; the request reports that very condition, so the
    relative cut does not drop it (English and Chinese)."""
    again = "export failed again: OutOfDiskSpace. thats the 2nd time"
    got = _recall(db_path, query=again, error_type="OutOfDiskSpace")
    assert got[0] == "export" and "twice" in got
    off = dataclasses.replace(Ranking(), condition=False)
    assert "twice" not in _recall(db_path, off, query=again, error_type="OutOfDiskSpace")
    zh = "export_video 报 OutOfDiskSpace，重试了两次还是不行"
    got = _recall(db_path, query=zh, error_type="OutOfDiskSpace")
    assert got[0] == "export" and "twice_zh" in got


def test_a_condition_the_request_does_not_report_keeps_the_relative_cut(db_path: Path) -> None:
    """One failure is not a repeated one, "again" without a failure reports none, and a
    request asking about failures is not reporting its own."""
    once = _recall(db_path, query="export_video failed with OutOfDiskSpace")
    assert "twice" not in once and "twice_zh" not in once
    assert "twice" not in _recall(db_path, query="export it again at 24 fps")
    # Nor a retry asked for after one failure (the caller names the error, so every clause is
    # read for it).
    retry = "export_video failed with OutOfDiskSpace. try again?"
    got = _recall(db_path, query=retry, error_type="OutOfDiskSpace")
    assert got[0] == "export" and "twice" not in got


def test_condition_kinds_read_each_clause() -> None:
    kinds = recall.condition_kinds
    names = [name for name, _ in recall._FAILURE_KINDS]

    def read(text: str, **kwargs: Any) -> set[str]:
        mask = kinds(RecallQuery(query=text, **kwargs))
        return {n for i, n in enumerate(names) if mask & (1 << i)}

    assert read("publish_post timed out, just try it again") == {"timeout"}
    assert read("fetch_url keeps returning 429 Too Many Requests") >= {"ratelimit", "repeat"}
    assert read("同样的 SQL 报错已经出现两次了") == {"repeat"}
    assert read("卧室的灯一直控制不了，我都点了五六次了", error_type="DeviceOffline") == {"repeat"}
    # The repetition is not of the failure: another clause, with no error named.
    assert read("publish it again - yesterday the readme was broken") == set()
    assert read("how many timeout errors were logged today?", intent="query") == set()
    assert read("Send the report again") == set()
    # A retry the request asks for is no failure repeated, even where every clause is read
    # for the error the caller names; a failure told again still is.
    assert read("renew_loan failed with HoldExists. try again?", error_type="HoldExists") == set()
    bounced = "upload got bounced with PdfNotSearchable. if i print it to pdf again will it go?"
    assert read(bounced, error_type="PdfNotSearchable") == set()
    assert read("export failed again: OutOfDiskSpace", error_type="OutOfDiskSpace") == {"repeat"}
    assert read("hit JobTimeout again, run it once more", error_type="JobTimeout") >= {"repeat"}
    flags = recall.advice_flags
    assert flags(TWICE.advice)[2] == 1 << names.index("repeat")
    assert flags(TWICE_ZH.advice)[2] == 1 << names.index("repeat")
    assert flags(TIMEOUT.advice)[2] & (1 << names.index("timeout"))
    # A precaution is no remedy: it names no condition to meet.
    assert flags("Retry twice, then give up: the API is flaky.")[2] == 0


@pytest.mark.parametrize("hnsw_min_rows", [0, 10**9], ids=["hnsw", "rule-index"])
def test_the_store_stage_holds_the_same_conditions_as_the_index(
    pg_url: str, tmp_path: Path, hnsw_min_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's candidate stage reads the conditions from the advice and lowers its bound
    by the boost: the same lessons and scores as SQLite's index, on a book past
    ``STORE_STAGE_MIN``."""
    from test_store_postgres import _hnsw_book

    monkeypatch.setattr(recall, "HNSW_MIN_ROWS", hnsw_min_rows)
    embedder = HashEmbedder()
    book = _hnsw_book(recall.STORE_STAGE_MIN + 200)
    book += [
        dataclasses.replace(les, valid_until=iso(utcnow() + timedelta(days=30)))
        for les in (EXPORT, FPS, TWICE, TWICE_ZH, TIMEOUT, *LEAVE_BOOK)
    ]
    vectors = embedder.embed([lesson_text(x) for x in book])
    stores = {"sqlite": open_store(str(tmp_path / "book.db")), "postgres": open_store(pg_url)}
    for store in stores.values():
        with store.transaction():
            for les, vec in zip(book, vectors, strict=True):
                store.save_lesson(les, embedding=vec.tobytes(), embed_model=embedder.name)
    caches = {k: RecallCache(s, lambda: embedder) for k, s in stores.items()}
    caches["postgres"].keep_index = False
    call = {"task_type": "video_editing", "tools": ["export_video"]}
    queries = [
        RecallQuery(**call, query="export failed again: OutOfDiskSpace. the 2nd time"),
        RecallQuery(**call, query="export_video 报 OutOfDiskSpace，重试了两次还是不行"),
        RecallQuery(**call, query="export_video timed out, just try it again"),
        RecallQuery(**call, query="export it again at 24 fps"),
        RecallQuery(task_type="web", tools=["http_get"], query="http_get timed out twice"),
        RecallQuery(
            **LEAVE_CALL, query="下周三到周五想请年假，半天的那种也要算上", intent="operation"
        ),
        RecallQuery(**LEAVE_CALL, query="下周三到周五想请年假，半天的那种也要算上"),
    ]
    for q in queries:
        got = {k: c.search(q, limit=3) for k, c in caches.items()}
        assert got["postgres"].ids == got["sqlite"].ids, q
        assert [x.score for x in got["postgres"]] == [x.score for x in got["sqlite"]], q
    assert "twice" in caches["postgres"].search(queries[0], limit=3).ids
    assert "timeout" in caches["postgres"].search(queries[2], limit=3).ids
    assert "balance" in caches["postgres"].search(queries[5], limit=3).ids
    for store in stores.values():
        store.close()


# -- lessons the rules tie to the call, in the other language ---------------------------------------

BALANCE = Lesson(
    lesson_id="balance",
    task_type="hr_leave",
    advice="Before submit_leave, look at get_leave_balance: a request over the balance bounces.",
    features=Features(tools=["submit_leave", "get_leave_balance"], intent="operation"),
)
ONE_TOOL = Lesson(
    lesson_id="one_tool",
    task_type="hr_leave",
    advice="Attach the doctor's note to submit_leave for sick days beyond two.",
    features=Features(tools=["submit_leave"], intent="operation"),
)
HALF_DAY = Lesson(
    lesson_id="half_day",
    task_type="hr_leave",
    advice="请假半天时，submit_leave 的开始时间要写到小时，否则按整天扣。",
    language="zh",
    features=Features(tools=["submit_leave"], intent="operation"),
)
LEAVE_BOOK = (BALANCE, ONE_TOOL, HALF_DAY)
LEAVE_CALL: dict[str, Any] = {
    "task_type": "hr_leave",
    "tools": ["submit_leave", "get_leave_balance"],
}


def _recall_leave(db: Path, **q: Any) -> list[str]:
    with Hindsight(db, background=False) as hs:
        for les in LEAVE_BOOK:
            hs.store.save_lesson(les)
        return hs.recall(**LEAVE_CALL, **q).ids


def test_a_lesson_tied_to_the_call_in_the_other_language_is_not_cut_for_its_text(
    db_path: Path,
) -> None:
    """A Chinese request sharing no word with the English lesson that names both tools of the
    call and was learned for the intent the caller gives: the lesson is kept beside the
    Chinese one the text found. Not the English lesson of one tool, and not without the
    caller's intent."""
    request = "下周三到周五想请年假，半天的那种也要算上"
    got = _recall_leave(db_path, query=request, intent="operation")
    assert got[0] == "half_day" and "balance" in got and "one_tool" not in got
    assert "balance" not in _recall_leave(db_path, query=request)
    off = _index_ids(LEAVE_BOOK, Ranking(tied=False), query=request, intent="operation")
    assert "balance" not in off


def _index_ids(book: tuple[Lesson, ...], ranking: Ranking, **q: Any) -> list[str]:
    index = recall.LessonIndex(list(book), embedder=HashEmbedder(), ranking=ranking)
    return index.search(RecallQuery(**LEAVE_CALL, **q)).ids


def test_a_tied_lesson_the_text_could_judge_keeps_its_floors() -> None:
    """A penalty the request earns still cuts a tied lesson: a remedy, for a request with
    nothing gone wrong, scores under a whole scenario match without text."""
    remedy = dataclasses.replace(
        BALANCE,
        lesson_id="remedy",
        advice="If submit_leave fails with OverBalance, check get_leave_balance and split it.",
    )
    request = "下周三到周五想请年假，半天的那种也要算上"
    assert "remedy" not in _index_ids(
        (remedy, HALF_DAY), Ranking(), query=request, intent="operation"
    )
    assert (
        recall.tied_across(
            Ranking(),
            np.array([True]),
            np.array([2]),
            np.array([True]),
            np.array([False]),
            np.array([1.0]),
            request,
        )
        is not None
    )
