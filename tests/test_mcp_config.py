"""The gateway's config file: the {"mcpServers": ...} shape MCP clients already use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hindsight_loop.mcp.config import ConfigError, load_config, parse_config


def test_claude_desktop_file_reads_as_is(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                    "docs": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "x"}},
                    "old": {"command": "node", "args": ["old.js"], "disabled": True},
                },
                "hindsight": {"taskType": "desktop", "toolNames": "prefixed", "timeout": 30},
            }
        )
    )
    cfg = load_config(path)
    assert [u.name for u in cfg.upstreams] == ["time", "docs"]
    time, docs = cfg.upstreams
    assert (time.transport, time.command, time.args, time.env) == (
        "stdio",
        "uvx",
        ["mcp-server-time"],
        {"TZ": "UTC"},
    )
    assert (docs.transport, docs.url, docs.headers) == (
        "http",
        "http://127.0.0.1:9000/mcp",
        {"Authorization": "x"},
    )
    assert cfg.task_type == "desktop" and cfg.tool_naming == "prefixed"
    assert cfg.call_timeout == 30.0 and cfg.advise is False
    assert cfg.skipped == ["old: disabled"]


def test_vscode_servers_key_and_explicit_types() -> None:
    cfg = parse_config(
        {
            "servers": {
                "a": {"type": "stdio", "command": "python", "args": ["-m", "srv", 3]},
                "b": {"type": "http", "url": "https://example.test/mcp"},
            }
        }
    )
    assert [(u.name, u.transport) for u in cfg.upstreams] == [("a", "stdio"), ("b", "http")]
    assert cfg.upstreams[0].args == ["-m", "srv", "3"]
    assert cfg.tool_naming == "auto" and cfg.task_type is None


def test_relative_cwd_is_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"s": {"command": "x", "cwd": "sub"}}}))
    assert load_config(path).upstreams[0].cwd == str(tmp_path / "sub")


def test_the_gateway_itself_is_skipped_not_launched_recursively() -> None:
    cfg = parse_config(
        {
            "mcpServers": {
                "hindsight": {
                    "command": "hindsight",
                    "args": ["mcp", "proxy", "--config", "x.json"],
                },
                "time": {"command": "uvx", "args": ["mcp-server-time"]},
            }
        }
    )
    assert [u.name for u in cfg.upstreams] == ["time"]
    assert "Hindsight gateway itself" in cfg.skipped[0]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "JSON object"),
        ({}, "no servers"),
        ({"mcpServers": {"s": "uvx"}}, "'s' must be an object"),
        ({"mcpServers": {"s": {"args": []}}}, "needs a 'command'"),
        ({"mcpServers": {"s": {"type": "sse", "url": "http://x/sse"}}}, "streamable-HTTP"),
        ({"mcpServers": {"s": {"type": "http", "url": "ftp://x"}}}, "http:// or https://"),
        ({"mcpServers": {"s": {"type": "carrier-pigeon", "command": "x"}}}, "unknown type"),
        ({"mcpServers": {"s": {"command": "x", "args": "a b"}}}, "'args' must be a list"),
        ({"mcpServers": {"s": {"command": "x", "disabled": True}}}, "no usable servers"),
        ({"mcpServers": {"s": {"command": "x"}}, "hindsight": {"toolNames": "short"}}, "toolNames"),
        ({"mcpServers": {"s": {"command": "x"}}, "hindsight": {"timeout": -1}}, "timeout"),
        ({"mcpServers": {"s": {"command": "x"}}, "hindsight": {"taskType": ""}}, "taskType"),
    ],
)
def test_bad_configs_name_the_problem_and_the_fix(data: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_config(data)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found.*--config"):
        load_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{mcpServers:")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
