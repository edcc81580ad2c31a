#!/usr/bin/env bash
# SupCon with a label-aware memory queue and a momentum key encoder (docs/QUEUE.md): SupContrast's CIFAR
# settings (ResNet-50, lr 0.5, temperature 0.1, cosine) with batch 256 and a queue of 8192 keys (MoCo's
# momentum 0.999), instead of batch 1024.
#   bash scripts/supcon_queue_cifar.sh [cifar10|cifar100] [more flags, e.g. --data_folder DIR --method RASCAL]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DATASET="${1:-cifar10}"; shift || true
"$PY" main_supcon.py --config configs/supcon_queue_cifar.yaml --dataset "$DATASET" "$@"
