"""data/augment.py: each batched operation against torchvision's functional operation applied per image, the batched
samplers against torchvision's own parameter draws (two-sample tests with power checks), and the cpu and device
pipelines against each other on digits."""
import itertools
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torchvision import transforms
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from data import augment as A
from helpers import make_options


def images(n=6, h=20, w=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, h, w, generator=g)


def per_image(fn, x, *params):
    return torch.stack([fn(x[i], *[p[i].item() if torch.is_tensor(p) else p for p in params])
                        for i in range(x.shape[0])])


@pytest.mark.parametrize('size', [8, 16, 40])          # down-scaling (antialias), mixed, up-scaling
def test_resized_crop_equals_torchvision(size):
    x = images()
    top, left = torch.tensor([0, 3, 5, 0, 7, 1]), torch.tensor([0, 2, 9, 4, 0, 11])
    h, w = torch.tensor([20, 10, 7, 15, 13, 9]), torch.tensor([24, 12, 15, 20, 5, 13])
    got = A.resized_crop(x, top, left, h, w, size)
    want = per_image(lambda im, t, lf, hh, ww: TF.resized_crop(im, t, lf, hh, ww, [size, size], antialias=True),
                     x, top, left, h, w)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    flip = torch.tensor([True, False, True, True, False, False])
    torch.testing.assert_close(A.resized_crop(x * 255, top, left, h, w, size, flip=flip, scale=1 / 255),
                               A.hflip(want, flip), rtol=0, atol=4e-6)       # flip and scaling folded in


def test_flip_rotate_grayscale_normalize_equal_torchvision():
    x = images()
    flip = torch.tensor([True, False, True, True, False, False])
    torch.testing.assert_close(A.hflip(x, flip), torch.stack([TF.horizontal_flip(im) if f else im
                                                              for im, f in zip(x, flip)]), rtol=0, atol=0)
    degrees = torch.tensor([-10.0, -3.3, 0.0, 2.5, 7.77, 10.0])
    want = torch.stack([TF.rotate(im, float(d), interpolation=InterpolationMode.NEAREST) for im, d in zip(x, degrees)])
    got = A.rotate(x, degrees)
    assert (got != want).float().mean() < 0.005       # nearest neighbour: a coordinate at a pixel edge may round
    torch.testing.assert_close(got[2], x[2], rtol=0, atol=0)
    gray = torch.tensor([True, False, False, True, True, False])
    torch.testing.assert_close(A.grayscale(x, gray), torch.stack([TF.rgb_to_grayscale(im, 3) if m else im
                                                                  for im, m in zip(x, gray)]), rtol=0, atol=1e-6)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.6, 0.7)
    torch.testing.assert_close(A.normalize(x, mean, std), TF.normalize(x, list(mean), list(std)))


@pytest.mark.parametrize('op, tv, values', [
    (A.adjust_brightness, TF.adjust_brightness, [0.6, 0.8, 1.0, 1.2, 1.4, 0.9]),
    (A.adjust_contrast, TF.adjust_contrast, [0.6, 0.8, 1.0, 1.2, 1.4, 0.9]),
    (A.adjust_saturation, TF.adjust_saturation, [0.6, 0.8, 1.0, 1.2, 1.4, 0.9]),
    (A.adjust_hue, TF.adjust_hue, [-0.1, -0.05, 0.0, 0.03, 0.1, 0.5]),
])
def test_colour_operations_equal_torchvision(op, tv, values):
    x = images()
    x[0, :, :4] = 0.5                     # gray pixels (no hue) and a black corner
    x[1, :, :2, :2] = 0.0
    x[2, 1, :5] = x[2, 0, :5]             # ties for the largest channel (sextant edges)
    x[3, 2, :5] = x[3, 1, :5]
    x[4, 2, :5] = x[4, 0, :5]
    factor = torch.tensor(values)
    torch.testing.assert_close(op(x, factor), per_image(tv, x, factor), rtol=0, atol=2e-6)


def test_colour_jitter_applies_the_operations_in_each_images_order():
    x = images()
    factors = torch.tensor([[0.7, 1.3, 0.6, 0.05]] * 6)
    order = torch.tensor([list(p) for p in itertools.permutations(range(4))][:6])
    apply = torch.tensor([True, True, True, False, True, True])
    got = A.color_jitter(x, factors, order, apply)
    tv_ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for i in range(6):
        want = x[i]
        for op_index in (order[i].tolist() if apply[i] else []):
            want = tv_ops[op_index](want, float(factors[i, op_index]))
        torch.testing.assert_close(got[i], want, rtol=0, atol=2e-6)
    torch.testing.assert_close(A.color_jitter(x, factors, order, apply, sync_free=True), got, rtol=0, atol=1e-6)


def test_colour_jitter_grouped_by_order_equals_each_image_alone():
    """The CPU form groups the batch by order of operations (24 orders); every image must come out as if it
    were jittered alone, bit for bit, and match the accelerator form (every operation on every row)."""
    g = torch.Generator().manual_seed(1)
    x = images(200)
    factors, order = A.sample_jitter(g, 200, 0.4, 0.4, 0.4, 0.1, 'cpu')
    apply = torch.rand(200, generator=g) < 0.8
    got = A.color_jitter(x, factors, order, apply)
    for i in range(200):
        want = x[i:i + 1]
        for op_index in (order[i].tolist() if apply[i] else []):
            want = A.JITTER_OPS[op_index](want, factors[i:i + 1, op_index])
        assert torch.equal(got[i:i + 1], want), i
    torch.testing.assert_close(A.color_jitter(x, factors, order, apply, sync_free=True), got, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- samplers
N_DRAWS = 20000


def torchvision_crops(height, width, scale, ratio, seed=0):
    torch.manual_seed(seed)
    boxes = [transforms.RandomResizedCrop.get_params(torch.empty(3, height, width), scale, ratio)
             for _ in range(N_DRAWS)]
    return np.array(boxes, dtype=np.float64)          # top, left, h, w


def ours_crops(height, width, scale, ratio, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.stack(A.sample_crops(g, N_DRAWS, height, width, scale, ratio, 'cpu'), 1).double().numpy()


def crop_pvalues(ours, theirs, height, width):
    """KS p-values of area fraction, aspect ratio and the box centre (x, y)."""
    def features(b):
        return [b[:, 2] * b[:, 3] / (height * width), b[:, 3] / b[:, 2],
                b[:, 1] + b[:, 3] / 2, b[:, 0] + b[:, 2] / 2]
    return [stats.ks_2samp(a, b).pvalue for a, b in zip(features(ours), features(theirs))]


@pytest.mark.parametrize('style', ['natural', 'digits'])
def test_crop_sampler_matches_torchvision_and_a_wrong_range_fails(style):
    scale, ratio = ((0.2, 1.0), (3 / 4, 4 / 3)) if style == 'natural' else ((0.5, 1.0), (0.8, 1.25))
    theirs = torchvision_crops(32, 32, scale, ratio)
    assert min(crop_pvalues(ours_crops(32, 32, scale, ratio), theirs, 32, 32)) > 1e-3
    # power: one range a little off must be detected
    assert crop_pvalues(ours_crops(32, 32, (scale[0] + 0.05, 1.0), ratio), theirs, 32, 32)[0] < 1e-3
    assert crop_pvalues(ours_crops(32, 32, scale, (ratio[0], ratio[1] * 1.1)), theirs, 32, 32)[1] < 1e-3


def test_crop_fallback_is_torchvisions_central_crop():
    """A wide image with a ratio range that never fits: every draw falls back to the central crop."""
    g = torch.Generator().manual_seed(0)
    top, left, h, w = A.sample_crops(g, 50, 10, 40, (0.9, 1.0), (0.5, 0.6), 'cpu')
    want = transforms.RandomResizedCrop.get_params(torch.empty(3, 10, 40), (0.9, 1.0), (0.5, 0.6))
    assert set(zip(top.tolist(), left.tolist(), h.tolist(), w.tolist())) == {want}


def test_jitter_flip_and_grayscale_rates_match_torchvision():
    g = torch.Generator().manual_seed(0)
    aug = A.BatchAugment(32, (0.5,) * 3, (0.5,) * 3, 'natural', 'contrastive', g)
    p = aug.sample(N_DRAWS, 32, 32, 'cpu')
    for name, rate in (('flip', 0.5), ('jitter', 0.8), ('gray', 0.2)):
        k = int(p[name].sum())
        assert stats.binomtest(k, N_DRAWS, rate).pvalue > 1e-3, name
        assert stats.binomtest(k, N_DRAWS, rate + 0.02).pvalue < 1e-3, name      # power
    torch.manual_seed(0)
    jitter = transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)
    theirs = [jitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
              for _ in range(N_DRAWS)]
    their_factors = np.array([t[1:] for t in theirs])
    ours = p['factors'].double().numpy()
    for j in range(4):
        assert stats.ks_2samp(ours[:, j], their_factors[:, j]).pvalue > 1e-3, j
    assert stats.ks_2samp(ours[:, 0] * 1.05, their_factors[:, 0]).pvalue < 1e-3          # power: a wider range
    perms = {perm: i for i, perm in enumerate(itertools.permutations(range(4)))}
    ours_count = np.bincount([perms[tuple(o)] for o in p['order'].tolist()], minlength=24)
    their_count = np.bincount([perms[tuple(t[0].tolist())] for t in theirs], minlength=24)
    assert stats.chisquare(ours_count).pvalue > 1e-3 and stats.chisquare(their_count).pvalue > 1e-3
    biased = ours_count.copy()
    biased[0] += N_DRAWS // 24 // 5                    # power: one order 20 % more frequent
    assert stats.chisquare(biased).pvalue < 1e-3


def test_rotation_angles_are_uniform_in_ten_degrees():
    g = torch.Generator().manual_seed(0)
    p = A.BatchAugment(16, (0.5,) * 3, (0.5,) * 3, 'digits', 'train', g).sample(N_DRAWS, 16, 16, 'cpu')
    assert stats.kstest(p['degrees'].numpy(), stats.uniform(-10, 20).cdf).pvalue > 1e-3
    assert stats.kstest(p['degrees'].numpy(), stats.uniform(-11, 22).cdf).pvalue < 1e-3   # power
    assert 'flip' not in p and 'jitter' not in p


# ---------------------------------------------------------------- cpu and device pipelines on digits
def view_statistics(views_a, views_b):
    """Per-channel mean and std over all views, and the mean cosine between the two views of an image."""
    both = torch.cat([views_a, views_b])
    cos = F.cosine_similarity(views_a.flatten(1), views_b.flatten(1), dim=1).mean()
    return both.mean((0, 2, 3)), both.std((0, 2, 3)), cos


@pytest.mark.parametrize('style, kind', [('natural', 'contrastive'), ('digits', 'contrastive'), ('natural', 'train')])
def test_cpu_passes_equal_one_pass_in_batch_order_and_each_image_alone(style, kind):
    """On a CPU the batch runs sorted by order of colour operations, in chunks, under inference mode; every image
    must land in its own row with the numbers of one pass over the batch in its own order and of the image
    augmented alone, bit for bit; and agree with the accelerator's form (every operation on every row)."""
    x = (images(300, 20, 20) * 255).to(torch.uint8)
    aug = A.BatchAugment(16, (0.5,) * 3, (0.3,) * 3, style, kind, torch.Generator().manual_seed(0))
    p = aug.sample(300, 20, 20, 'cpu')
    got = aug.apply(x, p)
    assert not got.is_inference() and got.is_contiguous()
    assert torch.equal(got, aug._apply(x, p))
    for i in (0, 1, 57, 299):
        assert torch.equal(got[i:i + 1], aug._apply(x[i:i + 1], {k: v[i:i + 1] for k, v in p.items()})), i
    torch.testing.assert_close(aug._apply(x, p, sync_free=True), got, rtol=0, atol=1e-5)
    aug.CPU_CHUNK = 1000
    assert torch.equal(aug.apply(x, p), got)
    if kind == 'contrastive':                   # power: the rows were processed out of order and put back
        idx = torch.argsort(A.jitter_groups(p['order'], p['jitter']), stable=True)
        assert not torch.equal(idx, torch.arange(300)) and not torch.equal(got[idx], got)
    assert aug.apply(x[:0], {k: v[:0] for k, v in p.items()}).shape == (0, 3, 16, 16)


def test_crop_weights_table_equals_the_direct_computation():
    g = torch.Generator().manual_seed(3)
    for in_size, out_size in ((20, 16), (32, 32), (8, 24)):
        n = 400
        length = torch.randint(1, in_size + 1, (n,), generator=g)
        start = (torch.rand(n, generator=g) * (in_size - length + 1)).long()
        flip = torch.rand(n, generator=g) < 0.5
        assert torch.equal(A.crop_weights(start, length, in_size, out_size),
                           A.resize_weights(start, length, in_size, out_size))
        direct = A.resize_weights(start, length, in_size, out_size, flip)
        assert torch.equal(A.crop_weights(start, length, in_size, out_size, flip), direct)
        assert torch.equal(direct[flip], A.resize_weights(start, length, in_size, out_size)[flip].flip(1))


def test_grayscale_forms_agree():
    x = images(50)
    gray = torch.rand(50, generator=torch.Generator().manual_seed(0)) < 0.3
    assert torch.equal(A.grayscale(x, gray), torch.where(gray[:, None, None, None], A.luma(x).expand_as(x), x))
    assert torch.equal(A.grayscale(x, gray), A._pick(gray, A.luma(x), x))


def test_cpu_and_device_pipelines_agree_on_digits_statistics():
    """The same distribution sample by sample: pixel statistics of two augmented views per digit image agree
    between today's per-image PIL pipeline and the batched one (tolerances: 0.02 for means and stds of
    normalized pixels, 0.02 for the mean cosine; the runs differ in their random draws and in PIL's uint8
    rounding after each operation)."""
    from data import Digits, build_transform
    opt = make_options(dataset='digits', size=16)
    torch.manual_seed(0)
    pil = Digits(train=True, size=16, transform=build_transform(opt, 'contrastive'))
    cpu_a = torch.stack([pil[i][0] for i in range(len(pil))])
    cpu_b = torch.stack([pil[i][0] for i in range(len(pil))])
    from data import in_memory_images
    raw, _ = in_memory_images(Digits(train=True, size=16))
    x = torch.from_numpy(raw).permute(0, 3, 1, 2)
    from data import mean_std
    aug = A.BatchAugment(16, *mean_std('digits'), 'digits', 'contrastive', torch.Generator().manual_seed(0))
    dev_a, dev_b = aug(x), aug(x)
    (m1, s1, c1), (m2, s2, c2) = view_statistics(cpu_a, cpu_b), view_statistics(dev_a, dev_b)
    torch.testing.assert_close(m1, m2, rtol=0, atol=0.02)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0.02)
    assert abs(float(c1) - float(c2)) < 0.02, (float(c1), float(c2))
    # power: without the colour operations, or with crops of scale (0.3, 1), the statistics move past the tolerance
    plain = A.BatchAugment(16, *mean_std('digits'), 'digits', 'train', torch.Generator().manual_seed(0))
    assert abs(float(view_statistics(plain(x), plain(x))[2]) - float(c1)) > 0.02
    wrong = A.BatchAugment(16, *mean_std('digits'), 'digits', 'contrastive', torch.Generator().manual_seed(0))
    wrong.scale = (0.3, 1.0)
    m4, _, c4 = view_statistics(wrong(x), wrong(x))
    assert abs(float(c4) - float(c1)) > 0.02 and (m4 - m1).abs().max() > 0.02


def test_device_loader_shards_like_distributed_sampler():
    from torch.utils.data import DistributedSampler

    from data import Digits, in_memory_images, mean_std
    from datasets_indexed import IndexedDataset
    data = IndexedDataset(Digits(train=True, size=8))
    for world, rank in ((1, 0), (2, 0), (2, 1), (3, 2)):
        loader = A.DeviceLoader(data, *in_memory_images(data), 'contrastive', device=torch.device('cpu'),
                                batch_size=100, size=8, mean_std=mean_std('digits'), style='digits', n_views=2,
                                seed=5, world_size=world, rank=rank)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            sampler.set_epoch(epoch)
            assert loader.indices().tolist() == list(sampler)
        batches = list(loader)
        assert len(batches) == len(loader) == math.ceil(len(sampler) / 100)
        views, labels, idx = batches[0]
        assert len(views) == 2 and views[0].shape == (100, 3, 8, 8) and not torch.equal(views[0], views[1])
        assert labels.tolist() == [data.targets[i] for i in idx.tolist()]


def test_device_loader_refuses_what_is_not_in_memory(tmp_path):
    from torchvision import datasets

    from core.flags import UserError
    from data import in_memory_images
    from helpers import make_image_folder
    folder = datasets.ImageFolder(str(make_image_folder(tmp_path) / 'train'))
    with pytest.raises(UserError, match='held in memory'):
        in_memory_images(folder)


# ---------------------------------------------------------------- end to end (the real scripts on digits)
DEVICE = ['--augment', 'device', '--num_workers', 0, '--batch_size', 128, '--print_freq', 1000]


@pytest.mark.slow
@pytest.mark.xdist_group('devaug')
def test_device_augmented_supcon_then_linear(shared_run, tmp_path):
    """The shared --augment device run (its exact resume: tests/engine/test_resume.py), then linear evaluation with
    the device pipeline."""
    from helpers import load, run_script
    run, _ = shared_run('devaug')
    ref = load(os.path.join(run, 'last.pth'))
    assert ref['config']['augment'] == 'device' and '_devaug' in run
    assert 'augment' in ref['rng']['generators']
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1, '--learning_rate', 1,
                     '--save_folder', tmp_path / 'lin', *DEVICE)
    assert 'final test top-1' in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize('script, args', [
    ('main_supcon.py', ['--method', 'RASCAL', '--queue_size', 128, '--carrot', '--chunk_size', 48,
                        '--channels_last', '--amp', 'bf16', '--knn_every', 1, '--label_granularity', 'coarse',
                        '--size', 8, '--dataset', 'digits_lt', '--imb_factor', 0.01]),     # bf16 is slow on a CPU
    ('main_ce.py', ['--carrot']),
])
def test_device_augmentation_composes(tmp_path, script, args):
    from helpers import only_run_folder, read_metrics, run_script
    run_script(script, *args, '--epochs', 1, '--save_folder', tmp_path, *DEVICE)
    row = read_metrics(only_run_folder(tmp_path))[0]
    assert float(row['train/loss']) > 0 and float(row['train/collapse/z_std_enc']) > 0
    if script == 'main_supcon.py':
        assert float(row['train/queue/fill']) > 0.5 and 0 < float(row['knn/acc']) <= 100


@pytest.mark.slow
def test_device_augmentation_under_torchrun(tmp_path):
    from test_distributed import torchrun

    from helpers import only_run_folder, read_metrics
    out = torchrun('main_supcon.py', '--dataset', 'digits', '--epochs', 1, '--save_folder', tmp_path, *DEVICE)
    assert out.stdout.count('epoch 1/1') == 1
    assert float(read_metrics(only_run_folder(tmp_path))[0]['train/loss']) > 0


@pytest.mark.slow
def test_device_augmentation_where_it_cannot_apply(tmp_path):
    from helpers import assert_one_line_error, make_image_folder, run_script
    folder = make_image_folder(tmp_path / 'imgs')
    proc = run_script('main_supcon.py', '--dataset', 'path', '--data_folder', folder, '--mean', '0.5', '--std', '0.5',
                      '--augment', 'device', '--save_folder', tmp_path / 'save', check=False)
    assert_one_line_error(proc, '--augment device needs a dataset held in memory', 'use --augment cpu')


def test_evaluation_loaders_equal_the_cpu_evaluation_transform():
    """``--augment device`` evaluation loaders: the whole split in order, normalized like ToTensor + Normalize;
    creating one leaves the training generator registered."""
    from data import Digits, build_loader, build_transform
    from runtime.rng import GENERATORS
    opt = make_options(dataset='digits', size=16, batch_size=100, augment='device', num_workers=0)
    # rank 1 of 2 with a local batch of 64, as engine.setup would set a run up under torchrun
    opt.local_batch_size, opt.world_size, opt.rank, opt.device = 64, 2, 1, torch.device('cpu')
    train = build_loader(opt, Digits(train=True, size=16), train=True, kind='train')
    g = GENERATORS['augment']
    test = Digits(train=False, size=16, transform=build_transform(opt, 'eval'))
    loader = build_loader(opt, Digits(train=False, size=16), train=False)
    assert GENERATORS['augment'] is g and len(loader) == math.ceil(len(test) / 100) and train.train
    got = torch.cat([x for x, _ in loader])
    want = torch.stack([test[i][0] for i in range(len(test))])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert torch.cat([y for _, y in loader]).tolist() == test.targets


def test_device_loader_drops_a_last_batch_of_one():
    import numpy as np

    from data.augment import DeviceLoader
    images, targets = np.zeros((9, 8, 8, 3), dtype=np.uint8), [0, 1, 2] * 3
    kw = dict(device=torch.device('cpu'), batch_size=4, size=8, mean_std=((0.5,) * 3, (0.25,) * 3), style='digits')
    sizes = [len(b[1]) for b in DeviceLoader(None, images, targets, 'train', drop_last=True, **kw)]
    assert sizes == [4, 4] and len(DeviceLoader(None, images, targets, 'train', drop_last=True, **kw)) == 2
    assert [len(b[1]) for b in DeviceLoader(None, images, targets, 'train', **kw)] == [4, 4, 1]


@pytest.mark.parametrize('n_views, kind', [(2, 'contrastive'), (None, 'train')])
def test_a_pending_loader_yields_what_the_step_augments(n_views, kind):
    """``pending`` (``data.views.pend_augmentation``, under ``--compile``): the loader draws the same parameters
    from its generator and hands the uint8 images over (:class:`data.views.PendingViews`); the views they make are
    the loader's own (its form without host reads: within float rounding on a CPU) and the generator is left where
    the plain loader leaves it."""
    from data.views import PendingViews
    rng = np.random.default_rng(0)
    images, targets = rng.integers(0, 256, (24, 20, 20, 3), dtype=np.uint8), [0, 1, 2] * 8
    kw = dict(device=torch.device('cpu'), batch_size=8, size=16, mean_std=((0.5,) * 3, (0.25,) * 3),
              style='natural', n_views=n_views, seed=3)
    plain, pending = (A.DeviceLoader(None, images, targets, kind, **kw) for _ in range(2))
    pending.pending = True
    for (want, labels), (got, got_labels) in zip(plain, pending):
        assert isinstance(got, PendingViews) and torch.equal(labels, got_labels)
        views = got.views()
        want = want if n_views else [want]
        assert len(views) == len(want)
        for a, b in zip(views, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(plain.augment.generator.get_state(), pending.augment.generator.get_state())
