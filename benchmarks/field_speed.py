"""The published variants' loss (docs/FIELD.md) forward+backward time / SupConLoss's, measured in one run.

    python benchmarks/field_speed.py [--device cuda] [--reps 7] [--sizes 1024] [--classes 10,100]

V = 2, D = 128, labels uniform over C classes; each method is timed interleaved with SupConLoss on the same
batch (same temperature). Target: ratio <= 1.3 for every method at B = 1024,
C in {10, 100} on a CPU. The last line per method reads ``<method> ratio X`` (the largest over the sizes).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from losses import SupConLoss  # noqa: E402
from losses_field import EpsSupInfoNCELoss, KCLLoss, SINCERELoss, SpreadLoss, SupDCLLoss  # noqa: E402
from runtime.device import resolve_device  # noqa: E402

TAU = 0.1
METHODS = {'KCL': lambda: KCLLoss(6, TAU), 'SINCERE': lambda: SINCERELoss(TAU),
           'EpsSupInfoNCE': lambda: EpsSupInfoNCELoss(0.1, TAU), 'SupDCL': lambda: SupDCLLoss(TAU),
           'Spread': lambda: SpreadLoss(0.5, TAU)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='auto')
    p.add_argument('--reps', type=int, default=7)
    p.add_argument('--sizes', default='1024')
    p.add_argument('--classes', default='10,100')
    args = p.parse_args()
    device = resolve_device(args.device)
    torch.manual_seed(0)
    print(f'device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, V=2, D=128')
    print(f'{"method":>14s} {"B":>5s} {"classes":>7s} {"SupCon ms":>10s} {"method ms":>10s} {"ratio":>6s}')
    supcon = SupConLoss(temperature=TAU, base_temperature=TAU)
    worst = {}
    for bsz in [int(b) for b in args.sizes.split(',')]:
        for n_cls in [int(c) for c in args.classes.split(',')]:
            feats = F.normalize(torch.randn(bsz, 2, 128, device=device), dim=-1).requires_grad_(True)
            labels = torch.randint(0, n_cls, (bsz,))               # on the host, as a loader yields them

            def run(loss_fn, feats=feats, labels=labels):
                def call():
                    feats.grad = None
                    loss_fn(feats, labels).backward()
                return call
            for name, build in METHODS.items():
                t = time_interleaved({'SupCon': run(supcon), name: run(build())}, device, reps=args.reps)
                ratio = t[name] / t['SupCon']
                worst[name] = max(worst.get(name, 0.0), ratio)
                print(f'{name:>14s} {bsz:5d} {n_cls:7d} {t["SupCon"] * 1e3:10.1f} {t[name] * 1e3:10.1f} {ratio:6.2f}',
                      flush=True)
    for name, ratio in worst.items():
        print(f'{name} ratio {ratio:.2f}')


if __name__ == '__main__':
    main()
