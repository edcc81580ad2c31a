"""steps.py: gradient caching (--chunk_size) gives the gradient of the plain step, for every method and
CARROT; power checks break the mechanism (the cached gradient dropped, the RNG not restored) and must fail."""
import copy

import pytest
import torch
import torch.nn as nn

import steps
from engine import setup
from losses_carrot import CARROT
from methods import get_method
from networks import SupCEResNet, SupConResNet
from options import parse_option
from util import prepare_model

BSZ = 16
CASES = {
    'SupCon': ['--method', 'SupCon'],
    'SimCLR': ['--method', 'SimCLR'],
    'SimCLR-ntlogistic': ['--method', 'SimCLR', '--simclr_loss', 'ntlogistic'],
    'RASCAL': ['--method', 'RASCAL'],
    'SupCon+CARROT': ['--method', 'SupCon', '--carrot', '--carrot_alpha_max', 'inf'],
    'RASCAL+CARROT-head': ['--method', 'RASCAL', '--carrot', '--carrot_on', 'head'],
    'CE+CARROT': ['--carrot', '--carrot_alpha_max', 'inf'],
}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(BSZ, 3, 16, 16, generator=g) for _ in range(2)]
    return views, torch.randint(0, 3, (BSZ,), generator=g), torch.arange(100, 100 + BSZ)


def build(case, chunk_size, train=False, dropout=False):
    script = 'ce' if case.startswith('CE') else 'supcon'
    opt = setup(parse_option(script, CASES[case] + ['--batch_size', str(BSZ), '--device', 'cpu',
                                                    '--chunk_size', str(chunk_size)]), run_folder=False)
    torch.manual_seed(0)
    model = SupCEResNet('resnet_tiny', num_classes=3) if script == 'ce' else SupConResNet('resnet_tiny')
    if dropout:    # a forward that draws random numbers: the RNG must be restored per chunk
        model.encoder = nn.Sequential(model.encoder, nn.Dropout(0.5))
    model = prepare_model(opt, model).train(train)
    return opt, model, CARROT(opt.carrot_q_hi, opt.carrot_q_lo) if opt.carrot else None


def run_step(case, chunk_size, train=False, dropout=False, model=None, seed=0):
    """One step (after a warm-up step for RASCAL's cache); returns (loss, stats, grads, model)."""
    opt, built, carrot = build(case, chunk_size, train, dropout)
    model = model if model is not None else built
    views, labels, ids = batch(seed)
    if case.startswith('CE'):
        torch.manual_seed(1)
        model.zero_grad()
        loss, stats = steps.ce_step(opt, model, model, carrot, views[0], labels)
    else:
        method = get_method(opt.method)
        criterion = method.build(opt, 200)
        for _ in range(2 if method.uses_ids else 1):
            torch.manual_seed(1)
            model.zero_grad()
            loss, stats = steps.contrastive_step(opt, method, model, model, criterion, carrot, views, labels, ids)
    return loss, stats, {n: p.grad.clone() for n, p in model.named_parameters()}, model


def assert_grads_equal(got, want, what):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=f'{what}: {name}')


@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize('chunk', [5, 8])
def test_chunked_step_equals_the_plain_step(case, chunk):
    """BatchNorm in eval mode: then the loss is the only coupling of samples, and chunking is exact."""
    loss, stats, grads, _ = run_step(case, 0)
    loss_c, stats_c, grads_c, _ = run_step(case, chunk)
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(grads_c, grads, case)
    if 'carrot/alpha' in stats:
        assert float(stats['carrot/alpha']) > 0
        torch.testing.assert_close(stats_c['carrot/alpha'], stats['carrot/alpha'], rtol=1e-5, atol=1e-7)
    for key in stats:
        torch.testing.assert_close(torch.as_tensor(stats_c[key]), torch.as_tensor(stats[key]), rtol=1e-5,
                                   atol=1e-6, msg=key)


def reference_on_chunks(case, chunk, dropout):
    """The plain computation on the same chunks, in train mode: each chunk through the encoder with a graph
    (BatchNorm statistics per chunk, the RNG drawn in chunk order), then one backward of the whole loss."""
    opt, model, carrot = build(case, 0, train=True, dropout=dropout)
    views, labels, ids = batch()
    method = get_method(opt.method)
    criterion = method.build(opt, 200)
    torch.manual_seed(1)
    chunks = steps.chunk_images(opt, views, chunk)
    h = steps.batch_order([model.encoder(c) for c in chunks], 2)
    loss, _, _ = steps.supcon_loss_from_parts(opt, method, model, criterion, carrot, h, model.head(h),
                                           labels.to(opt.device), ids, 2)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, model


@pytest.mark.parametrize('breakage', ['none', 'drop_cached_gradient', 'rng_not_restored'])
def test_train_mode_equals_the_plain_step_on_the_same_chunks(breakage, monkeypatch):
    """Train-mode BatchNorm and dropout: the chunked step equals back-propagating through per-chunk forwards.
    Power: dropping the cached gradient, or not restoring the RNG, must break the equality."""
    want, ref_model = reference_on_chunks('SupCon', 6, dropout=True)
    if breakage == 'drop_cached_gradient':
        real = steps.chunk_order
        monkeypatch.setattr(steps, 'chunk_order', lambda *a: [torch.zeros_like(g) for g in real(*a)])
    elif breakage == 'rng_not_restored':
        monkeypatch.setattr(steps, 'restore_rng', lambda device, state: None)
    _, _, got, model = run_step('SupCon', 6, train=True, dropout=True)
    if breakage == 'none':
        assert_grads_equal(got, want, 'chunked vs per-chunk graph')
        # BatchNorm running statistics: updated once per chunk, as by the reference's single pass
        for (name, a), (_, b) in zip(model.named_buffers(), ref_model.named_buffers()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    else:
        with pytest.raises(AssertionError):
            assert_grads_equal(got, want, breakage)


def test_bn_running_statistics_once_per_chunk():
    """After a chunked step the running statistics equal those after passing the same chunks once."""
    opt, model, _ = build('SupCon', 5, train=True)
    ref = copy.deepcopy(model)
    views, labels, ids = batch()
    with torch.no_grad():
        for chunk in steps.chunk_images(opt, views, 5):
            ref.encoder(chunk)
    run_step('SupCon', 5, train=True, model=model)
    bn = [(n, b) for n, b in model.named_buffers() if 'running' in n or 'num_batches' in n]
    assert bn
    ref_buffers = dict(ref.named_buffers())
    for name, value in bn:
        torch.testing.assert_close(value, ref_buffers[name], rtol=1e-6, atol=1e-7, msg=name)
    assert int(dict(model.named_buffers())['encoder.bn1.num_batches_tracked']) == 4   # 16 samples / 5


def test_chunk_order_round_trip():
    parts = [torch.arange(2 * n)[:, None] + 100 * k for k, n in enumerate([3, 3, 2])]
    rows = steps.batch_order(parts, 2)
    assert rows[:, 0].tolist() == [0, 1, 2, 100, 101, 102, 200, 201, 3, 4, 5, 103, 104, 105, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(steps.chunk_order(rows, [3, 3, 2], 2), parts))
