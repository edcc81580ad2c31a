"""Augmentation speed: ``--augment device`` (augment.BatchAugment) against ``--augment cpu`` (SupContrast's
per-image PIL pipeline), measured in one run.

    python benchmarks/augment_speed.py                 # CPU: per-core images/s, a digits SupCon epoch each
    python benchmarks/augment_speed.py --gpu           # also a full SupCon step on the GPU (CUDA only)

1. Two-view contrastive augmentation (CIFAR's: crop, flip, colour jitter, grayscale) of 32x32 images, one thread,
   both in this process: images per second per core (each view counts), the median of 5 passes of each; freed
   memory kept for reuse as the scripts keep it with ``--augment device`` on a CPU (``runtime.keep_freed_memory``;
   ``--default_allocator``: without).
2. One digits SupCon epoch (``main_supcon.py``, batch 128, no workers) with each, in its own process.
3. ``--gpu``: images/s of a full SupCon step (resnet18, 32x32, batch 512, two views, bf16, channels_last, SGD)
   fed by ``--augment device`` (images on the GPU) and by the cpu pipeline in 8 and 16 DataLoader workers, and
   the share of the device step spent augmenting.
The last line is ``ratio X``: device over cpu images/s per core (part 1), the median over the pairs of passes.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data import TwoCropTransform  # noqa: E402
from data.augment import BatchAugment  # noqa: E402
from runtime.device import keep_freed_memory  # noqa: E402

CIFAR_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))


def pil_transform():
    from config.options import parse_option
    from data import build_transform
    return TwoCropTransform(build_transform(parse_option('supcon', ['--dataset', 'cifar10', '--size', '32']),
                                            'contrastive'))


def per_core(n, reps=5):
    """Images/s (two views each counted) of the PIL pipeline and of BatchAugment on the CPU, one thread: the
    median of ``reps`` passes of each, taken in turn, and the ratio of each pair of passes (adjacent in time, so
    a neighbour that slows this machine for a while slows both alike). BatchAugment gets both views of a batch
    of 512 in one call, as ``augment.DeviceLoader`` gives them."""
    from PIL import Image
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    pil = [Image.fromarray(a) for a in raw]
    transform = pil_transform()
    batch = torch.from_numpy(raw).permute(0, 3, 1, 2).contiguous()
    aug = BatchAugment(32, *CIFAR_MEAN_STD, 'natural', 'contrastive', torch.Generator().manual_seed(0))
    aug(batch[:64])                                            # warm-up
    cpu, device = [], []
    for _ in range(reps):
        start = time.perf_counter()
        for im in pil:
            transform(im)
        cpu.append(2 * n / (time.perf_counter() - start))
        start = time.perf_counter()
        for part in batch.split(512):
            aug(part.repeat(2, 1, 1, 1)).chunk(2)
        device.append(2 * n / (time.perf_counter() - start))
    return float(np.median(cpu)), float(np.median(device)), [d / c for c, d in zip(cpu, device)]


def digits_epoch(augment, seed=0):
    """Seconds of one digits SupCon epoch (train/epoch_time), in its own process."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, os.path.join(ROOT, 'main_supcon.py'), '--epochs', '1', '--batch_size', '128',
                        '--num_workers', '0', '--print_freq', '1000', '--augment', augment, '--seed', str(seed),
                        '--save_folder', folder], check=True, capture_output=True, cwd=ROOT)
        path = next(os.path.join(d, 'metrics.csv') for d, _, fs in os.walk(folder) if 'metrics.csv' in fs)
        with open(path) as f:
            return float(next(csv.DictReader(f))['train/epoch_time'])


class ArrayDataset(torch.utils.data.Dataset):
    def __init__(self, raw, transform):
        from PIL import Image
        self.images, self.transform = [Image.fromarray(a) for a in raw], transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), 0


def gpu_step(n_images, batch, steps, workers_list):
    """Images/s of a full SupCon step on CUDA fed by the device pipeline and by DataLoader workers."""
    from losses import SupConLoss
    from networks import SupConResNet
    device = torch.device('cuda')
    torch.backends.cudnn.benchmark = True
    model = SupConResNet('resnet18').to(device).to(memory_format=torch.channels_last)
    criterion = SupConLoss(temperature=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    labels = torch.randint(0, 10, (batch,), device=device)

    def train(views):
        x = torch.cat(views).to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            feats = model(x)
        loss = criterion(torch.stack(feats.float().split(batch), 1), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    raw = np.random.default_rng(0).integers(0, 256, (n_images, 32, 32, 3), dtype=np.uint8)
    images = torch.from_numpy(raw).permute(0, 3, 1, 2).contiguous().to(device)
    aug = BatchAugment(32, *CIFAR_MEAN_STD, 'natural', 'contrastive', torch.Generator(device=device).manual_seed(0))

    def device_batches():
        while True:
            idx = torch.randint(0, n_images, (batch,), device=device)
            x = images[idx]
            yield [aug(x), aug(x)]

    def timed(batches, n_steps, warmup=5):
        it = iter(batches)
        for _ in range(warmup):
            train(next(it))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n_steps):
            train(next(it))
        torch.cuda.synchronize()
        return 2 * batch * n_steps / (time.perf_counter() - start)

    results = {'device': timed(device_batches(), steps)}
    it = device_batches()                                    # the augmentation alone, for its share of the step
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    torch.cuda.synchronize()
    aug_time = (time.perf_counter() - start) / steps
    share = aug_time / (2 * batch / results['device'])
    dataset = ArrayDataset(raw, pil_transform())
    for workers in workers_list:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                             pin_memory=True, drop_last=True, persistent_workers=True,
                                             prefetch_factor=4)

        def cpu_batches(loader=loader):
            while True:
                for views, _ in loader:
                    yield views
        results[f'cpu, {workers} workers'] = timed(cpu_batches(), steps, warmup=10)
    return results, share


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--images', type=int, default=2048, help='images for the per-core measurement')
    p.add_argument('--gpu', action='store_true', help='also the full step on CUDA (needs a GPU)')
    p.add_argument('--gpu_steps', type=int, default=40)
    p.add_argument('--workers', default='8,16')
    p.add_argument('--skip_epochs', action='store_true', help='skip the digits epochs (part 2)')
    p.add_argument('--default_allocator', action='store_true',
                   help="part 1 with glibc's default allocator settings (not runtime.keep_freed_memory)")
    args = p.parse_args()
    print(f'torch {torch.__version__}, {os.cpu_count()} CPUs')
    if not args.skip_epochs:
        cpu_epoch, device_epoch = digits_epoch('cpu'), digits_epoch('device')
        print(f'digits SupCon epoch (batch 128, no workers): cpu {cpu_epoch:.2f} s, device {device_epoch:.2f} s, '
              f'cpu/device {cpu_epoch / device_epoch:.2f}')
    if args.gpu:
        if not torch.cuda.is_available():
            sys.exit('augment_speed.py: error: --gpu needs a CUDA device')
        results, share = gpu_step(50000, 512, args.gpu_steps, [int(w) for w in args.workers.split(',')])
        print(f'{torch.cuda.get_device_name()}: SupCon step, resnet18 32x32, batch 512 x 2 views, bf16, channels_last')
        for name, ips in results.items():
            print(f'  {name:18s} {ips:10.0f} images/s  ({ips / results["device"]:.2f} of device)')
        print(f'  augmenting on the device takes {100 * share:.1f} % of the device step')
    if args.default_allocator:
        print("glibc's default allocator settings (the scripts keep freed memory: runtime.keep_freed_memory)")
    else:
        print(f'freed memory kept for reuse, as the scripts do with --augment device on a CPU: {keep_freed_memory()}')
    cpu, device, ratios = per_core(args.images)
    print(f'two-view contrastive augmentation, 32x32, one core: cpu (PIL) {cpu:.0f} images/s, '
          f'device (batched, on the CPU) {device:.0f} images/s (medians of {len(ratios)} passes)')
    print('ratio of each pair of passes: ' + ', '.join(f'{r:.2f}' for r in ratios))
    print(f'ratio {np.median(ratios):.2f}')


if __name__ == '__main__':
    main()
