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
import json
import os
import signal
import time
from typing import NamedTuple

from core.flags import UserError
from sweeping import launch
from sweeping.plan import STAGE1, Cell, build_stages
from sweeping.tracking import add_flags as add_tracker_flags
from sweeping.tracking import cell_tags, mark_trial, tracked
from sweeping.tuning.confirm import Confirmations
from sweeping.tuning.spec import BEST, study_folder, study_name
from sweeping.tuning.status import DIVERGED, STUDY
from sweeping.tuning.trials import epoch_values

JOURNAL = 'optuna.journal'
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
        """The trials' held-out flags; with ``val_noise: same`` the held-out labels get the run's label noise (a run
        without ``--label_noise``, and its evaluation, keep them clean)."""
        spec = self.spec
        noisy = spec.val_noise == 'same' and bool({**self.sweep.base, **self.flags}.get('label_noise'))
        return {'val_split': spec.val_split, 'split_seed': spec.split_seed, 'eval_split': 'val',
                **({'val_noise': 'same'} if noisy else {})}

    def cell(self, number, params, seed=None):
        """The trial ``number``'s cell: stage 1 with ``params`` (flag -> value) on the held-out split, then the
        objective's evaluation on it. With ``seed``: its confirmation run on that seed (``confirm/trial_<n>_seed_<s>``,
        no per-epoch monitor: nothing prunes it)."""
        # --trial: the run folders inside trial_<n>/ are named ..._trial_<n> (one meaning of "trial" in the path)
        stage1 = {**self.flags, **params, 'seed': self.spec.seed if seed is None else seed, **self.held_out(),
                  'trial': number}
        if self.script == 'main_supcon.py' and seed is None:
            stage1['knn_every'] = 1          # the held-out accuracy every epoch: what the pruner reads
        evaluations = ({self.objective: {**self.sweep.evaluation_flags[self.objective], **self.held_out(),
                                         'trial': number}}
                       if self.objective else {})
        folder = os.path.join(self.folder, f'trial_{number}' if seed is None else
                              os.path.join('confirm', f'trial_{number}_seed_{seed}'))
        stages = build_stages(self.script, stage1, evaluations, self.sweep.base, folder, f'{self.sweep.path}:',
                              self.method)
        add_tracker_flags(stages, self.sweep.name, self.sweep.folder,
                          cell_tags(self.method, self.chosen, stage1['seed'],
                                    'trial' if seed is None else 'confirmation', trial=number))
        return Cell(self.method, {**self.chosen, 'trial': number}, stage1['seed'], folder, stages)

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
            if len(opt_study.trials) > spec.search_trials:
                raise UserError(f'{sweep.path}: tune.trials is {spec.trials}'
                                + (f' ({spec.search_trials} searched, {spec.confirm_runs} confirming)'
                                   if spec.confirm else '')
                                + f', but {study.label} already ran {len(opt_study.trials)} trials: a choice among '
                                f'them would not respect the budget; raise tune.trials to '
                                f'{len(opt_study.trials) + spec.confirm_runs} or more, or tune in a new save_folder')
        self.running = {}           # (study name, trial number) -> Running
        self.crashed = set()
        self.without_choice = set()     # studies whose every trial diverged with no value (a minimized objective)
        self.confirm = Confirmations(spec, optuna, self.crashed, say)       # confirm:'s runs and choice

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
        open_ = [(len(o.trials), i) for i, (s, o) in enumerate(self.studies)
                 if len(o.trials) < self.spec.search_trials]
        if not open_:
            return None
        study, opt_study = self.studies[min(open_)[1]]
        return study, opt_study, self.ask(study, opt_study)

    def start(self, study, opt_study, trial, start_trial):
        cell = study.cell(trial.number, dict(trial.params))
        self.set_aside_other_values(cell.folder, trial)
        os.makedirs(cell.folder, exist_ok=True)
        with open(os.path.join(cell.folder, 'trial.json'), 'w') as f:
            json.dump({'study': study.name, 'number': trial.number, 'params': dict(trial.params)}, f, indent=2)
        frozen = next(t for t in opt_study.get_trials(deepcopy=False) if t.number == trial.number)
        reported = set(frozen.intermediate_values)
        self.running[(study.name, trial.number)] = Running(study, opt_study, trial, start_trial(cell), reported, cell)
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
            # asked after every report, also of a run that has ended: the pruner records the rungs a trial reached;
            # obeyed once the study has min_complete finished trials (a floor: every method keeps several)
            prune = bool(reported) and trial.should_prune() and self.complete(opt_study) >= \
                self.spec.pruning.get('min_complete', 0)
            if prune and outcome is None and launcher.stage.name == STAGE1:
                launcher.stop('pruned')
                opt_study.tell(trial, state=state.PRUNED)
                # said before the record, which says the study's choice when this was its last trial
                self.say(f'pruned: trial {trial.number} of {study.label} after epoch {max(reported)}')
                self.record(study, opt_study)
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
            line = launch.read_record(cell.folder).get(launcher.stage.name, {}).get('last_line', '')
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

    def complete(self, opt_study):
        """The study's finished trials (complete, diverged included)."""
        done = self.optuna.trial.TrialState.COMPLETE
        return sum(1 for t in opt_study.get_trials(deepcopy=False) if t.state == done)

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
        if complete:            # the best value, ties: the earlier trial
            if self.spec.direction == 'maximize':
                best = max(complete, key=lambda t: (t['value'], -t['number']))
            else:
                best = min(complete, key=lambda t: (t['value'], t['number']))
            best = {'number': best['number'], 'value': best['value'], 'params': best['params']}
        runs, confirmed = self.confirm.best(study, opt_study) if self.spec.confirm else ([], None)
        record = {'study': study.name, 'method': study.method, 'axes': study.chosen, 'budget': self.spec.trials,
                  'searched': self.spec.search_trials, 'confirm': self.spec.confirm,
                  'metric': self.spec.metric, 'direction': self.spec.direction, 'folder': study.folder,
                  'space': {f: vars(r) for f, r in study.space.items()}, 'trials': trials,
                  'confirmations': runs, 'best': confirmed or best}
        self.mark_in_trackers(study, trials)
        os.makedirs(study.folder, exist_ok=True)
        tmp = os.path.join(study.folder, f'.{STUDY}.tmp')
        with open(tmp, 'w') as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, os.path.join(study.folder, STUDY))
        finished = len(trials) >= self.spec.search_trials and all(t['state'] != 'running' and t['state'] != 'crashed'
                                                                  for t in trials)
        if self.spec.confirm and not (finished and not runs):   # then the confirmation runs, the choice by their
            finished, best = finished and confirmed is not None, confirmed       # means (none: every trial diverged)
        if finished and best is None:      # every trial diverged without a value: nothing to choose from
            self.without_choice.add(study.name)
        if finished and best is not None and self.spec.tuned(self.sweep.folder, study.method, study.chosen) is None:
            with open(os.path.join(study.folder, BEST), 'w') as f:
                json.dump({'flags': best['params'], 'trial': best['number'], 'value': best['value'],
                           'metric': self.spec.metric, 'budget': self.spec.trials, 'confirm': self.spec.confirm,
                           **({'confirmed': best['confirmed']} if 'confirmed' in best else {})}, f, indent=2)
            value = 'none' if best['value'] is None else f'{best["value"]:.4g}'
            self.say(f'chosen for {study.label}: trial {best["number"]} ({self.spec.metric} {value}'
                     + (f', the mean of {len(best["confirmed"]["values"])} seeds' if 'confirmed' in best else '')
                     + '): ' + ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else f'{k} {v}'
                                         for k, v in best['params'].items()))
        return record

    def mark_in_trackers(self, study, trials):
        """Where the trials log to a tracker: each ended trial's state and objective on its runs (once each)."""
        marked = self.__dict__.setdefault('_marked', set())         # (study, trial, state) done in this process
        for t in trials:
            key = (study.name, t['number'], t['state'])
            if t['state'] not in ('complete', 'pruned', 'diverged') or key in marked:
                continue
            marked.add(key)
            cell = study.cell(t['number'], t['params'])
            if tracked(cell.stages[0].argv):
                runs = [stage.run() for stage in cell.stages]
                mark_trial([r for r in runs if isinstance(r, str)], t['state'], t['value'])

    def run(self, jobs, start_trial, poll_s=0.5):
        """Run trials ``jobs`` at a time until every study has spent its budget (``start_trial(cell)``: a
        :class:`LocalTrial` or :class:`SlurmTrial`); a signal stops the running ones (checkpoints intact), which the
        next call continues. Returns the studies still unfinished (a trial crashed: the next call retries it)."""
        def stop(signum, frame):
            raise launch.Stop(signum)
        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for study, opt_study in self.studies:
                self.record(study, opt_study)
            while True:
                while len(self.running) + len(self.confirm.running) < jobs:
                    nxt = self.to_start()
                    if nxt is not None:
                        self.start(*nxt, start_trial)
                        continue
                    nxt = self.confirm.next(self.studies)
                    if nxt is None:
                        break
                    self.confirm.start(*nxt, start_trial)
                if not self.running and not self.confirm.running:
                    break
                time.sleep(poll_s)
                for key in list(self.running):
                    if not self.watch(key):
                        del self.running[key]
                for key in list(self.confirm.running):
                    self.confirm.watch(key, self.record)     # an ended run leaves confirm.running
        except launch.Stop as e:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for entry in self.running.values():
                entry.launcher.stop()
            for _, _, launcher, _ in self.confirm.running.values():
                launcher.stop()
            raise launch.Stop(e.signum) from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return [s for s, o in self.studies if self.spec.tuned(self.sweep.folder, s.method, s.chosen) is None]
