"""8. A user's recipe as it runs: ``scripts/supcon_cifar.sh`` on CIFAR-10-layout files."""
import json
import os
import re
import signal
import subprocess
import threading
import time

from benchmarks.gpu_check.common import PY, ROOT, outcome, tail
from benchmarks.gpu_check.recipe import epoch_times, run_folder, write_cifar10
from runtime import processes

USER_RECIPE_EPOCHS = 4        # the first (it compiles) and three steady ones


def timed_lines(cmd, log, timeout, env=None):
    """``cmd`` in the repo root, each output line with the seconds since the start at which it came (into ``log``
    too); ``(exit status or 'timed out', [(seconds, line)])``."""
    start = time.monotonic()
    lines = []
    with open(log, 'a') as f:
        f.write(f'\n$ {" ".join(map(str, cmd))}\n')
        proc = processes.start([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})},
                               start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            for line in proc.stdout:
                lines.append((time.monotonic() - start, line.rstrip('\n')))
                f.write(line)
            code = proc.wait()
        finally:
            timed_out = not timer.is_alive() and proc.returncode not in (0, None) and \
                time.monotonic() - start >= timeout
            timer.cancel()
    return ('timed out' if timed_out else code), lines


def epoch_ends(lines):
    """``{epoch: seconds}``: when each ``epoch N/E (...)`` line of a run came."""
    out = {}
    for t, line in lines:
        m = re.match(r'epoch (\d+)/\d+ \(', line.strip())
        if m:
            out[int(m.group(1))] = t
    return out


def user_recipe_rates(n_train, ends, train_times, wall, epochs_total=1000):
    """The recipe's figures from one run: ``ends`` (when each epoch's line came, s), ``train_times`` (metrics'
    ``train/epoch_time`` per epoch), ``wall`` (the whole command, s). Images count both views. The steady epoch is
    the mean of the epochs after the first (wall: from the first epoch's line to the last's, so a per-epoch
    evaluation or checkpoint counts); the projection is the run's time to the end of its first epoch plus
    ``epochs_total - 1`` steady epochs."""
    epochs = sorted(ends)
    if len(epochs) < 2:
        raise ValueError('the run needs two epochs at least for a steady rate')
    steady_wall = (ends[epochs[-1]] - ends[epochs[0]]) / (len(epochs) - 1)
    steady_train = sum(train_times[1:]) / len(train_times[1:])
    images = 2 * n_train
    projection = ends[epochs[0]] + (epochs_total - 1) * steady_wall
    return {'first_epoch_s': ends[epochs[0]], 'steady_epoch_wall_s': steady_wall,
            'steady_epoch_train_s': steady_train, 'images_per_s_wall': images / steady_wall,
            'images_per_s_train': images / steady_train, 'wall_s': wall,
            'projection_s': projection, 'projection_epochs': epochs_total}


def benchmark_best(work, model='resnet50', batch=1024):
    """Section 4's best ``ours SupCon`` rate (compiled or not) for ``model`` at ``batch`` in this same check, or
    ``None`` where it did not run."""
    path = os.path.join(os.path.dirname(work), 'throughput', 'throughput.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        report = json.load(f)
    for config in report.get('configs', []):
        if config['model'] == model and config['batch'] == batch:
            rates = {k: v for k, v in config['rates'].items() if k.startswith('ours SupCon') and
                     'deterministic' not in k}
            if rates:
                row = max(rates, key=rates.get)
                return row, rates[row]
    return None


def section_user_recipe(ctx):
    n_train, n_test = (256, 64) if ctx.dry else (50_000, 10_000)
    data = write_cifar10(os.path.join(ctx.work, 'data'), n_train, n_test)
    save = os.path.join(ctx.work, 'save')
    # on a GPU the recipe as it is; the dry run shrinks the model and turns compile off (a CPU compiles slowly)
    extra = ['--model', 'resnet_nano', '--size', '8', '--batch_size', '32', '--compile', 'off', '--num_workers',
             '2'] if ctx.dry else []
    # the recipe's 10-epoch warm-up (batch 1024) does not fit a few epochs: one, as the rate does not depend on it
    cmd = ['bash', 'scripts/supcon_cifar.sh', 'cifar10', '--data_folder', data, '--epochs', USER_RECIPE_EPOCHS,
           '--warm_epochs', '1', '--save_folder', save, *extra]
    shown = ' '.join(map(str, cmd)).replace(data, '<generated>').replace(save, '<save>')
    start = time.monotonic()
    code, lines = timed_lines(cmd, ctx.log, ctx.left(5), env={'PY': PY})
    wall = time.monotonic() - start
    output = '\n'.join(text for _, text in lines)
    if code != 0:
        return outcome(ctx, False, f'`{shown}` {"timed out" if code == "timed out" else f"exited {code}"}:\n\n'
                                   f'```\n{tail(output, 20)}\n```')
    path_line = next((text for _, text in lines if text.startswith('path: ')), '')
    try:
        r = user_recipe_rates(n_train, epoch_ends(lines), epoch_times(run_folder(save)), wall)
    except (ValueError, ZeroDivisionError, TypeError) as e:
        return outcome(ctx, False, f'`{shown}`: {e}\n\n```\n{tail(output, 20)}\n```')
    best = benchmark_best(ctx.work)
    recipe = 'tiny sizes (the dry run)' if ctx.dry else ('the recipe\'s ResNet-50, batch 1024, lr 0.5, temperature '
                                                        '0.1, cosine, `compile: true`; nothing else given')
    rows = [f'`{shown}` ({recipe}), {n_train:,} training and {n_test:,} test images (32x32, random, in '
            f'`cifar-10-batches-py`), {USER_RECIPE_EPOCHS} epochs, alone on the device (after section 4, whose '
            f'compile caches it finds: a first run on a fresh machine compiles longer).', '']
    if path_line:
        rows += [f'The run\'s first line: `{path_line.strip()}`', '']
    rows += ['| | |', '| --- | --- |',
             f'| to the end of epoch 1 (start, data, compile) | {r["first_epoch_s"]:.1f} s |',
             f'| a steady epoch, training only (`train/epoch_time`) | {r["steady_epoch_train_s"]:.2f} s, '
             f'{r["images_per_s_train"]:,.0f} images/s |',
             f'| a steady epoch, wall clock (its evaluation and checkpoints included) | '
             f'{r["steady_epoch_wall_s"]:.2f} s, {r["images_per_s_wall"]:,.0f} images/s |']
    if best:
        r['benchmark_row'], r['benchmark_rate'] = best
        rows.append(f'| section 4\'s best for resnet50 at batch 1024 (`{best[0]}`) | {best[1]:,.0f} images/s: the '
                    f'recipe\'s training rate is {r["images_per_s_train"] / best[1]:.2f} of it, its wall-clock rate '
                    f'{r["images_per_s_wall"] / best[1]:.2f} |')
    else:
        rows.append('| section 4\'s rate | not measured in this check |')
    rows.append(f'| 1000 epochs of {n_train:,} images at this wall-clock rate | {r["projection_s"]:,.0f} s = '
                f'{r["projection_s"] / 3600:.2f} h |')
    return outcome(ctx, True, '\n'.join(rows), r)
