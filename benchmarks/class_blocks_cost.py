"""The cost of the per-class work at a long tail: CIFAR-10-LT's profile at --imb_factor 0.01 (5,000 ... 50 images per
class), a batch of B = 4096 drawn from it, two views (M = 8192 rows), measured in one run.

    python benchmarks/class_blocks_cost.py [--batch 4096] [--imb_factor 0.01] [--reps 3]

1. The entries of the ``[c, k, k]`` blocks that SINCERE, epsilon-SupInfoNCE, L_spread and CARROT build: one block
   padded to the largest class (before 6d42068) against the blocks grouped by size (``losses.class_groups``), and
   ``sum_c n_c^2`` (float32 bytes per tensor of that shape).
2. KCL's / TSC's draw of k = 6 positives per row on the host: the padded ``[C, K, K]`` uniform keys and ``topk``
   (before 6d42068) against ``losses_field.kcl_positives`` (``O(M (k + V))``).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from data import long_tail_counts  # noqa: E402
from losses import class_blocks, class_groups  # noqa: E402
from losses_field import kcl_positives  # noqa: E402


def padded_draw(labels, n_views, k, generator):
    """KCL's draw before 6d42068: uniform keys over the padded ``[C, K, K]`` blocks, the k smallest by ``topk``."""
    bsz = labels.shape[0]
    members, present, _ = class_blocks(labels.repeat(n_views), 'cpu')
    sample = members % bsz
    n_cls, width = members.shape
    candidate = present[:, None, :] & (sample[:, None, :] != sample[:, :, None])
    keys = torch.rand(n_cls, width, width, generator=generator).masked_fill(~candidate, 2.0)
    drawn, slot = torch.topk(keys, min(k, width), dim=-1, largest=False)
    return drawn < 2.0, slot


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch', type=int, default=4096)
    parser.add_argument('--imb_factor', type=float, default=0.01)
    parser.add_argument('--reps', type=int, default=3)
    args = parser.parse_args(argv)
    counts = torch.tensor(long_tail_counts(5000, 10, args.imb_factor), dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    labels = torch.multinomial(counts / counts.sum(), args.batch, replacement=True, generator=g)
    rows = labels.repeat(2)
    sizes = torch.unique(rows, return_counts=True)[1]
    members, _, _ = class_blocks(rows, 'cpu')
    one_block = members.shape[0] * members.shape[1] ** 2
    grouped = sum(r.shape[0] * r.shape[1] ** 2 for r, _ in class_groups(rows, 'cpu').blocks)
    squares = int((sizes * sizes).sum())
    print(f'CIFAR-10-LT profile at imbalance {args.imb_factor}, B = {args.batch}, two views: class rows '
          f'{sizes.tolist()}; torch {torch.__version__}, {torch.get_num_threads()} threads')
    print(f'block entries: one padded block {one_block:,} ({one_block * 4 / 2 ** 30:.2f} GB per float32 tensor), '
          f'grouped {grouped:,} ({grouped * 4 / 2 ** 30:.2f} GB), sum n_c^2 {squares:,}; '
          f'padded / grouped = {one_block / grouped:.2f}')
    times = time_interleaved({'padded + topk': lambda: padded_draw(labels, 2, 6, g),
                              'kcl_positives': lambda: kcl_positives(labels, 2, 6, g)},
                             torch.device('cpu'), reps=args.reps, warmup=1)
    print(f'KCL draw (k = 6): padded + topk {times["padded + topk"] * 1e3:.1f} ms, kcl_positives '
          f'{times["kcl_positives"] * 1e3:.1f} ms; ratio {times["padded + topk"] / times["kcl_positives"]:.1f}')


if __name__ == '__main__':
    main()
