#!/usr/bin/env bash
# Install everything the tests need into .venv (pinned by requirements.lock) and run them all.
# Used by the README's test command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c requirements.lock -e '.[all,dev]'
# The MCP end-to-end tests drive a real published MCP server, installed in its own venv so its
# SDK pin cannot clash with ours.
bash scripts/setup-mcp-time.sh
# The reference servers on npm (Node.js and npm are on the machine): the gateway's
# direct-vs-gateway comparisons run against server-everything.
bash scripts/setup-mcp-npm.sh >/dev/null
bash scripts/setup-postgres.sh install  # PostgreSQL 15 + pgvector; the tests start their own cluster
bash scripts/setup-browser.sh
exec .venv/bin/python -m pytest -q "$@"
