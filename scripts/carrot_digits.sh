#!/usr/bin/env bash
# CARROT on digits: SupCon vs SupCon + CARROT (linear eval), and CE vs CE + CARROT; accuracy, NLL, ECE.
# About 6 minutes on 2 CPU cores.       bash scripts/carrot_digits.sh [SEED]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="save/carrot_digits/seed_${SEED}"
rm -rf "$OUT"
for V in plain carrot; do
    FLAG=(); [ "$V" = carrot ] && FLAG=(--carrot)
    LINEAR_EPOCHS=10 digits_run "$OUT/supcon_$V" "$SEED" main_supcon.py --epochs 30 --learning_rate 0.2 \
        --temp 0.1 "${FLAG[@]}"
    digits_run "$OUT/ce_$V" "$SEED" main_ce.py --epochs 30 --learning_rate 0.05 "${FLAG[@]}"
done
"$PY" compare.py "SupCon=$OUT/supcon_plain/linear" "SupCon + CARROT=$OUT/supcon_carrot/linear" \
    "CE=$OUT/ce_plain" "CE + CARROT=$OUT/ce_carrot"
