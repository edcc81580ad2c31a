#!/usr/bin/env bash
# Linear evaluation with SupContrast's settings: batch 512, lr 5 (use --learning_rate 1 for SimCLR).
#   bash scripts/linear_cifar.sh CKPT [cifar10|cifar100] [more flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
CKPT="${1:?usage: linear_cifar.sh CKPT [cifar10|cifar100] [flags]}"; shift
DATASET="${1:-cifar10}"; shift || true
"$PY" main_linear.py --config configs/linear_cifar.yaml --dataset "$DATASET" --ckpt "$CKPT" "$@"
