"""Host synchronizations per iteration of whole training loops: the real script's ``main`` (loader, ``--augment
device``, the step, the statistics and the progress line) run in this process for a few iterations of
``loop.train_loop``, with a counter recording what each iteration made the host wait for.

Two counters, one harness:

- :class:`CudaSyncCounter`: on CUDA, ``torch.cuda.set_sync_debug_mode('warn')`` makes every synchronizing CUDA
  operation warn; each warning is counted under the innermost line of this repository that made it (file, line,
  function and the code), so a report names the operation.
- ``tests/sync_count.SyncCounter``: on a CPU, the operations whose CUDA form would wait (``tests/training/test_sync.py``
  asserts its counts; ``scripts/gpu_check.sh --dry-run`` runs this harness with it).

    python benchmarks/loop_syncs.py [--device cuda] [--iterations 8]     # every mode of MODES, a table

Expected on either: from the third iteration on, exactly one wait per iteration, the loop's one read of the
previous step's values (``engine/run.py``'s ``values.tolist()``).
"""
import argparse
import contextlib
import importlib
import os
import sys
import tempfile
import traceback
import warnings
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, 'tests')):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

# the modes measured: (script, flags)
MODES = {
    'SupCon': ('main_supcon', []),
    'RASCAL + queue + CARROT': ('main_supcon', ['--method', 'RASCAL', '--queue_size', '256', '--carrot']),
    'BCL': ('main_supcon', ['--method', 'BCL']),
    'PaCo': ('main_supcon', ['--method', 'PaCo']),
    'TSC': ('main_supcon', ['--method', 'TSC']),
    'KCL': ('main_supcon', ['--method', 'KCL']),
    'SupCon chunked + CARROT fixed weight': ('main_supcon',
                                             ['--chunk_size', '8', '--carrot', '--carrot_weight', '0.5']),
    'CE + SupCon': ('main_ce', ['--supcon_weight', '1']),
    'SupCon multi-crop (DataLoader views)': ('main_supcon', ['--num_small_crops', '2', '--augment', 'cpu',
                                                                    '--num_workers', '2']),
}
SYNC_MESSAGE = 'called a synchronizing CUDA operation'


def base_flags(device, size=8, batch_size=32):
    """The digits run every mode shares (``--augment device`` unless a mode says otherwise)."""
    return ['--dataset', 'digits', '--size', str(size), '--augment', 'device', '--batch_size', str(batch_size),
            '--epochs', '1', '--num_workers', '0', '--device', device, '--print_freq', '1000']


class CudaSyncCounter:
    """``with CudaSyncCounter() as c: ...`` then ``c.counts`` (``{'file:line function: code': waits}``): every
    synchronizing CUDA operation in the block, under ``torch.cuda.set_sync_debug_mode('warn')``, by the innermost
    line of this repository that made it. ``host`` is a no-op (a real device tells host data from device data)."""

    def __init__(self):
        self.counts = Counter()
        self._stack = contextlib.ExitStack()

    def host(self, *tensors):
        pass

    def _where(self):
        here = os.path.abspath(__file__)
        for frame in reversed(traceback.extract_stack()[:-2]):
            path = os.path.abspath(frame.filename)
            if path.startswith(ROOT + os.sep) and path != here and os.sep + '.venv' + os.sep not in path:
                return f'{os.path.relpath(path, ROOT)}:{frame.lineno} {frame.name}: {(frame.line or "").strip()}'
        return 'outside the repository'

    def __enter__(self):
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter('always')
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if SYNC_MESSAGE in str(message):
                self.counts[self._where()] += 1
            else:
                shown(message, category, filename, lineno, file, line)
        warnings.showwarning = record
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode('warn')
        self._stack.callback(torch.cuda.set_sync_debug_mode, 'default')
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    @property
    def total(self):
        return sum(self.counts.values())


class CountedBar:
    """``loop.train_loop``'s progress bar limited to ``iterations`` batches, recording ``counter.counts`` each
    time a batch is handed out (the batch's labels and ids are the loader's host data) and after the last."""

    def __init__(self, bar, counter, record, iterations):
        self.bar, self.counter, self.record, self.iterations = bar, counter, record, iterations

    def __iter__(self):
        for i, batch in enumerate(self.bar):
            if i == self.iterations:
                break
            self.counter.host(*batch[1:])
            self.record.append(dict(self.counter.counts))
            yield batch
        self.record.append(dict(self.counter.counts))

    def __getattr__(self, name):
        return getattr(self.bar, name)


def iteration_counts(script, argv, counter, iterations=6):
    """Run ``<script>.main(argv)`` (one epoch, limited to ``iterations`` iterations of the training loop) inside
    ``counter`` (entered here); returns the waits of each iteration, ``[{where: count}]`` (``iterations`` dicts:
    iteration ``i`` counts from its batch being handed out to the next one's, so a step's waits and the next
    batch's loading fall in one)."""
    from training import loop
    records = []
    real_progress = loop.progress

    def limited(it, desc):
        bar = real_progress(it, desc)
        return CountedBar(bar, counter, records, iterations) if 'epoch' in desc else bar
    loop.progress = limited
    try:
        with counter:
            importlib.import_module(script).main(argv)
    finally:
        loop.progress = real_progress
    return [{k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            for before, after in zip(records, records[1:])]


def steady(per_iteration, skip=2):
    """The iterations after the first ``skip`` (RASCAL's cache, the queue's host copy and the first read fill)."""
    return per_iteration[skip:]


def measure(modes, device, iterations=8, size=8, batch_size=32, save_folder=None):
    """``{mode: {'per_iteration': [...], 'steady_total': [...], 'where': {where: count}, 'error': str|None}}`` for
    each mode, on ``device`` (CUDA: :class:`CudaSyncCounter`; CPU: the CPU counter with the accelerator forms)."""
    from sync_count import SyncCounter, accelerator_forms
    out = {}
    for mode in modes:
        script, flags = MODES[mode]
        with tempfile.TemporaryDirectory(dir=save_folder) as tmp:
            argv = [*base_flags(device, size, batch_size), '--save_folder', tmp, *flags]
            if torch.device(device).type == 'cuda':
                counter, forms = CudaSyncCounter(), contextlib.nullcontext()
            else:
                counter, forms = SyncCounter(), accelerator_forms()
            try:
                with forms:
                    per = iteration_counts(script, argv, counter, iterations)
                where = Counter()
                for it in steady(per):
                    where.update(it)
                out[mode] = {'per_iteration': [sum(it.values()) for it in per],
                             'steady_total': [sum(it.values()) for it in steady(per)],
                             'where': dict(where), 'error': None}
            except BaseException as e:         # a mode's failure is recorded, the next mode runs
                if isinstance(e, KeyboardInterrupt):
                    raise
                out[mode] = {'per_iteration': [], 'steady_total': [], 'where': {},
                             'error': ''.join(traceback.format_exception(e)).strip().splitlines()[-6:]}
    return out


def table(results):
    """A markdown table of :func:`measure`'s results."""
    rows = ['| mode | waits per iteration (all) | steady (from the 3rd) | where (steady state) |',
            '| --- | --- | --- | --- |']
    for mode, r in results.items():
        if r['error']:
            rows.append(f'| {mode} | error | | `{r["error"][-1][:150]}` |')
            continue
        where = '; '.join(f'{n}× `{w[:110]}`' for w, n in sorted(r['where'].items(), key=lambda kv: -kv[1]))
        rows.append(f'| {mode} | {r["per_iteration"]} | {r["steady_total"]} | {where} |')
    return '\n'.join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--iterations', type=int, default=8)
    parser.add_argument('--size', type=int, default=16)
    parser.add_argument('--batch_size', type=int, default=64)
    parser.add_argument('--modes', default=','.join(MODES), help='comma-separated names of MODES')
    args = parser.parse_args(argv)
    results = measure(args.modes.split(','), args.device, args.iterations, args.size, args.batch_size)
    print(table(results))
    return results


if __name__ == '__main__':
    main()
