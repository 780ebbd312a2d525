"""The values that travel around the loop: events, tasks, chronicles, reflections, lessons.

They are plain dataclasses; identity and persistence are the store's concern. Every value has
one wire form (``to_dict`` / ``from_dict``), the JSON shape in DESIGN.md, shared by the library,
the CLI's ``--json`` output, MCP and the JSON columns of the store.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import re
import time
import unicodedata
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

EventType = Literal[
    "task_start",
    "user_input",
    "llm_decision",
    "action_executed",
    "state_change",
    "feedback",
    "task_end",
]
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))

TaskStatus = Literal["running", "succeeded", "failed"]
LessonStatus = Literal["active", "needs_review", "rejected", "expired"]
LessonKind = Literal["full_review", "local_review", "heuristic"]
Intent = Literal["query", "operation", "analysis"]
ReflectionStatus = Literal["ok", "failed", "suspect"]

#: Fields of an event that hold nested JSON objects (everything else is a scalar).
EVENT_BODY_FIELDS = ("agent_state", "context", "input", "decision", "result")
#: Top-level fields of an event kept in their own columns (everything else is its body).
WIRE_SCALARS: frozenset[str] = frozenset({"event_id", "task_id", "seq", "timestamp", "type"})

DEFAULT_VALIDITY = timedelta(days=30)

#: Most lessons recall hands to one task: a prompt with more advice than this is read less, not
#: more (DESIGN.md: "at most 3"). Every surface (library, CLI, MCP, gateway) caps at this.
MAX_LESSONS = 3
#: Most keywords a lesson is matched by, and most suggestions it carries (DESIGN.md: 3-5).
MAX_KEYWORDS = 10
MAX_SUGGESTIONS = 5


# -- outcomes: the one rule for "did this fail?" -----------------------------------------------

#: Status words integrations use for a success, a failure, and a step still under way (or
#: deliberately not run). Any other status is unusual enough to be an anomaly worth a look.
OK_STATUSES: frozenset[str] = frozenset({"succeeded", "success", "ok", "completed", "done"})
FAILED_STATUSES: frozenset[str] = frozenset({"failed", "failure", "error", "errored"})
NEUTRAL_STATUSES: frozenset[str] = frozenset(
    {"running", "pending", "started", "skipped", "cancelled", "canceled", "interrupted"}
)
KNOWN_STATUSES: frozenset[str] = OK_STATUSES | FAILED_STATUSES | NEUTRAL_STATUSES


def normal_status(status: object) -> str | None:
    """A status word as the rule reads it: lower-case and stripped, None if not a string."""
    return status.strip().lower() if isinstance(status, str) else None


def is_failure(status: object) -> bool:
    """Whether a step's ``result.status`` says it failed: the one answer to "did this fail?".

    Only the status decides: an output that merely mentions "failed" is not a failure.
    """
    return normal_status(status) in FAILED_STATUSES


def is_success(status: object) -> bool:
    """Whether a step's ``result.status`` says it succeeded."""
    return normal_status(status) in OK_STATUSES


def task_outcome(status: object) -> Literal["succeeded", "failed"]:
    """The stored outcome of a ``task_end`` status: a success word succeeds, anything else fails
    (a run that ended without saying it succeeded did not)."""
    return "succeeded" if normal_status(status) in OK_STATUSES else "failed"


# -- time and ids ---------------------------------------------------------------------------


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    """ISO-8601 in UTC with milliseconds and a ``Z``, the one timestamp form on the wire."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    # Not strftime: its %Y writes the year 1 as "1", which no ISO reader takes back.
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:"
        f"{dt.second:02d}.{dt.microsecond // 1000:03d}Z"
    )


#: Epoch seconds of the first instant a datetime holds (0001-01-01T00:00:00Z) and of the one just
#: past its last (9999-12-31T23:59:59.999999Z): a number timestamp is read inside these.
EPOCH_RANGE = (-62_135_596_800, 253_402_300_800)
#: The units a number timestamp may be in, as parts of a second, coarsest first: seconds,
#: milliseconds, microseconds, nanoseconds.
EPOCH_UNITS = (1, 10**3, 10**6, 10**9)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_unit(value: float) -> int | None:
    """The unit (parts of a second) ``parse_ts`` reads an epoch number in, None when no unit
    makes it a datetime of years 1-9999.

    The coarsest unit in which the number is such a datetime: every instant of years 1-9999 reads
    back from its seconds, and from its milliseconds, microseconds or nanoseconds but those
    from 1968-01-12 to 1978-01-11, whose finer number is also a valid coarser one (1e11 is 1973
    in ms and 5138 in seconds; seconds win). Fixed size bands instead (1e11, 1e14, 1e17) read
    the milliseconds of the year 9999 as microseconds of 1978.
    """
    first, end = EPOCH_RANGE
    for scale in EPOCH_UNITS:
        if first * scale <= value < end * scale:  # int and float compare exactly
            return scale
    return None


def parse_ts(value: str | datetime | float | int | None) -> datetime:
    """Read a caller's timestamp: ISO-8601 (``Z`` or offset), a datetime, or an epoch number.

    A number is seconds, milliseconds, microseconds or nanoseconds since 1970, whichever is the
    coarsest that makes it a time of years 1-9999 (``epoch_unit``); an integer is read exactly
    (below the microsecond it is cut, as ``iso`` cuts below the millisecond), a float to the
    nearest microsecond.

    Raises:
        ValueError: text that is not ISO-8601, a boolean, NaN or infinity, or a number out of
            range in every unit.
    """
    if value is None:
        return utcnow()
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, bool):
        raise ValueError(f"a timestamp cannot be a boolean ({value!r})")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"a timestamp must be a finite number, got {value!r}")
        scale = epoch_unit(value)
        if scale is None:
            first, end = EPOCH_RANGE
            raise ValueError(
                f"timestamp {value!r} is out of range: an epoch number must be a time of years "
                f"1-9999 in seconds ({first} to {end - 1}), milliseconds, microseconds or "
                "nanoseconds; or give an ISO-8601 text such as 2024-11-20T14:32:10.882Z"
            )
        if isinstance(value, int):
            micros = value * 10**6 // scale
        else:  # the float's exact binary value, rounded once (1.001 is 1.000999999…)
            from fractions import Fraction  # rare: most callers give text or integers

            micros = round(Fraction(value) * 10**6 / scale)
        try:
            return _EPOCH + timedelta(microseconds=micros)
        except OverflowError:  # a float a hair below the end, rounded up to it
            raise ValueError(f"timestamp {value!r} is out of range: past the year 9999") from None
    text = str(value).strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


# Ids are a per-process random prefix plus a counter: uuid4() alone costs more than the whole
# budget of a record call on the agent's thread.
def _id_prefix() -> str:
    return f"{int(time.time()):x}{os.urandom(3).hex()}"


_ID_PREFIX = _id_prefix()
_ID_COUNTER = itertools.count(1)


def _new_id_prefix() -> None:
    """A forked child's own prefix: with its parent's and counter, children forked one after
    another (a pre-forking server's workers) made the same task and event ids."""
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX = _id_prefix()
    _ID_COUNTER = itertools.count(1)


# Registered at import, before any recorder's hook (they import this module): a child's new
# recorder session and tasks take ids of the new prefix.
os.register_at_fork(after_in_child=_new_id_prefix)


def reset_in_forked_child(registry: weakref.WeakSet[Any], what: str) -> None:
    """Have a child forked from this process call ``_forked()`` on each object of ``registry``
    (recorders, stores): their threads, locks and connections are the parent's. A failure is
    logged: a fork must never fail because of Hindsight."""

    def hook() -> None:
        for thing in list(registry):
            try:
                thing._forked()
            except Exception:  # noqa: BLE001
                logging.getLogger("hindsight_loop").exception(
                    "hindsight: resetting a %s in a forked child failed", what
                )

    os.register_at_fork(after_in_child=hook)


def new_id(kind: str) -> str:
    """A short id unique across processes: ``evt_…``, ``tsk_…``, ``les_…``, ``ref_…``."""
    return f"{kind}_{_ID_PREFIX}{next(_ID_COUNTER):x}"


# -- events and tasks -------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Event:
    """One step of a run, in the wire format of DESIGN.md."""

    event_id: str
    """Unique id (``evt_…``)."""
    task_id: str
    """The task this step belongs to."""
    seq: int
    """Tie-breaker after the timestamp: replay orders by (timestamp, seq)."""
    timestamp: str
    """UTC ISO-8601 with a ``Z``."""
    type: EventType
    """What kind of step this is."""
    agent_state: dict[str, Any] | None = None
    """The agent's own state: current step, context size, model."""
    context: dict[str, Any] | None = None
    """Goal, subtask, last user input."""
    input: dict[str, Any] | None = None
    """Tool name and arguments (``action_executed``), text of a user input, …"""
    decision: dict[str, Any] | None = None
    """``chosen_action``, ``alternatives``, ``confidence``."""
    result: dict[str, Any] | None = None
    """``status`` (``succeeded`` / ``failed``), ``error_type``, ``error_message``, ``output``…"""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other top-level fields (a ``task_start`` carries the task's fields here)."""

    # What an event did and whether it failed, read the one way (``is_failure``).
    @property
    def action(self) -> str | None:
        """The tool or action this step ran, if any."""
        if self.input and isinstance(self.input.get("tool"), str):
            return self.input["tool"]
        if self.decision and isinstance(self.decision.get("chosen_action"), str):
            return self.decision["chosen_action"]
        return None

    @property
    def failed(self) -> bool:
        return is_failure((self.result or {}).get("status"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event_id": self.event_id,
            "task_id": self.task_id,
            "seq": self.seq,
            "timestamp": self.timestamp,
            "type": self.type,
        }
        for name in EVENT_BODY_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Build an event from its wire form; raises ``ValueError`` naming what is wrong."""
        problem = wire_event_problem(data)
        if problem:
            raise ValueError(problem)
        task_id, etype = data["task_id"], data["type"]
        body = {name: data.get(name) for name in EVENT_BODY_FIELDS}
        known = WIRE_SCALARS | set(EVENT_BODY_FIELDS)
        extra = {k: v for k, v in data.items() if k not in known}
        seq = data.get("seq")
        return cls(
            event_id=str(data.get("event_id") or new_id("evt")),
            task_id=task_id,
            seq=int(seq)
            if isinstance(seq, int | float | str) and str(seq).lstrip("-").isdigit()
            else 0,
            timestamp=iso(parse_ts(data.get("timestamp"))),
            type=etype,
            extra=extra,
            **body,
        )


def wire_event_problem(event: Any) -> str | None:
    """What is wrong with a wire-format event, or None: the one check of the wire format,
    used by ``Event.from_dict``, ``hs.record`` and every import."""
    if not isinstance(event, dict):
        return f"an event must be a JSON object (a dict), got {type(event).__name__}"
    etype = event.get("type")
    # Text first: a list or a dict cannot be looked up in a set (it raised into the caller),
    # and an object's own repr may raise too.
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        shown = str.__repr__(etype) if isinstance(etype, str) else f"of type {type(etype).__name__}"
        return f"unknown event type {shown}; expected one of {', '.join(sorted(EVENT_TYPES))}"
    task_id = event.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        return "an event needs a non-empty string 'task_id'"
    for name in EVENT_BODY_FIELDS:
        value = event.get(name)
        if value is not None and not isinstance(value, dict):
            return f"event field {name!r} must be an object, got {type(value).__name__}"
    return None


@dataclass(kw_only=True, slots=True)
class Task:
    """One run of an agent on one goal."""

    task_id: str
    """Unique id (``tsk_…``)."""
    task_type: str
    """What kind of task this is (``csv_cleaning``, ``weather_query``…): lessons match on it."""
    goal: str = ""
    """What the agent was asked to do."""
    scope: str = "global"
    """``global``, ``project:NAME`` or ``user:NAME``."""
    tools: list[str] = field(default_factory=list)
    """The tools the agent had."""
    intent: str | None = None
    """``query`` / ``operation`` / ``analysis`` when known."""
    status: TaskStatus = "running"
    """``running`` until the ``task_end`` event."""
    outcome: dict[str, Any] | None = None
    """The ``task_end`` result."""
    injected_lesson_ids: list[str] = field(default_factory=list)
    """Lessons that were recalled and injected into this task."""
    started_at: str = ""
    """UTC ISO timestamp of ``task_start``."""
    ended_at: str | None = None
    """UTC ISO timestamp of ``task_end``."""
    event_count: int = 0
    """How many events the store holds for the task."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(kw_only=True, slots=True)
class TaskScores:
    """What one run of a task has counted in the lessons injected into it: each lesson counts a
    task once, and a later report of the same run (a retry, a second ``task_end``, a person's
    rating) replaces the verdict counted rather than adding another."""

    run: str = ""
    """The ``started_at`` of the run these verdicts are of: a task id run again (a new
    ``task_start``) counts afresh."""
    verdicts: dict[str, bool] = field(default_factory=dict)
    """Lesson id -> the verdict its counts hold for this run: True helpful, False harmful."""
    rated: list[str] = field(default_factory=list)
    """The lessons whose verdict a rating gave (``report_outcome``'s ``rated``): the task's
    outcome leaves them as rated."""

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "verdicts": self.verdicts, "rated": self.rated}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskScores:
        return cls(
            run=str(data.get("run") or ""),
            verdicts={str(k): bool(v) for k, v in (data.get("verdicts") or {}).items()},
            rated=[str(x) for x in data.get("rated") or []],
        )


class Ratings(list[str]):
    """The ids of the lessons an outcome report rated (``Hindsight.report_outcome``), with the
    rated ids it left alone in ``ignored``.

    A task's outcome rates only the lessons injected into it: recalled for it (``hs.task``,
    ``POST /api/tasks``, MCP ``recall_lessons`` with its ``task_id``), named in its
    ``task_start``'s ``injected_lesson_ids``, or credited with ``credit_lessons``. Any other id
    is ignored, as is one this task has rated already the same way (a retry counts once) and one
    no longer in the book. A rating that changes an earlier verdict of the same task (the
    outcome's, or an earlier rating's) is listed: it moves the lesson's count from helpful to
    harmful or back, never adds one.
    """

    __slots__ = ("ignored",)
    ignored: list[str]

    def __init__(self, rated: Iterable[str] = (), *, ignored: Iterable[str] = ()) -> None:
        super().__init__(rated)
        self.ignored = list(ignored)

    def answer(self, task_id: str, status: str, *, how: str) -> dict[str, Any]:
        """What the HTTP API and the MCP server answer an outcome report with; ``how`` says
        how a lesson comes to be injected there. An ignored id is named in a note, never an
        error: the task did end, and a retry would end it again."""
        out: dict[str, Any] = {
            "task_id": task_id,
            "status": status,
            "lessons_updated": list(self),
            "lessons_ignored": self.ignored,
        }
        if self.ignored:
            out["note"] = (
                f"only lessons injected into this task ({how}) can be rated; not counted, as "
                "not injected, rated the same way for it already or not in the book: "
                + ", ".join(self.ignored)
            )
        return out


# -- lesson text ------------------------------------------------------------------------------

# What the words of a lesson (its advice, root cause, general rule, suggestions) may not hold:
# control characters but tab, newline and carriage return; the bidi embeddings, overrides and
# isolates that reorder what a reviewer sees against what a model reads (U+202A-U+202E,
# U+2066-U+2069) and the deprecated format characters beside them; interlinear annotation
# marks and tag characters, which carry text a model reads and a person cannot see; lone
# surrogates, which no UTF-8 holds. Joiners and direction marks (ZWNJ, ZWJ, LRM, RLM), which
# Persian, Indic scripts, emoji and right-to-left text need, are kept.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u206f\ufff9-\ufffb"
    "\U000e0000-\U000e007f\ud800-\udfff]"
)


def check_lesson_text(what: str, text: str) -> None:
    """Refuse lesson words that hold a character which hides or reorders text (``_HIDDEN``).

    One rule for every way a person's words enter the book (an edit over HTTP or the CLI, an
    import); a reflector's words, made from a run's own text, pass ``clear_lesson_text``.

    Raises:
        ValueError: naming the character, where it is, and the fix.
    """
    found = _HIDDEN.search(text)
    if found is None:
        return
    char = found.group()
    if 0xD800 <= ord(char) <= 0xDFFF:
        label = "(a lone surrogate)"
    else:
        label = unicodedata.name(char, "") or "(a control character)"
    raise ValueError(
        f"{what} holds U+{ord(char):04X} {label} at character "
        f"{found.start() + 1}: control, bidi-override and invisible characters hide or reorder "
        "what people review and models read; remove it (tabs and newlines are fine)"
    )


def clear_lesson_text(text: str) -> str:
    """``text`` with every character ``check_lesson_text`` refuses turned into a space: what a
    reflector wrote from a run's own text cannot be refused, only cleared."""
    return _HIDDEN.sub(" ", text) if _HIDDEN.search(text) else text


# -- replay -----------------------------------------------------------------------------------

KeyNodeKind = Literal[
    "first_failure",
    "hesitation",
    "anomaly",
    "loop",
    "consecutive_failures",
    "dissatisfaction",
    "recovery",
    "handoff",
]


@dataclass(kw_only=True, slots=True)
class Step:
    """One line of a chronicle: a compact view of one event."""

    index: int
    """Position in ``Chronicle.steps`` (0-based); the run position unless the run was compressed."""
    event_id: str
    type: str
    action: str | None = None
    """Tool or action, when the step ran one."""
    status: str | None = None
    """``succeeded`` / ``failed`` for actions."""
    step: str | None = None
    """The agent's ``current_step`` label."""
    summary: str = ""
    """One short line (<= 80 chars)."""
    error_type: str | None = None
    input: dict[str, Any] | None = None
    """The (already bounded) input of an action: ``{"tool": …, "args": {…}}``."""
    context: dict[str, Any] | None = None
    """The event's ``context`` (goal, subtask, source …), when it carried one."""
    output: Any = None
    """A bounded view of the action's output, when it had one."""


@dataclass(kw_only=True, slots=True)
class KeyNode:
    """A moment of the run worth reflecting on."""

    kind: KeyNodeKind
    index: int
    """Index of the step in the chronicle's ``steps``."""
    event_id: str
    summary: str
    """At most 50 characters."""
    action: str | None = None
    error_type: str | None = None
    related: list[int] = field(default_factory=list)
    """Indices of the other steps that make up the node (the loop's repetitions, …)."""
    repeats: int = 0
    """More nodes like this one (the same kind, tool, error, agent and, for a recovery, failed
    tool) later in the run that a compressed chronicle left out: it lists the first few of them
    and the last."""


@dataclass(kw_only=True, slots=True)
class Chronicle:
    """A run replayed into ordered steps and the key nodes a reflector should look at."""

    task: Task
    steps: list[Step]
    key_nodes: list[KeyNode]
    event_count: int
    """Events in the run before compression."""
    compressed: bool = False
    """True when steps were dropped (more than the replay limit) keeping every key node."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chronicle:
        return cls(
            task=Task.from_dict(data["task"]),
            steps=[Step(**s) for s in data.get("steps", [])],
            key_nodes=[KeyNode(**k) for k in data.get("key_nodes", [])],
            event_count=data.get("event_count", 0),
            compressed=data.get("compressed", False),
        )


# -- lessons ----------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Structured:
    """A lesson in a form a plain program can apply: when the scenario matches, prefer/avoid."""

    when: dict[str, Any] = field(default_factory=dict)
    """Conditions: ``tool``, ``step``, ``error_type``, ``input`` (key/value pairs)…"""
    prefer: dict[str, Any] | None = None
    """Action to take instead: ``{"tool": …, "args": {…}}`` (only the args that differ)."""
    avoid: dict[str, Any] | None = None
    """Action not to take: ``{"tool": …, "args": {…}}``, with ``"variants": [{…}, …]`` when
    several different calls failed."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(kw_only=True, slots=True)
class Features:
    """What a lesson is about, used by the rule stage and the ranker to match it."""

    tools: list[str] = field(default_factory=list)
    intent: str | None = None
    step: str | None = None
    error_type: str | None = None
    keywords: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(kw_only=True, slots=True)
class Lesson:
    """One piece of advice learned from past runs, ready to inject."""

    lesson_id: str
    task_type: str
    advice: str
    """Second-person advice (``You …``), injected as is."""
    features: Features = field(default_factory=Features)
    root_cause: str = ""
    suggestions: list[str] = field(default_factory=list)
    general_rule: str = ""
    structured: Structured | None = None
    kind: LessonKind = "heuristic"
    scope: str = "global"
    """``global``, ``project:NAME`` or ``user:NAME``."""
    source_task_ids: list[str] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""
    valid_until: str | None = None
    """UTC ISO; ``None`` only for pinned lessons."""
    pinned: bool = False
    status: LessonStatus = "active"
    support: int = 1
    """How many reflections said the same thing."""
    hit_count: int = 0
    """How often recall returned it."""
    helpful: int = 0
    harmful: int = 0
    value_score: float = 0.5
    conflicts: list[str] = field(default_factory=list)
    """Ids of lessons this one contradicts."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Edits: ``{"at", "by", "action", "changes"}``."""
    quality: str = "ok"
    """``ok`` or ``suspect``."""
    language: str = "en"
    """``en`` or ``zh``: the language of the advice."""
    score: float | None = None
    """Set by recall: the fused ranking score. Not stored."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lesson:
        return cls(**_lesson_kwargs(data, _LESSON_FIELDS))

    def is_live(self, now: datetime | None = None) -> bool:
        """Active and not past ``valid_until`` (pinned lessons never expire)."""
        if self.status != "active":
            return False
        if self.pinned or not self.valid_until:
            return True
        return parse_ts(self.valid_until) > (now or utcnow())


_LESSON_FIELDS = frozenset(f.name for f in dataclasses.fields(Lesson))


def _lesson_kwargs(data: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """The fields of a lesson (or a draft) from its wire form, nested values rebuilt and
    unknown keys dropped (a newer writer may add fields)."""
    kwargs = {k: v for k, v in data.items() if k in names}
    feats = kwargs.get("features")
    if isinstance(feats, dict):
        kwargs["features"] = Features(
            **{k: v for k, v in feats.items() if k in Features.__dataclass_fields__}
        )
    elif feats is None:
        kwargs.pop("features", None)
    st = kwargs.get("structured")
    if isinstance(st, dict):
        kwargs["structured"] = Structured(
            **{k: v for k, v in st.items() if k in Structured.__dataclass_fields__}
        )
    return kwargs


# -- reflection -------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class LessonDraft:
    """A lesson as a reflector proposes it, before curation gives it an id and a place."""

    task_type: str
    advice: str
    features: Features = field(default_factory=Features)
    root_cause: str = ""
    suggestions: list[str] = field(default_factory=list)
    general_rule: str = ""
    structured: Structured | None = None
    kind: LessonKind = "heuristic"
    scope: str = "global"
    source_task_ids: list[str] = field(default_factory=list)
    language: str = "en"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LessonDraft:
        return cls(**_lesson_kwargs(data, _DRAFT_FIELDS))


_DRAFT_FIELDS = frozenset(f.name for f in dataclasses.fields(LessonDraft))


@dataclass(kw_only=True, slots=True)
class Reflection:
    """What one review of one task produced, kept whether it succeeded or not."""

    reflection_id: str
    task_id: str
    kind: Literal["full", "local"] = "full"
    status: ReflectionStatus = "ok"
    """``ok``; ``suspect`` when the answer could not be parsed; ``failed`` when the call failed."""
    reflector: str = "offline"
    """``offline``, ``openai:MODEL`` or ``anthropic:MODEL``."""
    model: str | None = None
    latency_ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    parsed: dict[str, Any] | None = None
    """The structured answer (root cause, suggestions, general rule, …)."""
    raw_text: str | None = None
    """The model's raw answer, kept when it was suspect."""
    error: str | None = None
    lessons: list[LessonDraft] = field(default_factory=list)
    lesson_ids: list[str] = field(default_factory=list)
    """Ids of the lessons curation made or strengthened from this reflection."""
    created_at: str = ""
    trigger: str = "task_end"
    """What asked for the review: ``task_end``, ``consecutive_failures``, ``loop``, …"""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reflection:
        kwargs = {k: v for k, v in data.items() if k in _REFLECTION_FIELDS}
        kwargs["lessons"] = [LessonDraft.from_dict(d) for d in kwargs.get("lessons") or []]
        return cls(**kwargs)


_REFLECTION_FIELDS = frozenset(f.name for f in dataclasses.fields(Reflection))
