"""CARROT's cost, measured in one run.

    python benchmarks/carrot_overhead.py [--device cuda] [--skip_step]

1. Loss level: (SupCon + CARROT with gradient balancing) forward+backward / SupCon forward+backward,
   B = 1024, V = 2, D = 128, 10 classes (target: <= 2.0 on a CPU), for each form of CARROT's positives, and against
   the original SupContrast SupConLoss (target on a CPU, with the CPU's form: <= 1.5).
2. Training step: resnet18, batch 256 (two views), 32x32: SupCon + CARROT (on the encoder) /
   SupCon (target <= 1.15).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from losses import SupConLoss  # noqa: E402
from losses_carrot import CARROT, FORMS, grad_balanced_total_loss  # noqa: E402
from networks import SupConResNet  # noqa: E402
from runtime.device import resolve_device  # noqa: E402


def loss_level(device, reps):
    """SupCon + balanced CARROT, forward and backward, with each form of CARROT's positives (``masked``: one pass
    over [n, n]; ``blocks``: the same-class blocks; the device's default marked), against our SupCon alone and the
    original SupContrast ``SupConLoss`` (benchmarks/supcontrast_losses.py)."""
    from benchmarks.supcontrast_losses import SupConLoss as OriginalSupConLoss
    bsz, views = 1024, 2
    h = torch.randn(views * bsz, 128, device=device, requires_grad=True)
    labels = torch.randint(0, 10, (bsz,), device=device)
    supcon, original = SupConLoss(0.1), OriginalSupConLoss(0.1)
    carrots = {form: CARROT(form=form) for form in FORMS}
    default = 'blocks' if device.type == 'cpu' else 'masked'

    def base():
        f = F.normalize(h, dim=1)
        return supcon(torch.stack(f.split(bsz), 1), labels)

    def plain():
        h.grad = None
        base().backward()

    def supcontrast():
        h.grad = None
        original(torch.stack(F.normalize(h, dim=1).split(bsz), 1), labels).backward()

    def with_carrot(form):
        def run():
            h.grad = None
            reg = carrots[form](h, labels.repeat(views))
            total, _ = grad_balanced_total_loss(base(), reg, h)
            total.backward()
        return run
    t = time_interleaved({'original': supcontrast, 'supcon': plain,
                          **{form: with_carrot(form) for form in FORMS}}, device, reps=reps)
    print(f'loss level, B={bsz}, V={views}, D=128: SupContrast\'s SupConLoss {t["original"] * 1e3:.1f} ms, our SupCon '
          f'{t["supcon"] * 1e3:.1f} ms', flush=True)
    for form in FORMS:
        mark = " (this device's default)" if form == default else ''
        print(f'  SupCon + CARROT, positives {form}{mark}: '
              f'{t[form] * 1e3:.1f} ms, {t[form] / t["supcon"]:.2f}x our SupCon (target <= 2.0), '
              f'{t[form] / t["original"]:.2f}x SupContrast\'s (target <= 1.5 on a CPU)', flush=True)


def step_level(device, reps, bsz):
    torch.manual_seed(0)
    model = SupConResNet('resnet18').to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(2 * bsz, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (bsz,), device=device)
    supcon, carrot = SupConLoss(0.1), CARROT()

    def step(use_carrot):
        h_enc, h_proj = model(images, parts=True)
        feats = F.normalize(h_proj, dim=1)
        loss = supcon(torch.stack(feats.split(bsz), 1), labels)
        if use_carrot:
            reg = carrot(h_enc, labels.repeat(2))
            loss, _ = grad_balanced_total_loss(loss, reg, h_enc, params=model.head.parameters())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    t = time_interleaved({'supcon': lambda: step(False), 'carrot': lambda: step(True)}, device,
                         reps=reps, warmup=1)
    print(f'training step, resnet18, batch {bsz}x2: SupCon {t["supcon"]:.2f} s, SupCon+CARROT {t["carrot"]:.2f} s, '
          f'ratio {t["carrot"] / t["supcon"]:.3f} (target <= 1.15)', flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='auto')
    p.add_argument('--reps', type=int, default=7)
    p.add_argument('--step_reps', type=int, default=None, help='default: 3 on CPU, 20 on GPU')
    p.add_argument('--batch_size', type=int, default=256)
    p.add_argument('--skip_step', action='store_true')
    args = p.parse_args()
    device = resolve_device(args.device)
    print(f'device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads')
    loss_level(device, args.reps)
    if not args.skip_step:
        step_level(device, args.step_reps or (20 if device.type == 'cuda' else 3), args.batch_size)


if __name__ == '__main__':
    main()
