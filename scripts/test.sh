#!/usr/bin/env bash
# Runs the test suite (installs requirements.txt into .venv first unless an environment is active),
# on every core (pytest-xdist; pytest.ini's addopts).        bash scripts/test.sh [pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PY" -c "import xdist" 2>/dev/null || {
    echo "error: pytest-xdist is missing from the active environment: pip install -r requirements.txt" >&2; exit 1; }
"$PY" -m pytest "$@"
