"""A tuned sweep's confirmation (``confirm:``): once a study's search has spent its budget, its ``top`` best trials
run again on more seeds, and the candidate with the best mean over its seeds (the trial's own and the confirmation's;
a diverged run counts with the lowest score) is the study's choice (docs/USAGE.md, "Tuning")."""
import os

from sweeping.tuning.status import confirmation_state


class Confirmations:
    """The confirmation runs of a :class:`sweeping.tuning.tuner.Tuner`'s studies: which to run, the ones running
    (``running``: ``(study name, trial number, seed) -> (study, optuna study, launcher, cell)``), and the choice.
    ``crashed``: the tuner's set of runs that crashed in this call (shared: a crashed confirmation is not retried in
    it, and a study with a crashed trial has no candidates yet)."""

    def __init__(self, spec, optuna, crashed, say):
        self.spec, self.optuna, self.crashed, self.say = spec, optuna, crashed, say
        self.running = {}

    def candidates(self, study, opt_study):
        """``[(trial number, params, value)]``: the ``confirm.top`` best complete trials of a study whose search has
        finished (ties: the earlier), which its confirmation runs re-run; ``[]`` before, or without ``confirm:``."""
        spec, state = self.spec, self.optuna.trial.TrialState
        trials = opt_study.get_trials(deepcopy=False)
        if not spec.confirm or len(trials) < spec.search_trials or any(
                t.state == state.RUNNING or (study.name, t.number) in self.crashed for t in trials):
            return []
        complete = [t for t in trials if t.state == state.COMPLETE and 'diverged' not in t.user_attrs]
        sign = -1 if spec.direction == 'maximize' else 1
        ranked = sorted(complete, key=lambda t: (sign * t.value, t.number))[:spec.confirm['top']]
        return [(t.number, dict(t.params), t.value) for t in ranked]

    def of(self, study, opt_study):
        """``[(trial number, seed, cell)]``: the study's confirmation runs (each candidate on each seed)."""
        return [(number, seed, study.cell(number, params, seed))
                for number, params, _ in self.candidates(study, opt_study) for seed in self.spec.confirm['seeds']]

    def next(self, studies):
        """``(study, optuna study, number, seed, cell)`` of a confirmation run to start (not finished, not running,
        not crashed in this call), or ``None``."""
        for study, opt_study in studies:
            for number, seed, cell in self.of(study, opt_study):
                key = (study.name, number, seed)
                if key in self.running or key in self.crashed:
                    continue
                if confirmation_state(cell) in ('pending', 'failed'):
                    return study, opt_study, number, seed, cell
        return None

    def start(self, study, opt_study, number, seed, cell, start_trial):
        os.makedirs(cell.folder, exist_ok=True)
        self.running[(study.name, number, seed)] = (study, opt_study, start_trial(cell), cell)
        self.say(f'confirming: trial {number} of {study.label} with seed {seed}')

    def watch(self, key, record):
        """Whether a confirmation run is still running; its end is said and ``record(study, optuna study)``
        called."""
        study, opt_study, launcher, cell = self.running[key]
        outcome = launcher.poll()
        if outcome is None:
            return True
        state = confirmation_state(cell)
        if state == 'complete':
            value = study.result(cell)
            self.say(f'confirmed: trial {key[1]} of {study.label} with seed {key[2]}: {self.spec.metric} '
                     + (f'{value:.4g}' if value is not None else 'not written'))
        elif state == 'diverged':
            self.say(f'diverged: the confirmation of trial {key[1]} of {study.label} with seed {key[2]} (counted '
                     'with the lowest score)')
        else:
            self.crashed.add(key)
            self.say(f'{outcome}: the confirmation of trial {key[1]} of {study.label} with seed {key[2]}; the next '
                     'call continues it')
        del self.running[key]
        record(study, opt_study)
        return False

    def best(self, study, opt_study):
        """``(confirmation records, the chosen candidate or None)``: each confirmation run's state and value, and
        once every one has ended the candidate with the best mean over its seeds (the trial's own and the
        confirmation's; a diverged run counts with the lowest score) as ``best`` record fields."""
        runs, means = [], []
        larger = self.spec.direction == 'maximize'
        for number, params, value in self.candidates(study, opt_study):
            values = [value]
            for seed in self.spec.confirm['seeds']:
                cell = study.cell(number, params, seed)
                state = confirmation_state(cell)
                if (study.name, number, seed) in self.running:
                    state = 'running'
                got = study.result(cell) if state == 'complete' else None
                if state == 'complete' and got is None:
                    state = 'failed'
                if state == 'diverged':
                    got = 0.0 if larger else None
                runs.append({'trial': number, 'seed': seed, 'state': state, 'value': got, 'folder': cell.folder})
                values.append(got)
            means.append((number, params, values))
        if not runs or any(r['state'] not in ('complete', 'diverged') for r in runs):
            return runs, None

        def score(entry):
            values = entry[2]
            if any(v is None for v in values):             # a diverged run of a minimized objective: the worst
                return (1, 0.0, entry[0])
            mean = sum(values) / len(values)
            return (0, -mean if larger else mean, entry[0])
        number, params, values = min(means, key=score)
        mean = None if any(v is None for v in values) else sum(values) / len(values)
        return runs, {'number': number, 'value': mean, 'params': params,
                      'confirmed': {'seeds': [self.spec.seed, *self.spec.confirm['seeds']], 'values': values}}
