"""The offline reflector: recoveries and repeated failures into lessons with a structured form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hindsight_loop import Hindsight
from hindsight_loop.models import Chronicle, Event, KeyNode, Step, Task
from hindsight_loop.reflect import OfflineReflector, Reflector, needs_review
from hindsight_loop.replay import replay
from hindsight_loop.text import detect_language

GOAL_EN = "Clean tonight's export orders.csv from source 'legacy_pos'"
GOAL_ZH = "清洗来源 'erp_cn' 的夜间导出文件 订单.csv"


def _task(goal: str = GOAL_EN, status: str = "succeeded", **kw: Any) -> Task:
    return Task(task_id="tsk_1", task_type="csv_cleaning", goal=goal, status=status, **kw)  # type: ignore[arg-type]


def _action(
    index: int,
    tool: str,
    args: dict[str, Any],
    *,
    ok: bool,
    step: str | None = "parse",
    error: str | None = None,
    context: dict[str, Any] | None = None,
) -> Step:
    return Step(
        index=index,
        event_id=f"evt_{index}",
        type="action_executed",
        action=tool,
        status="succeeded" if ok else "failed",
        step=step,
        error_type=None if ok else (error or "UnicodeDecodeError"),
        input={"tool": tool, "args": args},
        context={"source": "legacy_pos"} if context is None else context,
    )


def _start() -> Step:
    return Step(index=0, event_id="evt_0", type="task_start", summary="start")


def _chronicle(
    steps: list[Step], *, task: Task | None = None, nodes: list[KeyNode] | None = None
) -> Chronicle:
    return Chronicle(
        task=task or _task(), steps=steps, key_nodes=nodes or [], event_count=len(steps)
    )


def _read(index: int, encoding: str, *, ok: bool, **kw: Any) -> Step:
    return _action(
        index,
        "read_csv",
        {"path": "/data/in/orders.csv", "encoding": encoding, "delimiter": ","},
        ok=ok,
        **kw,
    )


def test_recovery_becomes_a_lesson_to_start_with_what_worked() -> None:
    chronicle = _chronicle([_start(), _read(1, "utf-8", ok=False), _read(2, "gbk", ok=True)])

    reflection = OfflineReflector().reflect(chronicle)

    assert reflection.status == "ok" and reflection.reflector == "offline"
    [draft] = reflection.lessons
    assert draft.advice == (
        "When read_csv (step 'parse') fails with UnicodeDecodeError for source 'legacy_pos', "
        "you should call read_csv with encoding='gbk' first instead of encoding='utf-8'."
    )
    assert draft.structured is not None
    assert draft.structured.when == {
        "tool": "read_csv",
        "step": "parse",
        "error_type": "UnicodeDecodeError",
        "context": {"source": "legacy_pos"},
    }
    # Only the arguments that differ: the file path belongs to this run, not to the lesson.
    assert draft.structured.prefer == {"tool": "read_csv", "args": {"encoding": "gbk"}}
    assert draft.structured.avoid == {"tool": "read_csv", "args": {"encoding": "utf-8"}}
    assert 3 <= len(draft.suggestions) <= 5
    assert draft.root_cause and draft.general_rule
    assert draft.features.tools == ["read_csv"]
    assert draft.features.step == "parse" and draft.features.error_type == "UnicodeDecodeError"
    assert {"legacy_pos", "UnicodeDecodeError", "gbk"} <= set(draft.features.keywords)
    assert draft.kind == "full_review" and draft.language == "en"
    assert draft.task_type == "csv_cleaning" and draft.source_task_ids == ["tsk_1"]
    assert reflection.parsed and reflection.parsed["root_cause"] == draft.root_cause


def test_several_failures_before_the_recovery_are_all_avoided() -> None:
    steps = [
        _start(),
        _read(1, "utf-8", ok=False),
        _read(2, "utf-8-sig", ok=False),
        _read(3, "utf-16", ok=True),
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps)).lessons

    assert draft.structured is not None
    assert draft.structured.prefer == {"tool": "read_csv", "args": {"encoding": "utf-16"}}
    assert draft.structured.avoid == {
        "tool": "read_csv",
        "args": {"encoding": "utf-8"},
        "variants": [{"encoding": "utf-8"}, {"encoding": "utf-8-sig"}],
    }


def test_another_tool_that_worked_at_the_same_step_is_preferred() -> None:
    steps = [
        _start(),
        _read(1, "utf-8", ok=True),
        _action(
            2,
            "validate",
            {"path": "/data/in/orders.csv"},
            ok=False,
            step="validate",
            error="RaggedRowsError",
        ),
        _action(
            3,
            "fix_rows",
            {"path": "/data/in/orders.csv", "strategy": "pad"},
            ok=True,
            step="validate",
        ),
        _action(4, "validate", {"path": "/data/in/orders.csv"}, ok=True, step="validate"),
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps)).lessons

    assert draft.advice == (
        "When validate (step 'validate') fails with RaggedRowsError for source 'legacy_pos', "
        "you should call fix_rows with strategy='pad' first instead of validate."
    )
    assert draft.structured is not None
    assert draft.structured.prefer == {"tool": "fix_rows", "args": {"strategy": "pad"}}
    assert draft.structured.avoid == {"tool": "validate", "args": {}}
    assert draft.features.tools == ["validate", "fix_rows"]


def test_repeated_failures_without_recovery_become_an_avoid_lesson() -> None:
    steps = [_start()] + [
        _read(i, enc, ok=False) for i, enc in enumerate(["utf-8", "utf-16", "gbk"], 1)
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps, task=_task(status="failed"))).lessons

    assert draft.structured is not None and draft.structured.prefer is None
    assert draft.structured.avoid == {
        "tool": "read_csv",
        "args": {"encoding": "utf-8"},
        "variants": [{"encoding": "utf-8"}, {"encoding": "utf-16"}, {"encoding": "gbk"}],
    }
    assert draft.advice.startswith("When read_csv (step 'parse') fails with UnicodeDecodeError")
    assert (
        "avoid calling read_csv with encoding='utf-8', encoding='utf-16' or encoding='gbk'"
        in draft.advice
    )
    assert "/data/in" not in draft.advice


def test_the_same_call_failing_again_and_again_is_avoided_without_its_file() -> None:
    steps = [_start()] + [_read(i, "utf-8", ok=False) for i in (1, 2, 3)]

    [draft] = OfflineReflector().reflect(_chronicle(steps)).lessons

    assert draft.structured is not None
    assert draft.structured.avoid == {
        "tool": "read_csv",
        "args": {"delimiter": ",", "encoding": "utf-8"},
    }


def test_no_lesson_from_a_clean_run_a_single_failure_or_a_transient_one() -> None:
    reflector = OfflineReflector()
    clean = _chronicle([_start(), _read(1, "utf-8", ok=True)])
    single = _chronicle([_start(), _read(1, "utf-8", ok=False)])
    transient = _chronicle([_start(), _read(1, "utf-8", ok=False), _read(2, "utf-8", ok=True)])
    for chronicle in (clean, single, transient):
        reflection = reflector.reflect(chronicle)
        assert reflection.status == "ok" and reflection.lessons == []


def test_steps_without_labels_pair_only_calls_of_the_same_tool() -> None:
    steps = [
        _start(),
        _action(1, "search", {"q": "x"}, ok=False, step=None),
        _action(2, "send_mail", {"to": "a"}, ok=True, step=None),
        _action(3, "search", {"q": "x", "lang": "en"}, ok=True, step=None),
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps)).lessons

    assert draft.structured is not None
    assert draft.structured.prefer == {"tool": "search", "args": {"lang": "en"}}
    assert "step" not in draft.structured.when


def test_a_chinese_run_gets_chinese_advice() -> None:
    ctx = {"source": "erp_cn"}
    steps = [
        _start(),
        _read(1, "utf-8", ok=False, context=ctx),
        _read(2, "gbk", ok=True, context=ctx),
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps, task=_task(goal=GOAL_ZH))).lessons

    assert draft.language == "zh"
    assert draft.advice == (
        "在 source 'erp_cn' 的情况下，read_csv（步骤 'parse'）出现 UnicodeDecodeError 时，"
        "你应该先用 encoding='gbk' 调用 read_csv，而不是 encoding='utf-8'。"
    )
    assert all(detect_language(s) == "zh" for s in draft.suggestions)
    assert detect_language(draft.root_cause) == "zh"
    assert "记住" in draft.general_rule
    assert draft.structured is not None and draft.structured.when["context"] == ctx


def test_context_keeps_identifying_scalars_only() -> None:
    ctx = {
        "source": "crm",
        "region": 7,
        "goal": "a long free text goal",
        "file_path": "/data/in/x.csv",
        "batch": "/tmp/night1",
        "tags": ["a"],
    }
    steps = [
        _start(),
        _read(1, "utf-8", ok=False, context=ctx),
        _read(2, "utf-16", ok=True, context=ctx),
    ]

    [draft] = OfflineReflector().reflect(_chronicle(steps)).lessons

    assert draft.structured is not None
    assert draft.structured.when["context"] == {"region": 7, "source": "crm"}


def test_a_local_review_only_looks_at_its_window() -> None:
    steps = [
        _start(),
        _read(1, "utf-8", ok=False),
        _read(2, "utf-8-sig", ok=False),
        _read(3, "gbk", ok=True),
    ]
    chronicle = _chronicle(steps)
    reflector = OfflineReflector()

    local = reflector.reflect(chronicle, kind="local", window=(0, 2))
    [draft] = local.lessons
    assert local.kind == "local" and draft.kind == "local_review"
    assert (
        draft.structured is not None and draft.structured.prefer is None
    )  # the recovery is outside
    assert draft.structured.avoid == {
        "tool": "read_csv",
        "args": {"encoding": "utf-8"},
        "variants": [{"encoding": "utf-8"}, {"encoding": "utf-8-sig"}],
    }
    assert reflector.reflect(chronicle, kind="local", window=(3, 3)).lessons == []
    [full] = reflector.reflect(chronicle).lessons
    assert full.structured is not None and full.structured.prefer is not None


def test_a_recovery_node_from_replay_is_honoured() -> None:
    # The agent relabelled its step while retrying: step pairing cannot see the recovery, the
    # replay's recovery node can.
    steps = [
        _start(),
        _read(1, "utf-8", ok=False, step="parse"),
        _read(2, "gbk", ok=True, step="parse_retry"),
    ]
    node = KeyNode(kind="recovery", index=2, event_id="evt_2", summary="recovered", related=[1, 2])

    [draft] = OfflineReflector().reflect(_chronicle(steps, nodes=[node])).lessons

    assert draft.structured is not None
    assert draft.structured.prefer == {"tool": "read_csv", "args": {"encoding": "gbk"}}


def test_the_same_chronicle_always_gives_the_same_drafts() -> None:
    steps = [
        _start(),
        _read(1, "utf-8", ok=False),
        _read(2, "gbk", ok=True),
        _action(3, "validate", {"path": "p"}, ok=False, step="validate", error="RaggedRowsError"),
        _action(
            4,
            "validate",
            {"path": "p", "strict": False},
            ok=False,
            step="validate",
            error="RaggedRowsError",
        ),
    ]
    a = OfflineReflector().reflect(_chronicle(steps))
    b = OfflineReflector().reflect(_chronicle(steps))
    assert len(a.lessons) == 2
    assert a.lessons == b.lessons
    assert a.reflection_id != b.reflection_id


def test_bad_data_gives_a_reflection_not_an_exception() -> None:
    odd = [
        _start(),
        Step(
            index=1,
            event_id="e1",
            type="action_executed",
            action="read_csv",
            status="failed",
            input=None,
        ),
        Step(
            index=2,
            event_id="e2",
            type="action_executed",
            action="read_csv",
            status="failed",
            input={"tool": "read_csv", "args": "not a dict"},
            context={"source": None},
        ),
        Step(index=3, event_id="e3", type="action_executed", action="read_csv", status="weird"),
    ]
    reflection = OfflineReflector().reflect(_chronicle(odd))
    assert reflection.status == "ok"

    broken = Chronicle(task=_task(), steps=None, key_nodes=[], event_count=0)  # type: ignore[arg-type]
    failed = OfflineReflector().reflect(broken)
    assert failed.status == "failed" and failed.error and failed.lessons == []


def test_offline_reflector_is_a_reflector() -> None:
    reflector = OfflineReflector()
    assert isinstance(reflector, Reflector)
    assert reflector.name == "offline"


def test_needs_review_when_failed_or_long_enough() -> None:
    assert needs_review(_task(status="failed"), 2)
    assert not needs_review(_task(), 9)
    assert needs_review(_task(), 10)
    assert needs_review(_task(), 3, min_events=3)
    assert not needs_review(_task(), 2, min_events=3)


def _events(task_id: str) -> list[Event]:
    def ev(seq: int, etype: str, **body: Any) -> Event:
        return Event.from_dict(
            {
                "task_id": task_id,
                "seq": seq,
                "type": etype,
                "timestamp": f"2024-11-20T00:00:0{seq}Z",
                **body,
            }
        )

    def read(seq: int, enc: str, ok: bool) -> Event:
        result = (
            {"status": "succeeded"}
            if ok
            else {"status": "failed", "error_type": "UnicodeDecodeError"}
        )
        return ev(
            seq,
            "action_executed",
            input={"tool": "read_csv", "args": {"path": "/in/a.csv", "encoding": enc}},
            result=result,
            agent_state={"current_step": "parse"},
            context={"source": "crm"},
        )

    start = ev(
        0,
        "task_start",
        task_type="csv_cleaning",
        goal="Clean a.csv from source 'crm'",
        tools=["read_csv"],
    )
    end = ev(4, "task_end", result={"status": "succeeded"})
    return [
        start,
        read(1, "utf-8", False),
        read(2, "utf-8-sig", False),
        read(3, "utf-16", True),
        end,
    ]


def test_a_replayed_run_gives_the_same_lesson_as_a_hand_built_chronicle() -> None:
    task = Task(
        task_id="tsk_r",
        task_type="csv_cleaning",
        goal="Clean a.csv from source 'crm'",
        status="succeeded",
    )
    chronicle = replay(task, _events("tsk_r"))

    [draft] = OfflineReflector().reflect(chronicle).lessons

    assert draft.structured is not None
    assert draft.structured.when["context"] == {"source": "crm"}
    assert draft.structured.prefer == {"tool": "read_csv", "args": {"encoding": "utf-16"}}


def test_the_facade_stores_the_offline_lessons(tmp_path: Path) -> None:
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        with hs.task(
            "csv_cleaning", goal="Clean a.csv from source 'crm'", tools=["read_csv"]
        ) as task:
            for enc in ("utf-8", "utf-16"):
                try:
                    with task.action(
                        "read_csv",
                        {"path": "/in/a.csv", "encoding": enc},
                        step="parse",
                        context={"source": "crm"},
                    ):
                        if enc == "utf-8":
                            b"\xff\xfe".decode(enc)
                except UnicodeDecodeError:
                    pass
        reflection = hs.reflect(task.task_id, reflector=OfflineReflector())
        assert reflection.status == "ok" and len(reflection.lesson_ids) == 1
        lesson = hs.store.get_lesson(reflection.lesson_ids[0])
        assert lesson is not None and lesson.structured is not None
        assert lesson.structured.prefer == {"tool": "read_csv", "args": {"encoding": "utf-16"}}
        assert lesson.kind == "full_review" and lesson.source_task_ids == [task.task_id]


# -- batch review: patterns across runs ------------------------------------------------------------


def _run(
    n: int,
    *,
    goal: str,
    user: str,
    calls: list[tuple[str, dict[str, Any], str | None]],
    status: str = "succeeded",
) -> Chronicle:
    """A run of ``calls`` ``(tool, args, error message or None)`` after one user message."""
    steps = [
        Step(index=0, event_id=f"e{n}_0", type="user_input", input={"text": user}, summary="user")
    ]
    for i, (tool, args, error) in enumerate(calls, start=1):
        steps.append(
            Step(
                index=i,
                event_id=f"e{n}_{i}",
                type="action_executed",
                action=tool,
                status="failed" if error else "succeeded",
                error_type="ToolError" if error else None,
                input={"tool": tool, "args": args},
                output=error,
            )
        )
    task = Task(task_id=f"tsk_{n}", task_type="shop_orders", goal=goal, status=status)  # type: ignore[arg-type]
    return Chronicle(task=task, steps=steps, key_nodes=[], event_count=len(steps))


def _pay_runs(zh: bool = False) -> list[Chronicle]:
    runs = []
    for n, (total, paid, voucher, card) in enumerate(
        [
            (120, 100, "voucher_55012", "card_88121"),
            (340, 300, "voucher_77310", "card_99002"),
            (75, 50, "voucher_12345", "card_31337"),
        ]
    ):
        msg = (
            f"错误：付款金额不符，总价 {total}，实付 {paid}"
            if zh
            else f"Error: amounts do not add up, total is {total}, but paid {paid}"
        )
        user = (
            "我想用代金券下单买两本书"
            if zh
            else f"I want to order two books with my voucher, ref {voucher}"
        )
        pay = [{"method": voucher, "amount": paid}]
        fixed = [{"method": voucher, "amount": paid}, {"method": card, "amount": total - paid}]
        runs.append(
            _run(
                n,
                goal=f"order task {n}",
                user=user,
                calls=[
                    ("find_item", {"query": "books"}, None),
                    ("place_order", {"items": 2, "payments": pay}, msg),
                    ("place_order", {"items": 2, "payments": fixed}, None),
                ],
            )
        )
    runs.append(
        _run(
            9,
            goal="look up",
            user="What is the status of my parcel?",
            calls=[("track_parcel", {"parcel": "PX1234"}, None)],
        )
    )
    return runs


def test_review_runs_groups_failures_by_tool_and_template_and_abstracts_values() -> None:
    from hindsight_loop.patterns import render_pattern, review_runs

    drafts = review_runs(_pay_runs())
    assert len(drafts) == 1
    d = drafts[0]
    assert d.structured is not None
    assert d.structured.when == {
        "tool": "place_order",
        "error_template": "Error: amounts do not add up, total is <num>, but paid <num>",
        "error_type": "ToolError",
    }
    assert d.structured.prefer is not None
    assert {"rule": "sum", "arg": "payments[].amount", "label": "total"} in (
        d.structured.prefer["changes"]
    )
    # Advice quotes the template, counts evidence, and says what the structured form says.
    assert '"Error: amounts do not add up, total is <num>, but paid <num>"' in d.advice
    assert "failed this way in 3 runs of 3 tasks; recovered in 3" in d.advice
    assert render_pattern(d.structured, "en") in d.advice
    assert "amount values that add up to the total" in d.advice
    # No value of any run, no repr: ids became kinds (or were left out), numbers are gone.
    for value in ("voucher_55012", "card_88121", "120", "100", "{'", "[{"):
        assert value not in d.advice
    assert d.features.tools == ["place_order"] and d.features.error_type == "ToolError"
    assert sorted(d.source_task_ids) == ["tsk_0", "tsk_1", "tsk_2"]
    assert d.language == "en"


def test_review_runs_needs_two_runs_and_keeps_one_run_values_out() -> None:
    from hindsight_loop.patterns import review_runs

    one = _pay_runs()[:1]
    assert review_runs(one) == []
    assert len(review_runs(one, min_runs=1)) == 1
    # A literal option used by one task only never enters advice.
    runs = [
        _run(
            n,
            goal=f"g{n}",
            user="upload my report",
            calls=[
                ("upload", {"mode": "fast"}, "Error: quota exceeded (used 98%)"),
                ("upload", {"mode": mode}, None),
            ],
        )
        for n, mode in enumerate(["chunked", "chunked", "resumable"])
    ]
    (d,) = review_runs(runs)
    assert "mode='chunked'" in d.advice and "resumable" not in d.advice


def test_review_runs_speaks_chinese_for_chinese_runs() -> None:
    from hindsight_loop.patterns import render_pattern, review_runs

    (d,) = review_runs(_pay_runs(zh=True))
    assert d.language == "zh" and detect_language(d.advice) == "zh"
    assert d.structured is not None
    assert d.structured.when["error_template"] == "错误:付款金额不符,总价 <num>,实付 <num>"
    assert render_pattern(d.structured, "zh") in d.advice
    assert "3 个任务的 3 次运行" in d.advice


def test_a_pattern_lesson_is_recalled_before_the_failing_call(tmp_path: Path) -> None:
    from hindsight_loop.patterns import review_runs

    hs = Hindsight(tmp_path / "hs.db", background=False)
    try:
        for d in review_runs(_pay_runs()):
            hs.add_lesson(d)
        found = hs.recall(
            task_type="shop_orders",
            tools=["place_order"],
            query="Hi, I'd like to order a lamp and pay with a voucher",
        )
        assert len(found) == 1 and found[0].features.tools == ["place_order"]
        quiet = hs.recall(
            task_type="shop_orders", tools=["track_parcel"], query="Where is my parcel?"
        )
        assert len(quiet) == 0
    finally:
        hs.close()


def test_a_later_batch_review_updates_the_pattern_lesson_instead_of_adding_one(
    tmp_path: Path,
) -> None:
    from hindsight_loop.patterns import review_runs

    runs = _pay_runs()
    hs = Hindsight(tmp_path / "hs.db", background=False)
    try:
        (first,) = [hs.add_lesson(d) for d in review_runs(runs[:2])]
        assert "in 2 runs of 2 tasks" in first.advice
        (again,) = [hs.add_lesson(d) for d in review_runs(runs)]
        assert again.lesson_id == first.lesson_id
        assert "in 3 runs of 3 tasks" in again.advice and "2 runs" not in again.advice
        assert again.structured is not None and "tsk_2" in again.source_task_ids
        assert len([x for x in hs.store.list_lessons() if x.status == "active"]) == 1
    finally:
        hs.close()
