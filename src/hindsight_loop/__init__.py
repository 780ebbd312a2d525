"""Hindsight: experience memory for AI agents.

Record every step of a run, replay it into a chronicle of key nodes, reflect on it into short
lessons, curate them, and recall the right few for the next similar task.

    from hindsight_loop import Hindsight
    hs = Hindsight("hindsight.db")
"""

from hindsight_loop import logs
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
