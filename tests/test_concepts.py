"""Concept tags: the words of one thing (English and Chinese) meet in recall and curation with the
default hashed embedder, where characters alone cannot ("where is my package?" / "order number",
快递 / 订单, 备份 / back up)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from hindsight_loop.embed import HashEmbedder
from hindsight_loop.lessons import curate, stance_relation
from hindsight_loop.models import Features, Lesson, LessonDraft
from hindsight_loop.recall import LessonIndex, RecallQuery
from hindsight_loop.text import concepts, tokenize

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_words_of_one_thing_get_one_tag_in_both_languages() -> None:
    assert "~order" in concepts("where is my package? it hasn't arrived")
    assert "~order" in concepts("我的快递怎么还没到？")
    assert "~order" in concepts("Ask for the order number once")
    assert "~delete" in concepts("删掉 users 表里的测试账号")
    assert "~delete" in concepts("Remove the test accounts")
    assert "~backup" in concepts("先备份原始文件") and "~backup" in concepts("back up the table")
    # Each tag once, in order of first appearance.
    assert concepts("refund the refund") == ("~refund",)


def test_ambiguous_words_get_no_tag() -> None:
    # "order" alone is also a sort order; advice's own verbs and whole domains are left out.
    assert "~order" not in concepts("it confuses day-month order")
    assert "~order" not in concepts("ORDER BY created_at")
    assert concepts("Confirm with the user before you call the tool") == ()
    assert concepts("Translate this birthday card into French") == ()


def test_tokenize_adds_tags_only_when_asked() -> None:
    assert tokenize("my package") == ["package"]
    assert tokenize("my package", with_concepts=True) == ["package", "~order"]
    assert tokenize("") == tokenize("", with_concepts=True) == []


def test_a_chinese_rewording_is_closer_with_tags_english_vectors_are_unchanged() -> None:
    a, b = "创建日程前确认时区", "安排会议之前先问清楚时区"
    with_tags, without = HashEmbedder(), HashEmbedder(concept_words=0)
    va, vb = with_tags.embed([a, b])
    wa, wb = without.embed([a, b])
    assert float(va @ vb) > float(wa @ wb) + 0.05
    english = ["where is my package?", "Ask for the order number once"]
    assert np.array_equal(with_tags.embed(english), without.embed(english))
    assert with_tags.name != without.name  # stored vectors of the other kind are re-embedded


def _lesson(lesson_id: str, task_type: str, tool: str, advice: str) -> Lesson:
    return Lesson(
        lesson_id=lesson_id, task_type=task_type, advice=advice, features=Features(tools=[tool])
    )


#: The rest of a small book: other task types, so that BM25 knows which terms are rare.
OTHERS = [
    _lesson("w", "weather_query", "get_weather", "Confirm which city before calling get_weather."),
    _lesson("c", "csv_cleaning", "read_csv", "Open Excel exports with encoding='utf-8-sig'."),
    _lesson("s", "sql_query", "run_sql", "Add LIMIT 100 to exploratory SELECT queries."),
    _lesson("e", "email_send", "send_email", "发送邮件前确认收件人地址。"),
    _lesson("k", "calendar", "create_event", "创建日程前确认时区。"),
    _lesson("f", "flight_search", "search_flights", "Confirm the departure airport first."),
]


def test_recall_finds_a_lesson_that_shares_no_word_with_the_request() -> None:
    index = LessonIndex(
        [
            *OTHERS,
            _lesson(
                "order",
                "customer_support",
                "order_lookup",
                "Ask for the order number once, then call order_lookup with it.",
            ),
            _lesson(
                "refund",
                "customer_support",
                "order_lookup",
                "Refunds over 100 euros need a supervisor; say so before promising one.",
            ),
        ],
        embedder=HashEmbedder(),
    )
    for text in ("where is my package? it hasn't arrived", "我的快递怎么还没到？"):
        q = RecallQuery(task_type="customer_support", tools=["order_lookup"], query=text)
        assert index.search(q).ids == ["order"], text


def test_never_x_immediately_forbids_the_haste_not_x() -> None:
    for kept, new in (
        ("On 503, never call fetch_url again immediately.", "On 503, pause, then call it again."),
        ("遇到 503 时不要立即重试 fetch_url。", "fetch_url 返回 503 后，先暂停一会儿再重试。"),
    ):
        opposed, _ = stance_relation(new, kept)
        assert opposed == 0, (kept, new)

        def draft(text: str) -> LessonDraft:
            return LessonDraft(
                task_type="web_scrape", advice=text, features=Features(tools=["fetch_url"])
            )

        first = curate(draft(kept), [], embedder=HashEmbedder(), now=NOW).lesson
        change = curate(draft(new), [first], embedder=HashEmbedder(), now=NOW)
        assert change.action != "conflict", (kept, new)
