"""Label operations on a training split: the long tail (LDAM's profile, ``--imb_factor``), coarse labels
(``--label_granularity``), label noise (``--label_noise``), a labelled fraction (``--label_fraction``) and the
held-out split (``--val_split``, ``--split_seed``, ``--eval_split``), with their flags (``flags.Feature``).
"""
import math
import os

import numpy as np
from torch.utils.data import Dataset, Subset

from core.flags import Feature, UserError, check
from runtime.distributed import is_main

from .sources import coarse_labels, dataset_info


def long_tail_counts(n_max, n_classes, imb_factor):
    """LDAM's exponential profile (Cao et al. 2019): class c keeps ``int(n_max * imb_factor**(c / (C-1)))``."""
    return [int(n_max * imb_factor ** (c / (n_classes - 1.0))) for c in range(n_classes)]


def long_tail_indices(targets, imb_factor, seed=0):
    """Indices of a long-tailed subset: per class, the first ``long_tail_counts`` of a seeded shuffle."""
    targets = np.asarray(targets)
    n_classes = int(targets.max()) + 1
    counts = long_tail_counts(int(np.bincount(targets).max()), n_classes, imb_factor)
    rng = np.random.RandomState(seed)
    keep = []
    for c, n in enumerate(counts):
        idx = np.flatnonzero(targets == c)
        rng.shuffle(idx)
        keep.extend(idx[:n].tolist())
    return sorted(keep)


class Relabeled(Dataset):
    """A view of ``base``: optionally a subset (``indices``) and/or labels mapped through ``mapping``.

    ``targets``/``classes`` are the new ones; ``fine_targets`` keeps the original labels.
    """

    def __init__(self, base, indices=None, mapping=None, classes=None):
        self.base = base
        self.indices = list(range(len(base))) if indices is None else list(indices)
        fine = np.asarray(base.targets)[self.indices]
        self.fine_targets = fine.tolist()
        self.targets = fine.tolist() if mapping is None else np.asarray(mapping)[fine].tolist()
        self.classes = list(base.classes) if classes is None else list(classes)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        x, _ = self.base[self.indices[i]]
        return x, self.targets[i]


def class_counts(dataset):
    """Training samples per class (for many/medium/few-shot groups); unlabelled samples (-1) are not counted."""
    targets = np.asarray(dataset.targets)
    return np.bincount(targets[targets >= 0], minlength=num_classes(dataset)).tolist()


LABEL_NOISE_SEED = 7717       # offset of the label-noise generator from --seed (its own stream)
HELD_OUT_NOISE_SEED = 15401   # offset of the held-out part's (--val_noise same): a stream of its own again


NOISE_KINDS = ('symmetric', 'pairflip')


def noisy_labels(targets, n_classes, fraction, seed, kind='symmetric', offset=LABEL_NOISE_SEED):
    """Label noise: each label is, with probability ``fraction``, replaced by another class: one of the other
    ``n_classes - 1`` uniformly (``symmetric``), or the next class ``(c + 1) mod n_classes`` (``pairflip``, the
    asymmetric noise of Han et al. 2018, "Co-teaching"). About ``fraction`` of the labels change. Deterministic
    in ``seed``; ``offset`` names the stream (the training part's, or the held-out part's ``HELD_OUT_NOISE_SEED``:
    independent draws). Returns ``(new labels list, flipped indices list)``."""
    if kind not in NOISE_KINDS:
        raise ValueError(f'kind must be one of {NOISE_KINDS}, got {kind!r}')
    if n_classes < 2:
        raise UserError(f'--label_noise needs at least 2 classes, the training set has {n_classes}')
    rng = np.random.RandomState((seed + offset) % 2 ** 32)
    targets = np.asarray(targets)
    flip = rng.rand(len(targets)) < fraction
    shift = rng.randint(1, n_classes, len(targets)) if kind == 'symmetric' else np.ones(len(targets), dtype=int)
    noisy = np.where(flip, (targets + shift) % n_classes, targets)
    return noisy.tolist(), np.flatnonzero(flip).tolist()


def labelled_fraction(targets, fraction, seed=0):
    """Sorted positions of a stratified ``fraction`` of ``targets``: from each class ``max(1, round(fraction * n_c))``
    of its ``n_c`` samples, drawn by a fixed ``seed`` (``--label_fraction``: the same labelled subset for every run
    and method, as solo-learn's data fraction, so that runs pair)."""
    rng = np.random.RandomState(seed)
    targets = np.asarray(targets)
    chosen = []
    for c in np.unique(targets):
        members = np.flatnonzero(targets == c)
        chosen.append(rng.permutation(members)[:max(1, int(round(fraction * len(members))))])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def balanced_subset(targets, n, seed=0):
    """Sorted positions of a class-balanced subset of ``n`` of ``targets`` (``--train_subset``): each of the C classes
    gives ``n // C`` images, the first ``n % C`` classes one more, drawn by ``seed`` (a stream of its own, not
    ``--seed``: every run and stage trains on the same images). A class with fewer images than its share is a
    :class:`UserError`."""
    targets = np.asarray(targets)
    classes, counts = np.unique(targets, return_counts=True)
    shares = [n // len(classes) + (i < n % len(classes)) for i in range(len(classes))]
    short = [(c, have, want) for c, have, want in zip(classes, counts, shares) if have < want]
    if short:
        c, have, want = short[0]
        raise UserError(f'--train_subset {n} takes {want} images of each class, and class {c} has {have}: use at most '
                        f'{int(counts.min()) * len(classes)}')
    rng = np.random.RandomState(seed % 2 ** 32)
    chosen = [rng.permutation(np.flatnonzero(targets == c))[:want] for c, want in zip(classes, shares)]
    return np.sort(np.concatenate(chosen))


def announce_label_fraction(dataset):
    """With ``--label_fraction``: one line saying how many labelled training images the run uses (rank 0)."""
    part = getattr(dataset, 'label_fraction', None)
    if part is not None and is_main():
        print(f'--label_fraction {part["fraction"]:g}: {part["n_labelled"]} labelled training images of '
              f'{part["n_total"]} (a fixed stratified subset, at least one per class)', flush=True)


def save_label_noise(run_folder, dataset):
    """``<run>/label_noise.json``: which training labels ``--label_noise`` changed (rank 0; nothing without noise)."""
    noise = getattr(dataset, 'label_noise', None)        # IndexedDataset passes it through
    if noise is not None and is_main():
        import json
        with open(os.path.join(run_folder, 'label_noise.json'), 'w') as f:
            json.dump(noise, f)


def long_tail_class_counts(dataset_name, dataset):
    """Training samples per class for the many/medium/few-shot groups of long-tailed datasets, else ``None``."""
    return class_counts(dataset) if dataset_info(dataset_name).long_tail else None


def num_classes(dataset):
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return len(dataset.classes)   # IndexedDataset passes it through


def classes_to_classify(dataset):
    """:func:`num_classes` of a training split a classifier (main_ce.py, main_linear.py) is built for: at least 2,
    else a :class:`UserError` (a one-class classifier is right by construction: its 100 % means nothing)."""
    n = num_classes(dataset)
    if n < 2:
        while isinstance(dataset, Subset):
            dataset = dataset.dataset
        raise UserError(f'the training split has {n} class ({", ".join(map(str, dataset.classes))}): a classifier '
                        'needs at least 2 (contrastive pre-training without labels, --method SimCLR, takes one)')
    return n


def evaluated_parts(val_split, eval_split):
    """The parts a run measures after its epochs, the one that selects first: ``('val', 'test')`` with a held-out
    part, ``('val',)`` with ``--eval_split val`` (no test image is read), ``('test',)`` without one (SupContrast's
    habit: selection on the test split)."""
    if eval_split == 'val':
        return ('val',)
    return ('val', 'test') if val_split > 0 else ('test',)


def split_train_val(targets, val_fraction, seed):
    """Stratified split of indices ``0..len(targets)-1`` into (train, held-out) sorted lists: ``ceil(fraction * N)``
    held out, stratified by class. A split that cannot hold every class on both sides (a class with one
    image, or fewer held-out or remaining images than classes) is a :class:`UserError` naming the usable range."""
    from sklearn.model_selection import train_test_split
    targets = np.asarray(targets)
    classes, counts = np.unique(targets, return_counts=True)
    n, n_classes = len(targets), len(classes)
    if counts.min() < 2:
        raise UserError(f'--val_split needs 2 training images of every class (one to train on, one to hold out); '
                        f'class {classes[counts.argmin()]} has {counts.min()}')
    n_val = math.ceil(val_fraction * n)
    if not n_classes <= n_val <= n - n_classes:
        raise UserError(f'--val_split {val_fraction} holds out {n_val} of the {n} training images, but each part needs '
                        f'one of each of the {n_classes} classes: use a value in [{n_classes / n:.4g}, '
                        f'{(n - n_classes) / n:.4g}]')
    train_idx, val_idx = train_test_split(np.arange(n), test_size=n_val, stratify=targets, random_state=seed % 2 ** 32)
    return np.sort(train_idx).tolist(), np.sort(val_idx).tolist()


# ---------------------------------------------------------------- the data features' flags (core/flags.py)
def _check_labels(label_granularity, eval_labels, dataset):
    if 'coarse' in (label_granularity, eval_labels):
        coarse_labels(dataset)    # a one-line error for datasets without superclasses


LABELS = Feature(
    'labels: coarse-to-fine', check=_check_labels,
    flags={'--label_granularity': dict(choices=['fine', 'coarse'], default='fine', scripts=('supcon', 'ce'),
                                       help='train on coarse labels: the 20 CIFAR-100 superclasses, 5 digit groups or '
                                            '3 Fashion-MNIST groups'),
           '--eval_labels': dict(choices=['fine', 'coarse'], default='fine', scripts=('linear',),
                                 help='labels of the linear classifier (fine: CIFAR-100 classes / digits)')},
    run_name=lambda label_granularity, eval_labels: ('_coarse' if label_granularity == 'coarse' else '')
    + ('_evalcoarse' if eval_labels == 'coarse' else ''))


LONG_TAIL = Feature(
    'long tail (digits_lt, cifar10_lt, cifar100_lt)',
    flags={'--imb_factor': dict(type=float, default=0.01,
                                help='digits_lt/cifar10_lt/cifar100_lt: smallest/largest class size of the training '
                                     'set')},
    check=lambda imb_factor: check(0 < imb_factor <= 1, f'--imb_factor must be in (0, 1], got {imb_factor}'),
    run_name=lambda imb_factor, dataset: f'_imb_{imb_factor}' if dataset_info(dataset).long_tail else '')


LABEL_FRACTION = Feature(
    'label fractions (docs/USAGE.md, "Fine-tuning and label fractions")', scripts=('ce', 'linear'),
    flags={'--label_fraction': dict(type=float, default=1.0,
                                    help='train on this fraction of the training labels: a fixed stratified subset '
                                         '(at least one image per class), e.g. 0.01 or 0.1 (default 1: all)')},
    check=lambda label_fraction: check(0 < label_fraction <= 1,
                                       f'--label_fraction must be in (0, 1], got {label_fraction}'),
    run_name=lambda label_fraction: f'_labels_{label_fraction}' if label_fraction < 1 else '')


def _check_label_noise(label_noise, label_noise_kind, given, val_noise, val_split, script, stage1_label_noise):
    check(0 <= label_noise < 1, f'--label_noise must be in [0, 1), got {label_noise}')
    check(label_noise > 0 or 'label_noise_kind' not in given, '--label_noise_kind needs --label_noise > 0')
    if val_noise == 'clean':
        return {'held_out_noise': None}
    check(val_split > 0, '--val_noise same gives the held-out part noisy labels: give --val_split > 0 too')
    if label_noise > 0:
        return {'held_out_noise': [label_noise, label_noise_kind]}
    check(script == 'linear' and stage1_label_noise,
          '--val_noise same gives the held-out part the training labels\' noise: give --label_noise > 0 too'
          + (' (or --ckpt of a stage-1 run trained with it)' if script == 'linear' else ''))
    return {'held_out_noise': list(stage1_label_noise)}


def held_out_labels(held_out_noise):
    """What results.json says of the held-out part's labels: ``clean``, or ``noisy (0.4 symmetric)``."""
    return f'noisy ({held_out_noise[0]:g} {held_out_noise[1]})' if held_out_noise else 'clean'


LABEL_NOISE = Feature(
    'label noise (docs/PROBES.md)', check=_check_label_noise,
    flags={'--label_noise': dict(type=float, default=0.0,
                                 help='label noise: this fraction of the training labels replaced by another class, '
                                      'seeded by --seed and recorded in <run>/label_noise.json; test labels stay '
                                      'clean'),
           '--label_noise_kind': dict(choices=list(NOISE_KINDS), default='symmetric',
                                      help='symmetric: any other class, uniformly; pairflip: the next class (c + 1 '
                                           'mod C)'),
           '--val_noise': dict(choices=['clean', 'same'], default='clean',
                               help='the held-out part\'s labels (--val_split): clean, or the same rate and kind of '
                                    'noise as the training labels, drawn independently (a user with noisy labels '
                                    'has no clean held-out set; main_linear.py: its stage-1 run\'s noise unless '
                                    'given --label_noise); the test split stays clean')},
    run_name=lambda label_noise, label_noise_kind, val_noise: (
        (f'_noise_{"" if label_noise_kind == "symmetric" else label_noise_kind + "_"}{label_noise}'
         if label_noise else '') + ('_valnoise' if val_noise == 'same' else '')))


def _check_subset(train_subset, subset_seed, dataset, given):
    check(train_subset >= 0, f'--train_subset must be >= 0 (0: the whole training split), got {train_subset}')
    check(train_subset > 0 or 'subset_seed' not in given, '--subset_seed draws --train_subset: give it too')
    check(not train_subset or not dataset_info(dataset).long_tail,
          f'--train_subset draws a class-balanced subset, and --dataset {dataset} is long-tailed: use --imb_factor')
    check(not train_subset or dataset_info(dataset).labelled is None,
          f'--train_subset draws by class, and --dataset {dataset} has unlabelled images')
    check(0 <= subset_seed < 2 ** 32, f'--subset_seed must be in [0, 2^32), got {subset_seed}')


TRAIN_SUBSET = Feature(
    'a class-balanced training subset (docs/USAGE.md, "Datasets")', check=_check_subset,
    flags={'--train_subset': dict(type=int, default=0,
                                  help='train on N images of the training split, as many of each class, drawn by '
                                       '--subset_seed (the same images in every run and stage; the held-out part of '
                                       '--val_split comes out of them; the test split stays whole; 0: all)'),
           '--subset_seed': dict(type=int, default=0,
                                 help='seed of the --train_subset draw (its own, not --seed)')},
    run_name=lambda train_subset, subset_seed: (f'_subset_{train_subset}' + (f'_{subset_seed}' if subset_seed else '')
                                                if train_subset else ''))


def _check_held_out(val_split, split_seed, eval_split, dataset, given, test_every, script):
    check(0 <= val_split < 1, f'--val_split must be in [0, 1), got {val_split}')
    check(val_split > 0 or 'split_seed' not in given, '--split_seed draws the held-out part: give --val_split > 0 too')
    check(eval_split == 'test' or val_split > 0,
          '--eval_split val evaluates on the held-out part: give --val_split > 0 too (e.g. 0.2)')
    check(val_split == 0 or dataset_info(dataset).labelled is None,
          f'--val_split holds out labelled images, and --dataset {dataset} has none: hold them out in the stage that '
          f'reads labels')
    check(0 <= split_seed < 2 ** 32, f'--split_seed must be in [0, 2^32), got {split_seed}')
    if test_every == 'auto':        # with a held-out part to select on: the test split read once
        return {'test_every': 'end' if val_split > 0 else 'epoch'}
    return {}


HELD_OUT = Feature(
    'held-out split (docs/USAGE.md, "Held-out data")', check=_check_held_out, resume_may_change=('test_every',),
    flags={'--val_split': dict(type=float, default=0.0,
                               help='hold out this stratified fraction of the training set in every stage: never '
                                    'trained on, measured by the kNN monitor and by the epoch selection (the same '
                                    'images in every run and stage with the same --split_seed; 0: none)'),
           '--split_seed': dict(type=int, default=0,
                                help='seed of the held-out draw (its own, not --seed: runs of every seed and both '
                                     'stages hold out the same images)'),
           '--eval_split': dict(choices=['test', 'val'], default='test',
                                help='val: every evaluation measures the held-out part instead of the test split, '
                                     'which is not read at all (tuning); test: the test split too (default)'),
           '--test_every': dict(choices=['auto', 'epoch', 'end'], default='auto',
                                help='when the test split is read: end (once, after the last epoch: the epoch is '
                                     'selected on the held-out part, or is the last; main_supcon.py: the kNN '
                                     'monitor measures the test split at the last epoch only), epoch (after every '
                                     'epoch, SupContrast\'s curve; the monitor every --knn_every), auto (end with '
                                     '--val_split, epoch without)')},
    run_name=lambda val_split, split_seed, eval_split: (
        (f'_val_{val_split}' + (f'_split_{split_seed}' if split_seed else '') if val_split else '')
        + ('_valonly' if eval_split == 'val' else '')))
