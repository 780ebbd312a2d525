"""Transcript import: OpenAI, Anthropic and OTLP GenAI runs mapped to wire-format events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.ingest import FORMATS, Run, detect_format, read_runs, runs_from, tool_error
from hindsight_loop.models import Event, parse_ts

# -- transcripts -------------------------------------------------------------------------------

OPENAI_RUN: dict[str, Any] = {
    "task_id": "weather-42",
    "reward": 0.0,
    "info": {"user": "u1"},
    "messages": [
        {"role": "system", "content": "You are a travel assistant."},
        {
            "role": "user",
            "name": "alice",
            "content": [
                {"type": "text", "text": "Weather in Paris"},
                {"type": "text", "text": "and Lyon?"},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking both cities.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lyon"'},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "get_weather",
            "content": "Error: invalid JSON arguments",
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"temp_c": 18}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": '{"temp_c": 21}'},
        {
            "role": "assistant",
            "content": "Paris 18°C, Lyon 21°C.",
            "refusal": None,
            "annotations": ["x"],
        },
        {
            "role": "assistant",
            "content": "Anything else?",
            "tool_calls": [
                {
                    "id": "c4",
                    "type": "function",
                    "function": {"name": "book_hotel", "arguments": "{}"},
                }
            ],
        },
    ],
}

CHINESE_RUN: list[dict[str, Any]] = [
    {"role": "system", "content": "你是一个数据助手。"},
    {"role": "user", "content": "请把销售报表转换成 UTF-8"},
    {
        "role": "assistant",
        "content": "好的，我先读取文件。",
        "tool_calls": [
            {
                "id": "z1",
                "type": "function",
                "function": {"name": "读取文件", "arguments": '{"路径": "/数据/销售.csv"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "z1", "content": "错误：无法解码第 3 行（GBK 编码）"},
    {
        "role": "assistant",
        "content": "文件是 GBK 编码，我换一种方式。",
        "tool_calls": [
            {
                "id": "z2",
                "type": "function",
                "function": {
                    "name": "读取文件",
                    "arguments": '{"路径": "/数据/销售.csv", "编码": "gbk"}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "z2", "content": "共 120 行"},
    {"role": "assistant", "content": "已完成转换。"},
]

ANTHROPIC_RUN: dict[str, Any] = {
    "system": [{"type": "text", "text": "You manage files."}],
    "outcome": "succeeded",
    "messages": [
        {"role": "user", "content": "Delete the tmp folder"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "List first.", "signature": "s"},
                {"type": "text", "text": "I'll look first."},
                {"type": "tool_use", "id": "tu1", "name": "list_dir", "input": {"path": "/tmp"}},
                {
                    "type": "tool_use",
                    "id": "tu2",
                    "name": "rm",
                    "input": {"path": "/tmp", "recursive": True},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "tu1",
                    "content": [{"type": "text", "text": "a.txt\nb.txt"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "tu2",
                    "content": "permission denied",
                    "is_error": True,
                },
                {"type": "text", "text": "Use sudo then."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    ],
}


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, list):
        return {
            "key": key,
            "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}},
        }
    return {"key": key, "value": {"stringValue": value}}


def _span(
    span_id: str,
    parent: str,
    name: str,
    start_ms: int,
    end_ms: int,
    attrs: dict[str, Any],
    status: dict | None = None,
) -> dict[str, Any]:
    base = 1_732_113_130_000_000_000  # 2024-11-20T14:32:10Z in unix nanos
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(base + start_ms * 1_000_000),
        "endTimeUnixNano": str(base + end_ms * 1_000_000),
        "attributes": [_attr(k, v) for k, v in attrs.items()],
    }
    if status:
        span["status"] = status
    return span


def _msgs(*messages: dict[str, Any]) -> str:
    return json.dumps(list(messages), ensure_ascii=False)


OTLP_TRACE: dict[str, Any] = {
    "resourceSpans": [
        {
            "resource": {"attributes": [_attr("service.name", "support-bot")]},
            "scopeSpans": [
                {
                    "scope": {"name": "agent-sdk"},
                    "spans": [
                        _span(
                            "a0",
                            "",
                            "invoke_agent helpdesk",
                            0,
                            900,
                            {
                                "gen_ai.operation.name": "invoke_agent",
                                "gen_ai.agent.name": "helpdesk",
                            },
                        ),
                        _span(
                            "c1",
                            "a0",
                            "chat gpt-4o",
                            10,
                            200,
                            {
                                "gen_ai.operation.name": "chat",
                                "gen_ai.request.model": "gpt-4o",
                                "gen_ai.usage.input_tokens": 120,
                                "gen_ai.system_instructions": json.dumps(
                                    [{"type": "text", "content": "Be brief."}]
                                ),
                                "gen_ai.input.messages": _msgs(
                                    {
                                        "role": "user",
                                        "parts": [{"type": "text", "content": "Reset my password"}],
                                    }
                                ),
                                "gen_ai.output.messages": _msgs(
                                    {
                                        "role": "assistant",
                                        "parts": [
                                            {
                                                "type": "tool_call",
                                                "id": "call_1",
                                                "name": "lookup_user",
                                                "arguments": {"email": "a@b.c"},
                                            }
                                        ],
                                        "finish_reason": "tool_call",
                                    }
                                ),
                            },
                        ),
                        _span(
                            "t1",
                            "a0",
                            "execute_tool lookup_user",
                            210,
                            260,
                            {
                                "gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "lookup_user",
                                "gen_ai.tool.call.id": "call_1",
                                "gen_ai.tool.call.arguments": '{"email": "a@b.c"}',
                            },
                            status={
                                "code": 2,
                                "message": "TimeoutError: directory did not answer in 5 s",
                            },
                        ),
                        _span("h1", "t1", "GET /users", 211, 259, {"http.request.method": "GET"}),
                        _span(
                            "c2",
                            "a0",
                            "chat gpt-4o",
                            300,
                            500,
                            {
                                "gen_ai.operation.name": "chat",
                                "gen_ai.request.model": "gpt-4o",
                                "gen_ai.input.messages": _msgs(
                                    {
                                        "role": "user",
                                        "parts": [{"type": "text", "content": "Reset my password"}],
                                    },
                                    {
                                        "role": "assistant",
                                        "parts": [
                                            {
                                                "type": "tool_call",
                                                "id": "call_1",
                                                "name": "lookup_user",
                                            }
                                        ],
                                    },
                                    {
                                        "role": "tool",
                                        "parts": [
                                            {
                                                "type": "tool_call_response",
                                                "id": "call_1",
                                                "response": "timeout",
                                            }
                                        ],
                                    },
                                ),
                                "gen_ai.output.messages": _msgs(
                                    {
                                        "role": "assistant",
                                        "parts": [
                                            {
                                                "type": "tool_call",
                                                "id": "call_2",
                                                "name": "lookup_user",
                                                "arguments": '{"email": "a@b.c"}',
                                            }
                                        ],
                                        "finish_reason": "tool_call",
                                    }
                                ),
                            },
                        ),
                        _span(
                            "t2",
                            "a0",
                            "execute_tool lookup_user",
                            510,
                            540,
                            {
                                "gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "lookup_user",
                                "gen_ai.tool.call.id": "call_2",
                                "gen_ai.tool.call.result": '{"id": 7}',
                            },
                        ),
                        _span(
                            "c3",
                            "a0",
                            "chat gpt-4o",
                            600,
                            800,
                            {
                                "gen_ai.operation.name": "chat",
                                "gen_ai.input.messages": _msgs(
                                    {
                                        "role": "user",
                                        "parts": [{"type": "text", "content": "Reset my password"}],
                                    },
                                    {
                                        "role": "user",
                                        "parts": [{"type": "text", "content": "谢谢，快一点"}],
                                    },
                                ),
                                "gen_ai.output.messages": _msgs(
                                    {
                                        "role": "assistant",
                                        "parts": [
                                            {
                                                "type": "text",
                                                "content": "A reset link is on its way.",
                                            }
                                        ],
                                        "finish_reason": "stop",
                                    }
                                ),
                            },
                        ),
                    ],
                }
            ],
        }
    ]
}


def _types(run: Run) -> list[str]:
    return [e["type"] for e in run.events]


def _actions(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events if e["type"] == "action_executed"]


# -- OpenAI ------------------------------------------------------------------------------------


def test_openai_run_maps_every_message() -> None:
    [run] = runs_from(OPENAI_RUN, "openai", task_type="weather")
    assert run.task_id == "weather-42"
    assert _types(run) == [
        "task_start",
        "user_input",
        "llm_decision",
        "action_executed",
        "action_executed",
        "llm_decision",
        "action_executed",
        "llm_decision",
        "llm_decision",
        "action_executed",
        "task_end",
    ]
    start = run.events[0]
    assert start["task_type"] == "weather"
    assert start["goal"] == "Weather in Paris\nand Lyon?"  # list-of-parts content joined
    assert start["tools"] == ["get_weather", "book_hotel"]
    assert start["context"]["system"] == "You are a travel assistant."
    assert start["context"]["metadata"] == {"info": {"user": "u1"}}  # unknown fields kept
    user = run.events[1]
    assert user["input"]["text"] == "Weather in Paris\nand Lyon?"
    assert user["agent_state"]["agent"] == "alice"

    decision = run.events[2]["decision"]
    assert decision == {
        "chosen_action": "get_weather",
        "message": "Checking both cities.",
        "tool_calls": ["get_weather", "get_weather"],
    }
    paris, lyon_bad, lyon = _actions(run)[:3]
    # Parallel calls matched to their results by id, whatever the order of the results.
    assert paris["input"] == {"tool": "get_weather", "args": {"city": "Paris"}}
    assert paris["result"] == {"status": "succeeded", "output": '{"temp_c": 18}'}
    assert lyon_bad["input"]["args"] == '{"city": "Lyon"'  # not JSON: kept raw
    assert lyon_bad["result"] == {
        "status": "failed",
        "error_type": "ToolError",
        "error_message": "Error: invalid JSON arguments",
    }
    assert lyon["result"]["status"] == "succeeded"
    reply = run.events[7]
    assert reply["decision"] == {"chosen_action": "reply", "message": "Paris 18°C, Lyon 21°C."}
    assert reply["context"]["metadata"] == {"annotations": ["x"]}
    # A call whose result never came.
    missing = _actions(run)[-1]
    assert missing["input"]["tool"] == "book_hotel"
    assert missing["result"]["status"] == "unknown"
    end = run.events[-1]
    assert end["result"] == {"status": "failed", "outcome_source": "reward", "reward": 0.0}


def test_chinese_run_failure_and_inferred_outcome() -> None:
    [run] = runs_from(CHINESE_RUN)
    start = run.events[0]
    assert run.task_id.startswith("tsk_")
    assert start["goal"] == "请把销售报表转换成 UTF-8"
    assert start["task_type"] == "imported"
    assert start["context"]["system"] == "你是一个数据助手。"
    failed, ok = _actions(run)
    assert failed["input"] == {"tool": "读取文件", "args": {"路径": "/数据/销售.csv"}}
    assert failed["result"]["status"] == "failed"
    assert failed["result"]["error_message"] == "错误：无法解码第 3 行（GBK 编码）"
    assert ok["result"] == {"status": "succeeded", "output": "共 120 行"}
    # No outcome or reward: the last tool call succeeded, so the run did.
    assert run.events[-1]["result"] == {"status": "succeeded", "outcome_source": "inferred"}


def test_outcome_rules() -> None:
    ended_on_failure = CHINESE_RUN[:4]
    [run] = runs_from(ended_on_failure)
    assert run.events[-1]["result"]["status"] == "failed"
    assert run.events[-1]["result"]["outcome_source"] == "inferred"
    [run] = runs_from({"messages": ended_on_failure, "reward": 1})
    assert run.events[-1]["result"] == {
        "status": "succeeded",
        "outcome_source": "reward",
        "reward": 1,
    }
    [run] = runs_from({"messages": ended_on_failure, "reward": 1, "outcome": "failed"})
    assert run.events[-1]["result"]["status"] == "failed"
    # The caller's word wins over the run's.
    [run] = runs_from({"messages": ended_on_failure, "outcome": "failed"}, outcome="succeeded")
    assert run.events[-1]["result"]["outcome_source"] == "caller"
    assert run.events[-1]["result"]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Error: payment amount does not add up", "ToolError"),
        ("error - flight not found", "ToolError"),
        ("  [ERROR] disk full", "ToolError"),
        ("Exception in handler", "ToolError"),
        ("ValueError: bad date '2024-13-01'", "ValueError"),
        ("requests.exceptions.HTTPError: 503", "HTTPError"),
        ("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'id'", "KeyError"),
        ("错误：城市不存在", "ToolError"),
        ("失败，余额不足", "ToolError"),
        ('{"error": {"type": "not_found", "message": "no such user"}}', "not_found"),
        ({"error": "rate limited"}, "ToolError"),
        ("Errors found: 0", None),
        ("error_count: 0", None),
        ("No error occurred", None),
        ('{"error": null, "rows": 3}', None),
        ('{"status": "ok"}', None),
        ("", None),
        (None, None),
        ("成功：已预订", None),
    ],
)
def test_tool_error_rule(output: Any, expected: str | None) -> None:
    found = tool_error(output)
    assert (found[0] if found else None) == expected
    if found and isinstance(output, str):
        assert found[1] == output  # the whole text, never cut


def test_ids_are_deterministic_and_times_increase() -> None:
    first = runs_from([OPENAI_RUN, CHINESE_RUN], "openai")
    again = runs_from(json.loads(json.dumps([OPENAI_RUN, CHINESE_RUN])), "openai")
    assert [r.events for r in first] == [r.events for r in again]
    ids = [e["event_id"] for r in first for e in r.events]
    assert len(ids) == len(set(ids))
    other = runs_from(CHINESE_RUN[:3])
    assert other[0].task_id != first[1].task_id
    for run in first:
        assert [e["seq"] for e in run.events] == list(range(len(run.events)))
        times = [parse_ts(e["timestamp"]) for e in run.events]
        assert times == sorted(times) and len(set(times)) == len(times)
        for e in run.events:
            Event.from_dict(e)  # every event is valid wire format


def test_source_timestamps_are_kept() -> None:
    messages = [
        {"role": "user", "content": "hi", "timestamp": "2024-11-20T14:32:10.882Z"},
        {"role": "assistant", "content": "hello", "timestamp": "2024-11-20T14:32:12Z"},
        {"role": "user", "content": "bye"},
    ]
    [run] = runs_from(messages)
    assert [e["timestamp"] for e in run.events] == [
        "2024-11-20T14:32:10.882Z",
        "2024-11-20T14:32:10.882Z",
        "2024-11-20T14:32:12.000Z",
        "2024-11-20T14:32:12.001Z",
        "2024-11-20T14:32:12.002Z",
    ]


# -- Anthropic ---------------------------------------------------------------------------------


def test_anthropic_run() -> None:
    assert detect_format(ANTHROPIC_RUN) == "anthropic"
    [run] = runs_from(ANTHROPIC_RUN, scope="project:ops")
    assert _types(run) == [
        "task_start",
        "user_input",
        "llm_decision",
        "action_executed",
        "action_executed",
        "user_input",
        "llm_decision",
        "task_end",
    ]
    start = run.events[0]
    assert start["context"]["system"] == "You manage files."
    assert start["scope"] == "project:ops"
    assert start["tools"] == ["list_dir", "rm"]
    assert run.events[2]["decision"] == {
        "chosen_action": "list_dir",
        "message": "I'll look first.",
        "tool_calls": ["list_dir", "rm"],
        "reasoning": "List first.",
    }
    listed, removed = _actions(run)
    assert listed["result"] == {"status": "succeeded", "output": "a.txt\nb.txt"}
    assert removed["input"] == {"tool": "rm", "args": {"path": "/tmp", "recursive": True}}
    assert removed["result"] == {
        "status": "failed",
        "error_type": "ToolError",
        "error_message": "permission denied",
    }
    assert run.events[5]["input"]["text"] == "Use sudo then."
    assert run.events[-1]["result"] == {"status": "succeeded", "outcome_source": "outcome"}


# -- OTLP --------------------------------------------------------------------------------------


def test_otlp_genai_trace() -> None:
    assert detect_format(OTLP_TRACE) == "otlp"
    [run] = runs_from(OTLP_TRACE)
    assert run.task_id.startswith("tsk_")
    assert _types(run) == [
        "task_start",
        "user_input",
        "llm_decision",
        "action_executed",
        "llm_decision",
        "action_executed",
        "user_input",
        "llm_decision",
        "task_end",
    ]
    start = run.events[0]
    assert start["timestamp"] == "2024-11-20T14:32:10.000Z"
    assert start["task_type"] == "helpdesk"
    assert start["goal"] == "Reset my password"
    assert start["context"]["system"] == "Be brief."
    assert start["context"]["metadata"]["resource"] == {"service.name": "support-bot"}
    assert start["context"]["metadata"]["unmapped_spans"] == 1  # the HTTP span
    assert start["agent_state"] == {"model": "gpt-4o"}
    first = run.events[2]
    assert first["decision"]["chosen_action"] == "lookup_user"
    assert first["agent_state"] == {"agent": "helpdesk", "model": "gpt-4o"}
    assert first["context"]["metadata"]["attributes"] == {"gen_ai.usage.input_tokens": 120}
    timeout, found = _actions(run)
    assert timeout["input"] == {"tool": "lookup_user", "args": {"email": "a@b.c"}}
    assert timeout["result"]["status"] == "failed"
    assert timeout["result"]["error_type"] == "TimeoutError"
    assert timeout["result"]["error_message"] == "TimeoutError: directory did not answer in 5 s"
    assert timeout["result"]["duration_ms"] == 50.0
    assert found["result"]["status"] == "succeeded"
    assert found["result"]["output"] == '{"id": 7}'
    assert run.events[6]["input"]["text"] == "谢谢，快一点"  # only the new user message
    assert run.events[7]["decision"] == {
        "chosen_action": "reply",
        "message": "A reset link is on its way.",
    }
    assert run.events[-1]["timestamp"] == "2024-11-20T14:32:10.900Z"
    assert run.events[-1]["result"]["status"] == "succeeded"
    assert runs_from(OTLP_TRACE) == [run]


def test_otlp_agent_error_status_fails_the_task() -> None:
    trace = json.loads(json.dumps(OTLP_TRACE))
    spans = trace["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["status"] = {"code": "STATUS_CODE_ERROR", "message": "gave up"}
    [run] = runs_from([trace], "otlp")
    assert run.events[-1]["result"]["status"] == "failed"
    assert run.events[-1]["result"]["error_message"] == "gave up"


# -- files and detection -----------------------------------------------------------------------


def test_read_runs_json_and_jsonl(tmp_path: Path) -> None:
    runs_file = tmp_path / "runs.jsonl"
    runs_file.write_text(
        "\n".join(
            json.dumps(r, ensure_ascii=False) for r in (OPENAI_RUN, {"messages": CHINESE_RUN})
        )
        + "\n",
        encoding="utf-8",
    )
    runs = read_runs(runs_file)
    assert [r.task_id for r in runs] == [
        r.task_id for r in runs_from([OPENAI_RUN, {"messages": CHINESE_RUN}])
    ]
    assert runs[0].events[0]["context"]["import_source"] == "runs.jsonl"

    messages_file = tmp_path / "one_run.jsonl"  # one message a line: one run
    messages_file.write_text(
        "\n".join(json.dumps(m, ensure_ascii=False) for m in CHINESE_RUN), encoding="utf-8"
    )
    [run] = read_runs(messages_file, task_type="csv_cleaning")
    assert run.events[0]["task_type"] == "csv_cleaning"

    list_file = tmp_path / "runs.json"
    list_file.write_bytes(b"\xef\xbb\xbf" + json.dumps([ANTHROPIC_RUN]).encode())
    [run] = read_runs(list_file, "anthropic", source="")
    assert "import_source" not in run.events[0]["context"]

    wire_file = tmp_path / "events.jsonl"
    events = runs_from(CHINESE_RUN)[0].events + runs_from(ANTHROPIC_RUN)[0].events
    wire_file.write_text(
        "\n".join(json.dumps(e, ensure_ascii=False) for e in events), encoding="utf-8"
    )
    wire = read_runs(wire_file)
    assert [len(r.events) for r in wire] == [
        len(runs_from(CHINESE_RUN)[0].events),
        len(runs_from(ANTHROPIC_RUN)[0].events),
    ]
    assert wire[0].events == runs_from(CHINESE_RUN)[0].events


def test_detect_format() -> None:
    assert detect_format(CHINESE_RUN) == "openai"
    assert detect_format([OPENAI_RUN, {"traj": CHINESE_RUN}]) == "openai"
    assert (
        detect_format([{"role": "user", "content": "hi"}]) == "openai"
    )  # plain text reads the same
    assert detect_format(runs_from(CHINESE_RUN)[0].events) == "wire"
    assert FORMATS == ("auto", "wire", "openai", "anthropic", "otlp", "ag2")
    for unsure in (
        {},
        [],
        "text",
        [1, 2],
        [{"role": "tool", "content": [{"type": "tool_result"}]}],
    ):
        with pytest.raises(ValueError, match="--format"):
            detect_format(unsure)
    with pytest.raises(ValueError, match="--format"):
        runs_from(CHINESE_RUN, "csv")


# -- end to end --------------------------------------------------------------------------------


def test_imported_run_replays_with_its_failure(tmp_path: Path) -> None:
    [run] = runs_from(CHINESE_RUN, task_type="csv_cleaning")
    hs = Hindsight(tmp_path / "h.db", background=False)
    try:
        for event in run.events:
            assert hs.record(event)
        hs.flush()
        chronicle = hs.replay(run.task_id)
        assert chronicle.task.task_type == "csv_cleaning"
        assert chronicle.task.status == "succeeded"
        assert chronicle.event_count == len(run.events)
        [first] = [n for n in chronicle.key_nodes if n.kind == "first_failure"]
        assert first.action == "读取文件"
        assert first.error_type == "ToolError"
        assert first.event_id == _actions(run)[0]["event_id"]
    finally:
        hs.close()


def test_import_transcript_twice_stores_each_event_once(tmp_path: Path) -> None:
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        first = hs.import_transcript(OPENAI_RUN, task_type="weather")
        again = hs.import_transcript(OPENAI_RUN, task_type="weather")
        [run] = runs_from(OPENAI_RUN, task_type="weather")
        assert first.runs == 1 and first.accepted == len(run.events) and first.duplicates == 0
        assert again.accepted == 0 and again.duplicates == len(run.events)
        assert hs.store.event_count(run.task_id) == len(run.events)
        task = hs.get_task(run.task_id)
        assert task is not None and task.task_type == "weather" and task.status == "failed"
        # An ended imported run is queued for reflection like a live one.
        assert any(j["task_id"] == run.task_id for j in hs.store.jobs())


@pytest.mark.parametrize("name", ["openai", "anthropic", "otlp"])
def test_hindsight_import_reads_each_format_from_a_file(tmp_path: Path, name: str) -> None:
    from typer.testing import CliRunner

    from hindsight_loop.cli.app import app

    data = {"openai": OPENAI_RUN, "anthropic": ANTHROPIC_RUN, "otlp": OTLP_TRACE}[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    db = str(tmp_path / "h.db")
    runner = CliRunner()
    out = runner.invoke(app, ["import", str(path), "--db", db, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["accepted"] > 0 and report["duplicates"] == 0 and report["problems"] == []
    out = runner.invoke(app, ["import", str(path), "--db", db, "--json", "--format", name])
    assert out.exit_code == 0, out.output
    again = json.loads(out.stdout)
    assert again["accepted"] == 0 and again["duplicates"] == report["accepted"]


def test_hindsight_import_names_the_format_option_when_it_cannot_tell(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hindsight_loop.cli.app import app

    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"rows": [1, 2, 3]}), encoding="utf-8")
    out = CliRunner().invoke(app, ["import", str(path), "--db", str(tmp_path / "h.db")])
    assert out.exit_code != 0
    assert "--format" in out.output
    assert "Traceback" not in out.output
