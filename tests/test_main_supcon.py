"""main_supcon.py end to end on the bundled digits: every method, the SimCLR loss family, CARROT,
linear evaluation of the result, and exact resume."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import FAST, ROOT, load, only_run_folder, read_metrics, run_script

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


def test_supcon_then_linear_on_digits(tmp_path):
    run_script('main_supcon.py', '--epochs', 2, '--save_folder', tmp_path / 'pre', *FAST)
    run = only_run_folder(tmp_path / 'pre')
    assert os.path.basename(run).startswith('SupCon_digits_resnet_tiny_lr_0.05_decay_0.0001_bsz_128_temp_0.07')
    rows = read_metrics(run)
    assert [r['epoch'] for r in rows] == ['1', '2'] and float(rows[0]['train/loss']) > 0
    assert any(f.startswith('events') for f in os.listdir(os.path.join(run, 'tensorboard')))
    ckpt = load(os.path.join(run, 'last.pth'))   # weights_only=True
    assert ckpt['epoch'] == 2 and ckpt['config']['model'] == 'resnet_tiny'

    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 2,
                     '--learning_rate', 1, '--save_folder', tmp_path / 'lin', *FAST)
    assert out.stdout.strip().splitlines()[-1].startswith('final test top-1: ')
    lin = only_run_folder(tmp_path / 'lin')
    results = json.load(open(os.path.join(lin, 'results.json')))
    assert 10 < results['final_test_acc'] <= 100
    assert {'test/acc', 'test/nll', 'train/acc', 'train/loss'} <= set(read_metrics(lin)[0])


def test_simclr_bf16_channels_last_linear_head(tmp_path):
    run_script('main_supcon.py', '--method', 'SimCLR', '--epochs', 1, '--amp', 'bf16', '--channels_last',
               '--temp', 0.5, '--head', 'linear', '--feat_dim', 32, '--save_freq', 1, '--trial', 7, '--cosine',
               '--warm', '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert 'SimCLR_digits' in run and run.endswith('trial_7_cosine_warm_bf16')
    assert os.path.exists(os.path.join(run, 'ckpt_epoch_1.pth'))
    assert load(os.path.join(run, 'last.pth'))['model']['head.weight'].shape == (32, 128)


def _weights(path):
    return load(path)['model']


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    args = ['--epochs', 3, '--seed', 3, *FAST]
    run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'a')
    ref = _weights(os.path.join(only_run_folder(tmp_path / 'a'), 'last.pth'))

    # Kill a second run with SIGKILL as soon as its first checkpoint exists, then resume it.
    cmd = [sys.executable, os.path.join(ROOT, 'main_supcon.py'), *map(str, args), '--save_folder', str(tmp_path / 'b')]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    last = None
    while time.time() < deadline and proc.poll() is None:
        found = [os.path.join(d, 'last.pth') for d, _, fs in os.walk(tmp_path / 'b') if 'last.pth' in fs]
        if found:
            last = found[0]
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert last is not None and proc.returncode == -signal.SIGKILL, 'the run finished before it could be killed'
    killed_at = load(last)['epoch']
    assert killed_at < 3
    out = run_script('main_supcon.py', *args, '--resume', last)
    assert f'resumed from {last} at epoch {killed_at}' in out.stdout
    resumed = _weights(last)
    assert resumed.keys() == ref.keys()
    for key in ref:
        assert torch.equal(resumed[key], ref[key]), key
    rows = read_metrics(os.path.dirname(last))
    assert [r['epoch'] for r in rows] == ['1', '2', '3']


RASCAL_STATS = ['avg_pos_per_anchor', 'cache_hit_rate', 'ranked_row_rate', 'rank_drift_mean', 'rank_drift_std',
         'w_entropy']


def test_rascal_two_epochs_linear_and_resume(tmp_path):
    run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 2, '--save_folder', tmp_path / 'a', *FAST)
    run = only_run_folder(tmp_path / 'a')
    rows = read_metrics(run)
    for s in RASCAL_STATS:
        assert f'train/rascal/{s}' in rows[0]
    assert float(rows[0]['train/rascal/cache_hit_rate']) == 0.0
    assert float(rows[1]['train/rascal/cache_hit_rate']) == 1.0
    assert float(rows[1]['train/rascal/ranked_row_rate']) > 0.5
    ckpt = load(os.path.join(run, 'last.pth'))
    cache = ckpt['extra']['criterion']
    assert cache['cache_feat'].shape == (1437, 128) and bool(cache['cache_valid'].all())
    events = os.listdir(os.path.join(run, 'tensorboard'))
    assert events

    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert 'final test top-1' in out.stdout

    # 1 epoch, then resume to 2: the cache comes back and the result equals the uninterrupted run
    run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 1, '--save_folder', tmp_path / 'b', *FAST)
    last = os.path.join(only_run_folder(tmp_path / 'b'), 'last.pth')
    run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 2, '--resume', last, *FAST)
    assert float(read_metrics(os.path.dirname(last))[1]['train/rascal/cache_hit_rate']) == 1.0
    resumed = load(last)
    for key, value in ckpt['model'].items():
        assert torch.equal(resumed['model'][key], value), key
    assert torch.equal(resumed['extra']['criterion']['cache_feat'], cache['cache_feat'])


@pytest.mark.parametrize('weighting', ['current', 'uniform'])
def test_ablation_weightings_run(tmp_path, weighting):
    run_script('main_supcon.py', '--method', 'RASCAL', '--rascal_weighting', weighting, '--epochs', 1,
               '--save_folder', tmp_path, *FAST)
    assert f'RASCAL-{weighting}_digits' in only_run_folder(tmp_path)


def test_rascal_errors(tmp_path):
    proc = run_script('main_supcon.py', '--rascal_weighting', 'current', check=False)
    assert proc.returncode == 2 and '--method RASCAL' in proc.stderr
    # resuming a RASCAL run on another dataset size: the cache does not fit
    run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 1, '--save_folder', tmp_path, *FAST)
    last = os.path.join(only_run_folder(tmp_path), 'last.pth')
    proc = run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 2, '--feat_dim', 64,
                      '--resume', last, *FAST, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize('method,loss,extra,name', [
    ('SimCLR', 'ntlogistic', ['--temp', '0.5'], 'SimCLR-ntlogistic_digits'),
    ('SimCLR', 'margin_triplet', [], 'SimCLR-margin_triplet_digits'),
    ('SupCon', 'margin_triplet', ['--margin', '0.5'], 'SupCon-margin_triplet_digits'),
])
def test_one_digits_epoch(tmp_path, method, loss, extra, name):
    run_script('main_supcon.py', '--method', method, '--simclr_loss', loss, *extra, '--epochs', 1,
               '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert name in run
    scale = {'ntlogistic': '_temp_0.5_', 'margin_triplet': '_margin_0.5_' if extra else '_margin_1.0_'}[loss]
    assert scale in run
    assert float(read_metrics(run)[0]['train/loss']) > 0


CARROT_STATS = ['L', 'U', 'pos_mean', 'pos_max', 'frac_pos_above_U', 'frac_pos_below_L', 'alpha', 'reg']


@pytest.mark.parametrize('method', ['SupCon', 'RASCAL'])
def test_supcon_carrot_then_linear(tmp_path, method):
    extra = ['--carrot_on', 'head', '--carrot_alpha_max', 100] if method == 'RASCAL' else []
    run_script('main_supcon.py', '--method', method, '--carrot', *extra, '--epochs', 2,
               '--save_folder', tmp_path / 'pre', *FAST)
    run = only_run_folder(tmp_path / 'pre')
    assert '_carrot' in os.path.basename(run)
    rows = read_metrics(run)
    for s in CARROT_STATS:
        assert f'train/carrot/{s}' in rows[-1], s
    assert float(rows[-1]['train/carrot/alpha']) >= 0 and 0 < float(rows[-1]['train/carrot/U']) <= 0.999
    if method == 'RASCAL':
        assert float(rows[-1]['train/carrot/alpha']) <= 100
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert 'ECE' in out.stdout and 'NLL' in out.stdout
    res = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
    assert 0 <= res['final_test_ece'] <= 1 and res['final_test_nll'] > 0


# ---------------------------------------------------------------- gradient caching end to end
CHUNKED = ['--chunk_size', 24, '--num_workers', 0, '--batch_size', 64, '--print_freq', 1000]   # 24 does not divide 64


def test_chunked_supcon_trains_resumes_exactly_and_evaluates(tmp_path):
    run_script('main_supcon.py', '--epochs', 2, '--save_folder', tmp_path / 'a', *CHUNKED)
    ref = load(os.path.join(only_run_folder(tmp_path / 'a'), 'last.pth'))['model']
    run_script('main_supcon.py', '--epochs', 1, '--save_folder', tmp_path / 'b', *CHUNKED)
    last = os.path.join(only_run_folder(tmp_path / 'b'), 'last.pth')
    run_script('main_supcon.py', '--epochs', 2, '--resume', last, *CHUNKED)
    resumed = load(last)['model']
    for key in ref:
        assert torch.equal(resumed[key], ref[key]), key
    out = run_script('main_linear.py', '--ckpt', last, '--epochs', 1, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'final test top-1' in out.stdout


@pytest.mark.parametrize('script,args', [
    ('main_supcon.py', ['--method', 'SimCLR', '--simclr_loss', 'ntlogistic', '--amp', 'bf16']),
    ('main_supcon.py', ['--method', 'RASCAL', '--carrot']),
    ('main_ce.py', ['--carrot', '--amp', 'fp16']),
])
def test_chunked_methods_train(tmp_path, script, args):
    run_script(script, *args, '--epochs', 1, '--save_folder', tmp_path, *CHUNKED)
    row = read_metrics(only_run_folder(tmp_path))[0]
    assert float(row['train/loss']) > 0 and float(row['train/collapse/z_std_enc']) > 0


# ---------------------------------------------------------------- the memory queue end to end
QUEUED = ['--queue_size', 256, '--num_workers', 0, '--batch_size', 64, '--print_freq', 1000]


def test_queue_trains_resumes_exactly_and_evaluates(tmp_path):
    args = ['--moco_m', 0.99, '--shuffle_bn_splits', 4, *QUEUED]
    run_script('main_supcon.py', '--epochs', 2, '--save_folder', tmp_path / 'a', *args)
    ref = load(os.path.join(only_run_folder(tmp_path / 'a'), 'last.pth'))
    run_script('main_supcon.py', '--epochs', 1, '--save_folder', tmp_path / 'b', *args)
    last = os.path.join(only_run_folder(tmp_path / 'b'), 'last.pth')
    run_script('main_supcon.py', '--epochs', 2, '--resume', last, *args)
    resumed = load(last)
    for part in ('model',):
        for key, value in ref[part].items():
            assert torch.equal(resumed[part][key], value), key
    for name in ('queue', 'key_encoder'):
        for key, value in ref['extra'][name].items():
            assert torch.equal(resumed['extra'][name][key], value), f'{name}.{key}'
    assert bool(resumed['extra']['queue']['valid'].all())
    row = read_metrics(os.path.dirname(last))[-1]
    assert float(row['train/queue/fill']) == 1.0 and 0 < float(row['train/queue/key_query_cos']) <= 1
    assert float(row['train/queue/pos_per_anchor']) > 10 and float(row['train/queue/key_age']) > 1
    out = run_script('main_linear.py', '--ckpt', last, '--epochs', 1, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'final test top-1' in out.stdout


@pytest.mark.parametrize('args', [['--method', 'SimCLR', '--moco_m', 0],
                                  ['--method', 'RASCAL', '--carrot', '--chunk_size', 24]])
def test_queue_with_other_methods(tmp_path, args):
    run_script('main_supcon.py', *args, '--epochs', 1, '--save_folder', tmp_path, *QUEUED)
    run = only_run_folder(tmp_path)
    assert '_queue_256_m_' in run
    row = read_metrics(run)[0]
    assert float(row['train/queue/fill']) > 0.8 and float(row['train/loss']) > 0    # the epoch mean: filling at first
    if 'SimCLR' in args:
        assert float(row['train/queue/pos_per_anchor']) == 0 and 'train/queue/key_query_cos' not in row
