"""CARROT's wall quantiles in the accelerator form (no host read): ``kthvalue`` on the whole upper triangle (the form
before 6d42068) against ``topk`` from the nearer side (``losses_carrot.pair_quantiles(sync_free=True)``), and the
CPU form (histogram, then ``kthvalue`` in a bucket), at B = 1024 and 4096 (two views: n = 2B rows, 10 classes),
measured in one run. The forms select the same values; the first lines say so.

    python benchmarks/carrot_quantile.py [--device cuda] [--batch_sizes 1024 4096] [--reps 3]

On CUDA, ``kthvalue`` of one 1-D tensor runs on one thread block, ``topk`` on many.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from losses_carrot import pair_quantiles  # noqa: E402
from runtime.device import resolve_device  # noqa: E402


def kthvalue_form(values, valid, qs, count):
    """The accelerator form before 6d42068: ``kthvalue`` on the whole triangle for every order statistic."""
    upper = valid.triu(1)
    flat = values.masked_fill(~upper, float('inf')).flatten()
    out = []
    for q in qs:
        pos = q * (2 * count - 1)
        lo = min(int(pos), 2 * count - 1)
        a, b = lo // 2, min(lo + 1, 2 * count - 1) // 2
        va, vb = torch.kthvalue(flat, a + 1).values, torch.kthvalue(flat, b + 1).values
        out.append(va + (vb - va) * (pos - lo))
    return torch.stack(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='auto')
    parser.add_argument('--batch_sizes', type=int, nargs='+', default=[1024, 4096])
    parser.add_argument('--reps', type=int, default=3)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    print(f'device {device} ({torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"}), '
          f'torch {torch.__version__}, {torch.get_num_threads()} threads')
    for bsz in args.batch_sizes:
        measure(bsz, device, args.reps)


def measure(bsz, device, reps, qs=(0.9, 0.1)):
    n = 2 * bsz
    g = torch.Generator(device=device).manual_seed(0)
    z = F.normalize(torch.randn(n, 128, device=device, generator=g), dim=1)
    y = torch.randint(0, 10, (n,), device=device, generator=g)
    sims = (z @ z.T).clamp_(-1, 1)
    neg = y[:, None] != y[None, :]
    count = int(neg.triu(1).sum())
    forms = {'kthvalue': lambda: kthvalue_form(sims, neg, qs, count),
             'topk': lambda: pair_quantiles(sims, neg, qs, count=count, sync_free=True),
             'cpu form': lambda: pair_quantiles(sims, neg, qs, count=count, sync_free=False)}
    values = {name: fn() for name, fn in forms.items()}
    assert all(torch.equal(v, values['topk']) for v in values.values()), values
    times = time_interleaved(forms, device, reps=reps, warmup=1)
    shown = ', '.join(f'{name} {t * 1e3:.1f} ms' for name, t in times.items())
    print(f'B = {bsz} (n = {n} rows, {count} negative pairs): {shown}; '
          f'kthvalue / topk = {times["kthvalue"] / times["topk"]:.2f}')

if __name__ == '__main__':
    main()
