"""Collect several runs' final metrics into one markdown table (mean +- std over seeds).

    python compare.py "SupCon=save/ablation/*/supcon/linear" "CE=save/ablation/*/ce/linear" [--out table.md]

Each argument is ``LABEL=PATTERN``: every ``results.json`` at or below the folders the glob matches
(one per seed or trial) becomes one sample of that row. A bare ``PATTERN`` is its own label.
"""
import argparse
import glob
import json
import math
import os
import sys

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


def table(rows):
    """``rows``: [(label, [results dicts])] -> markdown (columns present in any run)."""
    cols = [c for c in COLUMNS if any(c[0] in r for _, rs in rows for r in rs)]
    lines = ['| run | seeds | ' + ' | '.join(c[1] for c in cols) + ' |',
             '| --- | --- |' + ' --- |' * len(cols)]
    for label, results in rows:
        cells = []
        for key, _, digits in cols:
            values = [r[key] for r in results if key in r]
            if not values:
                cells.append('')
                continue
            mean, std = mean_std(values)
            cells.append(f'{mean:.{digits}f}' + ('' if std is None else f' ± {std:.{digits}f}'))
        lines.append(f'| {label} | {len(results)} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('runs', nargs='+', help='LABEL=PATTERN (glob of run folders or results.json files)')
    p.add_argument('--out', default='', help='also write the table to this file')
    args = p.parse_args(argv)
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
        if not results:
            raise UserError(f'no results.json found for {pattern!r}')
        rows.append((label or pattern, results))
    text = table(rows)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')


if __name__ == '__main__':
    run_cli(lambda: main(sys.argv[1:]))
