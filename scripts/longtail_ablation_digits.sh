#!/usr/bin/env bash
# The long-tail ablation on digits_lt (LDAM's exponential profile, --imb_factor 0.1: 142 ... 14 training images per
# class; 0.01: 142 ... 1; the balanced test split): SupCon, one-stage CE + SupCon, BCL, PaCo, TSC, RASCAL and SupCon +
# CARROT (pre-trained on the long-tailed split, then a linear classifier on it: main_linear.py), and CE, logit-adjusted CE
# and balanced softmax (main_ce.py, end to end). Prints, per imbalance factor, overall test top-1 and many/medium/
# few-shot accuracy (> 100, 20-100, < 20 training images) as mean +- std over seeds, with each method's paired
# difference from SupCon and from logit-adjusted CE over seeds (compare.py --baseline); saves the tables under
# save/longtail_ablation_digits/. The linear stage is plain cross-entropy on the long-tailed split for every
# pre-trained encoder (docs/results.md says what that means for the comparison).
# One (seed, factor) of one method takes about a minute of one core; the default (10 methods, 5 seeds, 2 factors:
# 100 trainings) about 55 minutes on a 2-core CPU (two runs at a time, one thread each). JOBS=N runs N at a time,
# METHODS="..." picks methods (SupCon and LA-CE, the baselines, must be among them), KEEP_DONE=1 keeps the runs a
# previous call finished.
#   bash scripts/longtail_ablation_digits.sh [EPOCHS] [SEEDS] [FACTORS]     defaults: 15 "0 1 2 3 4" "0.1 0.01"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2 3 4}"
FACTORS="${3:-0.1 0.01}"
JOBS="${JOBS:-2}"
OUT="${OUT_FOLDER:-save/longtail_ablation_digits}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)

declare -A ARGS=(
    [SupCon]="main_supcon.py --method SupCon --temp 0.1"
    [CE+SupCon]="main_ce.py --supcon_weight 1 --temp 0.1"
    [BCL]="main_supcon.py --method BCL --temp 0.1"
    [PaCo]="main_supcon.py --method PaCo --temp 0.1 --queue_size 1024 --moco_m 0.99"
    [TSC]="main_supcon.py --method TSC --temp 0.1"
    [TSC-step]="main_supcon.py --method TSC --temp 0.1 --tsc_assign step"
    [RASCAL]="main_supcon.py --method RASCAL --temp 0.1"
    [SupCon+CARROT]="main_supcon.py --method SupCon --temp 0.1 --carrot"
    [CE]="main_ce.py"
    [LA-CE]="main_ce.py --loss logit_adjusted"
    [BSM]="main_ce.py --loss balanced_softmax"
)
METHODS="${METHODS:-SupCon CE+SupCon BCL PaCo TSC RASCAL SupCon+CARROT CE LA-CE BSM}"
for method in $METHODS; do
    [ -n "${ARGS[$method]+x}" ] || { echo "unknown method $method (one of: ${!ARGS[*]})" >&2; exit 2; }
done

run_one() {   # METHOD FACTOR SEED: train on digits_lt; a pre-trained encoder then gets a linear classifier
    local method="$1" factor="$2" seed="$3"
    local dir="$OUT/imb_$factor/$method/seed_$seed"
    if [ -n "${KEEP_DONE:-}" ] && [ -f "$dir/done" ]; then echo "kept: imb $factor $method seed $seed"; return; fi
    rm -rf "$dir"; mkdir -p "$dir"
    # shellcheck disable=SC2086
    set -- ${ARGS[$method]}
    local script="$1"; shift
    local lr=0.2; [ "$script" = main_ce.py ] && lr=0.1
    local common=(--dataset digits_lt --imb_factor "$factor" --batch_size 128 --num_workers 0 --seed "$seed"
                  --print_freq 1000)
    {
        "$PY" "$script" "${common[@]}" --cosine --epochs "$EPOCHS" --learning_rate "$lr" "$@" \
            --save_folder "$dir/train"
        if [ "$script" = main_supcon.py ]; then
            "$PY" main_linear.py "${common[@]}" --epochs 5 --learning_rate 1 --cosine \
                --ckpt "$(find "$dir/train" -name last.pth)" --save_folder "$dir/eval"
        fi
        touch "$dir/done"
    } > "$dir.log" 2>&1 || { echo "FAILED: $method imb $factor seed $seed (see $dir.log)"; return 1; }
    echo "done: imb $factor $method seed $seed ($(( $(date +%s) - START ))s)"
}

for factor in $FACTORS; do
    for method in $METHODS; do
        for seed in $SEEDS; do
            in_background run_one "$method" "$factor" "$seed"
        done
    done
done
wait

for factor in $FACTORS; do
    ROWS=()
    for method in $METHODS; do   # the evaluated results: the linear stage's, or main_ce.py's own
        # shellcheck disable=SC2086
        set -- ${ARGS[$method]}
        local_part=eval; [ "$1" = main_ce.py ] && local_part=train
        ROWS+=("$method=$OUT/imb_$factor/$method/seed_*/$local_part")
    done
    for baseline in SupCon LA-CE; do
        echo
        echo "digits_lt, --imb_factor $factor, $EPOCHS epochs, seeds: $SEEDS; paired with $baseline"
        "$PY" compare.py "${ROWS[@]}" --baseline "$baseline" --out "$OUT/imb_${factor}_vs_$baseline.md"
    done
done
echo "total: $(( $(date +%s) - START ))s"
