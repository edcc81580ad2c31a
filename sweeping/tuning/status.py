"""What ``sweep.py --status`` and the report read of a tuning, without Optuna: a study's mirror (``study.json``), its
progress in one line, and a confirmation run's state from its files."""
import json
import os
import re

from sweeping import launch
from sweeping.tuning.spec import BEST

STUDY = 'study.json'
DIVERGED = re.compile(r'the loss became|steps in a row had non-finite')     # training/loop.py's two stop lines


def read_study(folder):
    """A study's mirror (``study.json``: its trials, budget, best), ``{}`` before it started."""
    try:
        with open(os.path.join(folder, STUDY)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def confirmation_state(cell):
    """A confirmation run's state from its files: ``complete``, ``diverged``, ``failed`` (it crashed: the next call
    continues it) or ``pending`` (not run, or not finished)."""
    record = launch.read_record(cell.folder)
    for stage in cell.stages:
        state = launch.state(stage, record)
        if state == 'failed':
            line = record.get(stage.name, {}).get('last_line', '')
            return 'diverged' if DIVERGED.search(line) else 'failed'
        if state != 'done':
            return 'pending'
    return 'complete'


def progress_line(record, budget, live=True):
    """``'5 of 8 trials: 3 complete, 1 pruned, 1 running; best 97.2 (trial 2)'``. ``live``: whether a process
    drives the sweep now; without one a trial the record holds as running is ``interrupted`` (the next call
    continues it from its checkpoint)."""
    trials = record.get('trials', [])
    counts = {}
    for t in trials:
        name = 'interrupted' if t['state'] == 'running' and not live else t['state']
        counts[name] = counts.get(name, 0) + 1
    order = ('complete', 'diverged', 'pruned', 'running', 'interrupted', 'crashed')
    text = f'{len(trials)} of {budget} trials' + (': ' + ', '.join(f'{counts[s]} {s}' for s in order if s in counts)
                                                  if trials else '')
    if len(trials) > budget:        # the file's budget was lowered after these ran: the next call refuses it
        return (f'{len(trials)} trials, more than the file\'s budget of {budget}: refused (raise tune.trials to '
                f'{len(trials)} or more)')
    runs = record.get('confirmations') or []
    if runs:
        text += f'; confirming: {sum(1 for r in runs if r["state"] in ("complete", "diverged"))} of {len(runs)} runs'
    best = record.get('best')
    if best:
        text += (f'; best {best["value"]:.4g} (trial {best["number"]}'
                 + (f', mean of {len(best["confirmed"]["values"])} seeds)' if best.get('confirmed') else ')'))
    if os.path.isfile(os.path.join(record.get('folder', ''), BEST)):
        text += '; chosen'
    return text
