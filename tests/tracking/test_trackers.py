"""tracking/trackers.py: ``--tracker wandb`` and ``--tracker mlflow`` with the real libraries (W&B offline, MLflow in a
local SQLite store), read back as a user would (``wandb leet inspect --json``, ``MlflowClient``): a digits run's
epochs and results, a resume continuing the same tracker run, ``--tracker none``, and the one-line refusals."""
import glob
import json
import os
import sys

import pytest

from helpers import (
    FAST,
    assert_one_line_error,
    needs_trackers,
    only_run_folder,
    run_in_process,
    run_script,
    summary,
    wandb_history,
    wandb_records,
)

CE = [*FAST, '--dataset', 'digits', '--learning_rate', '0.1']


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv('WANDB_MODE', 'offline')         # never online, whoever runs the suite


@needs_trackers          # the only test here that needs the packages: the others run without them
def test_a_run_and_its_resume_are_one_run_in_each_tracker_and_read_back_as_their_records(tmp_path, offline):
    """main_ce.py for 1 epoch with ``--tracker tensorboard,wandb,mlflow``, then ``--resume`` to 2: one W&B run id
    across both offline files and one MLflow run, each holding both epochs' loss, the run's flags and results.json's
    final test accuracy, equal to the file's; TensorBoard's files are there too."""
    run_script('main_ce.py', *CE, '--epochs', 1, '--tracker', 'tensorboard,wandb,mlflow', '--save_folder', tmp_path)
    folder = only_run_folder(tmp_path)
    ids = json.load(open(os.path.join(folder, 'trackers.json')))
    run_script('main_ce.py', *CE, '--epochs', 2, '--tracker', 'tensorboard,wandb,mlflow', '--resume',
               os.path.join(folder, 'last.pth'))
    assert json.load(open(os.path.join(folder, 'trackers.json'))) == ids
    with open(os.path.join(folder, 'results.json')) as f:
        results = json.load(f)
    assert os.path.isdir(os.path.join(folder, 'tensorboard'))

    runs = wandb_records(folder)
    assert len(runs) == 2 and {run_id for run_id, _ in runs} == {ids['wandb']['id']}
    assert set(wandb_history(runs[0][1], 'train/loss')) | set(wandb_history(runs[1][1], 'train/loss')) == {1, 2}
    assert summary(runs[1][1])['final_test_acc'] == pytest.approx(results['final_test_acc'])
    run = next(r['run'] for r in runs[0][1] if r['type'] == 'run')
    assert run['config']['update']['learning_rate'] == 0.1

    import mlflow
    client = mlflow.MlflowClient(tracking_uri=ids['mlflow']['uri'])
    logged = client.get_run(ids['mlflow']['run_id'])
    assert logged.info.status == 'FINISHED' and logged.data.params['learning_rate'] == '0.1'
    assert logged.data.metrics['results/final_test_acc'] == pytest.approx(results['final_test_acc'])
    assert [m.step for m in client.get_metric_history(logged.info.run_id, 'train/loss')] == [1, 2]
    assert logged.data.tags['run_folder'] == os.path.abspath(folder)
    assert [a.path for a in client.list_artifacts(logged.info.run_id)] == ['results.json']
    experiment = client.get_experiment_by_name('supcontrast')
    assert len(client.search_runs([experiment.experiment_id])) == 1       # the resume made no second run


def test_tracker_none_keeps_metrics_csv_and_writes_no_tensorboard(tmp_path):
    run_script('main_ce.py', *CE, '--epochs', 1, '--tracker', 'none', '--save_folder', tmp_path)
    folder = only_run_folder(tmp_path)
    assert os.path.isfile(os.path.join(folder, 'metrics.csv'))
    assert not os.path.exists(os.path.join(folder, 'tensorboard'))
    assert not os.path.exists(os.path.join(folder, 'trackers.json'))


@pytest.mark.parametrize('flags,words', [
    (['--tracker', 'neptune'], ['--tracker takes', 'neptune']),
    (['--tracker', 'none,wandb'], ['give it alone']),
    (['--tracker', 'wandb,wandb'], ['twice']),
    (['--tracker_tags', 'seed'], ['key=value']),
])
def test_bad_tracker_flags_are_one_line(tmp_path, flags, words):
    proc = run_script('main_ce.py', *CE, '--epochs', 1, *flags, '--save_folder', tmp_path, check=False)
    assert_one_line_error(proc, *words)
    assert not glob.glob(str(tmp_path / '**' / 'metrics.csv'), recursive=True)


def test_a_tracker_whose_package_is_missing_is_refused_before_training(tmp_path, monkeypatch):
    """A ``wandb`` that does not import (``None`` in ``sys.modules``: its import raises ImportError, as a missing or
    broken package's does) is one line naming the package and how to install it, before anything trains."""
    monkeypatch.setitem(sys.modules, 'wandb', None)
    proc = run_in_process('main_ce.py', *CE, '--epochs', 1, '--tracker', 'wandb', '--save_folder', tmp_path / 'save')
    assert_one_line_error(proc, '--tracker wandb needs the package wandb', 'pip install')
    assert not (tmp_path / 'save').exists()
