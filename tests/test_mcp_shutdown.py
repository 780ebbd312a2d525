"""A client stopping the gateway stops its upstream too, as it would have stopped the server.

MCP clients stop a stdio server by closing its stdin, then SIGTERM two seconds later, then
SIGKILL (the TypeScript SDK the Inspector uses, and the Python SDK). server-everything does not
exit on a closed stdin, so directly it dies of the SIGTERM. Through the gateway it must too: the
gateway used to spend those two seconds waiting for it, die of the client's SIGTERM, and leave it
running (in a process group of its own), holding the client's stderr open, so the Inspector hung
until the server died on its own (60 s). The store keeps the session's end either way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_mcp_everything import (  # noqa: E402  (the shared helpers live beside the first suite)
    CLI,
    _actions,
    _config,
    _tasks,
    everything,  # noqa: F401  (fixture)
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _is_writer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"hindsight_loop.writer" in f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gateway_with_one_call(exe: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    config = _config(tmp_path / "s.json", {"everything": {"command": exe, "args": ["stdio"]}})
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "mcp", "proxy", "--config", str(config)]
        + ["--db", str(tmp_path / "g.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, object]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps({"jsonrpc": "2.0", **message}) + b"\n")
        proc.stdin.flush()

    send(
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "stopper", "version": "1"},
            },
        }
    )
    assert orjson.loads(proc.stdout.readline())["id"] == 1
    send({"method": "notifications/initialized"})
    send(
        {"id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "x"}}}
    )
    assert "Echo: x" in orjson.loads(proc.stdout.readline())["result"]["content"][0]["text"]
    # The gateway's children: the upstream, and its writer process when it records through one.
    [upstream] = [c for c in _children(proc.pid) if not _is_writer(c)]
    assert _alive(upstream)
    return proc, upstream


def _wait_dead(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.parametrize("close_stdin_first", [True, False])
def test_the_clients_sigterm_reaches_the_upstream(
    everything: str,  # noqa: F811
    tmp_path: Path,
    close_stdin_first: bool,
) -> None:
    proc, upstream = _gateway_with_one_call(everything, tmp_path)
    writers = [c for c in _children(proc.pid) if _is_writer(c)]
    try:
        if close_stdin_first:  # as the SDKs do: stdin closed, two seconds, then SIGTERM
            assert proc.stdin is not None
            proc.stdin.close()
            time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        # The SDKs SIGKILL two seconds after the SIGTERM; the upstream must be gone by then
        # (generous here: a loaded machine is slow to start the gateway's Python, not this).
        assert _wait_dead(upstream, 10.0), "the upstream outlived the gateway's SIGTERM"
        assert proc.wait(timeout=30) == 0
        # A writer process does not outlive the gateway that started it.
        assert all(_wait_dead(w, 10.0) for w in writers), "the writer outlived the gateway"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if _alive(upstream):
            os.kill(upstream, signal.SIGKILL)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
    [(_, events)] = _tasks(tmp_path / "g.db")
    assert len(_actions(events)) == 1
    assert events[-1].type == "task_end"
