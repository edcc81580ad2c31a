"""Tuning before a sweep's seeded cells (docs/USAGE.md, "Tuning"): one Optuna study per method and combination of the
grid's values, each given the same budget of trials, driven from the sweep's own process by ask-and-tell.

A trial is a small cell in ``<sweep>/tune/<method>[/<axes>]/trial_<n>/``: stage 1 with the trial's values on the
training set less its held-out part (``--val_split``, ``--eval_split val``: no test image is read), then the file's
evaluation on the same held-out part; its objective is that evaluation's held-out result. While stage 1 runs, its
per-epoch held-out accuracy (``knn/val_acc`` of the kNN monitor, ``val/acc`` of main_ce.py) is reported to the study,
and a trial the pruner (successive halving) stops is stopped (SIGTERM locally, ``scancel`` on SLURM).

The sampler is TPE, seeded by the file's seed and the trial's number, so a study proposes the same trials again after
an interruption. Studies live in the sweep folder (Optuna's journal file, ``tune/optuna.journal``) or in an RDB given
by ``storage:``. A second call continues every study: finished trials are kept; a trial the storage holds as running
(the sweep was interrupted or killed, or the trial crashed) resumes from its last.pth; none is asked past the budget.
A diverged trial (a non-finite loss) is a result with the lowest score. A finished study writes ``best.json`` (its best
trial's values), which the seeded cells run with. ``study.json`` beside it mirrors every trial for ``--status`` and
the report, which do not import Optuna.
"""
import contextlib
import csv
import io
import json
import os
import re
import signal
import subprocess
import time
from typing import NamedTuple

from core.flags import UserError
from sweeping import launch as sweep_run
from sweeping.plan import STAGE1, Cell, build_stages
from sweeping.tune_spec import BEST, study_folder, study_name

STUDY = 'study.json'
JOURNAL = 'optuna.journal'
DIVERGED = re.compile(r'the loss became|steps in a row had non-finite')     # training/loop.py's two stop lines
PRUNE_ON = {'main_supcon.py': 'knn/val_acc', 'main_ce.py': 'val/acc'}       # the per-epoch held-out accuracy


class Running(NamedTuple):
    """A trial this call runs: its study, the Optuna study and trial, its launcher, the epochs reported, its cell."""
    study: 'Study'
    opt_study: object
    trial: object
    launcher: object
    reported: set
    cell: Cell


class Study:
    """One study: ``method`` at the grid's values ``chosen``, its folder, its name, what its trials run."""

    def __init__(self, sweep, method, chosen, axis_flags):
        spec = sweep.tune
        script, flags, evaluate = sweep.entries[method]
        self.sweep, self.spec, self.method, self.chosen, self.script = sweep, spec, method, chosen, script
        self.flags = {**axis_flags, **flags}
        self.folder = study_folder(sweep.folder, method, chosen)
        self.name = study_name(sweep.name, method, chosen)
        self.label = ' '.join([method, *(f'{k}={v}' for k, v in chosen.items())])
        self.objective = spec.evaluation if spec.evaluation in evaluate else None
        self.space = spec.space_of(method)

    def held_out(self):
        spec = self.spec
        return {'val_split': spec.val_split, 'split_seed': spec.split_seed, 'eval_split': 'val'}

    def cell(self, number, params):
        """The trial ``number``'s cell: stage 1 with ``params`` (flag -> value) on the held-out split, then the
        objective's evaluation on it."""
        stage1 = {**self.flags, **params, 'seed': self.spec.seed, **self.held_out()}
        if self.script == 'main_supcon.py':
            stage1['knn_every'] = 1          # the held-out accuracy every epoch: what the pruner reads
        evaluations = ({self.objective: {**self.sweep.evaluation_flags[self.objective], **self.held_out()}}
                       if self.objective else {})
        folder = os.path.join(self.folder, f'trial_{number}')
        stages = build_stages(self.script, stage1, evaluations, self.sweep.base, folder, f'{self.sweep.path}:',
                              self.method)
        return Cell(self.method, {**self.chosen, 'trial': number}, self.spec.seed, folder, stages)

    def result(self, cell):
        """The trial's objective from its results.json (the evaluation's, else stage 1's), or ``None``."""
        path = cell.stages[-1].result()
        if path is None:
            return None
        with open(path) as f:
            value = json.load(f).get(self.spec.metric)
        return None if value is None else float(value)


def studies_of(sweep):
    """Every study of the sweep: each method at each combination of the grid's values (the cells' order)."""
    import itertools
    out = []
    for method in sweep.entries:
        for values in itertools.product(*[list(a.items()) for a in sweep.axes.values()]):
            chosen = dict(zip(sweep.axes, (label for label, _ in values)))
            axis_flags = {}
            for _, flags in values:
                axis_flags.update(flags)
            out.append(Study(sweep, method, chosen, axis_flags))
    return out


# ---------------------------------------------------------------- what --status and the report read
def read_study(folder):
    """A study's mirror (``study.json``: its trials, budget, best), ``{}`` before it started."""
    try:
        with open(os.path.join(folder, STUDY)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def progress_line(record, budget, live=True):
    """``'5 of 8 trials: 3 complete, 1 pruned, 1 running; best 97.2 (trial 2)'``. ``live``: whether a process
    drives the sweep now; without one a trial the record holds as running is ``interrupted`` (the next call
    continues it from its checkpoint)."""
    trials = record.get('trials', [])
    counts = {}
    for t in trials:
        name = 'interrupted' if t['state'] == 'running' and not live else t['state']
        counts[name] = counts.get(name, 0) + 1
    order = ('complete', 'diverged', 'pruned', 'running', 'interrupted', 'crashed')
    text = f'{len(trials)} of {budget} trials' + (': ' + ', '.join(f'{counts[s]} {s}' for s in order if s in counts)
                                                  if trials else '')
    if len(trials) > budget:        # the file's budget was lowered after these ran: the next call refuses it
        return (f'{len(trials)} trials, more than the file\'s budget of {budget}: refused (raise tune.trials to '
                f'{len(trials)} or more)')
    best = record.get('best')
    if best:
        text += f'; best {best["value"]:.4g} (trial {best["number"]})'
    if os.path.isfile(os.path.join(record.get('folder', ''), BEST)):
        text += '; chosen'
    return text


# ---------------------------------------------------------------- the launchers of trials
class LocalTrial:
    """A trial's stages in order on this machine, one process at a time (``threads`` threads, ``gpu``)."""

    def __init__(self, cell, threads, gpu):
        self.cell, self.env, self.index, self.proc = cell, sweep_run.stage_env(threads, gpu), 0, None
        self.start_next()

    def start_next(self):
        record = sweep_run.read_record(self.cell.folder)
        stages = self.cell.stages
        while self.index < len(stages) and sweep_run.state(stages[self.index], record) == 'done':
            self.index += 1
        self.proc = None
        if self.index < len(stages):
            stage = stages[self.index]
            if stage.reads is not None:
                stage.stage1_run = self.cell.stage(stage.reads).run()
            self.proc, self.log, self.started = sweep_run.start_stage(self.cell, stage, self.env)

    @property
    def stage(self):
        return self.cell.stages[min(self.index, len(self.cell.stages) - 1)]

    def poll(self):
        """``None`` while a stage runs; else how the trial ended: ``done``, ``failed`` or ``interrupted``."""
        if self.proc is None:
            return 'done'
        code = self.proc.poll()
        if code is None:
            return None
        outcome = sweep_run.finish_stage(self.cell, self.stage, code, self.log, self.started)
        if outcome != 'done':
            return outcome
        self.index += 1
        self.start_next()
        return 'done' if self.proc is None else None

    def stop(self, why='interrupted'):
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        sweep_run.finish_stage(self.cell, self.stage, self.proc.returncode, self.log, self.started, interrupted=True)
        sweep_run.write_record(self.cell.folder, self.stage.name, state=why)


class SlurmTrial:
    """A trial as one SLURM job (the sweep's ``CellJob``: its stages in order, requeued at its time limit)."""

    def __init__(self, cell, executor, threads):
        self.cell = cell
        self.job = str(executor.submit(sweep_run.CellJob(cell, threads)).job_id)
        sweep_run.write_record(cell.folder, '_slurm', job=self.job, submitted=time.time())

    @property
    def stage(self):
        record = sweep_run.read_record(self.cell.folder)
        return next((s for s in self.cell.stages if sweep_run.state(s, record) != 'done'), self.cell.stages[-1])

    def poll(self):
        if sweep_run.queued({self.job}):
            return None
        record = sweep_run.read_record(self.cell.folder)
        states = [sweep_run.state(s, record) for s in self.cell.stages]
        if all(s == 'done' for s in states):
            return 'done'
        return 'failed' if 'failed' in states else 'interrupted'

    def stop(self, why='interrupted'):
        subprocess.run(['scancel', self.job], capture_output=True, timeout=60)
        deadline = time.time() + 120
        while sweep_run.queued({self.job}) and time.time() < deadline:
            time.sleep(1)
        stage = self.stage
        if stage.name in sweep_run.read_record(self.cell.folder):
            sweep_run.write_record(self.cell.folder, stage.name, state=why)


def epoch_values(run_folder, key):
    """``{epoch: value}`` of ``key`` in a run's metrics.csv, from whole lines only (the file may be being written)."""
    try:
        with open(os.path.join(run_folder, 'metrics.csv'), newline='') as f:
            text = f.read()
    except OSError:
        return {}
    text = text[:text.rfind('\n') + 1]
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if row.get(key):
                out[int(row['epoch'])] = float(row[key])
    return out


# ---------------------------------------------------------------- the studies
def storage_of(sweep, say=None):
    """The studies' storage: ``storage:``'s URL, else the journal file in the sweep's folder. A journal whose last
    record a crash cut short mid-write (no final newline: the write never completed, so no trial was told of it) is
    trimmed to its last whole record first, with a note through ``say``."""
    import optuna
    if sweep.tune.storage:
        return sweep.tune.storage
    from optuna.storages.journal import JournalFileBackend
    os.makedirs(os.path.join(sweep.folder, 'tune'), exist_ok=True)
    path = os.path.join(sweep.folder, 'tune', JOURNAL)
    trim_cut_record(path, say)
    return optuna.storages.JournalStorage(JournalFileBackend(path))


def trim_cut_record(path, say=None):
    """Drop a last line without its newline from the journal at ``path`` (a record cut short by a crash); returns the
    bytes dropped."""
    if not os.path.isfile(path):
        return 0
    with open(path, 'rb+') as f:
        data = f.read()
        if not data or data.endswith(b'\n'):
            return 0
        keep = data.rfind(b'\n') + 1
        f.truncate(keep)
    if say is not None:
        say(f'note: {path}: its last record was cut short ({len(data) - keep} bytes, a crash mid-write): dropped')
    return len(data) - keep


def distribution(rng):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    if rng.choices is not None:
        return CategoricalDistribution(rng.choices)
    return (IntDistribution if rng.integer else FloatDistribution)(rng.low, rng.high, log=rng.log)


class Tuner:
    """The studies of a sweep and the trials running now; :meth:`run` drives them to their budgets."""

    def __init__(self, sweep, studies, say):
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna, self.sweep, self.spec, self.say = optuna, sweep, sweep.tune, say
        spec = self.spec
        pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=spec.pruning['min_epochs'],
                                                         reduction_factor=spec.pruning['reduction'])
                  if spec.pruning and spec.direction == 'maximize' else optuna.pruners.NopPruner())
        try:           # before the first trial: a storage that cannot be opened is one line naming the file's entry
            storage = storage_of(sweep, say)
            self.studies = [(s, optuna.create_study(study_name=s.name, storage=storage, direction=spec.direction,
                                                    pruner=pruner, load_if_exists=True)) for s in studies]
        except Exception as e:      # SQLAlchemy's and Optuna's errors of every kind for a URL or file they cannot use
            where = (f'tune.storage {spec.storage!r}' if spec.storage
                     else os.path.join(sweep.folder, 'tune', JOURNAL))
            raise UserError(f'{sweep.path}: {where} cannot be opened ({type(e).__name__}: '
                            f'{(str(e).strip().splitlines() or [""])[0][:160]}): give a storage this machine can '
                            f'open (sqlite:///path/to/file.db), or move a damaged journal away') from None
        for study, opt_study in self.studies:     # a budget lowered below what ran: its choice could not respect it
            if len(opt_study.trials) > spec.trials:
                raise UserError(f'{sweep.path}: tune.trials is {spec.trials}, but {study.label} already ran '
                                f'{len(opt_study.trials)} trials: a choice among them would not respect the budget; '
                                f'raise tune.trials to {len(opt_study.trials)} or more, or tune in a new save_folder')
        self.running = {}           # (study name, trial number) -> Running
        self.crashed = set()

    def ask(self, study, opt_study):
        """A new trial of ``opt_study``: TPE seeded by the file's seed and the trial's number."""
        number = len(opt_study.trials)
        opt_study.sampler = self.optuna.samplers.TPESampler(seed=(self.spec.seed * 1_000_003 + number) % 2 ** 31,
                                                            n_startup_trials=self.spec.startup_trials)
        return opt_study.ask({flag: distribution(rng) for flag, rng in study.space.items()})

    def to_start(self):
        """``(study, optuna study, trial)`` to start next: a trial the storage holds as running (an earlier call's),
        else a new one of the study furthest from its budget; ``None`` when there is none."""
        for study, opt_study in self.studies:
            for frozen in opt_study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
                key = (study.name, frozen.number)
                if key not in self.running and key not in self.crashed:
                    return study, opt_study, self.optuna.trial.Trial(opt_study, frozen._trial_id)
        open_ = [(len(o.trials), i) for i, (s, o) in enumerate(self.studies) if len(o.trials) < self.spec.trials]
        if not open_:
            return None
        study, opt_study = self.studies[min(open_)[1]]
        return study, opt_study, self.ask(study, opt_study)

    def start(self, study, opt_study, trial, launch):
        cell = study.cell(trial.number, dict(trial.params))
        self.set_aside_other_values(cell.folder, trial)
        os.makedirs(cell.folder, exist_ok=True)
        with open(os.path.join(cell.folder, 'trial.json'), 'w') as f:
            json.dump({'study': study.name, 'number': trial.number, 'params': dict(trial.params)}, f, indent=2)
        frozen = next(t for t in opt_study.get_trials(deepcopy=False) if t.number == trial.number)
        reported = set(frozen.intermediate_values)
        self.running[(study.name, trial.number)] = Running(study, opt_study, trial, launch(cell), reported, cell)
        self.record(study, opt_study)          # the running trial in study.json (--status)
        self.say(f'trial {trial.number} of {study.label}: '
                 + ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else f'{k} {v}' for k, v in trial.params.items()))

    def set_aside_other_values(self, folder, trial):
        """A trial's folder that holds a run of other values (the storage lost that trial's record, say a journal cut
        short, and asked the number again) would resume that run under this trial's name: it is moved aside (never
        deleted) with a note, and the trial starts afresh with its own values."""
        try:
            with open(os.path.join(folder, 'trial.json')) as f:
                held = json.load(f).get('params')
        except (OSError, ValueError):
            return
        if held == dict(trial.params):
            return
        k = 1
        while os.path.exists(f'{folder}.other_values_{k}'):
            k += 1
        os.rename(folder, f'{folder}.other_values_{k}')
        self.say(f'note: {folder} held a run of other values ({held}) that the study has no record of: moved to '
                 f'{folder}.other_values_{k}; trial {trial.number} starts afresh with its own')

    def watch(self, key):
        """Report a running trial's new epochs to its study, stop it when the pruner says so, and tell its result when
        it has ended; returns whether it is still running."""
        study, opt_study, trial, launcher, reported, cell = self.running[key]
        state = self.optuna.trial.TrialState
        outcome = launcher.poll()
        run = cell.stage(STAGE1).run()
        if self.spec.pruning and self.spec.direction == 'maximize' and isinstance(run, str):
            for epoch, value in sorted(epoch_values(run, PRUNE_ON[study.script]).items()):
                if epoch not in reported:
                    trial.report(value, epoch)
                    reported.add(epoch)
            # asked after every report, also of a run that has ended: the pruner records the rungs a trial reached
            prune = bool(reported) and trial.should_prune()
            if prune and outcome is None and launcher.stage.name == STAGE1:
                launcher.stop('pruned')
                opt_study.tell(trial, state=state.PRUNED)
                self.record(study, opt_study)
                self.say(f'pruned: trial {trial.number} of {study.label} after epoch {max(reported)}')
                return False
        if outcome is None:
            return True
        if outcome == 'done':
            value = study.result(cell)
            if value is None:
                outcome = 'failed'
            else:
                opt_study.tell(trial, value)
                self.say(f'complete: trial {trial.number} of {study.label}: {self.spec.metric} {value:.4g}')
        if outcome != 'done':
            line = sweep_run.read_record(cell.folder).get(launcher.stage.name, {}).get('last_line', '')
            if outcome == 'failed' and DIVERGED.search(line):
                trial.set_user_attr('diverged', line)
                if self.spec.direction == 'maximize':
                    opt_study.tell(trial, 0.0)
                else:
                    opt_study.tell(trial, state=state.FAIL)
                self.say(f'diverged: trial {trial.number} of {study.label} (counted with the lowest score): {line}')
            else:
                self.crashed.add(key)
                self.say(f'{outcome}: trial {trial.number} of {study.label} ({line}); the next call continues it')
        self.record(study, opt_study)
        return False

    def record(self, study, opt_study):
        """``study.json``: every trial (number, state, value, values, epochs reported) and the best so far; with the
        budget spent and every trial finished, ``best.json`` (the flags the seeded cells take)."""
        state = self.optuna.trial.TrialState
        trials = []
        for t in opt_study.get_trials(deepcopy=False):
            name = {state.COMPLETE: 'complete', state.PRUNED: 'pruned', state.FAIL: 'diverged'}.get(t.state, 'running')
            if 'diverged' in t.user_attrs:
                name = 'diverged'
            if (study.name, t.number) in self.crashed:
                name = 'crashed'
            reported = t.intermediate_values
            trials.append({'number': t.number, 'state': name, 'params': t.params,
                           'value': t.value if name in ('complete', 'diverged') else None,     # the objective
                           'epochs': len(reported), 'last_reported': reported[max(reported)] if reported else None,
                           'folder': os.path.join(study.folder, f'trial_{t.number}')})
        complete = [t for t in trials if t['state'] in ('complete', 'diverged') and t['value'] is not None]
        best = None
        if complete:
            pick = max if self.spec.direction == 'maximize' else min
            best = pick(complete, key=lambda t: (t['value'] if pick is max else -t['value'], -t['number']))
        record = {'study': study.name, 'method': study.method, 'axes': study.chosen, 'budget': self.spec.trials,
                  'metric': self.spec.metric, 'direction': self.spec.direction, 'folder': study.folder,
                  'space': {f: vars(r) for f, r in study.space.items()}, 'trials': trials,
                  'best': best and {'number': best['number'], 'value': best['value'], 'params': best['params']}}
        os.makedirs(study.folder, exist_ok=True)
        tmp = os.path.join(study.folder, f'.{STUDY}.tmp')
        with open(tmp, 'w') as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, os.path.join(study.folder, STUDY))
        finished = len(trials) >= self.spec.trials and all(t['state'] != 'running' and t['state'] != 'crashed'
                                                           for t in trials)
        if finished and best is not None and self.spec.tuned(self.sweep.folder, study.method, study.chosen) is None:
            with open(os.path.join(study.folder, BEST), 'w') as f:
                json.dump({'flags': best['params'], 'trial': best['number'], 'value': best['value'],
                           'metric': self.spec.metric, 'budget': self.spec.trials}, f, indent=2)
            self.say(f'chosen for {study.label}: trial {best["number"]} ({self.spec.metric} {best["value"]:.4g}): '
                     + ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else f'{k} {v}'
                                 for k, v in best['params'].items()))
        return record

    def run(self, jobs, launch, poll_s=0.5):
        """Run trials ``jobs`` at a time until every study has spent its budget (``launch(cell)``: a
        :class:`LocalTrial` or :class:`SlurmTrial`); a signal stops the running ones (checkpoints intact), which the
        next call continues. Returns the studies still unfinished (a trial crashed: the next call retries it)."""
        def stop(signum, frame):
            raise sweep_run.Stop(signum)
        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for study, opt_study in self.studies:
                self.record(study, opt_study)
            while True:
                while len(self.running) < jobs:
                    nxt = self.to_start()
                    if nxt is None:
                        break
                    self.start(*nxt, launch)
                if not self.running:
                    break
                time.sleep(poll_s)
                for key in list(self.running):
                    if not self.watch(key):
                        del self.running[key]
        except sweep_run.Stop as e:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for entry in self.running.values():
                entry.launcher.stop()
            raise sweep_run.Stop(e.signum) from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return [s for s, o in self.studies if self.spec.tuned(self.sweep.folder, s.method, s.chosen) is None]


def local_launch(jobs):
    """``launch(cell)`` of trials on this machine: ``cores / jobs`` threads each, one GPU each where there are
    several."""
    gpus = sweep_run.visible_gpus()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    counter = iter(range(10 ** 9))

    def launch(cell):
        gpu = gpus[next(counter) % len(gpus)] if gpus else None
        return LocalTrial(cell, threads, gpu)
    return launch


def slurm_launch(sweep, settings):
    ex = sweep_run.executor(os.path.join(sweep.folder, 'tune'), {**settings, 'job_name': f'tune_{sweep.name}'})
    threads = int(settings.get('cpus_per_task', 1))
    return lambda cell: SlurmTrial(cell, ex, threads)
