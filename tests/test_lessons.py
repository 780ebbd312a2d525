"""Curation, feedback, expiry, edits and import/export of the lesson book (``hindsight_loop.lessons``)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from hindsight_loop.embed import HashEmbedder
from hindsight_loop.lessons import (
    Change,
    apply_outcome,
    check_scope,
    confirm,
    curate,
    draft_to_lesson,
    edit,
    expire_due,
    export_jsonl,
    export_markdown,
    keeps_hurting,
    parse_import_line,
    pin,
    reject,
    review_reasons,
    unpin,
    value_score,
)
from hindsight_loop.models import Features, Lesson, LessonDraft, Structured, iso, parse_ts

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
EMBEDDER = HashEmbedder()

ENCODING_REWORDED = [
    "Use encoding='utf-8-sig' when reading CSV files with read_csv.",
    "When reading CSV files with read_csv, use encoding='utf-8-sig'.",
    "Always pass encoding='utf-8-sig' to read_csv for CSV files.",
    "Read CSV files with read_csv and encoding='utf-8-sig'.",
    "For CSV files, call read_csv with encoding='utf-8-sig'.",
    "Set encoding='utf-8-sig' in read_csv when you read CSV files.",
    "You should read CSV files via read_csv using encoding='utf-8-sig', since Excel adds a BOM.",
    "CSV files must be read with read_csv(encoding='utf-8-sig').",
    "Remember to use encoding='utf-8-sig' with read_csv on CSV files.",
    "Pass encoding='utf-8-sig' to read_csv whenever you load a CSV file.",
]
CITY_REWORDED_ZH = [
    "调用 get_weather 前先向用户确认城市。",
    "在调用 get_weather 之前，先和用户确认城市。",
    "先确认用户要查询的城市，再调用 get_weather。",
    "调用天气接口 get_weather 前务必确认城市。",
    "请先向用户确认城市，然后调用 get_weather。",
    "确认城市后再调用 get_weather 查询天气。",
    "使用 get_weather 之前要先确认用户所说的城市。",
    "向用户确认城市之后才能调用 get_weather。",
    "调用 get_weather 查询天气前，先确认城市名称。",
    "先和用户核实城市，再调用 get_weather。",
]
DISTINCT_WEATHER = [
    "Confirm the city with the user before calling get_weather.",
    "Report temperatures in the unit the user asked for (Celsius or Fahrenheit).",
    "Retry get_weather once on timeout before telling the user it failed.",
    "Call get_weather with units='metric' for users in Europe.",
    "Confirm the date range with the user before calling get_forecast.",
    "Cache get_weather results for ten minutes instead of calling it again.",
]
DISTINCT_CSV = [
    "Use encoding='utf-8-sig' when reading CSV files with read_csv.",
    "Strip whitespace from column names after reading the CSV.",
    "Check whether the delimiter is a semicolon before parsing European CSV files.",
    "Convert date columns with pd.to_datetime and an explicit format.",
    "Drop duplicate rows before computing totals.",
    "Write the cleaned CSV with index=False.",
    "Pass sep=';' to read_csv for semicolon-separated files.",
    "Call read_csv with dtype=str so leading zeros in IDs are kept.",
]


class Book:
    """The shell's part in a test: keeps lessons by id and saves what curation returns."""

    def __init__(self) -> None:
        self.lessons: dict[str, Lesson] = {}

    def add(self, draft: LessonDraft | Lesson, *, now: datetime = NOW, **kwargs) -> Change:
        change = curate(draft, list(self.lessons.values()), embedder=EMBEDDER, now=now, **kwargs)
        for lesson in change.saves:
            self.lessons[lesson.lesson_id] = lesson
        return change

    def __len__(self) -> int:
        return len(self.lessons)

    def only(self) -> Lesson:
        assert len(self.lessons) == 1, [x.advice for x in self.lessons.values()]
        return next(iter(self.lessons.values()))


def draft(advice: str, task_type: str = "csv_cleaning", **kwargs) -> LessonDraft:
    return LessonDraft(task_type=task_type, advice=advice, **kwargs)


# -- curation: merging repeats ------------------------------------------------------------------


def test_the_same_lesson_reworded_ten_times_is_one_lesson_with_support_10():
    book = Book()
    for i, text in enumerate(ENCODING_REWORDED):
        change = book.add(draft(text, source_task_ids=[f"tsk_{i}"]), now=NOW + timedelta(hours=i))
        assert change.action == ("add" if i == 0 else "merge")
    lesson = book.only()
    assert lesson.support == 10
    assert lesson.source_task_ids == [f"tsk_{i}" for i in range(10)]
    assert lesson.status == "active"
    # The most specific wording is kept (the one that also says why).
    assert lesson.advice == ENCODING_REWORDED[6]
    assert [h["action"] for h in lesson.history] == ["create"] + ["merge"] * 9
    # Each merge refreshed the lesson: validity counts from the last time it was learned.
    assert lesson.updated_at == iso(NOW + timedelta(hours=9))
    assert lesson.valid_until == iso(NOW + timedelta(hours=9, days=30))


def test_a_run_reviewed_again_adds_no_support():
    book = Book()
    book.add(draft(ENCODING_REWORDED[0], source_task_ids=["tsk_1"]))
    # The same run's local review, then its full review, then a review asked for by name.
    for text in ENCODING_REWORDED[1:3]:
        assert book.add(draft(text, source_task_ids=["tsk_1"])).action == "merge"
    assert book.only().support == 1  # before: 3, from one run
    book.add(draft(ENCODING_REWORDED[3], source_task_ids=["tsk_1", "tsk_2"]))
    assert book.only().support == 2 and book.only().source_task_ids == ["tsk_1", "tsk_2"]


def test_lines_with_no_run_behind_them_count_once_however_often_they_come_back():
    """Ten hand-written rewordings imported twice: the second time each is a wording the lesson
    held (not only the last ``MAX_VARIANTS`` the rules read: they came back in turn, +9 each
    time)."""
    book = Book()
    for text in ENCODING_REWORDED:
        book.add(draft(text))
    assert book.only().support == 10
    for text in ENCODING_REWORDED:
        assert book.add(draft(text.upper())).action == "merge"
    assert book.only().support == 10


def test_the_same_lesson_reworded_in_chinese_merges_too():
    book = Book()
    for text in CITY_REWORDED_ZH:
        book.add(draft(text, task_type="weather_query", features=Features(tools=["get_weather"])))
    assert book.only().support == 10
    assert book.only().language == "zh"


def test_rewordings_merge_whatever_order_they_arrive_in():
    import random

    for seed in range(5):
        book = Book()
        for text in random.Random(seed).sample(ENCODING_REWORDED, len(ENCODING_REWORDED)):
            book.add(draft(text))
        assert book.only().support == 10


@pytest.mark.parametrize("texts", [DISTINCT_WEATHER, DISTINCT_CSV])
def test_distinct_lessons_of_one_task_type_stay_apart(texts):
    book = Book()
    for text in texts:
        assert book.add(draft(text)).action == "add", text
    assert len(book) == len(texts)
    assert all(x.support == 1 and x.status == "active" for x in book.lessons.values())


def test_scope_and_task_type_separate_lessons():
    book = Book()
    text = ENCODING_REWORDED[0]
    book.add(draft(text, scope="user:alice"))
    book.add(draft(text, scope="user:bob"))
    book.add(draft(text, scope="project:billing"))
    book.add(draft(text))
    book.add(draft(text, task_type="report_export"))
    assert len(book) == 5
    # ... and the same scope merges.
    assert book.add(draft(ENCODING_REWORDED[1], scope="user:alice")).action == "merge"
    assert sorted(x.scope for x in book.lessons.values() if x.support == 2) == ["user:alice"]


def test_opposites_one_recall_serves_from_two_owners_scopes_are_kept_apart():
    project = draft("Always reply to the customer in English.", scope="project:shop")
    user = draft("Never reply to the customer in English.", scope="user:alice")
    book = Book()
    old = book.add(project).lesson
    change = book.add(user)
    # A recall for user alice in project shop reads both scopes: before, the pair was never
    # compared and both were served. Each may be right for its owner: the new one stays live.
    assert change.action == "add" and change.lesson.status == "active"
    assert change.lesson.conflicts == [old.lesson_id]
    assert book.lessons[old.lesson_id].conflicts == [change.lesson.lesson_id]
    # Two users' lessons are never served together: neither compared nor recorded.
    bob = book.add(draft("Always reply to the customer in English.", scope="user:bob"))
    assert bob.action == "add" and bob.lesson.conflicts == [] and not bob.others


def test_a_different_error_type_or_step_is_a_different_lesson():
    book = Book()
    parse = Features(step="parse", error_type="UnicodeDecodeError")
    book.add(draft(ENCODING_REWORDED[0], features=parse))
    other_error = dataclasses.replace(parse, error_type="ParserError")
    assert book.add(draft(ENCODING_REWORDED[1], features=other_error)).action == "add"
    other_step = dataclasses.replace(parse, step="export")
    assert book.add(draft(ENCODING_REWORDED[2], features=other_step)).action == "add"
    assert book.add(draft(ENCODING_REWORDED[3], features=parse)).action == "merge"


def test_same_structured_form_is_the_same_lesson_whatever_the_words():
    rule = Structured(
        when={"tool": "read_csv", "error_type": "UnicodeDecodeError"},
        prefer={"tool": "read_csv", "args": {"encoding": "utf-8-sig"}},
        avoid={"tool": "read_csv", "args": {"encoding": "utf-8"}},
    )
    book = Book()
    book.add(draft("Open the file as utf-8-sig.", structured=rule))
    other = dataclasses.replace(rule, avoid={**rule.avoid, "variants": [{"encoding": "ascii"}]})
    change = book.add(draft("Excel exports need a BOM-aware codec.", structured=other))
    assert change.action == "merge"
    assert book.only().support == 2


@pytest.mark.parametrize("fix_first", [False, True])
def test_a_lesson_that_names_the_fix_wins_over_one_that_only_forbids(fix_first):
    when = {"tool": "read_csv", "step": "parse", "error_type": "UnicodeDecodeError"}
    utf8 = {"tool": "read_csv", "args": {"encoding": "utf-8"}}
    forbid = draft(
        "When read_csv (step 'parse') fails with UnicodeDecodeError, you should avoid calling "
        "read_csv(encoding='utf-8'): each failed there; try another option first.",
        structured=Structured(when=when, avoid={**utf8, "variants": [{"encoding": "utf-8"}]}),
    )
    fix = draft(
        "When read_csv (step 'parse') fails with UnicodeDecodeError, you should call "
        "read_csv(encoding='gbk') first instead of encoding='utf-8'.",
        structured=Structured(when=when, prefer={"tool": "read_csv", "args": {"encoding": "gbk"}},
                              avoid=utf8),
    )  # fmt: skip
    book = Book()
    for d in [fix, forbid] if fix_first else [forbid, fix]:
        book.add(d)
    lesson = book.only()
    assert lesson.support == 2
    assert lesson.advice == fix.advice and lesson.structured == fix.structured


def test_two_different_fixes_for_one_situation_stay_two_lessons():
    when = {"tool": "read_csv", "error_type": "UnicodeDecodeError"}
    book = Book()
    book.add(
        draft(
            "When read_csv fails with UnicodeDecodeError, call read_csv(encoding='utf-8-sig').",
            structured=Structured(when=when, prefer={"args": {"encoding": "utf-8-sig"}}),
        )
    )
    change = book.add(
        draft(
            "When read_csv fails with UnicodeDecodeError, call read_csv(encoding='latin-1').",
            structured=Structured(when=when, prefer={"args": {"encoding": "latin-1"}}),
        )
    )
    assert change.action == "add"


def test_merge_keeps_the_more_specific_text_and_unions_what_it_learned():
    book = Book()
    book.add(
        draft(
            "Use utf-8-sig to read CSV files.",
            features=Features(tools=["read_csv"], keywords=["bom"]),
            suggestions=["Check the first bytes."],
        )
    )
    change = book.add(
        draft(
            "Use utf-8-sig to read CSV files: read_csv(path, encoding='utf-8-sig').",
            features=Features(tools=["read_csv", "open"], keywords=["utf-8-sig"]),
            suggestions=["Check the first bytes.", "Log the encoding used."],
            general_rule="Know the encoding before parsing.",
        )
    )
    lesson = change.lesson
    assert lesson.advice == "Use utf-8-sig to read CSV files: read_csv(path, encoding='utf-8-sig')."
    assert lesson.features.tools == ["read_csv", "open"]
    assert lesson.features.keywords == ["bom", "utf-8-sig"]
    assert lesson.suggestions == ["Check the first bytes.", "Log the encoding used."]
    assert lesson.general_rule == "Know the encoding before parsing."
    merge = lesson.history[-1]
    assert merge["by"] == "curator" and merge["changes"]["support"] == 2
    assert merge["changes"]["advice"]["from"] == "Use utf-8-sig to read CSV files."


def test_merge_text_writer_is_used_and_its_failure_falls_back():
    book = Book()
    book.add(draft(ENCODING_REWORDED[0]))
    change = book.add(draft(ENCODING_REWORDED[1]), merge_text=lambda a, b: "MERGED: " + a)
    assert change.lesson.advice == "MERGED: " + ENCODING_REWORDED[0]

    def broken(a: str, b: str) -> str:
        raise RuntimeError("LLM down")

    change = book.add(draft(ENCODING_REWORDED[6]), merge_text=broken)
    assert change.action == "merge"
    assert change.lesson.advice == ENCODING_REWORDED[6]


def test_curate_does_not_change_the_lessons_it_is_given():
    book = Book()
    book.add(draft(ENCODING_REWORDED[0]))
    before = orjson.dumps(book.only().to_dict())
    snapshot = list(book.lessons.values())
    curate(draft(ENCODING_REWORDED[1]), snapshot, embedder=EMBEDDER, now=NOW)
    assert orjson.dumps(snapshot[0].to_dict()) == before


def test_repeat_of_an_expired_lesson_revives_it_and_a_rejected_one_stays_rejected():
    book = Book()
    lesson = book.add(draft(ENCODING_REWORDED[0])).lesson
    later = NOW + timedelta(days=40)
    (expired,) = expire_due(list(book.lessons.values()), now=later)
    book.lessons[expired.lesson_id] = expired
    change = book.add(draft(ENCODING_REWORDED[1]), now=later)
    assert change.action == "merge" and change.lesson.lesson_id == lesson.lesson_id
    assert change.lesson.status == "active"
    assert change.lesson.valid_until == iso(later + timedelta(days=30))

    book.lessons[lesson.lesson_id] = reject(change.lesson, by="alice", now=later)
    change = book.add(draft(ENCODING_REWORDED[2]), now=later)
    assert change.action == "merge"
    assert change.lesson.status == "rejected" and change.lesson.support == 3


def test_a_pinned_lesson_stays_pinned_and_never_gets_a_validity_on_merge():
    book = Book()
    lesson = book.add(draft(ENCODING_REWORDED[0])).lesson
    book.lessons[lesson.lesson_id] = pin(lesson, by="alice", now=NOW)
    change = book.add(draft(ENCODING_REWORDED[1]))
    assert change.lesson.pinned and change.lesson.valid_until is None


def test_suspect_drafts_wait_in_review():
    change = Book().add(draft("Use utf-8-sig."), quality="suspect")
    assert change.lesson.status == "needs_review" and change.lesson.quality == "suspect"
    assert review_reasons(change.lesson) == ["suspect quality"]


# -- curation: conflicts ------------------------------------------------------------------------

_ASK = "ask the user for the city before calling get_weather"
_WEN = "调用 get_weather 前{}问用户在哪个城市。"
# Prohibitions said after the act, in the passive, with an idiom or in other Chinese words: each
# merged into the advice it forbids, in either order.
PROHIBITIONS_SAID_OTHERWISE = [
    ("Ask the user for the city before calling get_weather.",
     "Asking the user for the city before calling get_weather should be avoided."),
    ("Ask the user for the city before calling get_weather.",
     "Asking the user for the city before calling get_weather is not recommended."),
    ("Retry fetch_page on a 503.", "Retrying fetch_page on a 503 is discouraged."),
    ("Retry fetch_page on a 503.", "Retrying fetch_page should be avoided on a 503."),
    ("Cache fetch_page results for the same URL.",
     "Caching fetch_page results for the same URL is forbidden."),
    ("Cache fetch_page results for the same URL.",
     "Steer clear of caching fetch_page results for the same URL."),
    ("Ask the user for the city before calling get_weather.", f"It is discouraged to {_ASK}."),
    ("Ask the user for the city before calling get_weather.", f"Under no circumstances {_ASK}."),
    ("Ask the user for the city before calling get_weather.", f"Dont {_ASK}."),
    ("Ask the user for the city before calling get_weather.", f"You cannot {_ASK}."),
    ("Ask the user for the city before calling get_weather.", f"Never, ever {_ASK}."),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("切忌")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("忌")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("严禁")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("莫")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("少")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("不该")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("不宜")),
    ("调用 get_weather 前先问清用户在哪个城市。", _WEN.format("不准")),
    ("调用 get_weather 前先问清用户在哪个城市。", "调用 get_weather 前问用户在哪个城市是大忌。"),
    ("fetch_page 超时后要重试。", "fetch_page 超时后少重试。"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Use utf-8-sig encoding when reading CSV files.",
         "Do not use utf-8-sig encoding when reading CSV files."),
        ("Prefer read_csv with engine='python'.", "Avoid read_csv with engine='python'."),
        ("Always retry get_weather on timeout.", "Never retry get_weather on timeout."),
        ("读取CSV文件时使用utf-8-sig编码。", "读取CSV文件时不要使用utf-8-sig编码。"),
        # "never" said in Chinese (从不 / 从来不 / 绝不): these merged into their opposite.
        ("总是先备份数据库再执行迁移。", "从不先备份数据库再执行迁移。"),
        ("执行迁移前总是备份数据库。", "执行迁移前从不备份数据库。"),
        ("始终备份数据库再执行迁移。", "绝不备份数据库再执行迁移。"),
        ("每次都重试 fetch_page。", "从来不重试 fetch_page。"),
        # A verdict on the act (对 / 错, right / wrong): these merged into their opposite.
        ("重试 fetch_page 是对的。", "重试 fetch_page 是错的。"),
        ("遇到超时时重试 fetch_page 是正确的。", "遇到超时时重试 fetch_page 是错误的。"),
        ("Retrying fetch_page on a timeout is the right call.",
         "Retrying fetch_page on a timeout is the wrong call."),
        ("Passing dtype=str to read_csv is correct.", "Passing dtype=str to read_csv is incorrect."),
        ("It is correct to confirm the city before calling get_weather.",
         "It is wrong to confirm the city before calling get_weather."),
        ("Not retrying fetch_page on a timeout is wrong.",
         "Retrying fetch_page on a timeout is wrong."),
        ("立即重试 fetch_page？这样做是错的。", "立即重试 fetch_page。"),
        # One thing chosen over another, swapped.
        ("Prefer run_sql with a LIMIT over fetching the whole table.",
         "Prefer fetching the whole table over run_sql with a LIMIT."),
        ("Use upload_file rather than upload_chunked for files under 10 MB.",
         "Use upload_chunked rather than upload_file for files under 10 MB."),
        ("小于 10 MB 的文件用 upload_file，而不是 upload_chunked。",
         "小于 10 MB 的文件用 upload_chunked，而不是 upload_file。"),
        ("与其重试 fetch_page，不如直接报错。", "与其直接报错，不如重试 fetch_page。"),
        # The act done where a condition holds by one, where it does not by the other.
        ("Retry the upload unless the server returns 400.",
         "Retry the upload only when the server returns 400."),
        ("Always confirm the city except when the user already named it.",
         "Always confirm the city, even when the user already named it."),
        ("Retry upload_file unless the error is a 413.", "Retry upload_file if the error is a 413."),
        ("重试 fetch_page，除非页面返回 404。", "只在页面返回 404 时重试 fetch_page。"),
        # "never" / "no" on its own after the act, stressed or not.
        ("失败的上传立即重试：永远不要。", "失败的上传立即重试。"),
        ("Immediate retries of failed uploads? No.", "Retry failed uploads immediately."),
        *PROHIBITIONS_SAID_OTHERWISE,
        *[(second, first) for first, second in PROHIBITIONS_SAID_OTHERWISE],
        # 只要 / 重要 / 可能 and then a prohibition: no yes-or-no question (these merged).
        ("调用 refund 时只要不要重复扣款就直接重试。", "调用 refund 时只要重复扣款就直接重试。"),
        ("调用 deploy 时，只要不要跳过灰度，就可以直接发布。", "调用 deploy 时，只要跳过灰度，就可以直接发布。"),
        ("run_sql 删除数据时最重要不要加 WHERE 条件。", "run_sql 删除数据时最重要加 WHERE 条件。"),
        ("该订单可能不能退款，调用 refund 前先告诉用户。", "该订单可能可以退款，调用 refund 前先告诉用户。"),
        # A question and its one-word answer: the answer says which way (these merged).
        ("调用 refund 前，可不可以跳过确认？不可以。", "调用 refund 前，可不可以跳过确认？可以。"),
        ("调用 refund 前，能不能跳过确认？不能。", "调用 refund 前，能不能跳过确认？能。"),
        ("调用 refund 前是否跳过确认？是的。", "调用 refund 前是否跳过确认？否。"),
        ("调用 refund 前，可以跳过确认吗？不行。", "调用 refund 前，可以跳过确认吗？行。"),
        ("Skip the order check before calling refund? Yes.",
         "Skip the order check before calling refund? No."),
        ("Before calling refund, can you skip the order check? Yes, you can.",
         "Before calling refund, can you skip the order check? No, you cannot."),
        ("调用 refund 前，跳过确认，对吗？不可以。", "调用 refund 前，跳过确认，对吗？可以。"),
        # A "no" after a statement forbids what it names, or says a prohibition again; "skip
        # it" after a question about skipping is a yes (the adversarial pass merged these).
        ("Never guess the city for get_weather. Never.", "Guess a default city when calling get_weather."),
        ("调用 get_weather 时不要猜城市，绝对不要。", "调用 get_weather 时猜一个默认城市。"),
        ("调用 refund 前不要跳过确认，千万不要。", "调用 refund 前直接跳过确认。"),
        ("立即重试 refund 容易被封号，不要。", "立即重试 refund。"),
        ("调用 refund 前，可以跳过确认吗？可以跳过。", "调用 refund 前，不要跳过确认。"),
        ("Can you skip the order check before calling refund? You can skip it.",
         "Never skip the order check before calling refund."),
        ("Skipping the order check before calling refund? No.",
         "Always skip the order check before calling refund."),
        # A question put in the negative, an answer with words around it, a choice, quotes,
        # no punctuation, 没问题 / 有问题 (all of these merged).
        ("Shouldn't you check the order before calling refund? Yes.",
         "Never check the order before calling refund."),
        ("Don't you need to check the order before calling refund? Yes.",
         "Never check the order before calling refund."),
        ("Skip the order check before calling refund? The answer is no.",
         "Skip the order check before calling refund? The answer is yes."),
        ("Q: Skip the order check before calling refund? A: No.",
         "Q: Skip the order check before calling refund? A: Yes."),
        ("Skip the order check before calling refund? No... never.",
         "Skip the order check before calling refund? Yes."),
        ('"Skip the order check before calling refund?" No.',
         '"Skip the order check before calling refund?" Yes.'),
        ("调用 refund 前，先核对订单还是直接退款？先核对订单。", "调用 refund 前，先核对订单还是直接退款？直接退款。"),
        ("调用 refund 前，可以跳过确认吗 不可以", "调用 refund 前，可以跳过确认吗 可以"),
        ("调用 refund 前，跳过确认？没问题。", "调用 refund 前，跳过确认？有问题。"),
        ("调用 refund 前，可以跳过确认吗？答：不可以。", "调用 refund 前，可以跳过确认吗？答：可以。"),
        ("调用退款前不应该先核对订单吗？不需要。", "调用退款前先核对订单。"),
        ("调用退款前不应该先核对订单吗？当然应该。", "调用退款前不用核对订单。"),
        ("Skip the order check before calling refund? Short answer: no.",
         "Skip the order check before calling refund."),
        ("退款时可以跳过订单核对吗？结论：不可以。", "退款时跳过订单核对就行。"),
        ("退款时可以跳过订单核对吗？不合适。", "退款时跳过订单核对就行。"),
        ("Hold off on retrying the refund after a timeout.", "Retry the refund after a timeout."),
        # Ignoring is not doing; which end of a list; how often an act pays (these merged).
        ("Honor the Retry-After header.", "Ignore the Retry-After header."),
        ("Respect the Retry-After header on a 429.", "Disregard the Retry-After header on a 429."),
        ("遵守 Retry-After 头。", "忽略 Retry-After 头。"),
        ("Check the newest orders first.", "Check the oldest orders first."),
        ("优先检查最新的订单。", "优先检查最早的订单。"),
        ("It is rarely worth retrying a 400.", "It is usually worth retrying a 400."),
        ("重试400错误很少有用。", "重试400错误通常有用。"),
        ("遇到429时用指数退避重试。", "遇到429时不退避，立刻重试。"),
        # What "except" leaves out; answers in brackets, after an arrow, after "TL;DR".
        ("Retry only on 5xx errors.", "Retry on every error except 5xx."),
        ("Retry all errors except timeouts.", "Retry only timeouts."),
        ("Skip the order check before calling refund? TL;DR: no.",
         "Skip the order check before calling refund."),
        ("Skip the order check before calling refund? (No.)",
         "Skip the order check before calling refund."),
        ("Skip the order check before calling refund? -> No.",
         "Skip the order check before calling refund."),
        # Read as they stand, as before (the first version of the rule above merged these):
        # "isn't it dangerous …" does not approve, "should you not …" asks about not doing it.
        ("Isn't it dangerous to retry the refund after a timeout? Yes.",
         "Retry the refund after a timeout."),
        ("Should you not retry the refund after a timeout? Correct, never.",
         "Retry the refund after a timeout."),
        ("Should the agent not guess the city? Right.", "Guess the city when it is missing."),
    ],
)  # fmt: skip
def test_opposite_advice_in_the_same_scenario_is_a_conflict(first, second):
    book = Book()
    old = book.add(draft(first)).lesson
    change = book.add(draft(second))
    assert change.action == "conflict"
    new, other = change.lesson, change.other
    assert new.status == "needs_review" and new.conflicts == [old.lesson_id]
    assert other is not None and other.lesson_id == old.lesson_id
    assert other.status == "active" and other.conflicts == [new.lesson_id]
    assert other.history[-1]["action"] == "conflict"
    assert review_reasons(new, book.lessons) == [f"conflicts with {old.lesson_id}"]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("重试 fetch_page 是对的。", "应该重试 fetch_page。"),
        ("Retrying fetch_page on a timeout is the right call.", "Retry fetch_page on a timeout."),
        ("It's wrong to retry upload_file on a 400.", "Never retry upload_file on a 400."),
        ("重试 fetch_page 是错误的做法。", "不要重试 fetch_page。"),
        ("Prefer read_csv over read_excel for exported sheets.",
         "Use read_csv rather than read_excel for exported sheets."),
        ("读取导出的表格时优先用 read_csv 而不是 read_excel。",
         "读取导出的表格时用 read_csv，不要用 read_excel。"),
        ("Retry the upload unless the server returns 400.",
         "Retry the upload, except when the server returns 400."),
        ("除非服务器返回 400，否则重试 upload_file。", "重试 upload_file，除非服务器返回 400。"),
        # A verdict on a thing ("the city is wrong") is the situation, not a prohibition.
        ("If the city is wrong, ask the user again before calling get_weather.",
         "Ask the user again before calling get_weather when the city is wrong."),
        ("Use upload_chunked for files over 10 MB.", "Use upload_chunked for any file over 10 MB."),
        # A prohibition said after the act or in other words is the same prohibition.
        (f"Avoid {_ASK.replace('ask', 'asking', 1)}.",
         "Asking the user for the city before calling get_weather should be avoided."),
        ("Never retry fetch_page on a 503.", "Retrying fetch_page on a 503 should be avoided."),
        ("Retrying fetch_page on a 503 is discouraged.", "Don't retry fetch_page on a 503."),
        (f"Do not {_ASK}.", "Asking the user for the city before calling get_weather is not recommended."),
        (f"Don't {_ASK}.", f"Dont {_ASK}."),
        (f"Don't {_ASK}.", f"Under no circumstances {_ASK}."),
        (_WEN.format("不要"), _WEN.format("切忌")),
        (_WEN.format("别"), _WEN.format("严禁")),
        (_WEN.format("禁止"), _WEN.format("不准")),
        ("fetch_page 超时后不要重试。", "fetch_page 超时后莫重试。"),
        # 至少 / 不准确 / 允不允许 / 该不该 are no prohibitions.
        ("调用 get_weather 前至少问一次用户在哪个城市。", "调用 get_weather 前先问清用户在哪个城市。"),
        ("调用 get_weather 前问清用户在哪个城市，不然结果不准确。", "调用 get_weather 前先问清用户在哪个城市。"),
        ("用 fetch_page 抓取前先看 robots.txt 是否允许抓取。", "用 fetch_page 抓取前先看 robots.txt 允不允许抓取。"),
        ("fetch_page 超时后先问用户是否重试。", "fetch_page 超时后先问用户该不该重试。"),
        # 要不要 / 能不能 / 可不可以 / 需不需要 ask about an act: they forbid nothing.
        ("fetch_page 超时后先问用户是否重试。", "fetch_page 超时后先问用户要不要重试。"),
        ("开票前先问用户是否需要纸质发票。", "开票前先问用户要不要纸质发票。"),
        ("调用 issue_refund 前先确认订单是否可以退款。", "调用 issue_refund 前先确认订单能不能退款。"),
        ("调用 change_ticket 前先问航司是否可以改签。", "调用 change_ticket 前先问航司可不可以改签。"),
        ("调用 get_weather 前先问用户是否需要未来三天的预报。",
         "调用 get_weather 前先问用户需不需要未来三天的预报。"),
        # A question answered "no" is the prohibition of what it asks about; "yes", the order.
        ("调用 refund 前，可不可以跳过确认？不可以。", "调用 refund 前，不要跳过确认。"),
        ("调用 refund 前，可不可以跳过确认？可以。", "调用 refund 前，可以跳过确认。"),
        ("Skip the order check before calling refund? No.",
         "Never skip the order check before calling refund."),
        ("Before calling refund, can you skip the order check? No, you cannot.",
         "Never skip the order check before calling refund."),
        ("调用 refund 前，跳过确认，对吗？不可以。", "调用 refund 前，不要跳过确认。"),
        ("Never guess the city for get_weather, no.", "Never guess the city for get_weather."),
        ("Don't call refund before verifying the order. Never.", "Verify the order before calling refund."),
        ("Shouldn't you check the order before calling refund? Yes.",
         "Always check the order before calling refund."),
        ("Isn't it better to check the order before calling refund? Yes.",
         "Always check the order before calling refund."),
        ("Shouldn't you skip the order check before calling refund? No.",
         "Never skip the order check before calling refund."),
        ("Skip the order check before calling refund? The answer is no.",
         "Never skip the order check before calling refund."),
        ("调用 refund 前，跳过确认？有问题。", "调用 refund 前，不要跳过确认。"),
        ("Honor the Retry-After header.", "Don't ignore the Retry-After header."),
        ("Retry every error except 4xx.", "Retry every error other than 4xx."),
        ("Ignore failing health checks during deploy. No, never.",
         "Never ignore failing health checks during deploy."),
        # An answer turning an option down, or naming it in a word, reads as it stands.
        ("Guess the city or ask the user? Never guess.",
         "Ask the user for the city instead of guessing it."),
        ("直接退款还是先核对订单？别直接退款。", "调用退款前先核对订单。"),
        ("直接退款还是先核对订单？当然是先核对。", "调用退款前先核对订单。"),
        ("Fetch all pages or only the first? Only the first.", "Fetch only the first page."),
        # An answer naming no option of a choice makes none: the question reads as before.
        ("Is the export UTF-8 or GBK? Check the BOM before calling read_csv.",
         "Is the export UTF-8 or GBK? Check the BOM before you call read_csv."),
    ],
)  # fmt: skip
def test_a_verdict_a_choice_or_a_condition_reworded_is_a_repeat(first, second):
    book = Book()
    book.add(draft(first))
    assert book.add(draft(second)).action == "merge"


def test_prefer_and_avoid_swapped_is_a_conflict():
    when = {"tool": "read_csv", "error_type": "UnicodeDecodeError"}
    sig, latin = {"args": {"encoding": "utf-8-sig"}}, {"args": {"encoding": "latin-1"}}
    book = Book()
    book.add(draft("Prefer utf-8-sig.", structured=Structured(when=when, prefer=sig, avoid=latin)))
    change = book.add(
        draft("Prefer latin-1.", structured=Structured(when=when, prefer=latin, avoid=sig))
    )
    assert change.action == "conflict"


def test_one_structured_form_with_words_that_say_the_opposite_is_a_conflict():
    rule = Structured(
        when={"tool": "read_csv", "error_type": "UnicodeDecodeError"},
        prefer={"tool": "read_csv", "args": {"encoding": "gbk"}},
        avoid={"tool": "read_csv", "args": {"encoding": "utf-8"}},
    )
    book = Book()
    kept = book.add(draft(
        "When read_csv fails with UnicodeDecodeError, retry it with encoding='gbk' instead of "
        "encoding='utf-8'.", structured=rule,
    )).lesson  # fmt: skip
    change = book.add(draft(
        "Never retry read_csv with encoding='gbk' after a UnicodeDecodeError: gbk silently "
        "garbles these files; ask the user for the encoding.", structured=rule,
    ))  # fmt: skip
    # Before: merged on the form alone, and the kept advice became "Never retry … gbk".
    assert change.action == "conflict"
    assert book.lessons[kept.lesson_id].advice == kept.advice


def test_a_negated_rewording_is_a_repeat_not_a_conflict():
    book = Book()
    book.add(draft("Read CSV files with encoding='utf-8-sig'."))
    change = book.add(draft("Don't read CSV files as plain utf-8; pick encoding='utf-8-sig'."))
    assert change.action == "merge"


def test_contradicting_a_rejected_lesson_is_no_conflict():
    book = Book()
    old = book.add(draft("Use utf-8-sig encoding when reading CSV files.")).lesson
    book.lessons[old.lesson_id] = reject(old, by="alice", now=NOW)
    change = book.add(draft("Do not use utf-8-sig encoding when reading CSV files."))
    assert change.action == "add" and change.lesson.status == "active"


def test_a_repeat_of_the_lesson_in_review_merges_into_it():
    book = Book()
    book.add(draft("Use utf-8-sig encoding when reading CSV files."))
    flagged = book.add(draft("Do not use utf-8-sig encoding when reading CSV files.")).lesson
    change = book.add(draft("Never use utf-8-sig encoding when you read CSV files."))
    assert change.action == "merge" and change.lesson.lesson_id == flagged.lesson_id
    assert change.lesson.status == "needs_review" and len(book) == 2


# -- feedback -----------------------------------------------------------------------------------


def test_a_lesson_injected_into_five_failed_tasks_in_a_row_drops_out_and_shows_in_review():
    lesson = Book().add(draft(ENCODING_REWORDED[0])).lesson
    scores = [lesson.value_score]
    for i in range(5):
        lesson = apply_outcome(
            lesson, succeeded=False, now=NOW + timedelta(hours=i), task_id=f"t{i}"
        )
        scores.append(lesson.value_score)
    assert lesson.harmful == 5 and lesson.helpful == 0
    assert lesson.status == "needs_review"
    assert not lesson.is_live(NOW + timedelta(days=1))  # recall's rule stage drops it
    assert scores == sorted(scores, reverse=True) and scores[-1] < 0.2
    flags = [h for h in lesson.history if h["action"] == "flag_harmful"]
    assert (
        len(flags) == 1 and flags[0]["by"] == "feedback" and flags[0]["changes"]["task_id"] == "t2"
    )
    assert review_reasons(lesson) == ["harmful: hurt 5 times, helped 0"]


def test_a_helpful_lesson_survives_a_few_failures():
    lesson = Book().add(draft(ENCODING_REWORDED[0])).lesson
    for _ in range(4):
        lesson = apply_outcome(lesson, succeeded=True, now=NOW)
    for _ in range(3):
        lesson = apply_outcome(lesson, succeeded=False, now=NOW)
    assert lesson.status == "active" and not keeps_hurting(lesson)


def test_success_keeps_a_date_a_person_set():
    """A person's edit of ``valid_until`` is theirs: a successful task moved it 30 days on."""
    lesson = Book().add(draft(ENCODING_REWORDED[0])).lesson
    until = iso(NOW + timedelta(days=2))
    dated = edit(lesson, by="alice", now=NOW, valid_until=until)
    helped = apply_outcome(dated, succeeded=True, now=NOW + timedelta(days=1))
    assert helped.valid_until == until and helped.helpful == 1
    # An edit of something else leaves the date the machine's to move.
    renamed = edit(lesson, by="alice", now=NOW, advice=lesson.advice + " Always.")
    later = NOW + timedelta(days=20)
    assert apply_outcome(renamed, succeeded=True, now=later).valid_until == iso(
        later + timedelta(days=30)
    )


def test_success_extends_validity_and_failure_does_not():
    lesson = Book().add(draft(ENCODING_REWORDED[0])).lesson
    later = NOW + timedelta(days=20)
    helped = apply_outcome(lesson, succeeded=True, now=later)
    assert helped.valid_until == iso(later + timedelta(days=30))
    hurt = apply_outcome(lesson, succeeded=False, now=later)
    assert hurt.valid_until == lesson.valid_until


def test_confirming_a_harmful_lesson_gives_it_a_fresh_start():
    lesson = Book().add(draft(ENCODING_REWORDED[0])).lesson
    for _ in range(3):
        lesson = apply_outcome(lesson, succeeded=False, now=NOW)
    assert lesson.status == "needs_review"
    lesson = confirm(lesson, by="alice", now=NOW)
    assert lesson.status == "active" and review_reasons(lesson) == []
    assert lesson.history[-1]["counts"] == {"helpful": 0, "harmful": 3}
    lesson = apply_outcome(lesson, succeeded=False, now=NOW)
    assert lesson.status == "active"  # one failure since the person vouched for it
    for _ in range(2):
        lesson = apply_outcome(lesson, succeeded=False, now=NOW)
    assert lesson.status == "needs_review"


def test_value_score_combines_outcomes_support_and_recency():
    base = Lesson(lesson_id="les_x", task_type="t", advice="a", updated_at=iso(NOW))
    fresh = value_score(base, NOW)
    assert 0.0 <= fresh <= 1.0
    helped = dataclasses.replace(base, helpful=5)
    hurt = dataclasses.replace(base, harmful=5)
    supported = dataclasses.replace(base, support=10)
    assert value_score(helped, NOW) > fresh > value_score(hurt, NOW)
    assert value_score(supported, NOW) > fresh
    assert value_score(base, NOW + timedelta(days=90)) < fresh
    extreme = dataclasses.replace(base, helpful=10_000, support=10_000)
    assert value_score(extreme, NOW) <= 1.0
    assert value_score(dataclasses.replace(base, harmful=10_000), NOW + timedelta(days=3650)) >= 0


# -- expiry -------------------------------------------------------------------------------------


def test_expire_due_marks_only_active_unpinned_lessons_past_their_date():
    book = Book()
    due = book.add(draft(DISTINCT_CSV[0])).lesson
    pinned = pin(book.add(draft(DISTINCT_CSV[1])).lesson, by="alice", now=NOW)
    review = edit(book.add(draft(DISTINCT_CSV[2])).lesson, by="alice", status="needs_review")
    later = book.add(draft(DISTINCT_CSV[3]), now=NOW + timedelta(days=20)).lesson
    lessons = [due, pinned, review, later]
    expired = expire_due(lessons, now=NOW + timedelta(days=31))
    assert [x.lesson_id for x in expired] == [due.lesson_id]
    assert expired[0].status == "expired"  # kept, marked, never deleted
    assert expired[0].history[-1]["action"] == "expire" and expired[0].history[-1]["by"] == "system"
    assert due.status == "active"  # the input is untouched
    assert expire_due(lessons, now=NOW + timedelta(days=3650))[-1].lesson_id == later.lesson_id
    assert pinned.lesson_id not in {
        x.lesson_id for x in expire_due(lessons, now=datetime.max.replace(tzinfo=UTC))
    }


# -- people in charge ---------------------------------------------------------------------------


def test_edit_records_who_when_and_what():
    lesson = Book().add(draft("Use utf-8-sig.")).lesson
    edited = edit(
        lesson,
        by="alice",
        now=NOW + timedelta(hours=1),
        advice="  Use encoding='utf-8-sig' with read_csv.  ",
        tools=["read_csv"],
        scope="project:billing",
    )
    assert edited.advice == "Use encoding='utf-8-sig' with read_csv."
    assert edited.features.tools == ["read_csv"] and edited.scope == "project:billing"
    entry = edited.history[-1]
    assert entry == {
        "at": iso(NOW + timedelta(hours=1)),
        "by": "alice",
        "action": "edit",
        "changes": {
            "advice": {"from": "Use utf-8-sig.", "to": "Use encoding='utf-8-sig' with read_csv."},
            "tools": {"from": [], "to": ["read_csv"]},
            "scope": {"from": "global", "to": "project:billing"},
        },
    }
    assert lesson.advice == "Use utf-8-sig."  # edit returns a copy
    assert edit(edited, by="bob", scope="project:billing").history == edited.history


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lesson_id": "x"}, "cannot edit 'lesson_id'"),
        ({"scope": "org:x"}, "use 'global', 'project:NAME', 'user:NAME'"),
        ({"status": "gone"}, "status must be one of"),
        ({"advice": "  "}, "'advice' must be non-empty text"),
        ({"valid_until": "next week"}, "ISO date"),
        ({"intent": "chat"}, "intent must be one of"),
        ({"pinned": "yes"}, "true or false"),
    ],
)
def test_edit_refuses_bad_changes(changes, message):
    lesson = Book().add(draft("Use utf-8-sig.")).lesson
    with pytest.raises(ValueError, match=message):
        edit(lesson, by="alice", **changes)


def test_pin_unpin_reject_confirm():
    lesson = Book().add(draft("Use utf-8-sig.")).lesson
    pinned = pin(lesson, by="alice", now=NOW)
    assert (
        pinned.pinned
        and pinned.valid_until is None
        and pinned.is_live(datetime.max.replace(tzinfo=UTC))
    )
    unpinned = unpin(pinned, by="alice", now=NOW)
    assert not unpinned.pinned and unpinned.valid_until == iso(NOW + timedelta(days=30))
    rejected = reject(unpinned, by="bob", now=NOW, reason="wrong for SAP exports")
    assert (
        rejected.status == "rejected" and rejected.history[-1]["reason"] == "wrong for SAP exports"
    )
    assert review_reasons(rejected) == []
    stale = confirm(rejected, by="carol", now=NOW + timedelta(days=60))
    assert stale.status == "active" and stale.is_live(NOW + timedelta(days=61))
    assert [h["action"] for h in stale.history] == ["create", "pin", "unpin", "reject", "confirm"]
    assert [h["by"] for h in stale.history[1:]] == ["alice", "alice", "bob", "carol"]


def test_check_scope():
    assert check_scope("global") == "global"
    assert check_scope("user:alice") == "user:alice"
    assert check_scope("project:数据") == "project:数据"
    assert check_scope("agent:Excel_Expert") == "agent:Excel_Expert"  # one role's own lessons
    assert check_scope("team:data") == "team:data"  # a team's collaboration lessons
    for bad in ("", "user:", "org:x", "team:", "USER:alice", "user: alice"):
        with pytest.raises(ValueError, match="invalid scope"):
            check_scope(bad)


# -- import and export --------------------------------------------------------------------------


def test_a_hand_written_line_needs_only_task_type_and_advice():
    lesson = parse_import_line({"task_type": "csv_cleaning", "advice": "Use utf-8-sig."}, now=NOW)
    assert lesson.lesson_id.startswith("les_")
    assert lesson.status == "active" and lesson.scope == "global" and lesson.support == 1
    assert lesson.valid_until == iso(NOW + timedelta(days=30))
    assert lesson.history[0]["action"] == "import"
    assert lesson.is_live(NOW)


def test_a_hand_written_line_with_every_optional_field():
    line = {
        "task_type": "weather_query",
        "advice": "调用 get_weather 前先确认城市。",
        "tools": ["get_weather"],
        "intent": "query",
        "scope": "user:alice",
        "keywords": ["城市", "city"],
        "valid_until": "2025-06-30",
        "status": "needs_review",
        "pinned": False,
    }
    lesson = parse_import_line(line, now=NOW)
    assert lesson.features.tools == ["get_weather"] and lesson.features.intent == "query"
    assert lesson.features.keywords == ["城市", "city"] and lesson.scope == "user:alice"
    assert lesson.valid_until == "2025-06-30T00:00:00.000Z" and lesson.status == "needs_review"
    assert lesson.language == "zh"
    pinned = parse_import_line({**line, "pinned": True, "status": "active"}, now=NOW)
    assert pinned.pinned and pinned.valid_until is None


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (["advice"], "expected a JSON object, got list"),
        ({"task_type": "t"}, "missing 'advice'"),
        ({"advice": "x"}, "missing 'task_type'"),
        ({"task_type": "t", "advice": "  "}, "missing 'advice'"),
        ({"task_type": "t", "advice": "x", "tool": ["a"]}, "unknown field 'tool' \\(did you mean 'tools'\\?\\)"),
        ({"task_type": "t", "advice": "x", "scope": "org:a"}, "invalid scope 'org:a'"),
        ({"task_type": "t", "advice": "x", "status": "live"}, "status must be one of"),
        ({"task_type": "t", "advice": "x", "pinned": "yes"}, "'pinned' must be true or false"),
        ({"task_type": "t", "advice": "x", "valid_until": "soon"}, "'valid_until' must be an ISO date"),
        ({"task_type": "t", "advice": "x", "tools": [1]}, "'tools' must be a list of strings"),
        ({"task_type": "t", "advice": "x", "intent": "chat"}, "intent must be one of"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "status": "??"}, "status must be"),
        # Restored lines whose inner shapes broke every later recall or review, or broke the
        # import half-way with a traceback once earlier lines were written.
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "value_score": "high"}, "'value_score' must be a number"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "hit_count": "many"}, "'hit_count' must be a whole number"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "language": 5}, "'language' must be text"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "updated_at": "yesterday"}, "'updated_at' must be an ISO date"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "features": {"step": {"x": 1}}}, "'step' must be text or null"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "features": {"intent": "destroy"}}, "intent must be one of"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "history": [{"changes": "oops"}]}, "history entry 0: 'changes'"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "history": [{"changes": {"merges": "lots"}}]}, "history entry 0: counts"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "history": [{"counts": {"helpful": "x"}}]}, "history entry 0: counts"),
        ({"lesson_id": "les_1", "task_type": "t", "advice": "x", "structured": {"when": {}, "prefer": "x"}}, "'prefer' and 'avoid' must be objects"),
        ({"task_type": "t", "advice": "x" * 5000}, "'advice' is 5,000 characters; at most 4,000"),
        ({"task_type": "t", "advice": "x", "root_cause": 7}, "'root_cause' must be text"),
    ],
)  # fmt: skip
def test_import_lines_with_problems_say_what_is_wrong(obj, message):
    with pytest.raises(ValueError, match=message):
        parse_import_line(obj)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("9999-12-31T23:00:00-05:00", "9999-12-31T23:59:59.999Z"),  # was refused as "not ISO"
        ("0001-01-01T00:00:00+05:00", "0001-01-01T00:00:00.000Z"),
        ("0999-03-04", "0999-03-04T00:00:00.000Z"),  # was stored as "999-03-04…", unreadable
    ],
)
def test_dates_at_the_ends_of_time_are_kept_readable(given, stored):
    lesson = parse_import_line({"task_type": "t", "advice": "x", "valid_until": given})
    assert lesson.valid_until == stored
    assert parse_import_line(lesson.to_dict()).valid_until == stored


def test_export_jsonl_round_trips_through_import():
    book = Book()
    for text in DISTINCT_CSV[:3]:
        book.add(draft(text, features=Features(tools=["read_csv"]), source_task_ids=["tsk_1"]))
    lessons = list(book.lessons.values())
    lessons[0] = pin(apply_outcome(lessons[0], succeeded=True, now=NOW), by="alice", now=NOW)
    lessons[1] = dataclasses.replace(
        lessons[1], structured=Structured(when={"tool": "read_csv"}, avoid={"args": {"sep": ","}})
    )
    text = export_jsonl(lessons)
    assert text.count("\n") == 3 and '"score"' not in text
    back = [parse_import_line(orjson.loads(line)) for line in text.splitlines()]
    assert [x.to_dict() for x in back] == [x.to_dict() for x in lessons]


def test_export_markdown_is_a_readable_knowledge_base():
    book = Book()
    book.add(draft("Use encoding='utf-8-sig' with read_csv.", root_cause="Excel writes a BOM."))
    book.add(draft("调用 get_weather 前先确认城市。", task_type="weather_query"))
    text = export_markdown(list(book.lessons.values()))
    assert text.startswith("# Lessons\n")
    assert "## csv_cleaning" in text and "## weather_query" in text
    assert "### Use encoding='utf-8-sig' with read_csv." in text
    assert "**Root cause.** Excel writes a BOM." in text
    assert "### 调用 get_weather 前先确认城市。" in text
    for lesson in book.lessons.values():
        assert f"`{lesson.lesson_id}`" in text
    assert "_No lessons._" in export_markdown([])


def test_import_of_a_hand_written_lesson_curates_like_any_other():
    book = Book()
    book.add(draft(ENCODING_REWORDED[0]))
    line = parse_import_line({"task_type": "csv_cleaning", "advice": ENCODING_REWORDED[1]})
    assert book.add(line).action == "merge"
    line = parse_import_line(
        {"task_type": "csv_cleaning", "advice": DISTINCT_CSV[1], "pinned": True}
    )
    change = book.add(line)
    assert change.action == "add" and change.lesson.lesson_id == line.lesson_id
    assert change.lesson.pinned and change.lesson.valid_until is None


def test_draft_to_lesson():
    d = draft("Use utf-8-sig.", scope="user:alice", source_task_ids=["tsk_1"], kind="full_review")
    lesson = draft_to_lesson(d, now=NOW, validity=timedelta(days=7))
    assert lesson.lesson_id.startswith("les_") and lesson.kind == "full_review"
    assert lesson.created_at == lesson.updated_at == iso(NOW)
    assert parse_ts(lesson.valid_until) == NOW + timedelta(days=7)
    assert lesson.history == [
        {
            "at": iso(NOW),
            "by": "curator",
            "action": "create",
            "changes": {"source_task_ids": ["tsk_1"]},
        }
    ]
    with pytest.raises(ValueError, match="invalid scope"):
        draft_to_lesson(draft("x", scope="everyone"))


def test_the_token_patterns_start_only_where_a_run_starts_and_find_what_they_found() -> None:
    """The concrete-token, identifier and assignment patterns start a match only where a run
    of their characters starts (a lookbehind): a long run without a match ("timeout error
    aaaa…", 8,000 letters, took 2 s per ``stance``) is read once, not once per character. What
    they find is what the patterns without the lookbehind find, on strings made of the
    characters that matter to them (a seeded generator, English and Chinese)."""
    import random
    import re

    from hindsight_loop import lessons

    before = {
        "_CONCRETE_RE": r"[\w.=/:'\"`-]*[\d_=./:'\"`-][\w.=/:'\"`-]*",
        "_IDENTIFIER_RE": r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+",
        "_ASSIGNED_RE": r"([A-Za-z_][\w.-]*)\s*=\s*(?:'[^']*'|\"[^\"]*\"|[^\s,;，。；]+)",
    }
    alphabet = "aZ9_=.-/:'\"` ,;，。；值x1城b"
    rng = random.Random(7)
    texts = [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(4000)
    ]
    texts += ["--encoding=utf-8-sig", "9abc_def x.y=1 -sep=';'", "值=1 read_csv_file 用utf_8"]
    texts += ["a9" * 50 + "_b", "城9" * 30 + "x=1", "设置encoding='utf-8'", "3d_model 2fa_code"]
    for name, pattern in before.items():
        old, new = re.compile(pattern), getattr(lessons, name)
        assert new.pattern != pattern  # the lookbehind is there
        for text in texts:
            assert new.findall(text) == old.findall(text), (name, text)
            if name != "_CONCRETE_RE":  # their match starts where the run does: the name's
                # own text (group 1 on) is what the old pattern matched, and is what goes
                spans = [text[m.start(1) : m.end()] for m in new.finditer(text)]
                assert spans == [m[0] for m in old.finditer(text)], (name, text)
    old_identifier = re.compile(before["_IDENTIFIER_RE"])
    for text in texts:
        assert lessons._IDENTIFIER_RE.sub(lessons._unname, text) == old_identifier.sub(" ", text)


def test_the_plain_reading_of_advice_reads_a_run_of_spaces_once() -> None:
    """The "over" of "prefer X over Y" is tried only where a run of spaces starts (tried from
    each space of a long run it read the run to its end each time), and finds what the pattern
    without the lookbehind finds; ``_plain`` reads 30,000 spaces as it reads one."""
    import random
    import re

    from hindsight_loop import lessons

    old = re.compile(lessons._OVER_RE.pattern.replace("(?<!\\s)", ""), re.I)
    assert old.pattern != lessons._OVER_RE.pattern
    rng = random.Random(11)
    texts = [
        "".join(rng.choice("  over x1—,") for _ in range(rng.randrange(1, 40))) for _ in range(3000)
    ]
    for text in texts + ["prefer a   over b", "prefer a over  10 MB"]:
        assert [m.span() for m in lessons._OVER_RE.finditer(text)] == [
            m.span() for m in old.finditer(text)
        ], text
    spaces = lessons._plain("Prefer fetch_page" + " " * 30_000 + "over fetch_cached — never.")
    assert " ".join(spaces.split()) == "Prefer fetch_page instead of fetch_cached — never ."


def test_advice_is_split_into_clauses_reading_a_run_of_spaces_once() -> None:
    """A clause split starts at a dash or at "but" / "then" / "so you" after a space (``\\s*—+``
    and ``\\s+but`` were tried from each space of a run and read it to its end each time:
    minutes for 30,000 spaces); the clauses, stripped, are those the old patterns cut wherever
    a connective follows a word. (After a clause end, "— but retry", the old split had taken the
    space the connective needed and left it in the clause; now it goes as it does elsewhere.)"""
    import random
    import re

    from hindsight_loop import lessons

    old_order = re.compile(r"[；。!?！？，：\n]+|[;,:](?=\s|$)|\.(?=\s|$)|\s*—+\s*")
    old_clause = re.compile(
        r"[；。!?！？，：\n]+|[;,:](?=\s|$)|\.(?=\s|$)|\s*—+\s*|\s+(?:but|then|and then)\s+"
        r"|\s+(?=so\s+(?:that\b|(?:you|we|it|they|he|she|this|these|those|there|nothing)\b))",
        re.I,
    )

    def clauses(pattern: re.Pattern[str], text: str) -> list[str]:
        return [c.strip() for c in pattern.split(text) if c.strip()]

    rng = random.Random(7)
    words, ends = ["ask", "x", "retry", "that", "you"], ["—", "——", ",", ".", "\n"]
    connectives = ["but", "BUT", "then", "and then", "so"]
    texts = []
    for _ in range(5000):
        tokens = [rng.choice(words)]
        for _ in range(rng.randrange(0, 25)):
            pool = words + ends + (connectives if tokens[-1] in words else [])
            tokens.append(rng.choice(words) if tokens[-1] in connectives else rng.choice(pool))
        texts.append("".join(t + rng.choice(["", " ", "  ", "   "]) for t in tokens))
    for text in texts:
        assert clauses(lessons._CLAUSE_SPLIT_RE, text) == clauses(old_clause, text), text
        assert clauses(lessons._ORDER_SPLIT_RE, text) == clauses(old_order, text), text
    # "wait on the webhook" waits for it; "hold off on retrying" does not retry.
    assert lessons.stance("Wait on the payment webhook before shipping.")["webhook"] > 0
    assert lessons.stance("Hold off on retrying the refund.")["xretry"] < 0
    # A "never" after an act that skips is not read as a warning said again.
    assert lessons.stance("Skip the canary stage. Never.") != lessons.stance(
        "Skip the canary stage."
    )
    spaced = "Retry fetch_page" + " " * 30_000 + "x"
    assert lessons.stance(spaced) == lessons.stance("Retry fetch_page x")
    assert lessons.stance("Ask first" + " " * 30_000 + "but never retry") == lessons.stance(
        "Ask first but never retry"
    )
