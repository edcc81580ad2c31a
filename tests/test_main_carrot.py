"""--carrot end to end on digits: statistics logged, linear evaluation with accuracy, ECE and NLL."""
import json
import os

import pytest

from helpers import FAST, only_run_folder, read_metrics, run_script

STATS = ['L', 'U', 'pos_mean', 'pos_max', 'frac_pos_above_U', 'frac_pos_below_L', 'alpha', 'reg']


@pytest.mark.parametrize('method', ['SupCon', 'RASCAL'])
def test_supcon_carrot_then_linear(tmp_path, method):
    extra = ['--carrot_on', 'head', '--carrot_alpha_max', 100] if method == 'RASCAL' else []
    run_script('main_supcon.py', '--method', method, '--carrot', *extra, '--epochs', 2,
               '--save_folder', tmp_path / 'pre', *FAST)
    run = only_run_folder(tmp_path / 'pre')
    assert '_carrot' in os.path.basename(run)
    rows = read_metrics(run)
    for s in STATS:
        assert f'train/carrot/{s}' in rows[-1], s
    assert float(rows[-1]['train/carrot/alpha']) >= 0 and 0 < float(rows[-1]['train/carrot/U']) <= 0.999
    if method == 'RASCAL':
        assert float(rows[-1]['train/carrot/alpha']) <= 100
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert 'ECE' in out.stdout and 'NLL' in out.stdout
    res = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
    assert 0 <= res['final_test_ece'] <= 1 and res['final_test_nll'] > 0


def test_ce_carrot(tmp_path):
    out = run_script('main_ce.py', '--carrot', '--carrot_weight', 0.5, '--epochs', 2, '--learning_rate', 0.05,
                     '--save_folder', tmp_path, *FAST)
    rows = read_metrics(only_run_folder(tmp_path))
    assert float(rows[-1]['train/carrot/alpha']) == pytest.approx(0.5)
    assert {'test/ece', 'test/nll', 'test/acc'} <= set(rows[-1]) and 'ECE' in out.stdout


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
