"""The tuning's part of a sweep's outputs (docs/USAGE.md, "Tuning"): in ``table.md`` each study's chosen values, its
trials by state and its best held-out result; ``tuning.png``, the expected best held-out result against the number of
trials, per study (Dodge et al. 2019, "Show Your Work": a budget is enough where the curves have flattened); each
study's Optuna parallel-coordinate and parameter-importance plots (``parallel_coordinate.png``, ``importance.png``
in its folder); and every trial for ``sweep.json``. Written from the studies' ``study.json`` files."""
import math
import os

from sweeping.launch import shown
from sweeping.tuning.status import read_study
from sweeping.tuning.tuner import studies_of


def expected_best(values, n, larger_is_better=True):
    """The expected best of ``n`` trials drawn with replacement from ``values`` (Dodge et al. 2019, eq. 1): with the
    values sorted from worst to best, ``sum_i v_(i) * ((i / N)^n - ((i - 1) / N)^n)``."""
    ordered = sorted(values, reverse=not larger_is_better)
    total = len(ordered)
    return sum(v * ((i / total) ** n - ((i - 1) / total) ** n) for i, v in enumerate(ordered, start=1))


def flatness(trials, margin, larger_is_better=True):
    """Whether a study's budget was enough, from its trials in the order they ran (``number``): ``(flat, early,
    best)`` with ``early`` the best objective among the first three quarters (rounded up) of the trials and ``best``
    the best of all; flat when ``best`` improves on ``early`` by at most ``margin``. A study whose best trial came late
    and by more than ``margin`` is not flat: more trials might have found better. ``None`` without a measured trial
    (pruned trials were never measured; diverged ones count with their lowest score)."""
    ordered = sorted(trials, key=lambda t: t['number'])
    pick = max if larger_is_better else min

    def best_of(part):
        values = [t['value'] for t in part if t['state'] in ('complete', 'diverged') and t['value'] is not None]
        return pick(values) if values else None
    best = best_of(ordered)
    if best is None:
        return None
    early = best_of(ordered[:math.ceil(0.75 * len(ordered))])
    if early is None:
        return False, None, best
    gain = best - early if larger_is_better else early - best
    return gain <= margin, early, best


def flat_cell(record, spec):
    """``table.md``'s word on a study's budget: ``yes (97.2 → 97.4)`` or ``**no** (...)``; ``—`` before its
    search has finished."""
    trials = record.get('trials', [])
    if len(trials) < spec.search_trials or any(t['state'] in ('running', 'crashed') for t in trials):
        return '—'
    found = flatness(trials, spec.flat_margin, spec.direction == 'maximize')
    if found is None:
        return '**no** (no trial measured)'
    flat, early, best = found
    return f'{"yes" if flat else "**no**"} ({fmt(early) if early is not None else "none"} → {fmt(best)})'


def records(sweep):
    """Every study's record (``study.json``), in the cells' order; a study not started yet has its label alone."""
    return [{'label': s.label, 'folder': s.folder, **read_study(s.folder)} for s in studies_of(sweep)]


def fmt(value):
    return f'{value:.4g}' if isinstance(value, float) else str(value)


def lines_of(sweep, studies):
    """``table.md``'s section on the tuning."""
    spec = sweep.tune
    out = ['## Tuning', '',
           f'Every method (per combination of the grid\'s values) had the same budget of {spec.trials} trials '
           f'(Optuna, TPE seeded with {spec.seed}, {spec.startup_trials} at random first'
           + (f'; successive halving on the per-epoch held-out accuracy, from epoch {spec.pruning["min_epochs"]}, '
              f'reduction {spec.pruning["reduction"]}' if spec.pruning else '; no pruning')
           + f'). Objective: `{spec.metric}` on a held-out {spec.val_split:g} of the training set (split seed '
           f'{spec.split_seed}; its labels '
           + ('with the training labels\' noise, `val_noise: same`' if spec.val_noise == 'same' else 'clean')
           + '), which the trials never train on; no trial reads the test split. '
           + (f'Of the budget, {spec.confirm_runs} runs confirmed: the best {spec.confirm["top"]} trials re-run with '
              f'seeds {", ".join(map(str, spec.confirm["seeds"]))}, the values chosen by the mean over '
              f'{len(spec.confirm["seeds"]) + 1} seeds. ' if spec.confirm else '')
           + 'The seeded cells below ran with the chosen values on the whole training set and read the test split '
           f'once. Flat: the best of the first three quarters of the trials is within {spec.flat_margin:g} of the '
           'best of all (the budget was enough); **no** marks a study whose budget may not have been.', '',
           '| study | chosen values | trials (complete / pruned / diverged / running) | best held-out | trial | '
           'flat (best at ¾ → best) |',
           '| --- | --- | --- | --- | --- | --- |']
    for record in studies:
        trials = record.get('trials', [])
        counts = {s: sum(1 for t in trials if t['state'] == s) for s in ('complete', 'pruned', 'diverged')}
        running = len(trials) - sum(counts.values())
        best = record.get('best')
        chosen = os.path.isfile(os.path.join(record['folder'], 'best.json'))
        values = ', '.join(f'{k} {fmt(v)}' for k, v in best['params'].items()) if best else '—'
        value = fmt(best['value']) if best else '—'
        if best and best.get('confirmed'):          # the mean over the confirmation's seeds
            value = f'{value} (mean of {len(best["confirmed"]["values"])} seeds)'
        out.append(f'| {record["label"]} | {values if chosen else f"(not chosen yet) {values}"} | '
                   f'{len(trials)} of {spec.search_trials}: {counts["complete"]} / {counts["pruned"]} / '
                   f'{counts["diverged"]} / {running} | {value} | '
                   f'{best["number"] if best else "—"} | {flat_cell(record, spec)} |')
    out += ['', 'Pruned trials are left out of the budget curves (their objective was never measured); diverged ones '
            'count with the lowest score. `tuning.png`: the expected best held-out result against the number of '
            'trials. Each study\'s folder holds `parallel_coordinate.png` and `importance.png`.', '']
    return out


def budget_figure(sweep, studies, path):
    """``tuning.png``: per study, the expected best held-out result of n trials, n = 1 .. the trials measured.
    Returns whether it was drawn (some study has a measured trial)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    larger = sweep.tune.direction == 'maximize'
    curves = []
    for record in studies:
        values = [t['value'] for t in record.get('trials', []) if t['state'] in ('complete', 'diverged')
                  and t['value'] is not None]
        if values:
            curves.append((record['label'], [expected_best(values, n, larger) for n in range(1, len(values) + 1)]))
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    for label, curve in curves:
        ax.plot(range(1, len(curve) + 1), curve, marker='o', markersize=3, label=label)
    ax.set_xlabel('trials measured (count; pruned trials left out)')
    unit = ' (%)' if sweep.tune.metric.endswith('acc') else ''
    ax.set_ylabel(f'expected best {sweep.tune.metric}{unit}')
    ax.set_title(f'{sweep.name}: expected best held-out result vs budget', fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))     # outside: the curves stay visible
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def readable_parallel_coordinate(ax):
    """Optuna's parallel-coordinate plot (``ax``, its figure laid out) made readable: the lines' colour map starts at
    a mid blue (Optuna's ``Blues`` starts at white, so the worst trial's line vanished), and the colour bar moves right
    of the last parameter axis's tick labels, which it covered; the parameter axes narrow to make room."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    figure = ax.figure
    for lines in ax.collections:
        lines.set_cmap(ListedColormap(lines.get_cmap()(np.linspace(0.3, 1.0, 256))))
    bars = [a for a in figure.axes if a.get_label() == '<colorbar>']
    if not bars:
        return
    bar, plots = bars[0], [a for a in figure.axes if a is not bars[0]]
    renderer = figure.canvas.get_renderer()
    to_figure = figure.transFigure.inverted()

    def right_of_ticks():
        return max(a.get_tightbbox(renderer).transformed(to_figure).x1 for a in plots)
    room = bar.get_tightbbox(renderer).transformed(to_figure).width + 0.02   # the bar, its ticks and its label
    over = right_of_ticks() + room - 0.99
    if over > 0:                                  # narrow the plot (all parameter axes share its position)
        pos = plots[0].get_position()
        for a in plots:
            a.set_position([pos.x0, pos.y0, pos.width - over, pos.height])
    pos, start = bar.get_position(), right_of_ticks() + 0.02
    bar.set_position([start, pos.y0, pos.width, pos.height])


def optuna_plots(sweep, studies):
    """Each study's parallel-coordinate and parameter-importance plots (Optuna's, through matplotlib) as PNGs in its
    folder; returns ``{label: why not drawn}`` for those it could not draw (too few complete trials, one parameter
    without spread)."""
    import warnings

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    from sweeping.tuning.tuner import storage_of
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_of(sweep)
    skipped = {}
    for record in studies:
        complete = [t for t in record.get('trials', []) if t['state'] == 'complete']
        if len(complete) < 2:
            skipped[record['label']] = f'{len(complete)} complete trial(s): the plots need 2'
            continue
        study = optuna.load_study(study_name=record['study'], storage=storage)
        for name, plot in (('parallel_coordinate.png', plots.plot_parallel_coordinate),
                           ('importance.png', plots.plot_param_importances)):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter('ignore')
                    ax = plot(study)
                figure = (ax[0] if hasattr(ax, '__len__') else ax).figure
                figure.set_size_inches(8, 4.4)
                figure.suptitle(f'{sweep.name}: {record["label"]} ({len(complete)} complete trials)', fontsize=9)
                figure.tight_layout()
                if name == 'parallel_coordinate.png':
                    readable_parallel_coordinate(ax)
                figure.savefig(os.path.join(record['folder'], name), dpi=110)
                plt.close(figure)
            except (ValueError, RuntimeError, ZeroDivisionError) as e:
                skipped[record['label']] = f'{name}: {str(e).splitlines()[0][:120]}'
    return skipped


def write(sweep, lines, written):
    """The tuning's section into ``lines`` (table.md's), its figures into the sweep folder (named in ``written``);
    returns the studies' records for sweep.json."""
    studies = records(sweep)
    lines += lines_of(sweep, studies)
    path = os.path.join(sweep.folder, 'tuning.png')
    if budget_figure(sweep, studies, path):
        written['tuning.png'] = path
    if any(r.get('trials') for r in studies):
        for label, why in optuna_plots(sweep, studies).items():
            lines += [f'Optuna\'s plots of {label} not drawn: {why}.', '']
    for record in studies:
        record['folder'] = shown(record['folder'])
    return studies
