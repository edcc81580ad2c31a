"""A sweep file read into its cells (docs/USAGE.md, "Sweeps"): every combination of a method, the grid's axes and a
seed, each with its stages (pre-training or CE, then the evaluations of its encoder), their command lines and their
folders; and what each stage's folder holds now (done, partly done, failed, not started).

Nothing here runs a script, reads a checkpoint or writes a file. Every command line is parsed by its script's own
parser (``options.parse_option``) before anything starts, so a flag a script does not have, a value it refuses or a
combination it refuses is one line naming the file, the entry and the cell (an evaluation's flags that contradict
the stage-1 checkpoint it adopts are the evaluation's own one-line error when it runs). A cell whose folder holds a
run of other flags (the file was changed after the run) is refused the same way, with the differences the resume
rules find.
"""
import contextlib
import fnmatch
import io
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from config.recipe import load_yaml
from core.flags import UserError, nearest_flags
from runtime.run_folder import RUN_IDENTITY
from sweeping.entries import (  # noqa: F401  (SCRIPTS, SweepError, folder_part: part of this module's API)
    SCRIPTS,
    SweepError,
    argv_of,
    axes_folder,
    folder_part,
    mapping,
    parser_of,
)
from sweeping.launch import read_record, state
from sweeping.tracking import add_flags as add_tracker_flags
from sweeping.tracking import cell_tags

# The scripts' parsers (config.options, which imports torch through the features' modules) are imported where a
# command line is checked, not here: --status reads a sweep's folders without them.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # the repository
KEYS = {'name': 'the sweep\'s folder: <save_folder>/sweeps/<name>/',
        'description': 'one line for the table\'s heading',
        'save_folder': 'the root of the sweep\'s folder (default ./save; --save_folder overrides it)',
        'base': 'flags of every run (each script takes those it has)',
        'methods': 'label -> script and its flags (stage 1)',
        'grid': 'further axes of stage 1: flag -> values, or axis -> {value label: flags}',
        'seeds': '--seed of every cell: a list, or N for 0..N-1 (with tune: the N seeds after the tuning\'s)',
        'linear': 'the flags of one evaluation named linear (main_linear.py on the stage-1 last.pth)',
        'evaluations': 'name -> the flags of an evaluation (main_linear.py on the stage-1 last.pth); a value '
                       '\'{flag}\' is the cell\'s stage-1 value of that flag',
        'compare': 'the table(s): baseline, metric, by, evaluation, train_metrics, rows, name',
        'slurm': 'the SLURM launcher\'s settings (partition, time_min, gpus_per_node, ...)',
        'tune': 'tuning before the seeded cells: trials, space, val_split, ... (docs/USAGE.md, "Tuning")',
        'estimate': 'the time the whole file takes, as measured (about 3.5 hours at --jobs 2): the dry run says it'}
METHOD_KEYS = ('script', 'evaluate', 'tune')         # a method entry's keys that are not flags
COMPARE_KEYS = ('name', 'baseline', 'metric', 'by', 'evaluation', 'train_metrics', 'rows', 'methods')
SLURM_KEYS = ('partition', 'time_min', 'gpus_per_node', 'cpus_per_task', 'mem_gb', 'nodes', 'tasks_per_node',
              'array_parallelism', 'setup', 'account', 'qos', 'constraint', 'additional_parameters', 'python')
STAGE1 = 'pretrain'       # the folder of a cell's first stage (pre-training, or main_ce.py's training)
UNREAD = os.path.join(os.sep, 'stage-1-not-read')    # where an evaluation's --ckpt points while it is planned
MAX_CELLS = 2000          # a larger grid is refused at once (planning parses every stage: about 10 ms each)


@dataclass
class Stage:
    """One run of a cell: ``script`` with ``argv`` (its flags but ``--save_folder``, ``--ckpt`` and ``--resume``,
    which :meth:`command` adds), into ``save_folder``; an evaluation ``reads`` the stage-1 run's last.pth."""
    name: str
    script: str
    argv: list
    save_folder: str
    reads: Optional[str] = None
    planned: dict = field(default_factory=dict)       # the options its parser makes (config_dict), given flags
    run_folder: Optional[str] = None                  # where the script will write (from the parser)
    stage1_run: Optional[str] = None                  # an evaluation's: the stage-1 run folder it reads

    def run(self):
        """The run folder under ``save_folder`` that holds a run (its ``run.json``), or ``None``."""
        found = []
        for folder, _, files in os.walk(self.save_folder):
            if RUN_IDENTITY in files:
                found.append(folder)
        return found[0] if len(found) == 1 else (sorted(found) if found else None)

    def result(self):
        """The run's results.json, or ``None``."""
        run = self.run()
        path = os.path.join(run, 'results.json') if isinstance(run, str) else None
        return path if path and os.path.isfile(path) else None

    def checkpoint(self):
        run = self.run()
        path = os.path.join(run, 'last.pth') if isinstance(run, str) else None
        return path if path and os.path.isfile(path) else None

    def command(self):
        """The command line (after ``python``): the flags, the save folder, the stage-1 checkpoint an evaluation
        reads, and ``--resume`` where the run has a checkpoint."""
        argv = [self.script, *self.argv, '--save_folder', self.save_folder]
        if self.reads is not None:
            argv += ['--ckpt', os.path.join(self.stage1_run, 'last.pth')]
        last = self.checkpoint()
        if last:
            argv += ['--resume', last]
        return argv


@dataclass
class Cell:
    """One combination: ``method`` (a label of the file), ``axes`` ({axis: value label}), ``seed``; its ``folder``
    and ``stages`` (stage 1 first)."""
    method: str
    axes: dict
    seed: int
    folder: str
    stages: list
    waiting: bool = False         # its method's tuning is not finished: its flags are not known yet

    @property
    def name(self):
        return ' '.join([self.method, *(f'{k}={v}' for k, v in self.axes.items()), f'seed {self.seed}'])

    def stage(self, name):
        return next((s for s in self.stages if s.name == name), None)


@dataclass
class Sweep:
    """A sweep file read and checked: its ``name``, ``folder``, ``cells`` and the settings of its ``compare`` tables
    and its ``slurm`` launcher."""
    path: str
    name: str
    folder: str
    description: str
    cells: list
    methods: list
    axes: dict
    evaluations: list
    compare: list
    slurm: dict
    text: str
    tune: Optional[object] = None             # the tune: section (sweeping.tuning.spec.TuneSpec), or None
    base: dict = field(default_factory=dict)
    entries: dict = field(default_factory=dict)       # label -> (script, flags, evaluations)
    evaluation_flags: dict = field(default_factory=dict)   # evaluation -> its flags
    estimate: str = ''                                  # the file's estimate of its time (estimate:)

    def select(self, patterns):
        """The cells whose name matches one of ``patterns`` (shell patterns: ``'SupCon *'``, ``'* seed 0'``)."""
        if not patterns:
            return list(self.cells)
        chosen = [c for c in self.cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
        if not chosen:
            raise SweepError(f'--only {" ".join(patterns)} matches no cell of {self.path} (cells are named like '
                             f'{self.cells[0].name!r})')
        return chosen


def read(path, save_folder=None, check=True):
    """The :class:`Sweep` of the file ``path``; :class:`SweepError` (one line naming the file and the entry) for
    anything it cannot run. ``check=False`` (--status) reads the file's cells and folders only: no stage's flags go
    through its script's parser (nor is its command line built)."""
    if not os.path.isfile(path):
        raise SweepError(f'{path} not found' if not os.path.isdir(path) else f'{path} is a folder: give a sweep file')
    try:
        with open(path) as f:
            text = f.read()
        data = load_yaml(text)
    except UserError as e:
        raise SweepError(f'{path}: {e}') from None
    except Exception as e:
        raise SweepError(f'{path} cannot be read ({(str(e).splitlines() or [type(e).__name__])[0]})') from None
    if not isinstance(data, dict):
        raise SweepError(f'{path} must hold a mapping (name:, methods:, seeds:, ...), not a {type(data).__name__}')
    where = f'{path}:'
    for key in data:
        if key not in KEYS:
            near = nearest_flags(str(key), list(KEYS))
            raise SweepError(f'{where} unknown key {key!r} (the keys: {", ".join(KEYS)})'
                             + (f'; did you mean {near[0].lstrip("-")}?' if near else ''))
    for key in ('name', 'methods', 'seeds'):
        if key not in data:
            raise SweepError(f'{where} {key} is missing ({KEYS[key]})')
    name = data['name']
    if not isinstance(name, str) or not re.fullmatch(r'[\w.+-]+', name) or not name.strip('.'):
        raise SweepError(f'{where} name must be a folder name (letters, digits, _ . + -), got {name!r}')
    root = save_folder or data.get('save_folder') or './save'
    folder = os.path.abspath(os.path.join(root, 'sweeps', name))
    base = mapping(data.get('base', {}), f'{where} base')
    methods = mapping(data['methods'], f'{where} methods')
    if not methods:
        raise SweepError(f'{where} methods is empty: give at least one (label: {{script: main_supcon.py, ...}})')
    axes = read_axes(data.get('grid') or {}, where)
    seeds = data['seeds']
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > MAX_CELLS:
        raise SweepError(f'{where} seeds: {seeds} seeds are more cells than a sweep plans ({MAX_CELLS} at most)')
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise SweepError(f'{where} seeds must be a non-empty list of integers (or N for 0..N-1), got {seeds!r}')
    if len(set(seeds)) != len(seeds):
        raise SweepError(f'{where} seeds repeats a seed: {seeds}')
    evaluations = {}
    if data.get('linear') is not None:
        evaluations['linear'] = mapping(data['linear'], f'{where} linear')
    for label, flags in mapping(data.get('evaluations', {}), f'{where} evaluations').items():
        if label in evaluations:
            raise SweepError(f'{where} evaluations.{label}: linear is already the evaluation given by linear:')
        evaluations[str(label)] = mapping(flags, f'{where} evaluations.{label}')
    if STAGE1 in evaluations:
        raise SweepError(f'{where} evaluations.{STAGE1}: {STAGE1} is the folder of every cell\'s stage 1; give the '
                         'evaluation another name')
    if len({folder_part(e) for e in evaluations}) != len(evaluations):
        raise SweepError(f'{where} evaluations: two names give one folder name ({", ".join(evaluations)})')
    entries, method_space = {}, {}
    for label, entry in methods.items():
        entry = dict(mapping(entry, f'{where} methods.{label}'))
        script = entry.pop('script', 'main_supcon.py')
        if script not in SCRIPTS or script == 'main_linear.py':
            raise SweepError(f'{where} methods.{label}.script: {script!r} is not main_supcon.py or main_ce.py')
        tune_extra = entry.pop('tune', None)
        evaluate = entry.pop('evaluate', script == 'main_supcon.py')
        if evaluate is True:
            evaluate = list(evaluations)
        elif evaluate is False or evaluate is None:
            evaluate = []
        elif isinstance(evaluate, str):
            evaluate = [evaluate]
        unknown = [e for e in evaluate if e not in evaluations]
        if unknown:
            raise SweepError(f'{where} methods.{label}.evaluate: {unknown[0]!r} is not an evaluation of the file '
                             f'({", ".join(evaluations) or "none: add linear: or evaluations:"})')
        for axis, values in axes.items():
            shared = sorted({str(k) for flags in values.values() for k in flags} & {str(k) for k in entry})
            if shared:
                raise SweepError(f'{where} grid.{axis} sets {shared[0]}, which methods.{label} sets too: every value '
                                 'of the axis would run the same command; set it in one place')
        entries[str(label)] = (script, entry, list(evaluate))
        method_space[str(label)] = tune_extra
    if len({folder_part(m) for m in entries}) != len(entries):
        raise SweepError(f'{where} methods: two labels give the same folder name')
    n_cells = len(entries) * math.prod(len(a) for a in axes.values()) * len(seeds)
    if n_cells > MAX_CELLS:
        raise SweepError(f'{where} {n_cells} cells ({len(entries)} methods x '
                         + ''.join(f'{len(a)} {k} x ' for k, a in axes.items())
                         + f'{len(seeds)} seeds): more than the {MAX_CELLS} a sweep plans; split it into several files')
    tune = None
    if data.get('tune') is not None:
        from sweeping.tuning.spec import read_spec
        tune = read_spec(data['tune'], method_space, where, entries, axes, evaluations, base, check)
        seeds = fresh_seeds(data['seeds'], seeds, tune, where)
    elif any(v is not None for v in method_space.values()):
        label = next(k for k, v in method_space.items() if v is not None)
        raise SweepError(f'{where} methods.{label}.tune: a method\'s own search space needs the file\'s tune: section')
    cells = []
    for method, (script, flags, evaluate) in entries.items():
        for axis, values in axes.items() if check else ():      # a misspelled flag of an axis is the axis's
            for value, axis_flags in values.items():
                argv_of(script, axis_flags, f'{where} grid.{axis}.{value}', only_known=list(base))
        for values in itertools.product(*[list(a.items()) for a in axes.values()]):
            chosen = dict(zip(axes, (label for label, _ in values)))
            stage1_flags = {}
            for _, axis_flags in values:
                stage1_flags.update(axis_flags)
            stage1_flags.update(flags)       # a method's own value wins over an axis's
            tuned = tune.tuned(folder, method, chosen) if tune is not None else {}
            stage1_flags.update(tuned or {})  # and the tuned values win over both
            # a tuned sweep's cells read the test split once, after their last epoch (the choice was made on held-out
            # data): every stage with --test_every end (main_supcon.py's kNN monitor too)
            once = {'test_every': 'end'} if tune is not None else {}
            stage1_flags.update(once)
            for seed in seeds:
                cell_folder = os.path.join(folder, 'runs', folder_part(method), *axes_folder(chosen), f'seed_{seed}')
                stages = build_stages(script, {**stage1_flags, 'seed': seed},
                                      {e: {**evaluations[e], **once} for e in evaluate}, base, cell_folder, where,
                                      method, check)
                if check:
                    add_tracker_flags(stages, name, folder, cell_tags(method, chosen, seed, 'cell'))
                cells.append(Cell(method, chosen, seed, cell_folder, stages, waiting=tune is not None and not tuned))
    compare = read_compare(data.get('compare'), where, entries, axes, evaluations)
    slurm = mapping(data.get('slurm', {}), f'{where} slurm')
    for key in slurm:
        if key not in SLURM_KEYS:
            raise SweepError(f'{where} slurm: unknown key {key!r} (the keys: {", ".join(SLURM_KEYS)})')
    if 'python' in slurm and not (isinstance(slurm['python'], str) and slurm['python'].strip()):
        raise SweepError(f'{where} slurm.python: the command a job runs Python with (e.g. '
                         f'/opt/envs/supcon/bin/python), got {slurm["python"]!r}')
    estimate = data.get('estimate') or ''
    if not isinstance(estimate, str):
        raise SweepError(f'{where} estimate must be a line of text (about 3.5 hours at --jobs 2), got {estimate!r}')
    sweep = Sweep(path, name, folder, str(data.get('description') or ''), cells, list(entries), axes,
                  list(evaluations), compare, slurm, text, tune, base, entries, evaluations, estimate)
    if check:
        check_base(base, entries, evaluations, where)
    return sweep


def fresh_seeds(given, seeds, tune, where):
    """A tuned sweep's cells run on seeds that no trial or confirmation ran with (docs/USAGE.md, "Tuning"):
    ``seeds: N`` is the first N seeds after the tuning's (``tune.seed`` and ``confirm:``'s seeds); a list that
    holds one of the tuning's seeds is a :class:`SweepError`."""
    used = sorted({tune.seed, *(tune.confirm['seeds'] if tune.confirm else [])})
    if isinstance(given, int) and not isinstance(given, bool):
        return list(range(used[-1] + 1, used[-1] + 1 + given))
    overlap = sorted(set(seeds) & set(used))
    if overlap:
        raise SweepError(f'{where} seeds: {overlap[0]} is a seed the tuning ran with (tune.seed and confirm: '
                         f'{", ".join(map(str, used))}): a tuned sweep tests on other seeds (seeds: N gives the N '
                         f'after them)')
    return seeds


def build_stages(script, stage1_flags, evaluations, base, folder, where, method, check=True):
    """The stages of one cell (or tuning trial) in ``folder``: stage 1 (``script`` with ``base`` and
    ``stage1_flags``, its seed among them), then each of ``evaluations`` (``{name: its flags}``: main_linear.py on
    the stage-1 last.pth, with the same seed). ``check=False``: no command line is built."""
    seed = stage1_flags.get('seed')
    stages = [Stage(STAGE1, script, [], os.path.join(folder, STAGE1))]
    if check:
        stages[0].argv = argv_of(script, {**base, **stage1_flags}, f'{where} methods.{method}', only_known=list(base))
    for evaluation, flags in evaluations.items():
        stage = Stage(evaluation, 'main_linear.py', [], os.path.join(folder, folder_part(evaluation)), reads=STAGE1)
        at = f'{where} evaluations.{evaluation}'
        own = {k: from_stage1(v, {**base, **stage1_flags}, f'{at}.{k}') for k, v in flags.items()}
        if check:
            stage.argv = argv_of('main_linear.py', {**base, **own, 'seed': seed}, at, only_known=list(base))
        stages.append(stage)
    return stages


def from_stage1(value, stage1, where):
    """An evaluation's value ``'{flag}'``: the cell's own stage-1 value of that flag (``imb_factor: '{imb_factor}'``
    evaluates each encoder on the long tail it was trained on)."""
    found = re.fullmatch(r'\{(\w+)\}', value) if isinstance(value, str) else None
    if found is None:
        return value
    if found.group(1) not in stage1:
        raise SweepError(f'{where}: {value} names a flag that stage 1 does not set (base, grid or the method)')
    return stage1[found.group(1)]


def read_axes(grid, where):
    """``{axis: {value label: {flag: value}}}`` of ``grid:``; a flag's list of values is an axis of that flag."""
    axes = {}
    for axis, values in mapping(grid, f'{where} grid').items():
        if str(axis) == 'seed':
            raise SweepError(f'{where} grid.seed: the seeds are the file\'s seeds:, not an axis of the grid')
        if isinstance(values, list):
            if not values:
                raise SweepError(f'{where} grid.{axis} is empty: give at least one value')
            labels = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
            if len(set(labels)) != len(labels):
                raise SweepError(f'{where} grid.{axis} repeats a value: {values}')
            axes[str(axis)] = {label: {axis: v} for label, v in zip(labels, values)}
        elif isinstance(values, dict):
            if not values:
                raise SweepError(f'{where} grid.{axis} is empty: give at least one value')
            axes[str(axis)] = {str(label): mapping(flags, f'{where} grid.{axis}.{label}') for label, flags in
                               values.items()}
        else:
            raise SweepError(f'{where} grid.{axis} must be a list of values or a mapping of named flag sets, got '
                             f'{values!r}')
        if len({folder_part(label) for label in axes[str(axis)]}) != len(axes[str(axis)]):
            raise SweepError(f'{where} grid.{axis}: two values give one folder name ({", ".join(axes[str(axis)])})')
    if len({folder_part(a) for a in axes}) != len(axes):
        raise SweepError(f'{where} grid: two axes give one folder name ({", ".join(axes)})')
    return axes


def read_compare(spec, where, entries, axes, evaluations):
    """The ``compare:`` tables as dicts with every key filled."""
    specs = [{}] if spec is None else spec if isinstance(spec, list) else [spec]
    tables = []
    for i, table in enumerate(specs):
        at = f'{where} compare' + (f'[{i}]' if isinstance(spec, list) else '')
        table = dict(mapping(table, at))
        for key in table:
            if key not in COMPARE_KEYS:
                raise SweepError(f'{at}: unknown key {key!r} (the keys: {", ".join(COMPARE_KEYS)})')
        table.setdefault('name', 'table' if i == 0 else f'table_{i + 1}')
        table.setdefault('metric', 'final_test_acc')
        table.setdefault('rows', 'method')
        table.setdefault('evaluation', evaluations and next(iter(evaluations)) or None)
        by = table.get('by') or []
        table['by'] = [by] if isinstance(by, str) else list(by)
        table['train_metrics'] = list(table.get('train_metrics') or [])
        table['methods'] = list(table.get('methods') or entries)
        for axis in table['by']:
            if axis not in axes:
                raise SweepError(f'{at}.by: {axis!r} is not an axis of the grid ({", ".join(axes) or "none"})')
        for method in table['methods']:
            if method not in entries:
                raise SweepError(f'{at}.methods: {method!r} is not a method of the file')
        if table['rows'] not in ('method', 'evaluation'):
            raise SweepError(f'{at}.rows: method (a row per method) or evaluation (a row per evaluation of the '
                             f'methods), not {table["rows"]!r}')
        if table['evaluation'] is not None and table['evaluation'] not in evaluations:
            raise SweepError(f'{at}.evaluation: {table["evaluation"]!r} is not an evaluation of the file')
        labels = table['methods'] if table['rows'] == 'method' else [e for e in evaluations if any(
            e in entries[m][2] for m in table['methods'])]
        baseline = table.get('baseline')
        if baseline is not None and str(baseline) not in labels:
            raise SweepError(f'{at}.baseline: {baseline!r} is not one of its rows ({", ".join(labels)})')
        tables.append(table)
    return tables


def check_base(base, entries, evaluations, where):
    """A ``base:`` key that no script of the sweep has is a mistake, not a flag to leave out."""
    scripts = {s for s, _, _ in entries.values()} | ({'main_linear.py'} if evaluations else set())
    known = set().union(*({a.dest for a in parser_of(s)._actions} for s in scripts))
    for key in base:
        if str(key).replace('-', '_') not in known:
            near = nearest_flags(str(key), [f'--{k}' for k in known])
            raise SweepError(f'{where} base: {key} is not a flag of {", ".join(sorted(scripts))}'
                             + (f' (did you mean {near[0].lstrip("-")}?)' if near else ''))


def parse(stage, cell, sweep):
    """Parse ``stage``'s command line with its script's parser (in this process, nothing run): fills
    ``stage.planned`` and ``stage.run_folder``; a :class:`SweepError` naming the cell for anything it refuses."""
    if stage.reads is not None:
        stage.stage1_run = cell.stage(stage.reads).run_folder
    argv = stage.command()[1:]
    if '--resume' in argv:          # the file's flags alone: a resume would replay its run.json under them
        del argv[argv.index('--resume'):argv.index('--resume') + 2]
    if stage.reads is not None:     # parsed before its checkpoint is read (it may not exist yet, or be mid-run)
        argv[argv.index('--ckpt') + 1] = os.path.join(UNREAD, os.path.basename(stage.stage1_run), 'last.pth')
    from config.options import parse_option
    from config.resume import config_dict
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            opt = parse_option(SCRIPTS[stage.script], argv)
    except SystemExit:
        message = err.getvalue().strip().splitlines()
        raise SweepError(f'{sweep.path}: {cell.name}, {stage.name} ({stage.script}): '
                         f'{message[-1].split("error: ", 1)[-1] if message else "refused"}') from None
    except UserError as e:
        raise SweepError(f'{sweep.path}: {cell.name}, {stage.name} ({stage.script}): {e}') from None
    stage.planned = {'config': config_dict(opt), 'given': set(opt.given_flags)}
    last = stage.checkpoint()
    stage.run_folder = os.path.dirname(os.path.abspath(last)) if last else os.path.abspath(opt.run_folder)


def conflict(stage, cell):
    """Why ``stage``'s folder cannot take the planned run (it holds a run of other flags: the file changed after it
    ran), or ``None``."""
    run = stage.run()
    if run is None:
        return None
    if isinstance(run, list):
        return f'{stage.save_folder} holds {len(run)} runs ({", ".join(os.path.basename(r) for r in run)})'
    try:
        with open(os.path.join(run, RUN_IDENTITY)) as f:
            saved = json.load(f)['config']
    except (OSError, ValueError, KeyError, TypeError):
        return f'{run}/{RUN_IDENTITY} cannot be read'
    planned = stage.planned['config']
    if stage.reads is not None:           # before stage 1 is read, only the flags the sweep gives are known
        keys = stage.planned['given'] - {'ckpt', 'save_folder', 'resume'}
        planned = {k: v for k, v in planned.items() if k in keys}
        saved = {k: v for k, v in saved.items() if k in keys}
    from config.resume import WHERE_IT_RAN, resume_conflicts
    if state(stage, read_record(cell.folder)) == 'done':     # finished: any difference but where it ran is another run
        differences = resume_conflicts(saved, planned, holder='the finished run', may_change=WHERE_IT_RAN)
    else:
        differences = resume_conflicts(saved, planned, holder='the run')
    if differences:
        return '; '.join(differences)
    if os.path.abspath(run) != stage.run_folder and stage.reads is None:
        return f'it holds the run {os.path.basename(run)}, the file now names {os.path.basename(stage.run_folder)}'
    return None


def prepare(sweep, cells):
    """Parse every stage of ``cells`` and refuse, in one line naming the cell, a folder that holds a run of other
    flags (the file was changed after the run: change it back, or give the sweep another name)."""
    for cell in cells:
        for stage in cell.stages:
            parse(stage, cell, sweep)
            why = None if cell.waiting else conflict(stage, cell)     # a waiting cell's values are not known yet
            if why:
                raise SweepError(f'{sweep.path}: the cell {cell.name} ({stage.name}) ran with other flags: {why}; '
                                 'change the file back, or give the sweep a new name')
