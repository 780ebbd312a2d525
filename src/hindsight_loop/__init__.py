"""Hindsight: experience memory for AI agents.

Record every step of a run, replay it into a chronicle of key nodes, reflect on it into short
lessons, curate them, and recall the right few for the next similar task.

    from hindsight_loop import Hindsight
    hs = Hindsight("hindsight.db")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hindsight_loop import logs

if TYPE_CHECKING:
    from hindsight_loop.hindsight import ActionCall, Hindsight, TaskRun, current_task
    from hindsight_loop.models import (
        Chronicle,
        Event,
        Features,
        KeyNode,
        Lesson,
        LessonDraft,
        Reflection,
        Step,
        Structured,
        Task,
    )
    from hindsight_loop.record import HindsightWarning

__version__ = "0.1.0"

logs.install()  # Hindsight's log lines are redacted like what it records

#: Where each public name lives. They are imported on first use: the writer process (``python
#: -m hindsight_loop.writer``) imports this package first, and needs only the recorder and the
#: store, not the facade's worker, curation and numpy (~60% of its start-up).
_PUBLIC = {
    "ActionCall": "hindsight_loop.hindsight",
    "Hindsight": "hindsight_loop.hindsight",
    "TaskRun": "hindsight_loop.hindsight",
    "current_task": "hindsight_loop.hindsight",
    "Chronicle": "hindsight_loop.models",
    "Event": "hindsight_loop.models",
    "Features": "hindsight_loop.models",
    "KeyNode": "hindsight_loop.models",
    "Lesson": "hindsight_loop.models",
    "LessonDraft": "hindsight_loop.models",
    "Reflection": "hindsight_loop.models",
    "Step": "hindsight_loop.models",
    "Structured": "hindsight_loop.models",
    "Task": "hindsight_loop.models",
    "HindsightWarning": "hindsight_loop.record",
}

__all__ = [
    "ActionCall",
    "Chronicle",
    "Event",
    "Features",
    "Hindsight",
    "HindsightWarning",
    "KeyNode",
    "Lesson",
    "LessonDraft",
    "Reflection",
    "Step",
    "Structured",
    "Task",
    "TaskRun",
    "current_task",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hindsight_loop' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
