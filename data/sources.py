"""The dataset table (``DATASETS``: one :class:`DatasetInfo` row per ``--dataset``) and the readers of the datasets
held in memory as one uint8 array: ``digits`` (scikit-learn's 1,797 bundled 8x8 handwritten digits, a fixed stratified
80/20 split, upsampled to ``--size`` and made RGB), CIFAR-10/100 (torchvision's python-version files under
``--data_folder``, downloaded when possible), STL-10 (its binary files); Fashion-MNIST's reader is
``data/fashion_mnist.py``. Every reader checks what it reads (counts
that match, labels in range, sizes that fit) and says what is wrong in one line naming the file. The image-file
datasets' readers are in ``data/folders.py``; their loaders (a few lines each) are here, beside their rows.

Adding a dataset: a loader function ``(data_folder, size, train, transform) -> dataset with targets and classes``
and one row of ``DATASETS`` (docs/DEVELOPING.md, "Adding a dataset").
"""
import functools
import os
import pickle
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets

from core.flags import UserError
from runtime.distributed import barrier, is_main

from . import fashion_mnist
from .folders import TinyImageNetVal, _class_folders, _image_folder

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


def _cifar_files(cls, train=None):
    """The files of a CIFAR split (``train``: the training batches, else the test batch; ``None``: both) and the
    meta file: a split is read from its own files (a run that reads no test image needs no test file)."""
    parts = {None: cls.train_list + cls.test_list, True: cls.train_list, False: cls.test_list}[train]
    return [name for name, _ in parts] + [cls.meta['filename']]


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
        return all(os.path.isfile(os.path.join(folder, name)) for name in _cifar_files(type(self), self.train))

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
        present = all(os.path.isfile(os.path.join(where, name)) for name in _cifar_files(cls, train))
        return read_files(lambda: cls(data_folder, train=train, transform=transform, download=not present),
                          cls.__name__.lower(), where,
                          f'the python-version files ({", ".join(_cifar_files(cls, train))})')
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


def _digits(data_folder, size, train, transform):
    return Digits(train=train, size=size, transform=transform)


# ---------------------------------------------------------------- the image-file datasets' loaders (data/folders.py)
def _path(data_folder, size, train, transform):
    ds = _image_folder(data_folder, 'train' if train else 'val', transform)
    if not train:
        ref = _image_folder(data_folder, 'train', None)
        if ds.classes != ref.classes:
            raise UserError(f'train/ and val/ in {data_folder} have different class folders')
    return ds


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


def _imagenet100(data_folder, size, train, transform):
    return _class_folders(data_folder, 'train' if train else 'val', transform, IMAGENET100_CLASSES, 'imagenet100')


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


@dataclass(frozen=True)
class DatasetInfo:
    """One row of the dataset table: everything the scripts need to know about a ``--dataset``.

    ``load(data_folder, size, train, transform)`` returns the full (balanced) split; ``mean_std`` is the default
    normalization (``None``: ``--mean``/``--std`` are required); ``size`` and ``model`` are the
    defaults of ``--size`` and ``--model``; ``coarse`` is ``(fine -> coarse index list, coarse
    names)`` or ``None``; ``long_tail``: the training split is LDAM's long-tailed subset
    (``--imb_factor``); ``augment``: ``'natural'`` (crop + flip) or ``'digits'`` (no flips,
    milder crops); ``resize_eval``: resize + centre-crop test images to ``--size``;
    ``needs_folder``: ``--data_folder`` must be given; ``data_folder``: its default where not ``./datasets/``;
    ``in_memory``: the training images are one array in
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
    data_folder: Optional[str] = None
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
    'fashion_mnist': DatasetInfo(fashion_mnist.load, fashion_mnist.MEAN_STD, size=28, model='resnet18',
                                 coarse=(fashion_mnist.COARSE, list(fashion_mnist.SUPERCLASSES)),
                                 data_folder=fashion_mnist.DEBIAN_FOLDER),
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


def mean_std(dataset_name, mean=None, std=None):
    """The normalization: ``--mean`` / ``--std`` where given, else the dataset's."""
    default = dataset_info(dataset_name).mean_std or (None, None)
    return mean or default[0], std or default[1]
