"""The sample agent: a plain program (no LLM) that cleans one CSV file with a budget of tool calls.

Cold, it does what a careful engineer would write without knowing the sources: strict codecs
first and the catch-all last (``utf-8`` → ``utf-8-sig`` → ``utf-16`` → ``gbk`` → ``latin-1``),
``,`` as the delimiter, re-reading with ``;`` when the whole header lands in one field, and
``fix_rows`` when validation finds ragged rows. It never hands over a table it did not validate.

Warm, it reads the lessons Hindsight recalled for the task and applies their *structured* form
when its ``when`` matches the call it is about to make (tool, step, the step's context): it
drops the arguments a lesson says to ``avoid`` and tries the arguments a lesson says to
``prefer`` first. That is all it does with lessons; the advice text is for LLM agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hindsight_loop.demo.data import CsvFile
from hindsight_loop.demo.tools import (
    HeaderMismatchError,
    RaggedRowsError,
    Table,
    fix_rows,
    read_csv,
    validate,
)
from hindsight_loop.models import Lesson

__all__ = ["BUDGET", "ENCODINGS", "TOOLS", "CsvAgent", "FileOutcome"]

#: The fallback order a careful engineer writes: strict codecs first, Latin-1 (which decodes
#: any byte) last, so that it cannot hide a better answer.
ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "gbk", "latin-1")
#: Tool calls allowed per file (reads, validations and repairs all count).
BUDGET = 4
TOOLS = ["read_csv", "validate", "fix_rows"]
#: The arguments of read_csv a lesson may set; anything else in a lesson's args is not ours.
_READ_KNOBS = ("encoding", "delimiter")


class _Call(Protocol):
    def result(self, output: Any = None, *, status: str | None = None, **fields: Any) -> None: ...


class TaskLike(Protocol):
    """What the agent needs from ``hs.task(...)``: its lessons and a way to record a tool call."""

    lessons: Sequence[Lesson]

    def action(
        self,
        name: str,
        input: dict[str, Any] | None = None,  # noqa: A002 - the facade's own word
        *,
        step: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> Any: ...


@dataclass(kw_only=True, slots=True)
class FileOutcome:
    """How cleaning one file went."""

    file: str
    source: str
    table: Table | None = None
    """The validated table handed over, or None when the agent gave up."""
    tool_calls: int = 0
    calls: list[str] = field(default_factory=list)
    """Each call as ``tool(args) -> ok|ErrorType``."""
    lessons_applied: list[str] = field(default_factory=list)
    """Ids of the lessons whose structured form changed what the agent did."""
    reason: str = ""
    """Why it gave up."""
    correct: bool | None = None
    """Set by the demo from the ground truth, which the agent never sees."""

    @property
    def delivered(self) -> bool:
        return self.table is not None


def _matches(when: dict[str, Any], *, tool: str, step: str, context: dict[str, Any]) -> bool:
    """Whether a lesson's ``when`` describes the call about to be made (its error type says what
    went wrong last time, so it is not a condition on a call that has not failed yet)."""
    if when.get("tool") not in (None, tool) or when.get("step") not in (None, step):
        return False
    ctx = when.get("context") or {}
    return isinstance(ctx, dict) and all(context.get(k) == v for k, v in ctx.items())


def _hits(variant: dict[str, Any], args: dict[str, Any]) -> bool:
    return bool(variant) and all(args.get(k) == v for k, v in variant.items())


class CsvAgent:
    """Cleans files one at a time, recording every tool call through the task it is given.

    Args:
        budget: Tool calls allowed per file.
        use_lessons: Apply the structured form of ``task.lessons`` (the warm agent).
    """

    def __init__(self, *, budget: int = BUDGET, use_lessons: bool = True) -> None:
        self.budget = budget
        self.use_lessons = use_lessons

    # -- planning from lessons ----------------------------------------------------------------
    def _lessons(
        self, task: TaskLike, tool: str, step: str, context: dict[str, Any]
    ) -> list[Lesson]:
        if not self.use_lessons:
            return []
        return [
            lesson
            for lesson in task.lessons
            if lesson.structured is not None
            and _matches(lesson.structured.when, tool=tool, step=step, context=context)
        ]

    def read_plan(
        self, task: TaskLike, context: dict[str, Any], applied: list[str]
    ) -> list[dict[str, str]]:
        """The read_csv arguments to try, in order: lessons' preferences first, avoided ones out."""
        ladder = [{"encoding": enc, "delimiter": ","} for enc in ENCODINGS]
        avoid: list[dict[str, Any]] = []
        prefer: list[dict[str, Any]] = []
        for lesson in self._lessons(task, "read_csv", "parse", context):
            st = lesson.structured
            assert st is not None
            used = False
            if st.avoid and st.avoid.get("tool") == "read_csv":
                avoid += st.avoid.get("variants") or [st.avoid.get("args") or {}]
                used = True
            if st.prefer and st.prefer.get("tool") == "read_csv":
                args = st.prefer.get("args") or {}
                prefer.append({k: str(args[k]) for k in _READ_KNOBS if k in args})
                used = True
            if used:
                applied.append(lesson.lesson_id)
        # A preference names only the arguments that differ from the call that failed, so it
        # is laid over each call of the ladder (all preferences together first, then each on
        # its own); what any lesson says to avoid is then dropped, whichever lesson it came from.
        overlays: list[dict[str, str]] = []
        if prefer:
            together: dict[str, str] = {}
            for p in prefer:
                for key, value in p.items():
                    together.setdefault(key, value)  # the better-ranked lesson wins a clash
            overlays = [together, *prefer]
        candidates = [{**args, **o} for o in overlays if o for args in ladder] + ladder
        plan: list[dict[str, str]] = []
        for args in candidates:
            if args not in plan and not any(_hits(v, args) for v in avoid):
                plan.append(args)
        return plan or ladder  # everything avoided: the lessons do not fit, fall back

    def repair_first(
        self, task: TaskLike, context: dict[str, Any], applied: list[str]
    ) -> dict[str, Any] | None:
        """The fix_rows arguments a lesson says to use before validating, if one does."""
        for lesson in self._lessons(task, "validate", "validate", context):
            prefer = lesson.structured.prefer if lesson.structured else None
            if prefer and prefer.get("tool") == "fix_rows":
                applied.append(lesson.lesson_id)
                args = prefer.get("args") or {}
                return {"strategy": str(args.get("strategy", "pad"))}
        return None

    # -- the run ------------------------------------------------------------------------------
    def clean(self, task: TaskLike, file: CsvFile) -> FileOutcome:
        """Read, repair and validate one file within the budget; never raises for a bad file."""
        out = FileOutcome(file=file.name, source=file.source)
        context = {"source": file.source}
        path = str(file.path)

        def call(tool: str, step: str, args: dict[str, Any], fn: Any, *fn_args: Any) -> Any:
            """Run one tool, recorded by Hindsight; counts against the budget."""
            out.tool_calls += 1
            shown = _fmt(args)
            try:
                with task.action(tool, {**args, "path": path}, step=step, context=context) as rec:
                    value = fn(*fn_args, columns=file.columns, **args)
                    rec.result(_summary(value))
            except Exception as exc:
                out.calls.append(f"{tool}({shown}) -> {type(exc).__name__}")
                raise
            out.calls.append(f"{tool}({shown}) -> ok")
            return value

        # 1. parse: read until a read gives the expected table.
        table: Table | None = None
        plan = self.read_plan(task, context, out.lessons_applied)
        tried: list[dict[str, str]] = []
        while plan and out.tool_calls < self.budget:
            args = plan.pop(0)
            if args in tried:
                continue
            tried.append(args)
            try:
                table = call("read_csv", "parse", args, read_csv, path)
                break
            except HeaderMismatchError as exc:
                # The whole header in one field with ';' inside: a ';'-separated file.
                if len(exc.header) == 1 and ";" in exc.header[0] and args["delimiter"] != ";":
                    plan.insert(0, {**args, "delimiter": ";"})
            except Exception:  # noqa: BLE001 - a failed read moves on to the next option
                pass
        if table is None:
            out.reason = "no read of the file gave the expected table within the budget"
            return out

        # 2. validate: repair ragged rows once (first, if a lesson says so), then check.
        repaired = False
        repair = self.repair_first(task, context, out.lessons_applied)
        if repair is not None and out.tool_calls < self.budget:
            try:
                table = call("fix_rows", "validate", repair, fix_rows, table)
                repaired = True
            except Exception:  # noqa: BLE001 - validation below still decides
                pass
        while out.tool_calls < self.budget:
            try:
                call("validate", "validate", {}, validate, table)
            except RaggedRowsError:
                if repaired or out.tool_calls >= self.budget:
                    break
                try:
                    table = call("fix_rows", "validate", {"strategy": "pad"}, fix_rows, table)
                except Exception:  # noqa: BLE001
                    break
                repaired = True
                continue
            except Exception:  # noqa: BLE001 - nothing this agent can repair
                break
            out.table = table
            return out
        out.reason = "the table did not validate within the budget"
        return out


def _fmt(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _summary(value: Any) -> Any:
    """A small output to record: the shape of a table, or a row count."""
    if isinstance(value, Table):
        return {"rows": len(value.rows), "columns": len(value.columns)}
    return value
