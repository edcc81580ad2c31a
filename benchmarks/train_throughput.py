"""Training throughput (images/s) of a SupCon step: resnet18 / resnet50, 32x32, two views.

    python benchmarks/train_throughput.py                      # CPU here, cuda when available
    python benchmarks/train_throughput.py --models resnet18 --batch_size 64 --steps 3

Each configuration (fp32, --amp bf16, --channels_last, both) runs the real model,
SupConLoss and an SGD step on random images; images/s counts both views. Ratios are
against fp32 of the same model, measured in the same run.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from losses import SupConLoss  # noqa: E402
from networks import SupConResNet  # noqa: E402
from runtime.device import Runtime, resolve_device  # noqa: E402


def measure(model_name, bsz, steps, warmup, device, amp, channels_last):
    runtime = Runtime(device, amp, channels_last)
    model = SupConResNet(model_name).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    criterion = SupConLoss(temperature=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = torch.randn(2 * bsz, 3, 32, 32, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (bsz,), device=device)

    def step():
        with runtime.autocast():
            feats = model(images)
        loss = criterion(torch.stack(feats.split(bsz), 1), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    if device.type == 'cuda':
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == 'cuda':
        torch.cuda.synchronize()
    return 2 * bsz * steps / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', default='resnet18,resnet50')
    p.add_argument('--batch_size', type=int, default=256)
    p.add_argument('--steps', type=int, default=None, help='timed steps (default: 3 on CPU, 20 on GPU)')
    p.add_argument('--device', default='auto')
    args = p.parse_args()
    device = resolve_device(args.device)
    steps = args.steps or (20 if device.type == 'cuda' else 3)
    warmup = 5 if device.type == 'cuda' else 1
    torch.manual_seed(0)
    print(f'device {device}, batch {args.batch_size} x 2 views, 32x32, {steps} timed steps, torch {torch.__version__}, '
          f'{torch.get_num_threads()} threads')
    print(f'{"model":10s} {"config":22s} {"images/s":>10s} {"vs fp32":>8s}')
    for name in args.models.split(','):
        base = None
        for amp, cl in (('none', False), ('bf16', False), ('none', True), ('bf16', True)):
            ips = measure(name, args.batch_size, steps, warmup, device, amp, cl)
            base = base or ips
            label = ('fp32' if amp == 'none' else '--amp bf16') + (' --channels_last' if cl else '')
            print(f'{name:10s} {label:22s} {ips:10.1f} {ips / base:8.2f}x', flush=True)


if __name__ == '__main__':
    main()
