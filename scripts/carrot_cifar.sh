#!/usr/bin/env bash
# CARROT launchers with SupContrast's recommended settings (ResNet-50, batch 1024):
#   bash scripts/carrot_cifar.sh supcon [cifar10|cifar100] [flags]   # SupCon + CARROT (on the encoder)
#   bash scripts/carrot_cifar.sh rascal [cifar10|cifar100] [flags]   # RASCAL + CARROT
#   bash scripts/carrot_cifar.sh ce     [cifar10|cifar100] [flags]   # cross-entropy + CARROT
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
KIND="${1:?usage: carrot_cifar.sh supcon|rascal|ce [dataset] [flags]}"; shift
DATASET="${1:-cifar10}"; shift || true
case "$KIND" in
    supcon|rascal)
        METHOD=SupCon; [ "$KIND" = rascal ] && METHOD=RASCAL
        "$PY" main_supcon.py --dataset "$DATASET" --model resnet50 --batch_size 1024 --learning_rate 0.5 \
            --temp 0.1 --cosine --method "$METHOD" --carrot "$@" ;;
    ce)
        "$PY" main_ce.py --dataset "$DATASET" --model resnet50 --batch_size 1024 --learning_rate 0.8 \
            --cosine --carrot "$@" ;;
    *) echo "carrot_cifar.sh: error: first argument must be supcon, rascal or ce" >&2; exit 2 ;;
esac
