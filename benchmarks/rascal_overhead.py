"""RASCAL forward+backward time / SupConLoss forward+backward time, measured in one run.

    python benchmarks/rascal_overhead.py [--device cuda] [--reps 7]

B in {256, 1024}, V = 2, D = 128, 10 and 100 classes, warm cache (every sample seen).
Target: <= 1.3 at B = 1024 on a CPU.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from losses import SupConLoss  # noqa: E402
from losses_rascal import RASCALLoss  # noqa: E402
from runtime.device import resolve_device  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='auto')
    p.add_argument('--reps', type=int, default=7)
    args = p.parse_args()
    device = resolve_device(args.device)
    torch.manual_seed(0)
    print(f'device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, V=2, D=128')
    print(f'{"B":>5s} {"classes":>7s} {"weighting":>10s} {"SupCon ms":>10s} {"RASCAL ms":>10s} {"ratio":>6s}')
    for bsz in (256, 1024):
        for n_cls in (10, 100):
            feats = F.normalize(torch.randn(bsz, 2, 128, device=device), dim=-1).requires_grad_(True)
            labels = torch.randint(0, n_cls, (bsz,), device=device)
            idx = torch.randperm(4 * bsz, device=device)[:bsz]
            for weighting in ('agreement', 'current'):
                rascal = RASCALLoss(4 * bsz, 128, temperature=0.1, base_temperature=0.1,
                                    weighting=weighting).to(device)
                rascal(feats.detach(), labels, idx)                  # warm the cache
                supcon = SupConLoss(temperature=0.1, base_temperature=0.1)

                def run(loss_fn, *extra, feats=feats, labels=labels):
                    def call():
                        feats.grad = None
                        loss_fn(feats, labels, *extra).backward()
                    return call
                t = time_interleaved({'supcon': run(supcon), 'rascal': run(rascal, idx)}, device, reps=args.reps)
                print(f'{bsz:5d} {n_cls:7d} {weighting:>10s} {t["supcon"] * 1e3:10.2f} {t["rascal"] * 1e3:10.2f} '
                      f'{t["rascal"] / t["supcon"]:6.2f}', flush=True)


if __name__ == '__main__':
    main()
