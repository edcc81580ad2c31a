"""Datasets, augmentations and loaders for all three scripts.

``cifar10`` / ``cifar100`` (torchvision files under ``--data_folder``, downloaded
when possible), their long-tailed training sets ``cifar10_lt`` / ``cifar100_lt``
(``--imb_factor``), ``path`` (ImageFolder with ``train/`` and ``val/``), and
``digits``: scikit-learn's 1,797 bundled 8x8 handwritten digits, a fixed
stratified 80/20 train/test split, upsampled to ``--size`` and made RGB.
``--label_granularity coarse`` trains on superclasses (CIFAR-100's 20, digits' 5).
"""
import argparse
import functools
import math
import os
import pickle
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets, transforms

from augment import DeviceLoader
from datasets_indexed import IndexedDataset
from distributed import barrier, is_main
from flags import Feature, UserError, check
from networks import timm_problem
from util import progress, writable_folder

# CIFAR-100's 20 superclasses (Krizhevsky 2009), 5 fine classes each. Fine and coarse indices are
# the alphabetical orders of the names, as in the dataset's meta file.
CIFAR100_SUPERCLASSES = {
    'aquatic_mammals': ['beaver', 'dolphin', 'otter', 'seal', 'whale'],
    'fish': ['aquarium_fish', 'flatfish', 'ray', 'shark', 'trout'],
    'flowers': ['orchid', 'poppy', 'rose', 'sunflower', 'tulip'],
    'food_containers': ['bottle', 'bowl', 'can', 'cup', 'plate'],
    'fruit_and_vegetables': ['apple', 'mushroom', 'orange', 'pear', 'sweet_pepper'],
    'household_electrical_devices': ['clock', 'keyboard', 'lamp', 'telephone', 'television'],
    'household_furniture': ['bed', 'chair', 'couch', 'table', 'wardrobe'],
    'insects': ['bee', 'beetle', 'butterfly', 'caterpillar', 'cockroach'],
    'large_carnivores': ['bear', 'leopard', 'lion', 'tiger', 'wolf'],
    'large_man-made_outdoor_things': ['bridge', 'castle', 'house', 'road', 'skyscraper'],
    'large_natural_outdoor_scenes': ['cloud', 'forest', 'mountain', 'plain', 'sea'],
    'large_omnivores_and_herbivores': ['camel', 'cattle', 'chimpanzee', 'elephant', 'kangaroo'],
    'medium_mammals': ['fox', 'porcupine', 'possum', 'raccoon', 'skunk'],
    'non-insect_invertebrates': ['crab', 'lobster', 'snail', 'spider', 'worm'],
    'people': ['baby', 'boy', 'girl', 'man', 'woman'],
    'reptiles': ['crocodile', 'dinosaur', 'lizard', 'snake', 'turtle'],
    'small_mammals': ['hamster', 'mouse', 'rabbit', 'shrew', 'squirrel'],
    'trees': ['maple_tree', 'oak_tree', 'palm_tree', 'pine_tree', 'willow_tree'],
    'vehicles_1': ['bicycle', 'bus', 'motorcycle', 'pickup_truck', 'train'],
    'vehicles_2': ['lawn_mower', 'rocket', 'streetcar', 'tank', 'tractor'],
}
_FINE = sorted(n for names in CIFAR100_SUPERCLASSES.values() for n in names)
_COARSE = sorted(CIFAR100_SUPERCLASSES)
CIFAR100_COARSE = [next(c for c, name in enumerate(_COARSE) if fine in CIFAR100_SUPERCLASSES[name])
                   for fine in _FINE]
# digits: a fixed grouping of the 10 digits into 5 coarse classes by shape (documented in docs/USAGE.md)
DIGITS_SUPERCLASSES = {'0-6': [0, 6], '1-7': [1, 7], '2-5': [2, 5], '3-8': [3, 8], '4-9': [4, 9]}
DIGITS_COARSE = [next(c for c, fines in enumerate(DIGITS_SUPERCLASSES.values()) if d in fines) for d in range(10)]

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


class Digits(Dataset):
    """scikit-learn's bundled handwritten digits as ``size x size`` RGB PIL images.

    The split is fixed: stratified, 20 % test, ``random_state=0`` (1,437 train / 360 test).
    """

    def __init__(self, train=True, size=16, transform=None):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        digits = load_digits()
        idx = np.arange(len(digits.target))
        train_idx, test_idx = train_test_split(idx, test_size=0.2, stratify=digits.target, random_state=0)
        keep = np.sort(train_idx if train else test_idx)
        pixels = (digits.images[keep] * (255.0 / 16.0)).round().astype(np.uint8)
        self.images = [Image.fromarray(p, mode='L').resize((size, size), Image.BILINEAR).convert('RGB')
                       for p in pixels]
        self.targets = digits.target[keep].tolist()
        self.classes = [str(c) for c in range(10)]
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img = self.images[index]
        return (self.transform(img) if self.transform else img), self.targets[index]


def _cifar_files(cls):
    return [name for name, _ in cls.train_list + cls.test_list] + [cls.meta['filename']]


class _FilesPresentMixin:
    """torchvision's CIFAR checks archive MD5s; we accept any files that are present and readable, and check what
    they hold instead: as many labels as images, labels in range (:meth:`_check_contents`)."""

    def __init__(self, *args, **kwargs):
        try:
            super().__init__(*args, **kwargs)
        except ValueError:            # batches of different widths: torchvision's stacking fails
            self._check_files(None)
            raise
        targets = np.asarray(self.targets)
        if len(targets) != len(self.data) or (len(targets) and (targets.min() < 0 or
                                                                targets.max() >= len(self.classes))):
            self._check_files(len(self.classes))
            raise UserError(f'the files in {os.path.join(self.root, self.base_folder)} disagree: {len(self.data)} '
                            f'images but {len(targets)} labels')

    def _check_files(self, n_classes):
        """Every batch file of this split holds as many labels as 3,072-byte images, each label one of the
        ``n_classes`` of the meta file: else a :class:`UserError` naming the file (read again only then)."""
        folder = os.path.join(self.root, self.base_folder)
        for name, _ in (self.train_list if self.train else self.test_list):
            path = os.path.join(folder, name)
            with open(path, 'rb') as f:
                entry = pickle.load(f, encoding='latin1')
            data = np.asarray(entry['data'])
            labels = np.asarray(entry['labels'] if 'labels' in entry else entry.get('fine_labels', []))
            if len(labels) != len(data) or data.size != len(data) * 3072:
                raise UserError(f'{path} holds {len(labels)} labels for {data.size / 3072:g} images of 32 x 32 x 3 '
                                f'bytes: the file is damaged; replace it')
            bad = labels[(labels < 0) | (labels >= n_classes)] if n_classes else []
            if len(bad):
                raise UserError(f'{path} holds label {int(bad[0])}, outside 0..{n_classes - 1} (the {n_classes} '
                                f'classes of {self.meta["filename"]}): the file is damaged; replace it')

    def _check_integrity(self):
        folder = os.path.join(self.root, self.base_folder)
        return all(os.path.isfile(os.path.join(folder, name)) for name in _cifar_files(type(self)))

    def _load_meta(self):
        with open(os.path.join(self.root, self.base_folder, self.meta['filename']), 'rb') as f:
            self.classes = pickle.load(f, encoding='latin1')[self.meta['key']]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


class CIFAR10(_FilesPresentMixin, datasets.CIFAR10):
    pass


class CIFAR100(_FilesPresentMixin, datasets.CIFAR100):
    pass


def _cifar(cls):
    """Loader of CIFAR-10 or CIFAR-100 files under ``--data_folder`` (downloaded when missing and online)."""
    def load(data_folder, size, train, transform):
        where = os.path.join(data_folder, cls.base_folder)
        present = all(os.path.isfile(os.path.join(where, name)) for name in _cifar_files(cls))
        return read_files(lambda: cls(data_folder, train=train, transform=transform, download=not present),
                          cls.__name__.lower(), where, f'the python-version files ({", ".join(_cifar_files(cls))})')
    return load


def read_files(make, name, where, files):
    """``make()`` (a torchvision dataset that downloads what is missing when online) under torchrun: rank 0 first,
    the others after it; offline, unreadable or corrupt files are one line naming ``files`` and ``--data_folder``."""
    if not is_main():
        barrier()   # under torchrun, rank 0 downloads (if needed) while the others wait
    try:
        dataset = make()
        if is_main():
            barrier()
        return dataset
    except UserError:         # the reader's own one line (a file that disagrees with itself): as it is
        raise
    except Exception as e:  # offline, unreadable or corrupt files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f'{name} not found or unreadable in {where} ({reason}); put {files} there '
                        f'or point --data_folder at their parent') from None


def load_image(path):
    """ImageFolder's loader (RGB PIL image) with a one-line error for a file that is not a readable image;
    16-bit grey images are scaled to 8 bits (:func:`to_rgb`), not clipped."""
    try:
        with open(path, 'rb') as f:
            return to_rgb(Image.open(f), path)
    except (OSError, ValueError) as e:     # PIL's UnidentifiedImageError is an OSError
        raise unreadable_image(path, e) from None


def unreadable_image(path, error):
    """The one-line error of an image file that cannot be read (a broken link, a damaged file)."""
    return UserError(f'cannot read image {path} ({type(error).__name__}); remove or replace that file '
                     f'(every file under the train/ and val/ class folders must be a readable image)')


SIXTEEN_BIT_MODES = ('I;16', 'I;16B', 'I;16L', 'I;16N')


def to_rgb(image, path):
    """``image`` as 8-bit RGB. PIL's own ``convert('RGB')`` clips a 16-bit grey image (modes ``I;16*``, or ``I``
    holding values above 255) at 255, leaving two grey levels; here it is scaled, ``round(v * 255 / 65535)``. An
    ``I`` image within 0..255 is 8-bit data. Values outside 0..65535, or floating-point pixels (mode ``F``, no
    known range), are a :class:`UserError` naming the file."""
    if image.mode == 'F':
        raise UserError(f'{path} has floating-point pixels (mode F), whose range is unknown: convert it to an 8- or '
                        '16-bit image')
    if image.mode in SIXTEEN_BIT_MODES or image.mode == 'I':
        values = np.asarray(image).astype(np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise UserError(f'{path} has pixel values outside 0..65535 (mode {image.mode}): convert it to an 8- or '
                            '16-bit image')
        full = 65535 if image.mode in SIXTEEN_BIT_MODES or (values.size and values.max() > 255) else 255
        image = Image.fromarray(np.round(values * (255 / full)).astype(np.uint8), 'L')
    return image.convert('RGB')


def _image_folder(data_folder, split, transform):
    folder = os.path.join(data_folder, split)
    if not os.path.isdir(folder):
        raise UserError(f'--dataset path expects ImageFolder sub-folders train/ and val/ in '
                        f'{data_folder}; {folder} is missing')
    try:
        return datasets.ImageFolder(folder, transform=transform, loader=load_image)
    except (FileNotFoundError, OSError) as e:
        raise UserError(f'cannot read images in {folder}: {str(e).splitlines()[0]}') from None


class STL10(datasets.STL10):
    """torchvision's STL-10 (96 px; 5,000 labelled training images, 8,000 test, 100,000 unlabelled) with the files
    accepted when present (no MD5 check of the archive's extracted files), ``targets`` and the images held as one
    uint8 ``[N, H, W, C]`` array (what ``--augment device`` puts on the device). Unlabelled images have label -1."""

    def __init__(self, root, split, transform=None, download=False):
        if not download:
            self._check_files(os.path.join(root, self.base_folder), split)
        super().__init__(root, split=split, transform=transform, download=download)
        self.data = np.ascontiguousarray(self.data.transpose(0, 2, 3, 1))           # NCHW -> NHWC, once
        labels = self.labels.astype(np.int64)
        labelled = len(labels) if split != 'train+unlabeled' else os.path.getsize(
            os.path.join(root, self.base_folder, 'train_y.bin'))
        bad = labels[:labelled][(labels[:labelled] < 0) | (labels[:labelled] > 9)]
        if len(bad):             # torchvision subtracts 1 in uint8: a label 0 became 255
            name = 'test_y.bin' if split == 'test' else 'train_y.bin'
            raise UserError(f'{os.path.join(root, self.base_folder, name)} holds label {(int(bad[0]) + 1) % 256}, '
                            f'outside 1..10 (STL-10\'s classes): the file is damaged; replace it')
        self.targets = labels.tolist()

    @staticmethod
    def _check_files(folder, split):
        """Each images file is whole 3 x 96 x 96 images and its labels file has one byte per image: else a
        :class:`UserError` naming the file (before torchvision reads them)."""
        image_bytes = 3 * 96 * 96
        pairs = [('test_X.bin', 'test_y.bin')] if split == 'test' else [('train_X.bin', 'train_y.bin')]
        if split == 'train+unlabeled':
            pairs.append(('unlabeled_X.bin', None))
        for images, labels in pairs:
            path = os.path.join(folder, images)
            if not os.path.isfile(path):
                continue                 # read_files says which files are missing
            size = os.path.getsize(path)
            if size % image_bytes or not size:
                raise UserError(f'{path} is {size} bytes, not a whole number of 96 x 96 colour images '
                                f'({image_bytes} bytes each): the file is cut short or damaged; replace it')
            label_path = os.path.join(folder, labels) if labels else None
            if label_path and os.path.isfile(label_path) and os.path.getsize(label_path) != size // image_bytes:
                raise UserError(f'{label_path} holds {os.path.getsize(label_path)} labels but {path} holds '
                                f'{size // image_bytes} images: one of them is cut short or damaged; replace it')

    def _check_integrity(self):
        folder = os.path.join(self.root, self.base_folder)
        return all(os.path.isfile(os.path.join(folder, name)) for name, _ in self.train_list + self.test_list)

    def __getitem__(self, index):
        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform is not None else image), self.targets[index]


STL10_FILES = ('train_X.bin', 'train_y.bin', 'test_X.bin', 'test_y.bin', 'unlabeled_X.bin', 'class_names.txt')


def _stl10(data_folder, size, train, transform, unlabeled=False):
    """STL-10's train (with ``unlabeled``: train + the 100,000 unlabelled images, labels -1) or test split."""
    where = os.path.join(data_folder, STL10.base_folder)
    needed = [f for f in STL10_FILES if unlabeled or f != 'unlabeled_X.bin']
    present = all(os.path.isfile(os.path.join(where, name)) for name in needed)
    split = ('train+unlabeled' if unlabeled else 'train') if train else 'test'
    return read_files(lambda: STL10(data_folder, split, transform, download=not present), 'stl10', where,
                      f'the binary files ({", ".join(needed)})')


# The 100 ImageNet classes of Tian et al.'s CMC ("Contrastive Multiview Coding", ECCV 2020; its imagenet100.txt),
# the ImageNet-100 of the contrastive literature
IMAGENET100_CLASSES = (
    'n02869837 n01749939 n02488291 n02107142 n13037406 n02091831 n04517823 n04589890 n03062245 n01773797 n01735189 '
    'n07831146 n07753275 n03085013 n04485082 n02105505 n01983481 n02788148 n03530642 n04435653 n02086910 n02859443 '
    'n13040303 n03594734 n02085620 n02099849 n01558993 n04493381 n02109047 n04111531 n02877765 n04429376 n02009229 '
    'n01978455 n02106550 n01820546 n01692333 n07714571 n02974003 n02114855 n03785016 n03764736 n03775546 n02087046 '
    'n07836838 n04099969 n04592741 n03891251 n02701002 n03379051 n02259212 n07715103 n03947888 n04026417 n02326432 '
    'n03637318 n01980166 n02113799 n02086240 n03903868 n02483362 n04127249 n02089973 n03017168 n02093428 n02804414 '
    'n02396427 n04418357 n02172182 n01729322 n02113978 n03787032 n02089867 n02119022 n03777754 n04238763 n02231487 '
    'n03032252 n02138441 n02104029 n03837869 n03494278 n04136333 n03794056 n03492542 n02018207 n04067472 n03930630 '
    'n03584829 n02123045 n04229816 n02100583 n03642806 n04336792 n03259280 n02116738 n02108089 n03424325 n01855672 '
    'n02090622').split()


class ClassFolders(datasets.ImageFolder):
    """An ImageFolder restricted to ``classes`` (folder names; every one must be there), e.g. ImageNet-100 in an
    ImageNet tree, or every class folder when ``classes`` is ``None``."""

    def __init__(self, root, transform=None, classes=None):
        self.wanted = None if classes is None else sorted(classes)
        super().__init__(root, transform=transform, loader=load_image)

    def find_classes(self, directory):
        if self.wanted is None:
            return super().find_classes(directory)
        missing = [c for c in self.wanted if not os.path.isdir(os.path.join(directory, c))]
        if missing:
            raise UserError(f'{directory} lacks {len(missing)} of the {len(self.wanted)} class folders of this dataset '
                            f'(e.g. {", ".join(missing[:3])}); point --data_folder at the folder holding train/ and '
                            f'val/ with one sub-folder per class')
        return self.wanted, {c: i for i, c in enumerate(self.wanted)}


def _class_folders(data_folder, split, transform, classes, name):
    folder = os.path.join(data_folder, split)
    if not os.path.isdir(folder):
        raise UserError(f'--dataset {name} expects {folder} (train/ and val/ with one folder per class); not found: '
                        f'point --data_folder at their parent')
    try:
        return ClassFolders(folder, transform, classes)
    except (FileNotFoundError, OSError) as e:      # a class folder without images, an unreadable folder
        raise UserError(f'cannot read --dataset {name} in {folder}: {str(e).splitlines()[0]}') from None


def _imagenet100(data_folder, size, train, transform):
    return _class_folders(data_folder, 'train' if train else 'val', transform, IMAGENET100_CLASSES, 'imagenet100')


class TinyImageNetVal(Dataset):
    """Tiny ImageNet's validation split as it is distributed: ``val/images/*.JPEG`` and ``val/val_annotations.txt``
    (file name, class id, box), with the training split's classes."""

    def __init__(self, folder, classes, transform=None):
        index = {c: i for i, c in enumerate(classes)}
        annotations = os.path.join(folder, 'val_annotations.txt')
        with open(annotations) as f:
            rows = [(n, line.split('\t')) for n, line in enumerate(f, 1) if line.strip()]
        short = [n for n, row in rows if len(row) < 2 or not row[0].strip() or not row[1].strip()]
        if short or not rows:
            raise UserError(f'{annotations} line {short[0]} is not "<file>\\t<class id>\\t..."' if short else
                            f'{annotations} lists no image')
        rows = [(row[0].strip(), row[1].strip()) for _, row in rows]
        unknown = sorted({c for _, c in rows} - set(index))
        if unknown:
            raise UserError(f'{annotations} names classes the training split lacks: {unknown[:3]}')
        missing = [name for name, _ in rows if not os.path.isfile(os.path.join(folder, 'images', name))]
        if missing:
            raise UserError(f'{annotations} lists {len(missing)} images that {folder}/images lacks (e.g. '
                            f'{", ".join(missing[:3])}): the folder is incomplete')
        self.samples = [(os.path.join(folder, 'images', name), index[c]) for name, c in rows]
        self.targets, self.classes, self.transform = [t for _, t in self.samples], list(classes), transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        image = load_image(path)
        return (self.transform(image) if self.transform is not None else image), target


def _tinyimagenet(data_folder, size, train, transform):
    """Tiny ImageNet (200 classes, 64 px) as distributed (``train/<wnid>/images``, ``val/images`` with
    ``val/val_annotations.txt``), or with ``val/`` already sorted into class folders."""
    train_set = _class_folders(data_folder, 'train', transform if train else None, None, 'tinyimagenet')
    if train:
        return train_set
    val = os.path.join(data_folder, 'val')
    if os.path.isfile(os.path.join(val, 'val_annotations.txt')):
        return TinyImageNetVal(val, train_set.classes, transform)
    return _class_folders(data_folder, 'val', transform, train_set.classes, 'tinyimagenet')


def _digits(data_folder, size, train, transform):
    return Digits(train=train, size=size, transform=transform)


def _path(data_folder, size, train, transform):
    ds = _image_folder(data_folder, 'train' if train else 'val', transform)
    if not train:
        ref = _image_folder(data_folder, 'train', None)
        if ds.classes != ref.classes:
            raise UserError(f'train/ and val/ in {data_folder} have different class folders')
    return ds


@dataclass(frozen=True)
class DatasetInfo:
    """One row of the dataset table: everything the scripts need to know about a ``--dataset``.

    ``load(data_folder, size, train, transform)`` returns the full (balanced) split; ``mean_std`` is the default
    normalization (``None``: ``--mean``/``--std`` are required); ``size`` and ``model`` are the
    defaults of ``--size`` and ``--model``; ``coarse`` is ``(fine -> coarse index list, coarse
    names)`` or ``None``; ``long_tail``: the training split is LDAM's long-tailed subset
    (``--imb_factor``); ``augment``: ``'natural'`` (crop + flip) or ``'digits'`` (no flips,
    milder crops); ``resize_eval``: resize + centre-crop test images to ``--size``;
    ``needs_folder``: ``--data_folder`` must be given; ``in_memory``: the training images are one array in
    memory (what ``--augment device`` puts on the device); ``labelled``: for a training set with unlabelled images
    (label -1: methods without labels only), the dataset its encoder is evaluated on."""
    load: Callable
    mean_std: Optional[tuple] = None
    size: int = 32
    model: str = 'resnet50'
    coarse: Optional[tuple] = None
    long_tail: bool = False
    augment: str = 'natural'
    resize_eval: bool = False
    needs_folder: bool = False
    in_memory: bool = True
    labelled: Optional[str] = None


# pixel statistics of the 8x8 digits scaled to [0, 1]
_DIGITS_MEAN_STD = ((0.305, 0.305, 0.305), (0.376, 0.376, 0.376))
_CIFAR10_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
_IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_STL10_MEAN_STD = ((0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713))
_CIFAR100_MEAN_STD = ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))
_CIFAR100_COARSE = (CIFAR100_COARSE, _COARSE)

DATASETS = {
    'digits': DatasetInfo(_digits, _DIGITS_MEAN_STD, size=16, model='resnet_tiny',
                          coarse=(DIGITS_COARSE, list(DIGITS_SUPERCLASSES)), augment='digits'),
    'digits_lt': DatasetInfo(_digits, _DIGITS_MEAN_STD, size=16, model='resnet_tiny',
                             coarse=(DIGITS_COARSE, list(DIGITS_SUPERCLASSES)), augment='digits', long_tail=True),
    'cifar10': DatasetInfo(_cifar(CIFAR10), _CIFAR10_MEAN_STD),
    'cifar100': DatasetInfo(_cifar(CIFAR100), _CIFAR100_MEAN_STD, coarse=_CIFAR100_COARSE),
    'cifar10_lt': DatasetInfo(_cifar(CIFAR10), _CIFAR10_MEAN_STD, long_tail=True),
    'cifar100_lt': DatasetInfo(_cifar(CIFAR100), _CIFAR100_MEAN_STD, coarse=_CIFAR100_COARSE, long_tail=True),
    'path': DatasetInfo(_path, None, resize_eval=True, needs_folder=True, in_memory=False),
    'stl10': DatasetInfo(_stl10, _STL10_MEAN_STD, size=96),
    'stl10_unlabeled': DatasetInfo(functools.partial(_stl10, unlabeled=True), _STL10_MEAN_STD, size=96,
                                   labelled='stl10'),
    'imagenet100': DatasetInfo(_imagenet100, _IMAGENET_MEAN_STD, size=224, resize_eval=True, needs_folder=True,
                               in_memory=False),
    'tinyimagenet': DatasetInfo(_tinyimagenet, ((0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262)), size=64,
                                resize_eval=True, needs_folder=True, in_memory=False),
}


def dataset_info(name):
    """The table row of ``--dataset name``."""
    if name not in DATASETS:
        raise UserError(f'unknown dataset {name!r}; choose from {", ".join(DATASETS)}')
    return DATASETS[name]


def coarse_labels(dataset):
    """(fine -> coarse index list, coarse class names) of ``dataset``; a :class:`UserError` if it has none."""
    coarse = dataset_info(dataset).coarse
    if coarse is None:
        have = ', '.join(name for name, info in DATASETS.items() if info.coarse)
        raise UserError(f'coarse labels are defined for {have}, not --dataset {dataset}')
    return coarse


LABEL_NOISE_SEED = 7717       # offset of the label-noise generator from --seed (its own stream)


NOISE_KINDS = ('symmetric', 'pairflip')


def noisy_labels(targets, n_classes, fraction, seed, kind='symmetric'):
    """Label noise: each label is, with probability ``fraction``, replaced by another class: one of the other
    ``n_classes - 1`` uniformly (``symmetric``), or the next class ``(c + 1) mod n_classes`` (``pairflip``, the
    asymmetric noise of Han et al. 2018, "Co-teaching"). About ``fraction`` of the labels change. Deterministic
    in ``seed``. Returns ``(new labels list, flipped indices list)``."""
    if kind not in NOISE_KINDS:
        raise ValueError(f'kind must be one of {NOISE_KINDS}, got {kind!r}')
    if n_classes < 2:
        raise UserError(f'--label_noise needs at least 2 classes, the training set has {n_classes}')
    rng = np.random.RandomState((seed + LABEL_NOISE_SEED) % 2 ** 32)
    targets = np.asarray(targets)
    flip = rng.rand(len(targets)) < fraction
    shift = rng.randint(1, n_classes, len(targets)) if kind == 'symmetric' else np.ones(len(targets), dtype=int)
    noisy = np.where(flip, (targets + shift) % n_classes, targets)
    return noisy.tolist(), np.flatnonzero(flip).tolist()


def build_dataset(opt, train, transform, granularity=None):
    """The train or test split of ``opt.dataset`` with ``transform``: long-tailed for ``*_lt``
    training sets (balanced test sets), with coarse labels for ``granularity='coarse'`` (default:
    ``--label_granularity``), and with ``--label_noise`` applied to the training split's labels
    (after the coarse mapping; ``dataset.label_noise`` then describes it, see :func:`save_label_noise`)."""
    info = dataset_info(opt.dataset)
    granularity = granularity or opt.label_granularity
    mapping, classes = coarse_labels(opt.dataset) if granularity == 'coarse' else (None, None)
    if opt.image_cache and not info.in_memory:      # decoded once, at a fixed size, into a uint8 file
        base = cached_images(info.load(opt.data_folder, opt.size, train, None), opt.image_cache,
                             os.path.join(opt.data_folder, '.cache', f'{opt.dataset}_{"train" if train else "val"}'),
                             transform)
    else:
        base = info.load(opt.data_folder, opt.size, train, transform)
    indices = long_tail_indices(base.targets, opt.imb_factor, seed=0) if info.long_tail and train else None
    if train and opt.label_fraction < 1:           # the labelled part: a fixed stratified subset (seed 0)
        pool = np.arange(len(base)) if indices is None else np.asarray(indices)
        indices = pool[labelled_fraction(np.asarray(base.targets)[pool], opt.label_fraction)].tolist()
    noise = train and opt.label_noise > 0
    if indices is None and mapping is None and not noise:
        return base
    dataset = Relabeled(base, indices, mapping, classes)
    if train and opt.label_fraction < 1:
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


def mean_std(dataset_name, mean=None, std=None):
    """The normalization: ``--mean`` / ``--std`` where given, else the dataset's."""
    default = dataset_info(dataset_name).mean_std or (None, None)
    return mean or default[0], std or default[1]


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


class CachedImages(Dataset):
    """A split's images decoded once into a uint8 ``[N, S, S, C]`` array (``data``, memory-mapped from its file),
    with ``targets`` and ``classes``: what ``--augment device`` serves without PIL; ``__getitem__`` gives PIL images
    through ``transform`` for the DataLoader's pipeline."""

    def __init__(self, data, targets, classes, transform=None):
        self.data, self.targets, self.classes, self.transform = data, list(targets), list(classes), transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        image = Image.fromarray(np.asarray(self.data[i]))
        return (self.transform(image) if self.transform is not None else image), self.targets[i]


def _fingerprint(dataset, size):
    """What a cache was built from: its size and every file's path, length and modification time (a changed,
    added or removed image builds it again)."""
    import hashlib
    digest = hashlib.sha1(str(size).encode())
    for path, target in getattr(dataset, 'samples', []):
        try:
            stat = os.stat(path)
        except OSError as e:         # a broken link, a file gone since the folder was listed
            raise unreadable_image(path, e) from None
        digest.update(f'{path}\0{target}\0{stat.st_size}\0{stat.st_mtime_ns}\n'.encode())
    return digest.hexdigest()


def cached_images(dataset, size, stem, transform):
    """``dataset``'s images (an ImageFolder-like split with ``samples``) resized (shorter side) and centre-cropped to
    ``size`` x ``size`` once, into ``<stem>_<size>.npy`` with its labels beside it (``--image_cache``), reused while the
    files are unchanged; rank 0 builds it, the other torchrun processes wait. Prints the build time and size."""
    import json
    import time
    data_path, meta_path = f'{stem}_{size}.npy', f'{stem}_{size}.json'
    key = _fingerprint(dataset, size)

    def valid():
        """The metadata when it is this dataset's and the array file holds all of it, else ``None``."""
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            if meta.get('fingerprint') != key:
                return None
            data = np.load(data_path, mmap_mode='r')      # a file cut short fails here, or has too few rows
            whole = data.dtype == np.uint8 and data.shape == (len(meta['targets']), size, size, 3)
            return meta if whole else None
        except (OSError, ValueError, KeyError, TypeError):
            return None
    if is_main() and valid() is None:
        if os.path.isfile(meta_path) and os.path.isfile(data_path):
            print(f'image cache: {data_path} is stale, cut short or damaged: building it again', flush=True)
        folder = writable_folder(os.path.dirname(stem), '--image_cache (under --data_folder)')
        start = time.time()
        shape = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size)])
        out = np.lib.format.open_memmap(data_path + '.tmp.npy', mode='w+', dtype=np.uint8,
                                        shape=(len(dataset), size, size, 3))
        for i in progress(range(len(dataset)), f'caching {os.path.basename(stem)} at {size} px'):
            out[i] = np.asarray(shape(dataset[i][0]).convert('RGB'))
        out.flush()
        del out
        os.replace(data_path + '.tmp.npy', data_path)
        with open(meta_path, 'w') as f:
            json.dump({'fingerprint': key, 'targets': list(map(int, dataset.targets)),
                       'classes': list(dataset.classes)}, f)
        print(f'image cache: {len(dataset)} images at {size} px in {time.time() - start:.1f} s, '
              f'{os.path.getsize(data_path) / 2 ** 20:.1f} MB: {data_path} (in {folder})', flush=True)
    barrier()
    meta = valid()
    if meta is None:
        raise UserError(f'the image cache {data_path} is missing or stale after it was built; remove it and rerun')
    return CachedImages(np.load(data_path, mmap_mode='r'), meta['targets'], meta['classes'], transform)


def in_memory_images(dataset):
    """``(uint8 [N, H, W, C] numpy array, targets list)`` of a dataset whose images are held in memory:
    :class:`Digits`, torchvision's CIFAR, and the views of them that this module builds (``Relabeled`` subsets
    and label maps, ``Subset``, ``IndexedDataset``): what ``--augment device`` puts on the device."""
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
    raise UserError(f'--augment device needs a training set held in memory (digits, cifar10, cifar100 and their '
                    f'_lt and coarse forms), not {type(dataset).__name__}; use --augment cpu')


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


# ---------------------------------------------------------------- the data features' flags (flags.py)
def _check_labels(label_granularity, eval_labels, dataset):
    if 'coarse' in (label_granularity, eval_labels):
        coarse_labels(dataset)    # a one-line error for datasets without superclasses


LABELS = Feature(
    'labels: coarse-to-fine', check=_check_labels,
    flags={'--label_granularity': dict(choices=['fine', 'coarse'], default='fine', scripts=('supcon', 'ce'),
                                       help='train on coarse labels: the 20 CIFAR-100 superclasses, or 5 digit groups'),
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


def _check_label_noise(label_noise, label_noise_kind, given):
    check(0 <= label_noise < 1, f'--label_noise must be in [0, 1), got {label_noise}')
    check(label_noise > 0 or 'label_noise_kind' not in given, '--label_noise_kind needs --label_noise > 0')


LABEL_NOISE = Feature(
    'label noise (docs/PROBES.md)', check=_check_label_noise,
    flags={'--label_noise': dict(type=float, default=0.0,
                                 help='label noise: this fraction of the training labels replaced by another class, '
                                      'seeded by --seed and recorded in <run>/label_noise.json; test labels stay '
                                      'clean'),
           '--label_noise_kind': dict(choices=list(NOISE_KINDS), default='symmetric',
                                      help='symmetric: any other class, uniformly; pairflip: the next class (c + 1 '
                                           'mod C)')},
    run_name=lambda label_noise, label_noise_kind: (
        f'_noise_{"" if label_noise_kind == "symmetric" else label_noise_kind + "_"}{label_noise}'
        if label_noise else ''))


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
            fits = [s for s in sorted(range(1, size), key=lambda s: (abs(s - small_size), -s))[:16]
                    if timm_problem(model[len('timm:'):], size, model_args, (s,)) is None]
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


def _check_augment(augment, dataset, randaugment, n_views, image_cache):
    check(image_cache >= 0, f'--image_cache must be >= 0 (0: off), got {image_cache}')
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


AUGMENT = Feature(
    'augmentation (docs/AUGMENT.md)', check=_check_augment,
    flags={'--augment': dict(choices=['cpu', 'device'], default='cpu',
                             help='training augmentation: cpu (per image, PIL, DataLoader workers: SupContrast\'s) '
                                  'or device (the same pipeline batched on --device; in-memory datasets)'),
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
