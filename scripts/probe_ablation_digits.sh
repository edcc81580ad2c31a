#!/usr/bin/env bash
# Probes that can tell the methods apart (docs/PROBES.md): SupCon, SimCLR, RASCAL (agreement / current /
# uniform), SupCon + CARROT, CE, CE + CARROT and the published variants (docs/FIELD.md: KCL, SINCERE,
# EpsSupInfoNCE, SupDCL, Spread, BCL, PaCo, TSC; one-stage CE + SupCon; logit-adjusted CE and balanced softmax),
# each pre-trained on the 5 coarse digit groups (coarse-to-fine) with 0, 20 % and 40 % symmetric label noise and
# 40 % pair-flip noise on the coarse labels; then, on the frozen encoder and clean fine labels, 1-, 5- and 10-shot
# fine probes (logistic regression and kNN, 5 draws each) and within-superclass fine accuracy. Prints, per noise
# level and K, the table with each method's paired difference from SupCon over seeds (and within-superclass
# accuracy the same way); saves them under save/probe_ablation_digits/.
# A noise level is a fraction (symmetric) or pairflip_FRACTION. One (seed, noise level) of one method takes 2-3
# minutes with two at a time on a 2-core CPU: the default (19 methods, 5 seeds, 4 levels: 380 pre-trainings and 1140
# probes) takes about 8 hours there (two runs at a time, one thread each); JOBS=N runs N at a time on a larger
# machine, METHODS="..." picks methods (SupCon, the baseline, must be among them), and EXTRA="flags" adds flags to every
# pre-training (e.g. EXTRA="--augment device" on a GPU); KEEP_DONE=1 keeps the runs a previous call finished
# (an interrupted ablation continues where it stopped).
#   bash scripts/probe_ablation_digits.sh [EPOCHS] [SEEDS] [NOISES]
#       defaults: 10 "0 1 2 3 4" "0 0.2 0.4 pairflip_0.4"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-10}"
SEEDS="${2:-0 1 2 3 4}"
NOISES="${3:-0 0.2 0.4 pairflip_0.4}"
JOBS="${JOBS:-2}"
EXTRA="${EXTRA:-}"
SHOTS="1 5 10"
OUT="${OUT_FOLDER:-save/probe_ablation_digits}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)

declare -A ARGS=(
    [SupCon]="main_supcon.py --method SupCon"
    [SimCLR]="main_supcon.py --method SimCLR"
    [RASCAL-agreement]="main_supcon.py --method RASCAL --rascal_weighting agreement"
    [RASCAL-current]="main_supcon.py --method RASCAL --rascal_weighting current"
    [RASCAL-uniform]="main_supcon.py --method RASCAL --rascal_weighting uniform"
    [SupCon+CARROT]="main_supcon.py --method SupCon --carrot"
    [CE]="main_ce.py"
    [CE+CARROT]="main_ce.py --carrot"
    [KCL]="main_supcon.py --method KCL"
    [SINCERE]="main_supcon.py --method SINCERE"
    [EpsSupInfoNCE]="main_supcon.py --method EpsSupInfoNCE"
    [SupDCL]="main_supcon.py --method SupDCL"
    [Spread]="main_supcon.py --method Spread"
    [BCL]="main_supcon.py --method BCL"
    [PaCo]="main_supcon.py --method PaCo --queue_size 1024 --moco_m 0.99"
    [TSC]="main_supcon.py --method TSC"
    [CE+SupCon]="main_ce.py --supcon_weight 1 --temp 0.1"
    [LA-CE]="main_ce.py --loss logit_adjusted"
    [BSM]="main_ce.py --loss balanced_softmax"
)
METHODS="${METHODS:-SupCon SimCLR RASCAL-agreement RASCAL-current RASCAL-uniform SupCon+CARROT CE CE+CARROT KCL SINCERE EpsSupInfoNCE SupDCL Spread BCL PaCo TSC CE+SupCon LA-CE BSM}"
for method in $METHODS; do
    [ -n "${ARGS[$method]+x}" ] || { echo "unknown method $method (one of: ${!ARGS[*]})" >&2; exit 2; }
done

run_one() {   # METHOD NOISE SEED: coarse pre-training with label noise, then the probes on fine labels
    local method="$1" noise="$2" seed="$3"
    local dir="$OUT/noise_$noise/$method/seed_$seed"
    if [ -n "${KEEP_DONE:-}" ] && [ -f "$dir/shots_10/done" ]; then echo "kept: noise $noise $method seed $seed"; return; fi
    rm -rf "$dir"; mkdir -p "$dir"
    # shellcheck disable=SC2086
    set -- ${ARGS[$method]}
    local script="$1"; shift
    local hyper=(--learning_rate 0.2 --temp 0.1)
    [ "$script" = main_ce.py ] && hyper=(--learning_rate 0.1)
    local common=(--dataset digits --batch_size 128 --num_workers 0 --seed "$seed" --print_freq 1000)
    local noise_flags=(--label_noise "${noise#pairflip_}")
    [ "$noise" != "${noise#pairflip_}" ] && noise_flags+=(--label_noise_kind pairflip)
    {
        # shellcheck disable=SC2086
        "$PY" "$script" "${common[@]}" --cosine --epochs "$EPOCHS" "${hyper[@]}" "$@" --label_granularity coarse \
            "${noise_flags[@]}" $EXTRA --save_folder "$dir/pretrain"
        local ckpt; ckpt="$(find "$dir/pretrain" -name last.pth)"
        for k in $SHOTS; do
            local extra=(); [ "$k" = 10 ] && extra=(--within_superclass)
            "$PY" main_linear.py "${common[@]}" --ckpt "$ckpt" --shots "$k" --shot_draws 5 --shot_seed 0 \
                "${extra[@]}" --save_folder "$dir/shots_$k"
        done
        touch "$dir/shots_10/done"
    } > "$dir.log" 2>&1 || { echo "FAILED: $method noise $noise seed $seed (see $dir.log)"; return 1; }
    echo "done: noise $noise $method seed $seed ($(( $(date +%s) - START ))s)"
}

for noise in $NOISES; do
    for method in $METHODS; do
        for seed in $SEEDS; do
            in_background run_one "$method" "$noise" "$seed"
        done
    done
done
wait

for noise in $NOISES; do
    for k in $SHOTS; do
        ROWS=()
        for method in $METHODS; do ROWS+=("$method=$OUT/noise_$noise/$method/seed_*/shots_$k"); done
        echo
        echo "digits coarse-to-fine, label noise $noise, $EPOCHS epochs, $k-shot fine probes (5 draws), seeds: $SEEDS"
        "$PY" compare.py "${ROWS[@]}" --baseline SupCon --out "$OUT/noise_${noise}_shots_$k.md"
    done
    echo
    echo "digits coarse-to-fine, label noise $noise: within-superclass fine kNN accuracy, paired with SupCon"
    "$PY" compare.py "${ROWS[@]}" --baseline SupCon --paired_metric final_test_within_superclass_acc \
        --out "$OUT/noise_${noise}_within_superclass.md"
done
echo "total: $(( $(date +%s) - START ))s"
