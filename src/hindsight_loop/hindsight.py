"""The facade: one object that records, replays, reflects and recalls.

``Hindsight`` holds the configuration and the lifecycle of the running parts and hands each verb
to the module that does it: ``task`` (the agent-side task context), ``record`` (the recorder),
``triggers`` (when a run asks for a review), ``worker`` (reflection, curation, outcomes),
``recall`` (the index and its ranking). Surfaces (CLI, MCP, HTTP) call this object, never the
store, so every write goes through the same locks and transactions. Nothing here raises into the
agent's task for a recording or reflection problem.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hindsight_loop.components import Models, make_recorder, writer_kind
from hindsight_loop.lessons import check_words
from hindsight_loop.models import (
    EVENT_TYPES,
    MAX_LESSONS,
    Chronicle,
    Lesson,
    Ratings,
    Reflection,
    Task,
    new_id,
    wire_event_problem,
)
from hindsight_loop.record import DEFAULT_MAX_TEXT, Recorder, warn
from hindsight_loop.store import Store, open_store
from hindsight_loop.task import (
    ActionCall,
    TaskRun,
    current_task,
    run_with_feedback,
    tool,
    tool_list,
)
from hindsight_loop.triggers import Triggers
from hindsight_loop.worker import Curator, Worker

if TYPE_CHECKING:
    from hindsight_loop.attribute import Attribution
    from hindsight_loop.embed import Embedder
    from hindsight_loop.ingest import ImportReport
    from hindsight_loop.lessons import Change
    from hindsight_loop.recall import LessonSet, RecallCache
    from hindsight_loop.reflect import Reflector


#: How long ``drain`` waits for queued reviews by default, in seconds.
DRAIN_TIMEOUT = 120.0
#: How long ``close`` waits for the review in flight before leaving the store open for it.
CLOSE_WAIT = 600.0

log = logging.getLogger("hindsight_loop")


class Hindsight:
    """Experience memory for one agent (or many sharing one store).

    Args:
        db: A SQLite file path or ``sqlite:///path`` URL.
        max_text: Long text fields are cut to this many characters at record time.
        review_min_events: A task with at least this many events is reviewed when it ends
            (a failed task always is).
        reflector: What turns a chronicle into lessons. Default: the LLM configured in the
            environment (``HINDSIGHT_LLM_*``), else the deterministic offline reflector.
        embedder: Embeddings for recall and curation. Default: the offline hashed n-grams.
        background: Run queued reviews in a background thread. When False, reviews stay
            queued for ``drain()`` or a ``hindsight worker`` process.
        triggers: Run the live anomaly rules (two failures in a row, dissatisfaction, loops)
            in the writer thread and queue local reviews for them.
        dead_letter: Where events that cannot be written go (default: next to the database).
        fallback_dir: Where they go when the dead letter cannot be written either (default:
            ``$XDG_STATE_HOME/hindsight``, else ``~/.local/state/hindsight``).
        queue_bound: Most events waiting for the writer; past it the agent's thread waits
            up to 2 s, then spills the oldest to the dead-letter file (memory stays bounded).
        skip_tools: Purely procedural tools (polling, heartbeats) whose calls are not recorded.
        readonly: Open an existing store to read it only (what the CLI's read commands do):
            nothing is written to the file or next to it, so a store on read-only media opens.
        writer: ``"process"``: a writer process started by the library (on the first event)
            sanitizes, redacts and writes, so the agent's process only serializes each event;
            ``"thread"``: a writer thread in the agent's process does it (no process to
            start: ~0.2-0.4 s saved on the first flush, for short scripts). Default:
            ``$HINDSIGHT_WRITER``, else ``"process"`` where a writer process can be started
            (a POSIX system, ``sys.executable`` a Python), else ``"thread"``. A writer process
            that cannot start or keeps dying falls back to the thread, with a warning.
    """

    def __init__(
        self,
        db: str | Path = "hindsight.db",
        *,
        max_text: int = DEFAULT_MAX_TEXT,
        review_min_events: int = 10,
        reflector: Reflector | None = None,
        embedder: Embedder | None = None,
        background: bool = True,
        triggers: bool = True,
        dead_letter: str | Path | None = None,
        fallback_dir: str | Path | None = None,
        queue_bound: int | None = None,
        skip_tools: Sequence[str] = (),
        readonly: bool = False,
        writer: Literal["thread", "process"] | None = None,
    ) -> None:
        bare = re.sub(r"^sqlite:///?", "", str(db))  # sqlite:///:memory: names it too
        if bare == ":memory:" or bare.startswith("file::memory:"):
            raise ValueError(
                "Hindsight needs a file: each thread opens its own connection, and an in-memory "
                "SQLite database is private to one; pass a path such as 'hindsight.db'"
            )
        kind = writer_kind(writer)  # a bad choice is refused before a store file is made
        self.store: Store = open_store(str(db), readonly=readonly)
        self._readonly = readonly
        if readonly:
            background = triggers = False  # a reader queues and runs no reviews
        self.skip_tools = frozenset(skip_tools)
        # The parts reach the models through ``models``, never through ``self``: the worker's
        # thread holds them, and a closure over ``self`` kept a dropped Hindsight (its writer
        # process, threads and files) alive until the exit.
        self.models = models = Models(reflector, embedder)
        self.curator: Curator = Curator(
            self.store, lambda: models.embedder, judge=lambda: models.pair_judge
        )
        self._recall_cache: RecallCache | None = None
        self.worker: Worker = Worker(
            self.store,
            curator=self.curator,
            reflector=lambda: models.reflector,
            offline_reflector=lambda: models.offline_reflector,
            background=background,
        )
        self.triggers: Triggers = Triggers(
            self.store, review_min_events=review_min_events, live=triggers, wake=self.worker.wake
        )
        self.recorder: Recorder = make_recorder(
            self.store,
            db,
            writer=kind,
            triggers=self.triggers,
            worker=self.worker,
            dead_letter=dead_letter,
            readonly=readonly,
            max_text=max_text,
            queue_bound=queue_bound,
            fallback_dir=fallback_dir,
        )
        # ``record`` hands the usual event straight to the recorder's ``emit``. The writer
        # process serializes it within that call; the writer thread reads it later, so it is
        # given a copy (a caller refilling the same dict must not rewrite what it recorded),
        # as ``Recorder.emit_event`` does.
        self._copy_events = isinstance(self.recorder, Recorder)
        self._closed = False
        # Flush at exit so a script that forgets close() loses nothing it recorded.
        ref = weakref.ref(self)

        def at_exit() -> None:
            h = ref()
            if h is not None:
                h.close()

        self._atexit = at_exit
        # Dropped without close() (a server making one per request): its parts are closed
        # then, off the collector's thread (``_drop``), so its writer process, threads and
        # files go and what it recorded is made durable. The finalizer holds the parts, never
        # ``self``; at the exit ``at_exit`` closes a live one.
        _start_closer()
        self._finalizer = weakref.finalize(
            self, _drop, (self.recorder, self.worker, self.models, at_exit)
        )
        self._finalizer.atexit = False
        atexit.register(at_exit)

    # -- configuration (resolved on first use: components.Models) ---------------------------
    @property
    def embedder(self) -> Embedder:
        return self.models.embedder

    @property
    def reflector(self) -> Reflector:
        """The configured reflector: an LLM from the environment, else the offline one."""
        return self.models.reflector

    @property
    def offline_reflector(self) -> Reflector:
        return self.models.offline_reflector

    @property
    def pair_judge(self) -> Callable[[str, str], str | None] | None:
        """The configured model as the judge of lesson pairs curation's rules leave open."""
        return self.models.pair_judge

    @property
    def recall_cache(self) -> RecallCache:
        """The recall index of this store, built on first recall (its libraries load then, not
        when the agent starts)."""
        if self._recall_cache is None:
            from hindsight_loop.recall import RecallCache

            models = self.models  # not ``self``: see ``__init__``
            # A contradiction a recall finds between lessons curation never compared is
            # recorded, so review shows it (a reader records nothing).
            record = None if self._readonly else self.curator.record_found
            self._recall_cache = RecallCache(self.store, lambda: models.embedder, on_clash=record)
        return self._recall_cache

    # -- recording ---------------------------------------------------------------------------
    def task(
        self,
        task_type: str,
        *,
        goal: str = "",
        tools: Sequence[str] = (),
        scope: str = "global",
        intent: str | None = None,
        query: str | None = None,
        recall: bool = True,
        task_id: str | None = None,
        timestamp: Any = None,
    ) -> TaskRun:
        """Start recording a task; use as ``with hs.task(...) as task:``.

        On entry the task recalls its lessons (``task.lessons``, ``task.advice``) unless
        ``recall=False``; on exit it records ``task_end`` (failed if the block raised).

        Raises:
            ValueError: ``scope`` is not ``global``, ``project:NAME`` or ``user:NAME`` (raised
                here, before the task runs: a mistyped scope would leak or lose lessons).
        """
        from hindsight_loop.lessons import check_scope

        return TaskRun(
            self,
            task_type=task_type,
            goal=goal,
            tools=tool_list(tools),
            scope=check_scope(scope),
            intent=intent,
            query=query,
            recall=recall,
            task_id=task_id or new_id("tsk"),
            timestamp=timestamp,
        )

    @staticmethod
    def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate a tool (sync or async) so each call inside a task is recorded."""
        return tool(fn)

    def record(self, event: dict[str, Any]) -> bool:
        """Accept one event in the wire format (DESIGN.md). Returns False if it was refused.

        A refused event (not an object, unknown type, no task id) is written to the
        dead-letter file with the reason and a warning; it never raises.
        """
        # The usual event is judged here in a few dict lookups and handed straight to ``emit``:
        # two Python calls fewer on the agent's thread (``wire_event_problem``, ``emit_event``),
        # ~10% of the call with the writer process (issue 13). Usual: a plain dict of a known
        # type, a task id, its body fields (``models.EVENT_BODY_FIELDS``) plain dicts, no id or
        # seq of its own (``emit_event`` vets those). What passes here passes
        # ``wire_event_problem`` (a test holds the two to one verdict), which judges the rest.
        if (
            type(event) is dict
            and type(etype := event.get("type")) is str
            and etype in EVENT_TYPES
            and type(task_id := event.get("task_id")) is str
            and task_id
            and ("input" not in event or type(event["input"]) is dict)
            and ("result" not in event or type(event["result"]) is dict)
            and ("agent_state" not in event or type(event["agent_state"]) is dict)
            and ("decision" not in event or type(event["decision"]) is dict)
            and ("context" not in event or type(event["context"]) is dict)
            and "event_id" not in event
            and "seq" not in event
        ):
            self.recorder.emit(
                task_id,
                etype,
                event.copy() if self._copy_events else event,
                timestamp=event.get("timestamp"),
            )
            return True
        problem = wire_event_problem(event)
        if problem:
            warn(f"event refused: {problem}; kept in the dead letter ({self.recorder.dead_letter})")
            self.recorder.keep_refused(event, problem)
            return False
        self.recorder.emit_event(event)
        return True

    def import_transcript(
        self,
        data: Any,
        *,
        format: str = "auto",  # noqa: A002 - the CLI's word
        task_type: str | None = None,
        goal: str | None = None,
        outcome: str | None = None,
        scope: str | None = None,
        source: str = "",
    ) -> ImportReport:
        """Record runs an agent already produced: OpenAI or Anthropic messages, AG2 group
        chats, OTLP GenAI traces or wire-format events (``format``: ``auto``, ``openai``,
        ``anthropic``, ``ag2``, ``otlp``, ``wire``). One run (a message list) or many; what the
        caller passes wins over what a run says about itself. Events already stored are
        skipped, so importing the same transcript twice stores it once. Ended runs are queued
        for reflection like live ones.

        Raises:
            ValueError: the format cannot be told (the message names ``format=``), the data
                is not in the format given, or the scope is not a valid one.
        """
        from hindsight_loop.ingest import import_data

        fields = {"task_type": task_type, "goal": goal, "outcome": outcome, "scope": scope}
        return import_data(self, data, format, source=source, **fields)

    def import_file(self, path: str | Path, *, format: str = "auto", **fields: Any) -> ImportReport:  # noqa: A002
        """``import_transcript`` for a JSON or JSONL file (``hindsight import FILE``); a bad line
        of a JSONL file of wire events is reported with its number and the rest is imported."""
        from hindsight_loop.ingest import import_path

        return import_path(self, path, format, **fields)

    def import_jsonl(self, path: str | Path) -> tuple[int, list[str]]:
        """Load a file of wire-format events (any mix of tasks). Returns (accepted, problems)."""
        report = self.import_file(path, format="wire")
        return report.accepted, report.problems

    def flush(self, timeout: float | None = None) -> bool:
        """Return once every event accepted so far is durable: stored, or kept in a dead letter
        with its reason. False on a timeout, or when events could be kept nowhere (they are
        counted in ``stats["lost"]`` and logged)."""
        return self.recorder.flush(timeout)

    @property
    def stats(self) -> dict[str, int]:
        """The recorder's counters: events written, dead-lettered, spilled, lost, warnings."""
        return dict(self.recorder.stats)

    # -- reading what was recorded -----------------------------------------------------------
    def get_task(self, task_id: str) -> Task | None:
        """One recorded task, or None."""
        return self.store.get_task(task_id)

    def tasks(
        self, *, limit: int = 50, task_type: str | None = None, status: str | None = None
    ) -> list[Task]:
        """Recorded tasks, newest first."""
        return self.store.list_tasks(limit=limit, task_type=task_type, status=status)

    def replay(self, task_id: str, *, max_steps: int = 500) -> Chronicle:
        """The chronicle of a task: ordered steps and key nodes."""
        return self.worker.chronicle(task_id, max_steps=max_steps)

    def reflections(self, task_id: str | None = None, *, limit: int = 100) -> list[Reflection]:
        """Stored reflections, newest first (of one task when ``task_id`` is given)."""
        return self.store.reflections(task_id, limit=limit)

    def pending_jobs(self) -> int:
        """Review jobs queued or running, from any process."""
        return self.store.pending_jobs()

    # -- reflection and the lesson book ------------------------------------------------------
    def reflect(
        self,
        task_id: str,
        *,
        reflector: Reflector | None = None,
        kind: str = "full",
        window: tuple[int, int] | list[int] | None = None,
        trigger: str = "manual",
    ) -> Reflection:
        """Review one task now and curate what it teaches into the lesson book.

        Never raises for a reflector's failure: the failure is stored as a reflection with
        ``status="failed"`` and returned.
        """
        self.flush()
        return self.worker.reflect(
            task_id, reflector=reflector, kind=kind, window=window, trigger=trigger
        )

    def lesson(self, lesson_id: str) -> Lesson | None:
        """One lesson of the book, or None."""
        return self.store.get_lesson(lesson_id)

    def lessons(self, *, status: str | None = None, task_type: str | None = None) -> list[Lesson]:
        """The lesson book (any status unless ``status`` is given)."""
        return self.store.list_lessons(status=status, task_type=task_type)

    def add_lesson(self, draft: Any) -> Lesson:
        """Curate one lesson draft into the book: add, merge into a twin, or flag a conflict.

        Raises:
            ValueError: the words hold a control, bidi-override or invisible character
                (``lessons.check_words``), as an edit or an import would refuse them.
        """
        return self.curate(draft).lesson

    def curate(self, draft: Any) -> Change:
        """Like ``add_lesson``, and say what curation did (``add``, ``merge``, ``conflict``)."""
        check_words(draft)
        return self.curator.add(draft)

    def save_lesson(self, lesson: Lesson) -> None:
        """Store a lesson as it is, with its embedding, over one of the same id: no curation,
        no check against the book (``restore_lesson`` puts back an exported one safely)."""
        self.curator.save(lesson)

    def restore_lesson(self, lesson: Lesson) -> Change | None:
        """Put back an exported lesson as it was (its id, status, history), never merged, with
        what it contradicts in the book recorded on both sides. None, and nothing written, when
        the book holds a lesson of that id: that one may be newer and is kept."""
        return self.curator.restore(lesson)

    def change_lesson(self, lesson_id: str, edit: Callable[[Lesson], Lesson]) -> Lesson | None:
        """Apply ``edit`` to a stored lesson in one transaction; None if there is no such one."""
        return self.curator.change(lesson_id, edit)

    def merge_lessons(self, lesson_id: str, into: str, *, by: str) -> Lesson | None:
        """A person says ``lesson_id`` says what ``into`` says (``lessons.same_as``): ``into``
        takes its support and wording, it is rejected with a note. Returns ``into`` as changed,
        None if either lesson is missing; ``ValueError`` for lessons of other task types."""
        from hindsight_loop.lessons import same_as

        changed = self.curator.change_pair(
            into, lesson_id, lambda kept, absorbed: same_as(absorbed, kept, by=by)
        )
        return None if changed is None else changed[0]

    def split_lesson(self, lesson_id: str, *, by: str) -> tuple[Lesson, list[Lesson]] | None:
        """A person says the wordings merged into a lesson on the pair judge's word alone do not
        say what it says (``lessons.split_judged``): each becomes a lesson of its own, waiting
        for review. Returns the lesson as changed and the new ones, None if it is missing;
        ``ValueError`` when it holds no such merge."""
        from hindsight_loop.lessons import split_judged

        return self.curator.split(lesson_id, lambda lesson: split_judged(lesson, by=by))

    def expire_due(self) -> list[Lesson]:
        """Expire the lessons past their ``valid_until`` (an explicit step: recall never writes)."""
        return self.curator.expire_due()

    def reembed(self) -> int:
        """Store embeddings from the current embedder for lessons that lack them."""
        return self.curator.reembed()

    # -- recall ------------------------------------------------------------------------------
    def recall(
        self,
        *,
        task_type: str | None = None,
        tools: Sequence[str] = (),
        query: str = "",
        intent: str | None = None,
        scope: str | Sequence[str] | None = None,
        step: str | None = None,
        error_type: str | None = None,
        limit: int = MAX_LESSONS,
    ) -> LessonSet:
        """The best lessons (at most ``limit``, never more than 3) for a task, rules first.

        A read: it changes no lesson it returns and counts no hit (lessons count a hit when
        they are injected into a task). One bookkeeping write may follow, off the caller's
        thread: two lessons curation never compared (no task type named) that the recall read
        as contradicting are recorded as a conflict, so review shows them to a person.
        """
        from hindsight_loop.recall import RecallQuery

        q = RecallQuery(
            task_type=task_type,
            tools=tool_list(tools),
            query=query,
            intent=intent,
            scope=scope,
            step=step,
            error_type=error_type,
        )
        return self.recall_cache.search(q, limit=min(limit, MAX_LESSONS))

    def credit_lessons(self, task_id: str, lesson_ids: Sequence[str]) -> None:
        """Count lessons as injected into a task that already started (recalled mid-run, or by
        an MCP client): the task's outcome will move their helpful / harmful counts."""
        if lesson_ids:
            self.flush()
            if not self.worker.credit(task_id, lesson_ids):
                warn(f"credit_lessons: no task {task_id!r}; start it first")

    def inject(
        self,
        messages: list[dict[str, Any]],
        lessons: Sequence[Lesson],
        *,
        mode: Literal["insert", "append"] = "insert",
    ) -> list[dict[str, Any]]:
        """Place the lessons' advice after the system/tool text and before the last user message.

        ``insert`` (default) adds one system message just before the last user message, so the
        system prompt stays byte-identical and provider prompt caches keep hitting; ``append``
        adds the advice to the first system message, for templates that allow only one.
        """
        from hindsight_loop.recall import inject

        return inject(messages, lessons, mode=mode)

    # -- outcomes ----------------------------------------------------------------------------
    def report_outcome(
        self,
        task_id: str,
        status: Literal["succeeded", "failed"],
        *,
        summary: str = "",
        rated: dict[str, bool] | None = None,
    ) -> Ratings:
        """End a task from outside the agent's process (MCP, HTTP) and score its lessons.

        ``rated`` gives explicit verdicts (lesson id -> helped) on lessons injected into the
        task; they replace the automatic score from the outcome for those lessons, so none is
        counted twice. Only a lesson injected into this task can be rated: recalled for it
        (``task``, ``POST /api/tasks``, MCP ``recall_lessons`` with its ``task_id``), named in
        its ``task_start``'s ``injected_lesson_ids``, or added with ``credit_lessons``. A task
        with no lessons injected has none to rate. A rated lesson stays listed in the task's
        ``injected_lesson_ids``.

        Each task counts once in a lesson's helpful / harmful counts. A report of a task whose
        end was reported already (a client retrying, ``report_outcome`` after a trajectory
        sent with its ``task_end``) adds nothing; one that changes the verdict (it said
        succeeded, a person now says failed) replaces it: the latest word stands, and the count
        moves from helpful to harmful or back. A rating keeps its word over the outcome of the
        same task, and a later rating replaces it. The outcome's counts move when the review
        queue runs (``drain``, the background worker); the ratings' at once.

        Returns:
            The ids of the rated lessons whose rating was taken; ``.ignored`` names the other
            rated ids (not injected into the task, rated the same way for it already, or not in
            the book). An ignored id is an answer, not an error: the task still ends.

        Raises:
            KeyError: there is no such task.
        """
        self.flush()
        # The ratings first, in one transaction with the reads of what the task was given and
        # what it counted: the outcome the task_end below queues leaves a rated lesson as rated
        # (counting it by the outcome first could flag it before the rating moved it back).
        ratings = self.worker.settle(task_id, rated or {}, outcome=False)
        result: dict[str, Any] = {"status": status}
        if summary:
            result["summary" if status == "succeeded" else "error_message"] = summary
        self.record({"type": "task_end", "task_id": task_id, "result": result})
        self.flush()
        return ratings

    # -- the whole loop in one call ----------------------------------------------------------
    def run_task_with_feedback(
        self,
        task_type: str,
        runner: Callable[[Any, Callable[[dict[str, Any]], None]], Any],
        task_input: Any,
        *,
        goal: str | None = None,
        tools: Sequence[str] = (),
        scope: str = "global",
        intent: str | None = None,
    ) -> Any:
        """Recall and inject, run ``runner(task_input, event_callback)``, review, store lessons.

        If ``task_input`` is a dict with ``messages`` (an OpenAI-style list), the advice is
        injected into them. ``event_callback`` takes wire-format event dicts (no task id
        needed). A runner that returns a dict with a failed ``status`` or raises marks the task
        failed; the exception is re-raised after the review is stored.
        """
        return run_with_feedback(
            self, task_type, runner, task_input, goal=goal, tools=tools, scope=scope, intent=intent
        )

    # -- reviews off the hot path ------------------------------------------------------------
    def run_pending(self, *, limit: int | None = None) -> int:
        """Run queued reviews in this thread (what ``hindsight worker`` does). Returns how many."""
        return self.worker.run_pending(limit=limit)

    def drain(self, timeout: float = DRAIN_TIMEOUT) -> bool:
        """Flush events, then wait until every queued review has run. True if all done."""
        self.flush()
        return self.worker.drain(timeout)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Flush what was recorded, finish the review in flight, close the store."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()  # closed here: nothing left for the collector to close
        if self._recall_cache is not None:
            self._recall_cache.closed = True
        _close_parts(self.recorder, self.worker, self.models, self._atexit)

    def __enter__(self) -> Hindsight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def book_version(self) -> int:
        """A number that changes whenever a lesson is saved: a reader's cache of the book is
        current while it holds (``hindsight serve`` parses the book once per version)."""
        return self.store.book_version()

    def lessons_since(self, version: int) -> tuple[int, list[Lesson]]:
        """The book's version and the lessons saved since ``version``: a reader holding the
        book at ``version`` applies these instead of reading the whole book again."""
        return self.store.lessons_since(version)

    def attribute(
        self,
        task_id: str,
        *,
        llm: Any = None,
        method: Literal["all_at_once", "binary_search"] = "all_at_once",
        save: bool = True,
    ) -> Attribution:
        """Say which agent of a run caused it to fail, at which step and why
        (``attribute.attribute``), and keep the answer beside the task's reflections.

        ``llm``: a model client (``hindsight_loop.llm.connect``) to review the run; None for the
        offline rules. The answer is stored as a reflection with ``trigger="attribution"`` and
        the attribution in ``parsed["attribution"]`` unless ``save`` is False.
        """
        from hindsight_loop.attribute import attribute

        self.flush()
        events = self.store.events(task_id)
        found = attribute(self.worker.chronicle(task_id), events=events, llm=llm, method=method)
        if save:
            self.store.save_reflection(found.to_reflection(task_id, getattr(llm, "model", None)))
        return found


# -- Hindsight objects dropped without close() ----------------------------------------------------

_Parts = tuple[Recorder, Worker, Models, Callable[[], None]]


def _close_parts(
    recorder: Recorder, worker: Worker, models: Models, at_exit: Callable[[], None]
) -> None:
    """What ``close()`` does to the running parts: flush and stop the recorder (its writer
    process, its threads), finish the review in flight, close the store. Given the parts, not
    the ``Hindsight``, so it also closes one that was dropped."""
    try:
        recorder.close()
    finally:
        worker.shutdown(CLOSE_WAIT, interrupt=models.close, released=recorder.on_released)
        atexit.unregister(at_exit)


#: The parts of dropped Hindsight objects, for the closer thread. ``SimpleQueue.put`` is safe in
#: a weakref callback, which runs on whatever thread the collector runs on, at any point of it:
#: closing there (a flush, a reap, a review's end) could wait on that very thread, or on a lock
#: it holds.
_dropped: queue.SimpleQueue[_Parts | None] = queue.SimpleQueue()
_closer: threading.Thread | None = None
#: Threads closing one dropped object each (a writer process takes a while to end: closed one
#: after another, a server dropping one per request would fall behind).
_closing: set[threading.Thread] = set()
_closer_lock = threading.Lock()


def _drop(parts: _Parts) -> None:
    """A ``Hindsight`` was collected without ``close()``: its parts go to the closer thread."""
    _dropped.put(parts)


def _start_closer() -> None:
    """Start the closer thread once per process (when the first ``Hindsight`` is made, never
    from the collector's callback)."""
    global _closer  # noqa: PLW0603 - one per process
    with _closer_lock:
        if _closer is None:
            _closer = threading.Thread(target=_close_dropped, name="hindsight-closer", daemon=True)
            _closer.start()


def _close_dropped() -> None:
    while (parts := _dropped.get()) is not None:
        closing = threading.Thread(
            target=_close_one, args=(parts,), name="hindsight-close", daemon=True
        )
        with _closer_lock:
            _closing.add(closing)
        closing.start()
        del parts, closing  # held here, they would outlive their closing


def _close_one(parts: _Parts) -> None:
    try:
        _close_parts(*parts)
    except Exception:  # noqa: BLE001 - one object's close must not stop the others'
        log.exception("hindsight: closing a Hindsight dropped without close() failed")
    finally:
        with _closer_lock:
            _closing.discard(threading.current_thread())


def _close_dropped_at_exit() -> None:
    """At the exit, the closes under way end before the interpreter does (their threads are
    daemons: what they flush would die with them), and what the closer has not taken yet is
    closed here (all of it in a forked child, where the parent's closer thread is not)."""
    closer = _closer
    if closer is not None and closer.is_alive():
        _dropped.put(None)
        closer.join()
    with _closer_lock:
        closing = list(_closing)
    for thread in closing:
        thread.join()
    while True:
        try:
            parts = _dropped.get_nowait()
        except queue.Empty:
            return
        if parts is not None:
            _close_one(parts)


def _closer_forked() -> None:
    """In a forked child the closer thread, and the closes under way, stayed in the parent."""
    global _dropped, _closer, _closing, _closer_lock  # noqa: PLW0603
    _dropped = queue.SimpleQueue()
    _closer = None
    _closing = set()
    _closer_lock = threading.Lock()


atexit.register(_close_dropped_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_closer_forked)


__all__ = ["ActionCall", "Hindsight", "TaskRun", "current_task"]
