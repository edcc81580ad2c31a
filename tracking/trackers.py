"""Experiment trackers beside TensorBoard (``--tracker``): Weights & Biases and MLflow receive what TensorBoard and
``metrics.csv`` receive (every epoch's scalars), the run's flags as its config, its folder and commit as tags, and at
the end ``results.json``'s numbers and the file itself (docs/USAGE.md, "Experiment trackers").

- ``wandb``: offline unless ``WANDB_MODE`` says otherwise or the user has logged in (``WANDB_API_KEY``, or
  api.wandb.ai in ``~/.netrc``); its files go under the run folder (``<run>/wandb``; ``wandb sync`` uploads them).
- ``mlflow``: a local store, ``sqlite:///<the run folder's parent>/mlflow.db`` unless ``--tracker_uri`` names
  another, its artifacts beside it (``mlflow ui --backend-store-uri <uri>`` shows them).

A run's tracker ids are kept in ``<run>/trackers.json``, so ``--resume`` continues the same tracker run. Only the
process that writes the run's records logs (rank 0 under torchrun): :class:`training.run_log.RunLogger` opens the
trackers, ``engine.run.write_results`` finishes them with the results (or the end of the process does, for a script
without results.json).
"""
import atexit
import json
import math
import netrc
import os
import subprocess
import uuid

from core.flags import Feature, UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHOICES = ('none', 'tensorboard', 'wandb', 'mlflow')
# tracker -> (the module it imports, what to install)
PACKAGES = {'wandb': ('wandb', 'pip install wandb'),
            'mlflow': ('mlflow', 'pip install mlflow-skinny sqlalchemy alembic')}
IDS_FILE = 'trackers.json'


def parse_trackers(text):
    """``'tensorboard,wandb'`` -> ``['tensorboard', 'wandb']`` (``none`` -> ``[]``); :class:`UserError` for a name
    that is no tracker, ``none`` beside another, or a repeat."""
    names = [t.strip() for t in str(text).split(',') if t.strip()]
    bad = [n for n in names if n not in CHOICES]
    if bad or not names:
        raise UserError(f'--tracker takes {", ".join(CHOICES)} or a comma-separated list of them, got {text!r}')
    if 'none' in names and len(names) > 1:
        raise UserError(f'--tracker none means no tracker at all: give it alone, got {text!r}')
    if len(set(names)) != len(names):
        raise UserError(f'--tracker names a tracker twice: {text!r}')
    return [n for n in names if n != 'none']


def parse_tags(text):
    """``'method=SupCon,seed=0'`` -> ``{'method': 'SupCon', 'seed': '0'}``; :class:`UserError` otherwise."""
    tags = {}
    for part in (p for p in str(text or '').split(',') if p.strip()):
        key, eq, value = part.partition('=')
        if not eq or not key.strip():
            raise UserError(f'--tracker_tags takes key=value pairs separated by commas, got {part!r}')
        tags[key.strip()] = value.strip()
    return tags


def missing_package(name):
    """The one-line reason ``--tracker name`` cannot run here, or ``None``."""
    if name not in PACKAGES:
        return None
    module, install = PACKAGES[name]
    try:
        __import__(module)
    except ImportError as e:
        return (f'--tracker {name} needs the package {module}, which does not import here ({e}): {install} '
                '(or pip install -r requirements-trackers.txt)')
    if name == 'mlflow':
        try:
            import alembic  # noqa: F401
            import sqlalchemy  # noqa: F401
        except ImportError:
            return (f'--tracker mlflow keeps its local store in SQLite, which needs sqlalchemy and alembic: '
                    f'{install} (or pip install -r requirements-trackers.txt)')
    return None


def check(tracker, tracker_tags):
    for name in parse_trackers(tracker):
        why = missing_package(name)
        if why:
            raise UserError(why)
    parse_tags(tracker_tags)


TRACKER = Feature(
    'experiment trackers', scripts=('supcon', 'ce', 'linear'),
    resume_may_change=('tracker', 'tracker_project', 'tracker_uri', 'tracker_group', 'tracker_tags'),
    flags={'--tracker': dict(default='tensorboard',
                             help='where the run is logged besides metrics.csv: tensorboard, wandb (offline unless '
                                  'logged in or WANDB_MODE says otherwise), mlflow (a local SQLite store), none, or '
                                  'a list (tensorboard,wandb)'),
           '--tracker_project': dict(default='supcontrast',
                                     help='the W&B project and the MLflow experiment'),
           '--tracker_uri': dict(default=None,
                                 help='the MLflow tracking URI (default: sqlite:///<the run folder\'s '
                                      'parent>/mlflow.db)'),
           '--tracker_group': dict(default=None,
                                   help='a group of runs: W&B\'s group, a parent run of that name in MLflow'),
           '--tracker_tags': dict(default=None,
                                  help='key=value,... tags of the run (in W&B as key=value tags; job_type=X '
                                       'sets W&B\'s job type)')},
    check=check)


def git_commit():
    try:
        out = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or 'unknown'
    except (OSError, subprocess.TimeoutExpired):
        return 'unknown'


def numbers(values):
    """The finite numbers of a flat dict (what a tracker takes as metrics)."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def load_ids(folder):
    """``<folder>/trackers.json``: the tracker ids of a run (or a sweep), ``{}`` without it."""
    try:
        with open(os.path.join(folder, IDS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_ids(folder, ids):
    """Write ``<folder>/trackers.json`` through a temporary file and a rename."""
    path = os.path.join(folder, IDS_FILE)
    with open(path + '.tmp', 'w') as f:
        json.dump(ids, f, indent=2)
    os.replace(path + '.tmp', path)


def wandb_logged_in():
    if os.environ.get('WANDB_API_KEY'):
        return True
    try:
        return netrc.netrc().authenticators('api.wandb.ai') is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode():
    """``WANDB_MODE`` when set, else online for a user logged in, offline otherwise."""
    return os.environ.get('WANDB_MODE') or ('online' if wandb_logged_in() else 'offline')


class WandbRun:
    """One W&B run for a run folder: the same id across ``--resume`` (``<run>/trackers.json``)."""

    def __init__(self, folder, name, config, tags, project, group, resumed):
        import wandb
        entry = load_ids(folder).get('wandb') if resumed else None
        entry = entry or {'id': uuid.uuid4().hex[:16], 'project': project}
        self.run = wandb.init(project=entry['project'], dir=folder, id=entry['id'], resume='allow', name=name,
                              config=config, group=group, job_type=tags.get('job_type'), mode=wandb_mode(),
                              tags=[f'{k}={v}' for k, v in tags.items() if k != 'job_type'],
                              settings=wandb.Settings(silent=True))
        save_ids(folder, {**load_ids(folder), 'wandb': entry})

    def log(self, step, scalars):
        self.run.log(numbers(scalars), step=step)

    def finish(self, results, results_path):
        if results:
            self.run.summary.update(numbers(results))
        if results_path and os.path.isfile(results_path):
            self.run.save(results_path, base_path=os.path.dirname(results_path), policy='now')
        self.run.finish()


def mlflow_uri(folder, uri):
    """``--tracker_uri``, else ``sqlite:///<the run folder's parent>/mlflow.db``."""
    return uri or 'sqlite:///' + os.path.join(os.path.dirname(os.path.abspath(folder)), 'mlflow.db')


def mlflow_client(uri):
    """An ``MlflowClient`` for ``uri`` (MLflow's notes on creating its tables kept out of the run's output)."""
    import logging

    from mlflow.tracking import MlflowClient
    for name in ('mlflow', 'alembic'):
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def mlflow_experiment(client, uri, project):
    experiment = client.get_experiment_by_name(project)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith('sqlite:///'):
        location = 'file://' + os.path.join(os.path.dirname(uri[len('sqlite:///'):]), 'mlflow-artifacts')
    try:
        return client.create_experiment(project, artifact_location=location)
    except Exception:                               # another process created it first
        experiment = client.get_experiment_by_name(project)
        if experiment is None:
            raise
        return experiment.experiment_id


def mlflow_parent(client, experiment_id, group):
    """The id of the parent run named ``group`` in the experiment (made once: the sweep's own run)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
    found = client.search_runs([experiment_id], filter_string=f"tags.`{MLFLOW_RUN_NAME}` = '{group}' and "
                                                              "tags.`supcontrast.kind` = 'group'", max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=group, tags={'supcontrast.kind': 'group'})
    return run.info.run_id


class MlflowRun:
    """One MLflow run for a run folder, in a local store; the same run across ``--resume``."""

    def __init__(self, folder, name, config, tags, project, group, uri, resumed):
        uri = mlflow_uri(folder, uri)
        self.client = client = mlflow_client(uri)
        ids = load_ids(folder).get('mlflow') or {}
        if resumed and ids.get('run_id') and ids.get('uri') == uri:
            self.run_id = ids['run_id']
            client.update_run(self.run_id, status='RUNNING')
        else:
            experiment_id = mlflow_experiment(client, uri, project)
            all_tags = {**tags, 'run_folder': os.path.abspath(folder), 'commit': git_commit()}
            if group:
                all_tags['mlflow.parentRunId'] = mlflow_parent(client, experiment_id, group)
            self.run_id = client.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id
            from mlflow.entities import Param
            params = [Param(k, _short(v)) for k, v in sorted(config.items())]
            for i in range(0, len(params), 100):
                client.log_batch(self.run_id, params=params[i:i + 100])
            save_ids(folder, {**load_ids(folder), 'mlflow': {'uri': uri, 'run_id': self.run_id}})

    def log(self, step, scalars):
        import time

        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in numbers(scalars).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def finish(self, results, results_path):
        if results:
            self.log(0, {f'results/{k}': v for k, v in numbers(results).items()})
        if results_path and os.path.isfile(results_path):
            self.client.log_artifact(self.run_id, results_path)
        self.client.set_terminated(self.run_id, status='FINISHED')


def _short(value):
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 6000 else text[:5990] + '...'


_OPEN = []          # the trackers of this process's run, until its results (or the process's end) finish them


def start(trackers, folder, name, config, resumed, project='supcontrast', uri=None, group=None, tags=None):
    """Open each of ``trackers`` (``wandb``, ``mlflow``; ``tensorboard`` is the run logger's own) for the run in
    ``folder``; returns them (each with ``log(step, scalars)``)."""
    tags = dict(tags or {})
    out = []
    for t in trackers:
        if t == 'wandb':
            out.append(WandbRun(folder, name, config, tags, project, group, resumed))
        elif t == 'mlflow':
            out.append(MlflowRun(folder, name, config, tags, project, group, uri, resumed))
    _OPEN[:] = out
    atexit.unregister(finish)       # registered after the trackers' own exit hooks, so it runs before them
    atexit.register(finish)
    return out


def finish(results=None, results_path=None):
    """Finish this process's open trackers: ``results`` (results.json's contents) as the run's final numbers (W&B's
    summary; MLflow metrics ``results/<key>``) and the file itself."""
    while _OPEN:
        _OPEN.pop(0).finish(results, results_path)

