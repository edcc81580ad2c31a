"""The end of a sweep (``sweep.py``): ``table.md`` (with ``tune:`` first the tuning section, ``tuning/report.py``; then
each ``compare:`` table through ``compare.table``: mean ± std over seeds, paired differences from the baseline),
``figure.png`` (one per further table) and ``sweep.json`` (every cell: its flags, state, folders, results; every
trial), written from the cells' folders and records, never from memory."""
import json
import math
import os
import time

import compare
from sweeping import launch
from sweeping import plan as sweep_plan
from sweeping.launch import shown
from sweeping.plan import STAGE1


def result_of(cell, evaluation):
    """The results.json path that stands for ``cell`` in a table of ``evaluation``: that evaluation's, or (a cell
    without it: main_ce.py's) its stage 1's own."""
    stage = cell.stage(evaluation) if evaluation else None
    return (stage or cell.stage(STAGE1)).result()


def groups_of(sweep, table, cells):
    """``[(group label, [(row label, [(cell, stage name, results.json path)])])]`` of one ``compare:`` table."""
    by = table['by']
    groups = {}
    for cell in cells:
        if cell.method not in table['methods']:
            continue
        group = ', '.join(f'{a}={cell.axes[a]}' for a in by)
        rest = ', '.join(f'{a}={v}' for a, v in cell.axes.items() if a not in by)
        if table['rows'] == 'method':
            entries = [(cell.method + (f', {rest}' if rest else ''), table['evaluation'])]
        else:
            stages = [s.name for s in cell.stages if s.name != STAGE1]
            entries = [((f'{cell.method} ' if len(table['methods']) > 1 else '') + s + (f', {rest}' if rest else ''),
                        s) for s in stages]
        for label, evaluation in entries:
            stage = evaluation if evaluation and cell.stage(evaluation) else STAGE1
            groups.setdefault(group, {}).setdefault(label, []).append((cell, stage, result_of(cell, evaluation)))
    return [(g, list(rows.items())) for g, rows in groups.items()]


def baseline_label(table, rows):
    base = table.get('baseline')
    if base is None:
        return None
    base = str(base)
    return next((label for label, _ in rows if label == base or label.startswith(f'{base}, ')), None)


def left_out(missing):
    """The table's lines for the rows' entries without a result, by why: ``missing`` is ``[(why, entry)]``."""
    words = {'failed': 'Failed (left out; --retry-failed runs them again)',
             'done': 'Done without a result of their own (pre-training alone: add linear: or evaluations: to the file '
                     'to evaluate them)',
             'unreadable': 'Left out, their results.json cannot be read (cut short?): run them again by deleting it',
             'pending': 'Not done yet (left out)'}
    out = []
    for why, text in words.items():
        entries = [entry for w, entry in missing if w == why]
        if entries:
            out += [f'{text}: {", ".join(entries)}.', '']
    return out


def write_results(sweep, cells, now):
    """``table.md``, ``figure.png`` (one per further table) and ``sweep.json`` in the sweep's folder. Returns their
    paths (the table and figures only where some cell has a result) and the problems the tables found (a
    ``compare:`` metric that no result holds), each one line."""
    os.makedirs(sweep.folder, exist_ok=True)
    written = {'sweep.json': os.path.join(sweep.folder, 'sweep.json')}
    lines = [f'# Sweep {sweep.name}', '']
    if sweep.description:
        lines += [sweep.description, '']
    lines += [f'From `{shown(sweep.path)}`, {len(cells)} cells; '
              f'{sum(1 for s in now.values() if s == "done")} of {len(now)} stages done.', '']
    figures, problems, tuning = [], [], None
    if sweep.tune is not None:          # the tuning first: the chosen values, then the test comparison
        from sweeping.tuning import report as tune_report
        tuning = tune_report.write(sweep, lines, written)
    for i, table in enumerate(sweep.compare):
        metric = table['metric']
        title = table['name'] if len(sweep.compare) > 1 else None
        panels = []
        for group, rows in groups_of(sweep, table, cells):
            read_rows, missing = [], []
            for label, entries in rows:
                results = []
                for cell, stage, path in entries:
                    state = now.get((cell.name, stage), 'pending')
                    if state not in ('failed', 'done') and now.get((cell.name, STAGE1)) == 'failed':
                        state = 'failed'        # its pre-training failed: its evaluation is not coming
                    if path is None:
                        why = state if state in ('failed', 'done') else 'pending'
                        missing.append((why, f'{label} seed {cell.seed}'))
                        continue
                    try:
                        with open(path) as f:
                            result = json.load(f)
                    except (OSError, ValueError):
                        missing.append(('unreadable', f'{label} seed {cell.seed} ({shown(path)})'))
                        continue
                    if table['train_metrics']:
                        compare.add_training_metrics(path, result, table['train_metrics'])
                    results.append(result)
                if results:
                    read_rows.append((label, results))
            heading = ' — '.join(x for x in (title, group) if x)
            if heading:
                lines += [f'## {heading}', '']
            if not read_rows:
                lines += ['No results yet.', '', *left_out(missing)]
                continue
            held = {key for _, results in read_rows for r in results for key in r}
            if metric not in held:
                known = sorted(k for k in held if k.startswith('final_'))
                problems.append(f'{sweep.path}: compare{f" {title}" if title else ""}.metric {metric!r} is in no '
                                f'result (they hold {", ".join(known) or "none of the final_ metrics"})')
                lines += [f'No result holds the metric {metric!r}.', *left_out(missing)]
                continue
            base = baseline_label(table, read_rows)
            lines += [compare.table(read_rows, table['train_metrics'], base, metric), '']
            lines += left_out(missing)
            panels.append((group, read_rows, base))
        if panels:
            name = 'figure.png' if i == 0 else f'figure_{sweep_plan.folder_part(table["name"])}.png'
            figure(panels, metric, os.path.join(sweep.folder, name), title or sweep.name)
            figures.append(name)
    if any(s == 'done' for s in now.values()) or tuning:
        with open(os.path.join(sweep.folder, 'table.md'), 'w') as f:
            f.write('\n'.join(lines).rstrip() + '\n')
        written['table.md'] = os.path.join(sweep.folder, 'table.md')
        for name in figures:
            written[name] = os.path.join(sweep.folder, name)
    record = {'sweep': sweep.name, 'file': os.path.abspath(sweep.path), 'folder': sweep.folder,
              'written': time.strftime('%Y-%m-%d %H:%M:%S'), 'cells': []}
    if tuning is not None:
        record['tuning'] = tuning
    for cell in cells:
        cell_record = launch.read_record(cell.folder)
        record['cells'].append({
            'name': cell.name, 'method': cell.method, 'axes': cell.axes, 'seed': cell.seed, 'folder': cell.folder,
            'stages': {s.name: {'state': now[(cell.name, s.name)], 'script': s.script, 'flags': s.argv,
                                'run_folder': s.run() if isinstance(s.run(), str) else None, 'result': s.result(),
                                **{k: cell_record.get(s.name, {}).get(k) for k in ('seconds', 'attempts', 'exit',
                                                                                  'last_line', 'command')}}
                       for s in cell.stages}})
    with open(written['sweep.json'], 'w') as f:
        json.dump(record, f, indent=2)
    return written, problems


def metric_range(metric):
    """``(low, high)`` a metric can take (``None``: no bound): accuracies in %, ECE in [0, 1], NLL >= 0."""
    if metric.endswith('_acc') or metric.endswith('/acc'):
        return 0.0, 100.0
    if metric.endswith('_ece'):
        return 0.0, 1.0
    if metric.endswith('_nll'):
        return 0.0, None
    return None, None


COLOURS = {'tab:green': 'above the baseline (paired, Holm p < 0.05)', 'tab:red': 'below it (Holm p < 0.05)',
           'tab:grey': 'no difference shown (Holm p >= 0.05)'}


def figure(panels, metric, path, title):
    """Each row's ``metric`` (mean and its 95 % t interval over seeds), one panel per group; the baseline's mean as a
    dashed line, each other row coloured only when its paired difference from it is significant after Holm's
    adjustment across the panel's comparisons (as in its table), the difference and its interval in the right
    margin. A legend explains the colours; the axis stays within what the metric can take, and an
    interval that reaches past it is drawn to the edge and marked with an arrow."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from scipy.stats import t
    low, high = metric_range(metric)
    height = max(2.8, 0.34 * max(len(rows) for _, rows, _ in panels) + 1.8)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels) + 2, height), squeeze=False, sharey=True)
    used = set()
    for ax, (group, rows, base) in zip(axes[0], panels):
        labels = [label for label, _ in rows]
        compared = compare.comparisons(rows, base, metric) if base is not None else {}
        points = []
        for y, (label, results) in enumerate(rows):
            values = [r[metric] for r in results if metric in r]
            if not values:
                continue
            mean, sd = compare.mean_std(values)
            half = float(t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values)) if sd is not None else 0
            colour, n = 'black', 0
            if base is not None and label != base:
                e = compared[label]
                n, diff, dhalf = e['n'], e['mean'], e['half']
                shown = e['holm'] is not None and e['holm'] < compare.ALPHA
                colour = 'tab:grey' if not shown else 'tab:green' if diff > 0 else 'tab:red'
                used.add(colour)
            points.append((y, mean, half, colour))
            if base is not None and label != base and n:
                ax.annotate(f'{diff:+.2f}' + (f' [{diff - dhalf:+.2f}, {diff + dhalf:+.2f}]' if dhalf else ''),
                            xy=(1.02, y), xycoords=('axes fraction', 'data'), ha='left', va='center', fontsize=7,
                            color=colour, annotation_clip=False)
        lo = min(m - h for _, m, h, _ in points) if points else 0
        hi = max(m + h for _, m, h, _ in points) if points else 1
        pad = 0.05 * (hi - lo or 1)
        means = [m for _, m, _, _ in points] or [0.0]
        left = lo - pad if low is None else min(max(low, lo - pad), min(means))     # a mean is never cut off
        right = hi + pad if high is None else max(min(high, hi + pad), max(means))
        for y, mean, half, colour in points:
            a, b = max(mean - half, left), min(mean + half, right)
            ax.errorbar(mean, y, xerr=[[mean - a], [b - mean]], fmt='o', color=colour, capsize=3)
            for end, cut, mark in ((a, mean - half < left, '<'), (b, mean + half > right, '>')):
                if cut:                                   # the interval goes on past what the metric can take
                    ax.plot(end, y, marker=mark, color=colour, markersize=6, clip_on=False)
        ax.set_xlim(left, right)
        if base is not None:
            values = [r[metric] for r in dict(rows)[base] if metric in r]
            if values:
                ax.axvline(sum(values) / len(values), color='black', linestyle='--', linewidth=0.8)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        name = dict((c[0], c[1]) for c in compare.COLUMNS).get(metric, metric)
        ax.set_xlabel(f'{name}: mean and 95 % CI over seeds', fontsize=8)
        ax.set_title(group or '', fontsize=9)
        ax.grid(axis='x', alpha=0.3)
    axes[0][0].invert_yaxis()           # shared: the first row on top, once
    handles = []
    if any(b for _, _, b in panels):
        handles.append(Line2D([], [], color='black', linestyle='--', linewidth=0.8, label='the baseline\'s mean'))
        handles += [Line2D([], [], color=c, marker='o', linestyle='', label=text) for c, text in COLOURS.items()
                    if c in used]
        handles.append(Line2D([], [], color='none', label='right: the paired difference [95 % CI]'))
    if any(h.get_marker() in ('<', '>') for ax in axes[0] for h in ax.lines):
        handles.append(Line2D([], [], color='black', marker='>', linestyle='', label='interval past the axis\'s end'))
    if handles:
        fig.legend(handles=handles, loc='lower center', ncol=min(3, len(handles)), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.12 if handles else 0, 0.9, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
