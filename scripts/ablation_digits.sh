#!/usr/bin/env bash
# The ablation that tests our own methods on digits: SupCon, SimCLR, RASCAL (agreement, current,
# uniform), SupCon + CARROT, CE, CE + CARROT (CARROT with its defaults); each pre-trained on the 10
# digit classes ("plain") and on 5 coarse digit groups ("coarse-to-fine"), then linearly evaluated on
# the 10 digit classes; 5 seeds each (160 runs). Prints the comparison table (mean +- std over seeds,
# with the collapse monitor of the pre-training's last epoch) and saves it as
# save/ablation_digits/table.md, then per setting the paired difference of each method from SupCon over seeds
# (compare.py --baseline). About 30 minutes on a 2-core CPU (two runs at a time, one thread each).
#   bash scripts/ablation_digits.sh [EPOCHS] [SEEDS]          defaults: 15 "0 1 2 3 4"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2 3 4}"
JOBS="${JOBS:-2}"
OUT="save/ablation_digits"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)
rm -rf "$OUT"

declare -A ARGS=(
    [SupCon]="main_supcon.py --method SupCon"
    [SimCLR]="main_supcon.py --method SimCLR"
    [RASCAL-agreement]="main_supcon.py --method RASCAL --rascal_weighting agreement"
    [RASCAL-current]="main_supcon.py --method RASCAL --rascal_weighting current"
    [RASCAL-uniform]="main_supcon.py --method RASCAL --rascal_weighting uniform"
    [SupCon+CARROT]="main_supcon.py --method SupCon --carrot"
    [CE]="main_ce.py"
    [CE+CARROT]="main_ce.py --carrot"
)
METHODS="SupCon SimCLR RASCAL-agreement RASCAL-current RASCAL-uniform SupCon+CARROT CE CE+CARROT"

run_one() {   # METHOD SETTING SEED: pre-train, then linear evaluation on the 10 digit classes
    local method="$1" setting="$2" seed="$3"
    local dir="$OUT/$setting/$method/seed_$seed" granularity=fine
    [ "$setting" = coarse-to-fine ] && granularity=coarse
    # shellcheck disable=SC2086
    set -- ${ARGS[$method]}
    local script="$1"; shift
    local hyper=(--learning_rate 0.2 --temp 0.1)
    [ "$script" = main_ce.py ] && hyper=(--learning_rate 0.1)
    LINEAR_ALWAYS=1 digits_run "$dir" "$seed" "$script" "$@" --label_granularity "$granularity" \
        --epochs "$EPOCHS" "${hyper[@]}" > "$dir.log" 2>&1
    echo "done: $setting $method seed $seed ($(( $(date +%s) - START ))s)"
}

mkdir -p "$OUT"
for setting in plain coarse-to-fine; do
    for method in $METHODS; do
        for seed in $SEEDS; do
            mkdir -p "$OUT/$setting/$method"
            in_background run_one "$method" "$setting" "$seed"
        done
    done
done
wait

ROWS=()
for setting in plain coarse-to-fine; do
    for method in $METHODS; do
        ROWS+=("$method, $setting=$OUT/$setting/$method/seed_*/linear")
    done
done
echo
echo "digits, resnet_tiny, $EPOCHS pre-training epochs, linear evaluation on the 10 digit classes, seeds: $SEEDS"
"$PY" compare.py "${ROWS[@]}" --train_metrics train/collapse/z_std_enc --out "$OUT/table.md"
for setting in plain coarse-to-fine; do
    PAIRED=()
    for method in $METHODS; do PAIRED+=("$method, $setting=$OUT/$setting/$method/seed_*/linear"); done
    echo
    echo "$setting: paired differences from SupCon over seeds"
    "$PY" compare.py "${PAIRED[@]}" --baseline "SupCon, $setting" --out "$OUT/paired_$setting.md"
done
echo "total: $(( $(date +%s) - START ))s"
