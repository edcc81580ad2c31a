#!/usr/bin/env bash
# Issue 42's comparison on digits: a tiny ViT (timm's vit_tiny_patch16_224 with 4 blocks, width 96, 3 heads,
# patches of 4 px at 16 px) against resnet_tiny, for SupCon (then a linear probe) and CE; and, for SupCon's
# resnet_tiny encoder, the linear probe against fine-tuning, each on all labels and on 10 % of them
# (--label_fraction 0.1). ResNets train with SGD (lr 0.2 SupCon, 0.1 CE), the ViT with AdamW (lr 1e-3, weight decay
# 0.05, biases and norms excluded), as each is usually trained; batch 128, cosine, --augment device, EPOCHS epochs.
# Prints the tables (mean +- std over seeds) and saves them under save/backbones_digits/.
#   bash scripts/backbones_digits.sh [EPOCHS] [SEEDS]      defaults: 15 "0 1 2"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
EPOCHS="${1:-15}"
SEEDS="${2:-0 1 2}"
JOBS="${JOBS:-2}"
OUT="${OUT_FOLDER:-save/backbones_digits}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
START=$(date +%s)
COMMON=(--dataset digits --batch_size 128 --num_workers 0 --cosine --augment device --print_freq 1000)
VIT=(--model timm:vit_tiny_patch16_224 --model_args depth=4,patch_size=4,embed_dim=96,num_heads=3
     --optimizer adamw --learning_rate 0.001 --weight_decay 0.05 --exclude_bias_norm)
RESNET=(--model resnet_tiny)

train_one() {   # NAME SCRIPT SEED [flags]: train, then (SupCon) the linear probe
    local name="$1" script="$2" seed="$3"; shift 3
    local dir="$OUT/$name/seed_$seed"
    rm -rf "$dir"; mkdir -p "$dir"
    {
        local lr=(); [ "$name" = SupCon-resnet ] && lr=(--learning_rate 0.2)
        [ "$name" = CE-resnet ] && lr=(--learning_rate 0.1)
        "$PY" "$script" "${COMMON[@]}" --seed "$seed" --epochs "$EPOCHS" "${lr[@]}" "$@" --save_folder "$dir/train"
        if [ "$script" = main_supcon.py ]; then
            "$PY" main_linear.py "${COMMON[@]}" --seed "$seed" --epochs 5 --learning_rate 1 \
                --ckpt "$(find "$dir/train" -name last.pth)" --save_folder "$dir/eval"
        fi
    } > "$dir.log" 2>&1 || { echo "FAILED: $name seed $seed (see $dir.log)"; return 1; }
    echo "done: $name seed $seed ($(( $(date +%s) - START ))s)"
}

evaluate_one() {   # NAME SEED [flags]: an evaluation of SupCon's resnet_tiny encoder of that seed
    local name="$1" seed="$2"; shift 2
    local dir="$OUT/$name/seed_$seed"
    rm -rf "$dir"; mkdir -p "$dir"
    "$PY" main_linear.py "${COMMON[@]}" --seed "$seed" --epochs 5 \
        --ckpt "$(find "$OUT/SupCon-resnet/seed_$seed/train" -name last.pth)" "$@" --save_folder "$dir/eval" \
        > "$dir.log" 2>&1 || { echo "FAILED: $name seed $seed (see $dir.log)"; return 1; }
    echo "done: $name seed $seed ($(( $(date +%s) - START ))s)"
}

for seed in $SEEDS; do
    in_background train_one SupCon-resnet main_supcon.py "$seed" "${RESNET[@]}" --temp 0.1
    in_background train_one SupCon-vit main_supcon.py "$seed" "${VIT[@]}" --temp 0.1
    in_background train_one CE-resnet main_ce.py "$seed" "${RESNET[@]}"
    in_background train_one CE-vit main_ce.py "$seed" "${VIT[@]}"
done
wait
for seed in $SEEDS; do
    in_background evaluate_one linear-10pct "$seed" --learning_rate 1 --label_fraction 0.1
    in_background evaluate_one finetune "$seed" --learning_rate 0.1 --finetune --encoder_lr 0.01
    in_background evaluate_one finetune-10pct "$seed" --learning_rate 0.1 --finetune --encoder_lr 0.01 \
        --label_fraction 0.1
done
wait

echo
echo "digits, $EPOCHS epochs, seeds: $SEEDS; backbones"
"$PY" compare.py SupCon-resnet_tiny="$OUT/SupCon-resnet/seed_*/eval" SupCon-ViT="$OUT/SupCon-vit/seed_*/eval" \
    CE-resnet_tiny="$OUT/CE-resnet/seed_*/train" CE-ViT="$OUT/CE-vit/seed_*/train" --out "$OUT/backbones.md"
echo
echo "SupCon's resnet_tiny encoder: linear probe and fine-tuning (5 epochs), all labels and 10 %"
"$PY" compare.py linear="$OUT/SupCon-resnet/seed_*/eval" linear-10pct="$OUT/linear-10pct/seed_*/eval" \
    finetune="$OUT/finetune/seed_*/eval" finetune-10pct="$OUT/finetune-10pct/seed_*/eval" \
    --baseline linear --out "$OUT/evaluations.md"
echo "total: $(( $(date +%s) - START ))s"
