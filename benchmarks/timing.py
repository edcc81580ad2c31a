"""Timing helper for the benchmarks: interleaved repetitions, median seconds per call."""
import statistics
import time

import torch


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def time_interleaved(fns, device, reps=7, warmup=2):
    """Median seconds of each zero-argument callable, measured round-robin in one run."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
