"""Hindsight as an MCP server: any MCP client can recall lessons, record runs and report outcomes.

Desktop assistants, IDE agents and frameworks that speak MCP get the whole loop as four tools,
with no Python in the agent: ``recall_lessons`` before a task, ``record_event`` while it runs
(one event or a whole trajectory), ``report_outcome`` at its end (and how the lessons did), and
``reflect_task`` to review a run into lessons now. The tool descriptions are written for the
model that will read them.

Every tool is a thin adapter over the facade; the facade's blocking work (SQLite, a reflector's
LLM call) runs in a worker thread so one slow review never stalls other requests.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from hindsight_loop.models import MAX_LESSONS, Event, Lesson, Ratings, new_id

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight

SERVER_NAME = "hindsight"

INSTRUCTIONS = """\
Hindsight is your experience memory: it keeps short lessons learned from earlier runs of tasks \
like yours, and learns new ones from how this run goes.
1. Before you start a task, call recall_lessons with the task type and what you are about to do \
(and the task's task_id, if it has one); follow the advice that fits your situation.
2. While you work, call record_event for the steps that matter (start the task with a \
task_start event, listing the lesson ids you were given in its injected_lesson_ids, then tool \
calls, decisions, user feedback), or send the whole trajectory at the end.
3. When the task is over, call report_outcome with succeeded or failed, and say which of the \
lessons recalled for this task helped or hurt (only those count).
4. Call reflect_task to turn a finished run into lessons right away."""

_WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)


def build_server(hs: Hindsight, *, name: str = SERVER_NAME) -> MCPServer:
    """The MCP server over one ``Hindsight`` facade (which the caller opens and closes)."""
    server = MCPServer(name, instructions=INSTRUCTIONS, version=_version(), log_level="WARNING")
    # Lessons recalled for a task that has not started yet, kept until its task_start arrives,
    # so the outcome can be credited to them.
    pending: dict[str, list[str]] = {}
    lock = threading.Lock()

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def recall_lessons(
        task_type: Annotated[
            str,
            Field(
                description="The kind of task, e.g. 'csv_cleaning' or 'weather_query'. "
                "Use the same name every time you do this kind of task."
            ),
        ],
        query: Annotated[
            str,
            Field(
                description="What you are about to do or the problem you hit, in a sentence "
                "(any language). An error message works well after a failure."
            ),
        ] = "",
        tools: Annotated[
            list[str],
            Field(description="Names of the tools you plan to use; lessons about them rank first."),
        ] = [],  # noqa: B006 - pydantic copies defaults; a schema default must be a literal
        task_id: Annotated[
            str | None,
            Field(
                description="Your current task's id, if you have one: Hindsight then credits "
                "the lessons with the task's outcome."
            ),
        ] = None,
        intent: Annotated[
            Literal["query", "operation", "analysis"] | None,
            Field(
                description="query (look something up), operation (change something) or "
                "analysis (work something out), when you know it."
            ),
        ] = None,
        scope: Annotated[
            str | None,
            Field(
                description="Whose lessons: 'user:NAME' or 'project:NAME' adds those to the "
                "global ones. Leave empty for global lessons only."
            ),
        ] = None,
        limit: Annotated[
            int,
            Field(
                ge=1, le=MAX_LESSONS, description=f"At most this many lessons (1-{MAX_LESSONS})."
            ),
        ] = MAX_LESSONS,
    ) -> dict[str, Any]:
        """Get the few lessons learned from earlier runs that fit the task you are about to do.

        Call this before starting a task, and again after a tool fails (with the error message
        as the query). Returns `advice`, text ready to follow, and the `lessons` behind it with
        their ids. An empty list means nothing relevant was learned yet: carry on normally.
        """

        def run() -> Any:
            return hs.recall(
                task_type=task_type,
                tools=tools,
                query=query,
                intent=intent,
                scope=scope,
                limit=limit,
            )

        found = await anyio.to_thread.run_sync(run)
        if task_id and found:
            await anyio.to_thread.run_sync(_credit, hs, task_id, [x.lesson_id for x in found])
            with lock:
                ids = pending.setdefault(task_id, [])
                ids.extend(x.lesson_id for x in found if x.lesson_id not in ids)
        return {
            "advice": found.as_prompt() if found else "",
            "lessons": [_lesson_view(x) for x in found],
        }

    @server.tool(annotations=_WRITES)
    async def record_event(
        event: Annotated[
            dict[str, Any] | None,
            Field(description="One event object (see the tool description for its shape)."),
        ] = None,
        events: Annotated[
            list[dict[str, Any]] | None,
            Field(description="A whole trajectory: a list of event objects, in order."),
        ] = None,
    ) -> dict[str, Any]:
        """Record what happened in a task: one event, or a whole trajectory at once.

        Each event is an object with a `type` and a `task_id`:
        - `task_start`: starts a task. Give `task_type`, `goal` and the `tools` you have, and in
          `injected_lesson_ids` the ids of the lessons recall_lessons gave you for it. Leave
          `task_id` out and one is made for you and returned; use it for the other events.
        - `action_executed`: one tool call. `input` = {"tool": name, "args": {...}};
          `result` = {"status": "succeeded" or "failed", "output": short text, "error_type": ...,
          "error_message": ...}.
        - `llm_decision`: `decision` = {"chosen_action": ..., "alternatives": [...],
          "confidence": 0..1}.
        - `user_input`: `input` = {"text": ...}. `feedback`: `input` = {"text": ..., "score": -1..1}
          (a negative score means the user was unhappy).
        - `state_change`: `agent_state` = {"current_step": ...}.
        - `task_end`: `result` = {"status": "succeeded" or "failed"} (or use report_outcome).
        A `timestamp` (ISO-8601 UTC) is optional; events are kept in the order given.
        """
        if (event is None) == (events is None):
            raise ToolError("pass exactly one of 'event' (one object) or 'events' (a list)")
        batch = [event] if event is not None else list(events or [])
        if not batch:
            raise ToolError("'events' is empty: pass at least one event")
        batch = [dict(e) if isinstance(e, dict) else e for e in batch]
        new_task_id: str | None = None
        for e in batch:
            if isinstance(e, dict) and e.get("type") == "task_start" and not e.get("task_id"):
                if new_task_id is not None:
                    raise ToolError(
                        "two task_start events without a task_id: give each its own task_id"
                    )
                new_task_id = e["task_id"] = new_id("tsk")
        if new_task_id is not None:
            for e in batch:
                if isinstance(e, dict) and not e.get("task_id"):
                    e["task_id"] = new_task_id
        problems = []
        for i, e in enumerate(batch):
            try:
                Event.from_dict(e)
            except (ValueError, TypeError) as exc:
                problems.append(f"event {i}: {exc}")
        if problems:
            raise ToolError(
                "nothing was recorded: "
                + "; ".join(problems)
                + ". Start a task with {'type': 'task_start', 'task_type': ..., 'goal': ...} and use "
                "the task_id it returns."
            )
        task_ids: list[str] = []
        for e in batch:
            if e["type"] == "task_start":
                with lock:
                    credited = pending.get(e["task_id"], [])
                if credited:
                    given = list(e.get("injected_lesson_ids") or [])
                    e["injected_lesson_ids"] = given + [x for x in credited if x not in given]
            hs.record(e)
            if e["task_id"] not in task_ids:
                task_ids.append(e["task_id"])
        await anyio.to_thread.run_sync(hs.flush)
        out: dict[str, Any] = {"recorded": len(batch), "task_ids": task_ids}
        if new_task_id is not None:
            out["task_id"] = new_task_id
        return out

    @server.tool(annotations=_WRITES)
    async def report_outcome(
        task_id: Annotated[str, Field(description="The task that ended.")],
        status: Annotated[
            Literal["succeeded", "failed"],
            Field(description="succeeded if the goal was met, failed if not."),
        ],
        summary: Annotated[
            str, Field(description="One or two sentences: what was achieved, or what went wrong.")
        ] = "",
        helpful_lesson_ids: Annotated[
            list[str],
            Field(
                description="Ids of lessons recalled for this task that helped (from "
                "recall_lessons with its task_id, or named in its task_start)."
            ),
        ] = [],  # noqa: B006
        harmful_lesson_ids: Annotated[
            list[str],
            Field(
                description="Ids of lessons recalled for this task that were wrong or "
                "misleading here."
            ),
        ] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """End a task: say whether it succeeded, and how the recalled lessons did.

        Lessons recalled with this task_id (or named in its task_start's injected_lesson_ids)
        are credited with the outcome automatically; list one as helpful or harmful to say so
        explicitly instead. Only those lessons can be rated: any other id is not counted and
        comes back in `lessons_ignored`. A task counts once: calling this again, or after
        sending the task's task_end, replaces the earlier outcome or rating, never adds to it.
        A failed task, or one with many steps, is queued for review so its lessons are learned.
        """
        rated = {**{x: True for x in helpful_lesson_ids}, **{x: False for x in harmful_lesson_ids}}
        updated = await anyio.to_thread.run_sync(_end_task, hs, task_id, status, summary, rated)
        with lock:
            pending.pop(task_id, None)
        return updated.answer(
            task_id,
            status,
            how="recall_lessons with its task_id, or named in its task_start's injected_lesson_ids",
        )

    @server.tool(annotations=_WRITES)
    async def reflect_task(
        task_id: Annotated[
            str, Field(description="The task to review (recorded with record_event).")
        ],
    ) -> dict[str, Any]:
        """Review a recorded task now and turn what it teaches into lessons.

        Returns the root cause found and the lessons made or strengthened, each with its id and
        advice. Later, recall_lessons returns them for similar tasks. Safe to call more than once.
        """

        def run() -> dict[str, Any]:
            hs.flush()
            if hs.get_task(task_id) is None:
                raise ToolError(
                    f"no task {task_id!r}: record it first with record_event (a task_start event)"
                )
            reflection = hs.reflect(task_id)
            lessons = [hs.lesson(x) for x in reflection.lesson_ids]
            parsed = reflection.parsed or {}
            return {
                "task_id": task_id,
                "status": reflection.status,
                "root_cause": parsed.get("root_cause", ""),
                "lessons": [_lesson_view(x) for x in lessons if x is not None],
                "error": reflection.error,
            }

        return await anyio.to_thread.run_sync(run)

    return server


def _lesson_view(lesson: Lesson) -> dict[str, Any]:
    """What a model needs of a lesson: the advice, what it is about, and its id for feedback."""
    return {
        "lesson_id": lesson.lesson_id,
        "advice": lesson.advice,
        "task_type": lesson.task_type,
        "tools": lesson.features.tools,
        "error_type": lesson.features.error_type,
        "general_rule": lesson.general_rule,
        "score": round(lesson.score, 4) if lesson.score is not None else None,
        "helpful": lesson.helpful,
        "harmful": lesson.harmful,
    }


def _credit(hs: Hindsight, task_id: str, lesson_ids: list[str]) -> None:
    """Add recalled lessons to a task that already started (its outcome is credited to them)."""
    hs.flush()
    if hs.get_task(task_id) is None:
        return  # not started yet: added to its task_start when that arrives
    hs.credit_lessons(task_id, lesson_ids)


def _end_task(
    hs: Hindsight, task_id: str, status: str, summary: str, rated: dict[str, bool]
) -> Ratings:
    try:
        return hs.report_outcome(task_id, status, summary=summary, rated=rated)  # type: ignore[arg-type]
    except KeyError:
        raise ToolError(
            f"no task {task_id!r}: start it with record_event "
            "({'type': 'task_start', 'task_type': ..., 'goal': ...}) first"
        ) from None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("hindsight-loop")
    except Exception:
        return "0"


__all__ = ["INSTRUCTIONS", "SERVER_NAME", "build_server"]
