"""Reading review answers that are not quite the JSON that was asked for."""

from __future__ import annotations

import json

import pytest

from hindsight_loop.llm.parse import (
    as_list,
    canonical_keys,
    extract_json,
    parse_review,
    strip_fences,
)

LESSON = {
    "advice": "You should detect the file's encoding before calling read_csv.",
    "root_cause": "read_csv assumed utf-8 for a gbk file.",
    "suggestions": [
        "Call detect_encoding first",
        "Pass encoding explicitly",
        "Stop after one failure",
    ],
    "general_rule": "Detect an input's encoding before parsing it.",
}


def test_fenced_json_with_prose_around_it() -> None:
    text = "Sure, here it is:\n```json\n" + json.dumps(LESSON) + "\n```\nAnything else?"
    assert extract_json(text) == LESSON


def test_an_unclosed_fence_of_a_cut_answer_still_yields_its_body() -> None:
    assert strip_fences('```json\n{"a": 1}') == '{"a": 1}'


def test_a_fence_without_an_object_is_skipped_for_the_one_with_it() -> None:
    text = '```bash\nls -l\n```\nand\n```\n{"a": 1}\n```'
    assert extract_json(text) == {"a": 1}


def test_broken_json_is_repaired() -> None:
    text = json.dumps(LESSON, indent=1)[:-1] + ",\n"  # no closing brace, trailing comma
    assert extract_json(text) == LESSON


def test_json_inside_prose_is_found() -> None:
    assert extract_json('My review: {"root_cause": "x", "advice": "You y"} Thanks!') == {
        "root_cause": "x",
        "advice": "You y",
    }


@pytest.mark.parametrize(
    "text", ["", "   ", "The agent should have checked the encoding.", "42", "[1, 2]"]
)
def test_prose_and_non_objects_are_not_a_review(text: str) -> None:
    assert extract_json(text) is None
    assert parse_review(text, "full") is None
    assert parse_review(text, "local") is None


@pytest.mark.parametrize(
    ("key", "canonical"),
    [
        ("rootCause", "root_cause"),
        ("Root Cause", "root_cause"),
        ("root-cause", "root_cause"),
        ("根本原因", "root_cause"),
        ("general rule", "general_rule"),
        ("GeneralRule", "general_rule"),
        ("通用规则", "general_rule"),
        ("建议", "suggestions"),
        ("Recommendations", "suggestions"),
        ("忠告", "advice"),
        ("keyDecisionPoints", "key_decisions"),
        ("执行路径", "execution_path"),
        ("errorType", "error_type"),
        ("something_else", "something_else"),
    ],
)
def test_near_miss_keys_map_to_the_fixed_ones(key: str, canonical: str) -> None:
    assert list(canonical_keys({key: "v"})) == [canonical]


def test_the_first_spelling_of_a_key_wins() -> None:
    assert canonical_keys({"root_cause": "a", "rootCause": "b"}) == {"root_cause": "a"}


def test_a_full_review_keeps_its_sections_and_lesson() -> None:
    answer = {
        "task_goal": "clean",
        "improvements": ["x"],
        "lesson": {"rootCause": "r", "advice": "You a"},
    }
    parsed = parse_review(json.dumps(answer), "full")
    assert parsed is not None
    assert parsed["task_goal"] == "clean"
    assert parsed["lesson"] == {"root_cause": "r", "advice": "You a"}


def test_a_flattened_full_review_gets_its_lesson_rebuilt() -> None:
    answer = {"task_goal": "clean", **LESSON}
    parsed = parse_review(json.dumps(answer), "full")
    assert parsed is not None
    assert parsed["lesson"] == LESSON
    assert "advice" not in parsed


def test_a_wrapped_review_is_unwrapped() -> None:
    parsed = parse_review(json.dumps({"review": {"lesson": LESSON}}), "full")
    assert parsed is not None and parsed["lesson"] == LESSON


def test_a_lesson_given_as_a_string_is_its_advice() -> None:
    parsed = parse_review(json.dumps({"task_goal": "g", "lesson": "You check first."}), "full")
    assert parsed is not None and parsed["lesson"]["advice"] == "You check first."


def test_a_local_review_answered_in_the_full_shape_is_accepted() -> None:
    parsed = parse_review(json.dumps({"task_goal": "g", "lesson": LESSON}), "local")
    assert parsed is not None and parsed["root_cause"] == LESSON["root_cause"]


def test_a_local_review_needs_a_lesson_field() -> None:
    assert parse_review(json.dumps({"task_goal": "g", "mood": "fine"}), "local") is None


def test_suggestions_in_one_string_are_split() -> None:
    assert as_list("1. first\n2) second\n- third\n• fourth") == [
        "first",
        "second",
        "third",
        "fourth",
    ]
    assert as_list("先检测编码；再读取文件") == ["先检测编码", "再读取文件"]
    assert as_list(["a", "", None, {"text": "b"}]) == ["a", "b"]
