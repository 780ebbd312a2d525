"""What the API and the pages both read and do: pages of runs and lessons, the review queue,
trends, and the review actions. One place, so the JSON and the page can never disagree.

Every call goes through the ``Hindsight`` facade. The review actions are the lesson-book
functions the CLI uses (``hindsight_loop.lessons``: confirm, reject, pin, unpin, edit), applied
with ``hs.change_lesson`` so each is one transaction with a history entry saying who made it.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hindsight_loop import lessons as book_ops
from hindsight_loop.models import Lesson, Task, parse_ts

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight

#: Rows per page: a page of 10,000 runs stays as fast as a page of 50.
PAGE_SIZE = 50
#: Task statuses a filter may name.
TASK_STATUSES = ("running", "succeeded", "failed")
#: Fields a person may change with an edit (the CLI's ``lessons edit`` options).
EDIT_FIELDS = (
    "advice",
    "general_rule",
    "root_cause",
    "suggestions",
    "task_type",
    "scope",
    "tools",
    "keywords",
    "intent",
    "step",
    "error_type",
    "valid_until",
)
#: The review actions, each a function of the lesson book module.
ACTIONS = ("confirm", "reject", "pin", "unpin", "edit", "split")


class NotFound(LookupError):
    """No such task or lesson (the message names it and where to list them)."""


class BadInput(ValueError):
    """A request the server refuses, with a message saying what to send instead."""


@dataclass(kw_only=True, slots=True)
class Page:
    """One page of a longer list."""

    items: list[Any]
    page: int
    """1-based."""
    has_next: bool
    total: int | None = None
    """How many match, when it was known without reading them all."""


def page_number(raw: Any) -> int:
    """A 1-based page number from a query string; bad input is an error, not page 1."""
    if raw in (None, ""):
        return 1
    try:
        n = int(raw)
    except (TypeError, ValueError):
        raise BadInput(f"page must be a whole number >= 1, got {raw!r}") from None
    if n < 1:
        raise BadInput(f"page must be a whole number >= 1, got {raw!r}")
    return n


def day_bound(raw: Any, name: str) -> str | None:
    """A date (``2025-01-31``) or timestamp from a filter, as the UTC ISO text tasks carry."""
    if raw in (None, ""):
        return None
    from hindsight_loop.models import iso

    try:
        return iso(parse_ts(str(raw)))
    except (TypeError, ValueError, OverflowError):
        raise BadInput(f"{name} must be a date like 2025-01-31, got {raw!r}") from None


# -- runs ---------------------------------------------------------------------------------------


def runs_page(
    hs: Hindsight,
    *,
    page: int = 1,
    task_type: str | None = None,
    status: str | None = None,
    since: str | None = None,
    until: str | None = None,
    size: int = PAGE_SIZE,
) -> Page:
    """Tasks newest first, filtered, one page of them.

    The store lists the newest N tasks of a type and status; a date range is applied to that
    list, read in growing chunks until the page is full (tasks come newest first, so reading
    stops at the first one older than ``since``).
    """
    if status and status not in TASK_STATUSES:
        raise BadInput(f"status must be one of {', '.join(TASK_STATUSES)}, got {status!r}")
    start = (page - 1) * size
    need = start + size + 1  # one more than the page: is there a next one?
    limit = need
    while True:
        got = hs.tasks(limit=limit, task_type=task_type or None, status=status or None)
        matched = [t for t in got if (not until or t.started_at <= until)]
        if since:
            matched = [t for t in matched if t.started_at >= since]
        exhausted = len(got) < limit or bool(since and got and got[-1].started_at < since)
        if len(matched) >= need or exhausted:
            break
        limit *= 4
    items = matched[start : start + size]
    return Page(items=items, page=page, has_next=len(matched) > start + size)


def run_view(hs: Hindsight, task_id: str) -> dict[str, Any]:
    """A run for people: the task, its chronicle, key nodes by step, injected lessons, reviews."""
    task = hs.get_task(task_id)
    if task is None:
        raise NotFound(f"no task {task_id!r}; list them at /runs or GET /api/tasks")
    chronicle = hs.replay(task_id)
    marks: dict[int, list[str]] = defaultdict(list)
    for node in chronicle.key_nodes:
        marks[node.index].append(node.kind)
    injected = [x for i in task.injected_lesson_ids if (x := hs.lesson(i)) is not None]
    return {
        "task": task,
        "chronicle": chronicle,
        "marks": dict(marks),
        "injected": injected,
        "reflections": hs.reflections(task_id, limit=20),
    }


# -- lessons ------------------------------------------------------------------------------------


class BookCache:
    """The whole lesson book, parsed once per book version.

    The lessons page and the review queue sort and filter the whole book; reading 10,000 JSON
    bodies on every page view would cost more than the page. The book version moves with every
    saved change, so a cached book is never served stale after a review action.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None
        self._book: list[Lesson] = []

    def get(self, hs: Hindsight) -> list[Lesson]:
        with self._lock:
            held, book = self._version, self._book
        if held is None:
            version = hs.book_version()
            book = hs.lessons()
        else:
            # Another process (a worker, another server) may have saved lessons: read only
            # those, not the whole book.
            version, saved = hs.lessons_since(held)
            if version == held and not saved:
                return book
            book = _patched(book, saved)
        with self._lock:
            if self._version == held:
                self._version, self._book = version, book
        return book

    def version(self) -> int | None:
        with self._lock:
            return self._version

    def changed(self, hs: Hindsight, before: int | None, lessons: list[Lesson]) -> None:
        """Patch in lessons this process just saved, one save each, instead of parsing the
        whole book again (a reviewer's next page would wait for that). Only when nobody else
        saved in between: otherwise the next ``get`` reads the book anew."""
        now = hs.book_version()
        with self._lock:
            if before is None or self._version != before or now != before + len(lessons):
                return
            self._book = _patched(self._book, lessons)
            self._version = now


def _patched(book: list[Lesson], saved: list[Lesson]) -> list[Lesson]:
    """The book with ``saved`` in place of the lessons of the same id (new ones at the end)."""
    if not saved:
        return book
    by_id = {x.lesson_id: x for x in saved}
    return [by_id.pop(x.lesson_id, x) for x in book] + list(by_id.values())


def _matches(lesson: Lesson, words: list[str]) -> bool:
    hay = " ".join(
        (
            lesson.lesson_id,
            lesson.advice,
            lesson.general_rule,
            lesson.root_cause,
            lesson.task_type,
            " ".join(lesson.features.tools),
            " ".join(lesson.features.keywords),
            lesson.features.error_type or "",
        )
    ).casefold()
    return all(w in hay for w in words)


def lessons_page(
    book: list[Lesson],
    *,
    page: int = 1,
    q: str = "",
    status: str | None = None,
    task_type: str | None = None,
    scope: str | None = None,
    size: int = PAGE_SIZE,
) -> Page:
    """Lessons best value first (live ones before the rest), filtered and searched.

    Search is by words, case-folded, in any language: every word must occur in the advice,
    rule, root cause, task type, tools, keywords or error type.
    """
    if status and status not in book_ops.STATUSES:
        raise BadInput(f"status must be one of {', '.join(book_ops.STATUSES)}, got {status!r}")
    words = q.casefold().split()
    found = [
        x
        for x in book
        if (not status or x.status == status)
        and (not task_type or x.task_type == task_type)
        and (not scope or x.scope == scope)
        and (not words or _matches(x, words))
    ]
    found.sort(key=lambda x: (x.status != "active", -x.value_score, x.created_at))
    start = (page - 1) * size
    return Page(
        items=found[start : start + size],
        page=page,
        has_next=len(found) > start + size,
        total=len(found),
    )


@dataclass(kw_only=True, slots=True)
class ReviewItem:
    """A lesson that needs a person, why, and the live lessons it conflicts with."""

    lesson: Lesson
    reasons: list[str]
    rivals: list[Lesson] = field(default_factory=list)
    #: Wordings merged on the pair judge's word alone, for a person to look at
    #: (``lessons.judged_merges``).
    judged: list[dict[str, Any]] = field(default_factory=list)


def review_queue(book: list[Lesson]) -> list[ReviewItem]:
    """What needs a person (``lessons.review_reasons``, as ``hindsight lessons review``).

    A conflict is listed once, from its older side, with the other side beside it.
    """
    by_id = {x.lesson_id: x for x in book}
    queue: list[ReviewItem] = []
    shown_pairs: set[frozenset[str]] = set()
    for lesson in book:
        reasons = book_ops.review_reasons(lesson, by_id)
        if not reasons:
            continue
        rivals = [
            other
            for cid in lesson.conflicts
            if (other := by_id.get(cid)) is not None and other.status in {"active", "needs_review"}
        ]
        pairs = {frozenset((lesson.lesson_id, r.lesson_id)) for r in rivals}
        if rivals and pairs <= shown_pairs and len(reasons) == 1:
            continue  # this conflict is already on the queue from its other side
        shown_pairs |= pairs
        queue.append(
            ReviewItem(
                lesson=lesson,
                reasons=reasons,
                rivals=rivals,
                judged=book_ops.judged_merges(lesson),
            )
        )
    queue.sort(key=lambda i: (i.lesson.status != "needs_review", i.lesson.created_at))
    return queue


# -- review actions -----------------------------------------------------------------------------


def act(
    hs: Hindsight,
    lesson_id: str,
    action: str,
    *,
    by: str,
    reason: str = "",
    changes: dict[str, Any] | None = None,
    cache: BookCache | None = None,
    settles_judged: bool = True,
) -> Lesson:
    """Confirm, reject, pin, unpin, edit or split one lesson, as the CLI does (``split``:
    the wordings merged on the model's word alone become lessons of their own, waiting for
    review; the lesson as changed is returned). ``settles_judged``: whether a confirmation
    also says those wordings say the same (``lessons.confirm``).

    Raises:
        BadInput: an unknown action, or an edit with no or bad fields (nothing is changed).
        NotFound: there is no such lesson.
    """
    if action not in ACTIONS:
        raise BadInput(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    if not by.strip():
        raise BadInput("say who makes the change ('by')")
    if by.strip() in book_ops.MACHINE_ACTORS:
        raise BadInput(
            f"'by' names a person: {', '.join(sorted(book_ops.MACHINE_ACTORS))} are Hindsight's own"
        )
    if action == "confirm":
        apply = lambda x: book_ops.confirm(x, by=by, settles_judged=settles_judged)  # noqa: E731
    elif action == "reject":
        apply = lambda x: book_ops.reject(x, by=by, reason=reason)  # noqa: E731
    elif action == "pin":
        apply = lambda x: book_ops.pin(x, by=by)  # noqa: E731
    elif action == "unpin":
        apply = lambda x: book_ops.unpin(x, by=by)  # noqa: E731
    elif action == "edit":
        fields = _edit_fields(changes)
        apply = lambda x: book_ops.edit(x, by=by, **fields)  # noqa: E731
    else:
        return _split(hs, lesson_id, by=by, cache=cache)
    before = cache.version() if cache is not None else None
    try:
        changed = hs.change_lesson(lesson_id, apply)
    except ValueError as exc:  # a field the lesson book refused: nothing was saved
        raise BadInput(str(exc)) from None
    if changed is None:
        raise NotFound(f"no lesson {lesson_id!r}; list them at /lessons or GET /api/lessons")
    if cache is not None:
        cache.changed(hs, before, [changed])
    return changed


def _split(hs: Hindsight, lesson_id: str, *, by: str, cache: BookCache | None) -> Lesson:
    """``act``'s split: the lesson and the ones split out of it are saved at once."""
    before = cache.version() if cache is not None else None
    try:
        split = hs.split_lesson(lesson_id, by=by)
    except ValueError as exc:  # no merge on the model's word to take back: nothing changed
        raise BadInput(str(exc)) from None
    if split is None:
        raise NotFound(f"no lesson {lesson_id!r}; list them at /lessons or GET /api/lessons")
    changed, added = split
    if cache is not None:
        cache.changed(hs, before, [changed, *added])
    return changed


def _edit_fields(changes: dict[str, Any] | None) -> dict[str, Any]:
    if not isinstance(changes, dict) or not changes:
        raise BadInput(f"an edit needs at least one of: {', '.join(EDIT_FIELDS)}")
    unknown = sorted(set(changes) - set(EDIT_FIELDS))
    if unknown:
        raise BadInput(
            f"cannot edit {', '.join(map(repr, unknown))}; editable: {', '.join(EDIT_FIELDS)}"
        )
    out = dict(changes)
    for name in ("intent", "step", "error_type"):
        if name in out and out[name] == "":
            out[name] = None  # an empty field clears it, as with the CLI
    return out


def resolve_conflict(
    hs: Hindsight,
    keep: str,
    drop: str,
    *,
    by: str,
    cache: BookCache | None = None,
    same: bool = False,
) -> tuple[Lesson, Lesson]:
    """Settle a conflict: confirm the lesson to keep, reject the other (both checked first).
    With ``same`` the two say one thing (a near pair the rules could not read): the kept one
    also takes the other's support and wording (``lessons.same_as``).

    Raises:
        BadInput: the two are the same, or do not conflict.
        NotFound: either lesson is missing.
    """
    if keep == drop:
        raise BadInput("keep and reject must be two different lessons")
    kept, dropped = hs.lesson(keep), hs.lesson(drop)
    for lesson_id, lesson in ((keep, kept), (drop, dropped)):
        if lesson is None:
            raise NotFound(f"no lesson {lesson_id!r}; list them at /lessons or GET /api/lessons")
    assert kept is not None and dropped is not None
    if drop not in kept.conflicts and keep not in dropped.conflicts:
        raise BadInput(f"{keep!r} and {drop!r} do not conflict; reject or confirm each instead")
    if same:
        if not by.strip():
            raise BadInput("say who makes the change ('by')")
        before = cache.version() if cache is not None else None
        try:
            merged = hs.merge_lessons(drop, keep, by=by)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        rejected = hs.lesson(drop)
        assert merged is not None and rejected is not None
        if cache is not None:
            cache.changed(hs, before, [merged, rejected])
        return act(hs, keep, "confirm", by=by, cache=cache, settles_judged=False), rejected
    rejected = act(
        hs, drop, "reject", by=by, reason=f"conflict settled in favour of {keep}", cache=cache
    )
    # Kept against the other side: what the model merged into it is still for a person to see.
    confirmed = act(hs, keep, "confirm", by=by, cache=cache, settles_judged=False)
    return confirmed, rejected


# -- trends -------------------------------------------------------------------------------------

#: Most tasks the trends read (newest first): enough for months of runs, bounded for the page.
TRENDS_TASKS = 20_000


def trends(hs: Hindsight, book: list[Lesson]) -> dict[str, Any]:
    """Success rate per task type and day, lessons created / confirmed / rejected per day, and
    helpful vs harmful outcomes per task type."""
    tasks: list[Task] = hs.tasks(limit=TRENDS_TASKS)
    per_type: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for t in tasks:
        if t.status == "running" or not t.started_at:
            continue
        cell = per_type[t.task_type][t.started_at[:10]]
        cell[1] += 1
        cell[0] += t.status == "succeeded"
    success = {
        tt: [(day, ok / n, n) for day, (ok, n) in sorted(days.items())]
        for tt, days in sorted(per_type.items())
    }
    made: Counter[str] = Counter()
    confirmed: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    helpful: Counter[str] = Counter()
    harmful: Counter[str] = Counter()
    for lesson in book:
        if lesson.created_at:
            made[lesson.created_at[:10]] += 1
        for entry in lesson.history:
            day = str(entry.get("at", ""))[:10]
            if not day:
                continue
            if entry.get("action") == "confirm":
                confirmed[day] += 1
            elif entry.get("action") == "reject":
                rejected[day] += 1
        helpful[lesson.task_type] += lesson.helpful
        harmful[lesson.task_type] += lesson.harmful
    days = sorted(set(made) | set(confirmed) | set(rejected))
    return {
        "success": success,
        "lessons": [(d, made[d], confirmed[d], rejected[d]) for d in days],
        "outcomes": [(tt, helpful[tt], harmful[tt]) for tt in sorted(set(helpful) | set(harmful))],
        "tasks_read": len(tasks),
    }
