#!/usr/bin/env bash
# Cross-entropy baseline with SupContrast's recommended settings (ResNet-50, batch 1024, lr 0.8).
# SupContrast also passes --syncBN: on several GPUs run it through scripts/torchrun.sh and add --syncBN.
#   bash scripts/ce_cifar.sh [cifar10|cifar100] [more flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DATASET="${1:-cifar10}"; shift || true
"$PY" main_ce.py --config configs/ce_cifar.yaml --dataset "$DATASET" "$@"
