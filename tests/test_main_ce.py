"""main_ce.py end to end on the bundled digits (then main_linear.py on its encoder), with CARROT, with --resume."""
import os

import pytest

from helpers import FAST, load, only_run_folder, read_metrics, run_script

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


def test_ce_then_linear_with_val_split(tmp_path):
    out = run_script('main_ce.py', '--epochs', 2, '--save_folder', tmp_path / 'ce', *FAST)
    assert 'best test top-1' in out.stdout
    run = only_run_folder(tmp_path / 'ce')
    assert 'test/acc' in read_metrics(run)[-1]
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--val_split', 0.2, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'best val top-1' in out.stdout
    assert 'val/acc' in read_metrics(only_run_folder(tmp_path / 'lin'))[0]


def test_resume_ce_keeps_best(tmp_path):
    run_script('main_ce.py', '--epochs', 1, '--amp', 'fp16', '--save_folder', tmp_path, *FAST)
    last = os.path.join(only_run_folder(tmp_path), 'last.pth')
    out = run_script('main_ce.py', '--epochs', 2, '--amp', 'fp16', '--resume', last, *FAST)
    assert 'resumed from' in out.stdout and load(last)['epoch'] == 2 and load(last)['best'] is not None


def test_ce_carrot(tmp_path):
    out = run_script('main_ce.py', '--carrot', '--carrot_weight', 0.5, '--epochs', 2, '--learning_rate', 0.05,
                     '--save_folder', tmp_path, *FAST)
    rows = read_metrics(only_run_folder(tmp_path))
    assert float(rows[-1]['train/carrot/alpha']) == pytest.approx(0.5)
    assert {'test/ece', 'test/nll', 'test/acc'} <= set(rows[-1]) and 'ECE' in out.stdout
