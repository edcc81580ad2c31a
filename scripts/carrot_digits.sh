#!/usr/bin/env bash
# CARROT on digits: SupCon vs SupCon + CARROT (linear eval), and CE vs CE + CARROT; accuracy, NLL, ECE.
# About 6 minutes on 2 CPU cores.       bash scripts/carrot_digits.sh [SEED]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="save/carrot_digits/seed_${SEED}"
rm -rf "$OUT"
COMMON=(--dataset digits --batch_size 128 --cosine --num_workers 0 --seed "$SEED" --print_freq 1000)
for V in plain carrot; do
    FLAG=(); [ "$V" = carrot ] && FLAG=(--carrot)
    "$PY" main_supcon.py "${COMMON[@]}" --epochs 30 --learning_rate 0.2 --temp 0.1 "${FLAG[@]}" \
        --save_folder "$OUT/supcon_$V/pretrain"
    "$PY" main_linear.py "${COMMON[@]}" --epochs 10 --learning_rate 1 \
        --ckpt "$(find "$OUT/supcon_$V/pretrain" -name last.pth)" --save_folder "$OUT/supcon_$V/linear"
    "$PY" main_ce.py "${COMMON[@]}" --epochs 30 --learning_rate 0.05 "${FLAG[@]}" --save_folder "$OUT/ce_$V"
done
"$PY" - "$OUT" <<'PYEOF'
import csv, glob, os, sys
out = sys.argv[1]
print(f'{"run":16s} {"test top-1":>10s} {"NLL":>8s} {"ECE":>8s}')
for name in ('supcon_plain', 'supcon_carrot', 'ce_plain', 'ce_carrot'):
    path = [p for p in glob.glob(os.path.join(out, name, '**', 'metrics.csv'), recursive=True)
            if 'pretrain' not in p][0]
    last = list(csv.DictReader(open(path)))[-1]
    print(f'{name:16s} {float(last["test/acc"]):10.2f} {float(last["test/nll"]):8.4f} {float(last["test/ece"]):8.4f}')
PYEOF
