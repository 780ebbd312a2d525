"""Review prompts: strict templates and a chronicle bounded by a token budget."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hindsight_loop.llm import estimate_tokens
from hindsight_loop.llm.templates import TemplateError, load, render, render_chronicle
from hindsight_loop.models import Chronicle, Event, Step, Task
from hindsight_loop.replay import NODE_SUMMARY_MAX, STEP_SUMMARY_MAX, replay, step_detail
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


# -- an imported transcript, as the reviewer reads it ----------------------------------------

REQUEST_ZH = "请帮我把 /data/raw/sales_2024.csv 清洗一下：去掉重复的行，按月份汇总销售额，然后写回 /data/clean。"
REQUEST_EN = (
    "Also, please make sure the totals match the finance report exactly, because last month "
    "the numbers were off by a few hundred and nobody noticed until the audit."
)
REPLY = (
    "Sure. I will read the file first, drop the duplicate rows, aggregate the sales by month "
    "and write the result back; I will compare the totals with the finance report at the end."
)
ERROR = (
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xed in position 1832: invalid "
    "continuation byte while reading line 57 of /data/raw/sales_2024.csv (the file looks like "
    "it was exported by the ERP system in GBK; pass encoding='gbk' or detect it first)"
)


def imported_run(padding: int = 0) -> Chronicle:
    """A run as the OpenAI-messages import records it: user turns, replies, tool calls."""
    events: list[dict[str, Any]] = [
        {"type": "task_start", "task_type": "chat", "goal": "clean the sales file"},
        {"type": "user_input", "input": {"text": REQUEST_ZH}},
        {"type": "user_input", "input": {"text": REQUEST_EN}},
        {"type": "llm_decision", "decision": {"chosen_action": "reply", "message": REPLY}},
        {
            "type": "llm_decision",
            "decision": {
                "chosen_action": "read_csv",
                "tool_calls": [{"name": "read_csv", "args": {"path": "/data/raw/sales_2024.csv"}}],
            },
        },
        {
            "type": "action_executed",
            "input": {"tool": "read_csv", "args": {"path": "/data/raw/sales_2024.csv"}},
            "result": {
                "status": "failed",
                "error_type": "UnicodeDecodeError",
                "error_message": ERROR,
            },
        },
        {
            "type": "action_executed",
            "input": {"tool": "read_csv", "args": {"path": "/data/raw/sales_2024.csv"}},
            "result": {
                "status": "failed",
                "error_type": "UnicodeDecodeError",
                "error_message": ERROR,
            },
        },
    ]
    for n in range(padding):
        events.append(
            {
                "type": "action_executed",
                "input": {"tool": "inspect_row", "args": {"row": n}},
                "result": {"status": "ok", "output": {"row": n, "amount": 100 + n, "note": "fine"}},
            }
        )
        events.append(
            {
                "type": "llm_decision",
                "decision": {
                    "chosen_action": "reply",
                    "message": f"Row {n} is fine, the amount is {100 + n}.",
                },
            }
        )
    events += [
        {
            "type": "action_executed",
            "input": {
                "tool": "read_csv",
                "args": {"path": "/data/raw/sales_2024.csv", "encoding": "gbk"},
            },
            "result": {"status": "ok", "output": {"rows": 1204, "columns": ["date", "amount"]}},
        },
        {
            "type": "llm_decision",
            "decision": {
                "chosen_action": "reply",
                "message": "Done: 1198 rows written to /data/clean.",
            },
        },
        {"type": "task_end", "result": {"status": "succeeded"}},
    ]
    wire = [
        {
            "event_id": f"evt_{n:04d}",
            "task_id": "tsk_chat",
            "seq": n,
            "timestamp": f"2024-11-20T14:{n // 60 % 60:02d}:{n % 60:02d}.000Z",
            **e,
        }
        for n, e in enumerate(events)
    ]
    task = Task(task_id="tsk_chat", task_type="chat", goal="clean the sales file")
    return replay(task, [Event.from_dict(w) for w in wire])


def test_an_imported_run_shows_what_was_said_and_the_full_error() -> None:
    chronicle = imported_run()
    text = render_chronicle(chronicle)
    assert REQUEST_ZH in text and REQUEST_EN in text
    assert REPLY in text
    assert ERROR in text
    assert '"path": "/data/raw/sales_2024.csv"' in text  # the arguments of the call
    assert '"rows": 1204' in text  # the gist of a result
    # The one-liners stay one-liners; the substance is indented under them.
    reply = chronicle.steps[3]
    assert reply.summary.startswith("reply: Sure. I will read the file")
    assert len(reply.summary) <= STEP_SUMMARY_MAX
    assert step_detail(reply) == REPLY
    failed = chronicle.steps[5]
    assert step_detail(failed).splitlines() == [
        'args: {"path": "/data/raw/sales_2024.csv"}',
        f"error: UnicodeDecodeError: {ERROR}",
    ]
    assert all(len(node.summary) <= NODE_SUMMARY_MAX for node in chronicle.key_nodes)
    assert "omitted" not in text and "left out" not in text


def test_a_short_user_text_is_not_repeated_under_its_summary() -> None:
    step = Step(index=0, event_id="e", type="user_input", summary="user: hi", input={"text": "hi"})
    assert step_detail(step) == ""


@pytest.mark.parametrize("budget", [600, 1200, 2500])
def test_trimming_drops_middle_steps_first_and_keeps_key_nodes_whole(budget: int) -> None:
    chronicle = imported_run(padding=60)
    full = render_chronicle(chronicle, budget_tokens=10**9)
    assert estimate_tokens(full) > budget
    text = render_chronicle(chronicle, budget_tokens=budget)
    assert estimate_tokens(text) <= budget
    # The start (the user's request), every key node with its error, and the end stay whole.
    assert REQUEST_ZH in text and ERROR in text
    assert "Done: 1198 rows written" in text
    for node in chronicle.key_nodes:
        for index in (node.index, *node.related):
            assert f"\n#{index} " in "\n" + text
    # What went is the middle, and the text says how much.
    shown = [int(line.split()[0][1:]) for line in text.splitlines() if line.startswith("#")]
    middle = len(chronicle.steps) // 2
    assert middle not in shown
    gaps = [int(m) for m in re.findall(r"… \((\d+) steps? omitted\) …", text)]
    assert sum(gaps) == len(chronicle.steps) - len(shown)
    assert f"{sum(gaps)} of {len(chronicle.steps)} steps left out" in text
    # Steps near the ends outlive steps near the middle.
    anchors = {i for node in chronicle.key_nodes for i in (node.index, *node.related)}
    centre = (len(chronicle.steps) - 1) / 2
    dropped = set(range(len(chronicle.steps))) - set(shown)
    nearest_kept = min(abs(i - centre) for i in set(shown) - anchors)
    assert all(abs(i - centre) <= nearest_kept for i in dropped)
