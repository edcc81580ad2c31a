"""Datasets, augmentations and loaders for all three scripts.

``cifar10`` / ``cifar100`` (torchvision files under ``--data_folder``, downloaded
when possible), ``path`` (ImageFolder with ``train/`` and ``val/``), and
``digits``: scikit-learn's 1,797 bundled 8x8 handwritten digits, a fixed
stratified 80/20 train/test split, upsampled to ``--size`` and made RGB.
"""
import os
import pickle

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets, transforms

from distributed import barrier, is_main
from util import UserError

DATASETS = ('digits', 'cifar10', 'cifar100', 'path')

MEAN_STD = {
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    'cifar100': ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    # pixel statistics of the 8x8 digits scaled to [0, 1]
    'digits': ((0.305, 0.305, 0.305), (0.376, 0.376, 0.376)),
}


class TwoCropTransform:
    """Two independent augmentations of one image (SupContrast's name, any number of views)."""

    def __init__(self, transform, n_views=2):
        self.transform, self.n_views = transform, n_views

    def __call__(self, x):
        return [self.transform(x) for _ in range(self.n_views)]


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
    """torchvision's CIFAR checks archive MD5s; we accept any files that are present and readable."""

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


def _cifar(opt, train, transform):
    cls = CIFAR10 if opt.dataset == 'cifar10' else CIFAR100
    where = os.path.join(opt.data_folder, cls.base_folder)
    if not is_main():
        barrier()   # under torchrun, rank 0 downloads (if needed) while the others wait
    present = all(os.path.isfile(os.path.join(where, name)) for name in _cifar_files(cls))
    try:
        dataset = cls(opt.data_folder, train=train, transform=transform, download=not present)
        if is_main():
            barrier()
        return dataset
    except Exception as e:  # offline, unreadable or corrupt files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f'{opt.dataset} not found or unreadable in {where} ({reason}); put the '
                        f'python-version files ({", ".join(_cifar_files(cls))}) there '
                        f'or point --data_folder at their parent') from None


def _image_folder(opt, split, transform):
    folder = os.path.join(opt.data_folder, split)
    if not os.path.isdir(folder):
        raise UserError(f'--dataset path expects ImageFolder sub-folders train/ and val/ in '
                        f'{opt.data_folder}; {folder} is missing')
    try:
        return datasets.ImageFolder(folder, transform=transform)
    except (FileNotFoundError, OSError) as e:
        raise UserError(f'cannot read images in {folder}: {str(e).splitlines()[0]}') from None


def build_dataset(opt, train, transform):
    """The train or test split of ``opt.dataset`` with ``transform``."""
    if opt.dataset == 'digits':
        return Digits(train=train, size=opt.size, transform=transform)
    if opt.dataset in ('cifar10', 'cifar100'):
        return _cifar(opt, train, transform)
    if opt.dataset == 'path':
        ds = _image_folder(opt, 'train' if train else 'val', transform)
        if not train:
            ref = _image_folder(opt, 'train', None)
            if ds.classes != ref.classes:
                raise UserError(f'train/ and val/ in {opt.data_folder} have different class folders')
        return ds
    raise UserError(f'unknown dataset {opt.dataset!r}; choose from {", ".join(DATASETS)}')


def num_classes(dataset):
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    base = getattr(dataset, 'base', dataset)
    return len(base.classes)


def mean_std(opt):
    mean, std = MEAN_STD.get(opt.dataset, (None, None))
    return opt.mean or mean, opt.std or std


def build_transform(opt, kind):
    """``kind``: ``'contrastive'`` (SupContrast's SupCon augmentation), ``'train'`` (crop + flip,
    for CE and linear), ``'eval'`` (none). Digits get no flips and milder crops."""
    mean, std = mean_std(opt)
    normalize = transforms.Normalize(mean=mean, std=std)
    digits = opt.dataset == 'digits'
    if kind == 'eval':
        steps = [] if digits or opt.dataset.startswith('cifar') else [transforms.Resize(opt.size),
                                                                     transforms.CenterCrop(opt.size)]
        return transforms.Compose(steps + [transforms.ToTensor(), normalize])
    if digits:
        steps = [transforms.RandomResizedCrop(opt.size, scale=(0.5, 1.0), ratio=(0.8, 1.25)),
                 transforms.RandomRotation(10)]
    else:
        steps = [transforms.RandomResizedCrop(opt.size, scale=(0.2, 1.0)),
                 transforms.RandomHorizontalFlip()]
    if kind == 'contrastive':
        steps += [transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                  transforms.RandomGrayscale(p=0.2)]
    return transforms.Compose(steps + [transforms.ToTensor(), normalize])


def build_loader(opt, dataset, train):
    """Training loaders are split over torchrun processes (DistributedSampler, ``--batch_size / W``
    per process); evaluation loaders are not: every process evaluates the whole split."""
    sampler = None
    if train and getattr(opt, 'world_size', 1) > 1:
        sampler = DistributedSampler(dataset, num_replicas=opt.world_size, rank=opt.rank, shuffle=True,
                                     seed=opt.seed, drop_last=False)
    return DataLoader(dataset, batch_size=getattr(opt, 'local_batch_size', opt.batch_size) if train else opt.batch_size,
                      shuffle=train and sampler is None, sampler=sampler, num_workers=opt.num_workers,
                      pin_memory=opt.device.type == 'cuda', drop_last=False)


def split_train_val(targets, val_fraction, seed):
    """Stratified split of indices ``0..len(targets)-1`` into (train, held-out) sorted lists."""
    from sklearn.model_selection import train_test_split
    idx = np.arange(len(targets))
    train_idx, val_idx = train_test_split(idx, test_size=val_fraction, stratify=np.asarray(targets),
                                          random_state=seed)
    return np.sort(train_idx).tolist(), np.sort(val_idx).tolist()
