"""AG2 / AutoGen group-chat logs into wire-format events.

A group chat is many agents taking turns in one conversation (``history``: messages with the
speaker's ``name``, a ``role`` and ``content``), as AG2's ``GroupChat`` keeps it and as the
Who&When failure-attribution logs store it. The mapping keeps one event per message, in order,
so a message's position in the history is its event's ``seq - 1`` (``task_start`` is seq 0):

- an agent's message: an ``llm_decision`` by that agent (``agent_state.agent`` = its name;
  ``chosen_action`` is ``execute_code`` when it holds a code block, else ``reply``);
- the code executor's answer (``exitcode: N …``): an ``action_executed`` of ``execute_code``
  by the agent whose code it ran (the last agent that spoke), with the executor kept in
  ``agent_state.executor`` and the code in ``input.args``. A non-zero exit code (1 for an
  exception, 124 for a timeout) is a failure; with exit code 0 the output is read by
  ``wire.tool_result`` like any tool output (a printed traceback still counts);
- the executor saying there was nothing to run: a ``state_change`` by the executor.

The run's ``question`` is the goal, ``is_correct`` its outcome. Labels a dataset adds for
evaluation (``mistake_agent``, ``mistake_step``, ``mistake_reason``, ``ground_truth``) are not
part of the run and are left out, so nothing downstream can read the answer off the task.
"""

from __future__ import annotations

import re
from typing import Any

from hindsight_loop.ingest.wire import (
    GENERIC_ERROR_TYPE,
    Overrides,
    RunBuilder,
    digest,
    split_run,
    text_of,
    timestamp_ns,
    tool_result,
)

#: The task type of an imported group chat when neither the caller nor the run names one.
AG2_TASK_TYPE = "group_chat"
#: Keys of a run object that label it for evaluation rather than describe it.
LABEL_KEYS = frozenset({"mistake_agent", "mistake_step", "mistake_reason", "ground_truth"})

_EXIT = re.compile(r"^\s*exitcode:\s*(-?\d+)[^\n]*\n?(?:Code output:\s?)?", re.IGNORECASE)
_NO_CODE = re.compile(r"^\s*There is no code from the last \d+ message", re.IGNORECASE)
_CODE_BLOCK = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_EXECUTORS = ("computer_terminal", "executor", "code_executor", "user_proxy")


def is_ag2_run(item: Any) -> bool:
    """A group-chat log: an object whose ``history`` is a list of messages naming speakers."""
    if not isinstance(item, dict):
        return False
    history = item.get("history")
    return (
        isinstance(history, list)
        and bool(history)
        and all(isinstance(m, dict) and "content" in m for m in history)
        and any(isinstance(m.get("name"), str) for m in history)
    )


def is_executor(name: str | None, content: str) -> bool:
    """Whether a message is the code executor's answer rather than an agent speaking."""
    if _EXIT.match(content) or _NO_CODE.match(content):
        return True
    return name is not None and name.lower() in _EXECUTORS and content.strip() != "TERMINATE"


def ag2_events(run: Any, overrides: Overrides | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Map one AG2 group-chat log to wire events (``task_start`` first, ``task_end`` last)."""
    if not is_ag2_run(run):
        raise ValueError("an AG2 group chat is an object with a 'history' list of messages")
    overrides = overrides or Overrides()
    body = {k: v for k, v in run.items() if k != "history" and k not in LABEL_KEYS}
    messages, info = split_run({**body, "messages": run["history"]})
    question = run.get("question")
    if info.goal is None and isinstance(question, str) and question:
        info.goal = question
    info.metadata.pop("question", None)
    if info.outcome is None and isinstance(run.get("is_correct"), bool):
        info.outcome = run["is_correct"]
    info.task_type = info.task_type or AG2_TASK_TYPE
    builder = RunBuilder(digest(body | {"history": run["history"]}))
    last_agent: str | None = None
    last_code: dict[str, Any] = {}
    for msg in messages:
        text, _ = text_of(msg.get("content"))
        name = msg.get("name") if isinstance(msg.get("name"), str) else None
        when = timestamp_ns(msg.get("timestamp"))
        if name is not None and is_executor(name, text):
            exit_match = _EXIT.match(text)
            if exit_match is None:
                builder.add(
                    "state_change",
                    when,
                    agent_state={"agent": name},
                    input={"text": text, "note": "no code to execute"},
                )
                continue
            event = builder.action("execute_code", last_code, when, agent=last_agent or name)
            event["agent_state"]["executor"] = name
            event["result"] = _execution_result(int(exit_match.group(1)), text[exit_match.end() :])
            continue
        blocks = _CODE_BLOCK.findall(text)
        builder.decision(text, ["execute_code"] if blocks else [], when, agent=name)
        last_agent = name
        last_code = (
            {
                "language": blocks[0][0] or "python",
                "code": "\n\n".join(code.strip() for _, code in blocks),
            }
            if blocks
            else {}
        )
    return builder.build(info, overrides)


def _execution_result(code: int, output: str) -> dict[str, Any]:
    """An executor's answer as a tool result: a non-zero exit code is a failure."""
    if code == 0:
        return tool_result(output)
    result = tool_result(output, is_error=True)
    if result.get("error_type") == GENERIC_ERROR_TYPE:
        result["error_type"] = "Timeout" if code == 124 else f"ExitCode{code}"
    result["exit_code"] = code
    return result
