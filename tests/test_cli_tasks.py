"""The task commands: tasks, replay, reflect, reflections, import, worker."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from hindsight_loop import Hindsight
from hindsight_loop.cli import app

runner = CliRunner()


def _seed(db: Path) -> str:
    with Hindsight(db, background=False) as hs:
        with hs.task("csv_cleaning", goal="clean 销售.csv", tools=["read_csv"]) as task:
            try:
                with task.action("read_csv", {"encoding": "utf-8"}, step="parse"):
                    raise UnicodeDecodeError("utf-8", b"\xd6", 0, 1, "invalid continuation byte")
            except UnicodeDecodeError:
                pass
            with task.action("read_csv", {"encoding": "gbk"}, step="parse") as call:
                call.result("ok")
            task.fail("validation failed")
        hs.flush()
        return task.task_id


def _run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_tasks_lists_with_json(db_path: Path) -> None:
    task_id = _seed(db_path)
    assert task_id in _run("tasks", "--db", str(db_path))
    [task] = orjson.loads(_run("tasks", "--db", str(db_path), "--json"))
    assert task["task_id"] == task_id and task["status"] == "failed" and task["event_count"] == 4


def test_ids_are_never_cut_in_a_narrow_terminal(db_path: Path) -> None:
    # An id with an ellipsis in it cannot be copied into the next command ('hindsight replay').
    # Imported runs keep their own ids, often long ones.
    task_id = "tau-bench-airline-task-017-trial-03-gpt-4o"
    with Hindsight(db_path, background=False) as hs:
        hs.record(
            {"type": "task_start", "task_id": task_id, "task_type": "airline", "goal": "x" * 80}
        )
        hs.record({"type": "task_end", "task_id": task_id, "status": "failed"})
        hs.flush()
        review = hs.reflect(task_id, reflector=hs.offline_reflector)
    for args, ids, width in (
        (["tasks"], [task_id], "46"),
        (["reflections"], [review.reflection_id, task_id], "72"),
    ):
        shown = runner.invoke(app, [*args, "--db", str(db_path)], env={"COLUMNS": width})
        assert shown.exit_code == 0, shown.output
        for one in ids:
            assert one in shown.output, shown.output


def test_replay_shows_key_nodes(db_path: Path) -> None:
    task_id = _seed(db_path)
    out = _run("replay", task_id, "--db", str(db_path))
    assert "first_failure" in out and "key nodes" in out
    data = orjson.loads(_run("replay", task_id, "--db", str(db_path), "--json"))
    kinds = {n["kind"] for n in data["key_nodes"]}
    assert {"first_failure", "recovery"} <= kinds
    assert all(len(n["summary"]) <= 50 for n in data["key_nodes"])


def test_replay_unknown_task_says_how_to_list(db_path: Path) -> None:
    _seed(db_path)
    result = runner.invoke(app, ["replay", "tsk_nope", "--db", str(db_path)])
    assert result.exit_code == 1
    assert "hindsight tasks" in result.output


def test_reflect_offline_then_reflections(db_path: Path) -> None:
    task_id = _seed(db_path)
    data = orjson.loads(_run("reflect", task_id, "--offline", "--db", str(db_path), "--json"))
    assert data["status"] == "ok"
    assert data["lessons"] and "gbk" in data["lessons"][0]["advice"]
    listed = orjson.loads(_run("reflections", task_id, "--db", str(db_path), "--json"))
    assert [r["reflection_id"] for r in listed] == [data["reflection_id"]]


def test_env_var_chooses_the_store(db_path: Path) -> None:
    task_id = _seed(db_path)
    result = runner.invoke(app, ["tasks", "--json"], env={"HINDSIGHT_DB": str(db_path)})
    assert result.exit_code == 0
    assert orjson.loads(result.output)[0]["task_id"] == task_id


def test_import_and_worker(db_path: Path, tmp_path: Path) -> None:
    events = [
        {
            "type": "task_start",
            "task_id": "tsk_i",
            "task_type": "weather",
            "tools": ["get_weather"],
            "timestamp": "2024-11-20T14:32:00Z",
        },
        {
            "type": "action_executed",
            "task_id": "tsk_i",
            "timestamp": "2024-11-20T14:32:01Z",
            "input": {"tool": "get_weather", "args": {"city": ""}},
            "result": {"status": "failed", "error_type": "MissingArgument"},
        },
        {
            "type": "task_end",
            "task_id": "tsk_i",
            "timestamp": "2024-11-20T14:32:02Z",
            "result": {"status": "failed"},
        },
    ]
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    data = orjson.loads(_run("import", str(path), "--db", str(db_path), "--json"))
    assert data["accepted"] == 3 and data["problems"] == [] and data["reviews_queued"] >= 1
    assert "ran" in _run("worker", "--once", "--db", str(db_path))
    with Hindsight(db_path, background=False) as hs:
        assert hs.store.pending_jobs() == 0
        assert hs.store.reflections("tsk_i")


def test_every_command_has_help() -> None:
    out = _run("--help")
    for command in ("tasks", "replay", "reflect", "reflections", "import", "worker"):
        assert command in out
        assert _run(command, "--help").strip()


def test_bad_store_paths_get_an_error_not_a_traceback(tmp_path: Path) -> None:
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello, not a database\n" * 100)
    for db in (str(not_db), "postgresql://x/y", str(tmp_path / "missing" / "x.db")):
        result = runner.invoke(app, ["tasks", "--db", db])
        assert result.exit_code == 1, result.output
        assert "Error:" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "missing").exists()
