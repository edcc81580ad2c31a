"""training/steps.py and training/chunks.py: gradient caching (--chunk_size) gives the gradient of the plain step,
for every method and CARROT; power checks break the mechanism (the cached gradient dropped, the RNG not restored)
and must fail."""
import copy

import pytest
import torch

from helpers import build_training, method_modes, step_batch, take_steps
from training import chunks as caching
from training import steps

# every method of the registry (helpers.method_modes: alone, with a queue without key encoder and CARROT uncapped where
# it takes them, each choice of its flags), the cross-entropy family, and settings of a method's own flags
CASES = {**method_modes(queue=('--queue_size', '64', '--moco_m', '0'),
                        carrot=('--carrot', '--carrot_alpha_max', 'inf')),
         'RASCAL+CARROT-head': ['--method', 'RASCAL', '--carrot', '--carrot_on', 'head'],
         'CE+CARROT': ['--carrot', '--carrot_alpha_max', 'inf'],
         'CE+SupCon+CARROT': ['--supcon_weight', '0.5', '--carrot', '--carrot_alpha_max', 'inf'],
         'CE-logit_adjusted': ['--loss', 'logit_adjusted', '--la_tau', '1.5'],
         'KCL k 2': ['--method', 'KCL', '--kcl_k', '2'],
         'PaCo weights': ['--method', 'PaCo', '--paco_alpha', '0.3', '--paco_gamma', '0.5', '--paco_beta', '2'],
         'TSC k 2 weight 2': ['--method', 'TSC', '--kcl_k', '2', '--tsc_weight', '2']}


def build(case, chunk_size, train=False, dropout=False):
    return build_training(CASES[case], ce=case.startswith('CE'), chunk=chunk_size, train=train, dropout=dropout)


def run_step(case, chunk_size, train=False, dropout=False, training=None, seed=0):
    """One step (after a warm-up step for RASCAL's cache); returns (loss, stats, grads, training)."""
    training = training if training is not None else build(case, chunk_size, train, dropout)
    loss, stats, grads = take_steps(training, *step_batch(seed), seed=1)
    return loss, stats, grads, training


def assert_grads_equal(got, want, what):
    assert got.keys() == want.keys()
    for name in want:
        # float32: the chunked step sums the same terms in another order, so the two differ by a few units in the last
        # place of the largest terms (2^-23 relative), amplified by CARROT's uncapped alpha (1,210 in BCL + CARROT,
        # whose cosine classifier's gradient is large): atol is 5e-6 of the tensor's scale. The power checks below
        # (a dropped cached gradient, an RNG not restored) still fail it.
        scale = max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=5e-6 * scale, msg=f"{what}: {name}")


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
    pre = build(case, 0, train=True, dropout=dropout)
    model = pre.model
    views, labels, ids = step_batch()
    torch.manual_seed(1)
    chunks = caching.chunk_images(pre.runtime, views, chunk)
    h = caching.batch_order([model.encoder(c) for c in chunks], 2)
    loss, _, _ = pre.loss_from_parts(h, model.head(h), labels, ids, 2)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, model


@pytest.mark.parametrize('breakage', ['none', 'drop_cached_gradient', 'rng_not_restored'])
def test_train_mode_equals_the_plain_step_on_the_same_chunks(breakage, monkeypatch):
    """Train-mode BatchNorm and dropout: the chunked step equals back-propagating through per-chunk forwards.
    Power: dropping the cached gradient, or not restoring the RNG, must break the equality."""
    want, ref_model = reference_on_chunks('SupCon', 6, dropout=True)
    if breakage == 'drop_cached_gradient':
        real = caching.chunk_order
        monkeypatch.setattr(caching, 'chunk_order', lambda *a: [torch.zeros_like(g) for g in real(*a)])
    elif breakage == 'rng_not_restored':
        monkeypatch.setattr(caching, 'restore_rng', lambda device, state: None)
    _, _, got, pre = run_step('SupCon', 6, train=True, dropout=True)
    model = pre.model
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
    pre = build('SupCon', 5, train=True)
    model = pre.model
    ref = copy.deepcopy(model)
    views, labels, ids = step_batch()
    with torch.no_grad():
        for chunk in caching.chunk_images(pre.runtime, views, 5):
            ref.encoder(chunk)
    run_step('SupCon', 5, train=True, training=pre)
    bn = [(n, b) for n, b in model.named_buffers() if 'running' in n or 'num_batches' in n]
    assert bn
    ref_buffers = dict(ref.named_buffers())
    for name, value in bn:
        torch.testing.assert_close(value, ref_buffers[name], rtol=1e-6, atol=1e-7, msg=name)
    assert int(dict(model.named_buffers())['encoder.bn1.num_batches_tracked']) == 4   # 16 samples / 5


def test_chunk_order_round_trip():
    parts = [torch.arange(2 * n)[:, None] + 100 * k for k, n in enumerate([3, 3, 2])]
    rows = caching.batch_order(parts, 2)
    assert rows[:, 0].tolist() == [0, 1, 2, 100, 101, 102, 200, 201, 3, 4, 5, 103, 104, 105, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(caching.chunk_order(rows, [3, 3, 2], 2), parts))


def test_projection_normalized_in_float32_under_autocast():
    """bf16 autocast: the unit features (what the loss, the queue and RASCAL's similarities see) are float32
    normalizations of the projection, and an all-zero projection row stays finite (eps 1e-12 is 0 in float16)."""
    training = build_training(['--amp', 'bf16'])
    views, labels, ids = step_batch()
    h_enc = torch.randn(2 * len(labels), 128, dtype=torch.bfloat16)
    h_proj = torch.randn(2 * len(labels), 128, dtype=torch.bfloat16)
    h_proj[3] = 0
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss, _, features = training.loss_from_parts(h_enc, h_proj, labels, ids, 2)
    assert features.dtype == torch.float32 and bool(torch.isfinite(loss))
    want = torch.nn.functional.normalize(h_proj.float(), dim=1)
    torch.testing.assert_close(features.transpose(0, 1).reshape(-1, 128), want, rtol=0, atol=0)
    # power: normalizing in bfloat16 rounds the unit features
    assert not torch.equal(torch.nn.functional.normalize(h_proj, dim=1).float(), want)


def test_key_encoder_is_copied_before_syncbn_conversion(monkeypatch):
    """``--syncBN`` with a queue: the key encoder keeps plain BatchNorm (shuffled BatchNorm of its own keys);
    power: a conversion before the copy would give it SyncBatchNorm."""
    import torch.nn as nn
    monkeypatch.setattr(steps, 'wrap_model', lambda model, *args: nn.SyncBatchNorm.convert_sync_batchnorm(model))
    training = build_training(['--queue_size', '64'])
    kinds = {type(m) for m in training.key_encoder.modules()}
    assert nn.BatchNorm2d in kinds and nn.SyncBatchNorm not in kinds
    assert nn.SyncBatchNorm in {type(m) for m in training.model.modules()}


@pytest.mark.parametrize('ce_weight, weight', [(2.0, 0.6), (0.0, 1.0), (1.5, 0.0)])
def test_the_bcl_weights_reach_its_loss(ce_weight, weight):
    """``--bcl_ce_weight`` and ``--bcl_weight`` weigh BCL's two terms in the loss the step optimizes."""
    views, labels, ids = step_batch()
    training = build_training(['--method', 'BCL', '--bcl_ce_weight', str(ce_weight), '--bcl_weight', str(weight)])
    loss, stats, _ = take_steps(training, views, labels, ids)
    want = ce_weight * stats['bcl/ce'] + weight * stats['bcl/contrastive']
    torch.testing.assert_close(torch.as_tensor(loss, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64))
    assert stats['bcl/ce'] > 0 and stats['bcl/contrastive'] > 0


@pytest.mark.parametrize('case', sorted(CASES))
def test_three_views_train_every_method_and_chunks_equal_the_plain_step(case):
    """Every method takes V = 3 views of each sample in a step (finite loss, gradients), and
    gradient caching still gives the plain step's gradients."""
    views, labels, ids = step_batch(0)
    views = views + [views[0].flip(-1)]
    loss, _, grads = take_steps(build(case, 0), views, labels, ids, seed=1)
    loss_c, _, grads_c = take_steps(build(case, 5), views, labels, ids, seed=1)
    assert torch.isfinite(loss) and grads
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(grads_c, grads, case)


@pytest.mark.parametrize('case', sorted(c for c in CASES if not c.startswith('CE') and 'queue' not in c))
def test_multicrop_views_of_two_sizes_train_every_method(case):
    """A batch of two 16-px and two 8-px views (large first) takes one step for every
    method (finite loss, gradients); the model encodes each size on its own in one forward, in view-major order:
    with BatchNorm in eval mode its rows equal encoding each view alone."""
    views, labels, ids = step_batch(0)
    small = [torch.nn.functional.interpolate(v, size=8, mode='bilinear', align_corners=False) for v in views]
    training = build(case, 0)
    loss, _, grads = take_steps(training, views + small, labels, ids, seed=1)
    assert torch.isfinite(loss) and any(name.startswith('encoder.') for name in grads)
    batch = steps.device_batch(training.runtime, views + small)
    assert isinstance(batch, list) and [b.shape[-1] for b in batch] == [16, 8]
    with torch.no_grad():
        h, _ = training.model(batch, parts=True)
        alone = torch.cat([training.model.encoder(v) for v in views + small])
    torch.testing.assert_close(h, alone, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- kernels a step launches
# Operators one training step dispatches that would each launch a kernel on a GPU (``sync_count.OperatorCounter``),
# on ``helpers.step_batch`` (resnet_tiny, 16 samples, two views), measured at the commit that set them. A step's host
# time on a GPU grows with this count (the H100 found SupCon + CARROT host-bound, docs/results.md "On a GPU"); a
# change may lower a figure (then lower it here) but not raise it by more than a fifth.
KERNELS = {'SupCon': 207, 'SupCon + CARROT': 325, 'RASCAL': 357, 'RASCAL + queue + CARROT': 930,
           'CE': 119, 'CE + CARROT': 234}
KERNEL_MODES = {'SupCon': ([], False), 'SupCon + CARROT': (['--carrot'], False),
                'RASCAL': (['--method', 'RASCAL'], False),
                'RASCAL + queue + CARROT': (['--method', 'RASCAL', '--queue_size', '64', '--carrot'], False),
                'CE': ([], True), 'CE + CARROT': (['--carrot'], True)}
# classes of 9, 4, 2 and 1 rows: four size groups (a per-class or per-group loop would launch more kernels here)
MANY_SIZES = torch.tensor([0] * 9 + [1] * 4 + [2] * 2 + [3])


def step_kernels(argv, ce, labels=None):
    """Kernels of the third step of ``argv`` on the fixed batch (the first two fill RASCAL's cache and the queue)."""
    import sync_count
    views, batch_labels, ids = step_batch()
    labels = batch_labels if labels is None else labels
    with sync_count.accelerator_forms():
        training = build_training(argv, ce=ce, train=True)
        for _ in range(3):
            training.model.zero_grad()
            with sync_count.OperatorCounter() as counter:
                if ce:
                    training.step(views[0], labels)
                else:
                    training.step(views, labels, ids)
    return counter.kernels


@pytest.mark.parametrize('mode', list(KERNEL_MODES))
def test_a_step_launches_no_more_kernels_than_it_did(mode):
    assert step_kernels(*KERNEL_MODES[mode]) <= 1.2 * KERNELS[mode], KERNELS[mode]


def test_carrots_kernels_do_not_grow_with_the_classes():
    """CARROT's positives are one masked pass over the batch's similarities: the same kernels for 3 classes as for
    four classes of four different sizes (its former per-size-group loop launched about 20 more per group). Power:
    the counter sees CARROT's kernels (more than 50 over SupCon's step)."""
    carrot = step_kernels(['--carrot'], False)
    assert step_kernels(['--carrot'], False, MANY_SIZES) == carrot
    assert carrot - step_kernels([], False) > 50
