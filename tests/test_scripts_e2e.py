"""The real scripts, end to end, on the bundled digits and on generated CIFAR / ImageFolder data."""
import json
import os
import signal
import subprocess
import sys
import time

import torch

from helpers import FAST, ROOT, load, make_fake_cifar, make_image_folder, only_run_folder, read_metrics, run_script


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
    assert {'test/acc', 'test/loss', 'train/acc', 'train/loss'} <= set(read_metrics(lin)[0])


def test_simclr_bf16_channels_last_linear_head(tmp_path):
    run_script('main_supcon.py', '--method', 'SimCLR', '--epochs', 1, '--amp', 'bf16', '--channels_last',
               '--temp', 0.5, '--head', 'linear', '--feat_dim', 32, '--save_freq', 1, '--trial', 7, '--cosine',
               '--warm', '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert 'SimCLR_digits' in run and run.endswith('trial_7_cosine_warm_bf16')
    assert os.path.exists(os.path.join(run, 'ckpt_epoch_1.pth'))
    assert load(os.path.join(run, 'last.pth'))['model']['head.weight'].shape == (32, 128)


def test_ce_then_linear_with_val_split(tmp_path):
    out = run_script('main_ce.py', '--epochs', 2, '--save_folder', tmp_path / 'ce', *FAST)
    assert 'best test top-1' in out.stdout
    run = only_run_folder(tmp_path / 'ce')
    assert 'test/acc' in read_metrics(run)[-1]
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--val_split', 0.2, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'best val top-1' in out.stdout
    assert 'val/acc' in read_metrics(only_run_folder(tmp_path / 'lin'))[0]


def test_fake_cifar10_and_cifar100(tmp_path):
    data = make_fake_cifar(tmp_path / 'data')
    run_script('main_ce.py', '--dataset', 'cifar10', '--data_folder', data, '--model', 'resnet_tiny',
               '--epochs', 1, '--save_folder', tmp_path / 'c10', *FAST)
    make_fake_cifar(tmp_path / 'data', hundred=True, n_classes=100, n_train=200, n_test=100)
    run_script('main_supcon.py', '--dataset', 'cifar100', '--data_folder', data, '--model', 'resnet_tiny',
               '--epochs', 1, '--save_folder', tmp_path / 'c100', *FAST)


def test_image_folder_all_three_scripts(tmp_path):
    data = make_image_folder(tmp_path / 'imgs')
    common = ['--dataset', 'path', '--data_folder', data, '--mean', '(0.5, 0.5, 0.5)', '--std', '0.25',
              '--size', 12, '--model', 'resnet_tiny', '--epochs', 1, *FAST]
    run_script('main_supcon.py', *common, '--save_folder', tmp_path / 'pre')
    run_script('main_ce.py', *common, '--save_folder', tmp_path / 'ce')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    run_script('main_linear.py', *common, '--ckpt', ckpt, '--save_folder', tmp_path / 'lin')


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


def test_resume_ce_keeps_best(tmp_path):
    run_script('main_ce.py', '--epochs', 1, '--amp', 'fp16', '--save_folder', tmp_path, *FAST)
    last = os.path.join(only_run_folder(tmp_path), 'last.pth')
    out = run_script('main_ce.py', '--epochs', 2, '--amp', 'fp16', '--resume', last, *FAST)
    assert 'resumed from' in out.stdout and load(last)['epoch'] == 2 and load(last)['best'] is not None
