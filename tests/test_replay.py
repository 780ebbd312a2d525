"""Replay turns raw events into a chronicle; AnomalyWatch finds the live anomalies."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import orjson
import pytest

from hindsight_loop.llm.templates import render_chronicle
from hindsight_loop.models import Chronicle, Event, KeyNodeKind, Task, iso
from hindsight_loop.replay import (
    DETAIL_TEXT_MAX,
    DETECTORS,
    LIVE_KINDS,
    LOCAL_WINDOW_AFTER,
    LOCAL_WINDOW_BEFORE,
    LOOP_REPEATS,
    NODE_SUMMARY_MAX,
    STEP_SUMMARY_MAX,
    AnomalyWatch,
    local_window,
    looks_dissatisfied,
    replay,
    step_detail,
)

TASK = Task(
    task_id="tsk_csv", task_type="csv_cleaning", goal="清洗 sales_2024.csv", tools=["read_csv"]
)
T0 = datetime(2024, 11, 20, 14, 32, 10, 882000, tzinfo=UTC)


class Run:
    """Builds a run's events in wire form, one call per step, like an agent would record them."""

    def __init__(self, task_id: str = TASK.task_id) -> None:
        self.task_id = task_id
        self.events: list[Event] = []

    def add(self, type: str, **body: Any) -> Event:
        seq = len(self.events)
        wire = {
            "event_id": f"evt_{seq:05d}",
            "task_id": self.task_id,
            "seq": seq,
            "timestamp": iso(T0 + timedelta(milliseconds=250 * seq)),
            "type": type,
            **body,
        }
        event = Event.from_dict(orjson.loads(orjson.dumps(wire)))
        self.events.append(event)
        return event

    def start(self, goal: str = "clean the sales file") -> Event:
        return self.add("task_start", task_type="csv_cleaning", goal=goal, tools=["read_csv"])

    def end(self, status: str = "succeeded") -> Event:
        return self.add("task_end", result={"status": status})

    def call(
        self,
        tool: str,
        status: str = "succeeded",
        *,
        step: str | None = "file_parse",
        error_type: str | None = None,
        output: Any = None,
        **args: Any,
    ) -> Event:
        result: dict[str, Any] = {"status": status, "latency_ms": 12.5}
        if status == "failed":
            result["error_type"] = error_type or "ValueError"
            result["error_message"] = f"{tool} broke"
        if output is not None:
            result["output"] = output
        return self.add(
            "action_executed",
            agent_state={"current_step": step} if step else None,
            input={"tool": tool, "args": args},
            result=result,
        )

    def decide(self, chosen: str, alternatives: list[str], *, step: str = "file_parse") -> Event:
        return self.add(
            "llm_decision",
            agent_state={"current_step": step},
            decision={"chosen_action": chosen, "alternatives": alternatives, "confidence": 0.6},
        )

    def say(self, text: str) -> Event:
        return self.add("user_input", input={"text": text})

    def feedback(self, text: str, score: float | None = None) -> Event:
        body: dict[str, Any] = {"text": text}
        if score is not None:
            body["score"] = score
        return self.add("feedback", input=body)


def kinds(chronicle: Chronicle) -> list[str]:
    return [node.kind for node in chronicle.key_nodes]


def nodes_of(chronicle: Chronicle, kind: str) -> list[Any]:
    return [node for node in chronicle.key_nodes if node.kind == kind]


def assert_consistent(chronicle: Chronicle) -> None:
    """Every key node points at its own event and at real steps; every summary fits."""
    steps = chronicle.steps
    for node in chronicle.key_nodes:
        assert steps[node.index].event_id == node.event_id
        assert all(0 <= r < len(steps) for r in node.related)
        assert len(node.summary) <= NODE_SUMMARY_MAX
        assert "\n" not in node.summary
    for n, step in enumerate(steps):
        assert step.index == n
        assert len(step.summary) <= STEP_SUMMARY_MAX
        assert "\n" not in step.summary


# -- steps ------------------------------------------------------------------------------------


def test_a_csv_run_replays_into_steps_and_key_nodes() -> None:
    run = Run()
    run.start("清洗销售数据 sales_2024.csv")
    run.say("帮我把 /data/raw/sales_2024.csv 清洗一下")
    run.decide("read_csv", ["parse_with_csv"])
    run.call(
        "read_csv",
        "failed",
        error_type="UnicodeDecodeError",
        path="/data/raw/sales_2024.csv",
        encoding="utf-8",
    )
    run.call(
        "read_csv",
        "failed",
        error_type="UnicodeDecodeError",
        path="/data/raw/sales_2024.csv",
        encoding="latin-1",
    )
    run.call("read_csv", path="/data/raw/sales_2024.csv", encoding="gbk", output={"rows": 1200})
    run.call("drop_duplicates", step="clean", output={"rows": 1180})
    run.feedback("错了，不是我要的", score=-1)
    run.end()

    chronicle = replay(TASK, run.events)

    assert chronicle.task is TASK
    assert chronicle.event_count == 9
    assert not chronicle.compressed
    assert [s.index for s in chronicle.steps] == list(range(9))
    failed = chronicle.steps[3]
    assert failed.type == "action_executed"
    assert failed.action == "read_csv"
    assert failed.status == "failed"
    assert failed.step == "file_parse"
    assert failed.error_type == "UnicodeDecodeError"
    assert failed.input == {
        "tool": "read_csv",
        "args": {"path": "/data/raw/sales_2024.csv", "encoding": "utf-8"},
    }
    assert (
        failed.summary
        == "read_csv(path=…/raw/sales_2024.csv, encoding=utf-8) -> failed UnicodeDecodeError"
    )
    assert chronicle.steps[5].output == {"rows": 1200}
    assert chronicle.steps[2].action == "read_csv"  # a decision's action is its chosen action
    assert chronicle.steps[1].summary == "user: 帮我把 /data/raw/sales_2024.csv 清洗一下"
    assert chronicle.steps[8].summary == "end: succeeded"

    assert kinds(chronicle) == [
        "first_failure",
        "consecutive_failures",
        "recovery",
        "dissatisfaction",
    ]
    first, streak, recovery, unhappy = chronicle.key_nodes
    assert (first.index, first.action, first.error_type) == (3, "read_csv", "UnicodeDecodeError")
    assert first.summary == "read_csv failed: UnicodeDecodeError"
    assert (streak.index, streak.related) == (4, [3, 4])
    # The reflector learns "utf-8 failed, gbk worked" from the first failed call and the fix.
    assert (recovery.index, recovery.related) == (5, [3, 5])
    assert recovery.summary == "read_csv ok with encoding=gbk"
    assert recovery.error_type == "UnicodeDecodeError"
    assert (unhappy.index, unhappy.action, unhappy.related) == (7, "drop_duplicates", [6, 7])
    assert unhappy.summary == "feedback -1: 错了，不是我要的"
    assert_consistent(chronicle)


def test_events_arriving_out_of_order_are_ordered_by_timestamp_then_seq() -> None:
    run = Run()
    run.start()
    for n in range(6):
        run.call("read_csv", path=f"/data/{n}.csv")
    shuffled = list(run.events)
    random.Random(7).shuffle(shuffled)
    chronicle = replay(TASK, shuffled)
    assert [s.event_id for s in chronicle.steps] == [e.event_id for e in run.events]

    # Same millisecond from two processes: seq breaks the tie.
    same = "2024-11-20T14:32:10.882Z"
    a = Event(
        event_id="b", task_id="t", seq=2, timestamp=same, type="user_input", input={"text": "2"}
    )
    b = Event(
        event_id="a", task_id="t", seq=1, timestamp=same, type="user_input", input={"text": "1"}
    )
    assert [s.event_id for s in replay(TASK, [a, b]).steps] == ["a", "b"]


def test_timestamps_in_other_forms_are_compared_as_times() -> None:
    # As strings "…10Z" sorts after "…10.500Z" and "+08:00" is eight hours off; as times they
    # are 10.000, 10.500 and 11.000 UTC.
    events = [
        Event(
            event_id="c",
            task_id="t",
            seq=0,
            timestamp="2024-11-20T22:32:11+08:00",
            type="user_input",
        ),
        Event(
            event_id="a", task_id="t", seq=0, timestamp="2024-11-20T14:32:10Z", type="user_input"
        ),
        Event(
            event_id="b",
            task_id="t",
            seq=0,
            timestamp="2024-11-20T14:32:10.500Z",
            type="user_input",
        ),
        Event(event_id="bad", task_id="t", seq=0, timestamp="not a time", type="user_input"),
    ]
    assert [s.event_id for s in replay(TASK, events).steps] == ["bad", "a", "b", "c"]


def test_summaries_fit_their_limits_in_english_and_chinese() -> None:
    long_zh = "北京明天的天气怎么样？会不会下雨，需要带伞吗？" * 20
    long_en = "The quick brown fox jumps over the lazy dog.\nAgain and again! " * 20
    run = Run()
    run.start(long_zh)
    run.say(long_zh)
    run.say(long_en + " this is wrong")
    run.decide(
        "a_really_long_tool_name_" * 5, ["parse_with_csv_" * 10, "另一个非常长的备选动作" * 5]
    )
    run.call(
        "search_" * 20, "failed", error_type="明显过长的错误类型" * 10, query=long_zh, lang="zh"
    )
    run.call("search_" * 20, "failed", error_type="TimeoutError", query=long_en)
    run.call("搜索" * 50, query=long_zh, output=long_zh)
    run.feedback(long_zh + "错了", score=-2)
    run.add("state_change", agent_state={"current_step": long_zh, "context_count": 87})
    run.end("failed")

    chronicle = replay(TASK, run.events)

    assert_consistent(chronicle)
    assert len(chronicle.key_nodes) >= 4
    assert all(s.summary for s in chronicle.steps)
    unhappy = nodes_of(chronicle, "dissatisfaction")
    assert [n.index for n in unhappy] == [2, 7]
    assert unhappy[1].summary.startswith("feedback -2: 北京明天")
    assert len(unhappy[1].summary) == NODE_SUMMARY_MAX
    assert unhappy[1].summary.endswith("…")
    # The status survives however long the call is.
    assert "-> failed 明显过长的错误类型" in chronicle.steps[4].summary
    assert chronicle.steps[5].summary.endswith(") -> failed TimeoutError")
    assert chronicle.steps[6].summary.endswith(") -> succeeded")
    assert nodes_of(chronicle, "first_failure")[0].summary.startswith("search_search_")


def test_step_views_are_bounded_and_json_safe() -> None:
    run = Run()
    run.call(
        "load",
        path="/data/x.csv",
        blob="x" * 5000,
        rows=list(range(1000)),
        deep={"a": {"b": {"c": {"d": {"e": 1}}}}},
        output={"text": "长" * 5000, "items": [{"n": n} for n in range(500)]},
    )
    # An in-process caller may hand over anything, not only JSON.
    run.events[0].input["args"]["obj"] = object()
    run.events[0].result["output"][1] = b"raw"

    step = replay(TASK, run.events).steps[0]

    args = step.input["args"]
    assert args["path"] == "/data/x.csv"
    assert len(args["blob"]) <= 200
    assert len(args["rows"]) <= 11
    assert isinstance(args["obj"], str)
    assert args["deep"] == {"a": "{1 keys}"}  # nesting is cut, with a hint of what was there
    assert len(step.output["text"]) <= 200
    assert len(step.output["items"]) <= 11
    assert step.output["1"].startswith("b'raw")
    orjson.dumps(step.input)  # raises if anything is not JSON
    orjson.dumps(step.output)
    assert run.events[0].input["args"]["blob"] == "x" * 5000  # the event itself is untouched


def test_chronicle_round_trips_through_json() -> None:
    run = Run()
    run.start()
    run.call("read_csv", "failed", encoding="utf-8")
    run.call("read_csv", encoding="gbk", output={"rows": 3})
    run.say("不对，又错了")
    run.end()
    chronicle = replay(TASK, run.events)
    again = Chronicle.from_dict(orjson.loads(orjson.dumps(chronicle.to_dict())))
    assert again == chronicle


def test_empty_and_bad_input() -> None:
    empty = replay(TASK, [])
    assert (empty.steps, empty.key_nodes, empty.event_count, empty.compressed) == ([], [], 0, False)
    with pytest.raises(ValueError, match="max_steps"):
        replay(TASK, [], max_steps=0)

    # Odd shapes from other integrations must not break a replay.
    odd = [
        Event(
            event_id="1",
            task_id="t",
            seq=1,
            timestamp=iso(T0),
            type="action_executed",
            agent_state={"current_step": ["a", "list"]},
            input={"tool": 42},
            result={"status": {"code": 500}},
        ),
        Event(
            event_id="2",
            task_id="t",
            seq=2,
            timestamp=iso(T0),
            type="llm_decision",
            decision={"alternatives": "not a list"},
        ),
        Event(
            event_id="3",
            task_id="t",
            seq=3,
            timestamp=iso(T0),
            type="feedback",
            input={"text": None, "score": "very bad"},
        ),
        Event(
            event_id="4",
            task_id="t",
            seq=4,
            timestamp=iso(T0),
            type="action_executed",
            input={"path": "/x"},
            decision={"chosen_action": "parse_with_pandas"},
            result={"status": "failed"},
        ),
    ]
    chronicle = replay(TASK, odd)
    assert [s.event_id for s in chronicle.steps] == ["1", "2", "3", "4"]
    assert chronicle.steps[0].step == "['a', 'list']"
    assert chronicle.steps[3].action == "parse_with_pandas"
    assert chronicle.steps[3].summary == "parse_with_pandas(path=/x) -> failed"
    assert kinds(chronicle) == ["first_failure"]
    assert_consistent(chronicle)


# -- key nodes --------------------------------------------------------------------------------


def test_three_repeats_are_not_a_loop_four_are() -> None:
    run = Run()
    for _ in range(3):
        run.call("fetch", url="https://example.com/a")
    assert nodes_of(replay(TASK, run.events), "loop") == []

    run.call("fetch", url="https://example.com/a")
    loop = nodes_of(replay(TASK, run.events), "loop")
    assert len(loop) == 1
    assert (loop[0].index, loop[0].related, loop[0].action) == (3, [0, 1, 2, 3], "fetch")
    assert loop[0].summary == "fetch ×4 same args in a row"


def test_a_long_loop_is_one_node() -> None:
    run = Run()
    run.say("start")
    for _ in range(10):
        run.decide("fetch", [])  # the agent thinks between calls: still in a row
        run.call("fetch", "failed", url="https://example.com/a")
    chronicle = replay(TASK, run.events)
    loop = nodes_of(chronicle, "loop")
    assert len(loop) == 1
    assert loop[0].related == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert loop[0].index == 8
    assert loop[0].summary == "fetch ×10 same args in a row"
    # Ten failures in a row are one streak, not nine.
    assert len(nodes_of(chronicle, "consecutive_failures")) == 1


def test_loop_needs_the_same_args_in_any_key_order() -> None:
    run = Run()
    for n in range(6):
        run.call("fetch", url=f"https://example.com/{n}", timeout=5)
    assert nodes_of(replay(TASK, run.events), "loop") == []

    run = Run()
    for n in range(4):
        args = {"url": "u", "timeout": 5} if n % 2 else {"timeout": 5, "url": "u"}
        run.call("fetch", **args)
    assert len(nodes_of(replay(TASK, run.events), "loop")) == 1


def test_a_cycle_is_a_loop_but_rare_repeats_are_not() -> None:
    run = Run()
    for _ in range(4):
        run.call("list_dir", path="/data")
        run.call("read_csv", path="/data/a.csv")
    loops = nodes_of(replay(TASK, run.events), "loop")
    assert sorted(n.action for n in loops) == ["list_dir", "read_csv"]
    assert all(n.summary.endswith("in the run") for n in loops)

    run = Run()
    for n in range(4):
        run.call("list_dir", path="/data")
        for k in range(10):
            run.call("read_csv", path=f"/data/{n}_{k}.csv")
    assert nodes_of(replay(TASK, run.events), "loop") == []


def test_hesitation_when_the_agent_weighs_and_switches() -> None:
    run = Run()
    run.call("read_csv", path="/data/a.csv")
    run.decide("parse_with_csv", ["read_csv"])
    run.call("parse_with_csv", path="/data/a.csv")
    hesitation = nodes_of(replay(TASK, run.events), "hesitation")
    assert len(hesitation) == 1
    assert (hesitation[0].index, hesitation[0].related) == (2, [0, 2])
    assert hesitation[0].summary == "wavered read_csv ↔ parse_with_csv at file_parse"


def test_hesitation_when_the_agent_runs_an_alternative_it_did_not_choose() -> None:
    run = Run()
    run.call("read_csv", path="/data/a.csv")
    run.decide("parse_with_pandas", ["parse_with_csv"])
    run.call("parse_with_csv", path="/data/a.csv")
    hesitation = nodes_of(replay(TASK, run.events), "hesitation")
    assert [(n.index, n.related, n.action) for n in hesitation] == [(2, [0, 2], "parse_with_csv")]


def test_hesitation_on_a_flip_flop_is_one_node() -> None:
    run = Run()
    run.call("read_csv", path="/data/a.csv")
    run.call("parse_with_csv", "failed", path="/data/a.csv")
    run.call("read_csv", path="/data/a.csv")
    run.call("parse_with_csv", "failed", path="/data/a.csv")
    run.call("read_csv", path="/data/a.csv")
    hesitation = nodes_of(replay(TASK, run.events), "hesitation")
    assert len(hesitation) == 1
    assert (hesitation[0].index, hesitation[0].related) == (2, [0, 1, 2, 3, 4])


def test_no_hesitation_for_a_pipeline_or_across_steps() -> None:
    run = Run()
    for n in range(5):  # fetch, parse, fetch, parse … on new pages is work, not wavering
        run.call("fetch", step="scrape", url=f"https://example.com/{n}")
        run.call("parse_html", step="scrape", page=n)
    run.decide("read_csv", ["read_excel"], step="clean")  # a decision before each tool
    run.call("read_csv", step="clean", path="/in.csv")
    run.decide("drop_duplicates", ["drop_na"], step="clean")
    run.call("drop_duplicates", step="clean", path="/in.csv")
    run.decide("write_csv", ["write_json"], step="save")
    run.call("write_csv", step="save", path="/out.csv")
    run.call("read_csv", step="check", path="/out.csv")
    assert nodes_of(replay(TASK, run.events), "hesitation") == []


def test_recovery_needs_a_different_call_at_the_same_step() -> None:
    run = Run()
    run.call("read_csv", "failed", encoding="utf-8")
    run.call("read_csv", encoding="utf-8")  # a plain retry that worked teaches nothing
    run.call("query_db", "failed", step="load", sql="select *")
    run.call("read_csv", step="other", path="/x")  # another step's success fixes nothing
    run.call("read_json", step="load", path="/x.json")
    chronicle = replay(TASK, run.events)
    recovery = nodes_of(chronicle, "recovery")
    assert len(recovery) == 1
    assert (recovery[0].index, recovery[0].related) == (4, [2, 4])
    assert recovery[0].summary == "read_json ok after query_db failed"
    assert recovery[0].action == "read_json"


def test_recovery_points_at_the_call_that_differs() -> None:
    run = Run()
    run.call("read_csv", "failed", encoding="gbk")
    run.call("read_csv", "failed", encoding="utf-8")
    run.call("read_csv", encoding="gbk")  # gbk failed once (flaky), utf-8 never worked
    recovery = nodes_of(replay(TASK, run.events), "recovery")
    assert [n.related for n in recovery] == [[1, 2]]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"status": "anomalous", "output": [1]}, "fetch returned status anomalous"),
        ({"status": "succeeded", "flagged": True}, "fetch result flagged"),
        ({"status": "succeeded", "anomaly": "rows halved"}, "fetch flagged: rows halved"),
        (
            {"status": "succeeded", "output": "oops", "expected_type": "object"},
            "fetch gave string, expected object",
        ),
        (
            {"status": "succeeded", "output": True, "expected_type": "number"},
            "fetch gave boolean, expected number",
        ),
        (
            {"status": "succeeded", "output": None, "expected_type": ["array", "object"]},
            "fetch gave null, expected array|object",
        ),
    ],
)
def test_anomalies(result: dict[str, Any], expected: str) -> None:
    run = Run()
    run.add("action_executed", input={"tool": "fetch", "args": {}}, result=result)
    nodes = nodes_of(replay(TASK, run.events), "anomaly")
    assert [(n.index, n.summary, n.action) for n in nodes] == [(0, expected, "fetch")]


@pytest.mark.parametrize(
    "result",
    [
        {"status": "succeeded", "output": {"a": 1}, "expected_type": "dict"},
        {"status": "succeeded", "output": 3, "expected_type": "number"},
        {"status": "succeeded", "output": "x", "expected_type": "weird-type-name"},
        {"status": "failed", "output": "x", "expected_type": "object"},
        {"status": "succeeded", "flagged": False},
        {"status": "skipped"},
    ],
)
def test_no_anomaly(result: dict[str, Any]) -> None:
    run = Run()
    run.add("action_executed", input={"tool": "fetch", "args": {}}, result=result)
    assert nodes_of(replay(TASK, run.events), "anomaly") == []


def test_expected_type_may_come_with_the_input() -> None:
    run = Run()
    run.add(
        "action_executed",
        input={"tool": "get_rows", "args": {}, "expected_type": "list"},
        result={"status": "succeeded", "output": {"rows": 3}},
    )
    assert kinds(replay(TASK, run.events)) == ["anomaly"]


@pytest.mark.parametrize(
    "text",
    [
        "This is wrong.",
        "That's not what I asked for",
        "Not what I wanted at all",
        "again?",
        "It failed AGAIN!",
        "it still doesn’t work",
        "useless answer",
        "错了",
        "不对，重新来",
        "这不是我要的",
        "没用",
        "怎么又失败了",
        "又错了！",
        "还是不行",
    ],
)
def test_complaints_in_english_and_chinese(text: str) -> None:
    assert looks_dissatisfied(text)
    run = Run()
    run.say(text)
    assert kinds(replay(TASK, run.events)) == ["dissatisfaction"]


@pytest.mark.parametrize(
    "text",
    [
        "Nothing went wrong, thanks!",
        "please read the file again",
        "great, it works",
        "不错了，谢谢",
        "这个结果对不对？",
        "我没用过这个工具",
        "行不行都告诉我",
        "",
    ],
)
def test_no_complaint(text: str) -> None:
    assert not looks_dissatisfied(text)
    run = Run()
    run.say(text)
    assert kinds(replay(TASK, run.events)) == []


def test_a_long_complaint_is_summarised_around_the_complaint() -> None:
    run = Run()
    run.say(
        "我要的是按月汇总的销售额，去掉重复的订单，统一日期格式，再按地区排序，可是你给我的结果完全不对，请重做"
    )
    run.say("I asked for the monthly totals per region, sorted by revenue, and this is wrong")
    first, second = replay(TASK, run.events).key_nodes
    assert (
        first.summary
        == "user: …汇总的销售额，去掉重复的订单，统一日期格式，再按地区排序，可是你给我的结果完全不对，…"
    )
    assert second.summary == "user: …ion, sorted by revenue, and this is wrong"


def test_a_feedback_score_wins_over_its_words() -> None:
    run = Run()
    run.feedback("wrong tool at first, but fine now", score=1)
    run.feedback("", score=-1)
    run.feedback("不是我要的")  # no score: the words decide
    nodes = nodes_of(replay(TASK, run.events), "dissatisfaction")
    assert [(n.index, n.summary) for n in nodes] == [
        (1, "feedback score -1"),
        (2, "user: 不是我要的"),
    ]


def test_first_failure_is_reported_once() -> None:
    run = Run()
    run.call("read_csv")
    run.call("read_csv", "failed", error_type="FileNotFoundError", path="/nope")
    run.call("ls", path="/")
    run.call("read_csv", "failed", path="/still-nope")
    first = nodes_of(replay(TASK, run.events), "first_failure")
    assert [(n.index, n.error_type) for n in first] == [(1, "FileNotFoundError")]


# -- compression ------------------------------------------------------------------------------


def long_run(n_events: int, seed: int = 3) -> tuple[Run, set[str]]:
    """A long, mostly healthy run with incidents planted at known places."""
    rnd = random.Random(seed)
    run = Run()
    run.start()
    planted: set[str] = set()
    k = 0
    while len(run.events) < n_events - 1:
        k += 1
        step = f"file_{k}"
        if k % 97 == 0:
            planted.add(
                run.call("read_csv", "failed", step=step, path=f"/d/{k}", encoding="utf-8").event_id
            )
            planted.add(
                run.call(
                    "read_csv", "failed", step=step, path=f"/d/{k}", encoding="latin-1"
                ).event_id
            )
            planted.add(run.call("read_csv", step=step, path=f"/d/{k}", encoding="gbk").event_id)
        elif k % 151 == 0:
            planted.add(run.say(rnd.choice(["错了，不是我要的", "that's wrong, again?"])).event_id)
        elif k % 211 == 0:
            for _ in range(5):
                event = run.call("poll_job", step=step, job=k)
            planted.add(event.event_id)
        else:
            run.call("read_csv", step=step, path=f"/d/{k}", encoding="utf-8", output={"rows": k})
            run.call("clean", step=step, path=f"/d/{k}")
    run.end()
    return run, planted


def test_a_long_run_is_compressed_keeping_every_key_node() -> None:
    run, planted = long_run(2000)
    assert len(run.events) == 2000
    shuffled = list(run.events)
    random.Random(1).shuffle(shuffled)

    full = replay(TASK, run.events, max_steps=10_000)
    chronicle = replay(TASK, shuffled)  # default max_steps=500

    assert not full.compressed
    assert chronicle.compressed
    assert chronicle.event_count == 2000
    assert len(chronicle.steps) <= 500
    # The same key nodes, pointing at the same events, with indices into the shorter list.
    assert [(n.kind, n.event_id, n.summary) for n in chronicle.key_nodes] == [
        (n.kind, n.event_id, n.summary) for n in full.key_nodes
    ]
    assert {"first_failure", "consecutive_failures", "recovery", "dissatisfaction", "loop"} <= set(
        kinds(chronicle)
    )
    assert_consistent(chronicle)
    kept = [s.event_id for s in chronicle.steps]
    assert planted <= set(kept)
    position = {e.event_id: n for n, e in enumerate(run.events)}
    assert [position[e] for e in kept] == sorted(position[e] for e in kept)  # still in run order
    # One index space: reflectors look steps up by Step.index and by key node indices alike.
    assert [s.index for s in chronicle.steps] == list(range(len(chronicle.steps)))
    for node, whole in zip(chronicle.key_nodes, full.key_nodes, strict=True):
        assert [chronicle.steps[r].event_id for r in node.related] == [
            full.steps[r].event_id for r in whole.related
        ]
        # The steps next to a node are kept for context.
        assert chronicle.steps[node.index - 1].event_id == full.steps[whole.index - 1].event_id
        assert chronicle.steps[node.index + 1].event_id == full.steps[whole.index + 1].event_id
    # The first and last few steps are kept.
    assert kept[:5] == [e.event_id for e in run.events[:5]]
    assert kept[-5:] == [e.event_id for e in run.events[-5:]]
    assert chronicle.steps[-1].type == "task_end"


def _groups(chronicle: Chronicle) -> dict[tuple[Any, ...], list[Any]]:
    """Key nodes by what makes them alike: kind, tool, error, the failed tool of a recovery."""
    out: dict[tuple[Any, ...], list[Any]] = {}
    for node in chronicle.key_nodes:
        failed = (
            chronicle.steps[node.related[0]].action
            if node.kind == "recovery" and node.related
            else None
        )
        out.setdefault((node.kind, node.action, node.error_type, failed), []).append(node)
    return out


def test_a_run_of_many_like_key_nodes_lists_a_few_and_counts_the_rest() -> None:
    """Hundreds of the same recoveries overflow the step budget: a compressed chronicle lists,
    of each group of like nodes, as many of its first as fit and its last; the first counts
    those left out. Recoveries from different failed tools are not alike."""
    run = Run()
    run.start()
    for k in range(400):
        broken = ("fetch_prices", "fetch_stock")[k % 2]  # two failures, one remedy
        run.call(broken, "failed", step=f"f{k}", error_type="Timeout", symbol=f"s{k}")
        run.call("cache_lookup", step=f"f{k}", key=f"s{k}")
        run.call("clean", step=f"f{k}", path=f"/d/{k}")
        if k % 2 == 0:
            run.say("that's wrong, again?")
    run.end()
    full = replay(TASK, run.events, max_steps=10_000)
    chronicle = replay(TASK, run.events)  # default max_steps=500
    assert not any(node.repeats for node in full.key_nodes)
    assert len(nodes_of(full, "recovery")) == 400
    assert chronicle.compressed and len(chronicle.steps) <= 500
    assert_consistent(chronicle)
    whole = {k: [n.event_id for n in v] for k, v in _groups(full).items()}
    listed = _groups(chronicle)
    assert listed.keys() == whole.keys()
    recoveries = [k for k in listed if k[0] == "recovery"]
    assert {k[3] for k in recoveries} == {"fetch_prices", "fetch_stock"}  # not one group
    kept = {len(nodes) for key, nodes in listed.items() if len(whole[key]) > len(nodes)}
    [k] = kept  # the same number of each group that had to fold
    assert k >= 3
    for key, nodes in listed.items():
        ids = whole[key]
        if len(ids) <= k:
            assert [n.event_id for n in nodes] == ids and not any(n.repeats for n in nodes)
            continue
        # The first k - 1 and the last, in run order; the first says how many were left out.
        assert [n.event_id for n in nodes] == [*ids[: k - 1], ids[-1]]
        assert [n.repeats for n in nodes] == [len(ids) - k] + [0] * (k - 1)
    # As many as fit: one more of each would overflow the budget.
    assert len(chronicle.key_nodes) > 3 * len(listed)
    assert [n.kind for n in nodes_of(chronicle, "first_failure")] == ["first_failure"]
    # A reviewer is told what was left out.
    folded = next(n for n in chronicle.key_nodes if n.repeats)
    assert f"{folded.repeats} more like it later in the run" in render_chronicle(chronicle)
    # A run whose key nodes fit keeps every one (the 2,000-event run above).
    shorter, _ = long_run(2000)
    assert not any(n.repeats for n in replay(TASK, shorter.events).key_nodes)


def test_like_nodes_of_two_agents_fold_apart() -> None:
    """A team run where two agents fail alike: each agent's nodes are their own group."""
    run = Run()
    run.start()
    for k in range(300):
        agent = ("coder", "tester")[k % 2]
        for status in ("failed", "succeeded"):
            run.add(
                "action_executed",
                agent_state={"current_step": f"s{k}", "agent": agent},
                input={"tool": "run_tests", "args": {"attempt": status == "succeeded", "k": k}},
                result={"status": status, "error_type": "AssertionError"},
            )
    run.end()
    chronicle = replay(TASK, run.events)
    assert chronicle.compressed and len(chronicle.steps) <= 500
    assert_consistent(chronicle)
    by_agent: dict[str, int] = {}
    for node in nodes_of(chronicle, "recovery"):
        step = chronicle.steps[node.index]
        who = run.events[int(step.event_id.split("_")[1])].agent_state["agent"]
        by_agent[who] = by_agent.get(who, 0) + 1 + node.repeats
    assert by_agent == {"coder": 150, "tester": 150}


def test_a_huge_loop_compresses_to_a_few_steps() -> None:
    run = Run()
    run.start()
    for _ in range(3000):
        run.call("poll_job", job=1)
    run.end()
    chronicle = replay(TASK, run.events)
    (loop,) = nodes_of(chronicle, "loop")
    assert loop.summary == "poll_job ×3000 same args in a row"
    assert len(loop.related) <= 20
    assert len(chronicle.steps) <= 40
    # The last repetition is kept.
    assert chronicle.steps[loop.related[-1]].event_id == run.events[3000].event_id
    assert_consistent(chronicle)


def test_a_ten_thousand_event_run_replays() -> None:
    # Speed is measured by the benchmark, not asserted here; this checks the scale works.
    run, planted = long_run(10_000)
    chronicle = replay(TASK, run.events)
    assert chronicle.compressed
    assert chronicle.event_count == 10_000
    assert planted <= {s.event_id for s in chronicle.steps}
    assert_consistent(chronicle)


# -- the live watch ---------------------------------------------------------------------------


def watch_all(events: list[Event]) -> list[Any]:
    watch = AnomalyWatch()
    found = [node for event in events for node in watch.observe(event)]
    assert watch.count == len(events)
    return found


def test_watch_reports_each_anomaly_once_as_it_completes() -> None:
    run = Run()
    run.start()
    watch = AnomalyWatch()
    assert watch.observe(run.events[0]) == []
    assert watch.observe(run.call("read_csv", "failed", encoding="utf-8")) == []
    (streak,) = watch.observe(
        run.call("read_csv", "failed", error_type="UnicodeDecodeError", encoding="latin-1")
    )
    assert (streak.kind, streak.index, streak.related) == ("consecutive_failures", 2, [1, 2])
    assert streak.error_type == "UnicodeDecodeError"
    assert watch.observe(run.call("read_csv", "failed", encoding="gbk")) == []  # same streak
    assert watch.observe(run.call("read_csv", encoding="gb18030")) == []
    assert watch.observe(run.call("clean", "failed")) == []
    (again,) = watch.observe(run.call("clean", "failed"))  # a new streak
    assert again.related == [5, 6]

    (unhappy,) = watch.observe(run.say("又错了，怎么回事"))
    assert (unhappy.kind, unhappy.index, unhappy.action) == ("dissatisfaction", 7, "clean")

    found = [watch.observe(run.call("poll_job", job=1)) for _ in range(LOOP_REPEATS + 2)]
    assert [len(f) for f in found] == [0, 0, 0, 1, 0, 0]
    loop = found[3][0]
    assert (loop.kind, loop.index, loop.related) == ("loop", 11, [8, 9, 10, 11])
    for node in (streak, again, unhappy, loop):
        assert len(node.summary) <= NODE_SUMMARY_MAX
        assert node.event_id == run.events[node.index].event_id


def test_watch_three_repeats_are_not_a_loop() -> None:
    run = Run()
    for _ in range(3):
        run.call("poll_job", job=1)
        run.call("poll_job", job=2)
    for _ in range(3):
        run.call("poll_job", job=3)
    run.call("poll_job", job=4)
    assert watch_all(run.events) == []


def test_watch_agrees_with_replay_on_the_live_triggers() -> None:
    run, _ = long_run(3000, seed=11)
    live = {"consecutive_failures", "dissatisfaction", "loop"}
    full = replay(TASK, run.events, max_steps=10_000)
    expected = [n for n in full.key_nodes if n.kind in live]
    got = sorted(watch_all(run.events), key=lambda n: n.index)
    assert [(n.kind, n.index, n.event_id) for n in got] == [
        (n.kind, n.index, n.event_id) for n in expected
    ]
    assert {n.kind for n in got} == live
    for watched, replayed in zip(got, expected, strict=True):
        if watched.kind == "loop":
            # Live, the loop is reported at its fourth call; replay knows how long it ran.
            assert watched.related == replayed.related[:LOOP_REPEATS]
            assert watched.summary == "poll_job ×4 same args in a row"
        else:
            assert (watched.summary, watched.related) == (replayed.summary, replayed.related)


def test_watch_and_replay_run_the_same_detectors() -> None:
    # Cycles, a streak broken by a success, statuses in other cases, nameless calls, complaints:
    # the live watch reports exactly the live nodes a replay finds, at the same call.
    run = Run()
    run.start()
    for _ in range(4):
        run.call("list_dir", path="/data")
        run.call("read_csv", path="/data/a.csv")
    run.call("read_csv", "FAILED", path="/b")
    run.call("read_csv", " Failed ", path="/c")
    run.call("read_csv", "Succeeded", path="/d")
    run.add("action_executed", input={"path": "/x"}, result={"status": "failed"})
    run.call("write", "failed", path="/e")
    run.say("this is not what I asked for")
    for _ in range(5):
        run.call("poll", job=1)
        run.decide("poll", [])
    run.feedback("fine", score=-1)
    run.end()

    full = replay(TASK, run.events)
    expected = [(n.kind, n.index, n.event_id) for n in full.key_nodes if n.kind in LIVE_KINDS]
    got = [(n.kind, n.index, n.event_id) for n in watch_all(run.events)]
    assert got == expected
    assert {kind for kind, _, _ in got} == set(LIVE_KINDS)
    # A cycle is a loop live too, reported at its fourth call.
    loops = [n for n in watch_all(run.events) if n.kind == "loop"]
    assert [(n.action, n.summary) for n in loops[:2]] == [
        ("list_dir", "list_dir ×4 same args in the run"),
        ("read_csv", "read_csv ×4 same args in the run"),
    ]
    # "FAILED" and " Failed " are failures by the one rule, for replay and the watch alike.
    (streak, *_) = [n for n in full.key_nodes if n.kind == "consecutive_failures"]
    assert streak.related == [9, 10]
    assert nodes_of(full, "first_failure")[0].index == 9


def test_every_key_node_kind_has_one_detector() -> None:
    kinds_found = [factory().kind for factory in DETECTORS]
    assert sorted(kinds_found) == sorted(get_args(KeyNodeKind))
    assert set(LIVE_KINDS) <= set(kinds_found)


def test_local_window_is_the_node_and_a_few_steps_around_it() -> None:
    assert local_window([12, 10, 11]) == (10 - LOCAL_WINDOW_BEFORE, 12 + LOCAL_WINDOW_AFTER)
    assert local_window([1]) == (0, 1 + LOCAL_WINDOW_AFTER)
    assert local_window([5], last=6) == (5 - LOCAL_WINDOW_BEFORE, 6)
    with pytest.raises(ValueError):
        local_window([])


def test_steps_keep_what_was_said_and_the_error_in_full() -> None:
    request = "请把销售数据按月汇总，并且和财务报表核对一下总数。" * 12  # longer than a view's text
    error = "codec can't decode byte 0xed in position 1832: invalid continuation byte " * 5
    reply = "I will read the file first and then aggregate the sales by month. " * 4
    run = Run()
    run.say(request)
    run.add("llm_decision", decision={"chosen_action": "reply", "message": reply})
    run.add(
        "action_executed",
        input={"tool": "read_csv", "args": {"path": "/data/a.csv"}},
        result={"status": "failed", "error_type": "UnicodeDecodeError", "error_message": error},
    )
    run.call("read_csv", path="/data/a.csv", encoding="gbk", output={"rows": 3})
    chronicle = replay(TASK, run.events)
    said, answered, failed, worked = chronicle.steps

    assert said.input == {"text": request}
    assert step_detail(said) == request
    assert answered.summary.startswith("reply: I will read the file first")
    assert answered.output == reply.strip()
    assert step_detail(answered) == reply.strip()
    assert failed.output == {"error_message": error}
    assert step_detail(failed).endswith(f"error: UnicodeDecodeError: {error}")
    assert worked.output == {"rows": 3}  # a plain output is as it was
    assert step_detail(worked).splitlines() == [
        'args: {"path": "/data/a.csv", "encoding": "gbk"}',
        'output: {"rows": 3}',
    ]
    assert_consistent(chronicle)
    # Every view is bounded, however long the text.
    run.say("x" * 50_000)
    long = replay(TASK, run.events).steps[-1]
    assert len(long.input["text"]) == DETAIL_TEXT_MAX
    assert len(step_detail(long)) == DETAIL_TEXT_MAX
    assert Chronicle.from_dict(orjson.loads(orjson.dumps(chronicle.to_dict()))) == chronicle


def test_the_complaint_gate_finds_a_hint_exactly_where_one_is() -> None:
    """``_HINTED`` groups the hints by first character (a faster pattern): it must still find
    each hint, in any position, and nothing else."""
    from hindsight_loop.replay import _COMPLAINT_HINTS, _HINTED

    texts = [t for h in _COMPLAINT_HINTS for t in (h, f"说{h}", f"the report {h} now")]
    texts += ["the report is fine", "nothing to see", "对，就这样", "ne ver", "wron", "不"]
    for text in texts:
        assert (_HINTED.search(text) is not None) == any(h in text for h in _COMPLAINT_HINTS), text
