"""Exact resume, one test over the training modes: a run stopped after epoch 1 (by its --epochs, by SIGKILL as
soon as its first checkpoint exists, or by SIGINT in the middle of epoch 2) and continued with --resume reaches
the uninterrupted 2-epoch run (``conftest.SHARED_RUNS``) bit for bit: model, and every checkpointed object
(RASCAL's cache, KCL's draw count, the queue, the key encoder). Power: the first epoch alone differs from the
reference."""
import os
import shutil
import signal

import pytest
import torch
from conftest import SHARED_RUNS

from helpers import load, only_run_folder, read_metrics, run_script, signal_after_first_checkpoint

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses

MODES = {   # mode -> (shared run, how the first part stops)
    'supcon-sigkill': ('supcon', 'sigkill'),
    'supcon-sigint': ('supcon', 'sigint'),
    'rascal': ('rascal', 'epochs'),
    'chunked': ('chunked', 'epochs'),
    'queue': ('queue', 'epochs'),
    'device-augment': ('devaug', 'epochs'),
    'ce-fp16': ('ce', 'epochs'),
    'kcl': ('kcl', 'epochs'),
}


@pytest.mark.parametrize('mode', [pytest.param(m, marks=pytest.mark.xdist_group(run)) for m, (run, _) in MODES.items()])
def test_stopped_and_resumed_equals_uninterrupted(mode, shared_run, tmp_path):
    name, stop = MODES[mode]
    script, flags = SHARED_RUNS[name]
    ref_run, _ = shared_run(name)
    ref = load(os.path.join(ref_run, 'last.pth'))
    args = [*flags, '--epochs', 2]
    folder = tmp_path / 'b'
    if stop == 'epochs':
        run_script(script, *flags, '--epochs', 1, '--save_folder', folder)
        last = os.path.join(only_run_folder(folder), 'last.pth')
    elif stop == 'sigkill':      # as soon as the first checkpoint exists
        proc, last, _ = signal_after_first_checkpoint(script, [*args, '--save_folder', folder], folder,
                                                      signal.SIGKILL, delay=0)
        assert last is not None and proc.returncode == -signal.SIGKILL, 'the run finished before it was killed'
    else:                  # epoch 1 is saved: interrupt epoch 2 in the middle
        proc, last, err = signal_after_first_checkpoint(script, [*args, '--save_folder', folder], folder,
                                                        signal.SIGINT, delay=0.3)   # an epoch: 1 s alone
        assert last is not None and proc.returncode == 130, f'the run ended before the signal? {err}'
        assert err.strip().splitlines() == [f'{script}: interrupted; the last complete checkpoint is intact: '
                                            f'continue with --resume {last}']
        assert not [f for f in os.listdir(os.path.dirname(last)) if f.startswith('.tmp')]
    stopped = load(last)
    assert stopped['epoch'] == 1
    assert any(not torch.equal(stopped['model'][k], v) for k, v in ref['model'].items())     # power
    out = run_script(script, *args, '--resume', last)
    assert f'resumed from {last} at epoch 1' in out.stdout
    resumed = load(last)
    assert resumed['epoch'] == 2 and resumed['model'].keys() == ref['model'].keys()
    for key, value in ref['model'].items():
        assert torch.equal(resumed['model'][key], value), key
    assert resumed['extra'].keys() == ref['extra'].keys()
    for part, state in ref['extra'].items():
        for key, value in state.items():      # buffers, or a module's extra state (KCL's call count)
            same = torch.equal if torch.is_tensor(value) else (lambda a, b: a == b)
            assert same(resumed['extra'][part][key], value), f'{part}.{key}'
    assert resumed.get('scaler') == ref.get('scaler')          # the fp16 loss scale (ce-fp16), else absent
    assert [r['epoch'] for r in read_metrics(os.path.dirname(last))] == ['1', '2']
    if script == 'main_ce.py':      # the best epoch's metrics survive the resume
        timeless = lambda best: {k: v for k, v in best.items() if not k.endswith('time')}
        assert resumed['best'] is not None and timeless(resumed['best']) == timeless(ref['best'])


@pytest.mark.xdist_group('ce')
def test_fp16_loss_scale_survives_a_resume(shared_run, tmp_path):
    """The GradScaler's state is in the checkpoint: a run whose scale had backed off (to 1024 here, written into
    the checkpoint) continues from that scale, not from 65536; power: the uninterrupted run's scale is not 1024."""
    script, flags = SHARED_RUNS['ce']
    ref_run, _ = shared_run('ce')
    assert load(os.path.join(ref_run, 'last.pth'))['scaler']['scale'] > 1024
    flags = [*flags, '--size', 8, '--batch_size', 256]       # a cheaper run of the same kind
    folder = tmp_path / 'b'
    run_script(script, *flags, '--epochs', 1, '--save_folder', folder)
    last = os.path.join(only_run_folder(folder), 'last.pth')
    ckpt = load(last)
    ckpt['scaler']['scale'] = 1024.0
    torch.save(ckpt, last)
    run_script(script, *flags, '--epochs', 2, '--resume', last)
    assert load(last)['scaler']['scale'] <= 1024.0       # growth needs 2000 clean steps; an epoch has 6


@pytest.mark.xdist_group('devaug')
def test_resume_on_another_device_reseeds_with_a_notice(shared_run, tmp_path):
    """A checkpoint whose augmentation generator was saved on another device type (as after ``--device cuda``)
    resumes on the CPU with that generator re-seeded, a one-line notice printed and written to warnings.txt."""
    script, flags = SHARED_RUNS['devaug']
    folder = tmp_path / 'b'
    run_script(script, *flags, '--epochs', 1, '--save_folder', folder)
    last = os.path.join(only_run_folder(folder), 'last.pth')
    ckpt = load(last)
    ckpt['rng']['generators']['augment'] = torch.zeros(16, dtype=torch.uint8)    # a CUDA generator's state
    ckpt['rng']['generator_devices'] = {'augment': 'cuda'}
    torch.save(ckpt, last)
    out = run_script(script, *flags, '--epochs', 2, '--resume', last)
    notes = [line for line in out.stdout.splitlines() if line.startswith('note: ')]
    assert len(notes) == 1 and 'augment generator re-seeded' in notes[0] and 'cuda' in notes[0], out.stdout
    with open(os.path.join(os.path.dirname(last), 'warnings.txt')) as f:
        assert 'on resume: the augment generator re-seeded' in f.read()
    assert load(last)['epoch'] == 2


@pytest.mark.parametrize('script, optimizer', [('main_supcon.py', ['--optimizer', 'lars', '--lars_eta', '0.02']),
                                               ('main_ce.py', ['--optimizer', 'adamw', '--exclude_bias_norm',
                                                               '--learning_rate', '0.001', '--weight_decay', '0.05'])])
def test_optimizers_resume_exactly(script, optimizer, tmp_path):
    """LARS and AdamW (with the weight-decay exclusions, and a 2-epoch warm-up: --warm_epochs) resume bit
    for bit: the checkpoint of epoch 1 (inside the warm-up), resumed to 3 epochs, equals 3 epochs (model and
    optimizer state); the run name says the optimizer."""
    args = [*optimizer, '--warm', '--warm_epochs', 2, '--batch_size', 128, '--size', 8, '--augment', 'device',
            '--num_workers', 0, '--device', 'cpu', '--print_freq', 1000, '--epochs', 3]
    run_script(script, *args, '--save_freq', 1, '--save_folder', tmp_path / 'whole')
    folder = only_run_folder(tmp_path / 'whole')
    os.makedirs(tmp_path / 'parts')
    part = str(tmp_path / 'parts' / 'last.pth')
    shutil.copy(os.path.join(folder, 'ckpt_epoch_1.pth'), part)       # as a crash after epoch 1 would leave it
    run_script(script, *args, '--resume', part)
    assert f'_{optimizer[1]}' in folder and '_warm_epochs_2' in folder
    whole, resumed = load(os.path.join(folder, 'last.pth')), load(part)
    for key, value in whole['model'].items():
        assert torch.equal(value, resumed['model'][key]), key
    for index, state in whole['optimizer']['state'].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(resumed['optimizer']['state'][index][name]))
    assert whole['optimizer']['param_groups'][0]['lr'] == resumed['optimizer']['param_groups'][0]['lr']
