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
    supcon|rascal) "$PY" main_supcon.py --config "configs/carrot_${KIND}_cifar.yaml" --dataset "$DATASET" "$@" ;;
    ce) "$PY" main_ce.py --config configs/carrot_ce_cifar.yaml --dataset "$DATASET" "$@" ;;
    *) echo "carrot_cifar.sh: error: first argument must be supcon, rascal or ce" >&2; exit 2 ;;
esac
