"""``hindsight demo``: two nights of messy CSV exports, before and after Hindsight's lessons."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from hindsight_loop.cli.common import (
    DbOption,
    JsonOption,
    console,
    fail,
    print_json,
    print_table,
    say,
)


def _llm_reflector() -> Any:
    """The model-backed reflector configured by ``HINDSIGHT_LLM_*``; exits with the fix if none."""
    try:
        from hindsight_loop.llm.reflector import reflector_from_env
    except ImportError as exc:
        raise fail(f"the LLM reflector is not available ({exc}); run without --llm") from None
    try:
        reflector = reflector_from_env()
    except ImportError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # LLMConfigError: settings present but unusable
        raise fail(str(exc)) from None
    if reflector is None:
        raise fail(
            "--llm needs a model: set HINDSIGHT_LLM_MODEL (and HINDSIGHT_LLM_BASE_URL for a "
            "local server, e.g. http://localhost:11434/v1), or run without --llm"
        )
    return reflector


def _structured_line(lesson: Any) -> str:
    st = lesson.structured
    if st is None:
        return ""
    when = st.when or {}
    ctx = ", ".join(f"{k}={v}" for k, v in (when.get("context") or {}).items())
    head = f"when {when.get('tool', 'any tool')}"
    head += f" at step {when['step']}" if when.get("step") else ""
    head += f" for {ctx}" if ctx else ""
    parts = [head]
    if st.prefer:
        args = ", ".join(f"{k}={v!r}" for k, v in (st.prefer.get("args") or {}).items())
        parts.append(f"prefer {st.prefer.get('tool')}({args})")
    if st.avoid:
        variants = st.avoid.get("variants") or [st.avoid.get("args") or {}]
        shown = " | ".join(", ".join(f"{k}={v!r}" for k, v in v.items()) for v in variants if v)
        parts.append(f"avoid {st.avoid.get('tool')}({shown})")
    return " → ".join(parts)


def _print_report(report: Any) -> None:
    from hindsight_loop.demo.data import SOURCES

    cold, warm = report.rounds
    print_table(
        [
            Column(col, justify="right" if col != "round" else "left")
            for col in ("round", "files", "cleaned", "rate", "tool calls", "calls / file")
        ],
        [
            (
                r.name,
                r.tasks,
                r.succeeded,
                f"{r.rate:.0%}",
                r.tool_calls,
                f"{r.tool_calls / r.tasks:.2f}" if r.tasks else "-",
            )
            for r in report.rounds
        ],
        title="Files cleaned correctly (checked against the ground truth)",
    )
    points = (warm.rate - cold.rate) * 100
    saved = cold.tool_calls - warm.tool_calls
    say(
        "Warm cleaned ",
        (f"{points:+.0f} percentage points", "bold"),
        " more files than cold, with ",
        (str(saved), "bold"),
        " fewer tool calls" + (f" ({-saved / cold.tool_calls:+.0%})." if cold.tool_calls else "."),
    )

    rows: list[tuple[str, ...]] = []
    for source in SOURCES:
        cells = []
        for r in report.rounds:
            files = [f for f in r.files if f.source == source.name]
            if not files:
                cells.append("-")
                continue
            ok = sum(1 for f in files if f.correct)
            calls = sum(f.tool_calls for f in files)
            cells.append(f"{ok}/{len(files)} ok, {calls} calls")
        rows.append((source.name, source.description, *cells))
    print_table(["source", "quirk", "cold", "warm"], rows, title="Per source system")

    say()
    say(("Lessons learned", "bold"), f" ({len(report.lessons)}):")
    if not report.lessons:
        say("  (none)")
    night1 = set(cold.task_ids)
    for i, lesson in enumerate(report.lessons, 1):
        # Lessons from night 2 were learned after the warm round; they did not help it.
        night = "night 1" if night1 & set(lesson.source_task_ids) else "night 2"
        say(
            f" {i}. [{night}, {lesson.kind}, support {lesson.support}, {lesson.status}] "
            f"{lesson.advice}"
        )
        line = _structured_line(lesson)
        if line:
            say("    ", (line, "dim"))
    failed = next(
        (tid for tid, f in zip(cold.task_ids, cold.files, strict=True) if not f.delivered), None
    )
    example = failed or (cold.task_ids[0] if cold.task_ids else "TASK_ID")
    say()
    say(f"Store: {report.db} (reflector: {report.reflector}, {report.seconds:.1f} s). Explore it:")
    say(f"  hindsight lessons list --db {report.db}")
    say(f"  hindsight replay {example} --db {report.db}")


def demo(
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    seed: Annotated[
        int, typer.Option(help="Night 1 uses SEED, night 2 SEED+1 (same seed, same run).")
    ] = 7,
    files: Annotated[
        int, typer.Option("--files", min=1, max=2000, help="CSV files per night.")
    ] = 24,
    llm: Annotated[
        bool,
        typer.Option(
            "--llm",
            help="Reflect with the model configured by HINDSIGHT_LLM_* instead of the offline reflector.",
        ),
    ] = False,
) -> None:
    """Clean two nights of messy CSV exports: cold, then with the lessons Hindsight learned.

    Each night brings files from six source systems (GBK, UTF-16, Latin-1 with ';', a BOM,
    quoted newlines, ragged rows). A sample agent cleans each file with a budget of tool calls;
    Hindsight records every file as a task, reflects on night 1, and recalls lessons for night 2.
    """
    from hindsight_loop.demo.run import COLD_STRATEGY, run_demo

    reflector = _llm_reflector() if llm else None
    if not json:
        say(
            ("Hindsight demo", "bold"),
            ": nightly CSV exports from six source systems, each with its own quirks.",
        )
        say(
            "The sample agent is a plain Python program, not an LLM: it reads Hindsight's "
            "lessons only through their structured form (when → prefer / avoid)."
        )
        say(f"Cold strategy: {COLD_STRATEGY}.")
    try:
        if json:
            report = run_demo(db, seed=seed, files=files, reflector=reflector)
        else:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(),
            ) as bar:
                ids = {
                    "cold": bar.add_task("night 1, cold", total=files),
                    "warm": bar.add_task("night 2, warm (with lessons)", total=files),
                }

                def progress(name: str, done: int, total: int, outcome: Any) -> None:
                    bar.update(ids[name], completed=done)

                report = run_demo(
                    db, seed=seed, files=files, reflector=reflector, progress=progress
                )
    except OSError as exc:
        raise fail(f"cannot use the store {db!r}: {exc}; pass another file with --db") from None
    if json:
        print_json(report.to_dict())
        return
    _print_report(report)


def register(app: typer.Typer) -> None:
    """Add ``hindsight demo`` to the root app."""
    app.command("demo")(demo)
