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
    LINEAR_EPOCHS=10 digits_run "$OUT/$LOSS" "$SEED" main_supcon.py --method SimCLR --simclr_loss "$LOSS" \
        "${SCALE[@]}" --epochs 30 --learning_rate 0.2
done
"$PY" compare.py "NT-Xent=$OUT/ntxent/linear" "NT-Logistic=$OUT/ntlogistic/linear" \
    "Marginal Triplet=$OUT/margin_triplet/linear"
