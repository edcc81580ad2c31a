"""A sweep's runs in the experiment trackers (docs/USAGE.md, "Experiment trackers"): where a run of the sweep logs to
W&B or MLflow (``--tracker`` in ``base:`` or a method's entry), every cell's and trial's stage is one run grouped by
the sweep (W&B: the sweep's name as project and group, ``job_type`` cell, trial or confirmation; MLflow: an
experiment named after the sweep in ``<sweep folder>/mlflow.db``, every run nested under the sweep's own run), tagged
with its method, grid values, seed and stage (a trial's also with its number, and once it ended its state and
objective); the sweep's own run holds ``table.md`` and the figures. Runs that already ran are not run, nor logged,
again, and the sweep's own run is found again by its id (``<sweep folder>/trackers.json``)."""
import os

TRACKED = ('wandb', 'mlflow')


def tracked(argv):
    """The trackers besides TensorBoard that a command line's ``--tracker`` names (its last one), ``[]`` else."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == '--tracker']
    return [t.strip() for t in str(values[-1]).split(',') if t.strip() in TRACKED] if values else []


def store_uri(sweep_folder):
    return 'sqlite:///' + os.path.join(os.path.abspath(sweep_folder), 'mlflow.db')


def tag_value(value):
    return str(value).replace(',', ';').replace('=', ':')


def add_flags(stages, sweep_name, sweep_folder, tags):
    """Give each tracked stage of a cell or trial the sweep's tracker flags (those its flags do not set already):
    project and group the sweep's name, the sweep's MLflow store, and ``tags`` with the stage's name."""
    for stage in stages:
        if not tracked(stage.argv):
            continue
        all_tags = {**tags, 'stage': stage.name}
        extra = {'--tracker_project': sweep_name, '--tracker_group': sweep_name,
                 '--tracker_uri': store_uri(sweep_folder),
                 '--tracker_tags': ','.join(f'{k}={tag_value(v)}' for k, v in all_tags.items())}
        for flag, value in extra.items():
            if flag not in stage.argv:
                stage.argv += [flag, value]


def cell_tags(method, axes, seed, job_type, **more):
    return {'job_type': job_type, 'method': method, **axes, 'seed': seed, **more}


def mark_trial(stage_runs, state, objective):
    """A tuning trial's state (complete, pruned, diverged) and objective on its runs' tracker records (``stage_runs``:
    the run folders of its stages); each run marked once per state."""
    from tracking.trackers import load_ids, mlflow_client, save_ids, wandb_add
    for folder in stage_runs:
        ids = load_ids(folder) if folder else {}
        if not ids or ids.get('trial_state') == state:
            continue
        values = {'trial_state': state, **({'objective': float(objective)} if objective is not None else {})}
        if ids.get('mlflow'):
            client = mlflow_client(ids['mlflow']['uri'])
            run_id = ids['mlflow']['run_id']
            client.set_tag(run_id, 'trial_state', state)
            if objective is not None:
                client.log_metric(run_id, 'objective', float(objective))
            if state != 'complete':          # a pruned run was stopped before it could end its tracker run
                client.set_terminated(run_id, status='KILLED' if state == 'pruned' else 'FAILED')
        if ids.get('wandb'):
            wandb_add(folder, ids['wandb'], values)
        save_ids(folder, {**load_ids(folder), 'trial_state': state})


def log_sweep(sweep, written):
    """The sweep's own run in each tracker its runs use: ``table.md`` and the figures (``written``: name -> path),
    made once and found again by its id in ``<sweep folder>/trackers.json``."""
    used = sorted({t for cell in sweep.cells for stage in cell.stages for t in tracked(stage.argv)})
    files = [p for n, p in written.items() if n.endswith(('.md', '.png')) and os.path.isfile(p)]
    if not used or not files:
        return
    from tracking.trackers import load_ids, mlflow_client, mlflow_experiment, mlflow_parent, save_ids, wandb_add
    ids = load_ids(sweep.folder)
    if 'mlflow' in used:
        uri = store_uri(sweep.folder)
        client = mlflow_client(uri)
        parent = mlflow_parent(client, mlflow_experiment(client, uri, sweep.name), sweep.name)
        for path in files:
            client.log_artifact(parent, path)
        ids['mlflow'] = {'uri': uri, 'run_id': parent}
    if 'wandb' in used:
        import uuid
        entry = ids.get('wandb') or {'id': uuid.uuid4().hex[:16], 'project': sweep.name}
        wandb_add(sweep.folder, entry, files=files, name=sweep.name, group=sweep.name, job_type='sweep')
        ids['wandb'] = entry
    save_ids(sweep.folder, ids)
