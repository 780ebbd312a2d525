"""How much latency the recording gateway adds to an MCP tool call.

Measured against a direct connection to the same published server (``mcp-server-time`` from its
own venv, see ``scripts/setup-mcp-time.sh``), in the same run, with the calls interleaved
(direct, gateway, direct, … in alternating order) so drift in machine load hits both alike.
Reports medians and the added time per call; never fails on a number.

Paths measured, each against its own direct baseline:

- ``stdio``: client → ``hindsight mcp proxy`` (a subprocess, as an MCP client launches it) →
  server. What a user gets; includes the extra process hop and JSON framing.
- ``in-process``: client → ``Gateway`` in this process → server. The gateway's own work
  (routing, recording, result summary) without the extra hop.
- ``in-process, recording off``: the same gateway with a facade that records nothing, so the
  difference to ``in-process`` is what recording costs a call.
- ``record``: the cost of one ``Hindsight.record`` call on the caller's thread (the only
  recording work on the call path).
- ``launch``: from starting the server to the client's handshake done, directly and through
  ``hindsight mcp proxy`` (which starts the server itself), for a client that declares no
  capabilities and for one that declares sampling (the gateway tells the upstream what its
  client declares); interleaved, medians.
- ``http`` (with ``--http``): client → ``hindsight mcp proxy --transport http`` (a subprocess on
  127.0.0.1) → server over stdio, against the direct stdio baseline; with the gateway process's
  CPU per call. Tool calls over HTTP take the SDK's path on both sides (no byte relay), so this
  is what a relay there could save.

    python bench/mcp_latency.py [--calls 1000] [--mode auto|legacy] [--launches 7] [--http] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import orjson
from mcp import Client, StdioServerParameters

from hindsight_loop import Hindsight
from hindsight_loop.mcp import Gateway
from hindsight_loop.mcp.config import parse_config

REPO = Path(__file__).resolve().parents[1]
ARGS = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
CLI = "from hindsight_loop.cli import main; main()"


def _time_server() -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup-mcp-time.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip().splitlines()[-1]


async def _interleave(
    fns: list[Callable[[], Awaitable[Any]]],
    calls: int,
    warmup: int = 30,
    mark: Callable[[], None] = lambda: None,
) -> list[list[float]]:
    """Call each of ``fns`` in turn, rotating which goes first; per-call ms of each.

    ``mark`` is called after the warm-up and after the last call."""
    for _ in range(warmup):
        for fn in fns:
            await fn()
    mark()
    times: list[list[float]] = [[] for _ in fns]
    for i in range(calls):
        k = i % len(fns)
        for j in [*range(k, len(fns)), *range(k)]:
            started = time.perf_counter()
            await fns[j]()
            times[j].append((time.perf_counter() - started) * 1000)
    mark()
    return times


class _NoRecording:
    """A facade that records nothing: isolates what recording costs the call path."""

    def record(self, event: dict[str, Any]) -> bool:
        return True

    def recall(self, **_: Any) -> list[Any]:
        return []


def _stats(direct: list[float], gateway: list[float]) -> dict[str, float]:
    md, mg = statistics.median(direct), statistics.median(gateway)
    q = lambda xs: statistics.quantiles(xs, n=10)[-1]  # noqa: E731 - p90
    return {
        "direct_median_ms": round(md, 3),
        "gateway_median_ms": round(mg, 3),
        "added_median_ms": round(mg - md, 3),
        "ratio": round(mg / md, 3),
        "direct_p90_ms": round(q(direct), 3),
        "gateway_p90_ms": round(q(gateway), 3),
    }


def _proxy(config_path: Path, db: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-c", CLI, "mcp", "proxy", "--config", str(config_path), "--db", str(db)],
        # The SDK passes a child only a few variables: without this the gateway would run
        # the installed package's code, not the checkout's that the bench is run from.
        env={"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None,
    )


async def _sampling(context: Any, params: types.CreateMessageRequestParams) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message="not asked")


async def _launch(
    exe: str, args: list[str], config_path: Path, workdir: Path, mode: str, launches: int
) -> dict[str, Any]:
    """Median ms from start to handshake done, per client kind, launches interleaved."""
    kinds = {
        "direct": lambda: Client(StdioServerParameters(command=exe, args=args), mode=mode),
        "gateway": lambda: Client(_proxy(config_path, workdir / "launch.db"), mode=mode),
        "gateway, client declares sampling": lambda: Client(
            _proxy(config_path, workdir / "launch.db"), mode=mode, sampling_callback=_sampling
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(launches):
        for kind, make in kinds.items():
            client = make()
            started = time.perf_counter()
            async with client:
                times[kind].append((time.perf_counter() - started) * 1000)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def _cpu_ms(marker: str) -> float | None:
    """CPU ms (user + system) used so far by the process whose command line names ``marker``
    (Linux ``/proc``; ``None`` elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if marker.encode() not in (stat.parent / "cmdline").read_bytes():
                continue
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / tick * 1000  # utime, stime
    return None


async def _http_path(
    exe: str, args: list[str], config_path: Path, workdir: Path, mode: str, calls: int
) -> dict[str, Any]:
    """The same calls through the gateway served over streamable HTTP (a subprocess)."""
    import socket

    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    marker = str(workdir / "http.db")
    token = "bench-token"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "mcp", "proxy", "--config", str(config_path)]
        + ["--db", marker, "--transport", "http", "--port", str(port), "--token", token],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the HTTP gateway did not start") from None
                time.sleep(0.05)
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(StdioServerParameters(command=exe, args=args), mode=mode) as d,
            Client(
                streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http),
                mode=mode,
            ) as g,
        ):
            cpu: list[float | None] = []
            ta, tb = await _interleave(
                [
                    lambda: d.call_tool("convert_time", ARGS),
                    lambda: g.call_tool("convert_time", ARGS),
                ],
                calls,
                mark=lambda: cpu.append(_cpu_ms(marker)),
            )
        result = _stats(ta, tb)
        if cpu[0] is not None and cpu[1] is not None:
            result["gateway_cpu_ms_per_call"] = round((cpu[1] - cpu[0]) / calls, 3)
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _bench(
    exe: str, calls: int, mode: str, workdir: Path, launches: int = 0, http: bool = False
) -> dict[str, Any]:
    args = ["--local-timezone", "UTC"]
    config_path = workdir / "servers.json"
    config_path.write_bytes(orjson.dumps({"mcpServers": {"time": {"command": exe, "args": args}}}))
    results: dict[str, Any] = {}
    if launches:
        results["launch_median_ms"] = await _launch(exe, args, config_path, workdir, mode, launches)

    direct = Client(StdioServerParameters(command=exe, args=args), mode=mode)
    marker = str(workdir / "stdio.db")
    proxied = Client(_proxy(config_path, workdir / "stdio.db"), mode=mode)
    async with direct as d, proxied as g:
        cpu: list[float | None] = []
        ta, tb = await _interleave(
            [lambda: d.call_tool("convert_time", ARGS), lambda: g.call_tool("convert_time", ARGS)],
            calls,
            mark=lambda: cpu.append(_cpu_ms(marker)),
        )
        results["stdio"] = _stats(ta, tb)
        # The gateway process's own CPU per call: steadier than wall time on a busy machine,
        # where the processes on the call path wait for a core.
        if cpu[0] is not None and cpu[1] is not None:
            results["stdio"]["gateway_cpu_ms_per_call"] = round((cpu[1] - cpu[0]) / calls, 3)

    if http:
        results["http"] = await _http_path(exe, args, config_path, workdir, mode, calls)

    with Hindsight(workdir / "inproc.db") as hs:
        config = parse_config({"mcpServers": {"time": {"command": exe, "args": args}}})
        async with (
            Gateway(hs, config) as gateway,
            Gateway(_NoRecording(), config) as silent,  # type: ignore[arg-type]
            Client(StdioServerParameters(command=exe, args=args), mode=mode) as d,
            Client(gateway.server, mode=mode) as g,
            Client(silent.server, mode=mode) as s,
        ):
            ta, tb, tc = await _interleave(
                [
                    lambda: d.call_tool("convert_time", ARGS),
                    lambda: g.call_tool("convert_time", ARGS),
                    lambda: s.call_tool("convert_time", ARGS),
                ],
                calls,
            )
            results["in-process"] = _stats(ta, tb)
            results["in-process, recording off"] = _stats(ta, tc)

        hs.record({"type": "task_start", "task_id": "tsk_bench", "task_type": "bench"})
        event = {
            "type": "action_executed",
            "task_id": "tsk_bench",
            "input": {"tool": "convert_time", "args": ARGS, "server": "time"},
            "result": {"status": "succeeded", "output": "x" * 200, "latency_ms": 1.0},
        }
        n = 20_000
        started = time.perf_counter()
        for _ in range(n):
            hs.record(event)
        results["record_us_per_event"] = round((time.perf_counter() - started) / n * 1e6, 2)
    results["calls"] = calls
    results["mode"] = mode
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per path")
    parser.add_argument(
        "--mode",
        choices=["auto", "legacy"],
        default="auto",
        help="client protocol era: auto (2026-07-28) or legacy (2025 handshake)",
    )
    parser.add_argument(
        "--launches", type=int, default=7, help="launches per client kind (0: skip)"
    )
    parser.add_argument(
        "--http", action="store_true", help="also measure the gateway over streamable HTTP"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    opts = parser.parse_args()
    exe = _time_server()
    with tempfile.TemporaryDirectory() as tmp:
        results = anyio.run(_bench, exe, opts.calls, opts.mode, Path(tmp), opts.launches, opts.http)
    if opts.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
        return
    print(
        f"mcp-server-time convert_time, {opts.calls} interleaved calls per path, client mode {opts.mode}"
    )
    print(
        f"{'path':<27}{'direct ms':>11}{'gateway ms':>12}{'added ms':>10}{'ratio':>8}{'p90 d/g ms':>16}"
    )
    for path in ("stdio", "http", "in-process", "in-process, recording off"):
        if path not in results:
            continue
        r = results[path]
        print(
            f"{path:<27}{r['direct_median_ms']:>11.3f}{r['gateway_median_ms']:>12.3f}"
            f"{r['added_median_ms']:>10.3f}{r['ratio']:>8.2f}"
            f"{r['direct_p90_ms']:>8.2f}/{r['gateway_p90_ms']:.2f}"
        )
    print(f"Hindsight.record on the call path: {results['record_us_per_event']} µs per event")
    for path in ("stdio", "http"):
        if "gateway_cpu_ms_per_call" in results.get(path, {}):
            print(f"{path} gateway CPU per call: {results[path]['gateway_cpu_ms_per_call']} ms")
    for kind, ms in results.get("launch_median_ms", {}).items():
        if kind != "gateway_process_cpu_ms":
            print(f"launch to handshake done, {kind}: {ms} ms (median of {opts.launches})")


if __name__ == "__main__":
    main()
