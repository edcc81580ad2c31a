"""The tuning's part of a sweep's outputs (docs/USAGE.md, "Tuning"): in ``table.md`` each study's chosen values, its
trials by state and its best held-out result; ``tuning.png``, the expected best held-out result against the number of
trials, per study (Dodge et al. 2019, "Show Your Work": a budget is enough where the curves have flattened); each
study's Optuna parallel-coordinate and parameter-importance plots (``parallel_coordinate.png``, ``importance.png``
in its folder); and every trial for ``sweep.json``. Written from the studies' ``study.json`` files."""
import os

from sweeping.launch import shown
from sweeping.tune import read_study, studies_of


def expected_best(values, n, larger_is_better=True):
    """The expected best of ``n`` trials drawn with replacement from ``values`` (Dodge et al. 2019, eq. 1): with the
    values sorted from worst to best, ``sum_i v_(i) * ((i / N)^n - ((i - 1) / N)^n)``."""
    ordered = sorted(values, reverse=not larger_is_better)
    total = len(ordered)
    return sum(v * ((i / total) ** n - ((i - 1) / total) ** n) for i, v in enumerate(ordered, start=1))


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
           f'{spec.split_seed}), which the trials never train on; no trial reads the test split. The seeded cells '
           'below ran with the chosen values on the whole training set and read the test split once.', '',
           '| study | chosen values | trials (complete / pruned / diverged / running) | best held-out | trial |',
           '| --- | --- | --- | --- | --- |']
    for record in studies:
        trials = record.get('trials', [])
        counts = {s: sum(1 for t in trials if t['state'] == s) for s in ('complete', 'pruned', 'diverged')}
        running = len(trials) - sum(counts.values())
        best = record.get('best')
        chosen = os.path.isfile(os.path.join(record['folder'], 'best.json'))
        values = ', '.join(f'{k} {fmt(v)}' for k, v in best['params'].items()) if best else '—'
        out.append(f'| {record["label"]} | {values if chosen else f"(not chosen yet) {values}"} | '
                   f'{len(trials)} of {spec.trials}: {counts["complete"]} / {counts["pruned"]} / '
                   f'{counts["diverged"]} / {running} | {fmt(best["value"]) if best else "—"} | '
                   f'{best["number"] if best else "—"} |')
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

    from sweeping.tune import storage_of
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
