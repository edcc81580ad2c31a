"""IndexedDataset over every dataset the scripts support."""
import pickle

import torch

from data import build_dataset, build_loader, build_transform, num_classes
from datasets_indexed import IndexedDataset
from helpers import make_fake_cifar, make_image_folder, make_options


def opt_for(dataset, folder=None, size=16):
    opt = make_options(dataset=dataset, data_folder=str(folder) if folder else None, size=size,
                       mean='(0.5, 0.5, 0.5)' if dataset == 'path' else None,
                       std='(0.25, 0.25, 0.25)' if dataset == 'path' else None, batch_size=4, num_workers=0)
    opt.device = torch.device('cpu')           # engine.setup's resolution of --device
    return opt


def check(opt):
    base = build_dataset(opt, 'train', build_transform(opt, 'eval'))
    ds = IndexedDataset(base)
    assert len(ds) == len(base) and ds.classes == base.classes and num_classes(ds) == num_classes(base)
    for i in (0, len(ds) - 1):
        x, y, idx = ds[i]
        x0, y0 = base[i]
        assert idx == i and y == y0 and torch.equal(x, x0)
    xb, yb, ib = next(iter(build_loader(opt, ds, train=False)))
    assert ib.tolist() == [0, 1, 2, 3] and xb.shape[0] == 4
    clone = pickle.loads(pickle.dumps(ds))        # what DataLoader workers do
    assert len(clone) == len(ds)


def test_digits():
    check(opt_for('digits'))
    assert len(build_dataset(opt_for('digits'), 'train', None)) == 1437
    assert len(build_dataset(opt_for('digits'), 'test', None)) == 360


def test_fake_cifar(tmp_path):
    check(opt_for('cifar10', make_fake_cifar(tmp_path), size=32))
    check(opt_for('cifar100', make_fake_cifar(tmp_path, hundred=True, n_classes=100, n_train=100), size=32))


def test_image_folder(tmp_path):
    check(opt_for('path', make_image_folder(tmp_path), size=12))
