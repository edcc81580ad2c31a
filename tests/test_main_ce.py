"""main_ce.py end to end on the bundled digits (then main_linear.py on its encoder), with CARROT (--resume:
tests/test_resume.py)."""
import os

import pytest

from helpers import FAST, only_run_folder, read_metrics, run_script

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


@pytest.mark.xdist_group('ce')
def test_ce_then_linear_with_val_split(shared_run, tmp_path):
    run, out = shared_run('ce')          # 2 epochs, fp16 (its exact resume: tests/test_resume.py)
    assert 'best test top-1' in out.stdout
    assert 'test/acc' in read_metrics(run)[-1]
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--val_split', 0.2, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'best val top-1' in out.stdout
    assert 'val/acc' in read_metrics(only_run_folder(tmp_path / 'lin'))[0]


def test_ce_carrot(tmp_path):
    out = run_script('main_ce.py', '--carrot', '--carrot_weight', 0.5, '--epochs', 2, '--learning_rate', 0.05,
                     '--save_folder', tmp_path, *FAST)
    rows = read_metrics(only_run_folder(tmp_path))
    assert float(rows[-1]['train/carrot/alpha']) == pytest.approx(0.5)
    assert {'test/ece', 'test/nll', 'test/acc'} <= set(rows[-1]) and 'ECE' in out.stdout
