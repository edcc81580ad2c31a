"""7. The field: every ``--method`` (and ``--carrot``, CE, CE + SupCon) on digits, one seed."""
import json
import os
import re
import sys
import time

from benchmarks.gpu_check.common import ROOT, outcome
from benchmarks.gpu_check.fork import Forked
from benchmarks.gpu_check.recipe import epoch_times, run_folder

FIELD_DRY_RUN = ('SupCon', 'RASCAL', 'SupCon + CARROT', 'CE', 'CE + SupCon')


def field_runs(dry=False):
    """``[(name, script, flags)]``: every ``--method`` of the registry, SupCon + CARROT, CE and CE + SupCon; the dry
    run's, :data:`FIELD_DRY_RUN` alone (each script's paths through the section: every method trains end to end on
    the CPU in tests/test_main_supcon.py; with 5 runs instead of 15 the dry run's field section took 7 s, not 23 s)."""
    sys.path.insert(0, ROOT)
    from methods import METHODS
    runs = [(m, 'main_supcon', ['--method', m]) for m in METHODS]
    runs += [('SupCon + CARROT', 'main_supcon', ['--method', 'SupCon', '--carrot']),
             ('CE', 'main_ce', ['--learning_rate', '0.1']),
             ('CE + SupCon', 'main_ce', ['--learning_rate', '0.1', '--supcon_weight', '1'])]
    return [r for r in runs if r[0] in FIELD_DRY_RUN] if dry else runs


def field_one(script, flags, linear_flags):
    """One run in this (forked) process: pre-training (or CE) then, for ``main_supcon``, linear evaluation."""
    import importlib
    importlib.import_module(script).main(flags)
    folder = run_folder(flags[flags.index('--save_folder') + 1])
    out = {'epoch_times': epoch_times(folder)}
    if script == 'main_supcon':
        save = os.path.join(os.path.dirname(flags[flags.index('--save_folder') + 1]), 'linear')
        importlib.import_module('main_linear').main(
            [*linear_flags, '--ckpt', os.path.join(folder, 'last.pth'), '--save_folder', save])
        folder = run_folder(save)
    with open(os.path.join(folder, 'results.json')) as f:
        out['test_acc'] = json.load(f)['final_test_acc']
    return out


FIELD_PARALLEL = 3            # field runs side by side on the GPU (2 in the dry run)
FIELD_RUN_BOUND = 150         # seconds for one run; one stopped earlier by the budget's end is skipped, not failed
FIELD_LINEAR_LR = 0.1         # the probe's learning rate: lr 1 did not converge on resnet18's features (2026-11-26)


def section_field(ctx):
    sys.path.insert(0, ROOT)
    import main_ce  # noqa: F401  (imported before the forks: each child starts from them)
    epochs, lin = ('1', '1') if ctx.dry else ('10', '5')
    size, model = ('8', 'resnet_nano') if ctx.dry else ('32', 'resnet18')
    common = ['--dataset', 'digits', '--size', size, '--model', model, '--batch_size', '128', '--cosine',
              '--augment', 'device', '--num_workers', '0', '--seed', '0', '--device', ctx.device, '--print_freq',
              '1000']
    runs = field_runs(ctx.dry)
    results, order = {}, [name for name, *_ in runs]
    pending, running, skipped = list(runs), {}, []
    parallel = 2 if ctx.dry else FIELD_PARALLEL
    while pending or running:
        while pending and len(running) < parallel:
            name, script, flags = pending.pop(0)
            if ctx.left() < 10:
                skipped.append(name)
                continue
            save = os.path.join(ctx.work, re.sub(r'\W+', '_', name), 'pretrain')
            hyper = [] if script == 'main_ce' else ['--learning_rate', '0.2', '--temp', '0.1']
            argv = [*common, '--epochs', epochs, *hyper, *flags, '--save_folder', save]
            linear = [*common, '--epochs', lin, '--learning_rate', str(FIELD_LINEAR_LR)]
            log = os.path.join(ctx.work, re.sub(r'\W+', '_', name) + '.log')
            bound = min(ctx.left(), FIELD_RUN_BOUND)
            try:
                running[name] = (Forked(field_one, (script, argv, linear), log, bound), log, bound < FIELD_RUN_BOUND)
            except RuntimeError as e:
                results[name] = {'error': str(e)}
        for name, (child, log, by_budget) in list(running.items()):
            try:
                out = child.poll()
            except RuntimeError as e:
                out = {'error': str(e)}
            if out is None:
                continue
            del running[name]
            if by_budget and out.get('error', '').startswith('timed out'):     # the budget's end, not the run's
                skipped.append(name)
                continue
            results[name] = out
            with open(log) as f, open(ctx.log, 'a') as whole:
                whole.write(f'\n--- {name}\n{f.read()}')
        time.sleep(0.2)
    rows = ['| run | seconds per epoch (pre-training) | first epoch (s) | test top-1 (%) |',
            '| --- | --- | --- | --- |']
    data, ok = {}, True
    for name in order:
        if name in skipped:
            rows.append(f'| {name} | skipped: out of time | | |')
            continue
        r = results[name]
        data[name] = r
        if 'error' in r:
            ok = False
            rows.append(f'| {name} | failed: `{r["error"].splitlines()[-1][:120] if r["error"] else "?"}` | | |')
            continue
        times = r['epoch_times']
        steady = times[1:] or times
        rows.append(f'| {name} | {sum(steady) / len(steady):.2f} | {times[0]:.2f} | {r["test_acc"]:.2f} |')
    summary = (f'`--dataset digits --size {size} --model {model} --batch_size 128 --cosine --augment device`, '
               f'{epochs} epochs (lr 0.2, temperature 0.1; CE lr 0.1), linear evaluation {lin} epochs at lr '
               f'{FIELD_LINEAR_LR}; seed 0; {parallel} runs side by side on the device.\n\n' + '\n'.join(rows))
    if skipped:        # runs the budget left no time for are not failures: the next call runs them (--sections 7)
        summary += (f'\n\n{len(skipped)} of {len(rows) - 2} runs skipped: out of time ({", ".join(skipped)}); '
                    'run the section again for them')
        if ok:
            return {'status': 'skipped: out of time', 'summary': summary, 'data': data}
    return outcome(ctx, ok, summary, data)
