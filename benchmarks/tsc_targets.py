"""TSC's targets beyond the simplex (C > D + 1): how spread they end (the largest cosine between two targets and the
uniformity energy at T = 0.07) from the same Gaussian start, with the optimization before 6d42068 (SGD lr 0.01,
2,000 steps, T = 0.1, projected back onto the sphere each step) and the authors' (``losses_proto.uniform_targets``:
Adam lr 1e-3, 10,000 steps, T = 0.07), and the time each takes, measured in one run.

    python benchmarks/tsc_targets.py [--classes 1000] [--dim 128] [--device cpu]
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from losses_proto import target_spread, uniform_targets  # noqa: E402
from runtime.device import resolve_device  # noqa: E402


def before_issue_41(n_classes, dim, seed=0, steps=2000, temperature=0.1, device='cpu'):
    g = torch.Generator().manual_seed(seed)
    u = nn.functional.normalize(torch.randn(n_classes, dim, generator=g, dtype=torch.float64), dim=1).to(device)
    u.requires_grad_(True)
    optimizer = torch.optim.SGD([u], lr=0.01)
    off_diagonal = ~torch.eye(n_classes, dtype=torch.bool, device=device)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.logsumexp((u @ u.T / temperature).masked_fill(~off_diagonal, -math.inf), dim=1).mean().backward()
        optimizer.step()
        with torch.no_grad():
            u.copy_(nn.functional.normalize(u, dim=1))
    return u.detach().float()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--classes', type=int, default=1000)
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--steps', type=int, default=10_000, help="the authors' steps (default 10,000)")
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    start = nn.functional.normalize(torch.randn(args.classes, args.dim, generator=torch.Generator().manual_seed(0),
                                                dtype=torch.float64), dim=1)
    print(f'C = {args.classes}, D = {args.dim}; torch {torch.__version__}, {device}')
    print('start: max cosine {:.3f}, energy {:.3f}'.format(*target_spread(start)))
    # both forms on --device (the earlier one ran on the CPU in float64 whatever the device: at C = 1000 it outlasted
    # the GPU check's bound on a loaded machine)
    for name, make in (('before 6d42068 (SGD, 2,000 steps, T 0.1)',
                        lambda: before_issue_41(args.classes, args.dim, device=device)),
                       (f'authors\' (Adam, {args.steps:,} steps, T 0.07)',
                        lambda: uniform_targets(args.classes, args.dim, 0, steps=args.steps, device=device))):
        print(f'{name}: running ...', flush=True)
        t = time.perf_counter()
        u = make()
        print('{}: max cosine {:.3f}, energy {:.3f}, {:.0f} s'.format(name, *target_spread(u), time.perf_counter() - t),
              flush=True)


if __name__ == '__main__':
    main()
