"""Triggers: when a run asks for a review, decided as its events become durable.

Runs in the recorder's committer thread, after each batch is written (``Recorder(on_batch=...)``):
a task that ends queues a full review (and an outcome job for the lessons injected into it);
an anomaly seen mid-run (the live key-node rules of ``replay.AnomalyWatch``) queues a local
review of a window around it, so a reflection can start before the run ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from hindsight_loop.models import FAILED_STATUSES, Event, Task, is_failure
from hindsight_loop.record import WATCHED_TYPES, Row, warn
from hindsight_loop.reflect import needs_review
from hindsight_loop.replay import (
    AnomalyWatch,
    local_window,
    read_projection,
    unstored,
    wire_timestamp,
)
from hindsight_loop.store import Store

log = logging.getLogger("hindsight_loop")

#: Most local reviews one task may ask for: a run that keeps failing needs one look, not fifty.
MAX_LOCAL_REVIEWS = 3
#: Reviews a failed queueing keeps for the next batch's (the newest kept past this).
MAX_UNQUEUED = 10_000


@dataclass(kw_only=True)
class _Running:
    """What the triggers keep about one running task, dropped at its ``task_end``."""

    events: int = 0
    """Events of the task written so far (the run position of the next one)."""
    had_failure: bool = False
    """A tool call of the task failed: a recovery may be worth a lesson."""
    local_reviews: int = 0
    """Local reviews queued for the task so far (at most ``MAX_LOCAL_REVIEWS``)."""
    watch: AnomalyWatch = field(default_factory=AnomalyWatch)
    """The live anomaly rules, fed only the events they read."""
    positions: list[int] = field(default_factory=list)
    """The run position of each event the watch saw (its node indices count only those)."""
    ended: bool = False
    """The task had ended before these events (feedback after its end): dropped after the
    batch, as no ``task_end`` will come to drop it."""


_new = object.__new__


def watched_event(row: Row, data: dict[str, Any]) -> Event:
    """The ``Event`` the live rules read for a written row and its sanitized payload.

    Its fields set one by one: the dataclass's keyword ``__init__`` costs twice as much, once
    per watched event on the writer's path. Every field is set (a test compares the result with
    ``Event(...)`` field by field)."""
    get = data.get
    event = _new(Event)
    event.event_id = row[0]
    event.task_id = row[1]
    event.seq = row[2]
    event.timestamp = row[3]
    event.type = row[4]  # type: ignore[assignment]
    event.agent_state = get("agent_state")
    event.context = None
    event.input = get("input")
    event.decision = get("decision")
    event.result = get("result")
    event.extra = {}
    return event


class _Written:
    """The event of a written row as the live rules' ``Seen`` reads it (``EventSource``):
    built (``watched_event``) only when a rule reads more than the projection, to word a key
    node; most tool calls complete none, and building an event for each was a fifth of the
    rules' cost."""

    __slots__ = ("row", "data")

    def __init__(self, row: Row, data: dict[str, Any]) -> None:
        self.row = row
        self.data = data

    def __getitem__(self, i: int) -> Event:
        return watched_event(self.row, self.data)  # ``Seen.event`` keeps it

    def event_id(self, i: int) -> str:
        return self.row[0]  # type: ignore[no-any-return]

    def when_read(self, positions: Iterable[int], then: Callable[[], None]) -> None:
        then()


class Triggers:
    """Decides the reviews of running tasks from their durable events.

    Args:
        store: Where reviews are queued and ended tasks are read.
        review_min_events: A task with at least this many events is reviewed when it ends.
        live: Run the live anomaly rules and queue local reviews.
        wake: Called once per batch that queued a review (wakes the review worker).
        on_unqueued: Told the reviews kept for a later try (``_unqueued``) whenever they
            change: the writer process tells the agent, which hands them to the writer (or
            the in-process writer) taking over if this one dies (``requeue``).
    """

    def __init__(
        self,
        store: Store,
        *,
        review_min_events: int,
        live: bool,
        wake: Callable[[], None],
        on_unqueued: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.store = store
        self.review_min_events = review_min_events
        self.live = live
        self._wake = wake
        self._on_unqueued = on_unqueued
        self._running: dict[str, _Running] = {}
        # Reviews whose queueing failed (the store busy past its timeout, a full disk): queued
        # with the next batch's, since the events that decided them are stored already and no
        # later batch would decide them again. The lock: ``requeue`` adds to them from another
        # thread than the committer's (the agent's, falling back to in-process writing).
        self._unqueued: list[dict[str, Any]] = []
        self._unqueued_lock = threading.Lock()

    def on_batch(self, rows: list[Row], payloads: list[Any]) -> None:
        """The recorder's hook: ``payloads`` holds, for each watched event, its sanitized
        payload and the projection stored with it (``record.WATCHED_TYPES``; else None), so
        the rules need not parse the JSON they were just made into. No rows: the writer
        stops, and reviews kept from a refused queueing get their last try."""
        jobs: list[dict[str, Any]] = []  # the reviews to queue, in one transaction at the end
        # The batch's task ends: where their reviews go in ``jobs``, once the ended tasks are
        # read (all at once, ``_with_end_reviews``), the task and whether a tool call failed.
        ends: list[tuple[int, str, bool]] = []
        running = self._running
        run: _Running | None = None
        last = None
        ended: list[str] = []
        for i, row in enumerate(rows):
            task_id, etype = row[1], row[4]
            if task_id is not last:  # a batch is mostly runs of one task's events
                run = running.get(task_id)
                if run is None:
                    run = running[task_id] = _Running()
                    if etype != "task_start":
                        self._catch_up(run, task_id, rows, i)
                        if run.ended:
                            ended.append(task_id)
                last = task_id
            assert run is not None
            position = run.events
            run.events += 1
            if etype == "task_end":
                del running[task_id]
                last = None
                ends.append((len(jobs), task_id, run.had_failure))
                continue
            if etype not in WATCHED_TYPES:
                continue
            kept = payloads[i] if i < len(payloads) else None
            data, stored = (None, None) if kept is None else kept
            if data is None:
                data = orjson.loads(row[5])
            # A task that used up its local reviews is not watched any more: what the rules
            # would find could not be queued (and its positions need not grow).
            watch = self.live and run.local_reviews < MAX_LOCAL_REVIEWS
            # The projection the recorder stored with the row: the rules read it as replay
            # will, without working it out again (its status is ``normal_status`` already).
            if not watch or len(row) <= 6:
                seen = None
            elif stored is not None:
                seen = unstored(etype, stored)
            else:
                seen = read_projection(etype, row[6])
            if etype == "action_executed" and (
                seen[2] in FAILED_STATUSES
                if seen is not None
                else is_failure((data.get("result") or {}).get("status"))
            ):
                run.had_failure = True
            if watch:
                # _Written(row, data), without its __init__'s call: once per watched event.
                written = _new(_Written)
                written.row, written.data = row, data
                self._watch(run, written, position, seen, jobs)
        for task_id in ended:
            running.pop(task_id, None)
        if ends:
            jobs = self._with_end_reviews(jobs, ends)
        retried: list[dict[str, Any]] = []
        if self._unqueued:
            with self._unqueued_lock:
                retried, self._unqueued = self._unqueued, []
            jobs[:0] = retried
        if jobs:
            # One commit for the batch's reviews: one each cost ~0.1 ms of the committer's time
            # (sampled), a tenth of its work when the tasks are short (a full review for every
            # task end).
            try:
                self.store.enqueue_jobs(jobs)
            except Exception as exc:
                self._keep_unqueued(jobs, exc, last=not rows)
                raise  # the recorder logs it
            if retried:
                self._tell_unqueued()
            self._wake()

    def _with_end_reviews(
        self, jobs: list[dict[str, Any]], ends: list[tuple[int, str, bool]]
    ) -> list[dict[str, Any]]:
        """``jobs`` with the reviews of the batch's task ends in their places, the ended tasks
        read in one statement (read after the batch's commit, as one read each was): with short
        tasks a read per task end held the committer, each time, for its wait for the GIL."""
        tasks = self.store.get_tasks([task_id for _, task_id, _ in ends])
        out: list[dict[str, Any]] = []
        done = 0
        for at, task_id, had_failure in ends:
            out += jobs[done:at]
            done = at
            task = tasks.get(task_id)
            if task is not None:
                self._end_reviews(task_id, had_failure, out, task=task)
        out += jobs[done:]
        return out

    def _catch_up(self, run: _Running, task_id: str, rows: list[Row], at: int) -> None:
        """A task first seen mid-run: what it did before came through another writer (one that
        died, the process writer this one took over from, another agent's). Its position and
        whether a tool call failed are read from the store's projections (no body decoded),
        so its end is decided on the whole run; the live rules see only what comes from now
        on. A task that has ended (feedback after its end) needs its count alone: a local
        review's window is in run positions."""
        # This batch's rows of the task from here on are written already and counted below.
        later = sum(1 for row in rows[at:] if row[1] == task_id)
        task = self.store.get_task(task_id)
        if task is None or task.status != "running":
            run.events = max(0, self.store.event_count(task_id) - later)
            run.ended = True
            return
        count, run.had_failure = self._stored_run(task_id)
        run.events = max(0, count - later)

    def _stored_run(self, task_id: str) -> tuple[int, bool]:
        """How many events the store holds for a task, and whether a tool call of them
        failed, read from their projections (no body decoded)."""
        stored = self.store.stored_run(task_id)
        try:
            projections = stored.projections()
            return len(projections), any(
                p[1] == "action_executed" and p[2] in FAILED_STATUSES for p in projections
            )
        finally:
            stored.release()

    def _keep_unqueued(self, jobs: list[dict[str, Any]], exc: Exception, *, last: bool) -> None:
        """Reviews the store refused: kept for the next try (the newest ``MAX_UNQUEUED``), or
        given up with a warning when no try will come (``last``: the writer stops)."""
        with self._unqueued_lock:
            kept = [] if last else (jobs + self._unqueued)[-MAX_UNQUEUED:]
            dropped = len(jobs) + len(self._unqueued) - len(kept)
            self._unqueued = kept
        if dropped > 0:
            warn(f"{dropped} review(s) not queued, the store refused them: {exc!r}")
        self._tell_unqueued()

    def _tell_unqueued(self) -> None:
        if self._on_unqueued is not None:
            try:
                self._on_unqueued(list(self._unqueued))
            except Exception:  # noqa: BLE001 - the reviews are still here; only the copy is not
                log.exception("hindsight: could not pass on the reviews kept for a later try")

    def requeue(self, jobs: list[dict[str, Any]]) -> None:
        """Reviews a writer that died had kept for a later try (``_unqueued``, as it told the
        agent): queued now, or kept here for this writer's next try. The lines that decided
        them are durable, so no writer sees them again: without this they were lost. An end
        review the dead writer did queue (it died before it said so) is not queued twice."""
        if not jobs:
            return
        try:
            jobs = self._not_queued_yet(jobs)
        except Exception:  # noqa: BLE001 - a review twice rather than none
            log.exception("hindsight: could not read which reviews a dead writer queued")
        if jobs:
            try:
                self.store.enqueue_jobs(jobs)
            except Exception as exc:  # noqa: BLE001 - the agent must never crash because of Hindsight
                self._keep_unqueued(jobs, exc, last=False)
                return
            self._wake()
        self._tell_unqueued()

    def _not_queued_yet(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``jobs`` but the end reviews queued already for their task's run (local reviews
        are kept: the store cannot tell two windows of one rule apart)."""
        queued: dict[str, set[str]] = {}
        out = []
        for job in jobs:
            task_id = job["task_id"]
            if job.get("trigger") == "task_end":
                kinds = queued.get(task_id)
                if kinds is None:
                    task = self.store.get_task(task_id)
                    kinds = queued[task_id] = set() if task is None else self._end_kinds(task)
                if job["kind"] in kinds:
                    continue
            out.append(job)
        return out

    def _end_kinds(self, task: Task) -> set[str]:
        """The kinds of end review queued for this run of ``task`` (done ones too)."""
        # A task id a caller ran before (``hs.task(task_id=...)`` again): the reviews of its
        # earlier runs were queued before this run started and are not this run's. A start
        # time out of the wire format (a caller's own) cannot be compared as text: every
        # review queued for the id counts then, as before runs were told apart.
        since = task.started_at if wire_timestamp(task.started_at) else None
        return self.store.queued_job_kinds(task.task_id, trigger="task_end", since=since)

    def ends_stored_before(self, task_ids: Iterable[str]) -> None:
        """Task ends a writer that died had stored: queue the reviews it may have died before
        queueing (it commits a batch, then queues the batch's reviews). The writer taking over
        skips those lines as stored, so ``on_batch`` never sees them; the reviews already
        queued for a task (done, even) are not queued again. The live rules' local reviews of
        the dead writer's batch are not redone: their windows were in its memory."""
        jobs: list[dict[str, Any]] = []
        for task_id in dict.fromkeys(task_ids):
            task = self.store.get_task(task_id)
            if task is None:
                continue
            queued = self._end_kinds(task)
            wanted: list[dict[str, Any]] = []
            self._end_reviews(task_id, self._stored_run(task_id)[1], wanted, task=task)
            jobs += [job for job in wanted if job["kind"] not in queued]
        if jobs:
            self.store.enqueue_jobs(jobs)
            self._wake()

    def _end_reviews(
        self,
        task_id: str,
        had_failure: bool,
        jobs: list[dict[str, Any]],
        *,
        task: Task | None = None,
    ) -> None:
        """The reviews an ended task gets: its outcome for the lessons it was given, and a full
        review when it needs one (``task``: the task as read already)."""
        if task is None:
            task = self.store.get_task(task_id)
        if task is None:
            return
        if task.injected_lesson_ids:
            jobs.append({"task_id": task_id, "kind": "outcome", "trigger": "task_end"})
        if needs_review(
            task, task.event_count, min_events=self.review_min_events, had_failure=had_failure
        ):
            jobs.append({"task_id": task_id, "kind": "full", "trigger": "task_end"})

    def _watch(
        self,
        run: _Running,
        written: _Written,
        position: int,
        projection: list[Any] | None,
        jobs: list[dict[str, Any]],
    ) -> None:
        run.positions.append(position)
        # Without a stored projection the watch works it out from the event.
        event = written[position] if projection is None else None
        for node in run.watch.observe(event, projection, source=written):
            if run.local_reviews >= MAX_LOCAL_REVIEWS:
                break
            run.local_reviews += 1
            # The watch counts only the events it saw; the review reads chronicle steps, which
            # are every event of the task: map back through the positions it saw them at.
            steps = [
                run.positions[i] for i in (node.index, *node.related) if 0 <= i < len(run.positions)
            ]
            first, last = local_window(steps)
            jobs.append(
                {
                    "task_id": written.row[1],
                    "kind": "local",
                    "trigger": node.kind,
                    "window": [first, last],
                }
            )
