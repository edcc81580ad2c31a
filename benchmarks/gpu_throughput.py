"""Training throughput on one GPU, ours against a SupContrast-style baseline and against the bound, in ONE process.

    python benchmarks/gpu_throughput.py                          # resnet18 and resnet50, batch 512 and 1024
    python benchmarks/gpu_throughput.py --smoke                  # a tiny run on any device (the suite runs it)

Images/s of a full training step (data to optimizer step, through ``loop.train_loop``; both views counted)
on 50,000 synthetic CIFAR-shaped images (32x32 uint8, 100 classes), for each model and batch size:

- ``baseline``: SupContrast as written: fp32, its dense-mask ``SupConLoss`` (``benchmarks/supcontrast_losses.py``),
  per-image PIL two-crop augmentation in DataLoader workers (pinned memory), no channels-last;
- ``ours <method>``: ``steps.Pretraining`` for SupCon, RASCAL and SupCon + CARROT with ``--augment device``,
  ``--amp bf16`` and ``--channels_last``, and SupCon with ``--deterministic`` (its cost); with ``--compile`` also
  ``ours <method> compiled``, each method with the scripts' ``--compile`` (the encoder and the heads; where the
  method's loss traces whole, SupCon's and RASCAL's, the step's forward as one graph with the augmentation; the fused
  optimizer update; ``--compile_mode``: inductor's mode, reduce-overhead for CUDA graphs; docs/USAGE.md,
  "torch.compile");
- ``bound``: the same model's forward, backward and SGD step on images already augmented on the GPU, with no
  loss beyond a sum (``bound compiled``, with ``--compile``: the same under ``torch.compile``; a compiled row's
  ratio is taken over it, never over the uncompiled bound);
- ``kornia``: SupContrast's augmentation built from ``kornia.augmentation`` (per-sample parameters on the GPU)
  feeding our SupCon step, beside ``--augment device`` (skipped when kornia is not installed).

Prints each rate, ours/baseline and ours/bound, then one line ``ratio X``: ours (SupCon) over the baseline for
resnet18 at batch 1024 (the first configuration measured with ``--smoke`` or other sizes). Targets: ours/baseline >= 3
(resnet18), >= 2 (resnet50); ours/bound >= 0.8 (SupCon), >= 0.7 (RASCAL, CARROT); compiled, over the compiled
bound: >= 0.9 (SupCon), >= 0.8 (RASCAL, CARROT).
"""
import argparse
import itertools
import json
import os
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.supcontrast_losses import SupConLoss as OriginalSupConLoss  # noqa: E402
from config.options import parse_option  # noqa: E402
from core.flags import call_hook  # noqa: E402
from data import TwoCropTransform, build_loader, build_transform  # noqa: E402
from datasets_indexed import IndexedDataset  # noqa: E402
from engine.run import setup  # noqa: E402
from networks import SupConResNet  # noqa: E402
from runtime.device import COMPILE_MODES, Runtime  # noqa: E402
from training.loop import Optimization, train_loop  # noqa: E402
from training.schedule import Schedule, set_optimizer  # noqa: E402
from training.steps import Pretraining  # noqa: E402


class SyntheticCIFAR(torch.utils.data.Dataset):
    """``n`` random 32x32 RGB images in torchvision CIFAR's layout (``data`` uint8 ``[N, 32, 32, 3]``, ``targets``),
    so that both the PIL pipeline and ``--augment device`` read it as they read CIFAR."""

    def __init__(self, n, n_classes=100, seed=0, transform=None):
        rng = np.random.default_rng(seed)
        self.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        self.targets = rng.integers(0, n_classes, n).tolist()
        self.classes = [str(c) for c in range(n_classes)]
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        img = Image.fromarray(self.data[i])
        return (self.transform(img) if self.transform else img), self.targets[i]


class Limited:
    """The first ``steps`` batches of ``loader`` (an epoch of ``train_loop``), cycling if it is shorter."""

    def __init__(self, loader, steps):
        self.loader, self.steps = loader, steps
        self.sampler = getattr(loader, 'sampler', None)

    def __len__(self):
        return self.steps

    def __iter__(self):
        return itertools.islice(itertools.cycle(self.loader), self.steps)


def options(model, bsz, device, extra=()):
    return setup(parse_option('supcon', ['--dataset', 'cifar100', '--model', model, '--batch_size', str(bsz),
                                         '--device', device, '--epochs', '1', '--print_freq', '1000000', *extra]),
                 run_folder=False)


def timed(opt, loader, model, step, steps, warmup, profile=False):
    """Images/s (both views) of ``steps`` training steps through ``loop.train_loop`` after ``warmup`` steps.
    ``profile``: instead, ``(images/s, table)`` with ``torch.profiler``'s table of the top 15 operators by device
    time (CPU time on a CPU) over the timed steps (:func:`profile_table`)."""
    update = set_optimizer(model.parameters(), opt.learning_rate, opt.momentum, opt.weight_decay, fused=opt.compile)
    optim = Optimization(update, call_hook(Runtime, opt).grad_scaler(), call_hook(Schedule, opt))
    sync = torch.cuda.synchronize if opt.device.type == 'cuda' else (lambda: None)
    train_loop(Limited(loader, warmup), optim, 1, step, 'warm-up', opt.print_freq)
    sync()
    run = lambda: train_loop(Limited(loader, steps), optim, 1, step, 'timed', opt.print_freq)
    start = time.perf_counter()
    if not profile:
        run()
        sync()
        return 2 * opt.batch_size * steps / (time.perf_counter() - start)
    table = profile_table(run, opt.device)
    return 2 * opt.batch_size * steps / (time.perf_counter() - start), table


def profile_table(fn, device, rows=15):
    """``fn()`` under ``torch.profiler``: the table of its top ``rows`` operators by self device time (self CPU
    time on a CPU)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == 'cuda':
            torch.cuda.synchronize()
    key = 'self_device_time_total' if device.type == 'cuda' else 'self_cpu_time_total'
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def baseline(model_name, bsz, device, dataset, steps, warmup, workers):
    """SupContrast's step: fp32, PIL two-crop augmentation in workers, its dense-mask loss."""
    opt = options(model_name, bsz, device, ['--num_workers', str(workers), '--temp', '0.1', '--augment', 'cpu',
                                            '--amp', 'none', '--channels_last', 'off'])
    dataset.transform = TwoCropTransform(build_transform(opt, 'contrastive'))
    loader = torch.utils.data.DataLoader(dataset, batch_size=bsz, shuffle=True, num_workers=workers,
                                         pin_memory=opt.device.type == 'cuda', drop_last=True,
                                         persistent_workers=workers > 0)
    model = SupConResNet(model_name).to(opt.device)
    criterion = OriginalSupConLoss(temperature=0.1)

    def step(batch, backward):
        (v1, v2), labels = batch
        images = torch.cat([v1, v2]).to(opt.device, non_blocking=True)
        labels = labels.to(opt.device, non_blocking=True)
        feats = model(images)
        loss = criterion(torch.stack(feats.split(bsz), 1), labels)
        backward(loss)
        return loss.detach(), bsz, {}
    model.train()
    return timed(opt, loader, model, step, steps, warmup)


def ours(model_name, bsz, device, dataset, steps, warmup, method_flags, compile_backend=None, profile=False,
         compile_mode='default'):
    """``steps.Pretraining`` with device augmentation, bf16 and channels-last; ``compile_backend``: with the
    scripts' ``--compile`` on that backend and ``compile_mode`` (``profile``: :func:`timed`'s)."""
    amp = ['--amp', 'bf16'] if device != 'cpu' or torch.cpu._is_avx512_bf16_supported() else []
    compiled = ['--compile', '--compile_backend', compile_backend, '--compile_mode', compile_mode] \
        if compile_backend else []
    torch._dynamo.reset()       # each row compiles its own graphs, as its own process would (never another row's)
    opt = options(model_name, bsz, device, ['--augment', 'device', '--channels_last', '--num_workers', '0',
                                            '--temp', '0.1', *amp, *method_flags, *compiled])
    dataset.transform = None
    train_set = IndexedDataset(dataset) if '--method' in method_flags else dataset
    loader = build_loader(opt, train_set, train=True, kind='contrastive', n_views=2)
    pre = Pretraining(opt, len(train_set))

    def step(batch, backward):
        loss, stats = pre.step(*batch, backward=backward)
        return loss, bsz, stats
    pre.model.train()
    return timed(opt, loader, pre.model, step, steps, warmup, profile)


def kornia_ours(model_name, bsz, device, dataset, steps, warmup):
    """Our SupCon step fed by SupContrast's augmentation written with kornia.augmentation (on the device)."""
    import kornia.augmentation as K
    opt = options(model_name, bsz, device, ['--channels_last', '--temp', '0.1', '--amp', 'bf16'])
    images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous().to(opt.device)
    labels = torch.as_tensor(dataset.targets)
    mean = torch.tensor((0.5071, 0.4867, 0.4408), device=opt.device)
    std = torch.tensor((0.2675, 0.2565, 0.2761), device=opt.device)
    augment = torch.nn.Sequential(
        K.RandomResizedCrop((32, 32), scale=(0.2, 1.0)), K.RandomHorizontalFlip(),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8), K.RandomGrayscale(p=0.2), K.Normalize(mean, std))

    class KorniaLoader:
        sampler = None

        def __iter__(self):
            order = torch.randperm(images.shape[0])
            for start in range(0, images.shape[0] - bsz + 1, bsz):
                idx = order[start:start + bsz]
                x = images[idx.to(opt.device)].float() / 255
                views = augment(x.repeat(2, 1, 1, 1)).contiguous(memory_format=torch.channels_last).chunk(2)
                yield list(views), labels[idx]
    pre = Pretraining(opt, len(dataset))

    def step(batch, backward):
        loss, stats = pre.step(*batch, backward=backward)
        return loss, bsz, stats
    pre.model.train()
    return timed(opt, KorniaLoader(), pre.model, step, steps, warmup)


def bound(model_name, bsz, device, steps, warmup, compile_backend=None, compile_mode='default'):
    """Forward + backward + SGD of the model on images already on the device, loss = a sum (no augmentation);
    ``compile_backend``: the model under ``torch.compile`` on that backend and ``compile_mode``, with the fused
    update (the bound of the compiled rows)."""
    opt = options(model_name, bsz, device, ['--channels_last', '--amp', 'bf16'] if device != 'cpu' else [])
    opt.compile = bool(compile_backend)            # the fused update of the compiled rows (timed)
    images = torch.randn(2 * bsz, 3, 32, 32, device=opt.device)
    if opt.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    model = SupConResNet(model_name).to(opt.device)
    if opt.channels_last:
        model = model.to(memory_format=torch.channels_last)
    runtime = call_hook(Runtime, opt)
    torch._dynamo.reset()
    mode = None if compile_mode == 'default' else compile_mode
    forward = torch.compile(model, backend=compile_backend, mode=mode) if compile_backend else model

    def step(batch, backward):
        with runtime.autocast():
            loss = forward(images).float().sum()
        backward(loss)
        return loss.detach(), bsz, {}
    return timed(opt, [None], model, step, steps, warmup)


# the targets: (rate, over, target) for each row that has one
TARGETS = [('ours SupCon', 'baseline', {'resnet18': 3.0, 'resnet50': 2.0}),
           ('ours SupCon', 'bound', 0.8), ('ours RASCAL', 'bound', 0.7), ('ours SupCon+CARROT', 'bound', 0.7),
           ('ours SupCon compiled', 'bound compiled', 0.9), ('ours RASCAL compiled', 'bound compiled', 0.8),
           ('ours SupCon+CARROT compiled', 'bound compiled', 0.8)]
METHOD_FLAGS = {'SupCon': [], 'RASCAL': ['--method', 'RASCAL'], 'SupCon+CARROT': ['--carrot']}


def bound_of(row, rates):
    """The bound a row is compared with: the compiled bound for a compiled row (where it was measured), else the
    plain one, so that every ratio compares like with like."""
    return 'bound compiled' if 'compiled' in row and 'bound compiled' in rates else 'bound'


def missed_targets(model_name, rates):
    """``[(row, over, ratio, target)]`` for every target ``rates`` misses."""
    out = []
    for row, over, target in TARGETS:
        target = target.get(model_name) if isinstance(target, dict) else target
        if target is not None and row in rates and over in rates and rates[row] / rates[over] < target:
            out.append((row, over, rates[row] / rates[over], target))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', default='resnet18,resnet50')
    p.add_argument('--batches', default='1024,512')
    p.add_argument('--images', type=int, default=50_000)
    p.add_argument('--steps', type=int, default=30, help='timed steps per configuration')
    p.add_argument('--warmup', type=int, default=5)
    p.add_argument('--workers', type=int, default=min(16, os.cpu_count() or 1), help='baseline DataLoader workers')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--compile', action='store_true', help="also each method with the scripts' --compile")
    p.add_argument('--compile_backend', default='inductor',
                   help='the compiled rows\' torch.compile backend (aot_eager: the same graphs in seconds on a CPU)')
    p.add_argument('--compile_mode', default='default', choices=COMPILE_MODES,
                   help="the compiled rows' inductor mode (reduce-overhead: CUDA graphs)")
    p.add_argument('--smoke', action='store_true', help='resnet_tiny, batch 16, 256 images, 2 steps: that it runs')
    p.add_argument('--profile', choices=['missed', 'always', 'never'], default='missed',
                   help='a torch.profiler table of ours for each method whose target is missed (always: every one)')
    p.add_argument('--json', help='also write every rate, ratio, missed target and profile table to this file '
                                  '(rewritten after each configuration)')
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.batches, args.images, args.steps, args.warmup, args.workers = \
            'resnet_tiny', '16', 256, 2, 1, 0
    dev = args.device
    name = torch.cuda.get_device_name() if dev.startswith('cuda') else 'cpu'
    print(f'device {name}, torch {torch.__version__}, {args.images} images 32x32, {args.steps} timed steps')
    headline, report = None, {'device': name, 'torch': torch.__version__, 'steps': args.steps, 'configs': []}
    for model_name in args.models.split(','):
        for bsz in (int(b) for b in args.batches.split(',')):
            data = SyntheticCIFAR(args.images)
            rates = {'baseline': baseline(model_name, bsz, dev, data, args.steps, args.warmup, args.workers),
                     'bound': bound(model_name, bsz, dev, args.steps, args.warmup)}
            for method, flags in METHOD_FLAGS.items():
                rates[f'ours {method}'] = ours(model_name, bsz, dev, data, args.steps, args.warmup, flags)
            if args.compile:
                rates['bound compiled'] = bound(model_name, bsz, dev, args.steps, args.warmup, args.compile_backend,
                                                args.compile_mode)
                for method, flags in METHOD_FLAGS.items():
                    rates[f'ours {method} compiled'] = ours(model_name, bsz, dev, data, args.steps, args.warmup, flags,
                                                            args.compile_backend, compile_mode=args.compile_mode)
            rates['ours SupCon deterministic'] = ours(model_name, bsz, dev, data, args.steps, args.warmup,
                                                      ['--deterministic'])
            torch.use_deterministic_algorithms(False)         # --deterministic is process-wide: off again
            torch.backends.cudnn.deterministic = False
            try:
                rates['kornia SupCon'] = kornia_ours(model_name, bsz, dev, data, args.steps, args.warmup)
            except ImportError:
                print('kornia is not installed: its row is skipped (pip install kornia)')
            print(f'\n{model_name}, batch {bsz}:')
            for key, rate in rates.items():
                over = bound_of(key, rates)
                extra = '' if key.startswith(('baseline', 'bound')) else \
                    f'   ours/baseline {rate / rates["baseline"]:5.2f}   ours/{over} {rate / rates[over]:5.2f}'
                print(f'  {key:26s} {rate:10.1f} images/s{extra}')
            missed = missed_targets(model_name, rates)
            for row, over, ratio, target in missed:
                print(f'  target missed: {row} / {over} = {ratio:.2f} < {target}')
            profiles = {}
            for method, flags in METHOD_FLAGS.items():
                if args.profile == 'always' or (args.profile == 'missed' and
                                                any(row == f'ours {method}' for row, *_ in missed)):
                    _, profiles[method] = ours(model_name, bsz, dev, data, args.steps, args.warmup, flags, None,
                                               profile=True)
                    print(f'  profile of ours {method} (top operators by self time):\n{profiles[method]}')
            report['configs'].append({'model': model_name, 'batch': bsz, 'rates': rates, 'profiles': profiles,
                                      'missed': [dict(zip(('row', 'over', 'ratio', 'target'), m)) for m in missed]})
            if headline is None or (model_name == 'resnet18' and bsz == 1024):
                headline = rates['ours SupCon'] / rates['baseline']
            report['ratio'] = headline
            if args.json:           # after each configuration: a run stopped later keeps what it measured
                with open(args.json + '.tmp', 'w') as f:
                    json.dump(report, f, indent=2)
                os.replace(args.json + '.tmp', args.json)
    print(f'ratio {headline:.2f}')


if __name__ == '__main__':
    main()
