#!/usr/bin/env bash
# --augment cpu against --augment device: SupCon on digits (15 epochs, lr 0.2, temp 0.1, as in
# ablation_digits.sh), then the same linear evaluation for both (5 epochs, --augment cpu), 3 seeds each. Prints the
# table (mean +- std over seeds) and saves it as save/augment_digits/table.md. About 5 minutes on a 2-core CPU.
#   bash scripts/augment_digits.sh [EPOCHS] [SEEDS] [DEVICE]     defaults: 15 "0 1 2" auto
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2}"
DEVICE="${3:-auto}"
OUT="save/augment_digits"
START=$(date +%s)
rm -rf "$OUT"
ROWS=()
for augment in cpu device; do
    for seed in $SEEDS; do
        dir="$OUT/$augment/seed_$seed"
        mkdir -p "$dir"
        digits_run "$dir" "$seed" main_supcon.py --method SupCon --epochs "$EPOCHS" --learning_rate 0.2 \
            --temp 0.1 --augment "$augment" --device "$DEVICE" > "$dir.log" 2>&1
        echo "done: $augment seed $seed ($(( $(date +%s) - START ))s)"
    done
    ROWS+=("SupCon --augment $augment=$OUT/$augment/seed_*/linear")
done
echo
echo "digits, resnet_tiny, SupCon $EPOCHS epochs, linear evaluation 5 epochs, seeds: $SEEDS, device: $DEVICE"
"$PY" compare.py "${ROWS[@]}" --baseline "SupCon --augment cpu" --out "$OUT/table.md"
echo "total: $(( $(date +%s) - START ))s"
