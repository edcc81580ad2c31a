"""Bad input through the real scripts: one line on stderr, non-zero exit, no traceback."""
import pytest

from helpers import assert_one_line_error, run_script

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


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
    'chunk_negative': (['main_supcon.py', '--chunk_size', -1], ['--chunk_size']),
    'queue_smaller_than_batch': (['main_supcon.py', '--queue_size', 100, '--batch_size', 128], ['--queue_size 100', '128']),
    'moco_m_one': (['main_supcon.py', '--queue_size', 1024, '--moco_m', 1], ['--moco_m']),
    'moco_m_without_queue': (['main_supcon.py', '--moco_m', 0.9], ['--moco_m needs --queue_size']),
    'queue_with_margin_triplet': (['main_supcon.py', '--queue_size', 1024, '--simclr_loss', 'margin_triplet'],
                                  ['--queue_size needs --simclr_loss ntxent']),
    'chunk_larger_than_batch': (['main_ce.py', '--chunk_size', 300, '--batch_size', 256], ['--chunk_size', '256']),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input(case, tmp_path):
    argv, words = BAD[case]
    proc = run_script(argv[0], *argv[1:], '--save_folder', tmp_path, '--data_folder', tmp_path / 'none',
                      check=False) if case == 'cifar_missing' else \
        run_script(argv[0], *argv[1:], '--save_folder', tmp_path, check=False)
    assert_one_line_error(proc, *words)


@pytest.mark.parametrize('argv, words', [
    (['main_supcon.py', '--method', 'SimCLR', '--carrot'], ['class labels']),
    (['main_supcon.py', '--carrot_on', 'head'], ['--carrot']),
    (['main_ce.py', '--carrot', '--carrot_q_lo', 0.95], ['--carrot_q_lo']),
])
def test_carrot_errors(argv, words):
    proc = run_script(*argv, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    for w in words:
        assert w in proc.stderr
