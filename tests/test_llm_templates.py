"""Review prompts: strict templates and a chronicle bounded by a token budget."""

from __future__ import annotations

import pytest

from hindsight_loop.llm import estimate_tokens
from hindsight_loop.llm.templates import TemplateError, load, render, render_chronicle
from hindsight_loop.testing.llm import sample_chronicle


def test_templates_are_package_data_with_the_expected_placeholders() -> None:
    assert set(load("system").get_identifiers()) == {"date", "language_instruction"}
    assert {"chronicle", "goal", "outcome"} <= set(load("full_review").get_identifiers())
    assert {"chronicle", "anomaly", "window_first"} <= set(load("local_review").get_identifiers())


def test_a_missing_value_is_an_error() -> None:
    with pytest.raises(TemplateError, match="missing values \\['date'\\]"):
        render("system", language_instruction="Write in English.")


def test_an_unknown_value_is_an_error() -> None:
    with pytest.raises(TemplateError, match="unknown values \\['dat'\\]"):
        render("system", date="2024-11-20", language_instruction="x", dat="typo")


def test_the_date_is_the_one_passed_in() -> None:
    text = render("system", date="2031-02-03", language_instruction="Write in English.")
    assert "Today is 2031-02-03." in text


def test_token_estimate_counts_cjk_characters_one_each() -> None:
    assert estimate_tokens("你好世界") == 4
    assert estimate_tokens("a" * 40) == 10
    assert estimate_tokens("读取 file") == 2 + 2


def test_a_small_chronicle_is_rendered_whole_with_arguments() -> None:
    text = render_chronicle(sample_chronicle())
    assert "#2 action_executed read_csv [parse] failed EncodingError" in text
    assert '"encoding": "utf-8"' in text
    assert "- #3 consecutive_failures: read_csv failed twice in a row" in text
    assert "omitted" not in text


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("budget", [250, 500, 1500])
def test_a_long_chronicle_fits_the_budget_and_keeps_key_nodes_and_ends(
    budget: int, language: str
) -> None:
    chronicle = sample_chronicle(padding=400, language=language)
    full = render_chronicle(chronicle, budget_tokens=10**9)
    assert estimate_tokens(full) > budget
    text = render_chronicle(chronicle, budget_tokens=budget)
    assert estimate_tokens(text) <= budget
    for index in (0, 2, 3, 6, len(chronicle.steps) - 1):  # first, key nodes, last
        assert f"\n#{index} " in "\n" + text
    assert "steps omitted" in text
    assert "consecutive_failures" in text


def test_steps_dropped_first_are_in_the_middle() -> None:
    chronicle = sample_chronicle(padding=100)
    text = render_chronicle(chronicle, budget_tokens=900)
    shown = {int(line.split()[0][1:]) for line in text.splitlines() if line.startswith("#")}
    assert 8 in shown and len(chronicle.steps) - 3 in shown  # next to kept steps
    assert 57 not in shown  # the middle of the run


def test_a_budget_smaller_than_the_key_nodes_still_holds() -> None:
    text = render_chronicle(sample_chronicle(padding=50), budget_tokens=80)
    assert estimate_tokens(text) <= 80
    assert "Key nodes:" in text


def test_a_window_shows_only_its_steps_and_nodes() -> None:
    text = render_chronicle(sample_chronicle(), window=(1, 4))
    assert "#2 action_executed" in text and "#4 llm_decision" in text
    assert "#5 " not in text and "#0 " not in text
    assert "recovery" not in text  # a key node outside the window
