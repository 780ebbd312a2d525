"""The two-round demo: a cold night, Hindsight reflects, a warm night with lessons.

Round 1 cleans one night's files with no lessons while Hindsight records every file as a task.
Its reviews then run (offline by default), turning what went wrong into lessons. Round 2 cleans
another night's files (another seed: new files, the same kinds of trouble) with the lessons
Hindsight recalls for each one. Each round is scored against the ground truth, so the difference
is measured, not claimed.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hindsight_loop.demo.agent import BUDGET, ENCODINGS, TOOLS, CsvAgent, FileOutcome
from hindsight_loop.demo.data import SOURCES, CsvFile, generate_batch
from hindsight_loop.models import Lesson

__all__ = ["DemoReport", "RoundResult", "run_demo", "TASK_TYPE", "COLD_STRATEGY"]

TASK_TYPE = "csv_cleaning"
COLD_STRATEGY = (
    f"{' → '.join(ENCODINGS)}, ',' then ';' when the header lands in one field, "
    f"fix_rows on ragged rows; {BUDGET} tool calls per file"
)

#: Called after each file: (round name, files done, files in the round, outcome).
Progress = Callable[[str, int, int, FileOutcome], None]


@dataclass(kw_only=True, slots=True)
class RoundResult:
    """One night's run, scored against the ground truth."""

    name: str
    """``cold`` or ``warm``."""
    tasks: int
    succeeded: int
    """Files whose cleaned table equals the ground truth."""
    tool_calls: int
    files: list[FileOutcome] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.succeeded / self.tasks if self.tasks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tasks": self.tasks,
            "succeeded": self.succeeded,
            "tool_calls": self.tool_calls,
        }


@dataclass(kw_only=True, slots=True)
class DemoReport:
    """Both rounds and the lessons the book holds afterwards."""

    rounds: list[RoundResult]
    lessons: list[Lesson]
    db: str
    seed: int
    seconds: float
    reflector: str

    def to_dict(self) -> dict[str, Any]:
        """The ``hindsight demo --json`` shape."""
        return {
            "rounds": [r.to_dict() for r in self.rounds],
            "lessons": [lesson.to_dict() for lesson in self.lessons],
        }


def _goal(file: CsvFile) -> str:
    source = next(s for s in SOURCES if s.name == file.source)
    if source.language == "zh":
        return f"清洗来源 '{file.source}' 的夜间导出文件 {file.name},整理成 {len(file.columns)} 列的订单表"
    return (
        f"Clean tonight's export {file.name} from source '{file.source}' into the "
        f"{len(file.columns)}-column table"
    )


def _run_round(
    hs: Any,
    name: str,
    batch: list[CsvFile],
    *,
    warm: bool,
    budget: int,
    progress: Progress | None,
) -> RoundResult:
    agent = CsvAgent(budget=budget, use_lessons=warm)
    result = RoundResult(name=name, tasks=len(batch), succeeded=0, tool_calls=0)
    for i, file in enumerate(batch, 1):
        with hs.task(TASK_TYPE, goal=_goal(file), tools=TOOLS, recall=warm) as task:
            outcome = agent.clean(task, file)
            if not outcome.delivered:
                task.fail(outcome.reason)
        result.task_ids.append(task.task_id)
        result.files.append(outcome)
        result.tool_calls += outcome.tool_calls
        outcome.correct = outcome.table is not None and (
            outcome.table.columns,
            outcome.table.rows,
        ) == (file.columns, file.rows)
        result.succeeded += outcome.correct
        if progress is not None:
            progress(name, i, len(batch), outcome)
    return result


def run_demo(
    db: str | Path,
    *,
    seed: int = 7,
    files: int = 24,
    budget: int = BUDGET,
    reflector: Any = None,
    workdir: str | Path | None = None,
    progress: Progress | None = None,
) -> DemoReport:
    """Run the cold round, let Hindsight reflect, run the warm round; return the scores.

    Args:
        db: The Hindsight store (a SQLite path); lessons and tasks stay there to explore.
        seed: Night 1 uses ``seed``, night 2 ``seed + 1``.
        files: Files per night.
        budget: Tool calls allowed per file.
        reflector: Any ``Reflector`` (an LLM one); default the offline reflector.
        workdir: Where to write the CSV files (default: a temporary directory, removed after).
        progress: Called after each file.
    """
    from hindsight_loop.hindsight import Hindsight
    from hindsight_loop.reflect import OfflineReflector

    reflector = reflector or OfflineReflector()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hindsight-demo-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        night1 = generate_batch(root / "night1", seed=seed, files=files, night="n1")
        night2 = generate_batch(root / "night2", seed=seed + 1, files=files, night="n2")
        # background=False: reviews run exactly when drain() is called, so round 2 sees the
        # lessons of round 1 and nothing else, and the demo gives the same numbers every run.
        # review_min_events=1: each file is a short task, and every one of them is reviewed.
        hs = Hindsight(str(db), reflector=reflector, background=False, review_min_events=1)
        try:
            cold = _run_round(hs, "cold", night1, warm=False, budget=budget, progress=progress)
            hs.drain()
            warm = _run_round(hs, "warm", night2, warm=True, budget=budget, progress=progress)
            hs.drain()
            lessons = [
                lesson
                for lesson in hs.lessons(task_type=TASK_TYPE)
                if lesson.status in ("active", "needs_review")
            ]
        finally:
            hs.close()
    lessons.sort(key=lambda x: (-x.support, x.created_at, x.lesson_id))
    return DemoReport(
        rounds=[cold, warm],
        lessons=lessons,
        db=str(db),
        seed=seed,
        seconds=time.perf_counter() - started,
        reflector=getattr(reflector, "name", type(reflector).__name__),
    )
