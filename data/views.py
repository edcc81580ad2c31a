"""The views of an image: SupContrast's augmentations (``build_transform``), two or more views per sample
(``TwoCropTransform``), multi-crop's small views (``--num_small_crops``) and RandAugment (``--randaugment``),
with their flags (``flags.Feature``). ``--augment device`` batches the same pipeline (``data/augment.py``).
"""
import argparse

import torch
from torchvision import transforms

from core.flags import Feature, check
from networks import timm_problem, timm_sizes

from .sources import dataset_info, mean_std


class TwoCropTransform:
    """Two independent augmentations of one image (SupContrast's name, any number of views)."""

    def __init__(self, transform, n_views=2):
        self.transform, self.n_views = transform, n_views

    def __call__(self, x):
        return [self.transform(x) for _ in range(self.n_views)]


class MultiCropTransform:
    """``n_large`` views by ``large`` and ``n_small`` by ``small`` (Caron et al.'s multi-crop, SwAV 2020): a list of
    ``n_large + n_small`` tensors, the large views first."""

    def __init__(self, large, n_large, small, n_small):
        self.large, self.n_large, self.small, self.n_small = large, n_large, small, n_small

    def __call__(self, x):
        return [self.large(x) for _ in range(self.n_large)] + [self.small(x) for _ in range(self.n_small)]


def contrastive_views(opt):
    """main_supcon.py's view transform: ``--n_views`` views of SupContrast's augmentation, plus ``--num_small_crops``
    views at ``--small_size`` (crops of 5-40 % of the image, SwAV's small crops) when asked."""
    large = build_transform(opt, 'contrastive')
    if not opt.num_small_crops:
        return TwoCropTransform(large, opt.n_views)
    small = build_transform(opt, 'contrastive', size=opt.small_size, scale=(0.05, 0.4))
    return MultiCropTransform(large, opt.n_views, small, opt.num_small_crops)


def build_transform(opt, kind, size=None, scale=None):
    """``kind``: ``'contrastive'`` (SupContrast's SupCon augmentation), ``'train'`` (crop + flip,
    for CE and linear), ``'eval'`` (none). Digits get no flips and milder crops. ``size``, ``scale``: the crop's
    output size and area range instead of ``--size`` and the default (multi-crop's small views)."""
    mean, std = mean_std(opt.dataset, opt.mean, opt.std)
    normalize = transforms.Normalize(mean=mean, std=std)
    info = dataset_info(opt.dataset)
    if kind == 'eval':
        steps = [transforms.Resize(opt.size), transforms.CenterCrop(opt.size)] if info.resize_eval else []
        return transforms.Compose(steps + [transforms.ToTensor(), normalize])
    if info.augment == 'digits':
        steps = [transforms.RandomResizedCrop(size or opt.size, scale=scale or (0.5, 1.0), ratio=(0.8, 1.25)),
                 transforms.RandomRotation(10)]
    else:
        steps = [transforms.RandomResizedCrop(size or opt.size, scale=scale or (0.2, 1.0)),
                 transforms.RandomHorizontalFlip()]
    if kind == 'contrastive':
        steps += [transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                  transforms.RandomGrayscale(p=0.2)]
    if opt.randaugment:              # after the crop (and colour), before the tensor: torchvision's RandAugment
        num_ops, magnitude = opt.randaugment
        steps.append(transforms.RandAugment(num_ops=num_ops, magnitude=magnitude))
    return transforms.Compose(steps + [transforms.ToTensor(), normalize])


def randaugment_spec(text):
    """``--randaugment``'s type: ``'N,M'`` -> ``(N, M)``, whole numbers, ``N >= 1`` and ``M`` in ``0..30``."""
    parts = [p.strip() for p in text.split(',')]
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 1 or int(parts[1]) > 30:
        raise argparse.ArgumentTypeError(f'expected N,M: N >= 1 operations of magnitude M in 0..30, e.g. "2,9"; '
                                         f'got {text!r}')
    return int(parts[0]), int(parts[1])


def _check_multicrop(num_small_crops, small_size, size, augment, chunk_size, queue_size, model, model_args, given):
    check(num_small_crops >= 0, f'--num_small_crops must be >= 0 (0: off), got {num_small_crops}')
    if not num_small_crops:
        check('small_size' not in given, '--small_size needs --num_small_crops')
        return {'small_size': None}
    timm = str(model or '').startswith('timm:') and 'dynamic_img_size' in model_args
    if small_size is None:
        small_size = max(4, round(size * 96 / 224))
        if timm:          # the nearest size below --size that the model takes (a ViT: a multiple of its patch)
            near = tuple(sorted(range(1, size), key=lambda s: (abs(s - small_size), -s))[:16])
            fits = timm_sizes(model[len('timm:'):], size, model_args, near)
            check(fits, f'{model} takes no small-view size near {small_size} (below --size {size}): give '
                        f'--small_size')
            small_size = fits[0]
    check(0 < small_size < size, f'--small_size must be in (0, --size {size}), got {small_size}')
    if timm and 'small_size' in given:
        problem = timm_problem(model[len('timm:'):], size, model_args, (small_size,))
        check(problem is None, f'--small_size {small_size}: {problem}')
    for flag, value, why in (('--augment device', augment == 'device', 'multi-crop runs in the PIL pipeline'),
                             ('--chunk_size', chunk_size, 'gradient caching takes views of one size'),
                             ('--queue_size', queue_size, 'the queue\'s keys come from views of one size')):
        check(not value, f'--num_small_crops cannot go with {flag} ({why}): leave one out')
    check(not str(model or '').startswith('timm:') or 'dynamic_img_size' in model_args,
          f'--num_small_crops gives {model} images of two sizes: a ViT needs --model_args dynamic_img_size=true')
    return {'small_size': small_size}


MULTICROP = Feature(
    'multi-crop (docs/USAGE.md, "Views and RandAugment")', scripts=('supcon',), check=_check_multicrop,
    flags={'--num_small_crops': dict(type=int, default=0,
                                     help='multi-crop: this many more views per sample at --small_size, crops of 5-40 '
                                          '%% of the image, besides the --n_views large ones (default 0: off)'),
           '--small_size': dict(type=int, default=None,
                                help='multi-crop: the small views\' size (default: --size x 96/224)')},
    run_name=lambda num_small_crops, small_size: (f'_multicrop_{num_small_crops}x{small_size}' if num_small_crops
                                                  else ''))


class PendingViews:
    """A batch's views before their augmentation, so that it runs inside the step's compiled graph (``--augment device``
    with ``--compile``: ``data.augment.DeviceLoader`` yields them, :func:`pend_augmentation`). ``images``: uint8
    ``[V*b, C, H, W]`` on the device, each sample once per view, view-major; ``params``: the augmentation's
    parameters, drawn already by the loader (from its generator, as it would have); ``augment(images, params)``: the
    augmentation in its form without host reads; ``channels_last``: the views' memory format. :meth:`views` is the
    list of the ``n_views`` augmented views the loader would have yielded."""

    def __init__(self, images, params, augment, n_views, channels_last=False):
        self.images, self.params, self.augment = images, params, augment
        self.n_views, self.channels_last = n_views, channels_last

    def views(self):
        out = self.augment(self.images, self.params)
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        return list(out.chunk(self.n_views))


def pend_augmentation(loader, on):
    """Have a loader that can (``data.augment.DeviceLoader``, its ``pending``) yield :class:`PendingViews` instead of
    augmented views, when ``on`` (a trainer whose step's forward is compiled takes the augmentation into its graph)."""
    if hasattr(loader, 'pending'):
        loader.pending = on
