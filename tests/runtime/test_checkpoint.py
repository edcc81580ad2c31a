"""runtime/checkpoint.py through the scripts: corrupt, truncated and mismatched checkpoints are one-line errors;
checkpoints of the original SupContrast and of torch.compile load."""
import os
import pickle

import pytest
import torch

from helpers import FAST, assert_one_line_error, make_options, run_in_process, run_script


def test_corrupt_checkpoints(tmp_path):
    """Each says in words what the file is: not a checkpoint, empty, truncated, a pickle torch cannot read."""
    garbage = tmp_path / 'garbage.pth'
    garbage.write_bytes(b'not a checkpoint at all')
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', garbage), 'cannot read',
                          'is not a PyTorch checkpoint')
    assert_one_line_error(run_in_process('main_supcon.py', '--resume', garbage), 'cannot read',
                          'is not a PyTorch checkpoint')
    notes = tmp_path / 'notes.txt'                     # the reported case: the reason was a bare number
    notes.write_text('hello, these are my notes\n')
    proc = run_in_process('main_linear.py', '--ckpt', notes)
    assert_one_line_error(proc, 'cannot read', 'notes.txt: it is not a PyTorch checkpoint', "starts with b'hello, t'")
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', empty), 'the file is empty')
    truncated = tmp_path / 'trunc.pth'
    torch.save({'model': {'w': torch.zeros(1000)}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', truncated), 'cannot read',
                          'zip archive is incomplete')
    pickled = tmp_path / 'plain.pkl'
    pickled.write_bytes(pickle.dumps({'model': {1, 2}}, protocol=4))
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', pickled), 'cannot read', 'pickle')


@pytest.mark.slow      # the tiny_ckpt fixture trains
@pytest.mark.xdist_group('tiny')
def test_checkpoint_model_mismatch(tiny_ckpt, tmp_path):
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', tiny_ckpt, '--model', 'resnet18',
                                     '--save_folder', tmp_path), 'resnet_nano', 'resnet18')
    assert_one_line_error(run_in_process('main_supcon.py', '--resume', tiny_ckpt, '--model', 'resnet18'), 'resnet18')
    # no config to compare: the weights themselves do not fit
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    bare = tmp_path / 'bare.pth'
    torch.save({'model': ckpt['model']}, bare)
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', bare, '--model', 'resnet18',
                                     '--save_folder', tmp_path), 'does not match')


@pytest.mark.slow
@pytest.mark.xdist_group('tiny')
def test_resume_with_another_script(tiny_ckpt, tmp_path):
    assert_one_line_error(run_in_process('main_ce.py', '--resume', tiny_ckpt), 'main_supcon.py')


@pytest.mark.slow
@pytest.mark.xdist_group('tiny')
def test_original_supcontrast_and_compiled_checkpoints(tiny_ckpt, tmp_path):
    """SupContrast pickles an argparse.Namespace and wraps the encoder in DataParallel."""
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    legacy = {'opt': make_options(model='resnet_nano', batch_size=128, size=8),     # an argparse.Namespace
              'model': {k.replace('encoder.', 'encoder.module.', 1): v for k, v in ckpt['model'].items()},
              'optimizer': ckpt['optimizer'], 'epoch': 1}
    torch.save(legacy, tmp_path / 'legacy.pth')
    compiled = {'model': {'_orig_mod.' + k: v for k, v in ckpt['model'].items()}, 'epoch': 1}
    torch.save(compiled, tmp_path / 'compiled.pth')
    for name in ('legacy.pth', 'compiled.pth'):
        out = run_script('main_linear.py', '--ckpt', tmp_path / name, '--epochs', 1,
                         '--save_folder', tmp_path / name.split('.')[0], *FAST)
        assert 'final test top-1' in out.stdout


def test_checkpoints_get_the_mode_of_other_files(tmp_path):
    """last.pth was 0600 (a temporary file renamed) while other run files follow the umask."""
    from runtime.checkpoint import save_checkpoint
    old = os.umask(0o022)
    try:
        save_checkpoint(str(tmp_path / "last.pth"), {"model": {}})
        (tmp_path / 'other.txt').write_text('x')
    finally:
        os.umask(old)
    assert os.stat(tmp_path / 'last.pth').st_mode & 0o777 == os.stat(tmp_path / 'other.txt').st_mode & 0o777 == 0o644
