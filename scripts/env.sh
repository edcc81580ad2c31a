# Sourced by the other scripts: sets PY to a Python with requirements.txt installed.
# With a virtualenv or conda environment already active, that one is used as it is;
# otherwise ./.venv is created and (re)installed whenever requirements.txt changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
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
        echo "installing requirements.txt into .venv (about 5 GB, once)" >&2
        "$PY" -m pip install -q -r "$ROOT/requirements.txt" || { echo "error: pip install -r requirements.txt failed" >&2; exit 1; }
        echo "$want" > "$stamp"
    fi
fi
"$PY" -c "import torch, torchvision, sklearn, tensorboard, tqdm" || {
    echo "error: torch/torchvision do not import; see requirements.txt for the matching pair" >&2; exit 1; }
export PYTHONUNBUFFERED=1
cd "$ROOT"

# digits_run DIR SEED SCRIPT [flags]: SCRIPT on digits (batch 128, cosine, no workers) into DIR/pretrain,
# then, for main_supcon.py, linear evaluation of its last.pth on the 10 digit classes into DIR/linear
# (5 epochs unless LINEAR_EPOCHS is set, lr 1). CE runs are evaluated by main_ce.py itself.
digits_run() {
    local dir="$1" seed="$2" script="$3"; shift 3
    local common=(--dataset digits --batch_size 128 --cosine --num_workers 0 --seed "$seed" --print_freq 1000)
    "$PY" "$script" "${common[@]}" --save_folder "$dir/pretrain" "$@"
    if [ "$script" = main_supcon.py ] || [ "${LINEAR_ALWAYS:-0}" = 1 ]; then
        "$PY" main_linear.py "${common[@]}" --epochs "${LINEAR_EPOCHS:-5}" --learning_rate 1 \
            --ckpt "$(find "$dir/pretrain" -name last.pth)" --save_folder "$dir/linear"
    fi
}

# in_background CMD [args]: CMD as a background job of this shell once fewer than JOBS (default 2) of its jobs
# run (the ablation scripts' runs, one thread each); the script ends with `wait`.
in_background() {
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n; done
    "$@" &
}
