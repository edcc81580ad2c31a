"""The CUDA path, on a machine with a GPU (``pytest -m cuda``; skipped without CUDA, as in CI): every mode end to
end through the real scripts, exact resume and repeatability with ``--deterministic``, chunked == plain
gradients, CUDA vs CPU losses on the same inputs, checkpoints moved between CPU and CUDA, and the training step
under ``torch.cuda.set_sync_debug_mode('error')`` (a host synchronization raises)."""
import contextlib
import os

import pytest
import torch

from helpers import build_training, load, method_modes, only_run_folder, run_script, step_batch, take_steps
from sync_count import READS_BY_DESIGN

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]
GPU = ['--device', 'cuda', '--num_workers', '0', '--batch_size', '128', '--print_freq', '1000']

MODES = {
    'supcon': [], 'simclr': ['--method', 'SimCLR'], 'ntlogistic': ['--simclr_loss', 'ntlogistic'],
    'rascal': ['--method', 'RASCAL'], 'rascal-current': ['--method', 'RASCAL', '--rascal_weighting', 'current'],
    'rascal-uniform': ['--method', 'RASCAL', '--rascal_weighting', 'uniform'],
    'carrot': ['--carrot'], 'queue': ['--queue_size', '512'],
    'rascal-queue': ['--method', 'RASCAL', '--queue_size', '512'],
    'chunks': ['--chunk_size', '48'], 'bf16': ['--amp', 'bf16', '--channels_last'],
    'fp16-carrot': ['--amp', 'fp16', '--carrot'], 'devaug': ['--augment', 'device'],
    'everything': ['--method', 'RASCAL', '--carrot', '--queue_size', '512', '--chunk_size', '64', '--amp', 'bf16',
                   '--channels_last', '--augment', 'device'],
}


@pytest.mark.parametrize('mode', list(MODES))
def test_every_mode_trains_and_evaluates_on_cuda(mode, tmp_path):
    run_script('main_supcon.py', *GPU, *MODES[mode], '--epochs', 1, '--save_folder', tmp_path / 'pre')
    last = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    out = run_script('main_linear.py', *GPU, '--epochs', 1, '--ckpt', last, '--save_folder', tmp_path / 'lin')
    assert 'final test top-1' in out.stdout


@pytest.mark.parametrize('flags', [[], ['--carrot', '--amp', 'fp16'], ['--chunk_size', '48', '--augment', 'device']],
                         ids=['ce', 'ce-carrot-fp16', 'ce-chunks-devaug'])
def test_ce_on_cuda(flags, tmp_path):
    out = run_script('main_ce.py', *GPU, *flags, '--epochs', 1, '--save_folder', tmp_path)
    assert 'final test top-1' in out.stdout


@pytest.mark.parametrize('flags', [[],
                                   ['--method', 'RASCAL', '--carrot', '--queue_size', '512', '--augment', 'device']],
                         ids=['supcon', 'rascal-carrot-queue-devaug'])
def test_deterministic_resume_and_repeat_bit_for_bit_on_cuda(flags, tmp_path):
    args = [*GPU, '--deterministic', *flags]
    runs = []
    for name in ('a', 'b'):
        run_script('main_supcon.py', *args, '--epochs', 2, '--save_folder', tmp_path / name)
        runs.append(load(os.path.join(only_run_folder(tmp_path / name), 'last.pth')))
    run_script('main_supcon.py', *args, '--epochs', 1, '--save_folder', tmp_path / 'c')
    last = os.path.join(only_run_folder(tmp_path / 'c'), 'last.pth')
    run_script('main_supcon.py', *args, '--epochs', 2, '--resume', last)
    runs.append(load(last))
    for other in runs[1:]:
        for key, value in runs[0]['model'].items():
            assert torch.equal(other['model'][key], value), key


def test_checkpoints_move_between_cpu_and_cuda(tmp_path):
    """A CPU run resumed on CUDA and the reverse: every state loads (what cannot is re-seeded with a notice)."""
    cpu = [a if a != 'cuda' else 'cpu' for a in GPU]
    for first, then, name in ((cpu, GPU, 'cpu-to-cuda'), (GPU, cpu, 'cuda-to-cpu')):
        run_script('main_supcon.py', *first, '--augment', 'device', '--epochs', 1, '--save_folder', tmp_path / name)
        last = os.path.join(only_run_folder(tmp_path / name), 'last.pth')
        out = run_script('main_supcon.py', *then, '--augment', 'device', '--epochs', 2, '--resume', last)
        assert 'note: ' in out.stdout and load(last)['epoch'] == 2


@contextlib.contextmanager
def full_float32():
    """Float32 matrix products and convolutions in full precision (no TF32) for the block. cuDNN's convolutions run
    in TF32 by default on Ampere and later (``torch.backends.cudnn.allow_tf32``): a 10-bit mantissa, so two sums of the
    same products in another order (the chunked step's per-chunk backward against the plain one) differ by about
    1e-3 relative, which says nothing about the step. An exact comparison is made at float32's precision; with
    TF32 on, the H100 check of 2026-11-26 saw 6e-4 absolute, and 0 failures with ``NVIDIA_TF32_OVERRIDE=0``."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize('argv', [[], ['--method', 'RASCAL'], ['--carrot']], ids=['supcon', 'rascal', 'carrot'])
def test_chunked_equals_plain_on_cuda(argv):
    """Gradient caching is exact: the chunked step's gradients are the plain step's at float32 precision
    (:func:`full_float32`: TF32 off; ``--amp none``, since on CUDA ``--amp auto`` is bf16, whose rounding differs
    between the two orders of summation: the H100 check of 2026-11-27 saw 1.2e-4; the CPU suite holds the same
    tolerance)."""
    views, labels, ids = step_batch()
    grads = []
    with full_float32():
        for chunk in (0, 6):
            training = build_training(['--amp', 'none', '--channels_last', 'off', *argv], chunk=chunk,
                                      device='cuda')
            for _ in range(2):
                training.model.zero_grad()
                training.step(views, labels, ids)
            grads.append({n: p.grad.detach().cpu() for n, p in training.model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-5)


def test_losses_on_cuda_equal_cpu():
    """The losses on CUDA equal the CPU's at float32 precision (TF32 off: :func:`full_float32`)."""
    from losses import SupConLoss
    from losses_carrot import CARROT
    from losses_rascal import RASCALLoss
    g = torch.Generator().manual_seed(0)
    features = torch.nn.functional.normalize(torch.randn(64, 2, 32, generator=g), dim=-1)
    labels, ids = torch.randint(0, 5, (64,), generator=g), torch.arange(64)
    for make, args in ((lambda: SupConLoss(0.1), (features, labels)),
                       (lambda: RASCALLoss(64, 32, 0.1), (features, labels, ids)),
                       (lambda: CARROT(), (features.reshape(128, 32), labels.repeat(2)))):
        values = []
        for device in ('cpu', 'cuda'):
            loss = make().to(device)
            with full_float32():
                for _ in range(2):     # RASCAL: the second call ranks against the cache
                    value = loss(*[a.to(device) if a.is_floating_point() else a for a in args])
            values.append(value.cpu())
        torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)


# the published variants (docs/FIELD.md); BCL and PaCo with their own classifier (and BCL's prototypes)
# every method of the registry but ours (tested above), alone and with the queue and CARROT where it takes them
FIELD = list(method_modes(skip=('SupCon', 'SimCLR', 'RASCAL')).values())


@pytest.mark.parametrize('argv', [[], ['--method', 'RASCAL', '--carrot'], *FIELD])
def test_a_deterministic_step_repeats_bit_for_bit_on_cuda(argv):
    """With ``--deterministic`` two builds of one step give bit-equal gradients (the model's and the loss's own
    parameters): no atomic accumulation (``index_add``, ``scatter_add``) in a loss; the loss is the CPU's up to
    rounding (cuDNN's TF32 convolutions: loosely)."""
    views, labels, ids = step_batch()
    try:
        runs = [take_steps(build_training([*argv, '--deterministic'], device='cuda'), views, labels, ids)
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    on_cpu = take_steps(build_training(argv), views, labels, ids)[0]
    assert runs[0][2].keys() == runs[1][2].keys()
    for name, g in runs[0][2].items():
        assert torch.equal(runs[1][2][name], g), name
    torch.testing.assert_close(torch.as_tensor(runs[0][0]).cpu().float(), torch.as_tensor(on_cpu).float(),
                               rtol=1e-2, atol=1e-3)


SYNC_MODES = {'SupCon': [], 'SimCLR': ['--method', 'SimCLR'], 'RASCAL': ['--method', 'RASCAL'],
              'RASCAL current': ['--method', 'RASCAL', '--rascal_weighting', 'current'], 'CARROT': ['--carrot'],
              'queue': ['--queue_size', '64'], 'RASCAL + queue + CARROT': ['--method', 'RASCAL', '--queue_size', '64',
                                                                          '--carrot'],
              'bf16': ['--amp', 'bf16'], **method_modes(skip=('SupCon', 'SimCLR', 'RASCAL'))}


@pytest.mark.parametrize('mode', list(SYNC_MODES))
@pytest.mark.parametrize('chunk', [0, 6])
def test_training_step_has_no_host_synchronization(mode, chunk):
    """The same step as tests/training/test_sync.py counts on a CPU, here under CUDA's sync debug mode (``warn``,
    each wait counted where it happens: ``benchmarks/loop_syncs.CudaSyncCounter``), after two warm-up steps that
    fill RASCAL's cache and the queue's host copy: no wait, except the reads a mode makes by design, which are the
    CPU test's expectation (``sync_count.READS_BY_DESIGN``)."""
    counts = steady_state_cuda_syncs(build_training(SYNC_MODES[mode], chunk=chunk, device='cuda', train=True))
    assert sum(counts.values()) == sum(READS_BY_DESIGN.get(mode, {}).values()), counts


def steady_state_cuda_syncs(training):
    """The waits for the device (``benchmarks/loop_syncs.CudaSyncCounter``) of the third step on one fixed batch (its
    views pinned): the first two fill RASCAL's cache and the queue's host copy (and compile, under ``--compile``)."""
    from benchmarks.loop_syncs import CudaSyncCounter
    views, labels, ids = step_batch()
    views = [v.pin_memory() for v in views]
    for _ in range(2):
        training.model.zero_grad()
        training.step(views, labels, ids)
    training.model.zero_grad()
    with CudaSyncCounter() as counter:
        training.step(views, labels, ids)
    return dict(counter.counts)


@pytest.mark.parametrize('mode', ['SupCon', 'RASCAL', 'queue', 'KCL', 'Spread', 'CARROT', 'RASCAL + queue + CARROT'])
def test_the_compiled_step_has_no_host_synchronization(mode):
    """``--compile`` (inductor): the step's forward and loss as one graph and its backward, counted as the eager step
    is (:func:`test_training_step_has_no_host_synchronization`), after two steps that compile and fill the caches:
    no wait beyond the eager step's by design (RASCAL's plan is built on the host, outside the graph)."""
    counts = steady_state_cuda_syncs(build_training([*SYNC_MODES[mode], '--compile'], device='cuda', train=True))
    assert sum(counts.values()) == sum(READS_BY_DESIGN.get(mode, {}).values()), counts


@pytest.mark.parametrize('argv, ce', [([], False), (['--queue_size', '512', '--amp', 'bf16'], False),
                                      (['--method', 'SimCLR'], False), (['--method', 'RASCAL', '--queue_size', '512'],
                                                                        False), ([], True), (['--carrot'], False),
                                      (['--carrot'], True)],
                         ids=['supcon', 'supcon-queue-bf16', 'simclr', 'rascal-queue', 'ce', 'supcon-carrot',
                              'ce-carrot'])
def test_the_compiled_loss_step_trains_on_cuda(argv, ce, tmp_path):
    """``--compile`` on CUDA compiles the step's forward and loss as one graph (``Method.compiles``; labels from the
    host, RASCAL's plan built there): a run of the real script trains and evaluates, and its checkpoint loads without
    ``--compile``."""
    script = 'main_ce.py' if ce else 'main_supcon.py'
    run_script(script, *GPU, *argv, '--compile', '--epochs', 1, '--save_folder', tmp_path / 'pre')
    last = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    if not ce:
        out = run_script('main_linear.py', *GPU, '--epochs', 1, '--ckpt', last, '--save_folder', tmp_path / 'lin')
        assert 'final test top-1' in out.stdout
    assert load(last)['config']['compile'] is True
