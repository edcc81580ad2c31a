#!/usr/bin/env bash
# RASCAL pre-training with SupContrast's recommended SupCon settings (ResNet-50, batch 1024, temp 0.1).
#   bash scripts/rascal_cifar.sh [cifar10|cifar100] [more flags, e.g. --rascal_weighting current]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DATASET="${1:-cifar10}"; shift || true
"$PY" main_supcon.py --config configs/rascal_cifar.yaml --dataset "$DATASET" "$@"
