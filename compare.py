"""Collect several runs' final metrics into one markdown table (mean +- std over seeds).

    python compare.py "SupCon=save/ablation/*/supcon/linear" "CE=save/ablation/*/ce/linear" [--out table.md]
    python compare.py ... --train_metrics train/collapse/z_std_enc,train/carrot/L

Each argument is ``LABEL=PATTERN``: every ``results.json`` at or below the folders the glob matches
(one per seed or trial) becomes one sample of that row. A bare ``PATTERN`` is its own label.
``--train_metrics`` adds the last epoch's value of those ``metrics.csv`` columns of the run that was
evaluated (the pre-training run a linear evaluation read, or the CE run itself) and a ``collapse
warnings`` column: how many of those runs the collapse monitor (``monitors.CollapseWatch``) flags
when their epochs are replayed through it.
"""
import argparse
import csv
import glob
import json
import math
import os
import sys

from monitors import CollapseWatch
from util import UserError, run_cli

COLUMNS = [('final_test_acc', 'test top-1 (%)', 2), ('final_test_ece', 'ECE', 4), ('final_test_nll', 'NLL', 4),
           ('final_test_many_acc', 'many-shot (%)', 2), ('final_test_medium_acc', 'medium-shot (%)', 2),
           ('final_test_few_acc', 'few-shot (%)', 2)]


def find_results(pattern):
    found = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isfile(match) and match.endswith('.json'):
            found.append(match)
        else:
            found += sorted(glob.glob(os.path.join(match, '**', 'results.json'), recursive=True))
    return found


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
    rows = []
    if os.path.isfile(os.path.join(folder, 'metrics.csv')):
        with open(os.path.join(folder, 'metrics.csv'), newline='') as f:
            rows = list(csv.DictReader(f))
    for name in names:
        if rows and rows[-1].get(name):
            results[f'train:{name}'] = float(rows[-1][name])
    # replay the run's epochs through the collapse monitor (the thresholds in force now)
    watch = CollapseWatch()
    results['train:warned'] = float(any(
        watch.check(int(row['epoch']), {k: float(v) for k, v in row.items() if v and k != 'epoch'})
        for row in rows))


def table(rows, train_metrics=()):
    """``rows``: [(label, [results dicts])] -> markdown (columns present in any run)."""
    cols = [c for c in COLUMNS if any(c[0] in r for _, rs in rows for r in rs)]
    cols += [(f'train:{name}', f'{name} (last epoch)', 4) for name in train_metrics]
    heads = [c[1] for c in cols] + (['collapse warnings'] if train_metrics else [])
    lines = ['| run | seeds | ' + ' | '.join(heads) + ' |', '| --- | --- |' + ' --- |' * len(heads)]
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
        lines.append(f'| {label} | {len(results)} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('runs', nargs='+', help='LABEL=PATTERN (glob of run folders or results.json files)')
    p.add_argument('--out', default='', help='also write the table to this file')
    p.add_argument('--train_metrics', default='',
                   help='comma-separated metrics.csv columns of the evaluated runs (last epoch), e.g. '
                        'train/collapse/z_std_enc; adds a collapse-warnings count')
    args = p.parse_args(argv)
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
            if train_metrics:
                add_training_metrics(path, results[-1], train_metrics)
        if not results:
            raise UserError(f'no results.json found for {pattern!r}')
        rows.append((label or pattern, results))
    text = table(rows, train_metrics)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')


if __name__ == '__main__':
    run_cli(lambda: main(sys.argv[1:]))
