#!/usr/bin/env bash
# Install the reference MCP servers from npm into a project-local folder, for the gateway's
# direct-vs-gateway end-to-end tests and bench/mcp_latency.py.
#
# Why npm: the reference servers (`@modelcontextprotocol/server-everything` exercises every part
# of the protocol: tools, resources, prompts, logging, completions, progress, sampling,
# elicitation, roots) are published there. Versions are pinned so a release cannot change what
# the tests see; bump deliberately. `server-filesystem` and `server-memory` are two servers as
# agents use them (files on disk, a knowledge graph in a JSON file).
#
# Usage: scripts/setup-mcp-npm.sh
# Folder: <repo>/.mcp-servers (ignored by git through its own .gitignore), or $MCP_NPM_DIR.
# Prints the path of the installed `mcp-server-everything` on its last line (the other servers'
# executables sit beside it in the same `node_modules/.bin`).
# Idempotent: a folder that already holds the pinned versions is reused without network access.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MCP_NPM_DIR:-$here/.mcp-servers}"
packages=(
    "@modelcontextprotocol/server-everything@2026.8.31"
    "@modelcontextprotocol/server-filesystem@2026.8.31"
    "@modelcontextprotocol/server-memory@2026.8.31"
)
exe="$dir/node_modules/.bin/mcp-server-everything"

# Installed versions are read from package.json: asking npm costs seconds per call.
installed() {
    local spec name version
    for spec in "${packages[@]}"; do
        name="${spec%@*}"
        version="${spec##*@}"
        grep -q "\"version\": \"$version\"" "$dir/node_modules/$name/package.json" 2>/dev/null \
            || return 1
    done
}

if [[ -x "$exe" ]] && installed; then
    echo "$exe"
    exit 0
fi

command -v npm >/dev/null || { echo "npm is not installed: install Node.js >= 20 with npm" >&2; exit 1; }
mkdir -p "$dir"
printf '*\n' > "$dir/.gitignore"
[[ -f "$dir/package.json" ]] || printf '{"private": true}\n' > "$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error --save-exact "${packages[@]}" >&2
echo "$exe"
