"""Fashion-MNIST (Xiao, Rasul and Vollgraf 2017, Zalando Research, MIT): 60,000 training and 10,000 test 28 x 28
grayscale photographs of 10 kinds of clothing, read from its four original IDX files (gzipped or not), as Debian's
``dataset-fashion-mnist`` installs them in ``/usr/share/datasets/fashion-mnist/`` (the default folder) or from
``--data_folder``. The images are held in memory as one uint8 ``[N, size, size, 3]`` array (grey made RGB, resized
with PIL's bilinear filter when ``--size`` is not 28), which ``--augment device`` serves as it serves the digits.

Every file is checked before it is used: its IDX header (the magic number of an image or a label file), the counts
of the split (60,000 / 10,000), the bytes that the header promises, labels in 0..9; anything else is one line naming
the file.
"""
import gzip
import os
import zlib

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from core.flags import UserError

DEBIAN_FOLDER = '/usr/share/datasets/fashion-mnist'
PACKAGE_HINT = ('install Debian\'s dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or put the four '
                'IDX files in a folder and point --data_folder at it')

CLASSES = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot']

# Three superclasses of the ten, with no superclass of one class (its images would be right by construction in the
# within-superclass probe): the four tops, which are the hard classes to tell apart; the three kinds of footwear; and
# the rest (trousers, dresses, bags). docs/USAGE.md, "Datasets".
SUPERCLASSES = {'tops': [0, 2, 4, 6], 'footwear': [5, 7, 9], 'trousers-dresses-bags': [1, 3, 8]}
COARSE = [next(c for c, fines in enumerate(SUPERCLASSES.values()) if k in fines) for k in range(10)]

# pixel statistics of the 60,000 training images scaled to [0, 1] (tests/data/test_fashion_mnist.py measures them)
MEAN_STD = ((0.2860, 0.2860, 0.2860), (0.3530, 0.3530, 0.3530))

# (images file, labels file, images) of each split
SPLITS = {True: ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte', 60000),
          False: ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte', 10000)}
FILES = [name for images, labels, _ in SPLITS.values() for name in (images, labels)]
_MAGIC = {'images': 0x00000803, 'labels': 0x00000801}     # unsigned bytes, 3 dimensions / 1 dimension


def find_file(folder, name):
    """The path of IDX file ``name`` (gzipped, ``name.gz``, or not) in ``folder`` or its ``fashion-mnist/``
    sub-folder; ``None`` if there is none."""
    for where in (folder, os.path.join(folder, 'fashion-mnist')):
        for path in (os.path.join(where, name + '.gz'), os.path.join(where, name)):
            if os.path.isfile(path):
                return path
    return None


def read_idx(path, kind, count):
    """The ``[count, 28, 28]`` images or ``[count]`` labels (uint8) of IDX file ``path`` (``kind``: ``'images'`` or
    ``'labels'``); a :class:`UserError` naming the file for a damaged, cut short or wrong file."""
    try:
        if path.endswith('.gz'):
            with gzip.open(path, 'rb') as f:
                raw = f.read()
        else:
            with open(path, 'rb') as f:
                raw = f.read()
    except (OSError, EOFError, zlib.error) as e:      # gzip: a cut-short stream is EOFError, a bad one OSError
        raise UserError(f'{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else "damaged"})'
                        f': the file is cut short or damaged; replace it ({PACKAGE_HINT})') from None
    dims = 3 if kind == 'images' else 1
    header = 4 + 4 * dims
    magic = int.from_bytes(raw[:4], 'big') if len(raw) >= 4 else None
    if magic != _MAGIC[kind]:
        other = next((k for k, m in _MAGIC.items() if m == magic), None)
        found = f'an IDX {other} file' if other else 'not an IDX file of unsigned bytes'
        raise UserError(f'{path} is {found}, not the IDX {kind} file it is named for: replace it ({PACKAGE_HINT})')
    if len(raw) < header:
        raise UserError(f'{path} is {len(raw)} bytes, shorter than its IDX header: the file is cut short; replace it')
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(dims)]
    want = [count, 28, 28] if kind == 'images' else [count]
    if shape != want:
        raise UserError(f'{path} holds {" x ".join(map(str, shape))} {kind}, not Fashion-MNIST\'s '
                        f'{" x ".join(map(str, want))}: it is another file or another split\'s; replace it')
    size = int(np.prod(shape))
    if len(raw) != header + size:
        raise UserError(f'{path} holds {len(raw) - header} bytes of {kind} where its header promises {size}: the file '
                        f'is cut short or damaged; replace it ({PACKAGE_HINT})')
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _resized(grey, size):
    """``[N, 28, 28]`` grey uint8 images as ``[N, size, size, 3]`` RGB uint8 (PIL's bilinear filter, as the digits)."""
    if size == grey.shape[1]:
        rgb = grey
    else:
        rgb = np.stack([np.asarray(Image.fromarray(g, mode='L').resize((size, size), Image.BILINEAR)) for g in grey])
    return np.ascontiguousarray(np.repeat(rgb[..., None], 3, axis=3))


class FashionMNIST(Dataset):
    """Fashion-MNIST's training (``train``) or test split from the IDX files in ``folder``, as ``size x size`` RGB PIL
    images; ``data`` is the uint8 ``[N, size, size, 3]`` array, ``targets`` the labels, ``classes`` the names."""

    def __init__(self, folder, train=True, size=28, transform=None):
        images_name, labels_name, count = SPLITS[train]
        paths = {name: find_file(folder, name) for name in (images_name, labels_name)}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            where = folder if os.path.isdir(folder) else f'{folder} (no such folder)'
            raise UserError(f'fashion_mnist not found in {where}: {" and ".join(missing)} (.gz) missing; '
                            f'{PACKAGE_HINT}')
        grey = read_idx(paths[images_name], 'images', count)
        labels = read_idx(paths[labels_name], 'labels', count)
        if labels.max() > 9:
            raise UserError(f'{paths[labels_name]} holds label {int(labels.max())}, outside 0..9 (Fashion-MNIST\'s '
                            f'classes): the file is damaged; replace it')
        self.data = _resized(grey, size)
        self.targets = labels.astype(np.int64).tolist()
        self.classes = list(CLASSES)
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform is not None else image), self.targets[index]


def load(data_folder, size, train, transform):
    """The dataset table's loader of ``--dataset fashion_mnist``."""
    return FashionMNIST(data_folder, train=train, size=size, transform=transform)
