#!/usr/bin/env bash
# The SimCLR loss comparison of the background document (docs/USAGE.md, "The SimCLR loss family") on CIFAR-10: ResNet-50 (CIFAR stem),
# feature dim 128, batch 128, 100 epochs; NT-Xent and NT-Logistic at temperature 0.5, Marginal Triplet
# at margin 1. Then linear evaluation of each. Their figures: 83.87 / 80.94 / 81.00 % (see docs/USAGE.md).
# Their optimizer was Adam (sthalles/SimCLR); here it is SupContrast's SGD with a cosine schedule.
#   bash scripts/simclr_family_cifar.sh [more main_supcon.py flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
OUT="save/simclr_family_cifar10"
for LOSS in ntxent ntlogistic margin_triplet; do
    SCALE=(--temp 0.5); [ "$LOSS" = margin_triplet ] && SCALE=(--margin 1)
    "$PY" main_supcon.py --dataset cifar10 --model resnet50 --method SimCLR --simclr_loss "$LOSS" "${SCALE[@]}" \
        --feat_dim 128 --batch_size 128 --epochs 100 --learning_rate 0.05 --cosine \
        --save_folder "$OUT/$LOSS/pretrain" "$@"
    "$PY" main_linear.py --dataset cifar10 --ckpt "$(find "$OUT/$LOSS/pretrain" -name last.pth | head -1)" \
        --batch_size 256 --learning_rate 5 --probe_norm none --save_folder "$OUT/$LOSS/linear"
done
grep -H "final_test_acc" "$OUT"/*/linear/*/*/*/results.json
