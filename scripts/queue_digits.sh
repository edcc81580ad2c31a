#!/usr/bin/env bash
# Does a memory queue make up for a small batch? SupCon on digits at batch 32 without and with a queue of
# 1024 keys (momentum key encoder, m 0.99), next to SupCon at batch 128; the settings of
# scripts/ablation_digits.sh otherwise (15 epochs, resnet_tiny, cosine, lr 0.2, temperature 0.1; linear
# evaluation on the 10 classes, 5 epochs), 3 seeds. Prints the table (mean +- std over seeds) and saves it
# as save/queue_digits/table.md. About 15 minutes on a 2-core CPU (two runs at a time, one thread each).
#   bash scripts/queue_digits.sh [EPOCHS] [SEEDS]          defaults: 15 "0 1 2"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2}"
JOBS="${JOBS:-2}"
OUT="save/queue_digits"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)
rm -rf "$OUT"
declare -A ARGS=([batch-32]="--batch_size 32" [batch-32+queue-1024]="--batch_size 32 --queue_size 1024 --moco_m 0.99"
                 [batch-128]="--batch_size 128")
NAMES="batch-32 batch-32+queue-1024 batch-128"
run_one() {   # NAME SEED
    # shellcheck disable=SC2086
    digits_run "$OUT/$1/seed_$2" "$2" main_supcon.py --epochs "$EPOCHS" --learning_rate 0.2 --temp 0.1 ${ARGS[$1]} \
        > "$OUT/$1/seed_$2.log" 2>&1 && echo "done: $1 seed $2 ($(( $(date +%s) - START ))s)"
}

ROWS=()
for name in $NAMES; do
    ROWS+=("SupCon, $name=$OUT/$name/seed_*/linear")
    for seed in $SEEDS; do
        mkdir -p "$OUT/$name"
        in_background run_one "$name" "$seed"
    done
done
wait
echo
echo "digits, resnet_tiny, SupCon, $EPOCHS pre-training epochs, linear evaluation on the 10 digit classes, seeds: $SEEDS"
"$PY" compare.py "${ROWS[@]}" --train_metrics train/collapse/z_std_enc,train/queue/key_query_cos --out "$OUT/table.md"
echo "total: $(( $(date +%s) - START ))s"
