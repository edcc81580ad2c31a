"""A sweep file's ``tune:`` section read and checked (docs/USAGE.md, "Tuning"): the budget of trials every method gets
per combination of the grid's values, the search space (flag -> range, log scale or choices; a method may add its own
flags under its ``tune:`` key), the held-out split the trials select on, the objective and the pruning; and where each
study keeps its chosen values (``best.json``), which the seeded cells then run with.

Nothing here imports Optuna or runs anything; ``sweeping/tuning/tuner.py`` runs the studies.
"""
import json
import math
import os
from dataclasses import dataclass, field
from typing import Optional

from core.flags import UserError, nearest_flags
from sweeping.entries import SCRIPTS, SweepError, argv_of, axes_folder, folder_part, parser_of

KEYS = {'trials': 'the budget: trials of every method per combination of the grid\'s values (>= 1)',
        'space': 'flag -> {low, high, log} or {choices: [...]}: what every method tunes (the flags its script has)',
        'val_split': 'the held-out fraction of the training set the trials select on (default 0.2)',
        'val_noise': 'the held-out labels the trials select on: clean (default), or same: the training labels\' '
                     'noise (--val_noise same; a method without --label_noise keeps them clean)',
        'split_seed': 'the seed of the held-out draw (default 0)',
        'seed': 'the sampler\'s seed and the trials\' --seed (default 0)',
        'metric': 'the objective, from the trial\'s evaluation: final_val_acc (default), best_val_acc, final_val_nll '
                  'or final_val_ece',
        'evaluation': 'the evaluation whose held-out result is the objective (default: the first; a method without '
                      'it: its stage 1\'s own)',
        'pruning': 'successive halving on the per-epoch held-out accuracy: {min_epochs: 1, reduction: 3, '
                   'min_complete: 0} (no trial pruned before min_complete trials have finished), or false',
        'confirm': 're-run the best trials on more seeds and choose by the mean: {top: 2, seeds: 2} (or a list of '
                   'seeds); these runs count in the budget (trials - top x seeds are searched)',
        'flat_margin': 'a study\'s budget was enough ("flat") when the best of its first three quarters of trials is '
                       'within this of its best (the objective\'s units; default 0.5)',
        'startup_trials': 'trials drawn at random before TPE models the results (default: a third of the budget, '
                          'at least 2)',
        'storage': 'an Optuna RDB URL (sqlite:///..., postgresql://...) instead of the journal file in the sweep '
                   'folder'}
SCRIPT_EPOCHS = {'main_supcon.py': 1000, 'main_ce.py': 500}      # the scripts' --epochs defaults (SupContrast's)
RANGE_KEYS = ('low', 'high', 'log', 'choices')
METRICS = {'final_val_acc': 'maximize', 'best_val_acc': 'maximize', 'final_val_nll': 'minimize',
           'final_val_ece': 'minimize'}
BEST = 'best.json'          # a finished study's chosen values, in its folder


@dataclass
class Range:
    """One flag's search space: ``low``..``high`` (``log``: on a log scale; ``integer``: whole numbers), or
    ``choices``."""
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    integer: bool = False
    choices: Optional[list] = None

    def midpoint(self):
        if self.choices is not None:
            return self.choices[0]
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return int(round(mid)) if self.integer else mid


@dataclass
class TuneSpec:
    trials: int
    space: dict                       # flag -> Range, for every method
    method_space: dict                # method -> {flag -> Range}: a method's own flags
    applies: dict = field(default_factory=dict)     # method -> [flags of the space that its runs take]
    val_split: float = 0.2
    split_seed: int = 0
    seed: int = 0
    metric: str = 'final_val_acc'
    evaluation: Optional[str] = None
    pruning: Optional[dict] = field(default_factory=lambda: {'min_epochs': 1, 'reduction': 3, 'min_complete': 0})
    startup_trials: int = 2
    storage: Optional[str] = None
    confirm: Optional[dict] = None    # {'top': k, 'seeds': [...]}: the best k trials re-run on these seeds
    val_noise: str = 'clean'
    flat_margin: float = 0.5

    @property
    def direction(self):
        return METRICS[self.metric]

    @property
    def confirm_runs(self):
        """Runs of the budget that confirm (re-run the best trials on more seeds) rather than search."""
        return self.confirm['top'] * len(self.confirm['seeds']) if self.confirm else 0

    @property
    def search_trials(self):
        """The trials Optuna asks: the budget less the confirmation runs."""
        return self.trials - self.confirm_runs

    def space_of(self, method):
        """``{flag: Range}`` that ``method`` tunes: the shared flags its runs take, and its own."""
        return {**{f: self.space[f] for f in self.applies.get(method, self.space)}, **self.method_space.get(method, {})}

    def tuned(self, sweep_folder, method, chosen):
        """The flags the study of ``method`` at the grid's values ``chosen`` chose (its best.json), or ``None`` while
        the study is not finished (a budget raised in the file continues the study and chooses again)."""
        try:
            with open(os.path.join(study_folder(sweep_folder, method, chosen), BEST)) as f:
                best = json.load(f)
            same = best.get('budget') == self.trials and best.get('confirm') == self.confirm
            return best['flags'] if same else None     # a larger budget or another confirmation: not yet
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def study_folder(sweep_folder, method, chosen):
    """``<sweep>/tune/<method>[/<axis=value,...>]``: a study's trials and its best.json."""
    return os.path.join(sweep_folder, 'tune', folder_part(method), *axes_folder(chosen))


def study_name(sweep_name, method, chosen):
    """The study's name in its storage: the sweep, the method and the grid's values (one storage may hold many)."""
    return ':'.join([sweep_name, method, *(f'{k}={v}' for k, v in chosen.items())])


class FloatFlag:
    """What :class:`AnyFlag` gives for every flag: an argparse action's ``type``, a float."""
    type = float


class AnyFlag(dict):
    """Every flag, as a float flag: the lookup of ``--status``, which reads a file without the scripts' parsers."""

    def __contains__(self, key):
        return True

    def __missing__(self, key):
        return FloatFlag


def read_range(spec, at, dest, action):
    if not isinstance(spec, dict):
        raise UserError(f'{at}: give {{low: A, high: B}} (log: true for a log scale) or {{choices: [...]}}, got '
                        f'{spec!r}')
    for key in spec:
        if key not in RANGE_KEYS:
            raise UserError(f'{at}: unknown key {key!r} (the keys: {", ".join(RANGE_KEYS)})')
    if 'choices' in spec:
        choices = spec['choices']
        if not isinstance(choices, list) or not choices or set(spec) - {'choices'}:
            raise UserError(f'{at}: choices must be a non-empty list, alone (no low/high)')
        return Range(choices=choices)
    if 'low' not in spec or 'high' not in spec:
        raise UserError(f'{at}: give both low and high')
    low, high, log = spec['low'], spec['high'], spec.get('log', False)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
        raise UserError(f'{at}: low and high must be numbers, got {low!r} and {high!r}')
    if not isinstance(log, bool):
        raise UserError(f'{at}: log must be true or false, got {log!r}')
    if not low < high:
        raise UserError(f'{at}: the range is {"empty" if low == high else "reversed"} (low {low}, high {high}): '
                        'give low < high')
    if log and low <= 0:
        raise UserError(f'{at}: a log scale needs low > 0, got {low}')
    integer = action.type is int
    if integer and (int(low) != low or int(high) != high):
        raise UserError(f'{at}: --{dest} takes whole numbers, got low {low}, high {high}')
    if action.type not in (int, float):
        raise UserError(f'{at}: --{dest} is not a number: give {{choices: [...]}}')
    return Range(int(low) if integer else float(low), int(high) if integer else float(high), log, integer)


def read_space(space, at, actions):
    """``{flag: Range}`` of a ``space:`` mapping; ``actions``: ``{dest: argparse action}`` of every script the flags
    may belong to."""
    if not isinstance(space, dict):
        raise UserError(f'{at} must be a mapping (flag: {{low: A, high: B}}), not {type(space).__name__}')
    out = {}
    for flag, spec in space.items():
        dest = str(flag).replace('-', '_')
        if dest not in actions:
            near = nearest_flags(dest, list(actions))
            raise UserError(f'{at}.{flag}: {flag} is not a flag of the sweep\'s scripts'
                            + (f' (did you mean {", ".join(n.lstrip("-") for n in near)}?)' if near else ''))
        if dest in ('seed', 'val_split', 'split_seed', 'eval_split', 'save_folder', 'resume', 'ckpt'):
            raise UserError(f'{at}.{flag}: {flag} is set by the tuning itself, not searched')
        out[dest] = read_range(spec, f'{at}.{flag}', dest, actions[dest])
    return out


def read_spec(data, method_space, where, entries, axes, evaluations, base, check=True):
    """The :class:`TuneSpec` of a file's ``tune:`` (``data``) and its methods' ``tune:`` keys (``method_space``:
    label -> mapping or None); a :class:`sweeping.plan.SweepError` naming the file and the entry for anything it
    cannot run. ``entries``: label -> (script, flags, evaluations)."""
    at = f'{where} tune'
    try:
        if not isinstance(data, dict):
            raise UserError(f'{at} must be a mapping (trials:, space:, ...), not {type(data).__name__}')
        for key in data:
            if key not in KEYS:
                near = nearest_flags(str(key), list(KEYS))
                raise UserError(f'{at}: unknown key {key!r} (the keys: {", ".join(KEYS)})'
                                + (f'; did you mean {near[0].lstrip("-")}?' if near else ''))
        trials = data.get('trials')
        if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
            raise UserError(f'{at}.trials: the budget must be a whole number >= 1, got {trials!r}')
        def actions_of(*scripts):        # --status (check=False) builds no parser: every flag read as a float
            if not check:
                return AnyFlag()
            return {a.dest: a for script in sorted(scripts) for a in parser_of(script)._actions
                    if a.option_strings and a.dest != 'help'}
        space = read_space(data.get('space') or {}, f'{at}.space', actions_of(*{s for s, _, _ in entries.values()}))
        own = {}
        for method, extra in method_space.items():
            if extra is not None:
                own[method] = read_space(extra, f'{where} methods.{method}.tune', actions_of(entries[method][0]))
        if not space and not any(own.values()):
            raise UserError(f'{at}.space is empty: give at least one flag to tune (learning_rate: {{low: 0.02, '
                            f'high: 1.0, log: true}})')
        for axis, values in axes.items():
            for flags in values.values():
                shared = sorted({str(k).replace('-', '_') for k in flags} & (set(space) | {f for o in own.values()
                                                                                          for f in o}))
                if shared:
                    raise UserError(f'{where} grid.{axis} sets {shared[0]}, which tune: searches: every value of the '
                                    'axis would be tuned away; set it in one place')
        val_split = data.get('val_split', 0.2)
        if not isinstance(val_split, (int, float)) or isinstance(val_split, bool) or not 0 < val_split < 1:
            raise UserError(f'{at}.val_split must be in (0, 1): the trials select on held-out data, got '
                            f'{val_split!r}')
        ints = {}
        for key in ('split_seed', 'seed', 'startup_trials'):
            value = data.get(key, 0 if key != 'startup_trials' else max(2, trials // 3))
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f'{at}.{key} must be a whole number >= 0, got {value!r}')
            ints[key] = value
        metric = data.get('metric', 'final_val_acc')
        if metric not in METRICS:
            raise UserError(f'{at}.metric: no trial writes {metric!r}: a trial\'s held-out result holds '
                            f'{", ".join(METRICS)}')
        evaluation = data.get('evaluation', next(iter(evaluations), None))
        if evaluation is not None and evaluation not in evaluations:
            raise UserError(f'{at}.evaluation: {evaluation!r} is not an evaluation of the file '
                            f'({", ".join(evaluations) or "none"})')
        for method, (script, _, evaluate) in entries.items():
            if script == 'main_supcon.py' and evaluation not in evaluate:
                raise UserError(f'{at}: methods.{method} is tuned on its evaluation\'s held-out result, and it has '
                                f'{"no evaluation" if evaluation is None else f"no evaluation {evaluation}"}: add '
                                'linear: to the file (pre-training alone measures nothing to select on)')
        pruning = data.get('pruning', {})
        if pruning is True:
            pruning = {}
        if pruning is not False and pruning is not None:
            if not isinstance(pruning, dict) or set(pruning) - {'min_epochs', 'reduction', 'min_complete'}:
                raise UserError(f'{at}.pruning: give {{min_epochs: 1, reduction: 3, min_complete: 0}} or false, got '
                                f'{pruning!r}')
            pruning = {'min_epochs': pruning.get('min_epochs', 1), 'reduction': pruning.get('reduction', 3),
                       'min_complete': pruning.get('min_complete', 0)}
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in pruning.values()) or \
                    pruning['min_epochs'] < 1 or pruning['reduction'] < 2 or pruning['min_complete'] < 0:
                raise UserError(f'{at}.pruning: min_epochs >= 1, reduction >= 2 and min_complete >= 0 (whole '
                                f'numbers), got {pruning}')
        else:
            pruning = None
        if pruning and 'epochs' not in space:        # a floor past every run's last epoch: pruning never acts
            for method, (script, flags, _) in entries.items():
                runs = [{**base, **axis_flags, **flags} for values in axes.values() for axis_flags in values.values()]
                epochs = [int(run.get('epochs', SCRIPT_EPOCHS[script])) for run in runs or [{**base, **flags}]]
                if max(epochs) < pruning['min_epochs']:
                    raise UserError(f'{at}.pruning.min_epochs is {pruning["min_epochs"]}, but methods.{method} runs '
                                    f'{max(epochs)} epochs: the pruning would never act; lower min_epochs, or give '
                                    f'pruning: false')
        confirm = read_confirm(data.get('confirm'), at, trials, ints['seed'])
        val_noise = data.get('val_noise', 'clean')
        if val_noise not in ('clean', 'same'):
            raise UserError(f'{at}.val_noise: clean or same (the held-out labels with the training labels\' noise), '
                            f'got {val_noise!r}')
        flat_margin = data.get('flat_margin', 0.5)
        if not isinstance(flat_margin, (int, float)) or isinstance(flat_margin, bool) or \
                not math.isfinite(flat_margin) or flat_margin < 0:
            raise UserError(f'{at}.flat_margin must be a number >= 0 (in the objective\'s units), got '
                            f'{flat_margin!r}')
        storage = data.get('storage')
        if storage is not None and (not isinstance(storage, str) or '://' not in storage):
            raise UserError(f'{at}.storage: an RDB URL (sqlite:///path.db, postgresql://user@host/db), got '
                            f'{storage!r}')
    except SweepError:
        raise
    except UserError as e:
        raise SweepError(str(e)) from None
    spec = TuneSpec(trials, space, own, val_split=float(val_split), metric=metric, evaluation=evaluation,
                    pruning=pruning, storage=storage, confirm=confirm, flat_margin=float(flat_margin),
                    val_noise=val_noise, **ints)
    if check:
        try:
            spec.applies = {}
            for method, (script, flags, _) in entries.items():
                run = {**base, **flags}
                spec.applies[method] = [f for f in space if takes(script, run, f, space[f], f'{at}.space.{f}')]
                for f, rng in own.get(method, {}).items():
                    if not takes(script, run, f, rng, f'{where} methods.{method}.tune.{f}'):
                        raise UserError(f'{where} methods.{method}.tune.{f}: {script} does not take --{f} in this '
                                        f'method\'s runs ({refusal(script, run, f, None)}): set what it needs in '
                                        f'the method, or tune another flag')
                if not spec.applies[method] and not own.get(method):
                    raise UserError(f'{at}: methods.{method} would tune nothing: {script} takes none of tune.space\'s '
                                    f'flags ({", ".join(space)}) in its runs; give it a flag it takes (its own tune: '
                                    'key), or leave it out of the file')
        except UserError as e:
            raise SweepError(str(e)) from None
    return spec


def read_confirm(confirm, at, trials, seed):
    """``{'top': k, 'seeds': [...]}`` of ``confirm:`` (``seeds: n`` is the n seeds after the file's ``seed``), or
    ``None``; one line for what cannot be: a seed the trials already ran, more confirmation runs than the budget leaves
    room for."""
    if confirm is None or confirm is False:
        return None
    where = f'{at}.confirm'
    if not isinstance(confirm, dict) or set(confirm) - {'top', 'seeds'} or 'top' not in confirm \
            or 'seeds' not in confirm:
        raise UserError(f'{where}: give {{top: K, seeds: N}} (or seeds: [1, 2]), got {confirm!r}')
    top, seeds = confirm['top'], confirm['seeds']
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise UserError(f'{where}.top: the number of best trials to re-run, a whole number >= 1, got {top!r}')
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise UserError(f'{where}.seeds: a number of seeds >= 1 or a list of seeds, got {seeds!r}')
        seeds = [seed + 1 + i for i in range(seeds)]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                            for v in seeds) or len(set(seeds)) != len(seeds):
        raise UserError(f'{where}.seeds: distinct whole numbers >= 0 (or their count), got {confirm["seeds"]!r}')
    if seed in seeds:
        raise UserError(f'{where}.seeds: {seed} is the seed every trial ran with (tune.seed): confirm on others')
    runs = top * len(seeds)
    if trials - runs < top:
        raise UserError(f'{where}: {top} trials x {len(seeds)} seeds = {runs} confirmation runs leave {trials - runs} '
                        f'of the {trials} trials to search, fewer than the {top} to confirm: raise tune.trials to '
                        f'{runs + top} or more, or confirm fewer')
    return {'top': top, 'seeds': seeds}


def refusal(script, flags, flag, value):
    """The one line ``script`` answers a command line of ``flags`` with ``--flag value`` (the flag's default for
    ``None``), or ``None`` when it accepts it."""
    import contextlib
    import io

    from config.options import parse_option
    if value is None:
        value = next(a.default for a in parser_of(script)._actions if a.dest == flag)
    err = io.StringIO()
    try:
        argv = argv_of(script, {**flags, flag: value}, 'tune', only_known=list(flags))
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse_option(SCRIPTS[script], argv)
    except (UserError, SweepError) as e:
        return str(e)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return lines[-1].split('error: ', 1)[-1] if lines else 'refused'
    return None


def takes(script, flags, flag, rng, at):
    """Whether a run of ``script`` with ``flags`` tunes ``flag``: not when its parser lacks the flag, nor when its runs
    refuse the flag even at its default (main_ce.py's --temp needs --supcon_weight: CE skips a temperature, as
    USAGE says). A flag it takes must be accepted at both ends of the range and at every choice: a value it refuses is
    a :class:`UserError` naming the entry ``at``, the value and the script's own line."""
    if flag not in {a.dest for a in parser_of(script)._actions}:
        return False
    if refusal(script, flags, flag, None) is not None:
        return False
    values = rng.choices if rng.choices is not None else [rng.low, rng.high]
    for value in values:
        why = refusal(script, flags, flag, value)
        if why is not None:
            raise UserError(f'{at}: {script} refuses {value!r} ({why}): give a range its runs take')
    return True
