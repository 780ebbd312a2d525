"""The worker: reflection jobs, curation into the lesson book, and outcome feedback.

Everything that turns a finished run into lessons happens here, off the agent's hot path: a
background thread of the agent's process, or a ``hindsight worker`` process on the same store.
Jobs come from the store's job queue, of three kinds:

- ``full``: reflect on a whole run (queued when a task ends);
- ``local``: reflect on a window around an anomaly (queued mid-run by the triggers);
- ``outcome``: move the helpful / harmful counts of the lessons injected into an ended task,
  each task counted once however often its end is reported (``Worker.settle``).

A reflection that fails is stored as a ``failed`` reflection; nothing here raises into the
agent's task.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from hindsight_loop import lesson_keys
from hindsight_loop.embed import lesson_text
from hindsight_loop.lessons import (
    Change,
    apply_outcome,
    clear_stale_conflicts,
    conflicts_via,
    contradictions,
    curate,
    expire_due,
    may_go_live,
)
from hindsight_loop.models import (
    Chronicle,
    Lesson,
    LessonDraft,
    Ratings,
    Reflection,
    Task,
    TaskScores,
    clear_lesson_text,
    iso,
    new_id,
    reset_in_forked_child,
    utcnow,
)
from hindsight_loop.record import redact_text
from hindsight_loop.replay import TeamChronicle, replay
from hindsight_loop.store import Job, Store
from hindsight_loop.text import defuse, value_shape

if TYPE_CHECKING:
    from hindsight_loop.embed import Embedder
    from hindsight_loop.reflect import Reflector

log = logging.getLogger("hindsight_loop")

#: How often the background thread looks for queued jobs when nothing woke it.
POLL_INTERVAL = 0.25
#: How often ``drain`` checks whether the jobs it waits for are done.
DRAIN_POLL = 0.01
#: Most recent ended runs of a task type that a batch review reads.
BATCH_RUNS = 200


#: The curators and workers of this process, reset in a child forked from it (``_forked``).
_FORKED: weakref.WeakSet[Curator | Worker] = weakref.WeakSet()
reset_in_forked_child(_FORKED, "curator or worker")


def _reading(lesson: Lesson) -> tuple[Any, ...]:
    """What curation reads of a lesson to tell a repeat or a contradiction."""
    feats = lesson.features
    return (
        lesson.advice,
        lesson.structured,
        lesson.task_type,
        lesson.scope,
        feats.tools,
        feats.step,
        feats.error_type,
    )


class Curator:
    """The stateful shell around ``lessons.curate``: read the book, decide, write, embed.

    Args:
        store: The lesson book.
        embedder: Returns the embedder (resolved lazily: a model is loaded on first use).
        judge: Returns the model that settles the pairs the rules leave open
            (``llm.judge.PairJudge``), or None (no model configured).
    """

    def __init__(
        self,
        store: Store,
        embedder: Callable[[], Embedder],
        judge: Callable[[], Callable[[str, str], str | None] | None] = lambda: None,
    ) -> None:
        self.store = store
        self._embedder = embedder
        self._judge = judge
        self._lock = threading.Lock()
        #: Set under ``_lock`` once the store is closing: a contradiction a recall found
        #: (``record_found``, on a thread of the recall cache) is no longer recorded; closing
        #: the store under another thread's transaction crashed the process (SIGSEGV).
        self.closed = False
        # Every task type the book holds, as stored, by the key recall matches it on
        # (``lesson_keys.task_key``), kept current from ``store.lessons_since``: the store's
        # task_type filter is exact, and recall serves "Quotes" with "quotes " and "*".
        self._spellings: dict[str, set[str]] = {}
        self._spellings_version = -1  # lessons from before the book was versioned are at 0
        self._spellings_lock = threading.Lock()
        _FORKED.add(self)

    def _forked(self) -> None:
        """In a forked child: locks of its own (one a parent's thread held at the fork would
        stay held in the child, and the child's lessons would wait for it for good)."""
        self._lock = threading.Lock()
        self._spellings_lock = threading.Lock()

    def add(self, draft: Any) -> Change:
        """Curate one lesson draft into the book: add, merge into a twin, or flag a conflict."""
        verdicts = self._ask_judge(draft)
        # Read the book, decide and write in one transaction: two reviews (a worker thread, a
        # `hindsight worker` process, an MCP call) curating at once must see each other's lesson.
        with self._lock, self.store.transaction():
            book = self._book(draft)
            judged = (lambda a, b: verdicts.get((a, b))) if verdicts else None
            change = curate(draft, book, embedder=self._embedder(), judge=judged)
            self._save_change(change)
        return change

    def _book(self, draft: Lesson | LessonDraft) -> list[Lesson]:
        """The lessons ``curate`` may compare ``draft`` with: those of its task type in every
        spelling stored (case and surrounding spaces aside) and those of any task type, the
        lessons recall may serve beside it (``lesson_keys.served_together``; ``curate`` leaves
        out those of other scopes). Not the whole book: reading it for every draft grows with
        every task type the book holds."""
        key = lesson_keys.task_key(draft.task_type)
        if not key:
            return self.store.list_lessons()  # of any task type: served beside every lesson
        spellings = self._task_type_spellings(key, "")
        if "" in spellings:
            return self.store.list_lessons()  # an empty task_type filters nothing in the store
        return [
            x for spelling in sorted(spellings) for x in self.store.list_lessons(task_type=spelling)
        ]

    def _task_type_spellings(self, *keys: str) -> set[str]:
        """The task types stored whose ``lesson_keys.task_key`` is one of ``keys``, the book's
        lessons saved since the last look (by any process) read first."""
        with self._spellings_lock:
            if self.store.book_version() != self._spellings_version:
                version, saved = self.store.lessons_since(self._spellings_version)
                for lesson in saved:
                    spelling = lesson.task_type
                    self._spellings.setdefault(lesson_keys.task_key(spelling), set()).add(spelling)
                self._spellings_version = version
            return set().union(*(self._spellings.get(key, ()) for key in keys))

    def _ask_judge(self, draft: Any) -> dict[tuple[str, str], str | None]:
        """The judge's verdicts on the pairs this draft leaves open, asked before the write
        transaction (a model takes seconds; the recorder must not wait for it meanwhile)."""
        judge = self._judge()
        if judge is None:
            return {}
        verdicts: dict[tuple[str, str], str | None] = {}

        def ask(a: str, b: str) -> str | None:
            verdicts[(a, b)] = verdict = judge(a, b)
            return verdict

        book = self._book(draft)
        curate(draft, book, embedder=self._embedder(), judge=ask)  # decides nothing: pure
        return verdicts

    def change(self, lesson_id: str, edit: Callable[[Lesson], Lesson]) -> Lesson | None:
        """Apply one change to a stored lesson (read and write in one transaction, so a worker
        scoring the same lesson meanwhile is not overwritten). None if there is no such lesson.

        A lesson that may go live again (a rejected or expired one confirmed, a past-due one
        renewed by a task's success) or whose reading changed (its advice, structured form,
        task type, scope or tools edited) is read against the book again (``_read_again``)."""
        with self.writing():
            return self.change_held(lesson_id, edit)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """What ``change`` holds for one lesson (this curator's lock, then one store
        transaction), for a caller that changes several lessons and writes beside them as one
        unit, with ``change_held``. The lock comes first, as in every write here: a thread
        holding the transaction and waiting for the lock would hold up the one holding the lock
        and waiting for the transaction."""
        with self._lock, self.store.transaction():
            yield

    def change_held(self, lesson_id: str, edit: Callable[[Lesson], Lesson]) -> Lesson | None:
        """``change`` inside ``writing()``."""
        lesson = self.store.get_lesson(lesson_id)
        if lesson is None:
            return None
        changed = edit(lesson)
        self._save_read_again([(lesson, changed)])
        return changed

    def _read_again(
        self, before: Lesson | None, after: Lesson, skip: frozenset[str] = frozenset()
    ) -> list[Lesson]:
        """What ``after`` contradicts in the book, recorded on both sides (``lessons.
        contradictions``), when it may go live and was dead as ``before`` (or is new, or had
        another reading): it was never compared with what came while it was dead, or in its new
        words, and recall keeps apart only the pairs recorded. ``skip``: the lessons changed with it,
        read as they were. Returns the others, to be saved."""
        now = utcnow()
        if not may_go_live(after, now):
            return []
        # One that could go live all along (waiting for review, too) was compared when it came
        # and by every lesson after it.
        if before is not None and may_go_live(before, now) and _reading(before) == _reading(after):
            return []
        book = [x for x in self._book(after) if x.lesson_id not in skip]
        return contradictions(after, book, embedder=self._embedder(), now=now)

    def change_pair(
        self, first_id: str, second_id: str, edit: Callable[[Lesson, Lesson], tuple[Lesson, Lesson]]
    ) -> tuple[Lesson, Lesson] | None:
        """``change`` for two lessons at once (a person merging one into another): both read and
        written in one transaction, each read against the book as ``change`` reads one. None if
        either is missing."""
        with self._lock, self.store.transaction():
            first, second = self.store.get_lesson(first_id), self.store.get_lesson(second_id)
            if first is None or second is None:
                return None
            changed = edit(first, second)
            # A person said the two are one: neither is read against the other as it was.
            self._save_read_again(
                zip((first, second), changed, strict=True), skip=frozenset((first_id, second_id))
            )
        return changed

    def split(
        self, lesson_id: str, edit: Callable[[Lesson], tuple[Lesson, list[Lesson]]]
    ) -> tuple[Lesson, list[Lesson]] | None:
        """``change`` that also adds the lessons ``edit`` makes (a person splitting a merge back
        out), all in one transaction; each new one is read against the book (its words were
        read only against the lesson they were merged into), and the contradictions their words
        brought to the lesson are read again without them (``lessons.conflicts_via``). None if
        there is no such lesson."""
        with self._lock, self.store.transaction():
            lesson = self.store.get_lesson(lesson_id)
            if lesson is None:
                return None
            changed, added = edit(lesson)
            brought = conflicts_via(changed, [part.advice for part in added])
            self._clear_stale(
                lesson,
                changed,
                brought,
                reason="the wording that contradicted it was split out",
                read_before=brought,
            )
            self._save_read_again([(lesson, changed), *((None, part) for part in added)])
        return changed, added

    def _clear_stale(
        self,
        before: Lesson,
        after: Lesson,
        ids: Iterable[str],
        reason: str,
        read_before: Collection[str] | None = None,
    ) -> None:
        """Clear the recorded contradictions of ``after`` (of ``ids``) that no longer hold now
        that it says something else (``lessons.clear_stale_conflicts``), saving the others;
        ``after`` is saved by the caller."""
        others = [x for x in map(self.store.get_lesson, set(ids)) if x is not None]
        if not others:
            return
        # The person who made the change, when it says who (a reading changed by code: none).
        by = after.history[-1]["by"] if len(after.history) > len(before.history) else "curator"
        cleared = clear_stale_conflicts(
            before,
            after,
            others,
            embedder=self._embedder(),
            by=by,
            reason=reason,
            read_before=read_before,
        )
        for other in cleared:
            self.save(other, embed=False)

    def close_store(self) -> None:
        """Close the store after a recall's recording of a contradiction under way
        (``record_found``), and let none start after it."""
        with self._lock:
            self.closed = True
            self.store.close()

    def record_found(self, earlier_id: str, later_id: str) -> None:
        """Record a contradiction a recall found between two lessons curation never compared
        (``recall.PairReadings``: of two task types, or of two users' scopes), read again here
        by the same rules against the book as it is, so review shows the pair to a person.
        Nothing once the store is closing."""
        with self._lock:
            if self.closed:
                return
            self._record_found(earlier_id, later_id)

    def _record_found(self, earlier_id: str, later_id: str) -> None:
        with self.store.transaction():
            earlier, later = self.store.get_lesson(earlier_id), self.store.get_lesson(later_id)
            if earlier is None or later is None:
                return
            keys = {lesson_keys.scope_key(earlier.scope), lesson_keys.scope_key(later.scope)}
            if len(keys) > 1 and "global" not in keys:
                # Two owners' lessons (two users, two projects) gathered by one recall: each may
                # be right for its owner. Recall keeps them apart; neither owner's book is
                # marked with the other's lesson.
                return
            others = contradictions(later, [earlier], embedder=self._embedder(), gathered=True)
            if others:
                self.save(later, embed=False)
                for other in others:
                    self.save(other, embed=False)

    def restore(self, lesson: Lesson) -> Change | None:
        """Put back a lesson as it was exported (its id, status, history), read against the
        book for what it contradicts (``lessons.contradictions``). One that repeats a lesson of
        the book (a teammate's export of the same advice) merges into it as a curated lesson
        does: a lesson a person rejected absorbs it rather than seeing it served again. None,
        and nothing written, when the book holds a lesson of that id: what the book holds may
        be newer (a person's edit, a rejection since the export) and is never overwritten."""
        with self._lock, self.store.transaction():
            if self.store.get_lesson(lesson.lesson_id) is not None:
                return None
            book = self._book(lesson)
            change = curate(lesson, book, embedder=self._embedder())
            if change.action != "merge":
                # New to the book: as it was exported, its status too (a conflict is recorded,
                # not sent to review: the export's word on it stands, and recall keeps the two
                # apart).
                others = contradictions(lesson, book, embedder=self._embedder())
                change = Change(
                    action="conflict" if others else "add", lesson=lesson, others=others
                )
            self._save_change(change)
        return change

    def _save_change(self, change: Change) -> None:
        """Save what curation decided: the lesson, and the copies of those it contradicts
        (their text unchanged: their stored vectors stay)."""
        self.save(change.lesson)
        for other in change.others:
            self.save(other, embed=False)

    def _save_read_again(
        self, pairs: Iterable[tuple[Lesson | None, Lesson]], skip: frozenset[str] = frozenset()
    ) -> None:
        """Save each lesson as changed (``before`` None: a new one; re-embedded only when its
        text changed), with what it contradicts; each is read against the book as saved so far
        (``skip`` left out). A lesson that says something else now is read again against
        the lessons recorded as contradicting it: the pairs that no longer hold are cleared."""
        for before, after in pairs:
            if before is not None and after.conflicts and _reading(before) != _reading(after):
                self._clear_stale(
                    before, after, after.conflicts, reason="it says something else now"
                )
            others = self._read_again(before, after, skip=skip)
            self.save(after, embed=before is None or lesson_text(after) != lesson_text(before))
            for other in others:
                self.save(other, embed=False)

    def save(self, lesson: Lesson, *, embed: bool = True) -> None:
        """Store a lesson with its embedding (re-embedded unless ``embed`` is False: the caller
        knows its text did not change, and the stored vector stays)."""
        if not embed:
            self.store.save_lesson(lesson)
            return
        embedder = self._embedder()
        vec = embedder.embed([lesson_text(lesson)])[0].astype(np.float32)
        self.store.save_lesson(lesson, embedding=vec.tobytes(), embed_model=embedder.name)

    def expire_due(self) -> list[Lesson]:
        """Mark lessons past ``valid_until`` expired (kept, never deleted); returns them."""
        with self._lock, self.store.transaction():
            expired = expire_due(self.store.list_lessons(status="active"))
            for lesson in expired:
                self.store.save_lesson(lesson)
        return expired

    def reembed(self) -> int:
        """Store embeddings for lessons whose stored one is missing or from another model."""
        embedder = self._embedder()
        stored = self.store.lesson_embeddings()
        stale = [
            x
            for x in self.store.list_lessons()
            if stored.get(x.lesson_id, (None, None))[0] != embedder.name
        ]
        if not stale:
            return 0
        vectors = embedder.embed([lesson_text(x) for x in stale])
        with self._lock, self.store.transaction():
            for lesson, vec in zip(stale, vectors, strict=True):
                self.store.save_lesson(
                    lesson, embedding=vec.astype(np.float32).tobytes(), embed_model=embedder.name
                )
        return len(stale)


class Worker:
    """Runs queued jobs: in a background thread (``background=True``) or when asked.

    Args:
        store: Where jobs, tasks, events and reflections live.
        curator: Where the lessons a reflection drafts go.
        reflector: Returns the configured reflector (an LLM, else the offline one).
        offline_reflector: Returns the offline reflector (for jobs that must not use an LLM).
        background: Start a thread that runs jobs as they are queued.
    """

    def __init__(
        self,
        store: Store,
        *,
        curator: Curator,
        reflector: Callable[[], Reflector],
        offline_reflector: Callable[[], Reflector],
        background: bool,
    ) -> None:
        self.store = store
        self.curator = curator
        self._reflector = reflector
        self._offline = offline_reflector
        self._closed = False
        # Task types whose runs were imported since their last batch review.
        self._unbatched: set[str] = set()
        self._wake = threading.Event()
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None
        _FORKED.add(self)
        if background:
            self._thread = threading.Thread(target=self._loop, name="hindsight-jobs", daemon=True)
            self._thread.start()

    def _forked(self) -> None:
        """In a forked child: locks of its own; the background thread stayed in the parent
        (it runs the jobs the child queues, in the shared store)."""
        self._wake = threading.Event()
        self._busy = threading.Lock()

    def wake(self) -> None:
        """Tell the background thread a job was queued."""
        self._wake.set()

    # -- one review --------------------------------------------------------------------------
    def chronicle(self, task_id: str, *, max_steps: int = 500) -> Chronicle:
        """The chronicle of a stored task."""
        task = self.store.get_task(task_id)
        if task is None:
            raise KeyError(
                f"no task {task_id!r} in {self.store.url}; list them with 'hindsight tasks'"
            )
        return replay(task, self.store.stored_run(task_id), max_steps=max_steps)

    def reflect(
        self,
        task_id: str,
        *,
        reflector: Reflector | None = None,
        kind: str = "full",
        window: tuple[int, int] | list[int] | None = None,
        trigger: str = "manual",
    ) -> Reflection:
        """Review one task now and curate what it teaches; a reflector's failure is stored as a
        ``failed`` reflection and returned, never raised."""
        # A local review's window is in run positions: replay it uncompressed so step indices
        # are run positions (the reflector reads only the window, so the size does not matter).
        chronicle = (
            self.chronicle(task_id, max_steps=1 << 30) if window else self.chronicle(task_id)
        )
        reflector = reflector or self._reflector()
        started = time.perf_counter()
        try:
            reflection = reflector.reflect(
                chronicle,
                kind=kind,  # type: ignore[arg-type]
                window=tuple(window) if window else None,  # type: ignore[arg-type]
            )
        except Exception as exc:  # noqa: BLE001 - a reflection never breaks the caller
            log.warning("hindsight: reflection of %s failed: %r", task_id, exc)
            reflection = Reflection(
                reflection_id=new_id("ref"),
                task_id=task_id,
                kind="local" if kind == "local" else "full",
                status="failed",
                reflector=getattr(reflector, "name", type(reflector).__name__),
                error=redact_text(f"{type(exc).__name__}: {exc}"),  # stored: no secrets
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        reflection.trigger = trigger
        reflection.created_at = reflection.created_at or iso(utcnow())
        # Learning on its own (a queued review), the offline reflector keeps only what may
        # transfer; a review someone asked for by name keeps what that one run shows.
        offline = getattr(reflector, "name", "") == "offline"
        if reflection.status == "ok" and offline and trigger != "manual":
            reflection.lessons = [
                d for d in reflection.lessons if self._values_recur(d, chronicle.task)
            ]
        if reflection.status == "ok" and isinstance(chronicle, TeamChronicle):
            _team_scopes(reflection.lessons, chronicle)
        if reflection.status == "ok":
            for draft in reflection.lessons:
                _defuse(draft)
                if not draft.source_task_ids:
                    draft.source_task_ids = [task_id]
                if not draft.scope or draft.scope == "global":
                    draft.scope = chronicle.task.scope or "global"
                try:
                    reflection.lesson_ids.append(self.curator.add(draft).lesson.lesson_id)
                except Exception as exc:  # noqa: BLE001
                    log.exception("hindsight: curating a lesson failed")
                    reflection.error = f"curation failed: {exc!r}"
        self.store.save_reflection(reflection)
        return reflection

    def _values_recur(self, draft: LessonDraft, task: Task) -> bool:
        """Whether a one-run offline lesson quotes only what may transfer: plain words (an
        option such as ``gbk`` or ``strict``), and numbers that another run of the task type
        used too. Ids, dates, long text and nested objects belong to their run (and to the
        other trials of the same task): what recurs of them is the batch review's, which
        abstracts them to their kind."""
        structured = draft.structured
        if structured is None:
            return True
        for action in (structured.prefer, structured.avoid):
            for args in [(action or {}).get("args"), *((action or {}).get("variants") or [])]:
                for key, value in (args or {}).items() if isinstance(args, dict) else ():
                    if isinstance(value, dict | list):
                        return False
                    shape = value_shape(value)
                    if shape is None:
                        continue  # a plain word: an option
                    if shape != "<num>":
                        return False
                    fragment = orjson.dumps({key: value}).decode()[1:-1]
                    if self.store.runs_with(task.task_type, fragment, besides=task.task_id) == 0:
                        return False
        return True

    def reflect_runs(self, task_type: str, *, limit: int = BATCH_RUNS) -> list[Lesson]:
        """Review the recent ended runs of a task type together (``patterns.review_runs``) and
        curate the lessons about the failures that recur among them. Runs of different scopes
        are reviewed apart, so a project's or a user's runs never teach another scope."""
        from hindsight_loop.patterns import review_runs

        tasks = [
            t
            for t in self.store.list_tasks(limit=limit, task_type=task_type)
            if t.status != "running"
        ]
        by_scope: dict[str, list[Chronicle]] = {}
        events: dict[str, Any] = {}
        for task in tasks:
            run = self.store.events(task.task_id)
            events.update((e.event_id, e) for e in run if e.type == "action_executed")
            by_scope.setdefault(task.scope or "global", []).append(replay(task, run))
        lessons = []
        for scope, chronicles in by_scope.items():
            for draft in review_runs(chronicles, events=events):
                draft.scope = scope
                _defuse(draft)
                try:
                    lessons.append(self.curator.add(draft).lesson)
                except Exception:  # noqa: BLE001 - one bad draft must not lose the others
                    log.exception("hindsight: curating a batch lesson failed")
        return lessons

    # -- outcome feedback --------------------------------------------------------------------
    def apply_outcome(self, task_id: str) -> int:
        """Score the lessons injected into an ended task by its outcome (``settle``): each once,
        however many times the task's end was reported. Returns how many counts moved."""
        try:
            return len(self._settle(task_id, {}, outcome=True)[1])
        except KeyError:
            return 0  # the task is gone

    def credit(self, task_id: str, lesson_ids: Sequence[str]) -> bool:
        """Count lessons as injected into a started task (its outcome will score them, and
        each counts a hit). False if there is no such task."""
        with self.store.transaction():
            task = self.store.get_task(task_id)
            if task is None:
                return False
            fresh = [x for x in lesson_ids if x not in task.injected_lesson_ids]
            if fresh:
                task.injected_lesson_ids = [*task.injected_lesson_ids, *fresh]
                self.store.upsert_task(task)
                self.store.bump_hits(fresh)
        return True

    def settle(
        self, task_id: str, rated: Mapping[str, bool] | None = None, *, outcome: bool = True
    ) -> Ratings:
        """Bring the counts of the lessons injected into a task to what its run says now,
        counting the run once per lesson.

        A lesson's verdict for the run is its rating, when one was given (``rated``: lesson id
        -> helped; here or in an earlier report), else, with ``outcome`` and once the task has
        ended, the task's outcome (the latest ``task_end`` stored). A lesson the run has not
        counted yet is counted; one it counted the other way is moved, from helpful to harmful
        or back (``lessons.apply_outcome``'s ``replaces``); one it counted the same way is left
        as it is. What the run counted is kept beside the task (``Store.save_task_scores``) in
        the transaction that moves the counts: a retried report, a second ``task_end`` or two
        workers settling the task at once count nothing twice. A task id run again (a new
        ``task_start``) is a new run and counts afresh.

        Returns:
            The ids of ``rated`` whose rating was taken; ``.ignored`` names the others: not
            injected into the task, rated the same way for this run already (a retry), or not
            in the book.

        Raises:
            KeyError: there is no such task.
        """
        return self._settle(task_id, rated or {}, outcome=outcome)[0]

    def _settle(
        self, task_id: str, rated: Mapping[str, bool], *, outcome: bool
    ) -> tuple[Ratings, list[str]]:
        """``settle``, and the ids of the lessons whose counts moved."""
        with self.curator.writing():
            task = self.store.get_task(task_id)
            if task is None:
                raise KeyError(task_id)
            scores = self.store.task_scores(task_id)
            if scores is None or scores.run != task.started_at:
                # Nothing counted yet, or for an earlier run of the task id.
                scores = TaskScores(run=task.started_at)
            before = (dict(scores.verdicts), list(scores.rated))
            injected = dict.fromkeys(task.injected_lesson_ids)
            wanted = {
                x: helped
                for x, helped in rated.items()
                if x in injected and not (x in scores.rated and scores.verdicts.get(x) == helped)
            }
            if outcome and task.status != "running":
                for lesson_id in injected:
                    if lesson_id not in scores.rated:
                        wanted.setdefault(lesson_id, task.status == "succeeded")
            taken: list[str] = []
            moved: list[str] = []
            for lesson_id, helped in wanted.items():
                was = scores.verdicts.get(lesson_id)
                if was == helped:
                    exists = self.store.get_lesson(lesson_id) is not None
                else:
                    # Read and written in this transaction: a CLI 'reject' or another
                    # worker's update of the same lesson in between would be overwritten.
                    # A success may renew a lesson past its date: read against the book again.
                    edit = functools.partial(
                        apply_outcome, succeeded=helped, task_id=task_id, replaces=was
                    )
                    exists = self.curator.change_held(lesson_id, edit) is not None
                    if exists:
                        moved.append(lesson_id)
                if not exists:
                    continue
                scores.verdicts[lesson_id] = helped
                if lesson_id in rated:
                    taken.append(lesson_id)
                    if lesson_id not in scores.rated:
                        scores.rated.append(lesson_id)
            if (scores.verdicts, scores.rated) != before:
                self.store.save_task_scores(task_id, scores)
        return Ratings(taken, ignored=[x for x in rated if x not in taken]), moved

    # -- the queue ---------------------------------------------------------------------------
    def run_pending(self, *, limit: int | None = None) -> int:
        """Run queued jobs in this thread (what ``hindsight worker`` does). Returns how many."""
        done = 0
        # A stopped worker takes no new job: close() waits for the one in flight only.
        while (limit is None or done < limit) and not self._closed:
            with self._busy:
                job = self.store.claim_job()
                if job is None:
                    break
                self._run(job)
            done += 1
        self.run_batches()
        return done

    def request_batch(self, task_types: Iterable[str]) -> None:
        """Ask for a batch review of these task types once the queued reviews have run (an
        import brings many runs at once: what recurs among them is the lesson)."""
        self._unbatched.update(task_types)
        self.wake()

    def run_batches(self) -> int:
        """Run the batch reviews asked for. Returns how many task types were reviewed."""
        due = sorted(self._unbatched)
        for task_type in due:
            if self._closed:
                break
            try:
                self._unbatched.remove(task_type)
            except KeyError:
                continue  # another thread took it
            with self._busy:
                try:
                    self.reflect_runs(task_type)
                except Exception:  # noqa: BLE001 - the worker survives a failed batch
                    log.exception("hindsight: batch review of %r failed", task_type)
        return len(due)

    def _run(self, job: Job) -> None:
        try:
            if job.kind == "outcome":
                self.apply_outcome(job.task_id)
            elif job.kind == "local" and self.store.has_pending_job(job.task_id, kind="full"):
                # The task ended before its local review ran and a full review of the whole
                # run is queued: that one sees everything the local one would.
                self.store.finish_job(job.job_id, status="skipped", error="full review queued")
                return
            else:
                reflector = self._reflector() if job.use_llm else self._offline()
                r = self.reflect(
                    job.task_id,
                    reflector=reflector,
                    kind=job.kind,
                    window=job.window,
                    trigger=job.trigger,
                )
                if r.status == "failed":
                    self.store.finish_job(job.job_id, status="failed", error=r.error)
                    return
            self.store.finish_job(job.job_id, status="done")
        except Exception as exc:  # noqa: BLE001 - the worker survives any one job
            log.exception("hindsight: job %s failed", job.job_id)
            self.store.finish_job(job.job_id, status="failed", error=redact_text(repr(exc)))

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(POLL_INTERVAL)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.run_pending()
            except Exception:  # noqa: BLE001
                log.exception("hindsight: job worker error")

    def drain(self, timeout: float) -> bool:
        """Wait until every job this process queued has run. True if all done."""
        deadline = time.monotonic() + timeout
        if self._thread is None or not self._thread.is_alive():
            self.run_pending()
            self.run_batches()
            return self.store.pending_jobs(mine=True) == 0
        while time.monotonic() < deadline:
            self._wake.set()
            with self._busy:
                if self.store.pending_jobs(mine=True) == 0:
                    break
            time.sleep(DRAIN_POLL)
        else:
            return False
        self.run_batches()
        return True

    def stop(self) -> None:
        """Ask the background thread to stop after the job in flight."""
        self._closed = True
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the background thread to stop (``stop()`` first). True once it has: only
        then may the store it uses be closed."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            return not self._thread.is_alive()
        return True

    def shutdown(
        self,
        timeout: float,
        *,
        interrupt: Callable[[], None],
        released: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Stop after the job in flight and close the store once no thread of ours can use it.

        ``interrupt`` cuts a model's retry backoff short; the model call in flight still ends
        at its own timeout. A job still running after ``timeout`` keeps the store open (the
        job is taken back after its lease if the process exits). ``released``: the recorder's
        ``on_released``, which closes the store once none of its threads can use it: at once,
        or once its call close() gave up on returns, or once a close a signal handler left
        for later is done (closing a connection under a call waits for that call).
        """
        self.stop()
        interrupt()
        if self.join(timeout):
            if released is None:
                self.curator.close_store()
            else:
                released(self.curator.close_store)
        else:
            log.error(
                "hindsight: a review is still running after %.0f s; the store is left open "
                "for it (its job is taken back after the lease if the process exits)",
                timeout,
            )


def _team_scopes(drafts: list[LessonDraft], chronicle: TeamChronicle) -> None:
    """Scope the lessons of a run of many agents: each is the team's or one role's.

    A lesson that names two or more of the run's agents is about how they work together: the
    team's (``team:<task type>``), injected into every agent of it. Any other is about the agent
    the run turned on (``attribute``, offline): its role's (``agent:<role>``), injected only
    into that role. A run that already has a scope of its own (a project, a user) keeps it.
    """
    from hindsight_loop.attribute import attribute, scopes_for

    if chronicle.task.scope not in ("", "global"):
        return
    blamed = attribute(chronicle).agent
    agents = [a.lower() for a in chronicle.agents]
    [team] = scopes_for(team=chronicle.task.task_type)
    for draft in drafts:
        if draft.scope not in ("", "global"):
            continue
        text = f"{draft.advice} {draft.root_cause} {draft.general_rule}".lower()
        if blamed is None or sum(a in text for a in agents) >= 2:
            draft.scope = team
        else:
            [draft.scope] = scopes_for(agent=chronicle.roles.get(blamed, blamed))


def _defuse(draft: LessonDraft) -> None:
    """Every reflector's words pass here before they can reach a prompt: a run's own text that
    reads as an instruction to a model (an error message, an argument, what the user typed, or
    an LLM reflector repeating it) is cut out of the lesson, and what an edit or an import of
    the lesson would refuse (``models.check_lesson_text``) is cleared, so an exported book
    imports back."""
    draft.advice = defuse(clear_lesson_text(draft.advice))
    draft.root_cause = defuse(clear_lesson_text(draft.root_cause))
    draft.general_rule = defuse(clear_lesson_text(draft.general_rule))
    draft.suggestions = [defuse(clear_lesson_text(x)) for x in draft.suggestions]
