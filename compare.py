"""Collect several runs' final metrics into one markdown table (mean +- std over seeds).

    python compare.py "SupCon=save/ablation/*/supcon/linear" "CE=save/ablation/*/ce/linear" [--out table.md]
    python compare.py ... --train_metrics train/collapse/z_std_enc,train/carrot/L

Each argument is ``LABEL=PATTERN``: every ``results.json`` at or below the folders the glob matches
(one per seed or trial) becomes one sample of that row. A bare ``PATTERN`` is its own label.
``--train_metrics`` adds the last epoch's value of those ``metrics.csv`` columns of the run that was
evaluated (the pre-training run a linear evaluation read, or the CE run itself) and a ``collapse
warnings`` column: how many of those runs the collapse monitor (``monitors.CollapseWatch``) flags
when their epochs are replayed through it.

``--baseline LABEL`` adds, for every other row, the paired difference of ``--paired_metric`` (default: test
top-1) from the baseline row over the seeds both rows have (runs paired by their ``--seed``): the mean
difference with a 95 % confidence interval from Student's t over seeds (``mean ± t(0.975, n - 1) · sd / √n``)
and whether that interval excludes 0, then the comparison's power: the paired t test's p-value adjusted by Holm's
method across the table's comparisons, the smallest difference the seeds detect at 80 % power (two-sided, level
0.05, from the observed spread of the differences), the seeds the observed difference needs for 80 % power, and the
seeds on which the row beats the baseline. Seeds-matched differences remove the share of the variance that a seed
gives both methods alike (the data order, the initialization), which unpaired mean ± std columns keep.

A linear probe that diverged (``probe_diverged`` in its results.json: main_linear.py's check) is marked: its row's
label carries ``†`` and a note under the table counts them. Its seed is left out of the paired differences (on both
sides) unless ``--include_diverged``.
"""
import glob
import json
import math
import os
import sys

import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

from config.cli import run_cli
from core.flags import Parser, UserError
from runtime.run_folder import writable_folder
from runtime.run_log import read_metrics
from training.monitors import CollapseWatch

COLUMNS = [('final_test_acc', 'test top-1 (%)', 2), ('final_test_ece', 'ECE', 4), ('final_test_nll', 'NLL', 4),
           ('final_test_many_acc', 'many-shot (%)', 2), ('final_test_medium_acc', 'medium-shot (%)', 2),
           ('final_test_few_acc', 'few-shot (%)', 2), ('final_test_knn_acc', 'kNN top-1 (%)', 2),
           ('final_test_within_superclass_acc', 'within-superclass (%)', 2)]


def find_results(pattern):
    found = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isfile(match) and match.endswith('.json'):
            found.append(match)
        else:
            found += sorted(glob.glob(os.path.join(match, '**', 'results.json'), recursive=True))
    return found


def check_numbers(path, results, keys):
    """A :class:`UserError` unless ``results`` (read from ``path``) is an object whose ``keys``, where present, are
    numbers and whose ``config.seed``, where present, is an integer (``null`` or a string there: one line)."""
    if not isinstance(results, dict):
        raise UserError(f'{path} is not a results.json (a JSON object), it holds a {type(results).__name__}')
    for key in keys:
        value = results.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f'{path}: {key} is {json.dumps(value)}, not a number')
    config = results.get('config', {})
    if not isinstance(config, dict):
        raise UserError(f'{path}: config is {json.dumps(config)}, not an object')
    seed = config.get('seed', 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UserError(f'{path}: config.seed is {json.dumps(seed)}, not an integer')


def mean_std(values):
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def trained_run(path, results):
    """The folder of the run whose representation ``results`` (a results.json at ``path``) evaluated."""
    ckpt = results.get('ckpt')
    return os.path.dirname(ckpt) if ckpt else os.path.dirname(path)


def add_training_metrics(path, results, names):
    """Copy the last ``metrics.csv`` row's ``names`` of the evaluated run into ``results`` (as
    ``train:<name>``), and ``train:warned`` (1 if the run wrote a collapse warning, else 0)."""
    folder = trained_run(path, results)
    rows = read_metrics(folder)
    for name in names:
        if rows and rows[-1].get(name):
            results[f'train:{name}'] = float(rows[-1][name])
    # replay the run's epochs through the collapse monitor (the thresholds in force now)
    watch = CollapseWatch()
    results['train:warned'] = float(any(
        watch.check(int(row['epoch']), {k: float(v) for k, v in row.items() if v and k != 'epoch'})
        for row in rows))


def diverged(result):
    """Whether a results.json says its linear probe diverged (main_linear.py's ``probe_diverged``)."""
    return result.get('probe_diverged') is True


def paired_difference(results, baseline, key, include_diverged=False):
    """``(n, mean, half-width of the 95 % t interval or None)`` of ``results[key] - baseline[key]`` over the seeds
    both lists have (``config.seed``; each seed at most once per list). A seed whose probe diverged on either side is
    left out unless ``include_diverged``."""
    diffs = paired_diffs(results, baseline, key, include_diverged)
    if not diffs:
        return 0, None, None
    mean, sd = mean_std(diffs)
    if sd is None:
        return 1, mean, None
    from scipy.stats import t
    return len(diffs), mean, float(t.ppf(0.975, len(diffs) - 1)) * sd / math.sqrt(len(diffs))


def paired_diffs(results, baseline, key, include_diverged=False):
    """``results[key] - baseline[key]`` per seed both have, in seed order (:func:`paired_difference`'s pairing)."""
    def by_seed(rs):
        seeds, skipped = {}, set()
        for r in rs:
            seed = r.get('config', {}).get('seed')
            if seed is None:
                raise UserError('cannot pair runs by seed: a results.json has no config.seed')
            if seed in seeds or seed in skipped:
                raise UserError(f'cannot pair runs by seed: seed {seed} occurs twice in one row')
            if diverged(r) and not include_diverged:
                skipped.add(seed)
            elif key in r:
                seeds[seed] = r[key]
        return seeds, skipped
    (mine, mine_skipped), (base, base_skipped) = by_seed(results), by_seed(baseline)
    common = sorted(set(mine) & set(base) - mine_skipped - base_skipped)
    return [mine[s] - base[s] for s in common]


# ---------------------------------------------------------------- the power of a paired comparison
POWER, ALPHA = 0.8, 0.05        # the power a comparison is planned for, at the two-sided level ALPHA
MOST_SEEDS = 100_000


def power(delta, sd, n, alpha=ALPHA):
    """The power of the two-sided paired t test on ``n`` seeds whose differences spread with ``sd`` against a true
    mean difference ``delta``: P(|T| > t(1 - alpha/2, n - 1)), T noncentral t with n - 1 degrees of freedom and
    noncentrality delta·√n / sd."""
    from scipy.stats import chi2, nct, norm, t
    df, nc = n - 1, delta * math.sqrt(n) / sd
    crit = float(t.ppf(1 - alpha / 2, df))
    value = float(nct.sf(crit, df, nc) + nct.cdf(-crit, df, nc))
    if math.isnan(value):         # scipy's noncentral t fails far out (few degrees of freedom): its definition
        from scipy import integrate
        value = integrate.quad(lambda v: chi2.pdf(v, df) * (norm.sf(crit * math.sqrt(v / df) - nc)
                                                             + norm.cdf(-crit * math.sqrt(v / df) - nc)),
                               0, math.inf, limit=200)[0]
    return min(1.0, value)


def detectable(sd, n, target=POWER):
    """The smallest mean difference that ``n`` seeds with spread ``sd`` detect with power ``target`` (the minimum
    detectable effect); ``None`` below 2 seeds, 0 when the differences do not spread."""
    if n < 2:
        return None
    if sd == 0:
        return 0.0
    from scipy.optimize import brentq
    high = sd
    while power(high, sd, n) < target:
        high *= 2
    return float(brentq(lambda d: power(d, sd, n) - target, 0.0, high, xtol=1e-12 * sd))


def seeds_needed(delta, sd, target=POWER):
    """The fewest seeds (at least 2) whose paired t test detects a true difference ``delta`` with power ``target``,
    for differences that spread with ``sd``; ``None`` for no difference or beyond :data:`MOST_SEEDS`."""
    if delta == 0:
        return None
    if sd == 0:
        return 2
    low, high = 2, 2
    while power(abs(delta), sd, high) < target:
        low, high = high + 1, high * 2
        if high > 2 * MOST_SEEDS:
            return None
    while low < high:                               # power grows with n: the first n that reaches target
        mid = (low + high) // 2
        low, high = (mid + 1, high) if power(abs(delta), sd, mid) < target else (low, mid)
    return low if low <= MOST_SEEDS else None


def p_value(diffs):
    """The two-sided paired t test's p-value of mean 0 for the differences ``diffs`` (at least 2)."""
    from scipy.stats import t
    mean, sd = mean_std(diffs)
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(len(diffs))), len(diffs) - 1))


def holm(pvalues):
    """Holm's step-down adjustment of ``pvalues`` (``{name: p}``): the k-th smallest of m times (m - k + 1), made
    monotone, at most 1. It bounds the chance of any false claim among the table's comparisons by the level."""
    order = sorted(pvalues, key=pvalues.get)
    out, running = {}, 0.0
    for k, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * pvalues[name]))
        out[name] = running
    return out


def comparisons(rows, baseline, key, include_diverged=False):
    """``{label: {n, mean, half, sd, p, holm, detectable, seeds_needed, wins}}`` of each row against ``baseline``:
    the paired difference and its 95 % interval, the paired t test's p-value and its Holm adjustment across these
    rows, the smallest difference these seeds detect at 80 % power, the seeds the observed difference needs for 80 %
    power, and the share of seeds on which the row beats the baseline."""
    out = {}
    for label, results in rows:
        if label == baseline:
            continue
        diffs = paired_diffs(results, dict(rows)[baseline], key, include_diverged)
        n, mean, half = paired_difference(results, dict(rows)[baseline], key, include_diverged)
        entry = {'n': n, 'mean': mean, 'half': half, 'sd': None, 'p': None, 'holm': None, 'detectable': None,
                 'seeds_needed': None, 'wins': (sum(d > 0 for d in diffs), n)}
        if n >= 2:
            sd = mean_std(diffs)[1]
            entry.update(sd=sd, p=p_value(diffs), detectable=detectable(sd, n), seeds_needed=seeds_needed(mean, sd))
        out[label] = entry
    adjusted = holm({label: e['p'] for label, e in out.items() if e['p'] is not None})
    for label, p in adjusted.items():
        out[label]['holm'] = p
    return out


PAIRED_HEADS = ['CI excludes 0', 'Holm p', 'detectable at 80 % power', 'seeds for 80 % power', 'seeds better']


def paired_cells(label, baseline, compared):
    """The row's cells under the paired columns (``compared``: :func:`comparisons`)."""
    if label == baseline:
        return ['(baseline)'] + [''] * len(PAIRED_HEADS)
    e = compared[label]
    n, mean, half = e['n'], e['mean'], e['half']
    if n == 0:
        return ['no common seeds'] + [''] * len(PAIRED_HEADS)
    wins = f'{e["wins"][0]}/{n}'
    if half is None:
        return [f'{mean:+.2f} (1 seed)', '', '', '', '', wins]
    needed = e['seeds_needed']
    return [f'{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] (n={n})',
            'yes' if mean - half > 0 or mean + half < 0 else 'no', f'{e["holm"]:.3g}', f'±{e["detectable"]:.2f}',
            '—' if e['mean'] == 0 else str(needed) if needed else f'> {MOST_SEEDS:,}', wins]


def table(rows, train_metrics=(), baseline=None, paired_metric='final_test_acc', include_diverged=False):
    """``rows``: [(label, [results dicts])] -> markdown (columns present in any run)."""
    cols = [c for c in COLUMNS if any(c[0] in r for _, rs in rows for r in rs)]
    cols += [(f'train:{name}', f'{name} (last epoch)', 4) for name in train_metrics]
    heads = [c[1] for c in cols] + (['collapse warnings'] if train_metrics else [])
    if baseline is not None:
        if baseline not in dict(rows):
            raise UserError(f'--baseline {baseline!r} is not one of the rows ({", ".join(label for label, _ in rows)})')
        name = dict((c[0], c[1]) for c in COLUMNS).get(paired_metric, paired_metric)
        heads += [f'Δ {name} vs {baseline} (95 % CI, paired t over seeds)', *PAIRED_HEADS]
        compared = comparisons(rows, baseline, paired_metric, include_diverged)
    lines = ['| run | seeds | ' + ' | '.join(heads) + ' |', '| --- | --- |' + ' --- |' * len(heads)]
    notes = []
    for label, results in rows:
        cells = []
        for key, _, digits in cols:
            values = [r[key] for r in results if key in r]
            if not values:
                cells.append('')
                continue
            mean, std = mean_std(values)
            cells.append(f'{mean:.{digits}f}' + ('' if std is None else f' ± {std:.{digits}f}'))
        if train_metrics:
            cells.append(f'{int(sum(r["train:warned"] for r in results))}/{len(results)}')
        if baseline is not None:
            cells += paired_cells(label, baseline, compared)
        n_diverged = sum(diverged(r) for r in results)
        if n_diverged:
            notes.append(f'{label}: {n_diverged} of {len(results)}')
        lines.append(f'| {label}{" †" if n_diverged else ""} | {len(results)} | ' + ' | '.join(cells) + ' |')
    if baseline is not None:
        lines += ['', f'Paired over seeds against {baseline}: Holm p is the paired t test\'s p-value adjusted '
                      f'(Holm) across the {len(compared)} comparison{"" if len(compared) == 1 else "s"} of this table; '
                      '"detectable at 80 % power" is the '
                      'smallest true difference these seeds would find in 80 % of repeats (two-sided, level 0.05, from '
                      'the observed spread of the differences); "seeds for 80 % power" is how many seeds the observed '
                      'difference would need; "seeds better" counts the seeds on which the row beats the baseline.']
    if notes:
        lines += ['', '† linear probes that diverged (probe_diverged in results.json; their accuracy is in the '
                      f'means): {"; ".join(notes)}. '
                  + ('They are in the paired differences (--include_diverged).' if include_diverged else
                     'Their seeds are left out of the paired differences (--include_diverged keeps them).'
                     if baseline is not None else '')]
    return '\n'.join(lines)


def main(argv=None):
    p = Parser(description=__doc__.split('\n')[0])
    p.add_argument('runs', nargs='+', help='LABEL=PATTERN (glob of run folders or results.json files)')
    p.add_argument('--out', default='', help='also write the table to this file')
    p.add_argument('--train_metrics', default='',
                   help='comma-separated metrics.csv columns of the evaluated runs (last epoch), e.g. '
                        'train/collapse/z_std_enc; adds a collapse-warnings count')
    p.add_argument('--baseline', default=None, help='a row label: add paired differences from it over seeds')
    p.add_argument('--paired_metric', default='final_test_acc',
                   help='the results.json key the paired differences use (default: final_test_acc)')
    p.add_argument('--include_diverged', action='store_true',
                   help='keep the seeds whose linear probe diverged in the paired differences (marked either way)')
    args = p.parse_args(argv)
    if args.out:      # checked before any work
        if os.path.isdir(args.out):
            raise UserError(f'--out {args.out} is a folder: give a file name')
        writable_folder(os.path.dirname(os.path.abspath(args.out)), '--out')
    train_metrics = [m for m in args.train_metrics.split(',') if m]
    rows = []
    for arg in args.runs:
        label, _, pattern = arg.partition('=') if '=' in arg else ('', '', arg)
        results = []
        for path in find_results(pattern):
            try:
                with open(path) as f:
                    results.append(json.load(f))
            except (OSError, ValueError) as e:
                raise UserError(f'cannot read {path}: {e}') from None
            check_numbers(path, results[-1], [c[0] for c in COLUMNS] + [args.paired_metric])
            if train_metrics:
                add_training_metrics(path, results[-1], train_metrics)
        if not results:
            raise UserError(f'no results.json found for {pattern!r}')
        rows.append((label or pattern, results))
    text = table(rows, train_metrics, args.baseline, args.paired_metric, args.include_diverged)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')


if __name__ == '__main__':
    run_cli(lambda: main(sys.argv[1:]))
