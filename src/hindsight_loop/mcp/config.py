"""Read the ``{"mcpServers": {...}}`` file that MCP clients already keep.

The gateway takes the same file a user's client (Claude Desktop, Cursor, VS Code, …) uses to
launch its servers, so putting Hindsight in front of them is one line of config, not a rewrite.
Parsing is kept apart from the gateway so a bad file fails before any server is started, with a
message that names the entry and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

ToolNaming = Literal["auto", "prefixed"]

#: Separator between an upstream's name and its tool name when names are prefixed. Two
#: underscores keep the result inside the tool-name alphabet every client accepts.
PREFIX_SEPARATOR = "__"

_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamablehttp"}
_STDIO_TYPES = {"stdio", "local"}


class ConfigError(ValueError):
    """The config file is missing, unreadable or has an entry the gateway cannot use."""


@dataclass(kw_only=True, slots=True)
class UpstreamConfig:
    """One MCP server the gateway connects to."""

    name: str
    """The key under ``mcpServers``; prefixes tool names when they clash."""
    transport: Literal["stdio", "http"]
    """``stdio`` (a command to launch) or ``http`` (a streamable-HTTP URL)."""
    command: str | None = None
    """Executable for a stdio server."""
    args: list[str] = field(default_factory=list)
    """Its arguments."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the server process (merged over a minimal safe environment)."""
    cwd: str | None = None
    """Working directory for the server process."""
    url: str | None = None
    """Endpoint of an HTTP server (``http://127.0.0.1:8000/mcp``)."""
    headers: dict[str, str] = field(default_factory=dict)
    """HTTP headers sent to an HTTP server (auth tokens, …)."""


@dataclass(kw_only=True, slots=True)
class GatewayConfig:
    """What the gateway runs: its upstreams and how it records them."""

    upstreams: list[UpstreamConfig]
    """Servers to put behind the gateway, in file order."""
    task_type: str | None = None
    """Task type of every recorded session; ``None`` uses the client's name."""
    tool_naming: ToolNaming = "auto"
    """``auto``: keep tool names, prefix only names that clash; ``prefixed``: always prefix."""
    advise: bool = False
    """Append recalled lessons to failed tool results."""
    call_timeout: float | None = None
    """Seconds before an upstream tool call counts as a ``timeout`` (``None``: no limit)."""
    skipped: list[str] = field(default_factory=list)
    """Entries left out (disabled, or the gateway itself), with why, for the startup log."""


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read and validate a config file; raises ``ConfigError`` naming the problem and the fix."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"config file '{p}' not found: pass the JSON file of your MCP client "
            '(the one with "mcpServers") with --config'
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{p}': {exc}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"config file '{p}' is not valid JSON: {exc}") from None
    return parse_config(data, base_dir=p.parent)


def parse_config(data: Any, *, base_dir: Path | None = None) -> GatewayConfig:
    """Validate an already-loaded config object (see ``load_config``)."""
    if not isinstance(data, dict):
        raise ConfigError('the config must be a JSON object like {"mcpServers": {...}}')
    # Claude Desktop, Cursor and most clients say "mcpServers"; VS Code says "servers".
    servers = data.get("mcpServers", data.get("servers"))
    if not isinstance(servers, dict) or not servers:
        raise ConfigError(
            'the config has no servers: add {"mcpServers": {"NAME": {"command": ..., "args": [...]}}} '
            'or {"mcpServers": {"NAME": {"url": "http://…/mcp"}}}'
        )
    options = data.get("hindsight") or {}
    if not isinstance(options, dict):
        raise ConfigError('"hindsight" must be an object, e.g. {"taskType": "coding"}')

    upstreams: list[UpstreamConfig] = []
    skipped: list[str] = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"server '{name}' must be an object with a 'command' or a 'url'")
        if entry.get("disabled") is True:
            skipped.append(f"{name}: disabled")
            continue
        if _is_this_gateway(entry):
            # A user who points the gateway at the very file that launches the gateway would
            # otherwise start it recursively, one process per level, forever.
            skipped.append(f"{name}: it is the Hindsight gateway itself")
            continue
        upstreams.append(_parse_server(str(name), entry, base_dir))
    if not upstreams:
        raise ConfigError(
            "no usable servers in the config ("
            + "; ".join(skipped)
            + '): add one under "mcpServers"'
        )

    naming = options.get("toolNames", options.get("tool_names", "auto"))
    if naming not in ("auto", "prefixed"):
        raise ConfigError(f'"hindsight.toolNames" must be "auto" or "prefixed", not {naming!r}')
    timeout = options.get("timeout")
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise ConfigError('"hindsight.timeout" must be a positive number of seconds')
    task_type = options.get("taskType", options.get("task_type"))
    if task_type is not None and (not isinstance(task_type, str) or not task_type.strip()):
        raise ConfigError('"hindsight.taskType" must be a non-empty string')
    return GatewayConfig(
        upstreams=upstreams,
        task_type=task_type,
        tool_naming=naming,
        advise=bool(options.get("advise", False)),
        call_timeout=float(timeout) if timeout is not None else None,
        skipped=skipped,
    )


def _parse_server(name: str, entry: dict[str, Any], base_dir: Path | None) -> UpstreamConfig:
    kind = str(entry.get("type") or entry.get("transport") or "").lower()
    if kind == "sse":
        raise ConfigError(
            f"server '{name}' uses the old HTTP+SSE transport, which the gateway does not speak: "
            "use its streamable-HTTP endpoint (usually ending in /mcp) as 'url'"
        )
    url = entry.get("url") or entry.get("serverUrl")
    command = entry.get("command")
    if kind in _HTTP_TYPES or (not kind and url and not command):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"server '{name}' needs a 'url' starting with http:// or https://")
        return UpstreamConfig(
            name=name, transport="http", url=url, headers=_str_dict(name, entry, "headers")
        )
    if kind and kind not in _STDIO_TYPES:
        raise ConfigError(f"server '{name}' has unknown type {kind!r}: use 'stdio' or 'http'")
    if not isinstance(command, str) or not command:
        raise ConfigError(f"server '{name}' needs a 'command' (stdio) or a 'url' (streamable HTTP)")
    args = entry.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise ConfigError(f"server '{name}': 'args' must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and base_dir is not None and not os.path.isabs(str(cwd)):
        cwd = str(base_dir / str(cwd))
    return UpstreamConfig(
        name=name,
        transport="stdio",
        command=command,
        args=[str(a) for a in args],
        env=_str_dict(name, entry, "env"),
        cwd=str(cwd) if cwd is not None else None,
    )


def _str_dict(name: str, entry: dict[str, Any], key: str) -> dict[str, str]:
    value = entry.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"server '{name}': '{key}' must be an object of strings")
    return {str(k): str(v) for k, v in value.items()}


def _is_this_gateway(entry: dict[str, Any]) -> bool:
    command = os.path.basename(str(entry.get("command") or ""))
    args = [str(a) for a in entry.get("args") or []]
    if command in ("hindsight", "hindsight.exe"):
        return args[:2] == ["mcp", "proxy"]
    # `python -m hindsight_loop.cli mcp proxy …`, `uvx --from hindsight-loop hindsight mcp proxy …`
    joined = " ".join(args)
    return "mcp proxy" in joined and ("hindsight" in joined or "hindsight_loop" in joined)


__all__ = [
    "PREFIX_SEPARATOR",
    "ConfigError",
    "GatewayConfig",
    "ToolNaming",
    "UpstreamConfig",
    "load_config",
    "parse_config",
]
