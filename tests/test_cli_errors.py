"""Bad input: one line on stderr, non-zero exit, no traceback."""
import argparse
import os

import pytest
import torch

from helpers import FAST, make_image_folder, run_script


def assert_one_line_error(proc, *words):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert 'Traceback' not in proc.stderr and 'error' in lines[0]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope='module')
def tiny_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp('pre')
    run_script('main_supcon.py', '--epochs', 1, '--save_folder', root, *FAST)
    return next(os.path.join(d, 'last.pth') for d, _, fs in os.walk(root) if 'last.pth' in fs)


BAD = {
    'unknown_dataset': (['main_supcon.py', '--dataset', 'mnist'], ['--dataset']),
    'unknown_model': (['main_ce.py', '--model', 'vgg'], ['--model']),
    'batch_size_0': (['main_supcon.py', '--batch_size', 0], ['--batch_size']),
    'negative_temp': (['main_supcon.py', '--temp', -0.5], ['--temp']),
    'mean_not_numbers': (['main_supcon.py', '--mean', '__import__("os")'], ['--mean']),
    'cifar_missing': (['main_ce.py', '--dataset', 'cifar10', '--model', 'resnet_tiny'], ['--data_folder']),
    'path_missing': (['main_supcon.py', '--dataset', 'path', '--data_folder', '/nonexistent',
                      '--mean', '0.5', '--std', '0.5'], ['train']),
    'path_needs_mean': (['main_supcon.py', '--dataset', 'path', '--data_folder', '/tmp'], ['--mean']),
    'linear_no_ckpt': (['main_linear.py'], ['--ckpt']),
    'linear_missing_ckpt': (['main_linear.py', '--ckpt', '/nonexistent/last.pth'], ['not found']),
    'resume_missing': (['main_ce.py', '--resume', '/nonexistent/last.pth'], ['not found']),
    'bad_device': (['main_ce.py', '--device', 'tpu'], ['--device']),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input(case, tmp_path):
    argv, words = BAD[case]
    proc = run_script(argv[0], *argv[1:], '--save_folder', tmp_path, '--data_folder', tmp_path / 'none',
                      check=False) if case == 'cifar_missing' else \
        run_script(argv[0], *argv[1:], '--save_folder', tmp_path, check=False)
    assert_one_line_error(proc, *words)


def test_corrupt_checkpoints(tmp_path):
    garbage = tmp_path / 'garbage.pth'
    garbage.write_bytes(b'not a checkpoint at all')
    assert_one_line_error(run_script('main_linear.py', '--ckpt', garbage, check=False), 'cannot read')
    assert_one_line_error(run_script('main_supcon.py', '--resume', garbage, check=False), 'cannot read')
    truncated = tmp_path / 'trunc.pth'
    torch.save({'model': {'w': torch.zeros(1000)}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    assert_one_line_error(run_script('main_linear.py', '--ckpt', truncated, check=False), 'cannot read')


def test_checkpoint_model_mismatch(tiny_ckpt, tmp_path):
    assert_one_line_error(run_script('main_linear.py', '--ckpt', tiny_ckpt, '--model', 'resnet18',
                                     '--save_folder', tmp_path, check=False), 'resnet_tiny', 'resnet18')
    assert_one_line_error(run_script('main_supcon.py', '--resume', tiny_ckpt, '--model', 'resnet18',
                                     check=False), 'resnet18')
    # no config to compare: the weights themselves do not fit
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    bare = tmp_path / 'bare.pth'
    torch.save({'model': ckpt['model']}, bare)
    assert_one_line_error(run_script('main_linear.py', '--ckpt', bare, '--model', 'resnet18',
                                     '--save_folder', tmp_path, check=False), 'does not match')


def test_resume_with_another_script(tiny_ckpt, tmp_path):
    assert_one_line_error(run_script('main_ce.py', '--resume', tiny_ckpt, check=False), 'main_supcon.py')


def test_original_supcontrast_and_compiled_checkpoints(tiny_ckpt, tmp_path):
    """SupContrast pickles an argparse.Namespace and wraps the encoder in DataParallel."""
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    legacy = {'opt': argparse.Namespace(model='resnet_tiny', dataset='digits', batch_size=128),
              'model': {k.replace('encoder.', 'encoder.module.', 1): v for k, v in ckpt['model'].items()},
              'optimizer': ckpt['optimizer'], 'epoch': 1}
    torch.save(legacy, tmp_path / 'legacy.pth')
    compiled = {'model': {'_orig_mod.' + k: v for k, v in ckpt['model'].items()}, 'epoch': 1}
    torch.save(compiled, tmp_path / 'compiled.pth')
    for name in ('legacy.pth', 'compiled.pth'):
        out = run_script('main_linear.py', '--ckpt', tmp_path / name, '--epochs', 1,
                         '--save_folder', tmp_path / name.split('.')[0], *FAST)
        assert 'final test top-1' in out.stdout


def test_mean_std_parsing():
    from options import _floats
    assert _floats('(0.4914, 0.4822, 0.4465)') == (0.4914, 0.4822, 0.4465)
    assert _floats('0.5') == (0.5, 0.5, 0.5)
    assert _floats('[1e-1,2,3]') == (0.1, 2.0, 3.0)
    for bad in ('(0.1, 0.2)', 'os.system("x")', ''):
        with pytest.raises(argparse.ArgumentTypeError):
            _floats(bad)


def test_image_folder_with_mismatched_classes(tmp_path):
    data = make_image_folder(tmp_path / 'imgs')
    os.rename(data / 'val' / 'c', data / 'val' / 'd')
    proc = run_script('main_ce.py', '--dataset', 'path', '--data_folder', data, '--mean', '0.5', '--std', '0.5',
                      '--model', 'resnet_tiny', '--save_folder', tmp_path, *FAST, check=False)
    assert_one_line_error(proc, 'class folders')
