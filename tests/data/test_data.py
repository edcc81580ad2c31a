"""data/ (sources, folders, labels, views, loaders): long-tailed subsets, coarse labels, and the dataset table
through the real scripts (generated CIFAR files and ImageFolder trees)."""
import os

import numpy as np
import pytest

from helpers import (
    FAST,
    FAST_FILES,
    assert_one_line_error,
    make_fake_cifar,
    make_image_folder,
    make_options,
    only_run_folder,
    run_in_process,
    run_script,
)


def _opt(tmp_path, dataset, **kw):
    return make_options(dataset=dataset, data_folder=str(tmp_path), size=32, imb_factor=0.1, **kw)


def test_long_tail_counts_follow_the_exponential_profile(tmp_path):
    from data import build_dataset, class_counts, long_tail_counts
    make_fake_cifar(tmp_path, n_train=1000, n_test=100)        # 100 training images per class
    lt = build_dataset(_opt(tmp_path, 'cifar10_lt'), 'train', None)
    want = [int(100 * 0.1 ** (c / 9)) for c in range(10)]
    assert class_counts(lt) == want == long_tail_counts(100, 10, 0.1)
    assert want[0] == 100 and want[-1] == 10
    assert class_counts(build_dataset(_opt(tmp_path, 'cifar10_lt'), 'test', None)) == [10] * 10   # balanced test
    again = build_dataset(_opt(tmp_path, 'cifar10_lt'), 'train', None)
    assert again.indices == lt.indices                                    # a fixed subset


def test_cifar100_coarse_mapping_on_a_fake_file(tmp_path):
    from data import CIFAR100_COARSE, build_dataset, num_classes
    make_fake_cifar(tmp_path, hundred=True, n_classes=100, n_train=300, n_test=100)
    assert sorted(set(CIFAR100_COARSE)) == list(range(20))
    assert np.bincount(CIFAR100_COARSE).tolist() == [5] * 20
    assert CIFAR100_COARSE[:5] == [4, 1, 14, 8, 0]          # apple, aquarium_fish, baby, bear, beaver
    fine = build_dataset(_opt(tmp_path, 'cifar100'), 'train', None)
    coarse = build_dataset(_opt(tmp_path, 'cifar100'), 'train', None, 'coarse')
    assert num_classes(fine) == 100 and num_classes(coarse) == 20 and coarse.classes[0] == 'aquatic_mammals'
    assert coarse.targets == [CIFAR100_COARSE[y] for y in fine.targets] and coarse.fine_targets == fine.targets
    assert coarse[7][1] == CIFAR100_COARSE[fine[7][1]]


def test_digits_coarse_grouping():
    from data import DIGITS_COARSE, Digits, build_dataset
    assert np.bincount(DIGITS_COARSE).tolist() == [2] * 5
    opt = make_options(dataset='digits', size=16, label_granularity='coarse')
    coarse = build_dataset(opt, 'train', None)
    assert coarse.targets == [DIGITS_COARSE[y] for y in Digits(True).targets]
    with pytest.raises(Exception, match='coarse labels'):
        build_dataset(make_options(dataset='cifar10', size=32, data_folder='/none'), 'train', None, 'coarse')


@pytest.mark.slow
def test_fake_cifar10_and_cifar100(tmp_path):
    data = make_fake_cifar(tmp_path / 'data')
    run_script('main_ce.py', '--dataset', 'cifar10', '--data_folder', data, '--model', 'resnet_tiny',
               '--epochs', 1, '--save_folder', tmp_path / 'c10', *FAST)
    make_fake_cifar(tmp_path / 'data', hundred=True, n_classes=100, n_train=200, n_test=100)
    run_script('main_supcon.py', '--dataset', 'cifar100', '--data_folder', data, '--model', 'resnet_tiny',
               '--epochs', 1, '--save_folder', tmp_path / 'c100', *FAST)


@pytest.mark.slow
def test_image_folder_all_three_scripts(tmp_path):
    data = make_image_folder(tmp_path / 'imgs')
    common = ['--dataset', 'path', '--data_folder', data, '--mean', '(0.5, 0.5, 0.5)', '--std', '0.25',
              '--size', 12, '--model', 'resnet_tiny', '--epochs', 1, *FAST_FILES]
    run_script('main_supcon.py', *common, '--save_folder', tmp_path / 'pre')
    run_script('main_ce.py', *common, '--save_folder', tmp_path / 'ce')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    run_script('main_linear.py', *common, '--ckpt', ckpt, '--save_folder', tmp_path / 'lin')


@pytest.mark.slow
def test_image_folder_with_mismatched_classes(tmp_path):
    data = make_image_folder(tmp_path / 'imgs')
    os.rename(data / 'val' / 'c', data / 'val' / 'd')
    proc = run_script('main_ce.py', '--dataset', 'path', '--data_folder', data, '--mean', '0.5', '--std', '0.5',
                      '--model', 'resnet_tiny', '--save_folder', tmp_path, *FAST_FILES, check=False)
    assert_one_line_error(proc, 'class folders')


@pytest.mark.slow
@pytest.mark.parametrize('workers', [0, 2])
def test_unreadable_image_is_a_one_line_error(tmp_path, workers):
    data = make_image_folder(tmp_path / 'imgs')
    bad = data / 'train' / 'b' / '3.png'
    bad.write_bytes(b'this is not a PNG file')
    args = ['--dataset', 'path', '--data_folder', data, '--mean', '0.5', '--std', '0.5', '--size', 12,
            '--model', 'resnet_tiny', '--epochs', 1, '--batch_size', 4, '--print_freq', 1000]
    proc = run_script('main_supcon.py', *args, '--num_workers', workers, '--save_folder', tmp_path / 'runs',
                      check=False)
    assert_one_line_error(proc, f'cannot read image {bad}', 'remove or replace')


def test_load_image_reads_rgb_and_names_a_bad_file(tmp_path):
    from core.flags import UserError
    from data import load_image
    good = make_image_folder(tmp_path / 'imgs') / 'val' / 'a' / '0.png'
    assert load_image(str(good)).mode == 'RGB'
    bad = tmp_path / 'bad.png'
    bad.write_bytes(b'\x89PNG truncated')
    with pytest.raises(UserError, match='cannot read image .*bad.png'):
        load_image(str(bad))


def test_digits_lt_follows_the_profile_with_a_balanced_test_split():
    from data import build_dataset, class_counts, long_tail_counts
    flags = dict(dataset='digits_lt', size=16, imb_factor=0.1)
    opt = make_options(**flags)
    full = class_counts(build_dataset(make_options(**{**flags, 'dataset': 'digits'}), 'train', None))
    lt = class_counts(build_dataset(opt, 'train', None))
    # class c keeps int(n_max * 0.1^(c/9)) images, or all it has (digits' classes differ a little in size)
    assert lt == [min(n, want) for n, want in zip(full, long_tail_counts(max(full), 10, 0.1))]
    assert lt[-1] == int(max(full) * 0.1)
    assert class_counts(build_dataset(opt, 'test', None)) == class_counts(
        build_dataset(make_options(**{**flags, 'dataset': 'digits'}), 'test', None))    # test: as digits
    rare = class_counts(build_dataset(make_options(**{**flags, 'imb_factor': 0.01}), 'train', None))
    assert rare[-1] == 1 and min(rare) == 1


def test_a_training_batch_of_one_is_dropped():
    """An epoch whose last batch would hold one sample (BatchNorm cannot train on it) drops it,
    with DataLoader and with --augment device; other epochs keep their last batch."""
    from data import last_batch_of_one
    assert last_batch_of_one(1437, 1, 4) and not last_batch_of_one(1437, 1, 128)
    assert last_batch_of_one(9, 2, 4) and not last_batch_of_one(1, 1, 4)      # 5 per process under torchrun


@pytest.mark.slow
def test_one_class_and_held_out_splits_that_cannot_hold_every_class(tmp_path, tiny_ckpt):
    """A single-class ImageFolder is refused by main_ce.py, main_linear.py (also its
    few-shot probe) and --label_noise in one line (SimCLR pre-trains on it); --val_split too small for one
    held-out image per class, or a class with one image, is one line too (not a traceback inside scikit-learn)."""
    from helpers import run_in_process
    one = make_image_folder(tmp_path / 'one', classes=('only',))
    common = ['--dataset', 'path', '--data_folder', one, '--mean', '0.5', '--std', '0.25', '--size', 12,
              '--model', 'resnet_tiny', '--epochs', 1, *FAST_FILES]
    assert_one_line_error(run_in_process('main_ce.py', *common, '--save_folder', tmp_path / 'ce'),
                          'has 1 class (only)', 'at least 2')
    assert_one_line_error(run_in_process('main_supcon.py', *common, '--label_noise', 0.2, '--save_folder',
                                         tmp_path / 'noisy'), '--label_noise needs at least 2 classes')
    run_script('main_supcon.py', *common, '--method', 'SimCLR', '--save_folder', tmp_path / 'pre')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    lin = [*common[:4], '--ckpt', ckpt, '--epochs', 1, *FAST_FILES, '--save_folder', tmp_path / 'lin']
    assert_one_line_error(run_in_process('main_linear.py', *lin), 'has 1 class (only)')
    assert_one_line_error(run_in_process('main_linear.py', *lin, '--shots', 1), 'a few-shot probe needs at least 2')
    digits = ['--ckpt', tiny_ckpt, '--epochs', 1, *FAST, '--save_folder', tmp_path / 'val']
    assert_one_line_error(run_in_process('main_linear.py', *digits, '--val_split', 0.001),
                          '--val_split 0.001 holds out 2 of the', 'use a value in [')
    three = make_image_folder(tmp_path / 'three')
    for f in os.listdir(three / 'train' / 'b')[1:]:
        os.remove(three / 'train' / 'b' / f)
    lin3 = ['--dataset', 'path', '--data_folder', three, *lin[4:]]
    assert_one_line_error(run_in_process('main_linear.py', *lin3, '--val_split', 0.5),
                          '--val_split needs 2 training images of every class', 'class 1 has 1')


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    """A 16-bit grey PNG (PIL mode I;16) keeps its grey levels (``round(v * 255 / 65535)``;
    PIL's own conversion clips them at 255: two levels); an ``I`` image within 0..255 is 8-bit data; floating-point
    pixels (mode F) are one line naming the file."""
    from PIL import Image

    from core.flags import UserError
    from data import load_image
    values = (np.arange(144).reshape(12, 12) * 455).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / 'sixteen.png')
    assert Image.open(tmp_path / 'sixteen.png').mode.startswith('I')
    assert len(np.unique(np.asarray(Image.open(tmp_path / 'sixteen.png').convert('RGB')))) == 2    # PIL's clip
    got = np.asarray(load_image(str(tmp_path / 'sixteen.png')))
    assert got.shape == (12, 12, 3) and np.array_equal(got[..., 0], np.round(values * (255 / 65535)).astype(np.uint8))
    eight = np.arange(144).reshape(12, 12).astype(np.int32)
    assert np.array_equal(np.asarray(load_image_of(Image.fromarray(eight, 'I'), tmp_path))[..., 1], eight)
    Image.fromarray(np.ones((4, 4), np.float32), 'F').save(tmp_path / 'float.tif')
    with pytest.raises(UserError, match='float.tif has floating-point pixels'):
        load_image(str(tmp_path / 'float.tif'))


def load_image_of(image, tmp_path):
    from data import to_rgb
    return to_rgb(image, str(tmp_path / 'in_memory'))


@pytest.mark.slow
def test_a_sixteen_bit_image_folder_trains_and_a_float_image_is_named(tmp_path):
    """Through the real script: an ImageFolder of 16-bit PNGs trains; one float TIFF among them
    stops the run with one line naming it."""
    from PIL import Image

    from helpers import run_in_process
    rng = np.random.default_rng(0)
    for split in ('train', 'val'):
        for c in ('a', 'b'):
            os.makedirs(tmp_path / 'imgs' / split / c)
            for i in range(6):
                Image.fromarray(rng.integers(0, 65536, (12, 12), dtype=np.uint16)).save(
                    tmp_path / 'imgs' / split / c / f'{i}.png')
    common = ['--dataset', 'path', '--data_folder', tmp_path / 'imgs', '--mean', 0.5, '--std', 0.25, '--size', 12,
              '--model', 'resnet_tiny', '--epochs', 1, *FAST_FILES]
    run_script('main_ce.py', *common, '--save_folder', tmp_path / 'ce')
    Image.fromarray(np.ones((12, 12), np.float32), 'F').save(tmp_path / 'imgs' / 'train' / 'a' / 'float.tif')
    assert_one_line_error(run_in_process('main_ce.py', *common, '--save_folder', tmp_path / 'ce2'),
                          'float.tif has floating-point pixels')


@pytest.mark.slow
def test_image_folder_of_mixed_modes_trains_analyzes_and_evaluates(tmp_path):
    """An ImageFolder whose images are grey, palette, 1-bit, grey + alpha, RGBA, CMYK and 16-bit
    grey, of other sizes than the rest, with a class folder holding one image, goes through the real scripts:
    pre-training, analyze.py and linear evaluation, which (given no --dataset) evaluates on the checkpoint's own
    dataset and folder, not on the flag's default (digits: a silent wrong result before)."""
    import json

    from PIL import Image
    root = make_image_folder(tmp_path / 'data', per_class=4, size=12)
    rng = np.random.default_rng(1)
    pixels = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)
    odd = {'grey.png': Image.fromarray(pixels(12, 12)), 'rgba.png': Image.fromarray(pixels(12, 12, 4)),
           'palette.png': Image.fromarray(pixels(12, 12, 3)).convert('P'),
           'bits.png': Image.fromarray(pixels(12, 12)).convert('1'),
           'grey_alpha.png': Image.fromarray(pixels(12, 12, 2), 'LA'),
           'cmyk.jpg': Image.fromarray(pixels(12, 12, 3)).convert('CMYK'),
           'wide.jpg': Image.fromarray(pixels(10, 15, 3)),
           'grey16.png': Image.fromarray(rng.integers(0, 65536, (12, 12), dtype=np.uint16))}
    for split in ('train', 'val'):
        for i, (name, image) in enumerate(odd.items()):
            image.save(os.path.join(root, split, 'abc'[i % 3], name))
        os.makedirs(os.path.join(root, split, 'single'))
        Image.fromarray(pixels(12, 12, 3)).save(os.path.join(root, split, 'single', 'only.png'))
    data = ['--dataset', 'path', '--data_folder', root, '--mean', '(0.5, 0.5, 0.5)', '--std', '(0.25, 0.25, 0.25)']
    run_script('main_supcon.py', *data, '--model', 'resnet_tiny', '--size', 8, '--epochs', 1, '--batch_size', 8,
               '--num_workers', 0, '--device', 'cpu', '--save_folder', tmp_path / 'pre')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    out = run_script('analyze.py', '--ckpt', ckpt, '--device', 'cpu', '--out', tmp_path / 'analysis')
    assert 'analysis written' in out.stdout and os.path.isfile(tmp_path / 'analysis' / 'summary.md')
    run_script('main_linear.py', '--ckpt', ckpt, '--epochs', 1, '--batch_size', 8, '--num_workers', 0,
               '--device', 'cpu', '--save_folder', tmp_path / 'lin')
    results = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
    assert results['config']['dataset'] == 'path' and results['config']['data_folder'] == str(root)
    assert len(results['final_test_per_class_acc']) == 4            # a, b, c and the one-image class


def test_labelled_fraction_is_stratified_fixed_and_keeps_every_class():
    """--label_fraction: a stratified subset, the same whatever the run (seed 0), at least one image per class, and
    within the long-tailed split when there is one."""
    from data import build_dataset, labelled_fraction
    targets = np.repeat(np.arange(4), [50, 20, 5, 1])
    chosen = labelled_fraction(targets, 0.1)
    assert np.bincount(targets[chosen]).tolist() == [5, 2, 1, 1]
    assert np.array_equal(chosen, labelled_fraction(targets, 0.1)) and np.array_equal(chosen, np.sort(chosen))
    assert not np.array_equal(chosen, labelled_fraction(targets, 0.1, seed=1))
    flags = dict(dataset='digits_lt', size=8, imb_factor=0.1)
    whole = build_dataset(make_options('ce', **flags), 'train', None)
    opt = make_options('ce', **flags, label_fraction=0.1)
    part = build_dataset(opt, 'train', None)
    assert set(part.indices) <= set(whole.indices) and len(set(part.targets)) == 10
    assert np.bincount(part.targets).tolist() == [max(1, round(0.1 * n)) for n in np.bincount(whole.targets)]
    assert len(build_dataset(opt, 'test', None)) == len(build_dataset(make_options('ce', **flags), 'test',
                                                                    None))    # the test split is whole


def test_randaugment_and_views_flags():
    """--randaugment N,M adds torchvision's RandAugment to the PIL pipeline (after the crop), is refused with
    --augment device and for values out of range; --n_views names the run and must be at least 2."""
    from torchvision import transforms

    from config.options import parse_option
    from data import build_transform
    from helpers import run_in_process
    opt = parse_option('supcon', ['--randaugment', '2,9', '--n_views', '3'])
    steps = build_transform(opt, 'contrastive').transforms
    rand = [t for t in steps if isinstance(t, transforms.RandAugment)]
    assert len(rand) == 1 and (rand[0].num_ops, rand[0].magnitude) == (2, 9)
    assert '_randaug_2_9_views_3' in opt.run_name
    assert not any(isinstance(t, transforms.RandAugment) for t in build_transform(parse_option('ce', []), 'train')
                   .transforms)
    for args, words in [(['--randaugment', '2,9', '--augment', 'device'], 'PIL pipeline only'),
                        (['--randaugment', '2,31'], '--randaugment'), (['--n_views', '1'], '--n_views must be >= 2'),
                        (['--num_small_crops', '2', '--augment', 'device'], 'PIL pipeline'),
                        (['--num_small_crops', '2', '--chunk_size', '8'], 'gradient caching'),
                        (['--num_small_crops', '2', '--small_size', '16'], '--small_size must be in (0, --size 16)'),
                        (['--small_size', '8'], '--small_size needs --num_small_crops'),
                        (['--num_small_crops', '2', '--model', 'timm:vit_tiny_patch16_224'], 'dynamic_img_size')]:
        assert_one_line_error(run_in_process('main_supcon.py', *args), *words)


# ---------------------------------------------------------------- mid-scale datasets, on generated files
def make_fake_stl10(root, n_train=20, n_test=10, n_unlabeled=30, size=96):
    """STL-10's binary files as torchvision reads them (column-major 3 x 96 x 96 uint8 images, 1-based labels)."""
    rng = np.random.default_rng(0)
    folder = os.path.join(root, 'stl10_binary')
    os.makedirs(folder)
    for split, n in (('train', n_train), ('test', n_test), ('unlabeled', n_unlabeled)):
        rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8).tofile(os.path.join(folder, f'{split}_X.bin'))
        if split != 'unlabeled':
            (np.arange(n) % 10 + 1).astype(np.uint8).tofile(os.path.join(folder, f'{split}_y.bin'))
    with open(os.path.join(folder, 'class_names.txt'), 'w') as f:
        f.write('\n'.join(f'class{i}' for i in range(10)))
    with open(os.path.join(folder, 'fold_indices.txt'), 'w') as f:
        f.write(' '.join(map(str, range(n_train))))
    return str(root)


@pytest.mark.slow
def test_stl10_trains_simclr_on_the_unlabelled_split_and_evaluates_on_the_labelled(tmp_path):
    """--dataset stl10 reads STL-10's binary files (held in memory: --augment device serves them); stl10_unlabeled
    adds the unlabelled images for a method without labels (SupCon on it is one line), and main_linear.py then
    evaluates on stl10; without the files, one line points to --data_folder."""
    from data import build_dataset
    root = make_fake_stl10(tmp_path / 'data')
    opt = make_options(dataset='stl10', data_folder=root, size=96)
    train = build_dataset(opt, 'train', None)
    assert len(train) == 20 and train.data.shape == (20, 96, 96, 3) and train.targets[:3] == [0, 1, 2]
    common = ['--data_folder', root, '--size', 16, '--model', 'resnet_tiny', '--batch_size', 16, '--num_workers', 0,
              '--device', 'cpu', '--epochs', 1, '--print_freq', 1000]
    run_script('main_supcon.py', '--dataset', 'stl10_unlabeled', '--method', 'SimCLR', '--augment', 'device', *common,
               '--save_folder', tmp_path / 'pre')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    out = run_script('main_linear.py', '--ckpt', ckpt, '--batch_size', 16, '--num_workers', 0, '--device', 'cpu',
                     '--epochs', 1, '--save_folder', tmp_path / 'lin')
    assert 'final test top-1' in out.stdout and '/stl10/' in only_run_folder(tmp_path / 'lin')
    assert_one_line_error(run_in_process('main_supcon.py', '--dataset', 'stl10_unlabeled', *common[:2]),
                          'unlabelled images', '--method SimCLR')
    assert_one_line_error(run_in_process('main_supcon.py', '--dataset', 'stl10', '--data_folder', tmp_path / 'none',
                                         '--save_folder', tmp_path / 'x'), 'stl10 not found', '--data_folder')


def test_imagenet100_and_tinyimagenet_layouts(tmp_path):
    """imagenet100: the 100 CMC classes of an ImageNet-style tree (others ignored; a missing one is one line);
    tinyimagenet: the distributed layout (train/<wnid>/images, val/images + val_annotations.txt). Defaults: 224 px
    with the ImageNet stem and ImageNet statistics, 64 px with the CIFAR stem."""
    from PIL import Image

    from config.options import parse_option
    from data import IMAGENET100_CLASSES, build_dataset, mean_std
    assert len(set(IMAGENET100_CLASSES)) == 100
    rng = np.random.default_rng(0)
    image = lambda: Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    net = tmp_path / 'imagenet'
    for split in ('train', 'val'):
        for wnid in (*IMAGENET100_CLASSES, 'n99999999'):
            os.makedirs(net / split / wnid)
            image().save(net / split / wnid / 'a.JPEG')
    opt = parse_option('supcon', ['--dataset', 'imagenet100', '--data_folder', str(net)])
    assert (opt.size, opt.stem, mean_std(opt.dataset, None, None)[0][0]) == (224, 'imagenet', 0.485)
    train = build_dataset(opt, 'train', None)
    assert len(train.classes) == 100 and 'n99999999' not in train.classes and len(train) == 100
    import shutil
    shutil.rmtree(net / 'val' / IMAGENET100_CLASSES[5])
    with pytest.raises(Exception, match='lacks 1 of the 100 class folders'):
        build_dataset(opt, 'test', None)
    tiny = tmp_path / 'tiny'
    wnids = ['n01443537', 'n01629819', 'n01641577']
    for wnid in wnids:
        os.makedirs(tiny / 'train' / wnid / 'images')
        for i in range(2):
            image().save(tiny / 'train' / wnid / 'images' / f'{wnid}_{i}.JPEG')
    os.makedirs(tiny / 'val' / 'images')
    with open(tiny / 'val' / 'val_annotations.txt', 'w') as f:
        for i, wnid in enumerate([wnids[2], wnids[0]]):
            image().save(tiny / 'val' / 'images' / f'val_{i}.JPEG')
            f.write(f'val_{i}.JPEG\t{wnid}\t0\t0\t8\t8\n')
    opt = parse_option('ce', ['--dataset', 'tinyimagenet', '--data_folder', str(tiny)])
    assert (opt.size, opt.stem) == (64, 'cifar')
    train, val = build_dataset(opt, 'train', None), build_dataset(opt, 'test', None)
    assert train.classes == wnids and len(train) == 6 and val.targets == [2, 0] and val[0][1] == 2


@pytest.mark.slow
def test_image_cache_serves_an_image_folder_to_device_augmentation(tmp_path):
    """--image_cache SIZE: an image-file dataset decoded once at SIZE into a uint8 file under --data_folder/.cache
    (build time and size printed), served by --augment device; a second run reuses it, a changed image rebuilds it;
    an in-memory dataset refuses it and --augment device without it is one line."""
    from PIL import Image
    root = make_image_folder(tmp_path / 'data', per_class=5, size=12)
    args = ['--dataset', 'path', '--data_folder', root, '--mean', '(0.5, 0.5, 0.5)', '--std', '(0.25, 0.25, 0.25)',
            '--image_cache', 16, '--augment', 'device', '--size', 8, '--model', 'resnet_tiny', '--epochs', 1,
            '--batch_size', 8, '--num_workers', 0, '--device', 'cpu']
    first = run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'a')
    assert 'image cache: 15 images at 16 px' in first.stdout
    cached = np.load(os.path.join(root, '.cache', 'path_train_16.npy'))
    assert cached.shape == (15, 16, 16, 3) and cached.dtype == np.uint8
    again = run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'b')
    assert 'image cache' not in again.stdout
    Image.fromarray(np.zeros((12, 12, 3), dtype=np.uint8)).save(os.path.join(root, 'train', 'a', '0.png'))
    rebuilt = run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'c')
    assert 'image cache: 15 images' in rebuilt.stdout
    assert not np.load(os.path.join(root, '.cache', 'path_train_16.npy'))[0].any()       # the new black image
    assert_one_line_error(run_in_process('main_supcon.py', '--image_cache', 16), 'held in memory already')
    assert_one_line_error(run_in_process('main_supcon.py', *args[:8], '--augment', 'device'), '--image_cache')


@pytest.mark.slow
def test_multicrop_through_the_real_script(tmp_path):
    """--num_small_crops: the PIL pipeline gives each sample --n_views large and K small views (SwAV's crops) and
    main_supcon.py trains on them (the run name says so)."""
    from PIL import Image

    from config.options import parse_option
    from data import contrastive_views
    opt = parse_option('supcon', ['--num_small_crops', '3'])
    views = contrastive_views(opt)(Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)))
    assert [v.shape[-1] for v in views] == [16, 16, 7, 7, 7] and opt.small_size == 7
    run_script('main_supcon.py', '--dataset', 'digits_lt', '--imb_factor', 0.1, '--num_small_crops', 2,
               '--epochs', 1, '--batch_size', 64, '--num_workers', 0, '--device', 'cpu', '--save_folder', tmp_path)
    assert '_multicrop_2x7' in only_run_folder(tmp_path)


# ---------------------------------------------------------------- files that lie about themselves
FILE_RUN = ['--size', 8, '--model', 'resnet_tiny', '--batch_size', 8, '--num_workers', 0, '--device', 'cpu',
            '--epochs', 1]


@pytest.mark.slow
def test_an_image_cache_cut_short_is_built_again(tmp_path):
    """A cache whose array file was cut short (a full disk, a killed build) while its metadata survived is built
    again with a line saying so: before, ``np.load`` failed with "mmap length is greater than file size"."""
    root = make_image_folder(tmp_path / 'data', per_class=5, size=12)
    args = ['--dataset', 'path', '--data_folder', root, '--mean', '(0.5, 0.5, 0.5)', '--std', '(0.25, 0.25, 0.25)',
            '--image_cache', 16, '--augment', 'device', *FILE_RUN]
    run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'a')
    cache = os.path.join(root, '.cache', 'path_train_16.npy')
    whole = os.path.getsize(cache)
    with open(cache, 'r+b') as f:
        f.truncate(whole - 700)
    out = run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'b')
    assert 'cut short or damaged: building it again' in out.stdout and 'image cache: 15 images' in out.stdout
    assert os.path.getsize(cache) == whole and np.load(cache).shape == (15, 16, 16, 3)


def test_a_broken_link_in_an_image_folder_is_one_line_with_the_cache_too(tmp_path):
    root = make_image_folder(tmp_path / 'data', per_class=3, size=12)
    os.symlink(tmp_path / 'gone.png', os.path.join(root, 'train', 'a', 'link.png'))
    args = ['main_supcon.py', '--dataset', 'path', '--data_folder', root, '--mean', '(0.5, 0.5, 0.5)', '--std',
            '(0.25, 0.25, 0.25)', *FILE_RUN, '--save_folder', tmp_path / 'run']
    assert_one_line_error(run_in_process(*args, '--image_cache', 16, '--augment', 'device'), 'cannot read image',
                          'link.png')


def test_stl10_files_that_disagree_with_themselves_are_one_line(tmp_path):
    """Labels outside 1..10 (a 0 became 255 in torchvision's uint8 subtraction: SupCon trained on it, CE crashed),
    a labels file shorter than its images file, an images file cut short: one line naming the file, for both
    scripts."""
    from test_data import make_fake_stl10
    common = [*FILE_RUN, '--augment', 'device']
    cases = []
    for case in ('label0', 'short_labels', 'short_images', 'label11'):
        root = make_fake_stl10(tmp_path / case)
        folder = os.path.join(root, 'stl10_binary')
        labels = np.fromfile(os.path.join(folder, 'train_y.bin'), dtype=np.uint8)
        if case in ('label0', 'label11'):
            labels[3] = 0 if case == 'label0' else 11
            labels.tofile(os.path.join(folder, 'train_y.bin'))
        elif case == 'short_labels':
            labels[:-1].tofile(os.path.join(folder, 'train_y.bin'))
        else:
            with open(os.path.join(folder, 'train_X.bin'), 'r+b') as f:
                f.truncate(3 * 96 * 96 * 5 + 100)
        cases.append((root, case))
    words = {'label0': ('train_y.bin', 'label 0, outside 1..10'), 'label11': ('train_y.bin', 'label 11'),
             'short_labels': ('train_y.bin', '19 labels', '20 images'), 'short_images': ('train_X.bin', 'cut short')}
    for root, case in cases:
        for script in ('main_supcon.py', 'main_ce.py'):
            assert_one_line_error(run_in_process(script, '--dataset', 'stl10', '--data_folder', root, *common,
                                                 '--save_folder', tmp_path / 'run' / case), *words[case])


def test_cifar_batches_that_disagree_with_themselves_are_one_line(tmp_path):
    import pickle
    for case, words in (('labels', ('data_batch_2', '7 labels for 8 images')),
                        ('range', ('data_batch_2', 'label 10, outside 0..9')),
                        ('width', ('data_batch_2', 'images of 32 x 32 x 3 bytes'))):
        root = make_fake_cifar(tmp_path / case)
        path = os.path.join(root, 'cifar-10-batches-py', 'data_batch_2')
        with open(path, 'rb') as f:
            entry = pickle.load(f)
        if case == 'labels':
            entry['labels'] = entry['labels'][:-1]
        elif case == 'range':
            entry['labels'][0] = 10
        else:
            entry['data'] = entry['data'][:, :3000]
        with open(path, 'wb') as f:
            pickle.dump(entry, f)
        for script in ('main_supcon.py', 'main_ce.py'):
            assert_one_line_error(run_in_process(script, '--dataset', 'cifar10', '--data_folder', root, *FILE_RUN,
                                                 '--save_folder', tmp_path / 'run'), *words)


def test_tinyimagenet_and_imagenet100_trees_that_lie_are_one_line(tmp_path):
    """Tiny ImageNet's annotations naming images the folder lacks, or a line without a class; an ImageNet-100 class
    folder without images: one line each, before training."""
    from PIL import Image

    from data import IMAGENET100_CLASSES
    image = Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8))
    tiny = tmp_path / 'tiny'
    for wnid in ('n01443537', 'n01629819'):
        os.makedirs(tiny / 'train' / wnid / 'images')
        image.save(tiny / 'train' / wnid / 'images' / f'{wnid}_0.JPEG')
    os.makedirs(tiny / 'val' / 'images')
    image.save(tiny / 'val' / 'images' / 'val_0.JPEG')
    args = ['--dataset', 'tinyimagenet', '--data_folder', tiny, *FILE_RUN, '--save_folder', tmp_path / 'run']
    for text, words in (('val_0.JPEG\tn01443537\t0\t0\t8\t8\nval_1.JPEG\tn01629819\t0\t0\t8\t8\n',
                         ('lists 1 images', 'val_1.JPEG')),
                        ('val_0.JPEG\n', ('line 1', 'class id'))):
        (tiny / 'val' / 'val_annotations.txt').write_text(text)
        assert_one_line_error(run_in_process('main_ce.py', *args), *words)
    net = tmp_path / 'imagenet'
    for split in ('train', 'val'):
        for wnid in IMAGENET100_CLASSES:
            os.makedirs(net / split / wnid)
            if wnid != IMAGENET100_CLASSES[7]:
                image.save(net / split / wnid / 'a.JPEG')
    assert_one_line_error(run_in_process('main_ce.py', '--dataset', 'imagenet100', '--data_folder', net, *FILE_RUN,
                                         '--save_folder', tmp_path / 'run2'), 'cannot read --dataset imagenet100',
                          IMAGENET100_CLASSES[7])


@pytest.mark.slow
def test_multicrop_with_a_vit_picks_a_small_size_the_model_takes(tmp_path):
    """USAGE's ViT multi-crop setup at the digits' size crashed (the default --small_size 7 is not a
    multiple of patch size 4); the default is now the nearest size the model takes (8), and a --small_size it
    cannot take is one line."""
    vit = ['--model', 'timm:vit_tiny_patch16_224', '--model_args', 'depth=1,patch_size=4,dynamic_img_size=true',
           '--num_small_crops', 2, '--num_workers', 0, '--device', 'cpu', '--batch_size', 64, '--epochs', 1]
    out = run_script('main_supcon.py', *vit, '--save_folder', tmp_path / 'a')
    assert '_multicrop_2x8' in only_run_folder(tmp_path / 'a') and 'epoch 1/1' in out.stdout
    assert_one_line_error(run_in_process('main_supcon.py', *vit, '--small_size', 7, '--save_folder', tmp_path / 'b'),
                          '--small_size 7', 'cannot take 7 x 7 images')
