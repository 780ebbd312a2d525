"""Storage behind one narrow protocol.

SQLite (a file, embedded) is the default; PostgreSQL (``postgresql://…``) is the store many
agents on many hosts share. Everything else in Hindsight talks to a ``Store`` and
never to a database directly, so another backend only has to implement this protocol.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hindsight_loop.models import (
    Event,
    Lesson,
    Reflection,
    Task,
    TaskScores,
    reset_in_forked_child,
)

if TYPE_CHECKING:
    from hindsight_loop.replay import StoredRun

#: A row for ``write_event_batch``: ``(event_id, task_id, seq, timestamp, type, body_json)``,
#: optionally with the event's replay projection (``replay.project_json``, None for none) as a
#: seventh element; a row without one has it worked out from its body.
EventRow = (
    tuple[str, str, int, str, str, bytes] | tuple[str, str, int, str, str, bytes, bytes | None]
)


@dataclass(kw_only=True, slots=True)
class Job:
    """A queued reflection, claimed by a worker thread or a ``hindsight worker`` process."""

    job_id: int
    task_id: str
    kind: str
    """``full`` or ``local``."""
    trigger: str
    """``task_end``, ``consecutive_failures``, ``dissatisfaction``, ``loop``, ``manual``."""
    window: list[int] | None = None
    """For a local review: ``[first, last]`` step indices (``Step.index``) of the anomaly's window."""
    attempts: int = 0
    use_llm: bool = True


class ThreadConnections:
    """Both stores' connections: one per thread (``_local.db``), each listed in ``_conns`` for
    ``close()``; in a child forked from the process, none of them.

    A connection copied into a child by ``fork()`` is its parent's: SQLite's locks are the
    parent's (SQLite says never to use one across a fork), and a PostgreSQL connection shares
    its socket with the parent, whose connection closing it in the child would end. The child
    keeps the copies, never using, closing or finalizing them, and connects anew."""

    def _init_connections(self) -> None:
        self._local = threading.local()
        self._conns: dict[Any, threading.Thread] = {}  # each connection and its thread
        self._lock = threading.Lock()
        _STORES.add(self)

    def _keep(self, db: Any) -> None:
        """List this thread's new connection for ``close()``, and close those of threads that
        have ended: each outlived its thread, and 10,000 short-lived threads making a call
        each held 10,000 files open, until SQLite could open no more."""
        # Not the main thread's: at the interpreter's exit it counts as ended (threading
        # stops it before the atexit hooks run), while those hooks, close() among them, still
        # call the store through its connection.
        main = threading.main_thread()
        with self._lock:
            ended = [
                conn
                for conn, thread in self._conns.items()
                if not thread.is_alive() and thread is not main
            ]
            for conn in ended:
                del self._conns[conn]
            self._conns[db] = threading.current_thread()
        for conn in ended:
            with contextlib.suppress(Exception):
                conn.close()

    def _forked(self) -> None:
        _INHERITED.extend(self._conns)
        self._init_connections()


class StoreCalls:
    """Before a fork, the store calls under way in other threads finish, and none starts until
    the fork is done.

    SQLite's global mutexes (its memory allocator's, the one over its open files and their
    locks) held by a thread in the middle of a call at the fork stay held in the child for
    good: the child's first store call hangs, on a connection of its own all the same. Beside
    two threads writing lessons, 4-5 of 150 forked children hung on their first read. Every
    SQLite store call (``through_store_calls``) passes through here.

    The calls pay no lock: each thread counts its own depth in a cell of its own, and a fork
    counts itself, then waits until every other thread's cell is at zero; a call that finds
    a fork under way steps out and waits for the forks to end."""

    #: Seconds a fork waits for the calls under way (a checkpoint takes tens of ms). Past
    #: this the fork goes ahead (a fork must never hang on Hindsight), and later forks do not
    #: wait for the calls it gave up on while they last: a thread waiting out SQLite's busy
    #: timeout on another process's lock (30 s) made each of a pool's four forks wait 5 s.
    WAIT = 1.0

    def __init__(self) -> None:
        # One thread-local for the life of the process: a forked child keeps the forking
        # thread's, and the others' went with their threads.
        self._local = threading.local()
        self._cells: weakref.WeakSet[_Depth] = weakref.WeakSet()  # a thread's ends with it
        # New cells are added under it: a fork listing them meanwhile failed (the set changed
        # size), and went ahead without waiting.
        self._cells_lock = threading.Lock()
        self._given_up: weakref.WeakSet[_Depth] = weakref.WeakSet()
        self._new_forks()

    def _new_forks(self) -> None:
        # Forks under way: two threads may fork at once, and the first one done must not let
        # calls in while the second is still on its way.
        self._forks = 0
        self._forks_lock = threading.Lock()
        self._fork_done = threading.Event()
        self._fork_done.set()

    def cell(self) -> _Depth:
        """This thread's depth in store calls."""
        cell = getattr(self._local, "cell", None)
        if cell is None:
            cell = self._local.cell = _Depth()
            with self._cells_lock:
                self._cells.add(cell)
        return cell

    def step_out(self, cell: _Depth) -> None:
        """A call that found a fork under way: out of the count until the forks are done."""
        while self._forks and cell.depth == 1:
            cell.depth = 0
            self._fork_done.wait()
            cell.depth = 1

    def __enter__(self) -> None:
        cell = self.cell()
        cell.depth += 1
        if self._forks:  # counted first, then the forks read: a fork begun sees this call
            self.step_out(cell)

    def __exit__(self, *exc: object) -> None:
        self._local.cell.depth -= 1

    def _before_fork(self) -> None:
        with self._forks_lock:
            self._forks += 1
            self._fork_done.clear()
        mine = getattr(self._local, "cell", None)  # a fork from inside a call waits not for it
        with self._cells_lock:
            cells = [c for c in self._cells if c is not mine]
        given_up = self._given_up  # under the forks' lock: two threads may fork at once
        with self._forks_lock:
            for cell in [c for c in given_up if not c.depth]:
                given_up.discard(cell)  # out of the call a fork gave up on
        deadline = time.monotonic() + self.WAIT
        while inside := [c for c in cells if c.depth and c not in given_up]:
            if time.monotonic() > deadline:
                with self._forks_lock:
                    given_up.update(inside)
                break
            time.sleep(0.0005)

    def _after_fork_in_parent(self) -> None:
        with self._forks_lock:
            self._forks -= 1
            if not self._forks:
                self._fork_done.set()

    def _after_fork_in_child(self) -> None:
        # The child's one thread; a cell another thread left inside a call the fork gave up
        # on would be waited for at each of the child's forks.
        mine = getattr(self._local, "cell", None)
        self._cells = weakref.WeakSet([mine] if mine is not None else [])
        self._cells_lock = threading.Lock()
        self._given_up = weakref.WeakSet()
        self._new_forks()  # their locks may have been held by another thread


class _Depth:
    """One thread's depth in store calls (a call may make another)."""

    __slots__ = ("depth", "__weakref__")

    def __init__(self) -> None:
        self.depth = 0


#: The one gate of this process's store calls (``StoreCalls``).
STORE_CALLS = StoreCalls()
os.register_at_fork(
    before=STORE_CALLS._before_fork,
    after_in_parent=STORE_CALLS._after_fork_in_parent,
    after_in_child=STORE_CALLS._after_fork_in_child,
)

C = TypeVar("C", bound=type)


def through_store_calls(*names: str) -> Callable[[C], C]:
    """A class decorator: its public methods, and ``names``, run through ``STORE_CALLS``
    (a method that reads a result lazily, a generator or a context manager, gates itself)."""

    def gate(cls: C) -> C:
        for name, method in list(vars(cls).items()):
            if inspect.isfunction(method) and (not name.startswith("_") or name in names):
                setattr(cls, name, _gated(method))
        return cls

    return gate


def _gated(method: Callable[..., Any]) -> Callable[..., Any]:
    gate, local = STORE_CALLS, STORE_CALLS._local

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        # ``with STORE_CALLS`` inlined: this costs ~0.3-0.4 µs a call (timeit, book_version).
        cell = getattr(local, "cell", None) or gate.cell()
        cell.depth += 1
        if gate._forks:
            gate.step_out(cell)
        try:
            return method(*args, **kwargs)
        finally:
            cell.depth -= 1

    return call


#: The stores of this process, and a forked child's copies of their connections.
_STORES: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()
_INHERITED: list[Any] = []


reset_in_forked_child(_STORES, "store")


class JobOwner:
    """The ``owner`` of a store object: who queues and claims jobs through it (both stores)."""

    def __init__(self) -> None:
        self._host = socket.gethostname()
        self._owner: str | None = None

    @property
    def owner(self) -> str:
        """Host, process, object. The process id is read when asked, so a child forked from
        the agent queues and waits for its own jobs."""
        return self._owner or f"{self._host}:{os.getpid()}:{id(self):x}"

    @owner.setter
    def owner(self, value: str) -> None:
        self._owner = value  # the writer process queues the agent's jobs as the agent's


class Store(Protocol):
    """What Hindsight needs from a database."""

    url: str
    owner: str
    """Who queues and claims jobs through this store object (``pending_jobs(mine=True)``)."""

    # events ------------------------------------------------------------------------------
    def write_event_batch(self, rows: Sequence[EventRow]) -> list[str]:
        """Durably write recorder rows ``(event_id, task_id, seq, timestamp, type, body_json[,
        projection])`` (``EventRow``).

        One statement per batch; raises on failure so the caller can dead-letter the batch.
        Tasks are created from ``task_start`` rows and closed by ``task_end`` rows; events of a
        task that was never started are kept under a placeholder task, whose ids are returned.
        """

    def event_ids(self, task_id: str) -> set[str]:
        """The ids of a task's stored events (an import skips those it already stored)."""
        ...

    def event_keys(self, task_id: str) -> set[tuple[str, int]]:
        """The ``(event_id, seq)`` of a task's stored events: a writer taking over from a dead
        one skips the lines it stored (a caller may use one id twice in a task)."""
        ...

    def runs_with(self, task_type: str, fragment: str, *, besides: str) -> int:
        """How many runs of a task type, other than ``besides``, have a tool call whose stored
        body contains ``fragment`` (a compact JSON ``"key":value``)."""
        ...

    def events(self, task_id: str) -> list[Event]:
        """A task's events ordered by (timestamp, seq)."""

    def stored_run(self, task_id: str) -> StoredRun:
        """A task's events as replay reads them: each event's projection (``replay.project``,
        kept beside its body at write time) in (timestamp, seq) order, bodies read on demand."""

    def event_count(self, task_id: str | None = None) -> int: ...

    # tasks -------------------------------------------------------------------------------
    def upsert_task(self, task: Task) -> None: ...

    def get_task(self, task_id: str) -> Task | None: ...

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        """``get_task`` of several tasks in one statement, by id (those not stored left out):
        the event writer reads a batch's ended tasks at once."""
        ...

    def list_tasks(
        self, *, limit: int = 50, task_type: str | None = None, status: str | None = None
    ) -> list[Task]: ...

    def task_scores(self, task_id: str) -> TaskScores | None:
        """What a task's run has counted in the lessons injected into it (``save_task_scores``);
        None when nothing has been counted for the task."""

    def save_task_scores(self, task_id: str, scores: TaskScores) -> None:
        """Keep what a task's run has counted, beside the task (nothing else of it changes)."""

    # lessons -----------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[None]:
        """A write transaction for this thread: reads and writes inside it are one unit."""

    def save_lesson(
        self, lesson: Lesson, *, embedding: bytes | None = None, embed_model: str | None = None
    ) -> None: ...

    def get_lesson(self, lesson_id: str) -> Lesson | None: ...

    def list_lessons(
        self, *, status: str | None = None, task_type: str | None = None
    ) -> list[Lesson]: ...

    def lesson_embeddings(self) -> dict[str, tuple[str, bytes]]:
        """``lesson_id -> (embed_model, vector bytes)`` for every lesson that has one."""

    def bump_hits(self, lesson_ids: Sequence[str]) -> None: ...

    def book_version(self) -> int:
        """A number that changes whenever any lesson changes (lets recall cache its index)."""

    def lessons_since(self, version: int) -> tuple[int, list[Lesson]]:
        """The book's version and the lessons saved since ``version`` (each lesson is stamped
        with the book version its save committed), so a reader's cache applies only those."""

    # reflections and the job queue -------------------------------------------------------
    def save_reflection(self, reflection: Reflection) -> None: ...

    def reflections(self, task_id: str | None = None, *, limit: int = 100) -> list[Reflection]: ...

    def enqueue_job(
        self,
        task_id: str,
        *,
        kind: str = "full",
        trigger: str = "task_end",
        window: list[int] | None = None,
        use_llm: bool = True,
    ) -> int: ...

    def enqueue_jobs(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        """``enqueue_job`` for each of ``jobs`` (its keyword arguments, ``task_id`` among them),
        in one transaction."""

    def claim_job(self) -> Job | None:
        """Take the oldest pending job (atomically, so two workers never take the same one),
        or one left running past its lease by a worker that died."""

    def finish_job(self, job_id: int, *, status: str, error: str | None = None) -> None: ...

    def has_pending_job(self, task_id: str, *, kind: str) -> bool:
        """Whether a job of this kind for this task is waiting to run."""

    def queued_job_kinds(self, task_id: str, *, trigger: str, since: str | None = None) -> set[str]:
        """The kinds of the jobs ever queued for this task with this trigger, whatever their
        status (a writer that takes over from a dead one queues only what is missing);
        ``since``, a wire timestamp: only those queued at or after it (a task id run again:
        the reviews of its earlier runs are not this run's)."""

    def pending_jobs(self, *, mine: bool = False) -> int:
        """Jobs waiting or running (``mine``: only those this store object runs)."""

    # misc --------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def open_store(url: str, *, readonly: bool = False) -> Store:
    """Open a store from a path or URL: ``hindsight.db``, ``sqlite:///path/to.db``,
    ``postgresql://user@host/db`` (needs the ``[postgres]`` extra).

    ``readonly`` opens an existing store for reading only (nothing is written to the file or
    next to it; a store on read-only media can be read).
    """
    from hindsight_loop.store.sqlite import SQLiteStore

    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///") :], readonly=readonly)
    if url.startswith("sqlite://"):
        return SQLiteStore(url[len("sqlite://") :], readonly=readonly)
    if url.startswith(("postgresql://", "postgres://")):
        # Imported here: psycopg is an extra, and the core must import without it.
        from hindsight_loop.store.postgres import PostgresStore

        return PostgresStore(url, readonly=readonly)
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(
            f"unsupported store URL scheme {scheme!r}: use a file path, 'sqlite:///path.db' or "
            "'postgresql://user@host/db'"
        )
    return SQLiteStore(url, readonly=readonly)


__all__ = ["Job", "Store", "open_store"]
