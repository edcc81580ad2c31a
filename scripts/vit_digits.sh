#!/usr/bin/env bash
# The tiny ViT recipe on the bundled digits (configs/digits_vit_*.yaml): cross-entropy, and SupCon with linear
# evaluation, for each seed; then the table (compare.py, mean +- std over seeds). About 8 minutes for 3 seeds on a
# 2-core CPU (two runs at a time, one thread each).
#   bash scripts/vit_digits.sh [SEEDS]          default: "0 1 2"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEEDS="${1:-0 1 2}"
OUT="${OUT_FOLDER:-save/vit_digits}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)
rm -rf "$OUT"

run_one() {   # KIND SEED
    local kind="$1" seed="$2" dir="$OUT/$1/seed_$2"
    mkdir -p "$dir"
    {
        if [ "$kind" = CE ]; then
            "$PY" main_ce.py --config configs/digits_vit_ce.yaml --seed "$seed" --print_freq 1000 --save_folder "$dir/train"
        else
            "$PY" main_supcon.py --config configs/digits_vit_supcon.yaml --seed "$seed" --print_freq 1000 \
                --save_folder "$dir/train"
            "$PY" main_linear.py --config configs/digits_vit_linear.yaml --seed "$seed" --print_freq 1000 \
                --ckpt "$(find "$dir/train" -name last.pth)" --save_folder "$dir/eval"
        fi
    } > "$dir.log" 2>&1 || { echo "FAILED: $kind seed $seed (see $dir.log)"; return 1; }
    echo "done: $kind seed $seed ($(( $(date +%s) - START ))s)"
}

for seed in $SEEDS; do
    in_background run_one SupCon "$seed"
    in_background run_one CE "$seed"
done
wait
"$PY" compare.py "tiny ViT, SupCon + linear=$OUT/SupCon/seed_*/eval" "tiny ViT, CE=$OUT/CE/seed_*/train"
echo "total: $(( $(date +%s) - START ))s"
