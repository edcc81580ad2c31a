"""The scale of stage-1 encoders' features: what a linear probe at a fixed learning rate sees.

    python benchmarks/feature_scale.py CKPT [CKPT ...] [--device cpu]
    python benchmarks/feature_scale.py --smoke          # an untrained resnet_nano on the digits

For each checkpoint: the mean L2 norm of the encoder's features (the frozen features a linear probe is trained on,
before any normalization) over its dataset's test split, with its standard deviation over images, and the mean
per-dimension standard deviation. A plain linear probe's logits, and so its effective learning rate, grow with the
norm: two encoders whose features differ in scale by a factor k train a fixed-rate probe at rates that differ by
k^2 (docs/results.md, "The probe and the features' scale").
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from config.options import parse_option  # noqa: E402
from data import build_dataset, build_loader, build_transform  # noqa: E402
from networks import SupConResNet  # noqa: E402
from runtime.checkpoint import load_encoder  # noqa: E402
from runtime.device import Runtime  # noqa: E402


def scale(encoder, loader, runtime):
    """(mean feature norm, its std over images, mean per-dimension std) of ``encoder`` over ``loader``."""
    norms, feats = [], []
    with torch.no_grad():
        for images, _ in loader:
            h = encoder(runtime.to_device(images)).float()
            norms.append(h.norm(dim=1))
            feats.append(h)
    norms, feats = torch.cat(norms), torch.cat(feats)
    return norms.mean().item(), norms.std().item(), feats.std(dim=0).mean().item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('ckpt', nargs='*', help='stage-1 checkpoints (last.pth)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--smoke', action='store_true', help='an untrained resnet_nano on the digits at 8 px')
    args = p.parse_args()
    if not args.ckpt and not args.smoke:
        p.error('give one or more checkpoints, or --smoke')
    for ckpt in args.ckpt or [None]:
        flags = ['--ckpt', ckpt] if ckpt else ['--ckpt', 'none', '--size', '8']
        opt = parse_option('linear', [*flags, '--device', args.device, '--num_workers', '0', '--augment', 'cpu'])
        opt.device = torch.device(args.device)
        runtime = Runtime(opt.device)
        if ckpt:
            encoder, _ = load_encoder(ckpt, None, None, runtime)
        else:
            encoder = SupConResNet('resnet_nano').encoder.eval()
        loader = build_loader(opt, build_dataset(opt, 'test', build_transform(opt, 'eval')), train=False)
        mean, spread, per_dim = scale(encoder, loader, runtime)
        print(f'{ckpt or "untrained resnet_nano"}: feature norm {mean:.4g} ± {spread:.3g} over images, '
              f'per-dimension std {per_dim:.4g}', flush=True)


if __name__ == '__main__':
    main()
