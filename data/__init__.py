"""Datasets, views and loaders for the three scripts, by concern:

- ``data/sources.py``: the dataset table (``DATASETS``, one row per ``--dataset``) and the in-memory readers
  (digits, CIFAR-10/100, STL-10);
- ``data/folders.py``: the image-file datasets (ImageFolder trees, ImageNet-100, Tiny ImageNet) and the uint8
  image cache (``--image_cache``);
- ``data/labels.py``: label operations (long tail, coarse labels, noise, labelled fractions, held-out splits);
- ``data/views.py``: augmentations and views (two-crop, multi-crop, RandAugment);
- ``data/loaders.py``: a split as a script trains on it (``build_dataset``) and its loader (``build_loader``).

The scripts import what they use from ``data`` itself (the names below).
"""
from .folders import CachedImages, cached_images, load_image, to_rgb
from .labels import (
    HELD_OUT,
    LABEL_FRACTION,
    LABEL_NOISE,
    LABELS,
    LONG_TAIL,
    NOISE_KINDS,
    TRAIN_SUBSET,
    Relabeled,
    announce_label_fraction,
    class_counts,
    classes_to_classify,
    evaluated_parts,
    held_out_labels,
    labelled_fraction,
    long_tail_class_counts,
    long_tail_counts,
    long_tail_indices,
    noisy_labels,
    num_classes,
    save_label_noise,
    split_train_val,
)
from .loaders import AUGMENT, build_dataset, build_loader, evaluation_loaders, in_memory_images, last_batch_of_one
from .sources import (
    CIFAR10,
    CIFAR100,
    CIFAR100_COARSE,
    CIFAR100_SUPERCLASSES,
    DATASETS,
    DIGITS_COARSE,
    DIGITS_SUPERCLASSES,
    IMAGENET100_CLASSES,
    STL10,
    DatasetInfo,
    Digits,
    coarse_labels,
    dataset_info,
    mean_std,
)
from .views import MULTICROP, MultiCropTransform, TwoCropTransform, build_transform, contrastive_views

__all__ = ['AUGMENT', 'CIFAR10', 'CIFAR100', 'CIFAR100_COARSE', 'CIFAR100_SUPERCLASSES', 'DATASETS', 'DIGITS_COARSE',
           'DIGITS_SUPERCLASSES', 'HELD_OUT', 'IMAGENET100_CLASSES', 'LABELS', 'LABEL_FRACTION', 'LABEL_NOISE',
           'LONG_TAIL', 'MULTICROP', 'NOISE_KINDS', 'STL10', 'TRAIN_SUBSET', 'CachedImages', 'DatasetInfo', 'Digits',
           'MultiCropTransform', 'Relabeled', 'TwoCropTransform', 'announce_label_fraction', 'build_dataset',
           'build_loader', 'build_transform', 'cached_images', 'class_counts', 'classes_to_classify', 'coarse_labels',
           'contrastive_views', 'dataset_info', 'evaluated_parts', 'evaluation_loaders', 'held_out_labels',
           'in_memory_images', 'labelled_fraction', 'last_batch_of_one', 'load_image', 'long_tail_class_counts',
           'long_tail_counts', 'long_tail_indices', 'mean_std', 'noisy_labels', 'num_classes', 'save_label_noise',
           'split_train_val', 'to_rgb']
