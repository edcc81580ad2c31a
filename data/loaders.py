"""A split as the scripts train on it (``build_dataset``: the source, then the label operations) and its loader
(``build_loader``: a DataLoader, or with ``--augment device`` the device-resident loader), with the augmentation
flags (``--augment``, ``--image_cache``, ``--n_views``).
"""
import math
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from core.flags import Feature, UserError, check
from data.augment import DeviceLoader
from datasets_indexed import IndexedDataset

from .folders import CachedImages, cached_images
from .labels import (
    HELD_OUT_NOISE_SEED,
    Relabeled,
    balanced_subset,
    coarse_labels,
    labelled_fraction,
    long_tail_indices,
    noisy_labels,
    split_train_val,
)
from .sources import DATASETS, Digits, dataset_info, mean_std
from .views import build_transform, randaugment_spec

PARTS = ('train', 'val', 'test')


def build_dataset(opt, part, transform, granularity=None):
    """A part of ``opt.dataset`` with ``transform``: ``'train'`` (the training split, or its ``--train_subset``, less
    the held-out part of ``--val_split``), ``'val'`` (that held-out part) or ``'test'`` (the test split, always whole).
    Long-tailed for ``*_lt`` training sets (balanced test sets), with coarse labels for ``granularity='coarse'``
    (default: ``--label_granularity``); the training part also with ``--label_fraction`` and ``--label_noise`` applied
    (after the coarse mapping; ``dataset.label_noise`` then describes it, see :func:`save_label_noise`). The held-out
    part is a stratified draw of ``--split_seed`` from the (long-tailed) training split by its fine labels, before any
    other label operation, so every stage and seed holds out the same images; its labels stay clean, as the test
    split's, unless ``--val_noise same`` (``opt.held_out_noise``): then they get the training labels' rate and kind of
    noise, drawn by ``--seed`` from a stream of their own."""
    if part not in PARTS:
        raise ValueError(f'part must be one of {PARTS}, got {part!r}')
    info = dataset_info(opt.dataset)
    train = part != 'test'                          # read from the training split's files (train and val)
    granularity = granularity or opt.label_granularity
    mapping, classes = coarse_labels(opt.dataset) if granularity == 'coarse' else (None, None)
    if opt.image_cache and not info.in_memory:      # decoded once, at a fixed size, into a uint8 file
        base = cached_images(info.load(opt.data_folder, opt.size, train, None), opt.image_cache,
                             os.path.join(opt.data_folder, '.cache', f'{opt.dataset}_{"train" if train else "val"}'),
                             transform)
    else:
        base = info.load(opt.data_folder, opt.size, train, transform)
    indices = long_tail_indices(base.targets, opt.imb_factor, seed=0) if info.long_tail and train else None
    if train and opt.train_subset:                  # a class-balanced subset, the same in every run and stage
        indices = balanced_subset(base.targets, opt.train_subset, opt.subset_seed).tolist()
    if train and opt.val_split > 0:                 # the held-out part: the same images in every stage and run
        pool = np.arange(len(base)) if indices is None else np.asarray(indices)
        kept, held = split_train_val(np.asarray(base.targets)[pool], opt.val_split, opt.split_seed)
        indices = pool[held if part == 'val' else kept].tolist()
    elif part == 'val':
        raise ValueError('the held-out part needs --val_split > 0')
    labelled = part == 'train'                      # the label operations below: the training part's alone
    if labelled and opt.label_fraction < 1:         # the labelled part: a fixed stratified subset (seed 0)
        pool = np.arange(len(base)) if indices is None else np.asarray(indices)
        indices = pool[labelled_fraction(np.asarray(base.targets)[pool], opt.label_fraction)].tolist()
    noise = labelled and opt.label_noise > 0
    if indices is None and mapping is None and not noise:
        return base
    dataset = Relabeled(base, indices, mapping, classes)
    held_out_noise = opt.held_out_noise
    if part == 'val' and held_out_noise:          # --val_noise same: a draw of its own, by --seed
        dataset.targets, flipped = noisy_labels(dataset.targets, len(dataset.classes), held_out_noise[0], opt.seed,
                                                held_out_noise[1], offset=HELD_OUT_NOISE_SEED)
    if labelled and opt.label_fraction < 1:
        dataset.label_fraction = {'fraction': opt.label_fraction, 'n_labelled': len(dataset),
                                  'n_total': len(pool)}
    if noise:
        clean = dataset.targets
        dataset.targets, flipped = noisy_labels(clean, len(dataset.classes), opt.label_noise, opt.seed,
                                                opt.label_noise_kind)
        dataset.label_noise = {'fraction': opt.label_noise, 'kind': opt.label_noise_kind, 'seed': opt.seed,
                               'granularity': granularity,
                               'n_samples': len(clean), 'n_flipped': len(flipped), 'flipped': flipped,
                               'clean_labels_of_flipped': [clean[i] for i in flipped]}
    return dataset


def evaluation_loaders(opt, parts, granularity=None):
    """``{part: loader}`` of the parts a classifier's run measures after its epochs (``labels.evaluated_parts``: the
    selecting one first), each with the evaluation transform and ``granularity``'s labels."""
    transform = build_transform(opt, 'eval')
    return {part: build_loader(opt, build_dataset(opt, part, transform, granularity), train=False) for part in parts}


def build_loader(opt, dataset, train, kind=None, n_views=None):
    """Training loaders are split over torchrun processes (DistributedSampler, ``--batch_size / W``
    per process); evaluation loaders are not: every process evaluates the whole split. With
    ``--augment device`` a training loader is an :class:`augment.DeviceLoader` that augments batches on
    the device as ``build_transform(opt, kind)`` would (``n_views`` views each, as ``TwoCropTransform``), and an
    evaluation loader reads the split from the device (normalized, in order)."""
    if opt.augment == 'device':
        images, targets = in_memory_images(dataset)
        return DeviceLoader(dataset, images, targets, kind if train else 'eval', device=opt.device,
                            drop_last=train and last_batch_of_one(len(images), opt.world_size, opt.local_batch_size),
                            batch_size=opt.local_batch_size if train else opt.batch_size, size=opt.size,
                            mean_std=mean_std(opt.dataset, opt.mean, opt.std), style=dataset_info(opt.dataset).augment,
                            n_views=n_views, seed=opt.seed, world_size=opt.world_size, rank=opt.rank,
                            channels_last=opt.channels_last)
    sampler = None
    if train and opt.world_size > 1:
        sampler = DistributedSampler(dataset, num_replicas=opt.world_size, rank=opt.rank, shuffle=True,
                                     seed=opt.seed, drop_last=False)
    # an evaluation loader draws its workers' seed from a generator of its own, not from the global RNG: a pass of
    # the kNN monitor must not move the training run's random numbers
    return DataLoader(dataset, batch_size=opt.local_batch_size if train else opt.batch_size,
                      shuffle=train and sampler is None, sampler=sampler, num_workers=opt.num_workers,
                      pin_memory=opt.device.type == 'cuda',
                      drop_last=train and last_batch_of_one(len(dataset), opt.world_size, opt.local_batch_size),
                      generator=None if train else torch.Generator().manual_seed(0))


def last_batch_of_one(n, world_size, batch_size):
    """Whether an epoch of ``n`` samples, split over ``world_size`` processes (``DistributedSampler`` pads each to
    ``ceil(n / W)``) in batches of ``batch_size``, ends with a batch of one sample: BatchNorm cannot train on it,
    so training loaders drop that batch (the sample is seen in other epochs' orders)."""
    per_process = math.ceil(n / world_size)
    return per_process > 1 and per_process % batch_size == 1


def in_memory_images(dataset):
    """``(uint8 [N, H, W, C] numpy array, targets list)`` of a dataset whose images are held in memory:
    :class:`Digits`, Fashion-MNIST, torchvision's CIFAR, and the views of them that this module builds (``Relabeled``
    subsets and label maps, ``Subset``, ``IndexedDataset``): what ``--augment device`` puts on the device."""
    if isinstance(dataset, IndexedDataset):
        return in_memory_images(dataset.base)
    if isinstance(dataset, Subset):
        images, targets = in_memory_images(dataset.dataset)
        idx = np.asarray(dataset.indices)
        return images[idx], np.asarray(targets)[idx].tolist()
    if isinstance(dataset, Relabeled):
        images, _ = in_memory_images(dataset.base)
        return images[np.asarray(dataset.indices)], list(dataset.targets)
    if isinstance(dataset, Digits):
        return np.stack([np.asarray(im) for im in dataset.images]), list(dataset.targets)
    if isinstance(dataset, CachedImages):
        return np.array(dataset.data), list(dataset.targets)         # into memory (the file is read-only)
    data = getattr(dataset, 'data', None)
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 4:
        return data, list(dataset.targets)
    raise UserError(f'--augment device needs a training set held in memory (digits, fashion_mnist, cifar10, '
                    f'cifar100 and their _lt and coarse forms), not {type(dataset).__name__}; use --augment cpu')


def _check_augment(augment, dataset, randaugment, n_views, image_cache, device):
    check(image_cache >= 0, f'--image_cache must be >= 0 (0: off), got {image_cache}')
    resolved = {}
    if augment == 'auto':       # the batched augmentation on a GPU where it can run; the PIL pipeline elsewhere
        from runtime.device import device_type
        can = (dataset_info(dataset).in_memory or image_cache) and not randaugment
        augment = resolved['augment'] = 'device' if device_type(device) == 'cuda' and can else 'cpu'
    check(not image_cache or not dataset_info(dataset).in_memory,
          f'--image_cache is for datasets read from image files; --dataset {dataset} is held in memory already')
    if augment == 'device':
        in_memory = ', '.join(name for name, row in DATASETS.items() if row.in_memory)
        check(dataset_info(dataset).in_memory or image_cache,
              f'--augment device needs a dataset held in memory ({in_memory}); --dataset {dataset} is read from '
              f'image files: use --augment cpu, or --image_cache SIZE to decode them once into a uint8 file')
        check(not randaugment, '--randaugment runs in the PIL pipeline only (its 14 operations are not batched on the '
                               'device here): use --augment cpu')
    check(n_views >= 2, f'--n_views must be >= 2 (a contrastive loss needs two views of a sample), got {n_views}')
    return resolved


AUGMENT = Feature(
    'augmentation (docs/AUGMENT.md)', check=_check_augment, where_it_ran=('augment',),
    flags={'--augment': dict(choices=['auto', 'cpu', 'device'], default='auto',
                             help='training augmentation: cpu (per image, PIL, DataLoader workers: SupContrast\'s), '
                                  'device (the same pipeline batched on --device; in-memory datasets), or auto '
                                  '(device on CUDA where it can run, cpu elsewhere)'),
           '--randaugment': dict(type=randaugment_spec, default=None,
                                 help='add RandAugment with N operations of magnitude M, e.g. "2,9" (PIL pipeline: '
                                      '--augment cpu; default: off)'),
           '--image_cache': dict(type=int, default=0,
                                 help='image-file datasets: decode every image once at this size (shorter side, '
                                      'centre crop) into a uint8 file under --data_folder/.cache, which --augment '
                                      'device serves without PIL (default 0: off)'),
           '--n_views': dict(type=int, default=2, scripts=('supcon',),
                             help='augmented views of each sample in a batch (default 2; every method takes V views)')},
    run_name=lambda augment, randaugment, n_views, image_cache: ('_devaug' if augment == 'device' else '')
    + (f'_cache_{image_cache}' if image_cache else '')
    + (f'_randaug_{randaugment[0]}_{randaugment[1]}' if randaugment else '')
    + (f'_views_{n_views}' if n_views != 2 else ''))
