"""The datasets read from image files: ImageFolder trees (``--dataset path``), ImageNet-100 (CMC's 100 classes of an
ImageNet tree), Tiny ImageNet (its distributed layout); every image through :func:`load_image` (one line for a file
that is not a readable image); and the uint8 image cache (``--image_cache``) that serves them to ``--augment
device``, rebuilt when the files change or the cache is cut short.
"""
import os

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from core.flags import UserError
from runtime.distributed import barrier, is_main
from runtime.run_folder import writable_folder
from util import progress


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
