"""``hindsight lessons …``: people stay in charge of the lesson book.

Review what curation and feedback flagged, confirm, edit, reject, pin and expire lessons (each
change lands in the lesson's history with who made it), and move the book in and out as
knowledge-base entries (Markdown) or JSON lines.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from hindsight_loop import lessons as book_ops
from hindsight_loop.cli.common import DbOption, JsonOption, fail, heading, open_hs, print_json, say

if TYPE_CHECKING:
    from hindsight_loop.models import Lesson

lessons_app = typer.Typer(
    help="Review and curate the lesson book: list, show, review, confirm, edit, reject, pin, "
    "expire, export, import.",
    no_args_is_help=True,
)

IdArgument = Annotated[str, typer.Argument(help="Lesson id (see 'hindsight lessons list').")]
ByOption = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar="HINDSIGHT_USER",
        help="Who makes the change, kept in the lesson's history (env: HINDSIGHT_USER; "
        "default: your login name).",
    ),
]


def _who(by: str | None) -> str:
    if by:
        if by.strip() in book_ops.MACHINE_ACTORS:
            # Recorded under such a name, a person's word would count as the machine's.
            raise fail(
                f"--by names a person: {', '.join(sorted(book_ops.MACHINE_ACTORS))} are "
                "Hindsight's own"
            )
        return by
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        return "cli"


def _find(hs: Any, lesson_id: str, db: str) -> Lesson:
    lesson = hs.lesson(lesson_id)
    if lesson is not None:
        return lesson
    raise fail(
        f"no lesson {lesson_id!r} in {db}; list them with 'hindsight lessons list --db {db}'"
    )


def _check_status(status: str | None) -> None:
    if status is not None and status not in book_ops.STATUSES:
        raise fail(f"unknown status {status!r}; use one of {', '.join(book_ops.STATUSES)}")


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _done(lesson: Lesson, json: bool, message: str) -> None:
    if json:
        print_json(lesson.to_dict())
    else:
        say(f"{lesson.lesson_id} {message} [{lesson.status}]")


def _change(
    db: str, lesson_id: str, json: bool, message: str, apply: Callable[[Lesson], Lesson]
) -> None:
    """Apply one change to a lesson (read, change and save in one transaction), report it."""
    with open_hs(db) as hs:
        try:
            changed = hs.change_lesson(lesson_id, apply)
        except ValueError as exc:
            raise fail(str(exc)) from None
        if changed is None:
            _find(hs, lesson_id, db)  # says which lesson is missing and how to list them
            return
    _done(changed, json, message)


# -- read commands ------------------------------------------------------------------------------


@lessons_app.command("list")
def list_(
    db: DbOption = "hindsight.db",
    json: JsonOption = False,
    status: Annotated[
        str | None, typer.Option(help="Only this status: active, needs_review, rejected, expired.")
    ] = None,
    task_type: Annotated[
        str | None, typer.Option("--task-type", help="Only this task type.")
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(
            help="Only this scope: global, project:NAME, user:NAME, agent:ROLE or team:NAME."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (best first).")] = 100,
) -> None:
    """List lessons, best value first, with status, scope, support and outcomes."""
    _check_status(status)
    with open_hs(db, readonly=True) as hs:
        found = hs.lessons(status=status, task_type=task_type)
    if scope is not None:
        found = [x for x in found if x.scope == scope]
    found.sort(key=lambda x: (x.status != "active", -x.value_score, x.created_at))
    found = found[:limit]
    if json:
        print_json([x.to_dict() for x in found])
        return
    if not found:
        if status or task_type or scope:
            say("No lessons match.")
        else:
            say("No lessons yet: review tasks, or seed the book with 'hindsight lessons import'.")
        return
    # Two lines per lesson rather than a table: the advice needs the width, in any terminal.
    for x in found:
        pinned = ", pinned" if x.pinned else ""
        say(
            f"{x.lesson_id} [{x.status}{pinned}] {x.task_type} {x.scope} support {x.support} "
            f"helped {x.helpful} hurt {x.harmful} value {x.value_score:.2f}"
        )
        say(f"  {_short(x.advice, 200)}")


@lessons_app.command("show")
def show(lesson_id: IdArgument, db: DbOption = "hindsight.db", json: JsonOption = False) -> None:
    """Show one lesson in full, with its edit history."""
    with open_hs(db, readonly=True) as hs:
        lesson = _find(hs, lesson_id, db)
    if json:
        print_json(lesson.to_dict())
        return
    f = lesson.features
    pinned = ", pinned" if lesson.pinned else ""
    say(f"{lesson.lesson_id} [{lesson.status}{pinned}]")
    say(lesson.advice, multiline=True)
    rows = [
        ("task type", lesson.task_type),
        ("scope", lesson.scope),
        ("kind", lesson.kind),
        ("tools", ", ".join(f.tools)),
        ("intent", f.intent or ""),
        ("step", f.step or ""),
        ("error type", f.error_type or ""),
        ("keywords", ", ".join(f.keywords)),
        ("root cause", lesson.root_cause),
        ("general rule", lesson.general_rule),
        ("suggestions", " | ".join(lesson.suggestions)),
        ("support", str(lesson.support)),
        ("hits", str(lesson.hit_count)),
        ("helpful/harmful", f"{lesson.helpful}/{lesson.harmful}"),
        ("value", f"{lesson.value_score:.2f}"),
        ("quality", lesson.quality),
        ("valid until", lesson.valid_until or ("never (pinned)" if lesson.pinned else "")),
        ("conflicts", ", ".join(lesson.conflicts)),
        ("sources", ", ".join(lesson.source_task_ids)),
        ("created", lesson.created_at),
        ("updated", lesson.updated_at),
    ]
    for name, value in rows:
        if value:
            say(f"  {name:<16}{value}")
    heading("history")
    for entry in lesson.history:
        changes = entry.get("changes") or {}
        what = ", ".join(sorted(changes)) if changes else ""
        reason = f" ({entry['reason']})" if entry.get("reason") else ""
        say(
            f"  {entry.get('at', '')}  {entry.get('by', '')}: {entry.get('action', '')}"
            + (f" {what}" if what else "")
            + reason
        )


@lessons_app.command("review")
def review(db: DbOption = "hindsight.db", json: JsonOption = False) -> None:
    """List what needs a person: conflicts, suspect quality, lessons that keep hurting."""
    with open_hs(db, readonly=True) as hs:
        every = {x.lesson_id: x for x in hs.lessons()}
    queue = []
    for lesson in every.values():
        reasons = book_ops.review_reasons(lesson, every)
        if reasons:
            queue.append((lesson, reasons))
    queue.sort(key=lambda pair: (pair[0].status != "needs_review", pair[0].created_at))
    if json:
        print_json(
            [
                {
                    **lesson.to_dict(),
                    "reasons": reasons,
                    "judged_merges": book_ops.judged_merges(lesson),
                }
                for lesson, reasons in queue
            ]
        )
        return
    if not queue:
        say("Nothing needs review.")
        return
    for lesson, reasons in queue:
        say(
            f"{lesson.lesson_id} [{lesson.status}] {lesson.task_type} {lesson.scope}: "
            + "; ".join(reasons)
        )
        say(f"  {lesson.advice}")
        for other_id in lesson.conflicts:
            other = every.get(other_id)
            if other is not None and other.status in {"active", "needs_review"}:
                say(f"  vs {other_id} [{other.status}]: {other.advice}")
        for merge in book_ops.judged_merges(lesson):
            say(f"  + merged on the model's word: {merge['wording']}")
    say(
        f"{len(queue)} to review. Settle each with 'hindsight lessons confirm ID', "
        "'hindsight lessons edit ID --advice …', 'hindsight lessons reject ID', or, when it says "
        "what the other says, 'hindsight lessons merge ID --into OTHER'; wordings merged on the "
        "model's word that say something else: 'hindsight lessons split ID'."
    )


# -- changes ------------------------------------------------------------------------------------


@lessons_app.command("confirm")
def confirm(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Vouch for a lesson: it goes live (again) and its harm count starts afresh."""
    who = _who(by)
    with open_hs(db) as hs:
        _find(hs, lesson_id, db)
        lesson = hs.change_lesson(lesson_id, lambda x: book_ops.confirm(x, by=who))
        assert lesson is not None
        live = [
            other.lesson_id
            for cid in lesson.conflicts
            if (other := hs.lesson(cid)) is not None and other.status == "active"
        ]
    _done(lesson, json, "confirmed")
    if live and not json:
        say(
            f"note: it conflicts with {', '.join(live)} (active); recall never injects both. "
            "Reject the wrong one with 'hindsight lessons reject ID'."
        )


@lessons_app.command("merge")
def merge(
    lesson_id: IdArgument,
    into: Annotated[str, typer.Option("--into", help="The lesson that stays (its text is kept).")],
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Say a lesson repeats another: --into takes its support and wording; it is rejected."""
    who = _who(by)
    with open_hs(db) as hs:
        _find(hs, lesson_id, db)
        _find(hs, into, db)
        try:
            kept = hs.merge_lessons(lesson_id, into, by=who)
        except ValueError as exc:
            raise fail(str(exc)) from None
    assert kept is not None
    _done(kept, json, f"now holds {lesson_id} (support {kept.support})")


@lessons_app.command("split")
def split(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Take back the wordings merged into a lesson on the model's word alone: each becomes a
    lesson of its own, waiting for review, with the support and sources its merge brought."""
    who = _who(by)
    with open_hs(db) as hs:
        _find(hs, lesson_id, db)
        try:
            changed = hs.split_lesson(lesson_id, by=who)
        except ValueError as exc:
            raise fail(str(exc)) from None
    assert changed is not None
    kept, parts = changed
    if json:
        print_json({"lesson": kept.to_dict(), "split": [p.to_dict() for p in parts]})
        return
    say(f"{kept.lesson_id} [{kept.status}] keeps its advice (support {kept.support})")
    for part in parts:
        say(f"  {part.lesson_id} [{part.status}]: {part.advice}")
    say(
        f"{len(parts)} split out, waiting for review: 'hindsight lessons confirm ID' or "
        "'hindsight lessons reject ID'."
    )


@lessons_app.command("reject")
def reject(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    reason: Annotated[str, typer.Option(help="Why, kept in the history.")] = "",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Reject a lesson: it is kept for the record but never recalled."""
    who = _who(by)
    _change(db, lesson_id, json, "rejected", lambda x: book_ops.reject(x, by=who, reason=reason))


@lessons_app.command("pin")
def pin(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Pin a lesson: it never expires."""
    who = _who(by)
    _change(db, lesson_id, json, "pinned", lambda x: book_ops.pin(x, by=who))


@lessons_app.command("unpin")
def unpin(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Unpin a lesson: it expires again 30 days from now."""
    who = _who(by)
    _change(db, lesson_id, json, "unpinned", lambda x: book_ops.unpin(x, by=who))


@lessons_app.command("expire")
def expire(
    lesson_ids: Annotated[
        list[str] | None, typer.Argument(help="Lessons to expire now (their ids).")
    ] = None,
    db: DbOption = "hindsight.db",
    due: Annotated[
        bool, typer.Option("--due", help="Expire every active, unpinned lesson past its date.")
    ] = False,
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Expire lessons: kept, not recalled. Give ids, or --due for all that ran out."""
    if not lesson_ids and not due:
        raise fail("name the lessons to expire, or pass --due to expire all past valid_until")
    who = _who(by)
    with open_hs(db) as hs:
        for lesson_id in lesson_ids or []:
            _find(hs, lesson_id, db)  # every id is checked before anything changes
        changed = [
            lesson
            for i in lesson_ids or []
            if (lesson := hs.change_lesson(i, lambda x: book_ops.expire(x, by=who))) is not None
        ]
        if due:
            changed += hs.expire_due()
    if json:
        print_json([x.to_dict() for x in changed])
        return
    for lesson in changed:
        _done(lesson, False, "expired")
    if not changed:
        say("No lesson is past its valid_until.")


@lessons_app.command("edit")
def edit(
    lesson_id: IdArgument,
    db: DbOption = "hindsight.db",
    advice: Annotated[str | None, typer.Option(help="New advice (second person).")] = None,
    general_rule: Annotated[str | None, typer.Option("--general-rule", help="New rule.")] = None,
    root_cause: Annotated[str | None, typer.Option("--root-cause", help="New root cause.")] = None,
    suggestion: Annotated[
        list[str] | None, typer.Option("--suggestion", help="Replace suggestions (repeat).")
    ] = None,
    task_type: Annotated[str | None, typer.Option("--task-type", help="New task type.")] = None,
    scope: Annotated[
        str | None,
        typer.Option(help="New scope: global, project:NAME, user:NAME, agent:ROLE or team:NAME."),
    ] = None,
    tool: Annotated[
        list[str] | None, typer.Option("--tool", help="Replace the tools it is about (repeat).")
    ] = None,
    keyword: Annotated[
        list[str] | None, typer.Option("--keyword", help="Replace its keywords (repeat).")
    ] = None,
    intent: Annotated[
        str | None, typer.Option(help="query, operation or analysis ('' to clear).")
    ] = None,
    step: Annotated[str | None, typer.Option(help="The step it applies to ('' to clear).")] = None,
    error_type: Annotated[
        str | None, typer.Option("--error-type", help="The error it is about ('' to clear).")
    ] = None,
    valid_until: Annotated[
        str | None, typer.Option("--valid-until", help="New expiry date, e.g. 2025-12-31.")
    ] = None,
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Change a lesson's text or scenario; the history keeps the old and new values."""
    changes: dict[str, Any] = {
        "advice": advice,
        "general_rule": general_rule,
        "root_cause": root_cause,
        "suggestions": suggestion,
        "task_type": task_type,
        "scope": scope,
        "tools": tool,
        "keywords": keyword,
        "valid_until": valid_until,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    for name, value in (("intent", intent), ("step", step), ("error_type", error_type)):
        if value is not None:
            changes[name] = value or None
    if not changes:
        raise fail(
            "nothing to change: pass --advice, --general-rule, --root-cause, --suggestion, "
            "--task-type, --scope, --tool, --keyword, --intent, --step, --error-type or "
            "--valid-until"
        )
    who = _who(by)
    _change(db, lesson_id, json, "edited", lambda x: book_ops.edit(x, by=who, **changes))


# -- export and import --------------------------------------------------------------------------


@lessons_app.command("export")
def export(
    db: DbOption = "hindsight.db",
    format_: Annotated[
        str, typer.Option("--format", "-f", help="md (knowledge-base entries) or jsonl.")
    ] = "md",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
    status: Annotated[str | None, typer.Option(help="Only lessons with this status.")] = None,
) -> None:
    """Write the lesson book as Markdown entries or JSON lines ('import' reads the lines back)."""
    if format_ not in {"md", "jsonl"}:
        raise fail(f"unknown format {format_!r}; use --format md or --format jsonl")
    _check_status(status)
    with open_hs(db, readonly=True) as hs:
        found = hs.lessons(status=status)
    text = book_ops.export_jsonl(found) if format_ == "jsonl" else book_ops.export_markdown(found)
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    say(f"wrote {len(found)} lessons to {output}", err=True)


@lessons_app.command("import")
def import_(
    file: Annotated[
        str,
        typer.Argument(
            help="JSON lines ('-' for stdin): exported lessons, or hand-written entries with "
            "task_type and advice, and optional tools, intent, scope, keywords, valid_until, "
            "status, pinned."
        ),
    ],
    db: DbOption = "hindsight.db",
    by: ByOption = None,
    json: JsonOption = False,
) -> None:
    """Read lessons in: hand-written ones are curated, exported ones restored as they were.

    Curation merges repeats into the lessons they repeat and flags contradictions for review.
    An exported lesson is never written over the book's lesson of its id; one that repeats a
    lesson of the book merges into it, one new to the book comes back as it was, with what it
    contradicts flagged for review. Nothing is imported if any line is wrong.
    """
    try:
        raw = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot read {file!r}: {exc.strerror or exc}") from None
    who = _who(by)
    parsed: list[tuple[Lesson, bool]] = []
    problems: list[str] = []
    raw = raw.removeprefix("\ufeff")  # a BOM from Windows tools
    # Split on "\n" only: str.splitlines() also splits on \x85 and \u2028, which JSON strings
    # may hold raw. A "\r" left by Windows line ends is JSON whitespace.
    for number, line in enumerate(raw.split("\n"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = orjson.loads(line)
            parsed.append((book_ops.parse_import_line(obj, by=who), "lesson_id" in obj))
        except orjson.JSONDecodeError as exc:
            problems.append(f"line {number}: not valid JSON ({exc})")
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
    if problems:
        for problem in problems:
            say(problem, err=True)
        raise fail(
            f"nothing imported from {file}: fix the {len(problems)} line(s) above and run again"
        )

    outcome: dict[str, list[str]] = {
        "added": [], "merged": [], "conflicts": [], "restored": [], "kept": []
    }  # fmt: skip
    with open_hs(db, create=True) as hs:
        for lesson, exported in parsed:
            if exported:
                # Never over the book's own copy: it may hold a person's edit or rejection made
                # since the export. A restored lesson that repeats one in the book merges into
                # it; one that contradicts one is kept as exported, the pair recorded for review.
                restored = hs.restore_lesson(lesson)
                if restored is None:
                    outcome["kept"].append(lesson.lesson_id)
                elif restored.action == "merge":
                    outcome["merged"].append(restored.lesson.lesson_id)
                elif restored.others:
                    outcome["conflicts"].append(lesson.lesson_id)
                else:
                    outcome["restored"].append(lesson.lesson_id)
                continue
            change = hs.curate(lesson)
            key = {"add": "added", "merge": "merged", "conflict": "conflicts"}[change.action]
            outcome[key].append(change.saves[0].lesson_id)
    if json:
        print_json(outcome)
        return
    counts = ", ".join(f"{len(ids)} {name}" for name, ids in outcome.items())
    say(f"imported {len(parsed)} lines from {file}: {counts}")
    if outcome["kept"]:
        say(
            f"{len(outcome['kept'])} line(s) name lessons the book holds: the book's copies are "
            "kept as they are (change them with 'hindsight lessons edit')"
        )
    if outcome["conflicts"]:
        say("see the conflicts with 'hindsight lessons review'")


def register(app: typer.Typer) -> None:
    app.add_typer(lessons_app, name="lessons")
