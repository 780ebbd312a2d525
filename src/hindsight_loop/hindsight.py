"""The facade: one object that records, replays, reflects and recalls.

This is the thin stateful shell around the functional core (``replay``, ``reflect``,
``lessons``, ``recall``): it loads from the store, calls the core and saves what comes back.
Nothing here raises into the agent's task for a recording or reflection problem.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import orjson

from hindsight_loop.embed import lesson_text
from hindsight_loop.models import (
    EVENT_BODY_FIELDS,
    EVENT_TYPES,
    Chronicle,
    Lesson,
    Reflection,
    is_failure,
    iso,
    new_id,
    utcnow,
)
from hindsight_loop.record import DEFAULT_MAX_TEXT, Recorder, Row, warn
from hindsight_loop.store import ReviewJob, Store, open_store

if TYPE_CHECKING:
    from hindsight_loop.embed import Embedder
    from hindsight_loop.recall import LessonIndex, LessonSet
    from hindsight_loop.reflect import Reflector

log = logging.getLogger("hindsight_loop")

F = TypeVar("F", bound=Callable[..., Any])

_current_task: contextvars.ContextVar[TaskRun | None] = contextvars.ContextVar(
    "hindsight_current_task", default=None
)

#: Books smaller than this are re-indexed on the spot when they change (about 0.1 s); larger
#: ones in the background while the previous index keeps serving recall.
SYNC_REBUILD_MAX = 2_000

#: Most local reviews one task may ask for: a run that keeps failing needs one look, not fifty.
MAX_LOCAL_REVIEWS = 3


def current_task() -> TaskRun | None:
    """The task whose ``with hs.task(...)`` block the caller is in, if any."""
    return _current_task.get()


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
        queue_bound: Most events waiting for the writer; past it the agent's thread waits
            up to 2 s, then spills the oldest to the dead-letter file (memory stays bounded).
        skip_tools: Purely procedural tools (polling, heartbeats) whose calls are not recorded.
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
        queue_bound: int | None = None,
        skip_tools: Sequence[str] = (),
    ) -> None:
        if str(db) == ":memory:" or str(db).startswith("file::memory:"):
            raise ValueError(
                "Hindsight needs a file: each thread opens its own connection, and an in-memory "
                "SQLite database is private to one; pass a path such as 'hindsight.db'"
            )
        self.store: Store = open_store(str(db))
        self.skip_tools = frozenset(skip_tools)
        self.review_min_events = review_min_events
        self.triggers = triggers
        self._reflector = reflector
        self._offline: Reflector | None = None
        self._embedder = embedder
        self._index: LessonIndex | None = None
        self._index_version = -1
        self._index_lock = threading.Lock()
        self._curate_lock = threading.Lock()
        # Per running task, kept by the writer thread and dropped at task_end.
        self._watches: dict[str, Any] = {}
        self._positions: dict[str, list[int]] = {}  # step index of each event the watch saw
        self._counts: dict[str, int] = {}  # events of the task written so far
        self._had_failure: set[str] = set()
        self._local_reviews: dict[str, int] = {}
        path = getattr(self.store, "path", "hindsight")
        kwargs: dict[str, Any] = {}
        if queue_bound is not None:
            kwargs["queue_bound"] = queue_bound
        self.recorder = Recorder(
            self.store.write_event_batch,
            dead_letter=dead_letter or f"{path}.deadletter.jsonl",
            max_text=max_text,
            on_batch=self._on_batch,
            **kwargs,
        )
        self._closed = False
        self._work = threading.Event()
        self._busy = threading.Lock()
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(
                target=self._work_loop, name="hindsight-reviews", daemon=True
            )
            self._worker.start()
        # Flush at exit so a script that forgets close() loses nothing it recorded.
        ref = weakref.ref(self)

        def at_exit() -> None:
            h = ref()
            if h is not None:
                h.close()

        self._atexit = at_exit
        atexit.register(at_exit)

    # -- configuration -----------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from hindsight_loop.embed import default_embedder

            self._embedder = default_embedder()
        return self._embedder

    @property
    def reflector(self) -> Reflector:
        """The configured reflector: an LLM from the environment, else the offline one."""
        if self._reflector is None:
            reflector: Reflector | None = None
            try:
                from hindsight_loop.llm import reflector_from_env

                reflector = reflector_from_env()  # type: ignore[assignment,operator]
            except (ImportError, ValueError) as exc:
                # A missing client package or an unusable HINDSIGHT_LLM_* setting: say so and
                # keep learning offline rather than failing every review.
                warn(f"LLM reflection is off ({exc}); using the offline reflector")
                reflector = None
            self._reflector = reflector or self.offline_reflector
        return self._reflector

    @property
    def offline_reflector(self) -> Reflector:
        if self._offline is None:
            from hindsight_loop.reflect import OfflineReflector

            self._offline = OfflineReflector()
        return self._offline

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

        scope = check_scope(scope)
        tools = _tool_list(tools)
        return TaskRun(
            self,
            task_type=task_type,
            goal=goal,
            tools=list(tools),
            scope=scope,
            intent=intent,
            query=query,
            recall=recall,
            task_id=task_id or new_id("tsk"),
            timestamp=timestamp,
        )

    def record(self, event: dict[str, Any]) -> bool:
        """Accept one event in the wire format (DESIGN.md). Returns False if it was refused.

        A refused event (not an object, unknown type, no task id) is written to the
        dead-letter file with the reason and a warning; it never raises.
        """
        problem = _check_wire_event(event)
        if problem:
            warn(f"event refused: {problem}; kept in {self.recorder.dead_letter}")
            self._keep_refused(event, problem)
            return False
        self._accept(event)
        return True

    def _accept(self, event: dict[str, Any]) -> None:
        """Queue a checked wire-format event (the writer keeps its scalars out of the body)."""
        event_id = event.get("event_id")
        seq = event.get("seq")
        # The writer reads the event a few milliseconds later. The event itself is copied, so
        # a caller that fills the same dict with new objects for its next call cannot rewrite
        # this one; the objects inside are handed over as they are (copying them too doubled
        # this call's cost): do not change them in place after recording.
        self.recorder.emit(
            event["task_id"],
            event["type"],
            event.copy(),
            timestamp=event.get("timestamp"),
            event_id=event_id if isinstance(event_id, str) else None,
            seq=seq if type(seq) is int and -(2**63) <= seq < 2**63 else None,  # not a bool
        )

    def _keep_refused(self, event: Any, problem: str) -> None:
        try:
            line = orjson.dumps(
                {"refused": event, "_dead_letter_reason": problem},
                default=repr,
                option=orjson.OPT_NON_STR_KEYS,
            )
        except Exception:  # noqa: BLE001
            line = orjson.dumps({"refused": repr(event)[:10_000], "_dead_letter_reason": problem})
        try:
            with open(self.recorder.dead_letter, "ab") as fh:
                fh.write(line + b"\n")
        except OSError as exc:
            log.error("hindsight: could not keep a refused event: %s", exc)

    def import_jsonl(self, path: str | Path) -> tuple[int, list[str]]:
        """Load a file of wire-format events (any mix of tasks). Returns (accepted, problems)."""
        accepted, problems = 0, []
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if lineno == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a BOM from Windows tools
                if not raw.strip():
                    continue
                try:
                    event = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    problems.append(f"line {lineno}: not JSON ({exc})")
                    continue
                problem = _check_wire_event(event)
                if problem:
                    problems.append(f"line {lineno}: {problem}")
                    continue
                self._accept(event)
                accepted += 1
        self.flush()
        return accepted, problems

    def tool(self, fn: F) -> F:
        """Decorate a tool (sync or async) so each call inside a task is recorded."""
        sig = inspect.signature(fn)
        name = fn.__name__

        def arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
            try:
                bound = sig.bind_partial(*args, **kwargs)
                return dict(bound.arguments)
            except TypeError:
                return {"args": list(args), **kwargs}

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                task = _current_task.get()
                if task is None:
                    return await fn(*args, **kwargs)
                with task.action(name, arguments(args, kwargs)) as call:
                    out = await fn(*args, **kwargs)
                    call.result(out)
                    return out

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            task = _current_task.get()
            if task is None:
                return fn(*args, **kwargs)
            with task.action(name, arguments(args, kwargs)) as call:
                out = fn(*args, **kwargs)
                call.result(out)
                return out

        return wrapper  # type: ignore[return-value]

    def flush(self, timeout: float | None = None) -> bool:
        """Return once every event accepted so far is durable."""
        return self.recorder.flush(timeout)

    # -- writer hook: triggers ---------------------------------------------------------------
    def _on_batch(self, rows: list[Row], payloads: list[Any]) -> None:
        """Runs in the committer thread after a batch is durable: task ends and anomalies.

        ``payloads`` holds the sanitized payload of each watched event (else None), so the
        anomaly rules need not parse the JSON they were just made from.
        """
        queued = False
        counts = self._counts
        for i, (event_id, task_id, seq, ts, etype, body) in enumerate(rows):
            position = counts.get(task_id, 0)
            counts[task_id] = position + 1
            data = payloads[i] if i < len(payloads) else None
            if etype == "action_executed" and b'"status"' in body:
                if data is None:
                    data = orjson.loads(body)
                if is_failure((data.get("result") or {}).get("status")):
                    self._had_failure.add(task_id)
            if etype == "task_end":
                queued |= self._queue_end_reviews(task_id, task_id in self._had_failure)
                for per_task in (self._watches, self._positions, self._counts, self._local_reviews):
                    per_task.pop(task_id, None)
                self._had_failure.discard(task_id)
            elif self.triggers and etype in ("action_executed", "feedback", "user_input"):
                if data is None:
                    data = orjson.loads(body)
                queued |= self._watch(task_id, etype, data, event_id, seq, ts, position)
        if queued:
            self._work.set()

    def _queue_end_reviews(self, task_id: str, had_failure: bool) -> bool:
        from hindsight_loop.reflect import needs_review

        task = self.store.get_task(task_id)
        if task is None:
            return False
        queued = False
        if task.injected_lesson_ids:
            self.store.enqueue_review(task_id, kind="outcome", trigger="task_end")
            queued = True
        if needs_review(
            task, task.event_count, min_events=self.review_min_events, had_failure=had_failure
        ):
            self.store.enqueue_review(task_id, kind="full", trigger="task_end")
            queued = True
        return queued

    def _watch(
        self,
        task_id: str,
        etype: str,
        data: dict[str, Any],
        event_id: str,
        seq: int,
        ts: str,
        position: int,
    ) -> bool:
        from hindsight_loop.models import Event
        from hindsight_loop.replay import AnomalyWatch

        watch = self._watches.get(task_id)
        if watch is None:
            watch = self._watches[task_id] = AnomalyWatch()
            self._positions[task_id] = []
        positions = self._positions[task_id]
        positions.append(position)
        event = Event(
            event_id=event_id,
            task_id=task_id,
            seq=seq,
            timestamp=ts,
            type=etype,  # type: ignore[arg-type]
            agent_state=data.get("agent_state"),
            input=data.get("input"),
            decision=data.get("decision"),
            result=data.get("result"),
        )
        queued = False
        for node in watch.observe(event):
            done = self._local_reviews.get(task_id, 0)
            if done >= MAX_LOCAL_REVIEWS:
                break
            self._local_reviews[task_id] = done + 1
            # The watch counts only the events it saw; the review reads chronicle steps, which
            # are every event of the task: map back through the positions it saw them at.
            steps = [positions[i] for i in (node.index, *node.related) if 0 <= i < len(positions)]
            window = [max(0, min(steps) - 2), max(steps)]
            self.store.enqueue_review(task_id, kind="local", trigger=node.kind, window=window)
            queued = True
        return queued

    # -- replay, reflection ------------------------------------------------------------------
    def replay(self, task_id: str, *, max_steps: int = 500) -> Chronicle:
        """The chronicle of a task: ordered steps and key nodes."""
        from hindsight_loop.replay import replay

        task = self.store.get_task(task_id)
        if task is None:
            raise KeyError(
                f"no task {task_id!r} in {self.store.url}; list them with 'hindsight tasks'"
            )
        return replay(task, self.store.events(task_id), max_steps=max_steps)

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
        # A local review's window is in run positions: replay it uncompressed so step indices
        # are run positions (the reflector reads only the window, so the size does not matter).
        chronicle = self.replay(task_id, max_steps=1 << 30) if window else self.replay(task_id)
        reflector = reflector or self.reflector
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
                error=f"{type(exc).__name__}: {exc}",
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        reflection.trigger = trigger
        reflection.created_at = reflection.created_at or iso(utcnow())
        if reflection.status == "ok":
            for draft in reflection.lessons:
                if not draft.source_task_ids:
                    draft.source_task_ids = [task_id]
                if not draft.scope or draft.scope == "global":
                    draft.scope = chronicle.task.scope or "global"
                try:
                    reflection.lesson_ids.append(self.add_lesson(draft).lesson_id)
                except Exception as exc:  # noqa: BLE001
                    log.exception("hindsight: curating a lesson failed")
                    reflection.error = f"curation failed: {exc!r}"
        self.store.save_reflection(reflection)
        return reflection

    def add_lesson(self, draft: Any) -> Lesson:
        """Curate one lesson draft into the book: add, merge into a twin, or flag a conflict."""
        from hindsight_loop.lessons import curate

        # Read the book, decide and write in one transaction: two reviews (a worker thread, a
        # `hindsight worker` process, an MCP call) curating at once must see each other's lesson.
        with self._curate_lock, self.store.transaction():
            book = self.store.list_lessons(task_type=draft.task_type)
            change = curate(draft, book, embedder=self.embedder)
            for lesson in change.saves:
                self.save_lesson(lesson)
        return change.lesson

    def save_lesson(self, lesson: Lesson) -> None:
        """Store a lesson with its embedding (re-embedded on every save: the text may change)."""
        vec = self.embedder.embed([lesson_text(lesson)])[0].astype(np.float32)
        self.store.save_lesson(lesson, embedding=vec.tobytes(), embed_model=self.embedder.name)

    # -- recall ------------------------------------------------------------------------------
    def _lesson_index(self) -> tuple[LessonIndex, bool]:
        """The recall index and whether it may be behind the book.

        A small book is re-indexed at once when it changes. A large one (building takes about
        0.6 s at 10k lessons) is re-indexed in a background thread while recall keeps serving
        the previous index, so no recall on the agent's path pays for a rebuild.
        """
        version = self.store.book_version()
        index = self._index
        if index is not None and version == self._index_version:
            return index, False
        if index is None or len(index) < SYNC_REBUILD_MAX:
            with self._index_lock:
                if self._index is None or self._index_version != self.store.book_version():
                    self._rebuild_index()
                assert self._index is not None
                return self._index, False
        if not self._index_lock.locked():
            threading.Thread(target=self._rebuild_in_background, daemon=True).start()
        return index, True

    def _rebuild_in_background(self) -> None:
        if not self._index_lock.acquire(blocking=False):
            return  # another rebuild is under way
        try:
            if self.store.book_version() != self._index_version and not self._closed:
                self._rebuild_index()
        except Exception:  # noqa: BLE001 - the old index keeps serving
            log.exception("hindsight: rebuilding the recall index failed")
        finally:
            self._index_lock.release()

    def _rebuild_index(self) -> None:
        """Build the index from the store (call with ``_index_lock`` held)."""
        from hindsight_loop.recall import LessonIndex

        version = self.store.book_version()
        lessons = self._expire_due(self.store.list_lessons())
        vectors: dict[str, np.ndarray] = {}
        stale: list[Lesson] = []
        stored = self.store.lesson_embeddings()
        for lesson in lessons:
            model, blob = stored.get(lesson.lesson_id, (None, None))
            if model == self.embedder.name and blob is not None:
                vectors[lesson.lesson_id] = np.frombuffer(blob, dtype=np.float32)
            else:
                stale.append(lesson)
        if stale:
            # The embedding model changed (or a lesson was imported without one): re-embed
            # and store, so the next process does not have to.
            fresh = self.embedder.embed([lesson_text(x) for x in stale])
            with self.store.transaction():
                for lesson, vec in zip(stale, fresh, strict=True):
                    vectors[lesson.lesson_id] = vec.astype(np.float32)
                    self.store.save_lesson(
                        lesson,
                        embedding=vec.astype(np.float32).tobytes(),
                        embed_model=self.embedder.name,
                    )
            version = self.store.book_version()
        self._index = LessonIndex(lessons, embedder=self.embedder, vectors=vectors)
        self._index_version = version

    def _expire_due(self, lessons: list[Lesson]) -> list[Lesson]:
        """Mark lessons past ``valid_until`` expired in the store (kept, never deleted)."""
        from hindsight_loop.lessons import expire_due

        expired = {x.lesson_id: x for x in expire_due(lessons)}
        for lesson in expired.values():
            self.store.save_lesson(lesson)
        return [expired.get(x.lesson_id, x) for x in lessons]

    def recall(
        self,
        *,
        task_type: str | None = None,
        tools: Sequence[str] = (),
        query: str = "",
        intent: str | None = None,
        scope: str | None = None,
        step: str | None = None,
        error_type: str | None = None,
        limit: int = 3,
        count_hits: bool = True,
    ) -> LessonSet:
        """The best lessons (at most ``limit``, at most 3 by default) for a task, rules first."""
        from hindsight_loop.recall import LessonSet, RecallQuery

        q = RecallQuery(
            task_type=task_type,
            tools=_tool_list(tools),
            query=query,
            intent=intent,
            scope=scope,
            step=step,
            error_type=error_type,
        )
        index, behind = self._lesson_index()
        found = index.search(q, limit=min(limit, 3))
        if behind and found:
            # The index may predate a reject, an expiry or a conflict: check the few lessons
            # returned against the book itself.
            live = {
                x.lesson_id
                for x in (self.store.get_lesson(i) for i in found.ids)
                if x is not None and x.is_live()
            }
            found = LessonSet(x for x in found if x.lesson_id in live)
        if count_hits and found:
            try:
                self.store.bump_hits([x.lesson_id for x in found])
            except Exception:  # noqa: BLE001 - a hit count is not worth failing a recall for
                log.exception("hindsight: could not count hits")
        return found

    def credit_lessons(self, task_id: str, lesson_ids: Sequence[str]) -> None:
        """Count lessons as injected into a task that already started (recalled mid-run, or by
        an MCP client): the task's outcome will move their helpful / harmful counts."""
        if not lesson_ids:
            return
        self.flush()
        with self.store.transaction():
            task = self.store.get_task(task_id)
            if task is None:
                warn(f"credit_lessons: no task {task_id!r}; start it first")
                return
            fresh = [x for x in lesson_ids if x not in task.injected_lesson_ids]
            if fresh:
                task.injected_lesson_ids = [*task.injected_lesson_ids, *fresh]
                self.store.upsert_task(task)

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
        needed). A runner that returns a dict with ``{"status": "failed"}`` or raises marks
        the task failed; the exception is re-raised after the review is stored.
        """
        text_goal = goal if goal is not None else _goal_text(task_input)
        try:
            with self.task(
                task_type, goal=text_goal, tools=tools, scope=scope, intent=intent
            ) as task:
                if isinstance(task_input, dict) and isinstance(task_input.get("messages"), list):
                    task_input = {
                        **task_input,
                        "messages": self.inject(task_input["messages"], task.lessons),
                    }

                def event_callback(event: dict[str, Any]) -> None:
                    if isinstance(event, dict):
                        self.record({**event, "task_id": task.task_id})
                    else:
                        self.record(event)  # refused with a warning, kept in the dead letter

                result = runner(task_input, event_callback)
                if isinstance(result, dict) and result.get("status") == "failed":
                    task.fail(str(result.get("error") or "runner reported failure"))
        finally:
            # After task_end is recorded, also when the runner raised: the review sees the
            # whole run, then the exception goes on.
            self._after_task()
        return result

    def _after_task(self) -> None:
        try:
            self.drain()
        except Exception:  # noqa: BLE001 - reviewing never breaks the task
            log.exception("hindsight: review after the task failed")

    # -- reviews off the hot path ------------------------------------------------------------
    def run_pending(self, *, limit: int | None = None) -> int:
        """Run queued reviews in this thread (what ``hindsight worker`` does). Returns how many."""
        done = 0
        while limit is None or done < limit:
            with self._busy:
                job = self.store.claim_review()
                if job is None:
                    return done
                self._run_job(job)
            done += 1
        return done

    def _run_job(self, job: ReviewJob) -> None:
        try:
            if job.kind == "outcome":
                self._apply_outcome(job.task_id)
            elif job.kind == "local" and self.store.has_pending_review(job.task_id, kind="full"):
                # The task ended before its local review ran and a full review of the whole
                # run is queued: that one sees everything the local one would.
                self.store.finish_review(job.job_id, status="skipped", error="full review queued")
                return
            else:
                reflector = self.reflector if job.use_llm else self.offline_reflector
                r = self.reflect(
                    job.task_id,
                    reflector=reflector,
                    kind=job.kind,
                    window=job.window,
                    trigger=job.trigger,
                )
                if r.status == "failed":
                    self.store.finish_review(job.job_id, status="failed", error=r.error)
                    return
            self.store.finish_review(job.job_id, status="done")
        except Exception as exc:  # noqa: BLE001 - the worker survives any one job
            log.exception("hindsight: review job %s failed", job.job_id)
            self.store.finish_review(job.job_id, status="failed", error=repr(exc))

    def _apply_outcome(self, task_id: str) -> None:
        from hindsight_loop.lessons import apply_outcome

        task = self.store.get_task(task_id)
        if task is None or task.status == "running":
            return
        for lesson_id in task.injected_lesson_ids:
            # Read and write in one transaction: a CLI 'reject' or another worker's update of
            # the same lesson in between would otherwise be overwritten.
            with self.store.transaction():
                lesson = self.store.get_lesson(lesson_id)
                if lesson is not None:
                    self.store.save_lesson(
                        apply_outcome(lesson, succeeded=task.status == "succeeded", task_id=task_id)
                    )

    def _work_loop(self) -> None:
        while not self._closed:
            self._work.wait(0.25)
            self._work.clear()
            if self._closed:
                return
            try:
                self.run_pending()
            except Exception:  # noqa: BLE001
                log.exception("hindsight: review worker error")

    def drain(self, timeout: float = 120.0) -> bool:
        """Flush events, then wait until every queued review has run. True if all done."""
        self.flush()
        deadline = time.monotonic() + timeout
        if self._worker is None or not self._worker.is_alive():
            self.run_pending()
            return self.store.pending_reviews(mine=True) == 0
        while time.monotonic() < deadline:
            self._work.set()
            with self._busy:
                if self.store.pending_reviews(mine=True) == 0:
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Flush what was recorded, finish the review in flight, close the store."""
        if self._closed:
            return
        try:
            self.recorder.close()
        finally:
            self._closed = True
            self._work.set()
            # Ends a retry backoff in flight, so a slow model cannot hold the process open.
            closer = getattr(self._reflector, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:  # noqa: BLE001
                    log.exception("hindsight: closing the reflector failed")
            if self._worker is not None:
                self._worker.join(timeout=30)
            self.store.close()
            atexit.unregister(self._atexit)

    def __enter__(self) -> Hindsight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the task context ---------------------------------------------------------------------------


class TaskRun:
    """One task being recorded; created by ``Hindsight.task``."""

    def __init__(
        self,
        hs: Hindsight,
        *,
        task_type: str,
        goal: str,
        tools: list[str],
        scope: str,
        intent: str | None,
        query: str | None,
        recall: bool,
        task_id: str,
        timestamp: Any,
    ) -> None:
        self.hs = hs
        self.task_id = task_id
        self.task_type = task_type
        self.goal = goal
        self.tools = tools
        self.scope = scope
        self.intent = intent
        self._query = query
        self._recall = recall
        self._timestamp = timestamp
        self._outcome: dict[str, Any] | None = None
        self._token: contextvars.Token | None = None
        self.lessons: LessonSet = _empty_lessons()
        self.events = 0

    # -- context -----------------------------------------------------------------------------
    def __enter__(self) -> TaskRun:
        if self._recall:
            try:
                self.lessons = self.hs.recall(
                    task_type=self.task_type,
                    tools=self.tools,
                    query=self._query or self.goal,
                    intent=self.intent,
                    scope=self.scope,
                )
            except Exception:  # noqa: BLE001 - no lessons is better than no task
                log.exception("hindsight: recall at task start failed")
        self._emit(
            "task_start",
            {
                "task_type": self.task_type,
                "goal": self.goal,
                "tools": self.tools,
                "scope": self.scope,
                "intent": self.intent,
                "injected_lesson_ids": [x.lesson_id for x in self.lessons],
            },
            timestamp=self._timestamp,
        )
        self._token = _current_task.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            try:
                _current_task.reset(self._token)
            except ValueError:  # exited in another context (a generator, a thread)
                _current_task.set(None)
        if exc is not None:
            result = {
                "status": "failed",
                "error_type": type(exc).__name__,
                "error_message": _error_text(exc),
            }
        else:
            result = self._outcome or {"status": "succeeded"}
        self._emit("task_end", {"result": result})
        # the exception, if any, propagates: returning None does not swallow it

    # -- steps -------------------------------------------------------------------------------
    def _emit(self, etype: str, payload: dict[str, Any], *, timestamp: Any = None) -> None:
        self.events += 1
        self.hs.recorder.emit(self.task_id, etype, payload, timestamp=timestamp)

    def user_input(self, text: str, *, timestamp: Any = None) -> None:
        """The user said something."""
        self._emit("user_input", {"input": {"text": text}}, timestamp=timestamp)

    def decision(
        self,
        chosen: str,
        *,
        alternatives: Sequence[str] = (),
        confidence: float | None = None,
        reasoning: str | None = None,
        step: str | None = None,
        timestamp: Any = None,
    ) -> None:
        """The model chose an action (``llm_decision``)."""
        payload: dict[str, Any] = {
            "decision": {
                "chosen_action": chosen,
                "alternatives": list(alternatives),
                "confidence": confidence,
            }
        }
        if reasoning:
            payload["decision"]["reasoning"] = reasoning
        if step:
            payload["agent_state"] = {"current_step": step}
        self._emit("llm_decision", payload, timestamp=timestamp)

    def state(
        self, *, timestamp: Any = None, context: dict[str, Any] | None = None, **agent_state: Any
    ) -> None:
        """The agent's state changed (``current_step=…``, ``context_count=…``)."""
        payload: dict[str, Any] = {"agent_state": agent_state}
        if context:
            payload["context"] = context
        self._emit("state_change", payload, timestamp=timestamp)

    def feedback(
        self, text: str = "", *, score: float | None = None, timestamp: Any = None
    ) -> None:
        """The user's satisfaction: a negative score or words of complaint mark dissatisfaction."""
        self._emit("feedback", {"input": {"text": text, "score": score}}, timestamp=timestamp)

    def action(
        self,
        name: str,
        input: dict[str, Any] | None = None,  # noqa: A002 - the wire format's own word
        *,
        step: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> ActionCall:
        """Record one tool call: ``with task.action("read_csv", {...}) as call: ...``."""
        return ActionCall(self, name, input, step=step, context=context)

    def record_action(
        self,
        name: str,
        args: dict[str, Any] | None,
        *,
        output: Any = None,
        status: str = "succeeded",
        error_type: str | None = None,
        error_message: str | None = None,
        step: str | None = None,
        latency_ms: float | None = None,
        timestamp: Any = None,
    ) -> None:
        """Record a tool call that already happened, in one call (the cheapest path)."""
        if name in self.hs.skip_tools:
            return
        result: dict[str, Any] = {"status": status, "output": output}
        if error_type is not None:
            result["error_type"] = error_type
            result["error_message"] = error_message
        if latency_ms is not None:
            result["latency_ms"] = latency_ms
        # The cheapest path takes ``args`` as given (no copy): the writer reads it within a few
        # milliseconds, so do not refill the same dict for the next call (task.action copies).
        payload: dict[str, Any] = {"input": {"tool": name, "args": args}, "result": result}
        if step is not None:
            payload["agent_state"] = {"current_step": step}
        self._emit("action_executed", payload, timestamp=timestamp)

    def fail(self, reason: str | None = None, **details: Any) -> None:
        """Mark the task failed (recorded when the ``with`` block ends)."""
        self._outcome = {"status": "failed", "error_message": reason, **details}

    def succeed(self, **details: Any) -> None:
        """Mark the task succeeded (the default when the block ends without an exception)."""
        self._outcome = {"status": "succeeded", **details}

    # -- lessons -----------------------------------------------------------------------------
    @property
    def advice(self) -> str:
        """The recalled lessons rendered as tool-usage advice ('' when there are none)."""
        return self.lessons.as_prompt() if self.lessons else ""

    def advice_for(self, tool: str, *, error_type: str | None = None, query: str = "") -> LessonSet:
        """Recall during the run, e.g. right after a tool failed, to change course in time."""
        try:
            found = self.hs.recall(
                task_type=self.task_type,
                tools=[tool],
                query=query or f"{tool} {error_type or ''}",
                scope=self.scope,
                error_type=error_type,
            )
            fresh = [x for x in found if x.lesson_id not in {y.lesson_id for y in self.lessons}]
            if fresh:
                # They were handed to the agent: the task's outcome counts for them too.
                self.lessons.extend(fresh)
                self.hs.credit_lessons(self.task_id, [x.lesson_id for x in fresh])
            return found
        except Exception:  # noqa: BLE001
            log.exception("hindsight: in-run recall failed")
            return _empty_lessons()


class ActionCall:
    """One tool call being recorded; ``call.result(...)`` sets its result explicitly."""

    __slots__ = ("_context", "_name", "_result", "_started", "_step", "_task", "input")

    def __init__(
        self,
        task: TaskRun,
        name: str,
        input: dict[str, Any] | None,  # noqa: A002
        *,
        step: str | None,
        context: dict[str, Any] | None,
    ) -> None:
        self._task = task
        self._name = name
        # As called: a dict the agent refills for its next call must not rewrite this one.
        self.input = input.copy() if type(input) is dict else input
        self._step = step
        self._context = context
        self._result: dict[str, Any] | None = None
        self._started = 0.0

    def __enter__(self) -> ActionCall:
        self._started = time.perf_counter()
        return self

    def result(self, output: Any = None, *, status: str | None = None, **fields: Any) -> None:
        """Set what the call returned. ``status`` defaults to succeeded."""
        self._result = {"status": status or "succeeded", "output": output, **fields}

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._name in self._task.hs.skip_tools:
            return
        latency = round((time.perf_counter() - self._started) * 1000, 3)
        result: dict[str, Any]
        if exc is not None:
            result = {
                "status": "failed",
                "error_type": type(exc).__name__,
                "error_message": _error_text(exc),
            }
            if self._result and "output" in self._result:
                result["output"] = self._result["output"]
        else:
            result = self._result or {"status": "succeeded"}
        result["latency_ms"] = latency
        payload: dict[str, Any] = {
            "input": {"tool": self._name, "args": self.input},
            "result": result,
        }
        if self._step is not None:
            payload["agent_state"] = {"current_step": self._step}
        if self._context:
            payload["context"] = self._context
        self._task._emit("action_executed", payload)


# -- helpers ------------------------------------------------------------------------------------


def _empty_lessons() -> LessonSet:
    from hindsight_loop.recall import LessonSet

    return LessonSet()


def _tool_list(tools: Sequence[str] | str | None) -> list[str]:
    """Tool names as a list; a lone string is one tool, not its letters."""
    if tools is None:
        return []
    if isinstance(tools, str):
        warn(f"tools={tools!r} is a string: taken as one tool; pass a list of tool names")
        return [tools]
    return [str(t) for t in tools]


def _error_text(exc: BaseException) -> str:
    """``str(exc)`` that cannot fail: the agent's own exception must stay the one it sees."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__}: str() failed>"


def _goal_text(task_input: Any) -> str:
    if isinstance(task_input, str):
        return task_input[:500]
    if isinstance(task_input, dict):
        for key in ("goal", "query", "question", "input", "task"):
            if isinstance(task_input.get(key), str):
                return task_input[key][:500]
        msgs = task_input.get("messages")
        if isinstance(msgs, list):
            for m in reversed(msgs):
                if (
                    isinstance(m, dict)
                    and m.get("role") == "user"
                    and isinstance(m.get("content"), str)
                ):
                    return m["content"][:500]
    return repr(task_input)[:500]


def _check_wire_event(event: Any) -> str | None:
    """What is wrong with a wire-format event, or None."""
    if not isinstance(event, dict):
        return f"an event must be a dict (a JSON object), got {type(event).__name__}"
    etype = event.get("type")
    if etype not in EVENT_TYPES:
        return f"unknown event type {etype!r}; expected one of {', '.join(sorted(EVENT_TYPES))}"
    task_id = event.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        return "an event needs a non-empty string 'task_id'"
    for name in EVENT_BODY_FIELDS:
        value = event.get(name)
        if value is not None and not isinstance(value, dict):
            return f"event field {name!r} must be an object, got {type(value).__name__}"
    return None


__all__ = ["ActionCall", "Hindsight", "TaskRun", "current_task"]
