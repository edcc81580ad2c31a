"""Fashion-MNIST (data/fashion_mnist.py): its reader on generated IDX files and on Debian's files where installed
(``apt-get install dataset-fashion-mnist``; .ci/run installs it), one line for each bad or missing file, the
class-balanced ``--train_subset``, and both stages end to end on a small subset."""
import gzip
import os
import shutil

import numpy as np
import pytest

from data import build_dataset, coarse_labels, fashion_mnist
from data.labels import balanced_subset
from helpers import FAST, assert_one_line_error, make_options, only_run_folder, run_in_process, run_script

INSTALLED = all(fashion_mnist.find_file(fashion_mnist.DEBIAN_FOLDER, name) for name in fashion_mnist.FILES)
needs_files = pytest.mark.skipif(not INSTALLED, reason=f'Fashion-MNIST is not in {fashion_mnist.DEBIAN_FOLDER} '
                                                       '(apt-get install dataset-fashion-mnist)')


def idx_bytes(array, magic):
    """``array`` (uint8) as an IDX file of unsigned bytes."""
    head = magic.to_bytes(4, 'big') + b''.join(n.to_bytes(4, 'big') for n in array.shape)
    return head + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def make_fake_fashion(folder, gz=True):
    """The four IDX files at Fashion-MNIST's counts: image i is a flat grey of value ``i % 251``, label ``i % 10``
    (gzipped at level 1: a fraction of a second)."""
    os.makedirs(folder, exist_ok=True)
    for images, labels, count in fashion_mnist.SPLITS.values():
        n = np.arange(count)
        pixels = np.broadcast_to((n % 251).astype(np.uint8)[:, None, None], (count, 28, 28))
        for name, data in ((images, idx_bytes(pixels, 0x803)), (labels, idx_bytes((n % 10).astype(np.uint8), 0x801))):
            if gz:
                with gzip.open(os.path.join(folder, name + '.gz'), 'wb', compresslevel=1) as f:
                    f.write(data)
            else:
                with open(os.path.join(folder, name), 'wb') as f:
                    f.write(data)
    return str(folder)


def test_reads_generated_files_gzipped_or_not_at_any_size(tmp_path):
    """The reader takes the gzipped or the plain files, in the folder or its fashion-mnist/ sub-folder; the images
    are one uint8 [N, size, size, 3] array (grey made RGB), resized from 28 px when --size asks."""
    for gz, where in ((True, tmp_path / 'a'), (False, tmp_path / 'b' / 'fashion-mnist')):
        make_fake_fashion(where, gz=gz)
        folder = str(tmp_path / 'a') if gz else str(tmp_path / 'b')
        train = fashion_mnist.FashionMNIST(folder, train=True, size=28)
        assert train.data.shape == (60000, 28, 28, 3) and train.data.dtype == np.uint8
        assert train.targets[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1] and len(train.classes) == 10
        assert (train.data[7] == 7).all()
    test = fashion_mnist.FashionMNIST(str(tmp_path / 'a'), train=False, size=12)
    assert test.data.shape == (10000, 12, 12, 3) and (test.data[250] == 250).all()
    image, label = test[3]
    assert image.size == (12, 12) and image.mode == 'RGB' and label == 3


def test_the_superclasses_cover_every_class_with_none_alone():
    mapping, names = coarse_labels('fashion_mnist')
    assert len(mapping) == 10 and names == list(fashion_mnist.SUPERCLASSES)
    counts = np.bincount(mapping)
    assert counts.min() >= 2 and counts.sum() == 10
    assert [fashion_mnist.CLASSES[k] for k in fashion_mnist.SUPERCLASSES['footwear']] == ['Sandal', 'Sneaker',
                                                                                          'Ankle boot']


@needs_files
def test_debians_files_are_the_default_and_match_the_stated_statistics():
    """Without --data_folder the Debian folder is read: 60,000 / 10,000 images, 6,000 / 1,000 of each class; the
    table's mean and std are the training images' (to the 4 decimals stated)."""
    opt = make_options(dataset='fashion_mnist')
    assert opt.data_folder == fashion_mnist.DEBIAN_FOLDER and opt.size == 28 and opt.model == 'resnet18'
    train = build_dataset(opt, 'train', None)
    test = build_dataset(opt, 'test', None)
    assert np.bincount(train.targets).tolist() == [6000] * 10 and np.bincount(test.targets).tolist() == [1000] * 10
    grey = train.data[..., 0] / 255.0
    assert round(float(grey.mean()), 4) == fashion_mnist.MEAN_STD[0][0]
    assert round(float(grey.std()), 4) == fashion_mnist.MEAN_STD[1][0]


def test_a_balanced_subset_is_fixed_by_its_own_seed():
    targets = np.repeat(np.arange(4), [10, 7, 9, 8])
    chosen = balanced_subset(targets, 14)
    assert np.bincount(targets[chosen]).tolist() == [4, 4, 3, 3]           # 14 // 4, the first 14 % 4 one more
    assert (chosen == balanced_subset(targets, 14)).all() and (chosen == np.sort(chosen)).all()
    assert not (chosen == balanced_subset(targets, 14, seed=1)).all()
    with pytest.raises(Exception, match='class 1 has 7: use at most 28'):
        balanced_subset(targets, 40)


def test_train_subset_in_every_part_and_stage(tmp_path):
    """--train_subset N: N training images, as many of each class, the same for every --seed; the held-out part of
    --val_split comes out of them, the test split stays whole; label noise applies to the subset."""
    root = make_fake_fashion(tmp_path / 'fm')
    opt = make_options(dataset='fashion_mnist', data_folder=root, train_subset=500, size=8, seed=3)
    train = build_dataset(opt, 'train', None)
    assert len(train) == 500 and np.bincount(train.targets).tolist() == [50] * 10
    assert train.indices == build_dataset(make_options(dataset='fashion_mnist', data_folder=root, train_subset=500,
                                                       size=8), 'train', None).indices
    assert len(build_dataset(opt, 'test', None)) == 10000 and '_subset_500' in opt.run_name
    held = make_options(dataset='fashion_mnist', data_folder=root, train_subset=500, size=8, val_split=0.2,
                        label_noise=0.4)
    kept, val = build_dataset(held, 'train', None), build_dataset(held, 'val', None)
    assert len(kept) == 400 and len(val) == 100 and not set(kept.indices) & set(val.indices)
    assert set(kept.indices) | set(val.indices) == set(train.indices)
    assert 0.3 < kept.label_noise['n_flipped'] / 400 < 0.5
    for args, words in [(['--train_subset', '-1'], '--train_subset must be >= 0'),
                        (['--subset_seed', '2'], '--subset_seed draws --train_subset'),
                        (['--dataset', 'digits_lt', '--train_subset', '100'], 'long-tailed'),
                        (['--dataset', 'fashion_mnist', '--data_folder', root, '--train_subset', '60010'],
                         'takes 6001 images of each class')]:
        assert_one_line_error(run_in_process('main_supcon.py', *args, '--save_folder', tmp_path / 'x', *FAST), *words)


def _damaged(tmp_path, case):
    """A copy of the generated files with one of them damaged as ``case`` says; its folder."""
    folder = make_fake_fashion(tmp_path / case)
    images = os.path.join(folder, 'train-images-idx3-ubyte.gz')
    labels = os.path.join(folder, 'train-labels-idx1-ubyte.gz')
    if case == 'missing':
        os.remove(labels)
    elif case == 'cut_gz':                      # a download stopped half-way
        with open(images, 'rb') as f:
            data = f.read()
        with open(images, 'wb') as f:
            f.write(data[:len(data) // 2])
    elif case == 'not_gzip':
        with open(images, 'wb') as f:
            f.write(b'<html>not found</html>')
    elif case == 'swapped':                     # the labels file under the images file's name
        shutil.copy(labels, images)
    elif case == 'other_split':                 # the test images under the training images' name
        shutil.copy(os.path.join(folder, 't10k-images-idx3-ubyte.gz'), images)
    elif case == 'short_plain':                 # an uncompressed file cut short: its header promises more
        os.remove(images)
        with open(images[:-3], 'wb') as f:
            f.write(idx_bytes(np.zeros((60000, 28, 28), np.uint8), 0x803)[:16 + 1000])
    elif case == 'bad_label':
        with gzip.open(labels, 'wb', compresslevel=1) as f:
            f.write(idx_bytes(np.full(60000, 12, np.uint8), 0x801))
    return folder


@pytest.mark.parametrize('case, words', [
    ('nowhere', ('fashion_mnist not found', 'no such folder', 'dataset-fashion-mnist', '--data_folder')),
    ('missing', ('train-labels-idx1-ubyte', 'missing', 'apt-get install dataset-fashion-mnist', '--data_folder')),
    ('cut_gz', ('train-images-idx3-ubyte.gz', 'cut short or damaged')),
    ('not_gzip', ('train-images-idx3-ubyte.gz', 'cut short or damaged')),
    ('swapped', ('train-images-idx3-ubyte.gz', 'is an IDX labels file', 'images file')),
    ('other_split', ('holds 10000 x 28 x 28 images', "60000 x 28 x 28", 'another split')),
    ('short_plain', ('train-images-idx3-ubyte', '1000 bytes of images', 'promises 47040000')),
    ('bad_label', ('train-labels-idx1-ubyte.gz', 'label 12', 'outside 0..9')),
])
def test_bad_or_missing_files_are_one_line(tmp_path, case, words):
    folder = str(tmp_path / 'none') if case == 'nowhere' else _damaged(tmp_path, case)
    proc = run_in_process('main_supcon.py', '--dataset', 'fashion_mnist', '--data_folder', folder, '--epochs', '1',
                          '--save_folder', tmp_path / 'x', *FAST)
    assert_one_line_error(proc, *words)


@needs_files
@pytest.mark.slow
def test_pretraining_and_the_probes_on_a_subset_of_debians_files(tmp_path):
    """`main_supcon.py --dataset fashion_mnist` trains from Debian's files with no --data_folder (a subset of 300, 2
    epochs, 40 % noise, a held-out part and the kNN monitor); main_linear.py takes its subset and held-out part from
    the checkpoint, trains the linear probe on them, and runs the few-shot and within-superclass probes."""
    run_script('main_supcon.py', '--dataset', 'fashion_mnist', '--train_subset', 300, '--epochs', 2,
               '--label_noise', 0.4, '--val_split', 0.2, '--knn_every', 1, '--save_folder', tmp_path / 'pre', *FAST)
    pre = only_run_folder(tmp_path / 'pre')
    assert '/fashion_mnist/' in pre and '_subset_300' in pre
    out = run_script('main_linear.py', '--ckpt', os.path.join(pre, 'last.pth'), '--epochs', 1, '--num_workers', 0,
                     '--batch_size', 128, '--device', 'cpu', '--save_folder', tmp_path / 'lin').stdout
    assert 'final test top-1' in out and 'final val top-1' in out
    lin = only_run_folder(tmp_path / 'lin')
    assert lin.endswith('_subset_300_bnprobe_val_0.2')
    shots = run_script('main_linear.py', '--ckpt', os.path.join(pre, 'last.pth'), '--shots', 5, '--shot_draws', 2,
                       '--within_superclass', '--device', 'cpu', '--num_workers', 0,
                       '--save_folder', tmp_path / 'shots').stdout
    assert '5-shot linear probe (test)' in shots and 'within-superclass fine kNN top-1 (test)' in shots
