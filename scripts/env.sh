# Sourced by the other scripts: sets PY to a Python with requirements.txt installed.
# $PY when set (a Python that has them already, e.g. a GPU image's python3) is used as it is, and so is an active
# virtualenv or conda environment; otherwise ./.venv is created and (re)installed whenever requirements.txt changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PY:-}" ]; then
    :
elif [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
    PY=python
else
    if [ ! -x "$ROOT/.venv/bin/python" ]; then
        echo "creating $ROOT/.venv" >&2
        python3 -m venv "$ROOT/.venv" || { echo "error: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
    fi
    PY="$ROOT/.venv/bin/python"
    stamp="$ROOT/.venv/.requirements.sha256"
    want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "installing requirements.txt into .venv (about 6 GB, once)" >&2
        "$PY" -m pip install -q -r "$ROOT/requirements.txt" || { echo "error: pip install -r requirements.txt failed" >&2; exit 1; }
        "$PY" -c "import torch, torchvision, sklearn, tensorboard, tqdm" || {     # once, after an install
            echo "error: torch/torchvision/sklearn/tensorboard/tqdm do not import in $PY; see requirements.txt" >&2; exit 1; }
        echo "$want" > "$stamp"
    fi
fi
# each call: the packages are there (found, not imported: importing torch and torchvision costs seconds of CPU)
"$PY" -c "import importlib.util as u, sys
missing = [m for m in ('torch', 'torchvision', 'sklearn', 'tensorboard', 'tqdm') if u.find_spec(m) is None]
sys.exit(f'error: {\", \".join(missing)} not installed in {sys.executable}; see requirements.txt' if missing else 0)" \
    || exit 1
export PYTHONUNBUFFERED=1
cd "$ROOT"
