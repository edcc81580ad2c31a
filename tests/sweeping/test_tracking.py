"""sweeping/tracking.py: a tuned sweep's runs in W&B (offline) and MLflow (the sweep's SQLite store), with the real
libraries: every trial and cell a run grouped by the sweep and tagged, the trials' states and objectives, the sweep's
own run holding table.md, and a second call that logs nothing twice."""
import json
import os

import pytest
from test_sweep import TINY, sweep
from test_tune import SPACE, ce_only

from helpers import needs_trackers, summary, wandb_records

pytestmark = needs_trackers


def run_folders(root):
    return sorted(d for d, _, files in os.walk(root) if 'trackers.json' in files and 'run.json' in files)


@pytest.mark.slow
def test_a_tuned_sweeps_trials_and_cells_are_grouped_tagged_and_logged_once(tmp_path, monkeypatch):
    monkeypatch.setenv('WANDB_MODE', 'offline')
    path = ce_only(tmp_path / 's.yaml', base={**TINY, 'epochs': 1, 'tracker': 'wandb,mlflow'},
                   tune={'trials': 2, 'space': {'learning_rate': SPACE['learning_rate']}, 'val_split': 0.2,
                         'pruning': False})
    out = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 1)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / 'save' / 'sweeps' / 'ce'

    import mlflow
    client = mlflow.MlflowClient(tracking_uri=f'sqlite:///{folder / "mlflow.db"}')
    experiment = client.get_experiment_by_name('ce')
    runs = client.search_runs([experiment.experiment_id])
    parent = [r for r in runs if r.data.tags.get('supcontrast.kind') == 'group']
    assert len(parent) == 1 and 'table.md' in [a.path for a in client.list_artifacts(parent[0].info.run_id)]
    children = [r for r in runs if r is not parent[0] and r.info.run_id != parent[0].info.run_id]
    assert len(children) == 3 and all(r.data.tags['mlflow.parentRunId'] == parent[0].info.run_id for r in children)
    trials = sorted((r for r in children if r.data.tags['job_type'] == 'trial'), key=lambda r: r.data.tags['trial'])
    assert [r.data.tags['trial'] for r in trials] == ['0', '1']
    assert all(r.data.tags['trial_state'] == 'complete' and 'objective' in r.data.metrics for r in trials)
    study = json.loads((folder / 'tune' / 'CE' / 'study.json').read_text())
    assert [r.data.metrics['objective'] for r in trials] == pytest.approx([t['value'] for t in study['trials']])
    cell, = [r for r in children if r.data.tags['job_type'] == 'cell']
    assert (cell.data.tags['method'], cell.data.tags['seed'], cell.data.tags['stage']) == ('CE', '1', 'pretrain')

    ids = [json.loads(open(os.path.join(f, 'trackers.json')).read()) for f in run_folders(folder)]
    assert len(ids) == 3
    for run_folder in run_folders(folder):
        records = [r for _, rs in wandb_records(run_folder) for r in rs]
        run = next(r['run'] for r in records if r['type'] == 'run')
        assert run['run_group'] == 'ce' and run['project'] == 'ce' and run['job_type'] in ('trial', 'cell')
        if run['job_type'] == 'trial':
            assert summary(records)['trial_state'] == 'complete'
    sweep_runs = wandb_records(str(folder))
    assert len(sweep_runs) == 1
    files = [f['path'] for r in sweep_runs[0][1] if r['type'] == 'files' for f in r['files']['files']]
    assert 'table.md' in files

    before = json.loads((folder / 'trackers.json').read_text())
    again = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 1)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(client.search_runs([experiment.experiment_id])) == 4            # nothing logged twice
    assert json.loads((folder / 'trackers.json').read_text()) == before      # the sweep's own runs found again
