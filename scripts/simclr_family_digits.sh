#!/usr/bin/env bash
# The SimCLR loss comparison (NT-Xent, NT-Logistic, Marginal Triplet) on the bundled digits, with the
# background document's temperature 0.5 / margin 1 and the demo's schedule; prints a table. ~4 min on 2 CPU cores.
#   bash scripts/simclr_family_digits.sh [SEED]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="save/simclr_family_digits/seed_${SEED}"
rm -rf "$OUT"
for LOSS in ntxent ntlogistic margin_triplet; do
    SCALE=(--temp 0.5); [ "$LOSS" = margin_triplet ] && SCALE=(--margin 1)
    "$PY" main_supcon.py --dataset digits --method SimCLR --simclr_loss "$LOSS" "${SCALE[@]}" --epochs 30 \
        --batch_size 128 --learning_rate 0.2 --cosine --num_workers 0 --seed "$SEED" \
        --save_folder "$OUT/$LOSS/pretrain" --print_freq 1000
    "$PY" main_linear.py --dataset digits --ckpt "$(find "$OUT/$LOSS/pretrain" -name last.pth)" --epochs 10 \
        --batch_size 128 --learning_rate 1 --cosine --num_workers 0 --seed "$SEED" \
        --save_folder "$OUT/$LOSS/linear" --print_freq 1000
done
"$PY" - "$OUT" <<'PYEOF'
import glob, json, os, sys
out = sys.argv[1]
print(f'{"loss":15s} {"test top-1":>10s}')
for loss in ('ntxent', 'ntlogistic', 'margin_triplet'):
    res = json.load(open(glob.glob(os.path.join(out, loss, 'linear', '**', 'results.json'), recursive=True)[0]))
    print(f'{loss:15s} {res["final_test_acc"]:10.2f}')
PYEOF
