#!/usr/bin/env bash
# Runs the test suite (installs requirements.txt into .venv first unless an environment is active).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PY" -m pytest "$@"
