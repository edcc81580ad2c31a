"""main_supcon.py --method RASCAL end to end on digits: statistics, linear eval, resume with the cache."""
import os

import pytest
import torch

from helpers import FAST, load, only_run_folder, read_metrics, run_script

STATS = ['avg_pos_per_anchor', 'cache_hit_rate', 'ranked_row_rate', 'rank_drift_mean', 'rank_drift_std',
         'w_entropy']


def test_rascal_two_epochs_linear_and_resume(tmp_path):
    run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 2, '--save_folder', tmp_path / 'a', *FAST)
    run = only_run_folder(tmp_path / 'a')
    rows = read_metrics(run)
    for s in STATS:
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
