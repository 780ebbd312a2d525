"""The whole loop through the facade: record, review, curate, recall, inject, feedback."""

from __future__ import annotations

from pathlib import Path

from hindsight_loop import Hindsight, LessonDraft, Reflection
from hindsight_loop.models import Chronicle, Features


def _failing_then_recovering_task(
    hs: Hindsight, *, source: str = "erp_cn", scope: str = "global"
) -> str:
    with hs.task(
        "csv_cleaning",
        goal=f"clean the nightly export from {source}",
        tools=["read_csv", "validate"],
        scope=scope,
    ) as task:
        try:
            with task.action(
                "read_csv",
                {"path": "a.csv", "encoding": "utf-8"},
                step="parse",
                context={"source": source},
            ):
                raise UnicodeDecodeError("utf-8", b"\xd6", 0, 1, "invalid continuation byte")
        except UnicodeDecodeError:
            pass
        with task.action(
            "read_csv",
            {"path": "a.csv", "encoding": "gbk"},
            step="parse",
            context={"source": source},
        ) as call:
            call.result({"rows": 12})
        for _ in range(8):
            task.state(current_step="clean")
    return task.task_id


def test_a_recovery_becomes_a_lesson_that_the_next_task_recalls(hs: Hindsight) -> None:
    first = _failing_then_recovering_task(hs)
    assert hs.drain()
    reflections = hs.store.reflections(first)
    assert [r.status for r in reflections] == ["ok"]
    lessons = hs.store.list_lessons(task_type="csv_cleaning")
    assert len(lessons) == 1
    lesson = lessons[0]
    assert "gbk" in lesson.advice
    assert lesson.source_task_ids == [first]
    assert lesson.structured is not None
    assert lesson.structured.prefer["args"]["encoding"] == "gbk"

    with hs.task(
        "csv_cleaning", goal="clean the nightly export from erp_cn", tools=["read_csv", "validate"]
    ) as task:
        assert [x.lesson_id for x in task.lessons] == [lesson.lesson_id]
        assert "gbk" in task.advice
        messages = hs.inject(
            [
                {"role": "system", "content": "You clean CSV files."},
                {"role": "user", "content": "clean a.csv"},
            ],
            task.lessons,
        )
        assert messages[-1] == {"role": "user", "content": "clean a.csv"}
        assert any("gbk" in str(m["content"]) for m in messages[:-1])
    assert hs.drain()
    stored = hs.store.get_task(task.task_id)
    assert stored.injected_lesson_ids == [lesson.lesson_id]
    after = hs.store.get_lesson(lesson.lesson_id)
    assert after.helpful == 1 and after.hit_count == 1


def test_the_same_lesson_twice_strengthens_one(hs: Hindsight) -> None:
    _failing_then_recovering_task(hs)
    _failing_then_recovering_task(hs)
    assert hs.drain()
    lessons = hs.store.list_lessons(task_type="csv_cleaning")
    assert len(lessons) == 1
    assert lessons[0].support == 2
    assert len(lessons[0].source_task_ids) == 2


def test_background_worker_reviews_off_the_agents_thread(db_path: Path) -> None:
    with Hindsight(db_path, background=True) as hs:
        _failing_then_recovering_task(hs)
        assert hs.drain(timeout=60)
        assert len(hs.store.list_lessons()) == 1


class _BrokenReflector:
    name = "broken"

    def reflect(self, chronicle: Chronicle, *, kind: str = "full", window=None) -> Reflection:
        raise RuntimeError("model fell over")


def test_a_failing_reflection_is_recorded_and_never_breaks_the_task(db_path: Path) -> None:
    with Hindsight(db_path, background=True, reflector=_BrokenReflector()) as hs:
        task_id = _failing_then_recovering_task(hs)
        assert hs.drain(timeout=60)
        assert hs.store.get_task(task_id).status == "succeeded"
        [reflection] = hs.store.reflections(task_id)
        assert reflection.status == "failed"
        assert "model fell over" in reflection.error
        assert hs.store.list_lessons() == []
        assert hs.store.event_count(task_id) == 12


def test_run_task_with_feedback(hs: Hindsight) -> None:
    _failing_then_recovering_task(hs)
    hs.drain()
    seen = {}

    def runner(task_input, emit):
        seen["messages"] = task_input["messages"]
        emit(
            {
                "type": "action_executed",
                "input": {"tool": "read_csv", "args": {"encoding": "gbk"}},
                "result": {"status": "succeeded"},
            }
        )
        return {"status": "succeeded", "rows": 3}

    out = hs.run_task_with_feedback(
        "csv_cleaning",
        runner,
        {"messages": [{"role": "user", "content": "clean the nightly export from erp_cn"}]},
        tools=["read_csv"],
    )
    assert out == {"status": "succeeded", "rows": 3}
    assert "gbk" in seen["messages"][0]["content"]
    [task] = [t for t in hs.store.list_tasks() if t.injected_lesson_ids]
    assert task.event_count == 3
    assert hs.store.get_lesson(task.injected_lesson_ids[0]).helpful == 1


def test_run_task_with_feedback_survives_a_broken_reflector(db_path: Path) -> None:
    with Hindsight(db_path, background=False, reflector=_BrokenReflector()) as hs:

        def runner(task_input, emit):
            emit(
                {"type": "action_executed", "input": {"tool": "x"}, "result": {"status": "failed"}}
            )
            return {"status": "failed", "error": "gave up"}

        assert hs.run_task_with_feedback("t", runner, "do it") == {
            "status": "failed",
            "error": "gave up",
        }
        [task] = hs.store.list_tasks()
        assert task.status == "failed"
        assert hs.store.reflections(task.task_id)[0].status == "failed"


def test_two_failures_in_a_row_queue_a_local_review(hs: Hindsight) -> None:
    with hs.task("api", tools=["fetch"]) as task:
        for _ in range(2):
            task.record_action(
                "fetch",
                {"url": "http://x"},
                status="failed",
                error_type="Timeout",
                error_message="timed out",
            )
        task.fail("gave up")
    hs.flush()
    jobs = hs.store.jobs()
    assert {(j["kind"], j["trigger"]) for j in jobs} >= {
        ("local", "consecutive_failures"),
        ("full", "task_end"),
    }


def test_lesson_injected_into_five_failed_tasks_drops_out(hs: Hindsight) -> None:
    lesson = hs.add_lesson(
        LessonDraft(
            task_type="weather",
            advice="You should ask for the city first.",
            features=Features(tools=["get_weather"]),
        )
    )
    for _ in range(5):
        with hs.task(
            "weather", goal="what is the weather in the city tomorrow", tools=["get_weather"]
        ) as task:
            task.fail("user unhappy")
        hs.drain()
    after = hs.store.get_lesson(lesson.lesson_id)
    assert after.harmful >= 3
    assert after.status == "needs_review"
    assert (
        hs.recall(
            task_type="weather",
            tools=["get_weather"],
            query="what is the weather in the city tomorrow",
        )
        == []
    )


def test_user_scoped_lessons_do_not_leak(hs: Hindsight) -> None:
    hs.add_lesson(
        LessonDraft(
            task_type="travel",
            advice="You should book aisle seats for Alice.",
            scope="user:alice",
            features=Features(tools=["book"]),
        )
    )
    assert hs.recall(task_type="travel", tools=["book"], query="book seats", scope="user:bob") == []
    found = hs.recall(task_type="travel", tools=["book"], query="book seats", scope="user:alice")
    assert len(found) == 1


def test_lessons_recalled_mid_run_are_credited_with_the_outcome(hs: Hindsight) -> None:
    _failing_then_recovering_task(hs)
    hs.drain()
    [lesson] = hs.store.list_lessons()
    with hs.task("csv_cleaning", goal="unrelated words", tools=["validate"], recall=False) as task:
        found = task.advice_for("read_csv", error_type="UnicodeDecodeError", query="erp_cn gbk")
        assert [x.lesson_id for x in found] == [lesson.lesson_id]
        assert [x.lesson_id for x in task.lessons] == [lesson.lesson_id]
    hs.drain()
    assert hs.store.get_task(task.task_id).injected_lesson_ids == [lesson.lesson_id]
    assert hs.store.get_lesson(lesson.lesson_id).helpful == 1


def test_invalid_scope_is_refused_before_the_task_runs(hs: Hindsight) -> None:
    import pytest

    with pytest.raises(ValueError, match="user:NAME"):
        hs.task("t", scope="alice")


def test_a_large_book_is_reindexed_in_the_background_and_never_serves_a_rejected_lesson(
    hs: Hindsight, monkeypatch
) -> None:
    import time

    import hindsight_loop.recall as recall_module
    from hindsight_loop.lessons import reject

    monkeypatch.setattr(recall_module, "SYNC_REBUILD_MAX", 0)
    first = hs.add_lesson(
        LessonDraft(
            task_type="weather",
            advice="You should ask for the city before calling get_weather.",
            features=Features(tools=["get_weather"]),
        )
    )
    query = dict(
        task_type="weather", tools=["get_weather"], query="ask the city before get_weather"
    )
    assert hs.recall(**query).ids == [first.lesson_id]
    hs.store.save_lesson(reject(hs.store.get_lesson(first.lesson_id), by="test"))
    # The index is behind the book now: the rejected lesson is filtered out all the same.
    assert hs.recall(**query) == []
    deadline = time.monotonic() + 10
    while hs.recall_cache.version != hs.store.book_version() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hs.recall_cache.version == hs.store.book_version()
    assert hs.recall(**query) == []


def test_run_task_with_feedback_reviews_a_runner_that_raised(hs: Hindsight) -> None:
    import pytest

    def runner(task_input, emit):
        emit({"type": "action_executed", "input": {"tool": "x"}, "result": {"status": "failed"}})
        raise RuntimeError("agent crashed")

    with pytest.raises(RuntimeError, match="agent crashed"):
        hs.run_task_with_feedback("t", runner, "do it")
    [task] = hs.store.list_tasks()
    assert task.status == "failed"
    assert hs.store.reflections(task.task_id)  # reviewed after task_end was recorded
    assert hs.store.pending_jobs() == 0


def test_a_tool_name_given_as_a_string_is_one_tool(hs: Hindsight) -> None:
    import pytest

    from hindsight_loop import HindsightWarning

    with (
        pytest.warns(HindsightWarning, match="one tool"),
        hs.task("t", tools="read_csv", recall=False) as task,
    ):
        pass
    hs.flush()
    assert hs.store.get_task(task.task_id).tools == ["read_csv"]
