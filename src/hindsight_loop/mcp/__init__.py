"""MCP surfaces of Hindsight: a recording gateway in front of any MCP servers, and Hindsight
itself as an MCP server (recall, record, report outcomes, reflect).

Needs the ``mcp`` SDK (2.x), an optional extra: ``pip install 'hindsight-loop[mcp]'``.
"""

from __future__ import annotations

try:
    import mcp as _sdk  # noqa: F401 - fail here, with the fix, rather than deep in an import
except ImportError as exc:  # pragma: no cover - exercised by the no-extras import test
    raise ImportError(
        "Hindsight's MCP gateway and server need the MCP SDK: pip install 'hindsight-loop[mcp]'"
    ) from exc

from hindsight_loop.mcp.config import ConfigError, GatewayConfig, UpstreamConfig, load_config
from hindsight_loop.mcp.proxy import Gateway
from hindsight_loop.mcp.server import build_server

__all__ = [
    "ConfigError",
    "Gateway",
    "GatewayConfig",
    "UpstreamConfig",
    "build_server",
    "load_config",
]
