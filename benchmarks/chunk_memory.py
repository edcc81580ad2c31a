"""Peak memory and step time of one SupCon training step against the batch size, with and without
gradient caching (--chunk_size), each configuration in its own process.

    python benchmarks/chunk_memory.py [--model resnet18] [--size 32] [--batches 128,256,512,1024] [--chunk 64]

On a CPU the peak is the process's peak resident memory (``ru_maxrss`` of the child, read with
``RUSAGE_CHILDREN`` after it exits, so each figure includes the ~0.5 GB of an idle PyTorch process); on
CUDA it is ``torch.cuda.max_memory_allocated``. Each child builds the model, runs one warm-up step and
``--steps`` timed steps of ``steps.Pretraining.step`` (two views, SGD), and reports the median step time.
Prints one row per batch size and the issue's ratios: chunked peak at the largest / smallest batch
(target <= 1.3), chunked / plain peak at the largest batch (<= 0.3), chunked / plain step time (<= 1.45).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    sys.path.insert(0, ROOT)
    import torch

    from config.options import parse_option
    from engine.run import setup
    from training.schedule import set_optimizer
    from training.steps import Pretraining
    opt = setup(parse_option('supcon', ['--batch_size', str(args.batch), '--chunk_size', str(args.chunk),
                                        '--model', args.model, '--size', str(args.size), '--device', args.device]),
                run_folder=False)
    torch.manual_seed(0)
    pre = Pretraining(opt, args.batch)
    pre.model.train()
    optimizer = set_optimizer(pre.model.parameters(), opt.learning_rate, opt.momentum, opt.weight_decay)
    views = [torch.randn(args.batch, 3, args.size, args.size) for _ in range(2)]
    labels = torch.randint(0, 10, (args.batch,))
    times = []
    for i in range(args.steps + 1):
        if opt.device.type == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        pre.step(views, labels)
        optimizer.step()
        if opt.device.type == 'cuda':
            torch.cuda.synchronize()
        if i:                                       # the first step is a warm-up
            times.append(time.perf_counter() - start)
    out = {'step_s': statistics.median(times)}
    if opt.device.type == 'cuda':
        out['peak_mb'] = torch.cuda.max_memory_allocated(opt.device) / 2 ** 20
    print(json.dumps(out))


def child(args, mode, batch, chunk):
    """Run this file in ``mode`` (``--worker`` or ``--measure``) for one configuration; its last stdout line."""
    cmd = [sys.executable, os.path.abspath(__file__), mode, '--batch', str(batch), '--chunk', str(chunk),
           '--model', args.model, '--size', str(args.size), '--steps', str(args.steps), '--device', args.device]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f'{mode} failed: {proc.stderr[-2000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args):
    """In a fresh process: run the worker as its only child, then read the child's peak RSS."""
    out = child(args, '--worker', args.batch, args.chunk)
    out.setdefault('peak_mb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', default='resnet18')
    p.add_argument('--size', type=int, default=32)
    p.add_argument('--batches', default='128,256,512,1024')
    p.add_argument('--chunk', type=int, default=64)
    p.add_argument('--steps', type=int, default=2)
    p.add_argument('--device', default='cpu')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--measure', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--batch', type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.measure:
        return measure(args)
    batches = [int(b) for b in args.batches.split(',')]
    print(f'{args.model} at {args.size}x{args.size}, two views, SupCon, {args.device}, chunks of {args.chunk} samples')
    print(f'{"batch":>6s} {"plain MB":>9s} {"chunked MB":>11s} {"plain s":>8s} {"chunked s":>10s} {"time ratio":>10s}')
    rows = {}
    for batch in batches:      # each configuration in its own process, measured by a fresh parent
        rows[batch] = {chunk: child(args, '--measure', batch, chunk) for chunk in (0, args.chunk)}
        plain, chunked = rows[batch][0], rows[batch][args.chunk]
        print(f'{batch:6d} {plain["peak_mb"]:9.0f} {chunked["peak_mb"]:11.0f} {plain["step_s"]:8.2f} '
              f'{chunked["step_s"]:10.2f} {chunked["step_s"] / plain["step_s"]:10.2f}', flush=True)
    lo, hi = batches[0], batches[-1]
    growth = rows[hi][args.chunk]["peak_mb"] / rows[lo][args.chunk]["peak_mb"]
    print(f'chunked peak, batch {hi} / batch {lo}: {growth:.2f}'
          f' (target <= 1.3)')
    print(f'batch {hi}, chunked / plain peak: {rows[hi][args.chunk]["peak_mb"] / rows[hi][0]["peak_mb"]:.2f}'
          f' (target <= 0.3)')
    print(f'batch {hi}, chunked / plain step time: {rows[hi][args.chunk]["step_s"] / rows[hi][0]["step_s"]:.2f}'
          f' (target <= 1.45)')


if __name__ == '__main__':
    main()
