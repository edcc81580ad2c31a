#!/usr/bin/env bash
# The GPU check in one command (benchmarks/gpu_check/): every CUDA-side check and measurement of the project,
# into $OUT/gpu_report.md and gpu_report.json (./gpu_check_out without $OUT). Installs nothing: on the GPU machine
# it runs with the image's own python3 (torch, torchvision, timm already there).
#   bash scripts/gpu_check.sh [--sections 1-8] [--budget SECONDS]     # on a GPU (docs/DEVELOPING.md, "On a GPU")
#   bash scripts/gpu_check.sh --dry-run                                # tiny sizes, any device, about 2 minutes
# The Python: $PY if set; else an active virtualenv or conda environment's; else python3 if it imports torch (the GPU
# image); else this checkout's .venv (bash scripts/test.sh creates it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -z "${PY:-}" ]; then
    if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then PY=python
    elif python3 -c "import torch, torchvision" 2>/dev/null; then PY=python3
    elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
    else echo "error: no Python with torch and torchvision here: run bash scripts/test.sh once (it creates .venv)" >&2
        exit 2
    fi
fi
export PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.gpu_check "$@"
