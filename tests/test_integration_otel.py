"""The OpenTelemetry exporter: GenAI spans from the real SDK (made by hand, and emitted by an
instrumented pydantic-ai agent driven by its own FunctionModel) become one Hindsight task per
run, through the same mapping as ``hindsight import --format otlp``; the offline reflector
learns from the run, and the next run gets the lesson in its instructions."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from hindsight_loop import Hindsight

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import Status, StatusCode, Tracer  # noqa: E402

from hindsight_loop.integrations.otel import HindsightSpanExporter, spans_to_otlp  # noqa: E402


@pytest.fixture(autouse=True)
def _close_the_loop_run_sync_leaves() -> Any:
    """pydantic-ai's ``run_sync`` sets a new event loop on the thread and never closes it; left
    open, it is collected (with its sockets) during whichever test next replaces it."""
    yield
    import asyncio
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return  # none set: nothing left behind
    if not loop.is_running():
        loop.close()
    asyncio.set_event_loop(None)


OP = "gen_ai.operation.name"
ENCODING_ERROR = "codec can't decode byte 0xed in position 3"


def _provider(*exporters: Any) -> TracerProvider:
    provider = TracerProvider()
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _chat(tracer: Tracer, said: list[dict[str, Any]], answer: dict[str, Any]) -> None:
    attrs = {
        OP: "chat",
        "gen_ai.request.model": "fake-model",
        "gen_ai.input.messages": json.dumps(said),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [answer]}]),
    }
    with tracer.start_as_current_span("chat fake-model", attributes=attrs):
        pass


def _call(call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": tool, "arguments": args}


def _tool(
    tracer: Tracer,
    call_id: str,
    tool: str,
    args: dict[str, Any],
    result: str | None = None,
    error: tuple[str, str] | None = None,
) -> None:
    attrs = {
        OP: "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": json.dumps(args),
    }
    with tracer.start_as_current_span(f"execute_tool {tool}", attributes=attrs) as span:
        if error:
            span.set_attribute("error.type", error[0])
            span.set_status(Status(StatusCode.ERROR, error[1]))
        else:
            span.set_attribute("gen_ai.tool.call.result", result or "")


def hand_made_run(tracer: Tracer, path: str = "sales.csv") -> None:
    """An agent run as GenAI spans: read_csv fails on the encoding, succeeds with utf-8-sig."""
    user = [{"role": "user", "parts": [{"type": "text", "content": f"Summarize {path}"}]}]
    first = {"path": path, "encoding": "utf-8"}
    second = {"path": path, "encoding": "utf-8-sig"}
    agent = {OP: "invoke_agent", "gen_ai.agent.name": "csv_agent"}
    with tracer.start_as_current_span("invoke_agent csv_agent", attributes=agent):
        _chat(tracer, user, _call("c1", "read_csv", first))
        _tool(tracer, "c1", "read_csv", first, error=("EncodingError", ENCODING_ERROR))
        _chat(tracer, user, _call("c2", "read_csv", second))
        _tool(tracer, "c2", "read_csv", second, result="3 rows")
        _chat(tracer, user, _call("c3", "summarize", {"rows": 3}))
        _tool(tracer, "c3", "summarize", {"rows": 3}, result="total 42")
        _chat(tracer, user, {"type": "text", "content": "Sales total: 42"})


def actions(hs: Hindsight, task_id: str) -> list[tuple[Any, ...]]:
    """Each recorded tool call: (tool, args, status, error type)."""
    return [
        (
            e.input["tool"],
            e.input["args"],
            e.result["status"],
            e.result.get("error_type"),
        )
        for e in hs.store.events(task_id)
        if e.type == "action_executed" and e.input and e.result
    ]


def projection(hs: Hindsight, task_id: str) -> list[tuple[Any, ...]]:
    """What must agree between a live run and its import: types, tools, args, statuses."""
    return [
        (
            e.type,
            (e.input or {}).get("tool"),
            (e.input or {}).get("args"),
            (e.result or {}).get("status"),
            (e.result or {}).get("error_type"),
            (e.decision or {}).get("chosen_action"),
        )
        for e in hs.store.events(task_id)
    ]


def otlp_json(spans: tuple[ReadableSpan, ...]) -> dict[str, Any]:
    """The spans as an OTLP/JSON file holds them, written by OpenTelemetry's own encoder when it
    is installed (protobuf's JSON gives ids in base64: OTLP/JSON wants hex), else by ours."""
    try:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    except ImportError:
        return spans_to_otlp(spans)
    data = MessageToDict(encode_spans(spans))
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return json.loads(json.dumps(data))  # through text, as a file would be


def test_hand_made_genai_spans_become_one_task(hs: Hindsight) -> None:
    exporter = HindsightSpanExporter(hs, task_type="csv_report")
    hand_made_run(_provider(exporter).get_tracer("test"))
    hs.flush()

    [task] = hs.tasks()
    assert task.task_type == "csv_report"
    assert task.goal == "Summarize sales.csv"
    assert task.status == "succeeded"
    assert actions(hs, task.task_id) == [
        ("read_csv", {"path": "sales.csv", "encoding": "utf-8"}, "failed", "EncodingError"),
        ("read_csv", {"path": "sales.csv", "encoding": "utf-8-sig"}, "succeeded", None),
        ("summarize", {"rows": 3}, "succeeded", None),
    ]
    events = hs.store.events(task.task_id)
    failed = next(e for e in events if e.result and e.result.get("status") == "failed")
    assert failed.result["error_message"] == ENCODING_ERROR
    assert failed.result["duration_ms"] >= 0  # the span's latency
    decisions = [e.decision["chosen_action"] for e in events if e.type == "llm_decision"]
    assert decisions == ["read_csv", "read_csv", "summarize", "reply"]


def test_live_run_and_its_otlp_file_import_give_the_same_events(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    with Hindsight(tmp_path / "live.db", background=False) as live:
        exporter = HindsightSpanExporter(live, task_type="csv_report")
        hand_made_run(_provider(memory, exporter).get_tracer("test"))
        live.flush()
        [task] = live.tasks()
        live_events = live.store.events(task.task_id)
        live_view = projection(live, task.task_id)

    data = otlp_json(memory.get_finished_spans())
    with Hindsight(tmp_path / "file.db", background=False) as imported:
        report = imported.import_transcript(data, format="otlp", task_type="csv_report")
        assert report.runs == 1 and not report.problems
        [same] = imported.tasks()
        assert same.task_id == task.task_id
        assert projection(imported, same.task_id) == live_view
        # The same mapping of the same spans: the very same events, ids included.
        assert imported.store.events(same.task_id) == live_events


def test_spans_of_a_run_wait_for_the_outermost_span(hs: Hindsight) -> None:
    """A run inside the app's own span is recorded when that span ends, in one piece."""
    exporter = HindsightSpanExporter(hs)
    tracer = _provider(exporter).get_tracer("test")
    with tracer.start_as_current_span("POST /report"):
        hand_made_run(tracer)
        hs.flush()
        assert hs.tasks() == []
    hs.flush()
    [task] = hs.tasks()
    assert task.task_type == "csv_agent"  # the agent's name when no task type is given
    assert len(actions(hs, task.task_id)) == 3


def test_two_runs_in_one_trace_are_two_tasks(hs: Hindsight) -> None:
    tracer = _provider(HindsightSpanExporter(hs)).get_tracer("test")
    with tracer.start_as_current_span("batch job"):
        hand_made_run(tracer, "a.csv")
        hand_made_run(tracer, "b.csv")
    hs.flush()
    assert sorted(t.goal for t in hs.tasks()) == ["Summarize a.csv", "Summarize b.csv"]


def test_recall_inside_a_run_credits_the_lessons_to_its_task(hs: Hindsight) -> None:
    exporter = HindsightSpanExporter(hs, task_type="csv_report")
    tracer = _provider(exporter).get_tracer("test")
    hand_made_run(tracer)
    hs.flush()
    [first] = hs.tasks()
    assert hs.reflect(first.task_id).lesson_ids

    agent = {OP: "invoke_agent", "gen_ai.agent.name": "csv_agent"}
    with tracer.start_as_current_span("invoke_agent csv_agent", attributes=agent):
        lessons = exporter.recall(query="Summarize b.csv", tools=["read_csv", "summarize"])
        again = exporter.recall(query="Summarize b.csv", tools=["read_csv", "summarize"])
        assert lessons and again is lessons  # one recall per run, however often it is asked
        args = {"path": "b.csv", "encoding": "utf-8-sig"}
        _tool(tracer, "c1", "read_csv", args, result="3 rows")
    hs.flush()
    second = next(t for t in hs.tasks() if t.task_id != first.task_id)
    assert second.injected_lesson_ids == lessons.ids


def test_a_failed_agent_span_fails_the_task(hs: Hindsight) -> None:
    tracer = _provider(HindsightSpanExporter(hs, task_type="t")).get_tracer("test")
    agent = {OP: "invoke_agent", "gen_ai.agent.name": "a"}
    with (
        pytest.raises(RuntimeError),
        tracer.start_as_current_span("invoke_agent a", attributes=agent),
    ):
        _tool(tracer, "c1", "fetch", {"url": "x"}, error=("TimeoutError", "timed out"))
        raise RuntimeError("gave up")
    hs.flush()
    [task] = hs.tasks()
    assert task.status == "failed"


# -- pydantic-ai, instrumented, driven by its own FunctionModel -------------------------------

pai = pytest.importorskip("pydantic_ai")


def _pydantic_agent(
    exporter: HindsightSpanExporter, seen: list[str | None], provider: Any = None
) -> Any:
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    from hindsight_loop.integrations.pydantic_ai import hindsight_instructions, instrumentation

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Tries utf-8 first unless its instructions advise otherwise; retries as asked."""
        returns = [p for p in messages[-1].parts if getattr(p, "tool_name", None)]
        last = returns[-1] if returns else None
        path = "a.csv"
        if last is None:
            seen.append(info.instructions)
            encoding = "utf-8-sig" if "utf-8-sig" in (info.instructions or "") else "utf-8"
            return ModelResponse(
                parts=[ToolCallPart("read_csv", {"path": path, "encoding": encoding})]
            )
        if last.tool_name == "read_csv" and getattr(last, "outcome", "success") != "success":
            args = {"path": path, "encoding": "utf-8-sig"}
            return ModelResponse(parts=[ToolCallPart("read_csv", args)])
        if last.tool_name == "read_csv":
            return ModelResponse(parts=[ToolCallPart("summarize", {"rows": 3})])
        return ModelResponse(parts=[TextPart("Sales total: 42")])

    agent = Agent(
        FunctionModel(model),
        name="csv_agent",
        instructions=["You summarize CSV files.", hindsight_instructions(exporter)],
        capabilities=[
            Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))
            if provider is not None
            else instrumentation(exporter)
        ],
    )

    @agent.tool_plain
    def read_csv(path: str, encoding: str) -> str:
        """Read a CSV file."""
        if encoding != "utf-8-sig":
            raise ModelRetry(f"EncodingError: {ENCODING_ERROR}; the file starts with a BOM")
        return "3 rows"

    @agent.tool_plain
    def summarize(rows: int) -> str:
        """Summarize rows."""
        return "total 42"

    return agent


def test_pydantic_ai_run_is_recorded_reflected_and_the_next_run_gets_the_lesson(
    hs: Hindsight,
) -> None:
    exporter = HindsightSpanExporter(hs, task_type="csv_report")
    seen: list[str | None] = []
    agent = _pydantic_agent(exporter, seen)

    assert agent.run_sync("Summarize a.csv").output == "Sales total: 42"
    hs.flush()
    [first] = hs.tasks()
    assert first.status == "succeeded" and first.task_type == "csv_report"
    calls = actions(hs, first.task_id)
    assert [(tool, args.get("encoding"), status) for tool, args, status, _ in calls] == [
        ("read_csv", "utf-8", "failed"),
        ("read_csv", "utf-8-sig", "succeeded"),
        ("summarize", None, "succeeded"),
    ]
    failed = next(
        e for e in hs.store.events(first.task_id) if e.result and e.result["status"] == "failed"
    )
    assert "EncodingError" in failed.result["error_message"]
    assert failed.result["error_type"] == "EncodingError"  # not the retry wrapper's type

    reflection = hs.reflect(first.task_id)
    assert reflection.status == "ok" and reflection.lesson_ids
    lesson = hs.lesson(reflection.lesson_ids[0])
    assert lesson is not None and "read_csv" in lesson.features.tools

    assert agent.run_sync("Summarize a.csv").output == "Sales total: 42"
    hs.flush()
    second = next(t for t in hs.tasks() if t.task_id != first.task_id)
    assert seen[0] is not None and "Advice from earlier runs" not in seen[0]
    assert " ".join(lesson.advice.split()) in (seen[1] or "")  # injected into the instructions
    assert second.injected_lesson_ids == reflection.lesson_ids
    assert [s for _, _, s, _ in actions(hs, second.task_id)] == ["succeeded", "succeeded"]


def test_pydantic_ai_live_run_and_its_otlp_import_agree(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    with Hindsight(tmp_path / "live.db", background=False) as live:
        exporter = HindsightSpanExporter(live, task_type="csv_report")
        agent = _pydantic_agent(exporter, [], _provider(memory, exporter))
        agent.run_sync("Summarize a.csv")
        live.flush()
        tasks = {t.task_id: projection(live, t.task_id) for t in live.tasks()}

    with Hindsight(tmp_path / "file.db", background=False) as imported:
        imported.import_transcript(
            otlp_json(memory.get_finished_spans()), format="otlp", task_type="csv_report"
        )
        [same] = imported.tasks()
        assert same.task_id in tasks
        view = projection(imported, same.task_id)
        assert view == tasks[same.task_id]
        assert [v[1] for v in view if v[0] == "action_executed"] == [
            "read_csv",
            "read_csv",
            "summarize",
        ]
