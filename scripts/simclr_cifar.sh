#!/usr/bin/env bash
# SimCLR pre-training with SupContrast's recommended settings (ResNet-50, batch 1024, temp 0.5).
# SupContrast also passes --syncBN: on several GPUs run it through scripts/torchrun.sh and add --syncBN.
#   bash scripts/simclr_cifar.sh [cifar10|cifar100] [more flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DATASET="${1:-cifar10}"; shift || true
"$PY" main_supcon.py --config configs/simclr_cifar.yaml --dataset "$DATASET" "$@"
