"""Many agents, one run: AG2 group chats imported, replayed per agent, lessons scoped per role/team."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.attribute import scopes_for
from hindsight_loop.ingest import detect_format, runs_from
from hindsight_loop.models import Chronicle, Event, Features, LessonDraft, Task
from hindsight_loop.replay import TeamChronicle, replay

OPENING = (
    "You are given: (1) a task and advises from your manager with a specific plan and (2) a "
    "general task.\n# General Task\nHow many clients have an even street number?"
)
NO_CODE = (
    "There is no code from the last 1 message for me to execute. Group chat manager should let "
    "other participants to continue the conversation."
)

#: An AG2 group chat shaped like Who&When's logs, labels included (the importer must drop them).
LOG: dict[str, Any] = {
    "question": "How many clients have an even street number?",
    "is_correct": False,
    "ground_truth": "8",
    "mistake_agent": "Excel_Expert",
    "mistake_step": "1",
    "mistake_reason": "LABEL-NOT-FOR-THE-MODEL",
    "system_prompt": {"Excel_Expert": "## Your role\nExcel_Expert: reads spreadsheets."},
    "history": [
        {"content": OPENING, "role": "assistant", "name": "Planner_Expert"},
        {
            "content": "I'll load the sheet.\n```python\nimport pandas as pd\n"
            "print(pd.read_excel('clients.xlsx').shape\n```",
            "role": "user",
            "name": "Excel_Expert",
        },
        {
            "content": 'exitcode: 1 (execution failed)\nCode output:   File "x.py", line 2\n'
            "SyntaxError: '(' was never closed",
            "role": "user",
            "name": "Computer_terminal",
        },
        {
            "content": "The count is 4 based on the data.",
            "role": "user",
            "name": "Verification_Expert",
        },
        {"content": NO_CODE, "role": "user", "name": "Computer_terminal"},
        {"content": "TERMINATE", "role": "user", "name": "Verification_Expert"},
    ],
}


def chronicle_of(log: dict[str, Any]) -> tuple[Chronicle, list[Event]]:
    [run] = runs_from(log)
    events = [Event.from_dict(e) for e in run.events]
    start = run.events[0]
    task = Task(task_id=run.task_id, task_type=start["task_type"], goal=start["goal"])
    return replay(task, events), events


def test_an_ag2_log_is_detected_and_each_message_is_one_event_with_its_agent() -> None:
    assert detect_format(LOG) == "ag2"
    assert detect_format([LOG, LOG]) == "ag2"
    [run] = runs_from(LOG)
    events = run.events
    assert [e["type"] for e in events] == [
        "task_start",
        "llm_decision",
        "llm_decision",
        "action_executed",
        "llm_decision",
        "state_change",
        "llm_decision",
        "task_end",
    ]
    # A message's index in the history is its event's seq - 1.
    for i, msg in enumerate(LOG["history"]):
        assert events[i + 1]["seq"] == i + 1
        if msg["name"] != "Computer_terminal":
            assert events[i + 1]["agent_state"]["agent"] == msg["name"]
    assert events[0]["goal"] == LOG["question"]
    assert events[0]["task_type"] == "group_chat"
    assert events[-1]["result"]["status"] == "failed"  # is_correct: false
    assert events[2]["decision"]["chosen_action"] == "execute_code"


def test_a_failed_execution_is_a_failed_tool_call_of_the_agent_whose_code_it_ran() -> None:
    [run] = runs_from(LOG)
    ran = run.events[3]
    assert ran["agent_state"] == {"agent": "Excel_Expert", "executor": "Computer_terminal"}
    assert ran["input"]["tool"] == "execute_code"
    assert "read_excel" in ran["input"]["args"]["code"]
    assert ran["result"]["status"] == "failed"
    assert ran["result"]["error_type"] == "SyntaxError"
    assert ran["result"]["exit_code"] == 1
    nothing = run.events[5]
    assert nothing["type"] == "state_change"
    assert nothing["agent_state"]["agent"] == "Computer_terminal"


def test_a_timeout_and_an_error_printed_with_exit_code_0_are_failures_too() -> None:
    log = copy.deepcopy(LOG)
    log["history"][2]["content"] = "exitcode: 124 (execution failed)\nCode output: \nTimeout"
    assert runs_from(log)[0].events[3]["result"]["error_type"] == "Timeout"
    log["history"][2]["content"] = (
        "exitcode: 0 (execution succeeded)\nCode output: Traceback (most recent call last):\n"
        "KeyError: 'Street'"
    )
    result = runs_from(log)[0].events[3]["result"]
    assert result["status"] == "failed" and result["error_type"] == "KeyError"
    log["history"][2]["content"] = "exitcode: 0 (execution succeeded)\nCode output: 4\n"
    assert runs_from(log)[0].events[3]["result"] == {"status": "succeeded", "output": "4\n"}


def test_the_dataset_labels_never_reach_the_events() -> None:
    [run] = runs_from(LOG)
    text = str(run.events)
    assert "LABEL-NOT-FOR-THE-MODEL" not in text
    assert "mistake_agent" not in text and "ground_truth" not in text


def test_read_runs_and_the_format_option_take_ag2(tmp_path: Path) -> None:
    import json

    from hindsight_loop.ingest import read_runs

    path = tmp_path / "chat.json"
    path.write_text(json.dumps(LOG))
    assert read_runs(path)[0].events == read_runs(path, "ag2")[0].events
    with pytest.raises(ValueError, match="history"):
        runs_from({"messages": []}, "ag2")


def test_replay_finds_handoffs_and_groups_key_nodes_by_agent() -> None:
    chronicle, _ = chronicle_of(LOG)
    assert isinstance(chronicle, TeamChronicle)
    handoffs = [k for k in chronicle.key_nodes if k.kind == "handoff"]
    assert [(k.index, k.related) for k in handoffs] == [(2, [1, 2]), (4, [2, 4])]
    assert handoffs[0].summary == "Planner_Expert → Excel_Expert"
    assert all(len(k.summary) <= 50 for k in chronicle.key_nodes)
    assert chronicle.step_agents[3] == "Excel_Expert"  # the execution is the author's
    assert list(chronicle.agents) == [
        "Planner_Expert",
        "Excel_Expert",
        "Verification_Expert",
        "Computer_terminal",
    ]
    assert [k.kind for k in chronicle.agents["Excel_Expert"]] == ["handoff", "first_failure"]
    assert [k.kind for k in chronicle.agents["Verification_Expert"]] == ["handoff"]
    assert chronicle.agents["Planner_Expert"] == []
    # A reviewer sees who did each step.
    assert chronicle.steps[3].summary.startswith("Excel_Expert: execute_code")
    assert chronicle.steps[4].summary.startswith("Verification_Expert: ")
    assert all(len(s.summary) <= 80 for s in chronicle.steps)


def test_wire_events_can_name_agent_and_role() -> None:
    def ev(seq: int, agent: str, role: str) -> Event:
        return Event(
            event_id=f"e{seq}",
            task_id="t",
            seq=seq,
            timestamp=f"2024-01-01T00:00:0{seq}.000Z",
            type="llm_decision",
            agent_state={"agent": agent, "role": role},
            decision={"chosen_action": "reply", "message": f"turn {seq}"},
        )

    chronicle = replay(
        Task(task_id="t", task_type="team"),
        [ev(0, "a1", "planner"), ev(1, "b1", "coder"), ev(2, "a1", "planner")],
    )
    assert isinstance(chronicle, TeamChronicle)
    assert chronicle.roles == {"a1": "planner", "b1": "coder"}
    assert [k.index for k in chronicle.key_nodes if k.kind == "handoff"] == [1, 2]


def test_a_single_agent_run_replays_as_before() -> None:
    log = copy.deepcopy(LOG)
    for msg in log["history"]:
        if msg["name"] != "Computer_terminal":
            msg["name"] = "Solo_Expert"
    chronicle, _ = chronicle_of(log)
    assert type(chronicle) is Chronicle
    assert "handoff" not in {k.kind for k in chronicle.key_nodes}
    assert set(chronicle.to_dict()) == {"task", "steps", "key_nodes", "event_count", "compressed"}


# -- lessons for a role, lessons for the team ------------------------------------------------

TEAM = "group_chat"
AGENTS = ("Excel_Expert", "Verification_Expert", "Planner_Expert")


def test_scopes_for_names_the_role_and_the_team() -> None:
    assert scopes_for("Excel_Expert", TEAM) == ["agent:Excel_Expert", "team:group_chat"]
    assert scopes_for("agent:Excel_Expert", "team:x") == ["agent:Excel_Expert", "team:x"]
    assert scopes_for(None, TEAM) == ["team:group_chat"]
    assert scopes_for() == []


def test_a_team_lesson_reaches_every_agent_and_a_role_lesson_only_its_role(
    tmp_path: Path,
) -> None:
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        team = hs.add_lesson(
            LessonDraft(
                task_type=TEAM,
                advice="Before you say the task is done, you should wait for the code output "
                "and quote the numbers it printed.",
                features=Features(keywords=["verify", "output"]),
                scope=f"team:{TEAM}",
            )
        )
        excel = hs.add_lesson(
            LessonDraft(
                task_type=TEAM,
                advice="When you read a spreadsheet with pandas, you should check the column "
                "names first.",
                features=Features(keywords=["spreadsheet", "pandas"]),
                scope="agent:Excel_Expert",
            )
        )
        other_team = hs.add_lesson(
            LessonDraft(
                task_type=TEAM,
                advice="你应该先列出计划再分配任务给其他专家。",
                features=Features(keywords=["计划"]),
                scope="team:another_team",
            )
        )
        for agent in AGENTS:
            found = hs.recall(
                task_type=TEAM,
                query="count even street numbers in the clients spreadsheet and verify the output",
                scope=scopes_for(agent, TEAM),
            )
            ids = {lesson.lesson_id for lesson in found}
            assert team.lesson_id in ids, agent
            assert (excel.lesson_id in ids) == (agent == "Excel_Expert"), agent
            assert other_team.lesson_id not in ids
            messages = hs.inject(
                [
                    {"role": "system", "content": f"You are {agent}."},
                    {"role": "user", "content": "Count the even street numbers."},
                ],
                list(found),
            )
            prompt = " ".join(str(m["content"]) for m in messages)
            assert "quote the numbers it printed" in prompt
            assert ("check the column names first" in prompt) == (agent == "Excel_Expert")
        # Global recall alone sees neither: the scoped lessons stay with their role and team.
        assert not hs.recall(task_type=TEAM, query="spreadsheet verify output")


def _recovered_log() -> dict[str, Any]:
    """LOG, where Excel_Expert fixes its code and the run goes on."""
    log = copy.deepcopy(LOG)
    fixed = (
        "Fixed.\n```python\nimport pandas as pd\nprint(pd.read_excel('clients.xlsx').shape)\n```"
    )
    log["history"][3:3] = [
        {"content": fixed, "role": "user", "name": "Excel_Expert"},
        {"content": "exitcode: 0 (execution succeeded)\nCode output: (10, 3)", "role": "user",
         "name": "Computer_terminal"},
    ]  # fmt: skip
    return log


def test_a_team_runs_reflected_lessons_are_scoped_to_the_role_it_turned_on(hs: Hindsight) -> None:
    hs.import_transcript(_recovered_log())
    [task] = hs.tasks()
    reflection = hs.reflect(task.task_id)  # the offline reflector: a lesson on the failed code
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and lesson.scope == "agent:Excel_Expert"
    query = {"task_type": task.task_type, "tools": ["execute_code"], "query": "SyntaxError"}
    mine = hs.recall(**query, scope=scopes_for("Excel_Expert", task.task_type))
    assert lesson.lesson_id in mine.ids
    theirs = hs.recall(**query, scope=scopes_for("Verification_Expert", task.task_type))
    assert lesson.lesson_id not in theirs.ids


def test_a_lesson_naming_two_agents_is_the_teams(tmp_path: Path) -> None:
    from hindsight_loop.llm.openai import OpenAILLM
    from hindsight_loop.llm.reflector import LLMReflector
    from hindsight_loop.testing.llm_server import LLMServer, answer

    lesson = {
        "advice": "Excel_Expert, you should send the file path to Verification_Expert with the "
        "count, so the check runs on the same data.",
        "root_cause": "Verification_Expert checked a count it could not reproduce.",
        "suggestions": ["Pass the data along", "Verify on the same file"],
        "general_rule": "Hand over the inputs with the result.",
        "tools": ["execute_code"],
    }
    full = {
        "task_goal": "count clients",
        "execution_path": "code failed, then ran",
        "lesson": lesson,
    }
    with LLMServer([answer(full)]) as server:
        llm = OpenAILLM("m", base_url=server.openai_base_url, api_key="k", timeout=2)
        reflector = LLMReflector(llm, owns_llm=True)
        with Hindsight(tmp_path / "hs.db", reflector=reflector, background=False) as hs:
            hs.import_transcript(_recovered_log())
            [task] = hs.tasks()
            reflection = hs.reflect(task.task_id)
            assert reflection.status == "ok"
            team_lesson = hs.lesson(reflection.lesson_ids[0])
            assert team_lesson is not None and team_lesson.scope == f"team:{task.task_type}"
            for agent in AGENTS:  # every agent of the team gets it
                found = hs.recall(
                    task_type=task.task_type,
                    tools=["execute_code"],
                    query="verify the count on the same file",
                    scope=scopes_for(agent, task.task_type),
                )
                assert team_lesson.lesson_id in found.ids, agent
