#!/usr/bin/env bash
# Install the reference MCP server `mcp-server-time` from PyPI into a venv of its own.
#
# Why its own venv: the published server pins its own `mcp` SDK, which must not clash with the
# SDK Hindsight is built against; the end-to-end tests and bench/mcp_latency.py then talk to it
# exactly as a user's client would, as a separate process over stdio.
#
# Usage: scripts/setup-mcp-time.sh [VENV_DIR]     (default: <repo>/.mcp-time-venv)
# Prints the path of the installed `mcp-server-time` executable on its last line.
# Idempotent: a venv that already has the pinned version is reused.
set -euo pipefail

# Pinned so a new release cannot change what the e2e tests see; bump deliberately.
MCP_SERVER_TIME_VERSION="${MCP_SERVER_TIME_VERSION:-2026.10.19}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${MCP_TIME_VENV:-$here/.mcp-time-venv}}"
python="${PYTHON:-python3}"
exe="$venv/bin/mcp-server-time"

if [[ -x "$exe" ]] && "$venv/bin/python" -m pip show mcp-server-time 2>/dev/null \
    | grep -qx "Version: $MCP_SERVER_TIME_VERSION"; then
    echo "$exe"
    exit 0
fi

"$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "mcp-server-time==$MCP_SERVER_TIME_VERSION" >&2
echo "$exe"
