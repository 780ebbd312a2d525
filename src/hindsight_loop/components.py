"""What a ``Hindsight`` is built from, chosen once from its arguments and the environment.

Which recorder runs (a writer thread, or a writer process), where its dead letter goes, and
which reflector, pair judge and embedder serve the reviews: each is answered here, so the
facade only holds the answers. The models are resolved lazily, on first use, so an agent that
only records never imports an LLM client or an embedding library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from hindsight_loop.record import Recorder, state_dir, warn

if TYPE_CHECKING:
    from hindsight_loop.embed import Embedder
    from hindsight_loop.reflect import Reflector
    from hindsight_loop.store import Store
    from hindsight_loop.triggers import Triggers
    from hindsight_loop.worker import Worker

log = logging.getLogger("hindsight_loop")

Writer = Literal["thread", "process"]


class Models:
    """The reflector, the pair judge and the embedder of one ``Hindsight``, each made on first use.

    Args:
        reflector: The caller's reflector; None for the LLM configured in the environment
            (``HINDSIGHT_LLM_*``), else the deterministic offline reflector.
        embedder: The caller's embedder; None for the default (offline hashed n-grams).
    """

    def __init__(self, reflector: Reflector | None, embedder: Embedder | None) -> None:
        self._reflector = reflector
        self._embedder = embedder
        self._offline: Reflector | None = None
        self._pair_judge: Any = None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from hindsight_loop.embed import default_embedder

            self._embedder = default_embedder()
        return self._embedder

    @property
    def reflector(self) -> Reflector:
        if self._reflector is None:
            reflector: Reflector | None = None
            try:
                from hindsight_loop.llm import reflector_from_env

                reflector = reflector_from_env()  # type: ignore[assignment,operator]
            except (ImportError, ValueError) as exc:
                # A missing client package or an unusable HINDSIGHT_LLM_* setting: say so and
                # keep learning offline rather than failing every review.
                warn(f"LLM reflection is off ({exc}); using the offline reflector")
            self._reflector = reflector or self.offline_reflector
        return self._reflector

    @property
    def offline_reflector(self) -> Reflector:
        if self._offline is None:
            from hindsight_loop.reflect import OfflineReflector

            self._offline = OfflineReflector()
        return self._offline

    @property
    def pair_judge(self) -> Callable[[str, str], str | None] | None:
        """The reflector's model as the judge of the lesson pairs curation's rules leave open;
        None when reviews run offline."""
        llm = getattr(self.reflector, "llm", None)
        if llm is None:
            return None
        if self._pair_judge is None or self._pair_judge.llm is not llm:
            from hindsight_loop.llm.judge import PairJudge

            self._pair_judge = PairJudge(llm)
        return self._pair_judge  # type: ignore[no-any-return]

    def close(self) -> None:
        """End a reflector's retry backoff in flight, so a slow model cannot hold the process."""
        closer = getattr(self._reflector, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing must not raise into close()
                log.exception("hindsight: closing the reflector failed")


def dead_letter_base(store: Store, *, readonly: bool) -> str:
    """Where a store's dead letter lives, without its suffix: next to a SQLite file; for a
    database server, in this user's state folder (named after the URL, password stripped)."""
    path = getattr(store, "path", None)
    if path is not None:
        return str(path)  # absolute (``SQLiteStore.path``): wherever the agent goes next
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", getattr(store, "url", "hindsight"))
    if not readonly:
        with contextlib.suppress(OSError):  # unwritable: the recorder's fallback applies
            state_dir().mkdir(parents=True, exist_ok=True)
    return str(state_dir() / slug.strip("_"))


def writer_kind(writer: str | None) -> Writer:
    """The writer asked for, else ``$HINDSIGHT_WRITER``, else ``process`` where this process
    can start a writer process (``can_start_writer``), else ``thread``.

    Raises:
        ValueError: neither ``thread`` nor ``process``.
    """
    writer = writer or os.environ.get("HINDSIGHT_WRITER")
    if not writer:
        return "process" if can_start_writer() else "thread"
    if writer not in ("thread", "process"):
        raise ValueError(f"writer must be 'thread' or 'process', not {writer!r}")
    return cast(Writer, writer)


def can_start_writer() -> bool:
    """Whether ``python -m hindsight_loop.writer`` can be started the way ``ProcessRecorder``
    does: a POSIX system (the writer's pipe) and ``sys.executable`` a Python interpreter. An
    embedding program (uwsgi, a frozen app) names itself there, and would start another copy
    of itself: those record with the writer thread."""
    exe = Path(sys.executable or "").name.lower()
    return (
        os.name == "posix"
        and not getattr(sys, "frozen", False)
        and exe.startswith(("python", "pypy"))
    )


def writer_db(store: Store, db: str | Path) -> str:
    """The store as the writer process opens it: a SQLite file by the absolute path the store
    keeps (``SQLiteStore.path``). The writer starts on the first event, in the agent's working
    directory of that moment: a relative path opened another file (a new, empty store) once the
    agent had changed it."""
    path = getattr(store, "path", None)
    return str(db) if path is None else str(path)


def make_recorder(
    store: Store,
    db: str | Path,
    *,
    writer: Writer,
    triggers: Triggers,
    worker: Worker,
    dead_letter: str | Path | None,
    readonly: bool,
    **options: Any,
) -> Recorder:
    """The recorder of one ``Hindsight``: a writer thread in this process, or (``writer=
    "process"``) a writer process that the library starts on the first event, with the thread
    recorder as its in-process fallback. ``options`` go to ``Recorder`` (max_text, queue_bound,
    fallback_dir)."""
    from hindsight_loop.store.sqlite import writer_checkpoints

    process = writer == "process" and not readonly
    local = Recorder(
        store.write_event_batch,
        dead_letter=dead_letter or f"{dead_letter_base(store, readonly=readonly)}.deadletter.jsonl",
        on_batch=triggers.on_batch,
        start=not process,
        checkpoints=writer_checkpoints(store),
        **{k: v for k, v in options.items() if v is not None},
    )
    if not process:
        return local
    from hindsight_loop.writer import ProcessRecorder

    # The same face as Recorder: a cast rather than a Protocol every caller would have to name.
    return cast(
        Recorder,
        ProcessRecorder(
            writer_db(store, db),
            local=local,
            stored_keys=store.event_keys,
            ended_stored=triggers.ends_stored_before,
            owner=lambda: store.owner,
            review_min_events=triggers.review_min_events,
            live_triggers=triggers.live,
            on_review=worker.wake,
            requeue=triggers.requeue,
        ),
    )
