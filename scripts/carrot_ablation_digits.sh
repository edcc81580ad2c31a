#!/usr/bin/env bash
# The CARROT remedy ablation on digits: SupCon + CARROT on the encoder and on the head, RASCAL + CARROT
# and CE + CARROT, each with the balanced weight uncapped (--carrot_alpha_max inf), capped at 10, capped
# at 1 (the default), and with a fixed --carrot_weight 1; next to the same methods without CARROT. Each
# pre-trained on the 10 digit classes ("plain") and on 5 coarse digit groups ("coarse-to-fine"), then
# linearly evaluated on the 10 digit classes, 5 seeds each, with the settings of scripts/ablation_digits.sh
# (15 epochs, resnet_tiny, batch 128, cosine; lr 0.2 and temperature 0.1, lr 0.1 for CE).
# Prints the table (mean +- std over seeds, collapse-warning counts, the collapse monitor and CARROT's
# lower wall at the last pre-training epoch) and saves it as save/carrot_ablation_digits/table.md.
# The runs that scripts/ablation_digits.sh makes too (the methods without CARROT, and SupCon/CE + CARROT
# with the default cap 1) are taken from save/ablation_digits when it holds them for the same epochs.
# About 35 minutes on a 2-core CPU after ablation_digits.sh (two runs at a time, one thread each).
#   bash scripts/carrot_ablation_digits.sh [EPOCHS] [SEEDS]          defaults: 15 "0 1 2 3 4"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2 3 4}"
JOBS="${JOBS:-2}"
OUT="save/carrot_ablation_digits"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)
rm -rf "$OUT"

declare -A BASE=(
    [SupCon-enc]="main_supcon.py --method SupCon --carrot"
    [SupCon-head]="main_supcon.py --method SupCon --carrot --carrot_on head"
    [RASCAL]="main_supcon.py --method RASCAL --carrot"
    [CE]="main_ce.py --carrot"
)
declare -A PLAIN=([SupCon]="main_supcon.py --method SupCon" [RASCAL]="main_supcon.py --method RASCAL" [CE]="main_ce.py")
declare -A VARIANT=([cap-inf]="--carrot_alpha_max inf" [cap-10]="--carrot_alpha_max 10" [cap-1]=""
                    [fixed-1]="--carrot_weight 1")
VARIANTS="cap-inf cap-10 cap-1 fixed-1"

# the same runs in scripts/ablation_digits.sh
declare -A REUSE=([SupCon]=SupCon [RASCAL]=RASCAL-agreement [CE]=CE [SupCon-enc+CARROT-cap-1]=SupCon+CARROT
                  [CE+CARROT-cap-1]=CE+CARROT)

reused() {   # NAME SETTING SEED: copy the run from save/ablation_digits if it is there for $EPOCHS epochs
    local from="save/ablation_digits/$2/${REUSE[$1]:-none}/seed_$3"
    [ -d "$from/linear" ] && [ -n "$(find "$from/linear" -name results.json)" ] || return 1
    local metrics; metrics="$(find "$from/pretrain" -name metrics.csv | head -n 1)"
    [ -n "$metrics" ] && [ "$(tail -n 1 "$metrics" | cut -d, -f1)" = "$EPOCHS" ] || return 1
    mkdir -p "$OUT/$2/$1" && cp -r "$from" "$OUT/$2/$1/seed_$3"
    echo "reused: $2 $1 seed $3 (from $from)"
}

run_one() {   # NAME SETTING SEED ARGS...: pre-train, then linear evaluation on the 10 digit classes
    local name="$1" setting="$2" seed="$3"; shift 3
    reused "$name" "$setting" "$seed" && return 0
    local dir="$OUT/$setting/$name/seed_$seed" granularity=fine
    [ "$setting" = coarse-to-fine ] && granularity=coarse
    local script="$1"; shift
    local hyper=(--learning_rate 0.2 --temp 0.1)
    [ "$script" = main_ce.py ] && hyper=(--learning_rate 0.1)
    mkdir -p "$(dirname "$dir")"
    LINEAR_ALWAYS=1 digits_run "$dir" "$seed" "$script" "$@" --label_granularity "$granularity" \
        --epochs "$EPOCHS" "${hyper[@]}" > "$dir.log" 2>&1
    echo "done: $setting $name seed $seed ($(( $(date +%s) - START ))s)"
}

ROWS=()
for setting in plain coarse-to-fine; do
    for method in SupCon RASCAL CE; do
        ROWS+=("$method, $setting=$OUT/$setting/$method/seed_*/linear")
        for seed in $SEEDS; do
            # shellcheck disable=SC2086
            in_background run_one "$method" "$setting" "$seed" ${PLAIN[$method]}
        done
    done
    for base in SupCon-enc SupCon-head RASCAL CE; do
        for v in $VARIANTS; do
            ROWS+=("$base + CARROT $v, $setting=$OUT/$setting/$base+CARROT-$v/seed_*/linear")
            for seed in $SEEDS; do
                # shellcheck disable=SC2086
                in_background run_one "$base+CARROT-$v" "$setting" "$seed" ${BASE[$base]} ${VARIANT[$v]}
            done
        done
    done
done
wait

echo
echo "digits, resnet_tiny, $EPOCHS pre-training epochs, linear evaluation on the 10 digit classes, seeds: $SEEDS"
"$PY" compare.py "${ROWS[@]}" --train_metrics train/collapse/z_std_enc,train/carrot/L,train/carrot/alpha \
    --out "$OUT/table.md"
echo "total: $(( $(date +%s) - START ))s"
