#!/usr/bin/env bash
# Multi-GPU (or multi-process CPU) launcher: torchrun, one process per device, for any of the scripts.
# --batch_size stays the global batch (split over all processes); the contrastive losses see all of it.
#   bash scripts/torchrun.sh NPROC main_supcon.py --dataset cifar10 --batch_size 1024 --syncBN ...
# Several nodes (run on each, same MASTER_ADDR/MASTER_PORT, NODE_RANK 0..NNODES-1; a shared save folder):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 bash scripts/torchrun.sh 8 main_supcon.py ...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
NPROC="${1:?usage: torchrun.sh NPROC main_supcon.py|main_ce.py|main_linear.py [flags]}"; shift
SCRIPT="${1:?usage: torchrun.sh NPROC SCRIPT [flags]}"; shift
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
if [ "${NNODES:-1}" -gt 1 ]; then
    exec "$PY" -m torch.distributed.run --nproc_per_node "$NPROC" --nnodes "$NNODES" --node_rank "${NODE_RANK:?}" \
        --master_addr "${MASTER_ADDR:?}" --master_port "${MASTER_PORT:-29500}" "$SCRIPT" "$@"
fi
exec "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$SCRIPT" "$@"
