"""Our SupConLoss forward+backward time / the original SupContrast SupConLoss's, measured in one run.

    python benchmarks/supcon_speed.py [--device cuda] [--reps 7]

B in {1024, 4096}, V = 2, D = 128, C in {10, 100} classes, and SimCLR (no labels). Also checks that the
two losses agree (value and gradient). Target: ratio <= 0.8 at every size.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.supcontrast_losses import SupConLoss as OriginalSupConLoss  # noqa: E402
from benchmarks.timing import time_interleaved  # noqa: E402
from losses import SupConLoss  # noqa: E402
from runtime.device import resolve_device  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='auto')
    p.add_argument('--reps', type=int, default=7)
    p.add_argument('--sizes', default='1024,4096')
    args = p.parse_args()
    device = resolve_device(args.device)
    torch.manual_seed(0)
    print(f'device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, V=2, D=128')
    print(f'{"B":>5s} {"classes":>7s} {"original ms":>12s} {"ours ms":>9s} {"ratio":>6s} {"max |grad diff|":>16s}')
    ours, original = SupConLoss(temperature=0.1), OriginalSupConLoss(temperature=0.1)
    for bsz in [int(b) for b in args.sizes.split(',')]:
        for n_cls in (10, 100, None):
            feats = F.normalize(torch.randn(bsz, 2, 128, device=device), dim=-1).requires_grad_(True)
            labels = torch.randint(0, n_cls, (bsz,), device=device) if n_cls else None
            grads = []
            for loss_fn in (ours, original):
                feats.grad = None
                loss_fn(feats, labels).backward()
                grads.append(feats.grad.clone())

            def run(loss_fn, feats=feats, labels=labels):
                def call():
                    feats.grad = None
                    loss_fn(feats, labels).backward()
                return call
            t = time_interleaved({'original': run(original), 'ours': run(ours)}, device, reps=args.reps)
            print(f'{bsz:5d} {str(n_cls or "SimCLR"):>7s} {t["original"] * 1e3:12.1f} {t["ours"] * 1e3:9.1f} '
                  f'{t["ours"] / t["original"]:6.2f} {float((grads[0] - grads[1]).abs().max()):16.2e}', flush=True)


if __name__ == '__main__':
    main()
