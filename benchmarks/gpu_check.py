"""The GPU check in one command: everything CUDA-side measured with the machine's own Python as it is, into one report.

    bash scripts/gpu_check.sh [--sections 1-8] [--budget SECONDS] [--out DIR]     # on the GPU machine
    bash scripts/gpu_check.sh --dry-run                                           # tiny sizes, any device

Writes ``<out>/gpu_report.md`` (ready to paste into docs/results.md), ``<out>/gpu_report.json`` and
``<out>/gpu_check.log`` (the output of the sections run alone; the others' in ``gpu_check_<sections>.log``), rewritten
after each section so that a run cut short still leaves
its report. ``<out>`` is ``$OUT`` when set, else ``./gpu_check_out``; a folder that holds a report already is refused
(a report never replaces another), as is a bad ``--sections``, ``--budget`` or ``--slack``: one line, exit 2, before
anything runs.

Each section runs in a process of its own under its own time bound (and the whole under ``--budget``, by default
560 s: one 10-minute call on one H100): one that fails or runs out of time is recorded with the last lines of its
output, and the next one runs. The plan: the environment, then the throughput and the user's recipe alone on the
machine (their timings must not share it), then the correctness sections side by side in four process chains (2 |
3, 5 | 6 | 7; their timings are under load, and the report says so), each writing its own
``gpu_check_<sections>.log``; ``--serial`` runs every section alone, in order. The report is rewritten as each
section ends, in section order.

1. environment: GPU, memory, driver, versions, commit (``GPU_CHECK_COMMIT`` where the tree has no ``.git``), date;
2. ``pytest -m cuda`` on the test files that mark a test ``cuda`` (found by their text, not by importing the whole
   suite): counts, and each failure's last lines;
3. host synchronizations per iteration of whole training loops under ``torch.cuda.set_sync_debug_mode``
   (``benchmarks/loop_syncs.py``), by mode, with the line where each fires;
4. ``benchmarks/gpu_throughput.py --compile``: images/s of ours, the baseline and the bound against the targets,
   with a ``torch.profiler`` table where a target is missed;
5. the accelerator forms: ``carrot_quantile.py``, ``queue_memory.py --device cuda``, ``class_blocks_cost.py``,
   ``tsc_targets.py`` at C = 1000;
6. a real recipe: SupCon, resnet18 at 32 px, on generated files in CIFAR-10's layout (``--dataset cifar10``),
   ``--deterministic``: two runs bit-equal, 2 epochs + ``--resume`` to 5 bit-equal to 5; epoch time; linear
   evaluation;
7. the field: every ``--method`` (and ``--carrot``, CE, CE + SupCon) on digits at 32 px with resnet18, one seed,
   pre-training + linear evaluation: seconds per epoch and test accuracy;
8. a user's recipe as the user runs it: ``bash scripts/supcon_cifar.sh cifar10`` (ResNet-50, batch 1024, the
   defaults the device resolves to, ``compile: true``) for a few epochs on 50,000 generated images in CIFAR-10's
   layout, alone on the machine: its images/s against section 4's best rate for resnet50 at batch 1024, and the
   1000-epoch projection from its own wall clock.

Without a CUDA device (and with ``--dry-run``) every section runs at tiny sizes on the CPU (``resnet_nano`` at 8 px;
sections 3 and 7 a few of their modes and runs: the suite runs each of them), and a section that needs CUDA reports
``skipped: no CUDA`` when its CPU run worked (``failed`` when it did not): never ``passed``.
"""
import argparse
import contextlib
import datetime
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# number, key, title, needs CUDA, time bound on a GPU (s), time bound in the dry run (s)
SECTIONS = [
    (1, 'environment', 'Environment', False, 60, 60),
    (2, 'cuda_tests', '`pytest -m cuda`', True, 240, 90),
    (3, 'loop_syncs', 'Host synchronizations per iteration of the training loop', True, 120, 90),
    (4, 'throughput', 'Throughput against the targets (`benchmarks/gpu_throughput.py --compile`)', True, 300, 90),
    (5, 'forms', 'The accelerator forms', True, 200, 120),
    (6, 'recipe', 'A real recipe: SupCon resnet18 on CIFAR-10-layout files, `--deterministic`', True, 240, 150),
    (7, 'field', 'The field on the GPU (digits, 32 px, resnet18, one seed)', True, 300, 240),
    (8, 'user_recipe', 'A user\'s recipe as it runs: `scripts/supcon_cifar.sh` on CIFAR-10-layout files', True,
     170, 120),
]
# The default plan: the environment, then the throughput alone on the machine (its timings must not share it), then
# the correctness sections side by side, each group in a process chain of its own (their timings are under load, and
# the reports say so). ``--serial`` runs every section alone, in order.
ALONE = (1, 4, 8)
SIDE_BY_SIDE = ((2,), (3, 5), (6,), (7,))
DEFAULT_BUDGET = 560          # seconds: one 10-minute call on one H100, with room for the transfers
RESULT_MARK = 'GPU_CHECK_SECTION_RESULT '


def tail(text, lines=15):
    return '\n'.join(str(text).rstrip().splitlines()[-lines:])


def run(cmd, log, timeout, env=None):
    """``cmd`` in the repo root, its output appended to ``log``; ``(exit status or 'timed out', output)``. A
    process group of its own, killed whole on the timeout."""
    with open(log, 'a') as f:
        f.write(f'\n$ {" ".join(map(str, cmd))}\n')
        f.flush()
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})},
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            code = 'timed out'
        f.write(out)
    return code, out


class Context:
    """What a section knows: ``dry`` (tiny sizes: ``--dry-run`` or no CUDA), ``cuda``, ``device``, ``work`` (a
    scratch folder), ``log`` (this section's log file), ``deadline`` (``time.monotonic()`` by which to end)."""

    def __init__(self, dry, cuda, work, log, deadline):
        self.dry, self.cuda, self.work, self.log, self.deadline = dry or not cuda, cuda, work, log, deadline
        self.device = 'cuda' if cuda else 'cpu'

    def left(self, reserve=5):
        return max(1.0, self.deadline - time.monotonic() - reserve)


def outcome(ctx, ok, summary, data=None, needs_cuda=True, status_ok='passed'):
    """A section's result: ``passed`` (or ``status_ok``) / ``failed``; without CUDA a section that needs it is
    ``skipped: no CUDA`` when its CPU run worked."""
    if not ok:
        status = 'failed'
    elif needs_cuda and not ctx.cuda:
        status = 'skipped: no CUDA'
    else:
        status = status_ok
    return {'status': status, 'summary': summary, 'data': data or {}}


# ---------------------------------------------------------------- 1. environment
def commit():
    if os.environ.get('GPU_CHECK_COMMIT'):
        return os.environ['GPU_CHECK_COMMIT']
    try:
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            return head.stdout.strip() + (' (with uncommitted changes)' if dirty.stdout.strip() else '')
    except (OSError, subprocess.TimeoutExpired):
        pass
    return 'unknown (no .git here: run with GPU_CHECK_COMMIT=<commit>)'


def section_environment(ctx):
    import numpy
    import torch
    import torchvision
    try:
        import timm
        timm_version = timm.__version__
    except ImportError:
        timm_version = 'not installed'
    env = {'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'), 'commit': commit(),
           'python': platform.python_version(), 'torch': torch.__version__, 'torchvision': torchvision.__version__,
           'timm': timm_version, 'numpy': numpy.__version__, 'cpu_cores': os.cpu_count(),
           'cuda_runtime': torch.version.cuda, 'cudnn': torch.backends.cudnn.version() if ctx.cuda else None}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                   multiprocessors=props.multi_processor_count, capability=f'{props.major}.{props.minor}')
        try:
            smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=20)
            env['driver'] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            env['driver'] = f'nvidia-smi failed: {e}'
    else:
        env['gpu'] = 'no CUDA device'
    rows = ['| | |', '| --- | --- |'] + [f'| {k} | {v} |' for k, v in env.items()]
    return outcome(ctx, True, '\n'.join(rows), env, needs_cuda=False)


# ---------------------------------------------------------------- 2. pytest -m cuda
def cuda_test_files():
    """The test files that mark a test ``cuda`` (``mark.cuda`` in their text), relative to the repository: what
    ``pytest -m cuda`` selects from, without importing the whole suite to find them (``['tests']`` if none does)."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, 'tests')):
        for name in sorted(files):
            if name.startswith('test_') and name.endswith('.py'):
                with open(os.path.join(folder, name), encoding='utf-8') as f:
                    if re.search(r'\bmark\.cuda\b', f.read()):
                        found.append(os.path.relpath(os.path.join(folder, name), ROOT))
    return sorted(found) or ['tests']


def section_cuda_tests(ctx):
    import xml.etree.ElementTree as ET
    junit = os.path.join(ctx.work, 'junit.xml')
    workers = ['-n', '0'] if not ctx.cuda else ['-n', str(min(8, os.cpu_count() or 1))]
    code, out = run([PY, '-m', 'pytest', '-m', 'cuda', '-q', '-p', 'no:cacheprovider', *workers,
                     f'--junitxml={junit}', *cuda_test_files()], ctx.log, ctx.left(10))
    if code == 'timed out' or not os.path.isfile(junit):
        return outcome(ctx, False, f'pytest {"timed out" if code == "timed out" else "wrote no report"}:\n\n'
                                   f'```\n{tail(out, 25)}\n```')
    counts = {'tests': 0, 'failures': 0, 'errors': 0, 'skipped': 0}
    failed = []
    for case in ET.parse(junit).getroot().iter('testcase'):
        counts['tests'] += 1
        for kind in ('failure', 'error', 'skipped'):
            node = case.find(kind)
            if node is not None:
                counts['failures' if kind == 'failure' else kind if kind == 'skipped' else 'errors'] += 1
                if kind != 'skipped':
                    name = f'{case.get("classname", "")}::{case.get("name")}'
                    failed.append((name, tail((node.get('message') or '') + '\n' + (node.text or ''), 12)))
    counts['passed'] = counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']
    lines = [f'{counts["tests"]} collected: {counts["passed"]} passed, {counts["failures"]} failed, '
             f'{counts["errors"]} errors, {counts["skipped"]} skipped (pytest exit status {code}).']
    for name, text in failed:
        lines += ['', f'**{name}**', '', '```', text, '```']
    ok = not failed and counts['tests'] > 0 and (counts['passed'] > 0 if ctx.cuda else True)
    return outcome(ctx, ok, '\n'.join(lines), {**counts, 'failed': [n for n, _ in failed]})


# ---------------------------------------------------------------- 3. host synchronizations
def section_loop_syncs(ctx):
    sys.path.insert(0, ROOT)
    from benchmarks import loop_syncs
    # the dry run: one mode (tests/training/test_sync.py counts every mode on the CPU)
    modes = list(loop_syncs.MODES) if not ctx.dry else ['SupCon']
    size, batch = (8, 32) if ctx.dry else (16, 64)
    results = loop_syncs.measure(modes, ctx.device, iterations=8, size=size, batch_size=batch, save_folder=ctx.work)
    ok = all(not r['error'] and r['steady_total'] and set(r['steady_total']) == {1} for r in results.values())
    counter = 'CUDA\'s sync debug mode (`warn`)' if ctx.cuda else 'the CPU counter (tests/sync_count.py)'
    summary = (f'Digits at {size} px, batch {batch}, `--augment device` (the multi-crop row: its DataLoader, 2 '
               f'workers), 8 iterations of `loop.train_loop` each; counted with {counter}. Expected: one wait per '
               f'iteration from the third on, the loop\'s read of the previous step\'s values.\n\n'
               + loop_syncs.table(results))
    return outcome(ctx, ok, summary, results)


# ---------------------------------------------------------------- 4. throughput
def section_throughput(ctx):
    out_json = os.path.join(ctx.work, 'throughput.json')
    flags = ['--smoke', '--profile', 'always'] if ctx.dry else \
        ['--compile', '--batches', '1024', '--steps', '20', '--warmup', '3']
    code, out = run([PY, 'benchmarks/gpu_throughput.py', *flags, '--device', ctx.device, '--json', out_json],
                    ctx.log, ctx.left(5))
    report = {}
    if os.path.isfile(out_json):
        with open(out_json) as f:
            report = json.load(f)
    lines = []
    for config in report.get('configs', []):
        rates = config['rates']
        lines += ['', f'**{config["model"]}, batch {config["batch"]}** ({report.get("steps")} timed steps)', '',
                  '| row | images/s | ours/baseline | ours/bound |', '| --- | --- | --- | --- |']
        for row, rate in rates.items():
            over = 'bound compiled' if 'compiled' in row and 'bound compiled' in rates else 'bound'
            ratios = ('', '') if row.startswith(('baseline', 'bound')) else \
                (f'{rate / rates["baseline"]:.2f}', f'{rate / rates[over]:.2f}' + (' (compiled bound)'
                                                                                   if over != 'bound' else ''))
            lines.append(f'| {row} | {rate:.0f} | {ratios[0]} | {ratios[1]} |')
        for m in config['missed']:
            lines.append(f'\nTarget missed: {m["row"]} / {m["over"]} = {m["ratio"]:.2f} < {m["target"]}.')
        for method, table in config['profiles'].items():
            lines += ['', f'Profile of ours {method} (top operators by self time):', '', '```', tail(table, 22),
                      '```']
    if code != 0:
        lines += ['', f'gpu_throughput.py {"timed out" if code == "timed out" else f"exited {code}"}:', '',
                  '```', tail(out, 20), '```']
    missed = any(c['missed'] for c in report.get('configs', []))
    return outcome(ctx, code == 0, '\n'.join(lines).strip(), report,
                   status_ok='passed, targets missed' if missed else 'passed')


# ---------------------------------------------------------------- 5. accelerator forms
def section_forms(ctx):
    d = ['--device', ctx.device]
    runs = [('CARROT\'s quantiles: kthvalue against topk', ['benchmarks/carrot_quantile.py', *d] + (
                ['--batch_sizes', '64', '--reps', '1'] if ctx.dry else
                ['--batch_sizes', '1024', '4096', '--reps', '5'])),
            ('The queue\'s peak memory, dense against blocked (B 4096, K 65536)', ['benchmarks/queue_memory.py', *d] + (
                ['--batch', '64', '--queue', '512'] if ctx.dry else [])),
            ('Class blocks and KCL\'s draw at a long tail (host work)', ['benchmarks/class_blocks_cost.py'] + (
                ['--batch', '256', '--reps', '1'] if ctx.dry else [])),
            ('TSC\'s targets at C = 1000', ['benchmarks/tsc_targets.py', *d] + (
                ['--classes', '20', '--steps', '50'] if ctx.dry else ['--classes', '1000']))]
    lines, ok, data = [], True, {}
    for title, cmd in runs:
        code, out = run([PY, *cmd], ctx.log, ctx.left(5))
        ok &= code == 0
        data[title] = {'status': code, 'output': out.strip().splitlines()[-12:]}
        lines += [f'**{title}** (`python {" ".join(cmd)}`{"" if code == 0 else f", exit {code}"})', '', '```',
                  tail(out, 12), '```', '']
    return outcome(ctx, ok, '\n'.join(lines).strip(), data)


# ---------------------------------------------------------------- 6. a real recipe
def write_cifar10(root, n_train, n_test, seed=0):
    """Random images in the python-version CIFAR-10 layout (``cifar-10-batches-py``: five training batches, a test
    batch, ``batches.meta``), the files ``--dataset cifar10`` reads."""
    import pickle

    import numpy as np
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, 'cifar-10-batches-py')
    os.makedirs(folder, exist_ok=True)
    names = [(f'data_batch_{i}', n_train // 5) for i in range(1, 6)] + [('test_batch', n_test)]
    for name, n in names:
        with open(os.path.join(folder, name), 'wb') as f:
            pickle.dump({'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         'labels': rng.integers(0, 10, n).tolist()}, f)
    with open(os.path.join(folder, 'batches.meta'), 'wb') as f:
        pickle.dump({'label_names': [f'c{i}' for i in range(10)]}, f)
    return root


def run_folder(save):
    found = sorted(glob.glob(os.path.join(save, '**', 'last.pth'), recursive=True))
    return os.path.dirname(found[0]) if found else None


def epoch_times(folder):
    from runtime.run_log import read_metrics
    return [float(r['train/epoch_time']) for r in read_metrics(folder) if r.get('train/epoch_time')]


def state_differences(a, b):
    """The keys of ``model`` and ``optimizer`` state where two checkpoints are not bit-equal."""
    import torch

    def flat(obj, prefix=''):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from flat(v, f'{prefix}{k}.')
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                yield from flat(v, f'{prefix}{i}.')
        else:
            yield prefix.rstrip('.'), obj
    out = []
    for part in ('model', 'optimizer', 'extra'):
        fa, fb = dict(flat(a.get(part, {}))), dict(flat(b.get(part, {})))
        if fa.keys() != fb.keys():
            out.append(f'{part}: different keys')
            continue
        for k, v in fa.items():
            w = fb[k]
            same = torch.equal(v, w) if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) else v == w
            if not same:
                out.append(f'{part}.{k}')
    return out


def section_recipe(ctx):
    import torch
    n_train, n_test = (250, 50) if ctx.dry else (20_000, 2_000)
    data = write_cifar10(os.path.join(ctx.work, 'data'), n_train, n_test)
    epochs, first = (2, 1) if ctx.dry else (5, 2)
    common = ['--dataset', 'cifar10', '--data_folder', data, '--model', 'resnet_nano' if ctx.dry else 'resnet18',
              '--size', '8' if ctx.dry else '32', '--batch_size', '64' if ctx.dry else '512',
              '--learning_rate', '0.5', '--temp', '0.1', '--cosine', '--deterministic', '--device', ctx.device,
              '--num_workers', '2' if ctx.dry else '8', '--print_freq', '1000', '--warm_epochs', '1']
    folders, lines, ok = {}, [], True

    def pretrain(name, *extra):
        code, out = run([PY, 'main_supcon.py', *common, '--save_folder', os.path.join(ctx.work, name), *extra],
                        ctx.log, ctx.left(5))
        if code != 0:
            raise RuntimeError(f'main_supcon.py ({name}) {"timed out" if code == "timed out" else f"exited {code}"}'
                               f':\n{tail(out, 15)}')
        return run_folder(os.path.join(ctx.work, name))
    try:
        start = time.monotonic()
        folders['a'] = pretrain('a', '--epochs', epochs, '--save_freq', first)
        wall = time.monotonic() - start
        folders['b'] = pretrain('b', '--epochs', epochs, '--save_freq', first)
        # run a's checkpoint after `first` epochs, as a crash would leave it, resumed in a run folder of its own
        folders['c'] = os.path.join(ctx.work, 'c')
        os.makedirs(folders['c'])
        shutil.copy(os.path.join(folders['a'], f'ckpt_epoch_{first}.pth'), os.path.join(folders['c'], 'last.pth'))
        pretrain('c', '--epochs', epochs, '--save_freq', first, '--resume', os.path.join(folders['c'], 'last.pth'))
        ckpts = {k: torch.load(os.path.join(f, 'last.pth'), map_location='cpu', weights_only=True)
                 for k, f in folders.items()}
        repeat, resumed = state_differences(ckpts['a'], ckpts['b']), state_differences(ckpts['a'], ckpts['c'])
        ok = not repeat and not resumed
        times = epoch_times(folders['a'])
        steady = times[1:] or times
        per_epoch = sum(steady) / len(steady)
        lines += [f'{n_train:,} training images (32x32, random, in `cifar-10-batches-py`), '
                  f'`python main_supcon.py {" ".join(map(str, common[4:]))}`.', '',
                  f'- two runs of {epochs} epochs: '
                  f'{"bit-equal" if not repeat else "DIFFER in " + ", ".join(repeat[:8])}',
                  f'- {first} epochs + `--resume` to {epochs} against {epochs}: '
                  f'{"bit-equal" if not resumed else "DIFFER in " + ", ".join(resumed[:8])}',
                  f'- epoch time: {", ".join(f"{t:.2f}" for t in times)} s (mean after the first {per_epoch:.2f} s: '
                  f'{2 * n_train / per_epoch:,.0f} images/s counting both views; a 50,000-image CIFAR-10 epoch at this '
                  f'rate: {per_epoch * 50_000 / n_train:.1f} s); the first run took {wall:.0f} s in all']
        lin_epochs = '1' if ctx.dry else '2'
        code, out = run([PY, 'main_linear.py', '--ckpt', os.path.join(folders['a'], 'last.pth'), '--dataset',
                         'cifar10', '--data_folder', data, '--device', ctx.device, '--batch_size',
                         '64' if ctx.dry else '512', '--learning_rate', '5', '--epochs', lin_epochs, '--num_workers',
                         '2' if ctx.dry else '8', '--print_freq', '1000', '--warm_epochs', '1', '--save_folder',
                         os.path.join(ctx.work, 'linear')], ctx.log, ctx.left(5))
        match = re.search(r'final test top-1[^0-9]*([0-9.]+)', out)
        ok &= code == 0
        lines.append(f'- linear evaluation ({lin_epochs} epochs, lr 5): '
                     + (f'final test top-1 {match.group(1)} % (random labels: about 10 % expected)' if code == 0
                        and match else f'FAILED ({code}):\n\n```\n{tail(out, 12)}\n```'))
        data_out = {'bit_equal_repeat': not repeat, 'bit_equal_resume': not resumed, 'epoch_times': times,
                    'differences': {'repeat': repeat[:20], 'resume': resumed[:20]}}
    except RuntimeError as e:
        return outcome(ctx, False, f'```\n{e}\n```')
    return outcome(ctx, ok, '\n'.join(lines), data_out)


# ---------------------------------------------------------------- 7. the field
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


class Forked:
    """``fn(*args)`` in a forked child (the imports are the parent's; the child alone touches CUDA), its output into
    ``log`` (a file of its own); :meth:`poll` is ``None`` while it runs, then its JSON-able result, or raises
    ``RuntimeError`` with the output's last lines (or the time-out)."""

    def __init__(self, fn, args, log, timeout):
        self.log, self.timeout, self.start = log, timeout, time.monotonic()
        self.result = tempfile.NamedTemporaryFile(suffix='.json', delete=False).name
        sys.stdout.flush()                          # the child must not print the parent's buffered output again
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:                           # the child
            code = 1
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(fd, 'w', buffering=1, closefd=False)   # also where they were replaced
                value = fn(*args)
                with open(self.result, 'w') as f:
                    json.dump(value, f)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self):
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if not done:
            if time.monotonic() - self.start <= self.timeout:
                return None
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.unlink(self.result)
            raise RuntimeError(f'timed out after {self.timeout:.0f} s')
        try:
            if os.waitstatus_to_exitcode(status) != 0:
                with open(self.log) as f:
                    raise RuntimeError(tail(f.read(), 8))
            with open(self.result) as f:
                return json.load(f)
        finally:
            os.unlink(self.result)


def forked(fn, args, log, timeout):
    """:class:`Forked`, waited for: its result, or ``RuntimeError``."""
    child = Forked(fn, args, log, timeout)
    while True:
        out = child.poll()
        if out is not None:
            return out
        time.sleep(0.2)


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
    import main_linear  # noqa: F401
    import main_supcon  # noqa: F401
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


# ---------------------------------------------------------------- 8. a user's recipe as it runs
USER_RECIPE_EPOCHS = 4        # the first (it compiles) and three steady ones


def timed_lines(cmd, log, timeout, env=None):
    """``cmd`` in the repo root, each output line with the seconds since the start at which it came (into ``log``
    too); ``(exit status or 'timed out', [(seconds, line)])``."""
    start = time.monotonic()
    lines = []
    with open(log, 'a') as f:
        f.write(f'\n$ {" ".join(map(str, cmd))}\n')
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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


# ---------------------------------------------------------------- the driver
def run_section(key, dry, cuda, work, log, seconds):
    """In the section's own process: run it, print its result as one marked JSON line."""
    sys.path.insert(0, ROOT)
    ctx = Context(dry, cuda, work, log, time.monotonic() + seconds)
    sabotage = os.environ.get('GPU_CHECK_SABOTAGE', '')        # the suite's power check: 'key:fail' or 'key:hang'
    if sabotage == f'{key}:fail':
        raise RuntimeError(f'sabotaged section {key}')
    if sabotage == f'{key}:hang':
        time.sleep(3600)
    if sabotage == 'nap' and key != 'environment':       # the driver's test: every section a 3-second pass
        time.sleep(3)
        print(RESULT_MARK + json.dumps({'status': 'passed', 'summary': 'a nap', 'data': {}}), flush=True)
        return
    result = globals()[f'section_{key}'](ctx)
    print(RESULT_MARK + json.dumps(result, default=str), flush=True)


class ArgumentError(Exception):
    """A bad argument of the GPU check: one line, exit status 2, before anything runs."""


def parse_sections(text):
    """``'2-4,7'`` -> ``{1, 2, 3, 4, 7}`` (the environment always runs); :class:`ArgumentError` for anything else: an
    empty or malformed list, a reversed range, a number that is no section."""
    known = {n for n, *_ in SECTIONS}
    if not re.fullmatch(r'\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*', text or ''):
        raise ArgumentError(f'--sections takes numbers and ranges of 1-{max(known)} separated by commas (e.g. '
                            f'1-3,5), got {text!r}')
    chosen = set()
    for part in text.split(','):
        a, _, b = (x.strip() for x in part.partition('-'))
        first, last = int(a), int(b or a)
        if last < first:
            raise ArgumentError(f'--sections: the range {part.strip()} is reversed (write {last}-{first})')
        chosen.update(range(first, last + 1))
    if not chosen <= known:
        raise ArgumentError(f'--sections takes numbers in 1-{max(known)}, got {text}')
    return chosen | {1}          # the environment always


def usable_out(out):
    """Create ``out`` and check that a file can be written there, and that it holds no report yet (a report never
    replaces another); :class:`ArgumentError` naming the cause otherwise."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ArgumentError(f'--out {out} is a file: give a folder (default $OUT, else ./gpu_check_out)')
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ArgumentError(f'cannot write the report into {out} ({e.strerror or type(e).__name__}): give another '
                            '--out (or $OUT)') from None
    if os.path.exists(os.path.join(out, 'gpu_report.md')):
        raise ArgumentError(f'{out} holds a report already (gpu_report.md): give another --out, or move that report '
                            'away first')
    return out


def machine_slack():
    """``--slack auto``: 1 plus the load the machine carries per core (its 1-minute load average), so the time bounds
    follow a machine that other work shares."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return round(1.0 + load / (os.cpu_count() or 1), 1)


def write_report(out, results, meta):
    with open(os.path.join(out, 'gpu_report.json'), 'w') as f:
        json.dump({'meta': meta, 'sections': results}, f, indent=2, default=str)
    env = next((r['data'] for r in results if r['key'] == 'environment'), {})
    lines = [f'# GPU check: {env.get("gpu", "?")}, torch {env.get("torch", "?")}, commit {env.get("commit", "?")}',
             '', f'{env.get("date", "")}; `{meta["command"]}`{" (dry run)" if meta["dry_run"] else ""}; '
             f'{meta["elapsed_s"]:.0f} s in all.', '', '| section | status | seconds |', '| --- | --- | --- |']
    lines += [f'| {r["number"]}. {r["title"]} | {r["status"]} | {r["seconds"]:.0f} |' for r in results]
    for r in results:
        lines += ['', f'## {r["number"]}. {r["title"]}: {r["status"]}', '', r['summary'] or '']
    with open(os.path.join(out, 'gpu_report.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def main(argv=None):
    sys.path.insert(0, ROOT)
    from core.flags import Parser  # one-line errors, full flag names only
    parser = Parser(prog='gpu_check.sh', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dry-run', action='store_true', help='tiny sizes, any device (the suite runs this)')
    parser.add_argument('--sections', default=f'1-{len(SECTIONS)}',
                        help='which sections, e.g. 1-3,5 (1 always runs)')
    parser.add_argument('--budget', type=float, default=None,
                        help=f'seconds for everything (default {DEFAULT_BUDGET}: one 10-minute call; dry run: the '
                             'bounds of the sections run alone plus the longest group side by side): a section that '
                             'would start later is skipped, one that runs past it is stopped')
    parser.add_argument('--chains', type=int, default=None,
                        help='process chains run side by side at most (default: all four on CUDA; without CUDA half '
                             'the CPU cores, at least 1, so that the dry run\'s bounds hold on a small machine)')
    parser.add_argument('--serial', action='store_true',
                        help='every section alone, in order (default: the throughput alone, then the correctness '
                             'sections side by side)')
    parser.add_argument('--slack', default='auto',
                        help='multiply every section\'s time bound by this (default auto: 1 + the load average per '
                             'core, so a loaded machine gets more time)')
    parser.add_argument('--out', default=os.environ.get('OUT') or os.path.join(ROOT, 'gpu_check_out'),
                        help='the report\'s folder (default $OUT, else ./gpu_check_out); one that holds a report is '
                             'refused')
    parser.add_argument('--run-section', help=argparse.SUPPRESS)
    parser.add_argument('--work', help=argparse.SUPPRESS)
    parser.add_argument('--log', help=argparse.SUPPRESS)
    parser.add_argument('--seconds', type=float, help=argparse.SUPPRESS)
    parser.add_argument('--cuda', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_section:
        return run_section(args.run_section, args.dry_run, bool(args.cuda), args.work, args.log, args.seconds)
    try:
        chosen = parse_sections(args.sections)
        slack = machine_slack() if args.slack == 'auto' else float(args.slack)
        if not slack > 0 or slack == float('inf'):
            raise ArgumentError(f'--slack must be a number > 0 or auto, got {args.slack}')
        if args.chains is not None and args.chains < 1:
            raise ArgumentError(f'--chains must be >= 1, got {args.chains}')
        if args.budget is not None and not (0 < args.budget < float('inf')):
            raise ArgumentError(f'--budget must be a number of seconds > 0, got {args.budget:g}')
        usable_out(args.out)
    except ValueError:
        parser.error(f'--slack must be a number > 0 or auto, got {args.slack}')
    except ArgumentError as e:
        parser.error(str(e))
    import torch
    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    if args.serial:
        alone, together = [[n] for n in sorted(chosen)], []
    else:
        alone = [[n] for n in ALONE if n in chosen]
        together = [g for g in ([n for n in group if n in chosen] for group in SIDE_BY_SIDE) if g]
    chains = args.chains or (len(SIDE_BY_SIDE) if cuda else max(1, (os.cpu_count() or 1) // 2))
    bounds = {n: (dry_bound if dry else bound) for n, _, _, _, bound, dry_bound in SECTIONS}
    longest = sorted((sum(bounds[n] for n in g) for g in together), reverse=True)
    default = sum(bounds[g[0]] for g in alone) + sum(longest[::chains])        # the chains, `chains` at a time
    budget = args.budget or (slack * default if dry else DEFAULT_BUDGET)
    log = os.path.join(args.out, 'gpu_check.log')
    open(log, 'w').close()
    start = time.monotonic()
    meta = {'command': ' '.join(['bash scripts/gpu_check.sh', *(argv if argv is not None else sys.argv[1:])]),
            'dry_run': args.dry_run, 'cuda': cuda, 'budget_s': budget, 'slack': slack, 'elapsed_s': 0,
            'plan': {'alone': alone, 'side_by_side': together, 'chains': chains}}
    results, lock = [], threading.Lock()
    print(f'GPU check ({"dry run, " if args.dry_run else ""}{"CUDA" if cuda else "no CUDA: tiny sizes on the CPU"}); '
          f'report in {args.out}; alone: {", ".join(str(g[0]) for g in alone)}'
          + (f'; then side by side ({chains} at a time): {" | ".join(",".join(map(str, g)) for g in together)}'
             if together else ''), flush=True)
    with tempfile.TemporaryDirectory(prefix='gpu_check_') as scratch:
        def run_group(numbers, group_log):
            for number in numbers:
                _, key, title, _, bound, dry_bound = SECTIONS[number - 1]
                left = budget - (time.monotonic() - start)
                seconds = min(slack * (dry_bound if dry else bound), left - 3)
                entry = {'number': number, 'key': key, 'title': title, 'seconds': 0.0}
                if seconds < 10:
                    entry.update(status='skipped: out of time', summary=f'{left:.0f} s of the --budget left', data={})
                else:
                    print(f'[{number}/{len(SECTIONS)}] {title} (at most {seconds:.0f} s) ...', flush=True)
                    work = os.path.join(scratch, key)
                    os.makedirs(work)
                    t = time.monotonic()
                    entry['started_s'] = t - start
                    with open(group_log, 'a') as f:
                        f.write(f'\n\n===== {number}. {title}\n')
                    code, out = run([PY, os.path.abspath(__file__), '--run-section', key, '--work', work, '--log',
                                     group_log, '--seconds', seconds - 5, '--cuda', int(cuda),
                                     *(['--dry-run'] if args.dry_run else [])], group_log, seconds)
                    entry['seconds'] = time.monotonic() - t
                    marked = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
                    if marked:
                        entry.update(json.loads(marked[-1][len(RESULT_MARK):]))
                    else:
                        why = 'timed out' if code == 'timed out' else f'exited {code} without a result'
                        entry.update(status='timed out' if code == 'timed out' else 'failed', data={},
                                     summary=f'The section {why} after {entry["seconds"]:.0f} s; the last lines of '
                                             f'its output:\n\n```\n{tail(out, 20)}\n```')
                    print(f'      {number}. {entry["status"]} ({entry["seconds"]:.0f} s)', flush=True)
                with lock:
                    results.append(entry)
                    results.sort(key=lambda r: r['number'])
                    meta['elapsed_s'] = time.monotonic() - start
                    write_report(args.out, results, meta)
        for group in alone:
            run_group(group, log)
        waiting = list(together)

        def worker():                       # one of `chains` workers: takes the next chain until none is left
            while True:
                with lock:
                    if not waiting:
                        return
                    group = waiting.pop(0)
                run_group(group, os.path.join(args.out, f'gpu_check_{"-".join(map(str, group))}.log'))
        threads = [threading.Thread(target=worker) for _ in range(min(chains, len(together)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failed = [r for r in results if r['status'] in ('failed', 'timed out')]
    print(f'report: {os.path.join(args.out, "gpu_report.md")}; '
          f'{len(failed)} of {len(results)} sections failed or timed out', flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
