"""Recall: the rule stage, the rank stage, rendering and injection, intent, the CLI."""

from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight, lesson_keys, recall
from hindsight_loop.cli import app
from hindsight_loop.embed import HashEmbedder, lesson_text
from hindsight_loop.lessons import review_reasons
from hindsight_loop.models import Features, Lesson, LessonDraft, iso
from hindsight_loop.recall import (
    LessonIndex,
    LessonSet,
    Ranking,
    RecallQuery,
    classify_intent,
    errors_named,
    inject,
)
from hindsight_loop.testing.embed import ConceptEmbedder
from hindsight_loop.text import detect_language

NOW = datetime(2025, 1, 15, tzinfo=UTC)
runner = CliRunner()


def lesson(
    lesson_id: str,
    advice: str,
    *,
    task_type: str = "weather_query",
    tools: tuple[str, ...] = ("get_weather",),
    **kwargs: Any,
) -> Lesson:
    feats = {k: kwargs.pop(k) for k in ("intent", "step", "error_type", "keywords") if k in kwargs}
    kwargs.setdefault("valid_until", iso(NOW + timedelta(days=30)))
    return Lesson(
        lesson_id=lesson_id,
        task_type=task_type,
        advice=advice,
        features=Features(tools=list(tools), **feats),
        **kwargs,
    )


CITY = lesson(
    "city",
    "Confirm which city the user means before calling get_weather.",
    keywords=["city", "ambiguous"],
)
AIRPORT = lesson(
    "airport",
    "Confirm the departure airport before calling search_flights.",
    task_type="flight_search",
    tools=("search_flights",),
    keywords=["airport", "departure"],
)
#: A remedy learned on one error (two tests read it: error_miss, remedy_miss).
CODEC = lesson(
    "codec",
    "When read_csv fails with a codec error, retry with encoding='gbk'.",
    task_type="csv_cleaning",
    tools=("read_csv",),
    error_type="UnicodeDecodeError",
)
WEATHER_Q = RecallQuery(
    task_type="weather_query",
    tools=["get_weather"],
    query="What is the weather in Springfield? which city",
)


#: Ranking with no cut-off: every lesson that passes the rules comes back.
ALL = Ranking(min_score=0.0, relative=0.0)


def search(
    lessons: list[Lesson], q: RecallQuery, *, ranking: Ranking | None = None, **kwargs: Any
) -> list[str]:
    index = LessonIndex(lessons, embedder=kwargs.pop("embedder", HashEmbedder()), ranking=ranking)
    return index.search(q, now=kwargs.pop("now", NOW), **kwargs).ids


# -- the rule stage ---------------------------------------------------------------------------


def test_only_active_unexpired_lessons_come_back() -> None:
    book = [
        CITY,
        lesson("review", CITY.advice, status="needs_review"),
        lesson("rejected", CITY.advice, status="rejected"),
        lesson("expired", CITY.advice, status="expired"),
        lesson("past_due", CITY.advice, valid_until=iso(NOW - timedelta(seconds=1))),
        lesson("pinned", CITY.advice, pinned=True, valid_until=iso(NOW - timedelta(days=99))),
    ]
    assert set(search(book, WEATHER_Q)) == {"city", "pinned"}
    # The same book a month later: only the pinned lesson is still valid.
    assert search(book, WEATHER_Q, now=NOW + timedelta(days=31)) == ["pinned"]


def test_a_user_scoped_lesson_never_reaches_another_user() -> None:
    alice = lesson(
        "alice", "Alice wants Fahrenheit: pass units=imperial to get_weather.", scope="user:alice"
    )
    web = lesson(
        "web",
        "For the web project, cache get_weather answers for ten minutes.",
        scope="project:web",
    )
    book = [CITY, alice, web]
    q = "weather in Springfield in fahrenheit, which city, cache for the web project"

    def ids(scope: Any) -> set[str]:
        return set(
            search(
                book,
                RecallQuery(task_type="weather_query", tools=["get_weather"], query=q, scope=scope),
                ranking=ALL,
            )
        )

    assert ids("user:alice") == {"city", "alice"}
    assert ids("user:bob") == {"city"}
    assert ids(None) == ids("global") == {"city"}
    assert ids("project:web") == {"city", "web"}
    assert ids(["project:web", "user:alice"]) == {"city", "alice", "web"}
    assert ids("User:Alice ") == {"city", "alice"}  # scopes compare case-insensitively


def test_task_type_must_match_unless_the_lesson_fits_any() -> None:
    anywhere = lesson(
        "any",
        "When a tool fails twice with the same error, change the arguments.",
        task_type="*",
        tools=(),
    )
    book = [CITY, AIRPORT, anywhere]
    q = RecallQuery(
        task_type="flight_search",
        tools=["search_flights"],
        query="confirm the city before calling the tool; it failed twice",
    )
    assert set(search(book, q, ranking=ALL)) == {"airport", "any"}
    q.task_type = None  # unknown task type: every task type is considered, tools still filter
    assert set(search(book, q, ranking=ALL, limit=5)) == {"airport", "any"}
    q.tools = []
    assert set(search(book, q, ranking=ALL, limit=5)) == {"airport", "any", "city"}
    q.task_type = "*"  # names no task type in particular: same as None
    assert set(search(book, q, ranking=ALL, limit=5)) == {"airport", "any", "city"}


def test_weather_and_flight_lessons_do_not_cross_even_when_phrased_alike() -> None:
    q = RecallQuery(
        task_type="flight_search",
        tools=["search_flights"],
        query="Confirm which city before calling search flights from London",
    )
    assert search([CITY, AIRPORT], q) == ["airport"]
    # Pure vector similarity would have put the weather lesson close to this query.
    e = HashEmbedder()
    vq, vc, va = e.embed([q.query, lesson_text(CITY), lesson_text(AIRPORT)])
    assert vq @ vc > 0.2


def test_a_lesson_must_share_a_tool_with_the_task() -> None:
    toolless = lesson("toolless", "Confirm which city the user means first.", tools=())
    forecast = lesson(
        "forecast", "Confirm which city before calling get_forecast.", tools=("get_forecast",)
    )
    book = [CITY, toolless, forecast]
    q = RecallQuery(task_type="weather_query", tools=["get_forecast"], query="which city")
    assert set(search(book, q, ranking=ALL)) == {"toolless", "forecast"}
    q.tools = ["GET_WEATHER"]  # tool names compare case-insensitively
    assert set(search(book, q, ranking=ALL)) == {"toolless", "city"}
    q.tools = ["send_email"]
    assert search(book, q, ranking=ALL) == ["toolless"]
    q.tools = []  # tools unknown: not a filter
    assert set(search(book, q, ranking=ALL)) == {"toolless", "city", "forecast"}


def test_intent_filters_only_when_both_sides_know_it() -> None:
    select = lesson(
        "select",
        "Add LIMIT to exploratory SELECT queries in run_sql.",
        task_type="sql",
        tools=("run_sql",),
        intent="query",
    )
    delete = lesson(
        "delete",
        "Back up the table before a DELETE in run_sql.",
        task_type="sql",
        tools=("run_sql",),
        intent="operation",
    )
    plain = lesson(
        "plain", "Quote identifiers in run_sql queries.", task_type="sql", tools=("run_sql",)
    )
    book = [select, delete, plain]
    q = RecallQuery(
        task_type="sql", tools=["run_sql"], query="run_sql select delete quote", intent="operation"
    )
    assert set(search(book, q, ranking=ALL)) == {"delete", "plain"}
    q.intent = None
    assert set(search(book, q, ranking=ALL)) == {"select", "delete", "plain"}
    q.intent = "chitchat"  # an intent no lesson has: only lessons without one fit
    assert search(book, q, ranking=ALL) == ["plain"]


# -- the rank stage ---------------------------------------------------------------------------


def test_poor_matches_are_not_returned() -> None:
    book = [CITY, lesson("units", "Report temperatures in the units the user asked for.")]
    q = RecallQuery(
        task_type="weather_query",
        tools=["get_weather"],
        query="Translate this birthday card into French",
    )
    assert search(book, q) == []
    assert search(book, WEATHER_Q) == ["city"]  # the units lesson is not good enough here
    assert len(search(book, q, ranking=ALL)) == 2


class _HighFloorEmbedder:
    """The hashed embedder with a direction every text shares: unrelated texts score ~0.8 on
    it, as they do on a sentence model (e5 scores unrelated advice 0.75-0.85)."""

    def __init__(self) -> None:
        self.inner = HashEmbedder()
        self.dim = self.inner.dim + 1
        self.name = "high-floor-" + self.inner.name

    def embed(self, texts: list[str]) -> np.ndarray:
        base = np.asarray(self.inner.embed(texts), dtype=np.float32)
        shared = np.full((len(texts), 1), 2.0, dtype=np.float32)
        out = np.hstack([base, shared])
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_a_model_embedders_high_floor_is_not_taken_for_relevance() -> None:
    # Unrelated text scores ~0.8 on such an embedder; read raw, that clears every cut-off and
    # the birthday card gets weather advice. Measured from the embedder's floor, it does not.
    embedder = _HighFloorEmbedder()
    book = [CITY, lesson("units", "Report temperatures in the units the user asked for.")]
    q = RecallQuery(
        task_type="weather_query",
        tools=["get_weather"],
        query="Translate this birthday card into French",
    )
    raw = float(np.dot(*embedder.embed([q.query, CITY.advice])))
    assert raw > 0.75  # the premise: a raw cosine would call them close
    assert search(book, q, embedder=embedder) == []
    assert search(book, WEATHER_Q, embedder=embedder) == ["city"]


def test_at_most_limit_lessons_best_first_with_scores() -> None:
    book = [lesson(f"l{i}", f"Confirm which city the user means, variant {i}.") for i in range(6)]
    index = LessonIndex(book, embedder=HashEmbedder())
    found = index.search(WEATHER_Q, now=NOW)
    assert isinstance(found, LessonSet) and len(found) == 3
    scores = [x.score or 0.0 for x in found]
    assert all(isinstance(s, float) and s > 0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    assert all(x.score is None for x in index.lessons)  # the index's own lessons are untouched
    assert len(index.search(WEATHER_Q, now=NOW, limit=1)) == 1
    assert index.search(WEATHER_Q, now=NOW, limit=0) == []


def test_value_score_breaks_ties_and_error_type_ranks_higher() -> None:
    good = lesson("good", "Confirm which city the user means.", value_score=0.9)
    poor = lesson("poor", "Confirm which city the user means.", value_score=0.1)
    assert search([poor, good], WEATHER_Q, ranking=ALL) == ["good", "poor"]
    specific = lesson(
        "404", "Confirm which city the user means.", error_type="HTTP404", step="fetch"
    )
    q = copy.copy(WEATHER_Q)
    q.error_type, q.step = "http404", "FETCH"
    assert search([good, specific], q, ranking=ALL)[0] == "404"


def test_two_conflicting_lessons_are_never_returned_together() -> None:
    bom = lesson(
        "bom",
        "Read CSV exports with encoding utf-8-sig.",
        task_type="csv",
        tools=("read_csv",),
        conflicts=["latin"],
    )
    latin = lesson(
        "latin",
        "Read CSV exports with encoding latin-1.",
        task_type="csv",
        tools=("read_csv",),
        value_score=0.3,
    )  # the conflict is recorded on one side
    other = lesson(
        "dedupe", "Deduplicate CSV exports on key columns.", task_type="csv", tools=("read_csv",)
    )
    q = RecallQuery(task_type="csv", tools=["read_csv"], query="read CSV exports encoding")
    found = search([bom, latin, other], q, ranking=ALL, limit=3)
    assert "bom" in found and "latin" not in found and len(found) == 2
    # Without the conflict both would be returned.
    bom.conflicts = []
    assert {"bom", "latin"} <= set(search([bom, latin, other], q, ranking=ALL))


# -- lessons curation never compared: read at recall time ------------------------------------------

#: Opposite advice (first, second) and a request both fit, in English and Chinese.
OPPOSITE = {
    "en": (
        "You should ask the user for the city before calling get_weather.",
        "You should not ask the user for the city before calling get_weather.",
        "ask the city before get_weather",
    ),
    "zh": (
        "调用 get_weather 之前，你应该先问用户是哪个城市。",
        "调用 get_weather 之前，你不要问用户是哪个城市。",
        "问用户哪个城市 get_weather",
    ),
}
#: How a recall gathers lessons curation never compared: the lessons' task types and scopes,
#: and the recall's.
UNCOMPARED: dict[str, tuple[dict[str, str], dict[str, str], dict[str, Any]]] = {
    "no task type": (
        {"task_type": "weather_query"},
        {"task_type": "trip_planning"},
        {"task_type": None},
    ),
    "any task type": (
        {"task_type": "weather_query"},
        {"task_type": "trip_planning"},
        {"task_type": "*"},
    ),
    "two users": (
        {"task_type": "weather_query", "scope": "user:alice"},
        {"task_type": "weather_query", "scope": "user:bob"},
        {"task_type": "weather_query", "scope": ["user:alice", "user:bob"]},
    ),
    "two projects": (
        {"task_type": "weather_query", "scope": "project:web"},
        {"task_type": "weather_query", "scope": "project:api"},
        {"task_type": None, "scope": ["project:web", "project:api"]},
    ),
}


def _draft(advice: str, language: str, **keys: str) -> LessonDraft:
    return LessonDraft(
        advice=advice, features=Features(tools=["get_weather"]), language=language, **keys
    )


@pytest.mark.parametrize("language", OPPOSITE)
@pytest.mark.parametrize("how", UNCOMPARED)
def test_opposite_lessons_curation_never_compared_are_not_returned_together(
    db_path: Path, language: str, how: str
) -> None:
    first, second, request = OPPOSITE[language]
    keys_a, keys_b, query = UNCOMPARED[how]
    with Hindsight(db_path, background=False) as hs:
        a = hs.curate(_draft(first, language, **keys_a))
        b = hs.curate(_draft(second, language, **keys_b))
        # Never served together by a recall of one task type and one scope per kind, so
        # curation did not compare them: both live, no conflict recorded.
        assert (a.action, b.action) == ("add", "add") and not b.lesson.conflicts
        found = hs.recall(**query, tools=["get_weather"], query=request)
        assert len(found) == 1 and found.ids[0] in (a.lesson.lesson_id, b.lesson.lesson_id)
        prompt = found.as_prompt()
        assert (first in prompt) != (second in prompt)
        # The recall found the pair: it is recorded on both sides, off the recall's thread,
        # for a person to settle in review (before, nothing showed it), and still never served
        # together. Not two owners' lessons (two users, two projects): each may be right.
        assert hs.recall_cache.wait_recorded()
        ids = a.lesson.lesson_id, b.lesson.lesson_id
        stored = [hs.lesson(x) for x in ids]
        if how in ("two users", "two projects"):
            assert [x.conflicts for x in stored] == [[], []]
        else:
            assert [x.conflicts for x in stored] == [[ids[1]], [ids[0]]]
            book = {x.lesson_id: x for x in hs.lessons()}
            assert review_reasons(stored[1], book) == [f"conflicts with {ids[0]}"]
        again = hs.recall(**query, tools=["get_weather"], query=request)
        assert again.ids == found.ids
        # Each is still recalled by the recall it was written for.
        for change, keys in ((a, keys_a), (b, keys_b)):
            alone = hs.recall(**keys, tools=["get_weather"], query=request)
            assert alone.ids == [change.lesson.lesson_id]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Always retry get_weather on timeout.", "Never retry get_weather on timeout."),
        ("读取CSV文件时使用utf-8-sig编码。", "读取CSV文件时不要使用utf-8-sig编码。"),
        ("总是先备份数据库再执行迁移。", "从不先备份数据库再执行迁移。"),
        ("Passing dtype=str to read_csv is correct.", "Passing dtype=str to read_csv is incorrect."),
        ("小于 10 MB 的文件用 upload_file，而不是 upload_chunked。",
         "小于 10 MB 的文件用 upload_chunked，而不是 upload_file。"),
        ("Retry the upload unless the server returns 400.",
         "Retry the upload only when the server returns 400."),
        ("重试 fetch_page，除非页面返回 404。", "只在页面返回 404 时重试 fetch_page。"),
    ],
)  # fmt: skip
def test_the_opposites_curation_flags_are_kept_apart_across_task_types(
    first: str, second: str
) -> None:
    """Pairs curation flags as conflicts within one task type (``test_lessons``), written for
    two task types: recall reads them by the same rules."""
    book = [
        lesson(
            f"l{i}",
            advice,
            task_type=task_type,
            tools=(),
            created_at=iso(NOW - timedelta(days=2 - i)),
            language=detect_language(advice),
        )
        for i, (task_type, advice) in enumerate((("t1", first), ("t2", second)))
    ]
    assert search(book, RecallQuery(query=first)) == ["l0"]
    assert search(book, RecallQuery(query=second, task_type="t2")) == ["l1"]


def test_lessons_of_two_task_types_that_agree_are_both_returned(db_path: Path) -> None:
    first, second, request = OPPOSITE["en"]
    with Hindsight(db_path, background=False) as hs:
        ask = hs.curate(_draft(first, "en", task_type="weather_query")).lesson
        hs.curate(_draft(second, "en", task_type="trip_planning"))
        units = hs.curate(
            _draft(
                "Before calling get_weather, ask the user for the units: celsius or fahrenheit.",
                "en",
                task_type="packing_list",
            )
        ).lesson
        # The contradicting one leaves its slot to the next lesson, which agrees.
        got = hs.recall(tools=["get_weather"], query=request + " and the units")
        assert got.ids == [ask.lesson_id, units.lesson_id]


class CountingEmbedder(HashEmbedder):
    """The hashed embedder, counting the texts it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0

    def embed(self, texts: Any) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def test_a_pair_is_read_once_while_the_book_changes_around_it(db_path: Path) -> None:
    """Every change of the book (an outcome scored, another lesson learned) made the next
    recall naming no task type read each uncompared pair again: 1-7 ms a pair. A pair is read
    again only when what the rules read of it changes."""
    first, second, request = OPPOSITE["en"]
    embedder = CountingEmbedder()
    with Hindsight(db_path, background=False, embedder=embedder) as hs:
        a = hs.curate(_draft(first, "en", task_type="weather_query")).lesson
        b = hs.curate(_draft(second, "en", task_type="trip_planning")).lesson

        def recall() -> tuple[list[str], int]:
            before = embedder.texts
            found = hs.recall(tools=["get_weather"], query=request)
            return found.ids, embedder.texts - before

        served, read = recall()
        assert len(served) == 1 and read > 1  # the query, and the pair's texts
        assert hs.recall_cache.wait_recorded()  # the pair is recorded (the book changes)
        assert recall() == (served, 1)  # the same book: the query alone
        for score in (0.9, 0.8):  # the book changes around the pair
            hs.change_lesson(a.lesson_id, lambda x, s=score: dataclasses.replace(x, value_score=s))
            assert recall() == (served, 1)  # before: the pair read again each time
        # Its words changed: read again, and the two agree now.
        agreeing = "You should ask the user for the city and the units before calling get_weather."
        hs.change_lesson(b.lesson_id, lambda x: dataclasses.replace(x, advice=agreeing))
        served, read = recall()
        assert sorted(served) == sorted([a.lesson_id, b.lesson_id]) and read > 1


def test_a_recall_of_one_task_type_and_one_scope_per_kind_reads_no_pair() -> None:
    """The usual recall gathers only lessons curation compared: it pays for no reading."""
    index = LessonIndex([CITY, AIRPORT], embedder=HashEmbedder())
    read: list[tuple[str, str]] = []
    index._pairs.clash = lambda a, b: read.append((a.lesson_id, b.lesson_id)) or False  # type: ignore[method-assign]
    index.search(dataclasses.replace(WEATHER_Q, scope=["user:alice", "project:web"]), now=NOW)
    assert read == []
    assert not lesson_keys.gathers_uncompared("weather_query", ["global", "user:a", "team:x"])
    assert lesson_keys.gathers_uncompared("", ["user:a"])
    assert lesson_keys.gathers_uncompared("csv", ["user:a", "user:b", "global"])


def test_chinese_queries_find_chinese_lessons() -> None:
    zh_city = lesson("zh_city", "查询天气前先确认用户说的是哪个城市，很多地名重名。", language="zh")
    zh_rain = lesson("zh_rain", "用户问下雨时提醒带伞。", language="zh")
    q = RecallQuery(
        task_type="weather_query", tools=["get_weather"], query="朝阳是哪个城市的？今天天气怎么样"
    )
    assert search([CITY, zh_city, zh_rain], q)[0] == "zh_city"


def test_stored_vectors_are_used_and_wrong_sized_ones_recomputed() -> None:
    e = ConceptEmbedder()
    vectors = {"city": e.embed([lesson_text(CITY)])[0], "airport": np.ones(3, np.float32)}
    e.calls.clear()
    index = LessonIndex([CITY, AIRPORT], embedder=e, vectors=vectors)
    assert e.calls == [[lesson_text(AIRPORT)]]  # only the wrong-sized one was embedded
    assert index.search(WEATHER_Q, now=NOW).ids == ["city"]


def test_a_query_without_text_ranks_by_the_scenario() -> None:
    generic = lesson("generic", "Confirm the city.", task_type="*", tools=())
    found = search(
        [generic, CITY], RecallQuery(task_type="weather_query", tools=["get_weather"]), ranking=ALL
    )
    assert found[0] == "city"  # written for this task type and its tool


def test_empty_books_and_empty_texts() -> None:
    assert search([], WEATHER_Q) == []
    blank = lesson("blank", "")
    assert search([blank], WEATHER_Q) == []
    assert search([blank], WEATHER_Q, ranking=ALL) == ["blank"]


def test_search_is_safe_from_many_threads() -> None:
    book = [
        lesson(f"l{i}", f"Confirm which city {i} the user means before get_weather.")
        for i in range(300)
    ]
    book += [lesson(f"f{i}", f"Use get_forecast for day {i} after today.") for i in range(300)]
    index = LessonIndex(book, embedder=HashEmbedder())
    queries = [
        RecallQuery(
            task_type="weather_query",
            tools=["get_weather"],
            query=f"which city {i}" if i % 2 else f"forecast for day {i}",
        )
        for i in range(40)
    ]
    expected = [index.search(q, now=NOW).ids for q in queries]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            assert list(pool.map(lambda q: index.search(q, now=NOW).ids, queries)) == expected


def test_ranking_weights_can_be_changed() -> None:
    index = LessonIndex([CITY], embedder=HashEmbedder(), ranking=Ranking(min_score=0.99))
    assert index.search(WEATHER_Q, now=NOW) == []
    assert index.search(WEATHER_Q, now=NOW, min_score=0.1).ids == ["city"]
    with pytest.raises(ValueError, match="weights"):
        Ranking(vector=0, bm25=0)


def test_a_broken_value_score_does_not_break_recall() -> None:
    odd = lesson("odd", CITY.advice, value_score=float("nan"))
    assert search([odd], WEATHER_Q) == ["odd"]


# -- rendering and injection ------------------------------------------------------------------


def test_as_prompt_renders_tool_usage_advice() -> None:
    found = LessonSet([CITY, lesson("plain", "Answer in the user's language.", tools=())])
    prompt = found.as_prompt()
    lines = prompt.splitlines()
    assert lines[0].startswith("Advice from earlier runs")
    assert (
        lines[1] == "- [get_weather] Confirm which city the user means before calling get_weather."
    )
    assert lines[2] == "- Answer in the user's language."
    assert "follow the actual situation" in lines[-1]
    assert LessonSet().as_prompt() == ""


def test_as_prompt_speaks_chinese_for_chinese_lessons() -> None:
    found = LessonSet([lesson("zh", "查询天气前先确认城市。"), lesson("zh2", "提醒用户带伞。")])
    prompt = found.as_prompt()
    assert prompt.startswith("以往类似任务") and prompt.endswith("请以实际情况为准。")
    assert "- [get_weather] 查询天气前先确认城市。" in prompt


MESSAGES = [
    {"role": "system", "content": "You are a travel agent. Tools: get_weather(city)."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Weather in Springfield?"},
]


def test_inject_inserts_a_system_message_before_the_last_user_message() -> None:
    original = copy.deepcopy(MESSAGES)
    out = inject(MESSAGES, [CITY])
    assert original == MESSAGES  # the input is not modified
    assert [m["role"] for m in out] == ["system", "user", "assistant", "system", "user"]
    assert "Confirm which city" in out[3]["content"]
    assert out[0] == MESSAGES[0] and out[4] == MESSAGES[3]
    out[0]["content"] = "changed"
    assert MESSAGES[0]["content"] != "changed"  # messages are copies too


def test_inject_append_mode_extends_the_system_message() -> None:
    out = inject(MESSAGES, [CITY], mode="append")
    assert len(out) == len(MESSAGES) and MESSAGES[0]["content"].endswith("get_weather(city).")
    assert out[0]["content"].startswith(MESSAGES[0]["content"] + "\n\n")
    assert "Confirm which city" in out[0]["content"]
    parts = [{"role": "system", "content": [{"type": "text", "text": "sys"}]}]
    assert inject(parts, [CITY], mode="append")[0]["content"][-1]["type"] == "text"
    assert inject([{"role": "user", "content": "x"}], [CITY], mode="append")[0]["role"] == "system"
    with pytest.raises(ValueError, match="insert"):
        inject(MESSAGES, [CITY], mode="middle")  # type: ignore[arg-type]


def test_inject_with_no_lessons_or_no_user_message() -> None:
    assert inject(MESSAGES, []) == MESSAGES
    assert inject(MESSAGES, []) is not MESSAGES
    only_system = [{"role": "system", "content": "sys"}]
    assert inject(only_system, [CITY])[-1]["content"].startswith("Advice")


# -- intent -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        ("What's the weather in Paris?", "query"),
        ("Find flights from London to Rome", "query"),
        ("Book the 9am flight to Paris for John", "operation"),
        ("Delete all test accounts from the users table", "operation"),
        ("Why did sales drop in February compared to January?", "analysis"),
        ("明天北京天气怎么样？", "query"),
        ("帮我预订明天去上海的机票", "operation"),
        ("删除重复的行", "operation"),
        ("分析今年销售额的同比增长", "analysis"),
        ("为什么这个月的转化率下降了", "analysis"),
        ("", "query"),
    ],
)
def test_classify_intent(text: str, intent: str) -> None:
    assert classify_intent(text) == intent


def test_classify_intent_can_ask_a_model_and_falls_back() -> None:
    assert classify_intent("anything", model=lambda t: "Analysis.") == "analysis"
    assert classify_intent("Delete the file", model=lambda t: "no idea") == "operation"

    def broken(text: str) -> str:
        raise TimeoutError("model down")

    assert classify_intent("Delete the file", model=broken) == "operation"


# -- through the facade and the CLI, on a real SQLite file -----------------------------------------


def _seed(db: Path) -> None:
    with Hindsight(db, background=False) as hs:
        hs.store.save_lesson(lesson("city", CITY.advice, valid_until=None, pinned=True))
        hs.store.save_lesson(
            lesson(
                "alice",
                "Alice wants the weather in Fahrenheit: pass units=imperial to get_weather.",
                scope="user:alice",
                valid_until=None,
                pinned=True,
            )
        )
        hs.store.save_lesson(
            lesson(
                "airport",
                AIRPORT.advice,
                task_type="flight_search",
                tools=("search_flights",),
                valid_until=None,
                pinned=True,
            )
        )


def test_facade_recall_keeps_users_apart(db_path: Path) -> None:
    _seed(db_path)
    with Hindsight(db_path, background=False) as hs:
        q: dict[str, Any] = {
            "task_type": "weather_query",
            "tools": ["get_weather"],
            "query": "weather in Springfield in Fahrenheit, which city?",
        }
        assert set(hs.recall(**q, scope="user:alice").ids) == {"city", "alice"}
        assert hs.recall(**q, scope="user:bob").ids == ["city"]
        messages = hs.inject([{"role": "user", "content": "weather?"}], hs.recall(**q))
        assert messages[0]["role"] == "system" and "Confirm which city" in messages[0]["content"]


def test_cli_recall_prints_ids_advice_and_scores(db_path: Path) -> None:
    _seed(db_path)
    args = [
        "recall",
        "--db",
        str(db_path),
        "--task-type",
        "weather_query",
        "--tool",
        "get_weather",
        "--tool",
        "get_forecast",
        "--scope",
        "user:alice",
        "What's the weather in Springfield in Fahrenheit? which city",
    ]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    found = orjson.loads(result.output)
    assert {x["lesson_id"] for x in found} == {"city", "alice"}
    assert all(x["advice"] and x["score"] > 0 for x in found)
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "city" in table.output and "score" in table.output
    prompt = runner.invoke(app, [*args, "--prompt"])
    assert prompt.output.startswith("Advice from earlier runs")


def test_cli_recall_prints_an_empty_list_when_nothing_fits(db_path: Path) -> None:
    _seed(db_path)
    result = runner.invoke(
        app,
        [
            "recall",
            "--db",
            str(db_path),
            "--task-type",
            "flight_search",
            "--tool",
            "book_hotel",
            "reserve a room",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.output) == []
    text = runner.invoke(app, ["recall", "--db", str(db_path), "--task-type", "nothing", "x"])
    assert text.exit_code == 0 and "No lesson fits" in text.output


def test_cli_recall_rejects_a_bad_intent_or_scope_with_the_fix(db_path: Path) -> None:
    result = runner.invoke(app, ["recall", "--db", str(db_path), "--intent", "chat", "x"])
    assert result.exit_code == 1 and "query, operation, analysis" in result.output
    result = runner.invoke(app, ["recall", "--db", str(db_path), "--scope", "alice", "x"])
    assert result.exit_code == 1 and "user:NAME" in result.output
    assert runner.invoke(app, ["recall", "--help"]).exit_code == 0


def test_a_strong_rule_match_is_not_cut_for_few_shared_words() -> None:
    """The lesson's task type and tool match the call, and the request shares one concept with
    it: rank decides, not the text cut-off; a request sharing nothing still gets nothing."""
    order = lesson(
        "order",
        "Ask for the order number once, then call order_lookup with it; do not search orders "
        "by the customer's name.",
        task_type="customer_support",
        tools=("order_lookup",),
    )
    q = RecallQuery(
        task_type="customer_support", tools=["order_lookup"], query="帮我查一下订单到哪了"
    )
    index = LessonIndex([order], embedder=HashEmbedder())
    found = index.search(q, now=NOW)
    assert found.ids == ["order"]
    # Below the weak floor: only the rule match kept it.
    assert (found[0].score or 0.0) < Ranking().min_score
    # Written for any task type, the same lesson is a weak match and is cut.
    anywhere = dataclasses.replace(order, lesson_id="any", task_type="*")
    assert search([anywhere], q) == []
    # A tool of the call but nothing in common with the request: nothing fits.
    other = RecallQuery(
        task_type="customer_support", tools=["order_lookup"], query="Translate this card"
    )
    assert search([order], other) == []


def test_a_neighbour_that_adds_nothing_to_the_request_is_left_out() -> None:
    """Two lessons of one situation: the one the request matches best is enough; the other,
    close behind but matching no word of the request the first did not, stays out. A lesson
    speaking to another part of the request stays in."""
    city = lesson(
        "city",
        "Confirm which city the user means before calling get_weather; many towns share a name.",
    )
    forecast = lesson(
        "forecast",
        "For the weather of any day after today, call get_forecast instead of get_weather.",
        value_score=0.8,  # well proven: close behind on its record, not on the request
    )
    q = RecallQuery(
        task_type="weather_query", tools=["get_weather"], query="get_weather for the city"
    )
    index = LessonIndex([city, forecast], embedder=HashEmbedder(), ranking=ALL)
    scores = {x.lesson_id: x.score or 0.0 for x in index.search(q, now=NOW)}
    zone = Ranking(near=0.9)  # off by default: see ``Ranking.near``
    # Close behind: within ``relative`` of the best, but not within ``near``.
    assert zone.relative < scores["forecast"] / scores["city"] < zone.near
    assert search([city, forecast], q, ranking=zone) == ["city"]
    # Without the near zone (the default) the neighbour comes back.
    assert search([city, forecast], q) == ["city", "forecast"]
    # (A lesson close behind that speaks to another part of the request stays in:
    # tests/test_multi_agent.py's role and team lessons.)


def test_a_lesson_learned_on_another_error_than_the_one_named_ranks_lower() -> None:
    codec = CODEC
    twice = lesson(
        "twice",
        "When a tool call fails twice with the same error, stop retrying it as is.",
        task_type="*",
        tools=(),
    )
    q = RecallQuery(
        task_type="csv_cleaning",
        tools=["read_csv"],
        query="read_csv failed twice with the same FileNotFoundError",
    )
    assert errors_named(q) == {"filenotfound"}
    assert search([codec, twice], q, ranking=Ranking(error_miss=0.0, condition=False))[0] == "codec"
    assert search([codec, twice], q)[0] == "twice"
    # The error it was learned on, named in the request or given as the error type: no penalty.
    q.query = "read_csv failed twice with the same UnicodeDecodeError"
    assert search([codec, twice], q)[0] == "codec"
    # Given as the error type, another error costs the lesson ``error_miss`` the same way.
    q.query = "read_csv failed twice"
    before = LessonIndex([codec], embedder=HashEmbedder(), ranking=ALL).search(q, now=NOW)
    q.error_type = "FileNotFoundError"
    after = LessonIndex([codec], embedder=HashEmbedder(), ranking=ALL).search(q, now=NOW)
    value = Ranking().value_floor + Ranking().value_span * codec.value_score
    assert (before[0].score or 0) - (after[0].score or 0) == pytest.approx(
        Ranking().error_miss * value, abs=1e-3
    )
    # A request about no error in particular holds no lesson's error against it.
    assert errors_named(RecallQuery(query="the parser keeps failing, ParserErrors")) == set()
    # Errors are compared without their "Error" / "Exception": Timeout is TimeoutError.
    assert errors_named(RecallQuery(query="pandas.errors.ParserError, TimeoutException")) == {
        "parser",
        "timeout",
    }
    slow = lesson(
        "slow",
        "When read_csv times out on a network share, copy the file locally first.",
        task_type="csv_cleaning",
        tools=("read_csv",),
        error_type="Timeout",
    )
    q.query, q.error_type = "read_csv hit a TimeoutError twice", None
    with_miss = LessonIndex([slow], embedder=HashEmbedder(), ranking=ALL).search(q, now=NOW)
    no_miss = LessonIndex(
        [slow],
        embedder=HashEmbedder(),
        ranking=Ranking(min_score=0.0, relative=0.0, error_miss=0.0),
    ).search(q, now=NOW)
    assert with_miss[0].score == no_miss[0].score


def test_a_request_naming_what_a_lessons_tool_does_is_a_strong_rule_match() -> None:
    """The call has three tools; the request shares no word with the lesson's advice, but
    speaks of what one of its tools is named for (putting a file into a bucket: upload_object):
    the rules tie the lesson to the request, so the strong floor applies."""
    upload = lesson(
        "upload",
        "upload_object overwrites an existing key silently; call head_object first and ask "
        "before replacing it.",
        task_type="cloud_storage",
        tools=("upload_object", "head_object"),
    )
    tools = ["upload_object", "head_object", "presign_url"]
    q = RecallQuery(
        task_type="cloud_storage", tools=tools, query="Put report.pdf into the backups bucket"
    )
    found = LessonIndex([upload], embedder=HashEmbedder()).search(q, now=NOW)
    assert found.ids == ["upload"]
    assert (found[0].score or 0.0) < Ranking().min_score  # only the strong floor kept it
    # The same request about another of the call's tools' work (a download link): nothing.
    q.query = "Give me a download link for report.pdf"
    assert search([upload], q) == []
    # A lesson for any task type is no strong match, whatever its tools are named for.
    anywhere = dataclasses.replace(upload, lesson_id="any", task_type="*")
    q.query = "Put report.pdf into the backups bucket"
    assert search([anywhere], q) == []


def test_a_rule_match_in_the_other_language_is_offered_when_nothing_reaches_its_floor() -> None:
    """A Chinese request, and the lessons for its very call (task type, every tool among the
    call's) are English: the hashed text shares nothing across languages, so the rules decide
    and the best of them is offered, alone. Not when one of them is in the request's language
    (the text could judge it: nothing fits), nor a partial or any-task match, nor a lesson
    with a poor track record."""
    gate = lesson(
        "gate",
        "Before calling schedule_pickup, ask for the building's gate code; couriers cannot reach "
        "the door without it.",
        task_type="courier",
        tools=("schedule_pickup",),
        value_score=0.6,
    )
    weight = lesson(
        "weight",
        "Weigh every box before schedule_pickup: a box above 30 kg needs a freight pickup.",
        task_type="courier",
        tools=("schedule_pickup",),
    )
    q = RecallQuery(
        task_type="courier", tools=["schedule_pickup"], query="明早九点让师傅上门把两个箱子拉走"
    )
    found = LessonIndex([gate, weight], embedder=HashEmbedder()).search(q, now=NOW)
    assert found.ids == ["gate"]  # one lesson: the better track record of the two
    assert (found[0].score or 0.0) < Ranking().min_score - Ranking().rule_slack
    assert search([gate, weight], q, ranking=Ranking(unjudged=False)) == []
    # A lesson of the call in the request's own language shares nothing with it either: the
    # text could compare that one and found it wanting, so nothing fits.
    fragile = lesson(
        "fragile",
        "易碎物品要在备注里写清楚，并提醒用户用泡沫纸包好。",
        task_type="courier",
        tools=("schedule_pickup",),
    )
    assert search([gate, weight, fragile], q) == []
    # Weak rule matches are not offered on the rules alone: a lesson naming a tool the call
    # does not have, a lesson for any task type, a lesson that has been hurting its tasks.
    partial = dataclasses.replace(gate, features=Features(tools=["schedule_pickup", "cancel"]))
    anywhere = dataclasses.replace(gate, task_type="*")
    hurting = dataclasses.replace(gate, value_score=0.3)
    for weak in (partial, anywhere, hurting):
        assert search([weak], q) == [], weak
    # In the request's language a request sharing nothing with the lesson still gets nothing.
    q.query = "Pick up the two boxes at nine tomorrow morning"
    assert search([gate, weight], q) == []


def test_a_lesson_for_the_other_act_than_the_request_reads_as_ranks_lower() -> None:
    """No intent given: a request that reads as looking something up holds a lesson learned
    for changing something against it (and the other way round), by ``intent_miss``: a
    penalty, since the reading is keyword rules. An analysis request, or one that reads as
    nothing, holds no lesson against its intent; a given intent filters instead."""
    advice = "Check the order status with order_lookup before you answer the customer."
    read = lesson("read", advice, task_type="support", tools=("order_lookup",), intent="query")
    change = dataclasses.replace(
        read, lesson_id="change", features=Features(tools=["order_lookup"], intent="operation")
    )

    def scores(text: str, **kwargs: Any) -> dict[str, float]:
        q = RecallQuery(task_type="support", tools=["order_lookup"], query=text, **kwargs)
        found = LessonIndex([read, change], embedder=HashEmbedder(), ranking=ALL).search(q, now=NOW)
        return {x.lesson_id: x.score or 0.0 for x in found}

    lookup = scores("What is the status of my order?")
    assert lookup["read"] - lookup["change"] == pytest.approx(Ranking().intent_miss, abs=2e-4)
    act = scores("Cancel my order and refund the card")
    assert act["change"] - act["read"] == pytest.approx(Ranking().intent_miss, abs=2e-4)
    for neutral in ("Compare my order with last month's", "the parcel from Lisbon"):
        both = scores(neutral)
        assert both["read"] == both["change"], neutral
    assert list(scores("What is the status of my order?", intent="operation")) == ["change"]


def test_a_remedy_is_held_back_until_the_request_reports_something_gone_wrong() -> None:
    """A lesson whose advice is a remedy ("When read_csv fails with a codec error, …") loses
    ``remedy_miss`` for a request where nothing has gone wrong yet, in English and Chinese;
    not once the request reports an error (its words, an error name, or the error type).
    A precaution learned on an error ("… from the start") is no remedy."""
    codec = CODEC
    codec_zh = lesson(
        "codec_zh",
        "读取 CSV 报编码错误时，先用 gbk 编码重试。",
        task_type="csv_cleaning",
        tools=("read_csv",),
        language="zh",
    )
    bom = lesson(
        "bom",
        "Call read_csv with encoding='utf-8-sig' from the start: Excel exports carry a BOM.",
        task_type="csv_cleaning",
        tools=("read_csv",),
        error_type="KeyError",
    )
    value = Ranking().value_floor + Ranking().value_span * 0.5

    def score(les: Lesson, text: str, **kwargs: Any) -> float:
        q = RecallQuery(task_type="csv_cleaning", tools=["read_csv"], query=text, **kwargs)
        found = LessonIndex([les], embedder=HashEmbedder(), ranking=ALL).search(q, now=NOW)
        return found[0].score or 0.0

    def no_miss(les: Lesson, text: str, **kwargs: Any) -> float:
        q = RecallQuery(task_type="csv_cleaning", tools=["read_csv"], query=text, **kwargs)
        ranking = dataclasses.replace(ALL, remedy_miss=0.0)
        found = LessonIndex([les], embedder=HashEmbedder(), ranking=ranking).search(q, now=NOW)
        return found[0].score or 0.0

    for les, calm in ((codec, "How many rows are in data.csv?"), (codec_zh, "data.csv 有多少行？")):
        assert no_miss(les, calm) - score(les, calm) == pytest.approx(
            Ranking().remedy_miss * value, abs=2e-4
        ), les.lesson_id
    for gone_wrong, kwargs in (
        ("read_csv failed on data.csv", {}),
        ("read_csv raised UnicodeDecodeError", {}),
        ("读取 data.csv 报错了", {}),
        ("How many rows are in data.csv?", {"error_type": "UnicodeDecodeError"}),
    ):
        for les in (codec, codec_zh):
            assert score(les, gone_wrong, **kwargs) == no_miss(les, gone_wrong, **kwargs)
    assert score(bom, "How many rows are in data.csv?") == no_miss(
        bom, "How many rows are in data.csv?"
    )
    # Remedies name a call going wrong; a condition on anything else is not one.
    for advice, remedy in (
        ("If search_flights returns no results, widen the dates by a day.", True),
        ("When get_weather returns 404 for a city, call get_weather_v1.", True),
        ("fetch_url 返回 429 时，等待后重试。", True),
        ("如果上传失败，先检查网络。", True),
        ("When a customer returns an item after 30 days, refuse the refund.", False),
        (
            "For any date after today call get_forecast: get_weather returns current conditions.",
            False,
        ),
        ("用户问明天的天气时调用 get_forecast，get_weather 只返回实时天气。", False),
        ("Do not retry book_flight with the same arguments: fix what the error points at.", False),
        # The reflector's own lessons: learned on a failure, worded after it, but what to do
        # first next time (a precaution for the start of a run, not a remedy).
        (
            "When read_csv fails with EncodingError, you should call read_csv with "
            "encoding='utf-8-sig' first instead of encoding='utf-8'.",
            False,
        ),
        ("read_csv 读取失败时，你应该先用 encoding='gbk' 调用 read_csv，而不是 utf-8。", False),
        (
            "When read_csv fails with UnicodeDecodeError, you should avoid calling read_csv "
            "with encoding='utf-8': each failed there; try another option first.",
            False,
        ),
    ):
        assert lesson_keys.is_remedy(advice) is remedy, advice


def test_a_lesson_for_later_dates_ranks_lower_for_a_request_about_today() -> None:
    """A lesson about later dates ("for any date after today …") loses ``time_miss`` for a
    request about the present only ("today", 今天); not for one naming a later time, nor for
    one naming no time at all."""
    later = lesson(
        "later",
        "For any date after today call get_forecast, not get_weather.",
        tools=("get_weather", "get_forecast"),
    )
    later_zh = lesson(
        "later_zh",
        "用户问明天或下周的天气时调用 get_forecast。",
        tools=("get_weather", "get_forecast"),
        language="zh",
    )
    value = Ranking().value_floor + Ranking().value_span * 0.5

    def drop(les: Lesson, text: str) -> float:
        q = RecallQuery(
            task_type="weather_query", tools=["get_weather", "get_forecast"], query=text
        )
        got = {}
        for miss in (0.0, Ranking().time_miss):
            ranking = dataclasses.replace(ALL, time_miss=miss)
            found = LessonIndex([les], embedder=HashEmbedder(), ranking=ranking).search(q, now=NOW)
            got[miss] = found[0].score or 0.0
        return got[0.0] - got[Ranking().time_miss]

    for les in (later, later_zh):
        for today in ("How warm is it in Springfield today?", "朝阳今天天气怎么样？"):
            assert drop(les, today) == pytest.approx(Ranking().time_miss * value, abs=2e-4)
        for other in (
            "Will it rain tomorrow?",
            "Weather today and tomorrow in Paris",
            "下周北京会下雨吗",
            "Weather in Paris",
            "Now show me the weather in Paris",  # "now" alone speaks of no time
            "现在查一下巴黎的天气",
        ):
            assert drop(les, other) == 0.0, other
    # Words of sequence ("after the payment") name an event, not a later day.
    assert not recall.speaks_of_later("支付以后再发货，接下来通知用户。")
    assert not recall.speaks_of_later("Ship the order after the payment clears.")


def test_a_recall_records_what_it_found_without_waiting_for_the_write_lock(
    db_path: Path,
) -> None:
    """Another process holding the book's write lock held a recall naming no task type for
    the store's busy timeout (30 s) while it recorded the contradiction it found, and the
    record, failed, was never tried again. The recall hands it to a thread and returns."""
    import sqlite3

    first, second, request = OPPOSITE["en"]
    with Hindsight(db_path, background=False) as hs:
        a = hs.curate(_draft(first, "en", task_type="weather_query")).lesson
        b = hs.curate(_draft(second, "en", task_type="trip_planning")).lesson
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writing
        try:
            found = hs.recall(tools=["get_weather"], query=request)
            assert len(found) == 1
            assert other.in_transaction  # the recall returned while the lock was held
            assert hs.lesson(a.lesson_id).conflicts == []
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert hs.recall_cache.wait_recorded(timeout=60)
        assert hs.lesson(a.lesson_id).conflicts == [b.lesson_id]


def test_a_contradiction_handed_over_as_the_store_closes_is_not_recorded(db_path: Path) -> None:
    """The recall cache's thread recording a pair while ``close()`` closed the store under its
    transaction crashed the process (SIGSEGV in the test suite). Once the store is closing, a
    pair handed over is dropped (a later recall finds it again)."""
    first, second, _ = OPPOSITE["en"]
    hs = Hindsight(db_path, background=False)
    a = hs.curate(_draft(first, "en", task_type="weather_query")).lesson
    b = hs.curate(_draft(second, "en", task_type="trip_planning")).lesson
    hs.close()
    assert hs.curator.closed
    hs.curator.record_found(a.lesson_id, b.lesson_id)  # before: used the closed store
