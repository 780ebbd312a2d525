"""``hindsight recall``: ask the lesson book what an agent would be told before a task.

The same recall the library does before every task, from the shell: handy to check what a new
lesson will reach, and why a lesson does (or does not) come back.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hindsight_loop.cli.common import (
    DbOption,
    JsonOption,
    fail,
    open_hs,
    print_json,
    print_table,
    say,
)
from hindsight_loop.lessons import check_scope

_INTENTS = ("query", "operation", "analysis")


def recall(
    query: Annotated[str, typer.Argument(help="What the task is about (English or Chinese).")] = "",
    task_type: Annotated[
        str | None, typer.Option("--task-type", help="The task's type, e.g. csv_cleaning.")
    ] = None,
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", help="A tool the agent has (repeat for several)."),
    ] = None,
    intent: Annotated[
        str | None, typer.Option(help="query, operation or analysis (default: not filtered).")
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(help="The caller's scope, e.g. user:alice or project:web (global always)."),
    ] = None,
    step: Annotated[str | None, typer.Option(help="The agent's current step label.")] = None,
    error_type: Annotated[
        str | None, typer.Option("--error-type", help="The error just met, e.g. EncodingError.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=3, help="At most this many lessons.")] = 3,
    prompt: Annotated[
        bool, typer.Option("--prompt", help="Print the advice exactly as it would be injected.")
    ] = False,
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
) -> None:
    """Recall the lessons that fit a task: ids, advice and scores (an empty list if none fit)."""
    if intent is not None and intent not in _INTENTS:
        raise fail(
            f"unknown --intent {intent!r}: use one of {', '.join(_INTENTS)}, or leave it out"
        )
    if scope is not None:
        try:
            scope = check_scope(scope)
        except ValueError as exc:
            raise fail(str(exc)) from None
    with open_hs(db, readonly=True) as hs:
        found = hs.recall(
            task_type=task_type,
            tools=tool or [],
            query=query,
            intent=intent,
            scope=scope,
            step=step,
            error_type=error_type,
            limit=limit,
        )
    if json:
        print_json([lesson.to_dict() for lesson in found])
        return
    if prompt:
        # As injected, but with any control character made visible: this goes to a terminal.
        say(found.as_prompt(), multiline=True)
        return
    if not found:
        say(
            "No lesson fits this task. (Lessons must be active, unexpired, in scope, "
            "of this task type and share a tool; see 'hindsight lessons --help'.)"
        )
        return
    print_table(
        ["score", "lesson id", "task type", "tools", "advice"],
        [
            (
                f"{lesson.score:.3f}",
                lesson.lesson_id,
                lesson.task_type,
                ", ".join(lesson.features.tools),
                lesson.advice,
            )
            for lesson in found
        ],
    )


def register(app: typer.Typer) -> None:
    app.command("recall")(recall)
