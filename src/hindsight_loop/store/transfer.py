"""Copy one store into another (SQLite into PostgreSQL and back), through the ``Store`` protocol.

Idempotent: events already in the destination (by event id, per task) are skipped and tasks,
lessons and reflections are upserted, so copying twice leaves the same rows as copying once.
Queued jobs are not copied: they belong to the workers of the source store.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from hindsight_loop.models import WIRE_SCALARS
from hindsight_loop.replay import event_projection
from hindsight_loop.store import EventRow, Store

#: Events per write: large enough for COPY to pay, small enough to bound memory per batch.
BATCH = 5000


@dataclass(kw_only=True, slots=True)
class Copied:
    """What one copy wrote."""

    tasks: int = 0
    """Tasks upserted."""
    events: int = 0
    """Events written (those already in the destination are not counted)."""
    lessons: int = 0
    """Lessons upserted, with their embeddings."""
    reflections: int = 0
    """Reflections upserted."""


def copy_store(src: Store, dst: Store) -> Copied:
    """Copy every task, event, lesson and reflection of ``src`` into ``dst``."""
    out = Copied()
    # Oldest first throughout: rows tied on their timestamp keep the source's insertion order.
    tasks = list(reversed(src.list_tasks(limit=2**62)))
    rows: list[EventRow] = []
    for task in tasks:
        have = dst.event_ids(task.task_id)
        for event in src.events(task.task_id):
            if event.event_id in have:
                continue
            body = {k: v for k, v in event.to_dict().items() if k not in WIRE_SCALARS}
            rows.append(
                (
                    event.event_id,
                    event.task_id,
                    event.seq,
                    event.timestamp,
                    event.type,
                    orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
                    event_projection(event),  # from the decoded event, not its body again
                )
            )
            if len(rows) >= BATCH:
                dst.write_event_batch(rows)
                out.events += len(rows)
                rows = []
    if rows:
        dst.write_event_batch(rows)
        out.events += len(rows)
    # After the events: a task_start written above re-creates its task from the event alone;
    # the source's row (status, outcome, injected lessons) is what the copy must hold.
    for task in tasks:
        dst.upsert_task(task)
        out.tasks += 1
    # After the tasks' events too: a copied task_start counts a hit on the lessons it injected,
    # and the source's own count must win.
    embeddings = src.lesson_embeddings()
    with dst.transaction():
        for lesson in src.list_lessons():
            model, vector = embeddings.get(lesson.lesson_id, (None, None))
            dst.save_lesson(lesson, embedding=vector, embed_model=model)
            out.lessons += 1
    for reflection in reversed(src.reflections(limit=2**62)):
        dst.save_reflection(reflection)
        out.reflections += 1
    return out
