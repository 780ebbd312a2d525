#!/usr/bin/env bash
# Re-pin requirements.lock from a clean venv with every extra installed.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf /tmp/hindsight-lock-venv
python3 -m venv /tmp/hindsight-lock-venv
/tmp/hindsight-lock-venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all,dev]'
{
  echo "# Pinned versions for hindsight-loop and its extras; regenerate with scripts/lock.sh."
  /tmp/hindsight-lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^-e '
} > requirements.lock
