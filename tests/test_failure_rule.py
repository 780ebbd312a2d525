"""One rule for "did this fail?": the trigger, replay, the offline reflector and the store agree.

The same small run is recorded once per status word; each of the four readers is asked what it
made of the step, and all four must give the answer of ``models.is_failure``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.models import is_failure
from hindsight_loop.reflect import OfflineReflector

# (status of the step, its output): the last one succeeded but its output talks of failure.
CASES = [
    ("ok", "rows: 12"),
    ("succeeded", "rows: 12"),
    ("failed", None),
    ("error", None),
    ("errored", None),
    ("succeeded", {"status": "failed", "note": "the previous import failed"}),
]


def _run(hs: Hindsight, status: str, output: object) -> str:
    """A short run (too short for a review by size): one call with ``status`` at a step, then a
    different call that succeeds at the same step; the task ends with ``status`` too."""
    task_id = f"tsk_{status}_{type(output).__name__}"
    events = [
        {"type": "task_start", "task_type": "import_rows", "goal": "load the rows"},
        {
            "type": "action_executed",
            "agent_state": {"current_step": "load"},
            "input": {"tool": "load_rows", "args": {"path": "a.csv", "mode": "strict"}},
            "result": {
                "status": status,
                "output": output,
                **(
                    {"error_type": "ValueError", "error_message": "bad row 3"}
                    if output is None
                    else {}
                ),
            },
        },
        {
            "type": "action_executed",
            "agent_state": {"current_step": "load"},
            "input": {"tool": "load_rows", "args": {"path": "a.csv", "mode": "lenient"}},
            "result": {"status": "succeeded", "output": "rows: 12"},
        },
        {"type": "task_end", "result": {"status": status}},
    ]
    for seq, event in enumerate(events):
        assert hs.record({**event, "task_id": task_id, "seq": seq})
    hs.flush()
    return task_id


@pytest.mark.parametrize(("status", "output"), CASES)
def test_trigger_replay_reflector_and_store_agree(tmp_path: Path, status: str, output: object):
    expected = is_failure(status)
    with Hindsight(tmp_path / "h.db", background=False, triggers=True) as hs:
        task_id = _run(hs, status, output)

        # The store: the task's outcome.
        task = hs.get_task(task_id)
        assert task is not None
        assert (task.status == "failed") is expected

        # The trigger: a run this short is reviewed only because a call failed or it failed.
        queued = [j for j in hs.store.jobs() if j["task_id"] == task_id]
        assert any(j["kind"] == "full" for j in queued) is expected

        # Replay: the first failure is a key node.
        chronicle = hs.replay(task_id)
        kinds = {node.kind for node in chronicle.key_nodes}
        assert ("first_failure" in kinds) is expected
        assert ("recovery" in kinds) is expected

        # The offline reflector: a failure then another call that worked is a lesson.
        reflection = OfflineReflector().reflect(chronicle, kind="full")
        assert bool(reflection.lessons) is expected


def test_unknown_status_words_are_not_failures_but_do_not_succeed_a_task() -> None:
    assert not is_failure("partial") and not is_failure(None) and not is_failure(3)
    assert is_failure(" Error ") and is_failure("FAILED")
