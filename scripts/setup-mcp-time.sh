#!/usr/bin/env bash
# Install the reference MCP server `mcp-server-time` from PyPI into a venv of its own.
#
# Why its own venv: the published server pins its own `mcp` SDK, which must not clash with the
# SDK Hindsight is built against. The MCP end-to-end tests and bench/mcp_latency.py then talk to
# it the way a user's client does: a separate process over stdio.
#
# Usage:
#   scripts/setup-mcp-time.sh            # 2026-era server (mcp-server-time 2026.10.19, SDK 2.x)
#   scripts/setup-mcp-time.sh --legacy   # 2025-era server (mcp-server-time 2025.9.25, SDK 1.x:
#                                        #   initialize handshake only)
# Venvs: <repo>/.mcp-time-venv and <repo>/.mcp-time-venv/legacy (both gitignored), or
# $MCP_TIME_VENV. Prints the path of the installed `mcp-server-time` on its last line.
# Idempotent: a venv that already holds the pinned version is reused without network access.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"

if [[ "${1:-}" == "--legacy" ]]; then
    # Pinned: the last release built on the 1.x SDK (lowlevel Server, 2025 handshake only).
    version="2025.9.25"
    sdk="mcp>=1.20,<2"
    venv="${MCP_TIME_VENV:-$here/.mcp-time-venv}/legacy"
else
    # Pinned so a new release cannot change what the end-to-end tests see; bump deliberately.
    version="2026.10.19"
    sdk="mcp>=2.3,<3"
    venv="${MCP_TIME_VENV:-$here/.mcp-time-venv}"
fi
exe="$venv/bin/mcp-server-time"

# The installed version is read from its dist-info folder: asking pip costs seconds per call.
shopt -s nullglob
installed=("$venv"/lib/python*/site-packages/mcp_server_time-"$version".dist-info)
if [[ -x "$exe" && ${#installed[@]} -gt 0 ]]; then
    echo "$exe"
    exit 0
fi

"$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "mcp-server-time==$version" "$sdk" >&2
echo "$exe"
