"""tracking/trackers.py: ``--tracker wandb`` and ``--tracker mlflow`` with the real libraries (W&B offline, MLflow in a
local SQLite store), read back as a user would (``wandb leet inspect --json``, ``MlflowClient``): a digits run's
epochs and results, a resume continuing the same tracker run, ``--tracker none``, and the one-line refusals."""
import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import (
    FAST,
    ROOT,
    assert_one_line_error,
    needs_trackers,
    only_run_folder,
    own_process,
    run_in_process,
    run_script,
    script_env,
    signal_after_first_checkpoint,
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
    out = run_script('main_ce.py', *CE, '--epochs', 1, '--tracker', 'tensorboard,wandb,mlflow', '--save_folder',
                     tmp_path)
    assert 'wandb.save' not in out.stdout + out.stderr and 'Symlinked' not in out.stdout + out.stderr
    folder = only_run_folder(tmp_path)
    ids = json.load(open(os.path.join(folder, 'trackers.json')))
    import glob
    assert glob.glob(os.path.join(folder, 'wandb', '*', 'files', 'results.json'))    # results.json in W&B's files
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


def _fake_wandb_that_breaks(folder):
    """A ``wandb`` package whose import raises RuntimeError (as a broken install can), first on sys.path."""
    os.makedirs(os.path.join(folder, 'wandb'))
    with open(os.path.join(folder, 'wandb', '__init__.py'), 'w') as f:
        f.write('raise RuntimeError("protobuf version mismatch")\n')
    return str(folder)


@needs_trackers
@pytest.mark.parametrize('case', ['long_tag', 'empty_project', 'uri_under_a_file', 'uri_not_db', 'uri_scheme',
                                  'uri_nothing_listening', 'wandb_mode_typo', 'wandb_online_no_login',
                                  'wandb_import_raises', 'uri_folder_cannot_be_made', 'uri_damaged_db'])
def test_the_trackers_bad_input_is_one_line_before_any_work(tmp_path, monkeypatch, case):
    """What W&B or MLflow would refuse after the data and model are built (a traceback then) is one line while the
    options are parsed: nothing is trained, no run folder is made."""
    not_db = tmp_path / 'notes.db'
    not_db.write_text('not a database')
    damaged = tmp_path / 'cut.db'            # SQLite's header, then garbage: a copy cut short
    damaged.write_bytes(b'SQLite format 3\x00' + bytes(range(256)) * 8)
    monkeypatch.setenv('WANDB_MODE', 'offline')
    flags, words = {
        'long_tag': (['--tracker', 'wandb', '--tracker_tags', 'ablation=' + 'x' * 60], ['at most 64 characters']),
        'empty_project': (['--tracker', 'mlflow', '--tracker_project', ''], ['--tracker_project', 'give a name']),
        'uri_under_a_file': (['--tracker', 'mlflow', '--tracker_uri', f'sqlite:///{not_db}/runs/m.db'],
                             ['is a file, not a folder']),
        'uri_not_db': (['--tracker', 'mlflow', '--tracker_uri', f'sqlite:///{not_db}'], ['is not an SQLite database']),
        'uri_folder_cannot_be_made': (['--tracker', 'mlflow', '--tracker_uri',
                                       'sqlite:////proc/nonexistent/dir/mlflow.db'],
                                      ['no folder can be made in /proc']),
        'uri_damaged_db': (['--tracker', 'mlflow', '--tracker_uri', f'sqlite:///{damaged}'],
                           ['is a damaged SQLite database']),
        'uri_scheme': (['--tracker', 'mlflow', '--tracker_uri', 'mlfow://localhost/x'], ["no scheme 'mlfow'"]),
        'uri_nothing_listening': (['--tracker', 'mlflow', '--tracker_uri', 'http://127.0.0.1:9'],
                                  ['no MLflow server answers']),
        'wandb_mode_typo': (['--tracker', 'wandb'], ['WANDB_MODE=ofline is not a W&B mode']),
        'wandb_online_no_login': (['--tracker', 'wandb'], ['WANDB_MODE=online', 'wandb login']),
        'wandb_import_raises': (['--tracker', 'wandb'], ['needs the package wandb', 'RuntimeError', 'protobuf']),
    }[case]
    if case == 'wandb_mode_typo':
        monkeypatch.setenv('WANDB_MODE', 'ofline')
    if case == 'wandb_online_no_login':
        monkeypatch.setenv('WANDB_MODE', 'online')
        monkeypatch.delenv('WANDB_API_KEY', raising=False)
        monkeypatch.setenv('HOME', str(tmp_path))           # no ~/.netrc
    if case == 'wandb_import_raises':
        monkeypatch.syspath_prepend(_fake_wandb_that_breaks(tmp_path / 'site'))
        for name in [m for m in sys.modules if m == 'wandb' or m.startswith('wandb.')]:
            monkeypatch.delitem(sys.modules, name)
    proc = run_in_process('main_ce.py', *CE, '--epochs', 1, *flags, '--save_folder', tmp_path / 'save')
    assert_one_line_error(proc, *words)
    assert not (tmp_path / 'save').exists()


@needs_trackers
@pytest.mark.slow
def test_mlflow_runs_end_as_they_ended_and_say_where_they_wrote(tmp_path, offline):
    """Two runs at once on a new store under one group whose name has a quote: both run, one parent run; each run's
    last lines name its W&B folder and MLflow store. A run stopped by SIGTERM is KILLED, one whose loss diverged
    FAILED (not FINISHED), in a store whose folder is made. A damaged trackers.json is one line before its --resume
    trains. main_linear.py --shots logs its results too."""
    import mlflow
    common = [*CE, '--epochs', 1, '--tracker', 'wandb,mlflow', '--tracker_group', "bob's ablation"]
    procs = [subprocess.Popen([*own_process('main_ce.py'), *map(str, common), '--trial', t, '--save_folder',
                               str(tmp_path)], cwd=ROOT, env=script_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for t in ('a', 'b')]      # two processes at once
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out, _ in outs:
        last = out.strip().splitlines()[-2:]
        assert last[0].startswith('W&B: run ') and 'wandb sync' in last[0], last
        assert last[1].startswith('MLflow: run ') and '(FINISHED)' in last[1] and 'mlflow ui' in last[1], last
    client = mlflow.MlflowClient(tracking_uri='sqlite:///' + str(tmp_path / 'SupCE' / 'digits' / 'mlflow.db'))
    runs = client.search_runs([client.get_experiment_by_name('supcontrast').experiment_id])
    parents = [r for r in runs if r.data.tags.get('supcontrast.kind') == 'group']
    assert len(parents) == 1 and parents[0].info.run_name == "bob's ablation"
    assert {r.data.tags.get('mlflow.parentRunId') for r in runs if r not in parents} == {parents[0].info.run_id}

    uri = 'sqlite:///' + str(tmp_path / 'stores' / 'new' / 'mlflow.db')         # a folder that is made
    client = mlflow.MlflowClient(tracking_uri=uri)
    store = ['--tracker', 'mlflow', '--tracker_uri', uri]
    stopped, last, _ = signal_after_first_checkpoint('main_ce.py', [*CE, '--epochs', 50, *store, '--trial', 'stop',
                                                                    '--save_folder', tmp_path / 'stop'],
                                                     tmp_path / 'stop', signal.SIGTERM, 0)
    diverged = run_script('main_ce.py', *CE, '--epochs', 1, '--learning_rate', '1e12', *store, '--trial', 'nan',
                          '--save_folder', tmp_path / 'nan', check=False)
    assert stopped.returncode == 143 and diverged.returncode != 0 and 'the loss became' in diverged.stderr
    status = {r.info.run_name.split('_trial_')[1].split('_')[0]: r.info.status for r in client.search_runs(
        [client.get_experiment_by_name('supcontrast').experiment_id]) if '_trial_' in (r.info.run_name or '')}
    assert status == {'stop': 'KILLED', 'nan': 'FAILED'}, status

    with open(os.path.join(os.path.dirname(last), 'trackers.json'), 'w') as f:
        f.write('{"mlflow": {"uri": ')
    assert_one_line_error(run_in_process('main_ce.py', *CE, '--epochs', 50, *store, '--resume', last),
                          'trackers.json cannot be read', 'move it away')

    ckpt = next(glob.iglob(str(tmp_path / 'SupCE' / 'digits' / '*trial_a*' / 'last.pth')))
    shots = run_script('main_linear.py', '--ckpt', ckpt, '--shots', 2, '--shot_draws', 1, '--device', 'cpu',
                       '--num_workers', 0, *store, '--save_folder', tmp_path / 'lin')
    assert 'MLflow: run ' in shots.stdout.strip().splitlines()[-1]
    probe = [r for r in client.search_runs([client.get_experiment_by_name('supcontrast').experiment_id])
             if '_shots_2_' in (r.info.run_name or '')]
    assert len(probe) == 1 and 'results/shots' in probe[0].data.metrics and probe[0].info.status == 'FINISHED'


@needs_trackers
@pytest.mark.slow
def test_the_mlflow_ui_that_usage_shows_serves_the_runs_store(tmp_path):
    """USAGE's command, `mlflow ui --backend-store-uri <the store>`, starts with what requirements-trackers.txt
    installs (mlflow-skinny alone had no server: flask was missing) and serves the store: its page, and the run's
    experiment through the UI's own API."""
    import socket
    import time
    import urllib.request

    from tracking.trackers import MlflowRun
    run_folder = tmp_path / 'SupCE' / 'digits' / 'run'
    run_folder.mkdir(parents=True)
    run = MlflowRun(str(run_folder), 'run', {'learning_rate': 0.1}, {}, 'supcontrast', None, None, False)
    line = run.finish({'final_test_acc': 50.0}, None)
    uri = line.split(' in ')[1].split(';')[0]
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mlflow = os.path.join(os.path.dirname(sys.executable), 'mlflow')
    server = subprocess.Popen([mlflow, 'ui', '--backend-store-uri', uri, '--host', '127.0.0.1', '--port', str(port)],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline, page = time.time() + 180, None
        while time.time() < deadline and server.poll() is None and page is None:
            try:
                page = urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert page is not None and '<html' in page, server.stderr.read().decode()[-2000:] if server.poll() else ''
        request = urllib.request.Request(f'http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search',
                                         data=b'{"max_results": 10}', headers={'Content-Type': 'application/json'})
        names = [e['name'] for e in json.loads(urllib.request.urlopen(request, timeout=30).read())['experiments']]
        assert 'supcontrast' in names
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
