"""Experiment trackers beside TensorBoard (``--tracker``): Weights & Biases and MLflow receive what TensorBoard and
``metrics.csv`` receive (every epoch's scalars), the run's flags as its config, its folder and commit as tags, and at
the end ``results.json``'s numbers and the file itself (docs/USAGE.md, "Experiment trackers").

- ``wandb``: offline unless ``WANDB_MODE`` says otherwise or the user has logged in (``WANDB_API_KEY``, or
  api.wandb.ai in ``~/.netrc``); its files go under the run folder (``<run>/wandb``; ``wandb sync`` uploads them).
- ``mlflow``: a local store, ``sqlite:///<the run folder's parent>/mlflow.db`` unless ``--tracker_uri`` names
  another, its artifacts beside it (``mlflow ui --backend-store-uri <uri>`` shows them).

A run's tracker ids are kept in ``<run>/trackers.json``, so ``--resume`` continues the same tracker run. Only the
process that writes the run's records logs (rank 0 under torchrun): :class:`runtime.run_log.RunLogger` opens the
trackers, ``engine.run.write_results`` finishes them with the results (or the end of the process does, for a script
without results.json).
"""
import atexit
import contextlib
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
            'mlflow': ('mlflow', 'pip install mlflow sqlalchemy alembic')}
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
    except Exception as e:       # missing (ImportError), or broken in another way: its own error, named
        reason = f'{type(e).__name__}: {(str(e).splitlines() or [""])[0][:120]}'
        return (f'--tracker {name} needs the package {module}, which does not import here ({reason}): {install} '
                '(or pip install -r requirements-trackers.txt)')
    if name == 'mlflow':
        try:
            import alembic  # noqa: F401
            import sqlalchemy  # noqa: F401
        except ImportError:
            return (f'--tracker mlflow keeps its local store in SQLite, which needs sqlalchemy and alembic: '
                    f'{install} (or pip install -r requirements-trackers.txt)')
    return None


WANDB_MODES = ('online', 'offline', 'disabled', 'shared', 'dryrun', 'run')
WANDB_TAG_LENGTH = 64       # W&B refuses a longer tag
MLFLOW_SCHEMES = ('sqlite', 'postgresql', 'mysql', 'mssql', 'http', 'https', 'file', 'databricks')


def check(tracker, tracker_tags, tracker_project, tracker_uri, resume):
    """Everything the trackers would refuse, found while the options are parsed (before data, model or run folder):
    packages, tags, the project, W&B's mode and login, MLflow's URI and a resumed run's ``trackers.json``."""
    names = parse_trackers(tracker)
    for name in names:
        why = missing_package(name)
        if why:
            raise UserError(why)
    tags = parse_tags(tracker_tags)
    if not names:
        return
    if not str(tracker_project).strip():
        raise UserError('--tracker_project names the W&B project and the MLflow experiment: give a name, not an empty '
                        'one')
    if 'wandb' in names:
        long = [f'{k}={v}' for k, v in tags.items() if k != 'job_type' and len(f'{k}={v}') > WANDB_TAG_LENGTH]
        if long:
            raise UserError(f'--tracker_tags: W&B takes tags of at most {WANDB_TAG_LENGTH} characters, and '
                            f'{long[0][:40]}... has {len(long[0])}')
        mode = os.environ.get('WANDB_MODE')
        if mode is not None and mode not in WANDB_MODES:
            raise UserError(f'WANDB_MODE={mode} is not a W&B mode: {", ".join(WANDB_MODES[:4])} (--tracker wandb)')
        if mode == 'online' and not wandb_logged_in():
            raise UserError('WANDB_MODE=online, but W&B has no login here: run wandb login (or set WANDB_API_KEY), '
                            'or leave WANDB_MODE unset to log offline')
    if 'mlflow' in names and tracker_uri is not None:
        check_mlflow_uri(tracker_uri)
    if resume:
        path = os.path.join(os.path.dirname(os.path.abspath(resume)), IDS_FILE)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    ids = json.load(f)
                if not isinstance(ids, dict):
                    raise ValueError('not a mapping')
            except (OSError, ValueError) as e:
                raise UserError(f'{path} cannot be read ({type(e).__name__}): it holds the ids that --resume '
                                f'continues the tracker runs with; restore it, or move it away to start new tracker '
                                f'runs') from None


def _check_can_make_folder_in(folder, uri):
    """The store's missing folders start in ``folder``: one is made and removed there (nothing is left), else a
    :class:`UserError` (a folder such as /proc, or one without write permission)."""
    import tempfile
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder))
    except OSError as e:
        raise UserError(f'--tracker_uri {uri}: no folder can be made in {folder} ({e.strerror or e}); name a database '
                        f'in a folder you can write') from None


def _check_sqlite_reads(path, uri):
    """An existing SQLite file whose schema can be read; a damaged one (a copy cut short) is a :class:`UserError`."""
    import sqlite3
    try:
        with contextlib.closing(sqlite3.connect(f'file:{path}?mode=ro', uri=True)) as db:
            db.execute('SELECT count(*) FROM sqlite_master').fetchall()
    except sqlite3.DatabaseError as e:
        raise UserError(f'--tracker_uri {uri}: {path} is a damaged SQLite database ({e}); restore it from a copy, or '
                        f'name a new file') from None


def check_mlflow_uri(uri):
    """``--tracker_uri``: a scheme MLflow knows; a SQLite file that is a database when it exists, in a folder (or
    where one can be made); a file store's folder; a server that answers (5 s). Else a :class:`UserError`."""
    scheme, sep, rest = uri.partition('://')
    if not sep:
        if not os.path.isdir(uri):
            raise UserError(f'--tracker_uri {uri}: no such folder (give sqlite:///path/to/mlflow.db, a folder, '
                            f'http://host:port or another MLflow URI)')
        return
    if scheme.split('+')[0] not in MLFLOW_SCHEMES:
        raise UserError(f'--tracker_uri {uri}: MLflow knows no scheme {scheme!r} (sqlite:///path/to/mlflow.db, '
                        f'http://host:port, file:///folder, postgresql://...)')
    if scheme == 'sqlite':                   # (a missing folder is made when the run opens the store)
        path = rest[1:] if rest.startswith('/') else rest
        above = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(above):
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            raise UserError(f'--tracker_uri {uri}: {above} is a file, not a folder that could hold the database')
        if above != os.path.dirname(os.path.abspath(path)):
            _check_can_make_folder_in(above, uri)
        if os.path.isdir(path):
            raise UserError(f'--tracker_uri {uri}: {path} is a folder; name the database file in it (.../mlflow.db)')
        if os.path.isfile(path) and os.path.getsize(path):
            with open(path, 'rb') as f:
                if f.read(16) != b'SQLite format 3\x00':
                    raise UserError(f'--tracker_uri {uri}: {path} is not an SQLite database; name a new file or an '
                                    f'MLflow store')
            _check_sqlite_reads(path, uri)
    elif scheme == 'file' and not os.path.isdir(rest):
        raise UserError(f'--tracker_uri {uri}: no such folder {rest}')
    elif scheme in ('http', 'https'):
        import socket
        import urllib.parse
        url = urllib.parse.urlsplit(uri)
        try:
            socket.create_connection((url.hostname, url.port or (443 if scheme == 'https' else 80)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise UserError(f'--tracker_uri {uri}: no MLflow server answers there ({type(e).__name__}); start one '
                            f'(mlflow server --port ...) or give another URI') from None


TRACKER = Feature(
    'experiment trackers', scripts=('supcon', 'ce', 'linear'),
    where_it_ran=('tracker', 'tracker_project', 'tracker_uri', 'tracker_group', 'tracker_tags'),
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


def wandb_open(folder, entry, **init):
    """The W&B run ``entry`` (its id and project) in ``folder``, made or reopened, silent, in :func:`wandb_mode`;
    ``init``: more of ``wandb.init``'s keywords (name, config, group, job_type, tags)."""
    import wandb
    return wandb.init(project=entry['project'], dir=folder, id=entry['id'], resume='allow', mode=wandb_mode(),
                      settings=wandb.Settings(silent=True), **init)


def wandb_add(folder, entry, summary=None, files=(), **init):
    """Reopen (or make) the W&B run ``entry`` in ``folder`` and add ``summary`` and ``files``: the sweep's trial
    marks and its own run (``sweeping/tracking.py``); ``init``: as :func:`wandb_open`'s."""
    run = wandb_open(folder, entry, **init)
    if summary:
        run.summary.update(summary)
    for path in files:
        wandb_attach(run, path)
    run.finish()


def wandb_attach(run, path):
    """``path`` into the W&B run's files: copied into its files folder, then saved from there (``run.save`` of a file
    outside that folder symlinks it and prints a warning that asks the user to call it again)."""
    import shutil
    copy = os.path.join(run.dir, os.path.basename(path))
    shutil.copyfile(path, copy)
    run.save(copy, base_path=run.dir, policy='now')


class WandbRun:
    """One W&B run for a run folder: the same id across ``--resume`` (``<run>/trackers.json``)."""

    def __init__(self, folder, name, config, tags, project, group, resumed):
        entry = load_ids(folder).get('wandb') if resumed else None
        entry = entry or {'id': uuid.uuid4().hex[:16], 'project': project}
        self.run = wandb_open(folder, entry, name=name, config=config, group=group, job_type=tags.get('job_type'),
                              tags=[f'{k}={v}' for k, v in tags.items() if k != 'job_type'])
        self.mode = wandb_mode()
        save_ids(folder, {**load_ids(folder), 'wandb': entry})

    def log(self, step, scalars):
        self.run.log(numbers(scalars), step=step)

    def finish(self, results, results_path, status='FINISHED'):
        if results:
            self.run.summary.update(numbers(results))
        if results_path and os.path.isfile(results_path):
            wandb_attach(self.run, results_path)
        self.run.finish(exit_code=0 if status == 'FINISHED' else 1)
        where = self.run.dir if self.mode == 'online' else os.path.dirname(self.run.dir)
        return (f'W&B: run {self.run.id} ({self.mode}) in {where}'
                + (f'; wandb sync {where} uploads it' if self.mode == 'offline' else ''))


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
    """The id of the parent run named ``group`` in the experiment (made once: the sweep's own run; called under
    :func:`store_lock`). Matched by name here, not in a filter string, so any name works (quotes included)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
    found = [r for r in client.search_runs([experiment_id], filter_string="tags.`supcontrast.kind` = 'group'",
                                           max_results=50000, order_by=['attributes.start_time ASC'])
             if r.data.tags.get(MLFLOW_RUN_NAME) == group]
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=group, tags={'supcontrast.kind': 'group'})
    return run.info.run_id


@contextlib.contextmanager
def store_lock(folder, uri):
    """An exclusive lock while a run sets itself up in an MLflow store: two runs starting at once on a new SQLite
    store would both create its tables, and two runs of a new group would both make its parent run. The lock is a
    file beside the SQLite database, else in the run folder's parent (the runs of one sweep)."""
    import fcntl
    path = (uri[len('sqlite:///'):] if uri.startswith('sqlite:///') else
            os.path.join(os.path.dirname(os.path.abspath(folder)), 'mlflow')) + '.lock'
    with open(path, 'a') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class MlflowRun:
    """One MLflow run for a run folder, in a local store; the same run across ``--resume``."""

    def __init__(self, folder, name, config, tags, project, group, uri, resumed):
        uri = self.uri = mlflow_uri(folder, uri)
        if uri.startswith(('http:', 'https:')):      # a server that stops answering: a few tries, not minutes of them
            os.environ.setdefault('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '2')
            os.environ.setdefault('MLFLOW_HTTP_REQUEST_TIMEOUT', '20')
        if uri.startswith('sqlite:///'):
            os.makedirs(os.path.dirname(os.path.abspath(uri[len('sqlite:///'):])), exist_ok=True)
        ids = load_ids(folder).get('mlflow') or {}
        again = resumed and ids.get('run_id') and ids.get('uri') == uri
        with store_lock(folder, uri):         # the store's tables, the experiment, the group's parent: made once
            self.client = client = mlflow_client(uri)
            if again:
                self.run_id = ids['run_id']
                client.update_run(self.run_id, status='RUNNING')
            else:
                all_tags = {**tags, 'run_folder': os.path.abspath(folder), 'commit': git_commit()}
                experiment_id = mlflow_experiment(client, uri, project)
                if group:
                    all_tags['mlflow.parentRunId'] = mlflow_parent(client, experiment_id, group)
                self.run_id = client.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id
        if not again:
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

    def finish(self, results, results_path, status='FINISHED'):
        if results:
            self.log(0, {f'results/{k}': v for k, v in numbers(results).items()})
        if results_path and os.path.isfile(results_path):
            self.client.log_artifact(self.run_id, results_path)
        self.client.set_terminated(self.run_id, status=status)
        return f'MLflow: run {self.run_id} ({status}) in {self.uri}; mlflow ui --backend-store-uri {self.uri} shows it'


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


def open_for_run(run_folder, config, resumed, tracker, tracker_project, tracker_uri, tracker_group, tracker_tags):
    """The W&B and MLflow runs of the run in ``run_folder`` (``--tracker``; TensorBoard is the run logger's own), with
    its flags (``config``); rank 0 only. The scripts call it through ``call_hook`` with the run's options."""
    return start([n for n in parse_trackers(tracker) if n != 'tensorboard'], run_folder,
                 os.path.basename(os.path.normpath(run_folder)), config, resumed, project=tracker_project,
                 uri=tracker_uri, group=tracker_group, tags=parse_tags(tracker_tags))


def finish(results=None, results_path=None, status='FINISHED'):
    """Finish this process's open trackers: ``results`` (results.json's contents) as the run's final numbers (W&B's
    summary; MLflow metrics ``results/<key>``) and the file itself, with the run's ``status`` (``FINISHED``, or
    ``FAILED`` / ``KILLED`` for a run that stopped on an error or a signal: ``config.cli.run_cli``); each says where
    it wrote, on the run's last lines."""
    while _OPEN:
        print(_OPEN.pop(0).finish(results, results_path, status), flush=True)

