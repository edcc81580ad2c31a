#!/usr/bin/env bash
# SupCon pre-training with SupContrast's recommended settings (ResNet-50, batch 1024).
#   bash scripts/supcon_cifar.sh [cifar10|cifar100] [more flags, e.g. --data_folder DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DATASET="${1:-cifar10}"; shift || true
"$PY" main_supcon.py --config configs/supcon_cifar.yaml --dataset "$DATASET" "$@"
