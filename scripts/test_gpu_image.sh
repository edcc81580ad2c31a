#!/usr/bin/env bash
# The GPU image's versions, checked on this machine: a virtualenv (.venv-gpu-image) with the GPU machine's torch 2.11.0
# and torchvision 0.26.0 (and the rest of requirements.txt unpinned, as the image has them), Python 3.12 where there is
# one, then the non-slow suite and the GPU check's dry run in it. Not in CI (it downloads about 3 GB); run it before
# stopping whenever a change touches torch or torchvision APIs (docs/DEVELOPING.md, "On a GPU").
#   bash scripts/test_gpu_image.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TORCH="${GPU_IMAGE_TORCH:-2.11.0}"
VISION="${GPU_IMAGE_TORCHVISION:-0.26.0}"
VENV="$ROOT/.venv-gpu-image"
BASE=python3
for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do      # the image's Python where there is one
    if "$candidate" -c "import sys" 2>/dev/null; then BASE="$candidate"; break; fi
done
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV with $("$BASE" --version)" >&2
    "$BASE" -m venv "$VENV" || { echo "error: $BASE -m venv failed (install python3-venv)" >&2; exit 1; }
fi
want="torch==$TORCH torchvision==$VISION $(sha256sum requirements.txt | cut -c1-16)"
if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$want" ]; then
    echo "installing torch $TORCH, torchvision $VISION and requirements.txt's other packages (about 3 GB, once)" >&2
    grep -v -E '^(torch|torchvision)[<>=!~ ]' requirements.txt > "$VENV/requirements-rest.txt"
    "$VENV/bin/python" -m pip install -q "torch==$TORCH" "torchvision==$VISION" -r "$VENV/requirements-rest.txt" || {
        echo "error: pip install of torch $TORCH / torchvision $VISION failed" >&2; exit 1; }
    echo "$want" > "$VENV/.installed"
fi
"$VENV/bin/python" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
PY="$VENV/bin/python"
"$PY" -m pytest -m "not slow" -q "$@"
rm -rf "$VENV/gpu_check_out"     # the dry run refuses a folder that holds a report
PY="$PY" bash scripts/gpu_check.sh --dry-run --out "$VENV/gpu_check_out"
echo "the GPU image's versions: the non-slow suite and the dry run passed (report: $VENV/gpu_check_out/gpu_report.md)"
