"""6. A real recipe: SupCon on CIFAR-10-layout files, ``--deterministic``, resume, linear evaluation."""
import glob
import os
import re
import shutil
import time

from benchmarks.gpu_check.common import PY, outcome, run, tail


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
