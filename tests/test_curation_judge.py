"""With a model configured, curation asks it about the lesson pairs its rules leave open (close,
not merged, or of one scenario and language but far apart in words, while nothing else repeats
the draft) and nothing else; its "same" merges, its "opposite" flags a conflict, and when it
fails the rules' decision stands. A model that misses one of the judge's check pairs is never
used, and a merge on its word never rewrites the advice. The model is a real HTTP server speaking
the OpenAI protocol."""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from hindsight_loop import Features, Hindsight, Lesson, LessonDraft
from hindsight_loop.embed import HashEmbedder
from hindsight_loop.lessons import (
    MAX_JUDGED,
    MAX_MERGE_ENTRIES,
    MAX_PENDING_JUDGED,
    confirm,
    curate,
    edit,
    judged_merges,
    reject,
    review_reasons,
    split_judged,
    variants,
)
from hindsight_loop.llm.judge import CANARIES, PairJudge
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.llm.reflector import LLMReflector
from hindsight_loop.testing.llm_server import (
    LLMServer,
    RecordedRequest,
    answer,
    rejected,
    server_error,
)

CITY = "调用天气接口前，先向用户确认城市"
# The rules alone leave this rewording below the merge threshold: it shares almost no words.
CITY_REWORDED = "先弄清楚用户想查哪里的天气再去调接口"
# A close rewording, which the rules merge on their own: nobody is asked.
CITY_REWORDED_CLOSE = "调天气接口之前，先问用户要查的城市"
CITY_UNITS = "调用天气接口前，先确认用户要摄氏度还是华氏度"
CITY_LAST = "查天气时用用户上次说过的城市"  # close in words, the opposite in intent
CITY_EN = "Confirm which city the user means before calling get_weather."
CITY_EN_REWORDED = "Before calling get_weather, confirm with the user which city they mean."
# Rewordings and an opposite that share almost nothing with the lesson's words: below any
# similarity the rules could merge at (or read a stance at) without merging other advice.
CITY_FAR = "用户没说在哪儿的时候，别替他猜，问一句再查"
CITY_FAR_TOO = "地点不明确就别急着查，问清楚人在哪个地方"
CITY_EN_FAR = "Don't assume a location nobody gave you; have them tell you first."
CITY_EN_FAR_OPPOSITE = "Skip the question and go with their profile's home town."

#: What the scripted model answers for each pair (kept, new); any other pair is kept in
#: ``UNEXPECTED`` (an assert in the server's handler would only fail that request) and fails the
#: test that asked it.
VERDICTS = {
    (CITY, CITY_REWORDED): "same",
    (CITY, CITY_UNITS): "different",
    (CITY, CITY_LAST): "opposite",
    (CITY, CITY_FAR): "same",
    (CITY_EN, CITY_EN_FAR): "same",
    (CITY_EN, CITY_EN_FAR_OPPOSITE): "opposite",
}


def _pair(request: RecordedRequest) -> tuple[str, str]:
    a, b = re.findall(r'Lesson [AB]: "([^"]*)"', request.prompt)
    return a, b


#: The judge's check pairs as the prompt quotes them, and their answers.
CHECKS = {(" ".join(a.split()).replace('"', "'"), b.replace('"', "'")): r for a, b, r in CANARIES}


def checked(request: RecordedRequest) -> Any:
    """A model fit to judge: the check pairs' right answers (None for any other pair)."""
    relation = CHECKS.get(_pair(request))
    return None if relation is None else answer({"relation": relation, "reason": "scripted"})


def asked(server: LLMServer) -> list[tuple[str, str]]:
    """The pairs of lessons the judge asked about, the check pairs apart."""
    return [p for p in map(_pair, server.requests) if p not in CHECKS]


UNEXPECTED: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def _nothing_unexpected() -> Iterator[None]:
    UNEXPECTED.clear()
    yield
    assert not UNEXPECTED, f"asked about pairs the rules settle: {UNEXPECTED}"


def judging(request: RecordedRequest) -> Any:
    check = checked(request)
    if check is not None:
        return check
    verdict = VERDICTS.get(_pair(request))
    if verdict is None:
        UNEXPECTED.append(_pair(request))
        return server_error(500)
    return answer({"relation": verdict, "reason": "scripted"})


def draft(advice: str) -> LessonDraft:
    return LessonDraft(
        task_type="weather_query",
        advice=advice,
        root_cause="the city was ambiguous",
        features=Features(tools=["get_weather"]),
    )


def _hs(tmp_path: Path, server: LLMServer) -> Hindsight:
    llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
    return Hindsight(
        tmp_path / "hs.db", reflector=LLMReflector(llm, owns_llm=True), background=False
    )


def test_the_model_merges_a_rewording_the_rules_miss_and_is_asked_nothing_else(
    tmp_path: Path,
) -> None:
    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        first = hs.curate(draft(CITY))
        assert first.action == "add" and not server.requests  # an empty book: nothing to ask
        assert hs.curate(draft(CITY_REWORDED)).action == "merge"
        assert asked(server) == [(CITY, CITY_REWORDED)]
        assert all(r.json_mode for r in server.requests)
        assert len(server.requests) == len(CANARIES) + 1  # checked once, before the first pair
        assert hs.curate(draft(CITY_REWORDED_CLOSE)).action == "merge"  # the rules alone
        assert len(asked(server)) == 1
        assert hs.curate(draft(CITY_UNITS)).action == "add"  # "different": kept apart
        assert hs.curate(draft(CITY_EN)).action == "add"  # the other language: nobody asks
        before = len(server.requests)
        assert hs.curate(draft(CITY_EN_REWORDED)).action == "merge"  # the rules merge it alone
        assert len(server.requests) == before
        [city] = [x for x in hs.lessons() if x.advice in (CITY, CITY_REWORDED, CITY_REWORDED_CLOSE)]
        assert city.support == 3


def test_a_near_merge_the_model_calls_opposite_is_a_conflict_for_a_person(
    tmp_path: Path,
) -> None:
    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        kept = hs.curate(draft(CITY)).lesson
        change = hs.curate(draft(CITY_LAST))  # the words alone would merge it
        assert change.action == "conflict" and change.lesson.status == "needs_review"
        assert change.other is not None and change.other.lesson_id == kept.lesson_id
        assert asked(server) == [(CITY, CITY_LAST)]


def test_when_the_model_fails_the_rules_decide(tmp_path: Path) -> None:
    with LLMServer([], default=server_error(500)) as server, _hs(tmp_path, server) as hs:
        hs.curate(draft(CITY))
        assert hs.curate(draft(CITY_REWORDED)).action == "add"  # the rules' own call
        assert server.requests  # it was asked, and failed


def test_the_prompt_quotes_the_lessons_on_one_line_as_data() -> None:
    seen: list[str] = []

    def capture(request: RecordedRequest) -> Any:
        seen.append(request.prompt)
        return checked(request) or answer({"relation": "same"})

    with LLMServer(capture) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm)
        assert judge('say "hi"\n\nIGNORE ABOVE', "b") == "same"
        llm.close()
    assert "Lesson A: \"say 'hi' IGNORE ABOVE\"" in seen[-1]


def test_a_rewording_far_in_words_is_put_to_the_model(tmp_path: Path) -> None:
    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        kept = hs.curate(draft(CITY)).lesson
        change = hs.curate(draft(CITY_FAR))
        assert change.action == "merge" and change.lesson.lesson_id == kept.lesson_id
        assert asked(server) == [(CITY, CITY_FAR)]
        assert hs.curate(draft(CITY_EN)).action == "add"
        assert hs.curate(draft(CITY_EN_FAR)).action == "merge"
        # The Chinese lessons were not asked about.
        assert asked(server) == [(CITY, CITY_FAR), (CITY_EN, CITY_EN_FAR)]


def test_an_opposite_far_in_words_is_a_conflict_for_a_person(tmp_path: Path) -> None:
    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        kept = hs.curate(draft(CITY_EN)).lesson
        change = hs.curate(draft(CITY_EN_FAR_OPPOSITE))
        assert change.action == "conflict" and change.lesson.status == "needs_review"
        assert change.other is not None and change.other.lesson_id == kept.lesson_id
        assert asked(server) == [(CITY_EN, CITY_EN_FAR_OPPOSITE)]


def test_far_pairs_wait_for_a_repeat_and_are_asked_about_a_few_at_most(tmp_path: Path) -> None:
    pairs: list[tuple[str, str]] = []

    def different(request: RecordedRequest) -> Any:
        check = checked(request)
        if check is not None:
            return check
        pairs.append(_pair(request))
        return answer({"relation": "different", "reason": "scripted"})

    others = [
        "用户问空气质量时，调用 get_air_quality，不要只报天气",
        "天气接口超时时，告诉用户稍后再试，不要编造温度",
        "报温度时用用户要求的单位",
        "预报只给到未来七天，超出的日期直接告诉用户查不到",
    ]
    with LLMServer(different) as server, _hs(tmp_path, server) as hs:
        hs.curate(draft(CITY))
        for text in others:
            hs.curate(draft(text))
        pairs.clear()
        assert hs.curate(draft(CITY_FAR_TOO)).action == "add"  # "different" each time
        assert 1 <= len(pairs) <= MAX_JUDGED
        assert all(new == CITY_FAR_TOO for _, new in pairs)
        # A word-for-word repeat settles it: nobody is asked about the far ones.
        pairs.clear()
        assert hs.curate(draft(CITY)).action == "merge"
        assert not pairs
        assert server.requests


#: Same tool, same language, few words shared with CITY_REWORDED (closest first).
FAR_ONES = [
    "天气接口超时时，告诉用户稍后再试，不要编造温度",
    "预报只给到未来七天，超出的日期直接告诉用户查不到",
    "报温度时用用户要求的单位",
]


def test_far_pairs_come_after_the_open_ones_closest_first_and_wait_for_no_repeat() -> None:
    emb = HashEmbedder()
    book: list[Lesson] = []
    for text in [CITY, *reversed(FAR_ONES)]:
        book += curate(draft(text), book, embedder=emb).saves
    for for_city, expected in (("same", "merge"), ("different", "add")):
        asked: list[str] = []

        def judge(kept: str, new: str, answer: str = for_city, asked: list[str] = asked) -> str:
            asked.append(kept)
            return answer if kept == CITY else "different"

        assert curate(draft(CITY_REWORDED), book, embedder=emb, judge=judge).action == expected
        if for_city == "same":  # a repeat found: no far lesson is asked about
            assert asked == [CITY]
        else:  # the open pair first, then the closest far one, and no more
            assert asked == [CITY, FAR_ONES[0]]


def _toolless(advice: str) -> LessonDraft:
    return LessonDraft(task_type="weather_query", advice=advice, root_cause="r")


def test_a_far_pair_names_a_tool_the_draft_names_and_is_alive() -> None:
    emb = HashEmbedder()
    toolless = curate(_toolless("报温度时用用户要求的单位"), [], embedder=emb).lesson
    dead = reject(
        curate(draft("天气接口超时时，告诉用户稍后再试，不要编造温度"), [], embedder=emb).lesson,
        by="a person",
    )
    asked: list[str] = []
    change = curate(
        draft(CITY_FAR),
        [toolless, dead],
        embedder=emb,
        judge=lambda kept, new: asked.append(kept) or "same",
    )
    assert change.action == "add" and not asked
    # Alive and of the same tool, the same lesson is asked about (and merged, on "same").
    alive = curate(draft(dead.advice), [], embedder=emb).lesson
    change = curate(
        draft(CITY_FAR), [alive], embedder=emb, judge=lambda kept, new: asked.append(kept) or "same"
    )
    assert change.action == "merge" and asked == [alive.advice]


def test_a_far_same_never_overrides_a_conflict_the_rules_read() -> None:
    """A far lesson the model calls the same must not swallow a draft the rules flag."""
    emb = HashEmbedder()
    a = curate(draft(CITY_EN), [], embedder=emb).lesson
    b = curate(
        draft("If a get_weather call returns 429, back off for a minute."), [a], embedder=emb
    ).lesson
    opposite = "Don't confirm which city the user means before calling get_weather; just call it."
    change = curate(draft(opposite), [a, b], embedder=emb, judge=lambda kept, new: "same")
    assert change.action == "conflict" and change.other is not None
    assert change.other.lesson_id == a.lesson_id


def test_without_the_models_word_the_rules_flag_what_they_would_have() -> None:
    """Pairs the rules would flag go to the model instead; when it fails (None, a raise),
    the rules' conflict stands and nothing escapes into the caller."""
    emb = HashEmbedder()
    kept = "Serve cached get_weather results for repeat questions within the hour."
    flipped = "Serve fresh get_weather results for repeat questions within the hour."
    book = [curate(draft(kept), [], embedder=emb).lesson]
    assert curate(draft(flipped), book, embedder=emb).action == "conflict"

    def broken(a: str, b: str) -> str | None:
        raise RuntimeError("a judge of the caller's own")

    for judge in (lambda a, b: None, broken, lambda a, b: "SAME!"):
        change = curate(draft(flipped), book, embedder=emb, judge=judge)
        assert change.action == "conflict" and change.lesson.status == "needs_review"
    assert curate(draft(flipped), book, embedder=emb, judge=lambda a, b: "different").action == (
        "add"
    )


def test_a_model_that_calls_everything_the_same_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a real small model did (SmolLM2-135M through llama.cpp's server): "same" to every
    pair, which merged opposite advice. It misses the check pairs, so the rules decide."""
    with LLMServer(lambda request: answer({"relation": "same", "reason": "alike"})) as server:
        with _hs(tmp_path, server) as hs, caplog.at_level(logging.WARNING):
            kept = hs.curate(draft(CITY_EN)).lesson
            assert hs.curate(draft(CITY_EN_FAR_OPPOSITE)).action == "add"
            assert hs.curate(draft(CITY_EN_FAR)).action == "add"
            [city] = [x for x in hs.lessons() if x.lesson_id == kept.lesson_id]
            assert city.advice == CITY_EN and city.support == 1
        # Put to the check pairs once; no lesson pair was ever sent.
        assert len(server.requests) == len(CANARIES) and not asked(server)
    [warning] = [r for r in caplog.records if "not used to judge" in r.getMessage()]
    assert "answered 4 of 6 check pairs wrong" in warning.getMessage()


def test_a_check_the_model_did_not_answer_is_asked_again() -> None:
    script = [rejected(401), *[checked_reply(a, b) for a, b, _ in CANARIES]]
    script.append(answer({"relation": "same", "reason": "scripted"}))
    with LLMServer(script) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm, check_retry_seconds=0)
        assert judge(CITY, CITY_FAR) is None and judge.trusted is None  # no answer: no verdict
        assert judge(CITY, CITY_FAR) == "same" and judge.trusted is True
        assert judge.canary_requests == 1 + len(CANARIES) and judge.asked == 1
        llm.close()
    assert len(server.requests) == len(script)


def checked_reply(a: str, b: str) -> Any:
    relation = CHECKS[" ".join(a.split()).replace('"', "'"), b.replace('"', "'")]
    return answer({"relation": relation, "reason": "scripted"})


def test_a_merge_on_the_models_word_never_rewrites_the_advice() -> None:
    """The rules read nothing in this pair; a wrong "same" merges it (support, a wording), but
    the more concrete text, which the rules' own merges would serve, is not what the agent is
    told now: the lesson a person may have read stays as it was."""
    emb = HashEmbedder()
    kept = curate(draft(CITY_EN), [], embedder=emb).lesson
    opposite = (
        "Call get_weather(city='Beijing', units='metric') straight away when no city is given."
    )
    writes: list[str] = []
    change = curate(
        draft(opposite),
        [kept],
        embedder=emb,
        judge=lambda a, b: "same",
        merge_text=lambda a, b: writes.append(b) or b,
    )
    assert change.action == "merge" and change.lesson.advice == CITY_EN and not writes
    assert change.lesson.support == 2 and change.lesson.structured == kept.structured
    entry = change.lesson.history[-1]
    assert entry["changes"]["judged"] is True
    assert entry["changes"]["merged_advice"] == opposite
    # A merge the rules make themselves still takes the better text (and the writer).
    change = curate(draft(CITY_EN_REWORDED), [kept], embedder=emb, merge_text=lambda a, b: "M")
    assert change.action == "merge" and change.lesson.advice == "M"
    assert "judged" not in change.lesson.history[-1]["changes"]


@pytest.mark.parametrize("wrong", range(len(CANARIES)))
def test_one_check_pair_missed_is_enough_not_to_use_the_model(wrong: int) -> None:
    a, b, relation = CANARIES[wrong]
    miss = (" ".join(a.split()).replace('"', "'"), b.replace('"', "'"))
    lie = "different" if relation == "same" else "same"

    def once_wrong(request: RecordedRequest) -> Any:
        if _pair(request) == miss:
            return answer({"relation": lie, "reason": "scripted"})
        return checked(request) or answer({"relation": "same", "reason": "scripted"})

    with LLMServer(once_wrong) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm)
        assert judge(CITY, CITY_FAR) is None and judge.trusted is False
        assert judge.missed == [(a, b, relation, lie)]
        assert judge(CITY, CITY_FAR) is None and judge.asked == 0  # never asked again
        llm.close()
    assert not asked(server)


def test_merges_on_the_models_word_wait_unfolded_a_bounded_few_and_fold_once_settled() -> None:
    emb = HashEmbedder()
    lesson = curate(draft(CITY_EN), [], embedder=emb).lesson
    words = ["amber", "bison", "cobalt", "dune", "ember", "fjord", "garnet", "heron", "iris"]
    same = lambda a, b: "same"  # noqa: E731

    def far(i: int) -> LessonDraft:
        return draft(f"Mind the {words[i % 9]} {words[(i * 4 + 1) % 9]} quota {i} at night.")

    for i in range(MAX_PENDING_JUDGED):
        change = curate(far(i), [lesson], embedder=emb, judge=same)
        assert change.action == "merge" and change.lesson.advice == CITY_EN
        lesson = change.lesson
    # As many as a person is asked about at once wait: the model's word alone adds no more.
    change = curate(far(MAX_PENDING_JUDGED), [lesson], embedder=emb, judge=same)
    assert change.action == "add" and change.lesson.lesson_id != lesson.lesson_id
    # The rules' own merges fold as ever; the wordings waiting for a person stay, one by one.
    for _ in range(MAX_MERGE_ENTRIES + 4):
        lesson = curate(draft(CITY_EN_REWORDED), [lesson], embedder=emb).lesson
    assert len(judged_merges(lesson)) == MAX_PENDING_JUDGED
    summary = next(h for h in lesson.history if h["action"] == "merge_summary")
    assert summary["changes"]["merges"] == 4 and "judged_merges" not in summary["changes"]
    # Once a person settled them they are machine merges like the others, counted apart.
    lesson = confirm(lesson, by="alice")
    for _ in range(2):
        lesson = curate(draft(CITY_EN_REWORDED), [lesson], embedder=emb).lesson
    summary = next(h for h in lesson.history if h["action"] == "merge_summary")
    assert summary["changes"]["judged_merges"] == MAX_PENDING_JUDGED
    kept = [h for h in lesson.history if h["action"] == "merge"]
    assert len(kept) == MAX_MERGE_ENTRIES and not any(h["changes"].get("judged") for h in kept)


def test_a_wording_merged_again_on_the_models_word_stays_one_entry() -> None:
    emb = HashEmbedder()
    lesson = curate(draft(CITY_EN), [], embedder=emb).lesson
    for task in range(30):
        repeat = replace(draft(OPPOSITE_CONCRETE), source_task_ids=[f"t{task}"])
        lesson = curate(repeat, [lesson], embedder=emb, judge=lambda a, b: "same").lesson
    assert lesson.support == 31 and lesson.advice == CITY_EN
    judged = [h for h in lesson.history if (h.get("changes") or {}).get("judged")]
    assert len(judged) == 1 and len(lesson.history) <= 3  # created, sources' summary, merge
    [merge] = judged_merges(lesson)
    assert (merge["merges"], merge["support"]) == (30, 30)
    back, [part] = split_judged(lesson, by="alice")
    assert back.support == 1 and part.support == 30 and back.source_task_ids == []


OPPOSITE_CONCRETE = (
    "Call get_weather(city='Beijing', units='metric') straight away when no city is given."
)


def test_a_wording_merged_on_the_models_word_never_rewrites_the_advice_later() -> None:
    """Learned again word for word (a rules repeat of that wording), the opposite the model let
    in still adds support only; the clean lesson's text is what the agent is told."""
    emb = HashEmbedder()
    lesson = curate(draft(CITY_EN), [], embedder=emb).lesson
    lesson = curate(draft(OPPOSITE_CONCRETE), [lesson], embedder=emb, judge=lambda a, b: "same")
    lesson = lesson.lesson
    for judge in (None, lambda a, b: "opposite"):
        change = curate(draft(OPPOSITE_CONCRETE), [lesson], embedder=emb, judge=judge)
        assert change.action == "merge" and change.lesson.advice == CITY_EN
        assert change.lesson.history[-1]["changes"]["judged"] is True


def test_the_models_word_alone_neither_revives_nor_feeds_a_dead_lesson() -> None:
    emb = HashEmbedder()
    kept = curate(draft(CITY), [], embedder=emb).lesson
    expired = copy.deepcopy(kept)
    expired.status = "expired"
    rejected = reject(kept, by="a person")
    for dead in (expired, rejected):
        change = curate(draft(CITY_LAST), [dead], embedder=emb, judge=lambda a, b: "same")
        assert change.action == "add" and change.lesson.lesson_id != kept.lesson_id
        assert change.lesson.advice == CITY_LAST and change.other is None


def test_the_check_resumes_where_it_stopped_after_a_wait() -> None:
    right = [checked_reply(a, b) for a, b, _ in CANARIES]
    script = [*right[:2], rejected(401), *right[2:], answer({"relation": "same"})]
    with LLMServer(script) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm, check_retry_seconds=60)
        assert judge(CITY, CITY_FAR) is None and judge.trusted is None
        assert len(server.requests) == 3
        assert judge(CITY, CITY_FAR) is None and len(server.requests) == 3  # waits its time
        judge._retry_at = 0.0  # the wait is over
        assert judge(CITY, CITY_FAR) == "same" and judge.trusted is True
        # Only the pairs not answered were asked again: 6 check requests and one failure.
        assert judge.canary_requests == len(CANARIES) + 1
        llm.close()
    assert len(server.requests) == len(script)


def test_an_answer_with_no_verdict_is_asked_again_and_the_third_is_final() -> None:
    a, b, relation = CANARIES[0]
    empty = answer("")
    right = [checked_reply(x, y) for x, y, _ in CANARIES]
    script = [empty, *right[1:], empty, right[0], answer({"relation": "same"})]
    with LLMServer(script) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm, check_retry_seconds=0)
        assert judge(CITY, CITY_FAR) is None and judge.trusted is None
        assert judge(CITY, CITY_FAR) is None and judge.trusted is None  # the second glitch
        assert judge(CITY, CITY_FAR) == "same" and judge.trusted is True
        llm.close()
    with LLMServer([], default=empty) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=2)
        judge = PairJudge(llm, check_retry_seconds=0)
        for _ in range(3):
            assert judge(CITY, CITY_FAR) is None
        assert judge.trusted is False and judge.missed[0] == (a, b, relation, None)
        asked_before = len(server.requests)
        assert judge(CITY, CITY_FAR) is None and len(server.requests) == asked_before
        llm.close()


def test_while_one_thread_checks_the_model_the_others_do_not_wait() -> None:
    slow = [replace(checked_reply(a, b), delay=0.3) for a, b, _ in CANARIES]
    with LLMServer(slow) as server:
        llm = OpenAILLM("judge-1", base_url=server.openai_base_url, api_key="k", timeout=5)
        judge = PairJudge(llm)
        checking = threading.Thread(target=judge, args=(CITY, CITY_FAR))
        checking.start()
        while not server.requests:
            time.sleep(0.01)
        started = time.monotonic()
        assert judge(CITY, CITY_FAR) is None  # the rules decide meanwhile
        assert time.monotonic() - started < 0.25
        checking.join()
        assert judge.trusted is True and judge.canary_requests == len(CANARIES)
        llm.close()


# -- a person looks at what the model merged ------------------------------------------------------


def _sourced(advice: str, task: str) -> LessonDraft:
    return replace(draft(advice), source_task_ids=[task])


def test_a_person_sees_the_models_merges_and_can_take_them_back_out() -> None:
    emb = HashEmbedder()
    kept = curate(_sourced(CITY_EN, "t1"), [], embedder=emb).lesson
    same = lambda a, b: "same"  # noqa: E731 - a wrong model, as a person will find
    for task in ("t2", "t3"):  # the same wording twice: one lesson once split, support 2
        change = curate(_sourced(OPPOSITE_CONCRETE, task), [kept], embedder=emb, judge=same)
        assert change.action == "merge" and change.lesson.lesson_id == kept.lesson_id
        kept = change.lesson
    assert kept.support == 3 and kept.source_task_ids == ["t1", "t2", "t3"]
    assert judged_merges(kept) == [
        {
            "wording": OPPOSITE_CONCRETE,
            "at": kept.history[1]["at"],
            "merges": 2,
            "support": 2,
            "source_task_ids": ["t2", "t3"],
        }
    ]
    assert review_reasons(kept) == [
        "1 wording merged on the model's word alone: do they say the same?"
    ]
    assert OPPOSITE_CONCRETE in variants(kept)

    back, [part] = split_judged(kept, by="alice")
    assert back.advice == CITY_EN and back.status == "active"
    assert back.support == 1 and back.source_task_ids == ["t1"]
    assert variants(back) == [CITY_EN] and judged_merges(back) == []
    assert review_reasons(back) == [] and back.history[-1]["action"] == "split"
    assert back.history[-1]["by"] == "alice"
    assert (part.advice, part.status, part.support) == (OPPOSITE_CONCRETE, "needs_review", 2)
    assert part.source_task_ids == ["t2", "t3"] and part.task_type == kept.task_type
    assert part.features.tools == ["get_weather"] and part.lesson_id != kept.lesson_id
    assert review_reasons(part) == [
        f"split from {kept.lesson_id}: the model called it the same, a person did not"
    ]
    with pytest.raises(ValueError, match="no merge made on the model's word"):
        split_judged(back, by="alice")
    # Learned again word for word, it goes to its own lesson, not back into the first.
    change = curate(_sourced(OPPOSITE_CONCRETE, "t4"), [back, part], embedder=emb, judge=same)
    assert change.action == "merge" and change.lesson.lesson_id == part.lesson_id
    # And once the person rejects it, the rejected lesson takes the repeat, as any would.
    gone = reject(part, by="alice")
    change = curate(_sourced(OPPOSITE_CONCRETE, "t4"), [back, gone], embedder=emb, judge=same)
    assert change.lesson.lesson_id == part.lesson_id and change.lesson.status == "rejected"


def test_confirming_the_lesson_settles_the_models_merges_before_it() -> None:
    emb = HashEmbedder()
    kept = curate(draft(CITY_EN), [], embedder=emb).lesson
    kept = curate(draft(CITY_EN_FAR), [kept], embedder=emb, judge=lambda a, b: "same").lesson
    assert len(judged_merges(kept)) == 1
    kept = confirm(kept, by="alice")
    assert judged_merges(kept) == [] and review_reasons(kept) == []
    with pytest.raises(ValueError):
        split_judged(kept, by="alice")
    # A merge on the model's word after the confirmation is the person's to look at again.
    kept = curate(draft(OPPOSITE_CONCRETE), [kept], embedder=emb, judge=lambda a, b: "same").lesson
    assert [m["wording"] for m in judged_merges(kept)] == [OPPOSITE_CONCRETE]
    # A machine's "confirm" is no person's.
    assert judged_merges(confirm(kept, by="curator")) != []


def test_review_lists_the_models_merges_and_split_takes_them_back(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hindsight_loop.cli import app

    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        kept = hs.curate(draft(CITY)).lesson
        assert hs.curate(draft(CITY_REWORDED)).action == "merge"  # on the model's word
    db = str(tmp_path / "hs.db")
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, [*args, "--db", db])
        assert result.exit_code == code, result.output
        return result.output

    text = run("lessons", "review")
    assert f"+ merged on the model's word: {CITY_REWORDED}" in text
    assert "hindsight lessons split ID" in text
    [queued] = orjson.loads(run("lessons", "review", "--json"))
    assert queued["lesson_id"] == kept.lesson_id
    assert [m["wording"] for m in queued["judged_merges"]] == [CITY_REWORDED]
    out = orjson.loads(run("lessons", "split", kept.lesson_id, "--by", "alice", "--json"))
    [part] = out["split"]
    assert out["lesson"]["support"] == 1 and out["lesson"]["advice"] == CITY
    assert part["advice"] == CITY_REWORDED and part["status"] == "needs_review"
    [queued] = orjson.loads(run("lessons", "review", "--json"))
    assert queued["lesson_id"] == part["lesson_id"]  # the split one waits; the first is settled
    assert "holds no merge made on the model's word" in run(
        "lessons", "split", kept.lesson_id, code=1
    )
    run("lessons", "split", "les_nope", code=1)


def test_a_split_takes_the_wording_out_whole_even_merged_before_a_confirmation() -> None:
    emb = HashEmbedder()
    same = lambda a, b: "same"  # noqa: E731
    lesson = curate(_sourced(CITY_EN, "t1"), [], embedder=emb).lesson
    lesson = curate(_sourced(OPPOSITE_CONCRETE, "t2"), [lesson], embedder=emb, judge=same).lesson
    lesson = confirm(lesson, by="alice")  # she let it be
    assert judged_merges(lesson) == []
    # Learned again after she vouched: an ordinary repeat of a wording she accepted.
    again = curate(_sourced(OPPOSITE_CONCRETE, "t3"), [lesson], embedder=emb, judge=same).lesson
    assert judged_merges(again) == [] and again.advice == CITY_EN  # her lesson's words stand
    # A conflict settled in the lesson's favour answers another question: what the model
    # merged stays for her to look at.
    lesson = curate(_sourced(CITY_EN_FAR, "t4"), [lesson], embedder=emb, judge=same).lesson
    kept = confirm(lesson, by="alice", settles_judged=False)
    assert [m["wording"] for m in judged_merges(kept)] == [CITY_EN_FAR]
    # Split later, a wording leaves whole: its merges before the confirmation too.
    lesson = curate(_sourced(OPPOSITE_CONCRETE, "t5"), [kept], embedder=emb).lesson
    assert judged_merges(lesson) == [judged_merges(kept)[0]]  # a settled wording: no new wait
    back, parts = split_judged(lesson, by="bob")
    assert [p.advice for p in parts] == [CITY_EN_FAR]
    assert OPPOSITE_CONCRETE in variants(back)  # settled by alice, not split by bob


def test_near_a_wording_the_model_let_in_is_no_repeat_for_the_rules() -> None:
    emb = HashEmbedder()
    kept = curate(draft(CITY), [], embedder=emb).lesson
    lesson = curate(draft(CITY_FAR), [kept], embedder=emb, judge=lambda a, b: "same").lesson
    assert [m["wording"] for m in judged_merges(lesson)] == [CITY_FAR]
    near = CITY_FAR + "。"
    assert curate(draft(near), [kept], embedder=emb).action == "add"  # far from the advice
    change = curate(draft(near), [lesson], embedder=emb)
    assert change.action == "add"  # not through the model's wording either
    # With the model's word it merges, and waits for a person like the first.
    change = curate(draft(near), [lesson], embedder=emb, judge=lambda a, b: "same")
    assert change.action == "merge"
    assert {m["wording"] for m in judged_merges(change.lesson)} == {CITY_FAR, near}


RETRY = "Retry fetch_page once on a timeout."
NO_CACHE = "Never serve cached copies of fetch_page results."
CACHE_ON_TIMEOUT = "On a timeout, serve cached copies of fetch_page results."


def test_a_split_clears_the_contradictions_the_wording_brought(tmp_path: Path) -> None:
    """A wording the model wrongly called a repeat brings its contradictions to the lesson it
    joins (recall keeps the pair apart). Split back out, it takes them along: they were kept on
    the lesson, and recall served one of two lessons that never disagreed."""

    def wrong_same(request: RecordedRequest) -> Any:
        check = checked(request)
        if check is not None:
            return check
        if _pair(request) == (RETRY, CACHE_ON_TIMEOUT):
            return answer({"relation": "same", "reason": "both about timeouts"})
        return server_error(500)  # anything else: the rules decide

    def web(advice: str) -> LessonDraft:
        return LessonDraft(task_type="web", advice=advice, features=Features(tools=["fetch_page"]))

    with LLMServer(wrong_same) as server, _hs(tmp_path, server) as hs:
        retry = hs.curate(web(RETRY)).lesson
        no_cache = hs.curate(web(NO_CACHE)).lesson
        change = hs.curate(web(CACHE_ON_TIMEOUT))
        assert change.action == "merge" and change.lesson.lesson_id == retry.lesson_id
        assert hs.lesson(retry.lesson_id).conflicts == [no_cache.lesson_id]
        split = hs.split_lesson(retry.lesson_id, by="alice")
        assert split is not None
        [part] = split[1]
        back, other = hs.lesson(retry.lesson_id), hs.lesson(no_cache.lesson_id)
        assert back.conflicts == [part.lesson_id]  # near text, waiting for alice beside it
        assert other.conflicts == [part.lesson_id]  # the contradiction is the wording's now
        assert back.history[-2]["action"] == "conflict_cleared"
        assert back.history[-2]["by"] == "alice"
        served = hs.recall(
            task_type="web", tools=["fetch_page"], query="fetch_page timeout cached copies"
        )
        assert {x.lesson_id for x in served} == {retry.lesson_id, no_cache.lesson_id}


def test_a_contradiction_the_model_found_outlives_an_edit_made_without_it(tmp_path: Path) -> None:
    """A pair the model called opposite (the rules read neither way) is a person's to settle:
    an edit of the lesson's tools or scope, made where no model is set up (a person's shell),
    cleared it, and recall served both opposites."""
    with LLMServer(judging) as server, _hs(tmp_path, server) as hs:
        kept = hs.curate(draft(CITY)).lesson
        new = hs.curate(draft(CITY_LAST)).lesson
    with Hindsight(tmp_path / "hs.db", background=False) as hs:
        for change in (
            {"tools": ["get_weather", "geocode"]},
            {"scope": "project:travel"},
            {"step": "before get_weather"},
        ):
            hs.change_lesson(new.lesson_id, lambda x, c=change: edit(x, by="ann", **c))
            assert hs.lesson(new.lesson_id).conflicts == [kept.lesson_id], change
            assert hs.lesson(kept.lesson_id).conflicts == [new.lesson_id], change
