"""Commands about recorded runs: tasks, replay, reflect, import, worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column

from hindsight_loop.cli.common import (
    DbOption,
    JsonOption,
    fail,
    heading,
    open_hs,
    print_json,
    print_table,
    say,
)


def tasks(
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    limit: Annotated[int, typer.Option(help="How many tasks, newest first.")] = 20,
    task_type: Annotated[
        str | None, typer.Option("--task-type", help="Only this task type.")
    ] = None,
    status: Annotated[str | None, typer.Option(help="running, succeeded or failed.")] = None,
) -> None:
    """List recorded tasks, newest first."""
    with open_hs(db, readonly=True) as hs:
        found = hs.tasks(limit=limit, task_type=task_type, status=status)
    if json:
        print_json([t.to_dict() for t in found])
        return
    print_table(
        [
            _id_column("task id", [t.task_id for t in found]),
            "type",
            "status",
            "events",
            "started",
            "goal",
        ],
        [
            (t.task_id, t.task_type, t.status, t.event_count, t.started_at, t.goal[:60])
            for t in found
        ],
    )


def _id_column(header: str, ids: list[str]) -> Column:
    """A column of ids, never cut: an id with an ellipsis in it cannot be copied into the next
    command (a narrow terminal shrinks the other columns instead)."""
    return Column(header, no_wrap=True, min_width=max(map(len, ids), default=len(header)))


def replay(
    task_id: Annotated[str, typer.Argument(help="The task to replay (see 'hindsight tasks').")],
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    steps: Annotated[bool, typer.Option("--steps/--no-steps", help="Show every step.")] = True,
) -> None:
    """Replay a task into its chronicle: the ordered steps and the key nodes."""
    with open_hs(db, readonly=True) as hs:
        try:
            chronicle = hs.replay(task_id)
        except KeyError:
            raise fail(
                f"no task {task_id!r} in {db}; list them with 'hindsight tasks --db {db}'"
            ) from None
    if json:
        print_json(chronicle.to_dict())
        return
    t = chronicle.task
    say((t.task_id, "bold"), f" {t.task_type} [{t.status}] {t.goal}")
    suffix = " (compressed)" if chronicle.compressed else ""
    say(f"{chronicle.event_count} events{suffix}")
    marks: dict[int, list[str]] = {}
    for node in chronicle.key_nodes:
        marks.setdefault(node.index, []).append(node.kind)
    if steps:
        from hindsight_loop.replay import step_detail

        for s in chronicle.steps:
            tag = f"  <- {', '.join(marks[s.index])}" if s.index in marks else ""
            say(f"  {s.index:>4} {s.summary}", (tag, "yellow"))
            # What the reviewer reads too: the request, the reply, arguments, the full error.
            detail = step_detail(s)
            if detail:
                say(_indent(detail, " " * 10), multiline=True)
    heading("key nodes")
    if not chronicle.key_nodes:
        say("  (none)")
    for node in chronicle.key_nodes:
        more = f"  (+{node.repeats} more like it)" if node.repeats else ""
        say(f"  {node.index:>4} {node.kind:<22} {node.summary}{more}")


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def reflect(
    task_id: Annotated[str, typer.Argument(help="The task to review.")],
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    llm: Annotated[
        bool,
        typer.Option(
            "--llm/--offline",
            help="Use the model configured by HINDSIGHT_LLM_* (default), or the offline reflector.",
        ),
    ] = True,
    kind: Annotated[str, typer.Option(help="full or local.")] = "full",
) -> None:
    """Review a task now and curate its lessons into the book; shows failed reviews too."""
    with open_hs(db) as hs:
        if hs.get_task(task_id) is None:
            raise fail(f"no task {task_id!r} in {db}; list them with 'hindsight tasks --db {db}'")
        reflector = hs.reflector if llm else hs.offline_reflector
        if llm and reflector is hs.offline_reflector and not json:
            say(
                "no model configured (HINDSIGHT_LLM_PROVIDER / HINDSIGHT_LLM_MODEL): "
                "using the offline reflector"
            )
        reflection = hs.reflect(task_id, reflector=reflector, kind=kind)
        lessons = [hs.lesson(i) for i in reflection.lesson_ids]
    if json:
        out = reflection.to_dict()
        out["lessons"] = [x.to_dict() for x in lessons if x is not None]
        print_json(out)
        return
    colour = {"ok": "green", "suspect": "yellow", "failed": "red"}[reflection.status]
    say(
        f"reflection {reflection.reflection_id} ",
        (reflection.status, colour),
        f" by {reflection.reflector}"
        + (
            f" ({reflection.model}, {reflection.latency_ms:.0f} ms)"
            if reflection.model and reflection.latency_ms
            else ""
        ),
    )
    if reflection.error:
        say(("error:", "red"), f" {reflection.error}")
    if reflection.status == "suspect" and reflection.raw_text:
        say(f"raw answer: {reflection.raw_text[:300]}")
    for lesson in lessons:
        if lesson is not None:
            say(f"  {lesson.lesson_id} [{lesson.status}] {lesson.advice}")
    if reflection.status == "ok" and not lessons:
        say("  no lesson in this run")


def reflections(
    task_id: Annotated[str | None, typer.Argument(help="Only this task's reviews.")] = None,
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
) -> None:
    """List stored reviews (ok, suspect and failed) with model, latency and tokens."""
    with open_hs(db, readonly=True) as hs:
        found = hs.reflections(task_id, limit=limit)
    if json:
        print_json([r.to_dict() for r in found])
        return
    print_table(
        [
            _id_column("reflection", [r.reflection_id for r in found]),
            _id_column("task", [r.task_id for r in found]),
            "kind",
            "status",
            "by",
            "ms",
            "tokens",
            "error",
        ],
        [
            (
                r.reflection_id,
                r.task_id,
                r.kind,
                r.status,
                r.reflector,
                f"{r.latency_ms:.0f}" if r.latency_ms is not None else "",
                f"{r.tokens_in or 0}/{r.tokens_out or 0}" if r.tokens_in is not None else "",
                (r.error or "")[:60],
            )
            for r in found
        ],
    )


def import_(
    file: Annotated[
        Path,
        typer.Argument(
            help="A transcript or trace: JSON or JSONL (wire events, OpenAI or Anthropic "
            "messages, OTLP JSON).",
            exists=True,
            dir_okay=False,
        ),
    ],
    db: DbOption = "hindsight.db",
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="auto, wire, openai, anthropic, ag2 or otlp (auto tells them apart).",
        ),
    ] = "auto",
    task_type: Annotated[
        str | None, typer.Option("--task-type", help="Task type of every imported run.")
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(help="Outcome of every run (succeeded or failed), over what it says itself."),
    ] = None,
    scope: Annotated[
        str | None, typer.Option(help="Scope of every run: global, project:NAME or user:NAME.")
    ] = None,
    json: JsonOption = False,
) -> None:
    """Load runs an agent already produced; events already stored are skipped.

    Exits 1 when any line or event was refused (each is listed on stderr; the rest is kept).
    """
    from hindsight_loop.ingest import FORMATS

    if format_ not in FORMATS:
        raise fail(f"unknown format {format_!r}; use --format {'|'.join(FORMATS)}")
    fields = {"task_type": task_type, "outcome": outcome, "scope": scope}
    with open_hs(db, create=True) as hs:
        try:
            report = hs.import_file(
                file, format=format_, **{k: v for k, v in fields.items() if v is not None}
            )
        except ValueError as exc:
            raise fail(f"cannot import {file}: {exc}") from None
        pending = hs.pending_jobs()
    if json:
        print_json(
            {
                "runs": report.runs,
                "accepted": report.accepted,
                "duplicates": report.duplicates,
                "problems": report.problems,
                "reviews_queued": pending,
            }
        )
    else:
        already = f" ({report.duplicates} already stored)" if report.duplicates else ""
        say(
            f"imported {report.accepted} events{already} into {db}; {pending} reviews queued "
            "(run 'hindsight worker --once')"
        )
        for p in report.problems[:50]:
            say(("skipped", "yellow"), f" {p}", err=True)
    if report.problems:
        # Every refusal is reported: a script that imports must notice skipped lines.
        raise typer.Exit(1)


def worker(
    db: DbOption = "hindsight.db",
    once: Annotated[bool, typer.Option("--once", help="Run what is queued, then exit.")] = False,
    poll: Annotated[float, typer.Option(help="Seconds between looks at the queue.")] = 1.0,
) -> None:
    """Run queued reviews (reflections) as a separate process on the same store."""
    with open_hs(db) as hs:
        total = 0
        while True:
            total += hs.run_pending()
            if once:
                break
            time.sleep(poll)
    say(f"ran {total} reviews")


def register(app: typer.Typer) -> None:
    app.command("tasks")(tasks)
    app.command("replay")(replay)
    app.command("reflect")(reflect)
    app.command("reflections")(reflections)
    app.command("import")(import_)
    app.command("worker")(worker)
