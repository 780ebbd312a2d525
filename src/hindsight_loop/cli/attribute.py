"""``hindsight attribute TASK_ID``: which agent of a failed run caused it, at which step, why.

Offline by default (rules read off the run); ``--llm`` asks the model configured by the
``HINDSIGHT_LLM_*`` environment variables. The answer is stored beside the task's reflections.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hindsight_loop.cli.common import DbOption, JsonOption, fail, open_hs, print_json, say


def register(app: typer.Typer) -> None:
    app.command("attribute")(attribute)


def attribute(
    task_id: Annotated[str, typer.Argument(help="The failed task (see 'hindsight tasks').")],
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    use_llm: Annotated[
        bool,
        typer.Option(
            "--llm/--offline",
            help="Ask the model set by HINDSIGHT_LLM_* (--llm) or use the offline rules.",
        ),
    ] = False,
    method: Annotated[
        str,
        typer.Option(help="With --llm: all_at_once (one call) or binary_search."),
    ] = "all_at_once",
) -> None:
    """Say which agent caused a multi-agent run to fail, at which step, and why."""
    if method not in ("all_at_once", "binary_search"):
        raise fail(f"unknown --method {method!r}; use all_at_once or binary_search")
    llm: Any = None
    if use_llm:
        from hindsight_loop.llm import LLMConfigError, from_env

        try:
            llm = from_env()
        except (LLMConfigError, ImportError) as exc:
            raise fail(str(exc)) from None
        if llm is None:
            raise fail(
                "--llm needs a model: set HINDSIGHT_LLM_PROVIDER and HINDSIGHT_LLM_MODEL "
                "(and HINDSIGHT_LLM_BASE_URL for an OpenAI-compatible server), or use --offline"
            )
    try:
        with open_hs(db) as hs:
            try:
                found = hs.attribute(task_id, llm=llm, method=method)  # type: ignore[arg-type]
            except KeyError:
                raise fail(
                    f"no task {task_id!r} in {db}; list them with 'hindsight tasks --db {db}'"
                ) from None
    finally:
        if llm is not None:
            llm.close()
    if json:
        print_json(found.to_dict())
        return
    if found.agent is None:
        say(f"no agent to blame: {found.reason}")
        return
    say(
        (found.agent, "bold"),
        f" at step {found.step}",
        f" ({found.method}, {found.confidence:.0%})",
    )
    say(f"  {found.reason}")
    if found.calls:
        say(f"  {found.calls} model call(s), {found.tokens_in + found.tokens_out} tokens")
    if found.error:
        say((f"  the model's answer was not used: {found.error}", "yellow"))
