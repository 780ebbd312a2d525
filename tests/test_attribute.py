"""Attribution: which agent of a failed group chat caused it, offline and with a model.

The model is the local fake OpenAI-compatible server (``hindsight_loop.testing.llm_server``),
reached over HTTP by the real client.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.attribute import RULE_CONFIDENCE, Attribution, attribute
from hindsight_loop.cli import app
from hindsight_loop.ingest import runs_from
from hindsight_loop.llm.openai import OpenAILLM
from hindsight_loop.testing.llm_server import LLMServer, RecordedRequest, answer, fenced, prose
from tests.test_multi_agent import LOG, NO_CODE, OPENING, chronicle_of

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def chat(*turns: tuple[str, str]) -> dict[str, Any]:
    return {
        "question": "How many clients have an even street number?",
        "is_correct": False,
        "history": [{"name": n, "role": "user", "content": c} for n, c in turns],
    }


def history_step(found: Attribution, events: list[Any]) -> int | None:
    """The attribution's step as an index in the log's history (its event's seq - 1)."""
    return next((e.seq - 1 for e in events if e.event_id == found.event_id), None)


def blame(log: dict[str, Any], **kwargs: Any) -> tuple[Attribution, int | None]:
    chronicle, events = chronicle_of(log)
    found = attribute(chronicle, events=events, **kwargs)
    return found, history_step(found, events)


# -- offline ----------------------------------------------------------------------------------


def test_the_author_of_the_first_failed_code_is_blamed_not_the_executor() -> None:
    found, step = blame(LOG)
    assert (found.agent, step) == ("Excel_Expert", 1)
    assert found.method == "offline:failed_execution"
    assert "SyntaxError" in found.reason
    assert found.confidence == RULE_CONFIDENCE["failed_execution"]
    assert found.calls == 0 and found.tokens_in == 0


def test_made_up_input_before_any_failure_is_blamed_in_english_and_chinese() -> None:
    english = chat(
        ("Planner_Expert", OPENING),
        ("Data_Expert", "I cannot open the file, so let's assume the street numbers are 1-10."),
        ("Computer_terminal", NO_CODE),
        ("Verification_Expert", "```python\nprint(sum(1 for n in range(1, 11) if n % 2 == 0)\n```"),
        ("Computer_terminal", "exitcode: 1 (execution failed)\nCode output: SyntaxError: x"),
    )
    found, step = blame(english)
    assert (found.agent, step, found.method) == ("Data_Expert", 1, "offline:made_up_input")
    chinese = chat(
        ("规划专家", "你将获得一个任务：统计门牌号为偶数的客户数量。"),
        ("审核专家", "好的，我来检查。"),
        ("数据专家", "我们先假设数据如下：门牌号为 1 到 10。"),
        ("审核专家", "计算结果正确，共 5 个。"),
    )
    found, step = blame(chinese)
    assert (found.agent, step) == ("数据专家", 2)
    assert "假设" in found.reason


def test_without_failures_the_first_agent_to_do_work_is_blamed() -> None:
    quiet = chat(
        ("Planner_Expert", OPENING),
        ("Research_Expert", "The sheet has 4 clients with even numbers."),
        ("Verification_Expert", "I agree, 4."),
        ("Verification_Expert", "TERMINATE"),
    )
    found, step = blame(quiet)
    assert (found.agent, step, found.method) == ("Research_Expert", 1, "offline:first_worker")
    # The opening agent is the first worker when its own code ran.
    ran = copy.deepcopy(quiet)
    ran["history"][0]["content"] += "\n```python\nprint(4)\n```"
    ran["history"].insert(
        1,
        {
            "name": "Computer_terminal",
            "content": "exitcode: 0 (execution succeeded)\nCode output: 4",
        },
    )
    found, step = blame(ran)
    assert (found.agent, step) == ("Planner_Expert", 0)


def test_a_run_where_no_agent_speaks_blames_nobody() -> None:
    chronicle, events = chronicle_of(chat(("Computer_terminal", NO_CODE)))
    found = attribute(chronicle, events=events)
    assert found.agent is None and found.step is None


# -- with a model (the fake server over HTTP) -------------------------------------------------


def llm_for(server: LLMServer) -> OpenAILLM:
    return OpenAILLM("fake-model", base_url=server.openai_base_url, api_key="sk-test", timeout=10)


def test_all_at_once_asks_once_with_every_step_and_its_agent_and_uses_the_answer() -> None:
    reply = {
        "agent": "Verification_Expert",
        "step": 4,
        "reason": "claimed 4 without output",
        "confidence": 0.8,
    }
    with LLMServer([fenced(reply)]) as server, llm_for(server) as llm:
        found, step = blame(LOG, llm=llm)
        [request] = server.requests
    assert (found.agent, step) == ("Verification_Expert", 3)
    assert found.method == "openai:fake-model:all_at_once"
    assert found.reason == "claimed 4 without output" and found.confidence == 0.8
    assert found.calls == 1 and found.tokens_in > 0 and found.tokens_out > 0
    assert found.error is None
    prompt = request.prompt
    assert "step 3 | Excel_Expert: [execute_code FAILED]" in prompt
    assert "step 4 | Verification_Expert: The count is 4" in prompt
    assert LOG["question"] in prompt
    assert "LABEL-NOT-FOR-THE-MODEL" not in prompt + request.system


def test_the_prompt_stays_within_its_token_budget() -> None:
    from hindsight_loop.llm import estimate_tokens

    long_log = copy.deepcopy(LOG)
    for msg in long_log["history"]:
        if msg["name"] == "Verification_Expert":
            msg["content"] = "I checked every row. " * 400
    with (
        LLMServer([answer({"agent": "Excel_Expert", "step": 2})]) as server,
        llm_for(server) as llm,
    ):
        blame(long_log, llm=llm, budget_tokens=300)
        [request] = server.requests
    steps = request.prompt.split("one step a line", 1)[1]
    assert estimate_tokens(steps) <= 400  # the steps within budget, the frame around them fixed


def test_binary_search_halves_the_run_until_one_step_is_left() -> None:
    def bisect(request: RecordedRequest) -> Any:
        # The fake knows the culprit is step 2 and answers each half question accordingly.
        first, second = re.findall(r"steps (\d+)-(\d+)", request.prompt)
        lo, hi = int(first[0]), int(first[1])
        return answer({"half": "first" if lo <= 2 <= hi else "second", "reason": "code bug"})

    with LLMServer(bisect) as server, llm_for(server) as llm:
        found, step = blame(LOG, llm=llm, method="binary_search")
        calls = len(server.requests)
    assert (found.agent, step) == ("Excel_Expert", 1)
    assert found.method == "openai:fake-model:binary_search"
    assert calls == found.calls == 3  # 6 steps between task start and end: ceil(log2 6)


def test_a_model_that_answers_nonsense_falls_back_to_the_offline_answer() -> None:
    with LLMServer([prose("I think it was someone.")]) as server, llm_for(server) as llm:
        found, step = blame(LOG, llm=llm)
    assert (found.agent, step) == ("Excel_Expert", 1)
    assert found.method == "offline:failed_execution"
    assert found.error and found.calls == 1
    with LLMServer([answer({"agent": "X", "step": 99})]) as server, llm_for(server) as llm:
        found, _ = blame(LOG, llm=llm)
    assert found.method == "offline:failed_execution" and "no step" in (found.error or "")


def test_a_failing_model_falls_back_to_the_offline_answer() -> None:
    from hindsight_loop.testing.llm_server import rejected

    with LLMServer([rejected(400)]) as server, llm_for(server) as llm:
        found, _ = blame(LOG, llm=llm)
    assert found.method == "offline:failed_execution"
    assert found.error and "LLMError" in found.error


# -- the facade and the CLI -------------------------------------------------------------------


def imported(hs: Hindsight, log: dict[str, Any]) -> str:
    hs.import_transcript(log)
    hs.flush()
    return runs_from(log)[0].task_id


def test_hs_attribute_stores_the_answer_beside_the_reflections(tmp_path: Path) -> None:
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        task_id = imported(hs, LOG)
        found = hs.attribute(task_id)
        assert found.agent == "Excel_Expert"
        stored = [r for r in hs.reflections(task_id) if r.trigger == "attribution"]
        assert len(stored) == 1
        assert stored[0].parsed == {"attribution": found.to_dict()}
        assert Attribution.from_dict(stored[0].parsed["attribution"]) == found
        hs.attribute(task_id, save=False)
        assert len([r for r in hs.reflections(task_id) if r.trigger == "attribution"]) == 1


def test_hs_attribute_with_a_model(tmp_path: Path) -> None:
    reply = {"agent": "Verification_Expert", "step": 4, "reason": "no evidence"}
    with (
        Hindsight(tmp_path / "h.db", background=False) as hs,
        LLMServer([answer(reply)]) as server,
        llm_for(server) as llm,
    ):
        task_id = imported(hs, LOG)
        found = hs.attribute(task_id, llm=llm)
        [stored] = [r for r in hs.reflections(task_id) if r.trigger == "attribution"]
    assert found.agent == "Verification_Expert"
    assert stored.reflector == "openai:fake-model:all_at_once"
    assert stored.tokens_in == found.tokens_in > 0


def test_cli_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = str(tmp_path / "h.db")
    with Hindsight(db, background=False) as hs:
        task_id = imported(hs, LOG)
    result = runner.invoke(app, ["attribute", task_id, "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["agent"] == "Excel_Expert" and data["method"] == "offline:failed_execution"
    result = runner.invoke(app, ["attribute", task_id, "--db", db])
    assert result.exit_code == 0 and "Excel_Expert" in result.output
    result = runner.invoke(app, ["attribute", "tsk_nope", "--db", db])
    assert result.exit_code == 1 and "hindsight tasks" in result.output
    for name in ("HINDSIGHT_LLM_PROVIDER", "HINDSIGHT_LLM_MODEL", "HINDSIGHT_LLM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["attribute", task_id, "--db", db, "--llm"])
    assert result.exit_code == 1 and "HINDSIGHT_LLM_PROVIDER" in result.output
    assert "attribute" in runner.invoke(app, ["--help"]).output


def test_cli_attribute_with_a_model_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "h.db")
    with Hindsight(db, background=False) as hs:
        task_id = imported(hs, LOG)
    with LLMServer([answer({"agent": "Verification_Expert", "step": 4})]) as server:
        monkeypatch.setenv("HINDSIGHT_LLM_PROVIDER", "openai")
        monkeypatch.setenv("HINDSIGHT_LLM_MODEL", "fake-model")
        monkeypatch.setenv("HINDSIGHT_LLM_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("HINDSIGHT_LLM_API_KEY", "sk-test")
        result = runner.invoke(app, ["attribute", task_id, "--db", db, "--llm", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["agent"] == "Verification_Expert"


# -- the benchmark harness, end to end against an OpenAI-compatible endpoint ------------------


def test_the_who_when_bench_runs_its_llm_path_against_an_openai_compatible_server(
    tmp_path: Path,
) -> None:
    data = tmp_path / "logs"
    data.mkdir()
    # Two logs whose culprit wrote "guess"; the fake model names the step holding that word.
    for number, culprit in ((1, "Excel_Expert"), (2, "Verification_Expert")):
        log = copy.deepcopy(LOG)
        index = 1 if culprit == "Excel_Expert" else 3
        log["history"][index]["content"] += " (a guess)"
        log["mistake_agent"], log["mistake_step"] = culprit, str(index)
        (data / f"{number}.json").write_text(json.dumps(log))

    def model(request: RecordedRequest) -> Any:
        line = next(x for x in request.prompt.splitlines() if "guess" in x)
        step, agent = re.match(r"step (\d+) \| ([^:]+):", line).groups()  # type: ignore[union-attr]
        return answer({"agent": agent, "step": int(step), "reason": "it guessed"})

    with LLMServer(model) as server:
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "bench" / "who_when.py"),
                "--json",
                "--data",
                str(data),
                "--dev-until",
                "1",
                "--base-url",
                server.openai_base_url,
                "--model",
                "fake-model",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        asked = len(server.requests)
    result = json.loads(out.stdout)
    assert result["logs"] == 2 and result["held_out_logs"] == 1 and asked == 2
    assert result["llm"]["agent_all"] == 1.0 and result["llm"]["step_all"] == 1.0
    assert result["llm_tokens_per_log"] > 0 and result["llm_fallbacks"] == 0
    assert result["offline"]["agent_all"] == 0.5  # log 2's culprit is not the failed code's author
    assert set(result["most_active"]) == {
        "agent_all",
        "step_all",
        "agent_held_out",
        "step_held_out",
    }


def test_the_who_when_bench_says_why_it_skips_without_data(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "who_when.py"), "--data", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.startswith("skipped: no Who&When logs at")
