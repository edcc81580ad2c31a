#!/usr/bin/env bash
# The main job on the bundled digits, on a CPU in 1.5 to 3 minutes (after the one-time install):
# SupCon pre-training of resnet_tiny, then linear evaluation of the frozen encoder.
# The last line printed is the test accuracy.     bash scripts/demo.sh [SEED]
# PRETRAIN_EPOCHS and LINEAR_EPOCHS (default 30 and 10) shorten it, DEMO_OUT (default save/demo/seed_SEED) moves
# its output: the test suite runs 2 + 1 epochs into a temporary folder.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="${DEMO_OUT:-save/demo/seed_${SEED}}"
rm -rf "$OUT"
"$PY" main_supcon.py --dataset digits --model resnet_tiny --epochs "${PRETRAIN_EPOCHS:-30}" --batch_size 128 \
    --learning_rate 0.2 --temp 0.1 --cosine --num_workers 0 --seed "$SEED" --save_folder "$OUT/pretrain"
CKPT="$(find "$OUT/pretrain" -name last.pth | head -n 1)"
"$PY" main_linear.py --dataset digits --ckpt "$CKPT" --epochs "${LINEAR_EPOCHS:-10}" --batch_size 128 \
    --learning_rate 1 --probe_norm none --cosine --num_workers 0 --seed "$SEED" --save_folder "$OUT/linear"
RESULTS="$(find "$OUT/linear" -name results.json | head -n 1)"
"$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"digits test accuracy (SupCon + linear eval, seed $SEED): {r['final_test_acc']:.2f} %\")" "$RESULTS"
