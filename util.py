"""Small shared helpers: errors, meters, learning-rate schedule, optimizer, seeding, devices, logging."""
import csv
import math
import os
import random
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from features import Feature


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr with exit status 2."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is (as Ctrl-C raises KeyboardInterrupt)."""


_MAIN_PID = os.getpid()


def _raise_interrupted(signum, frame):
    if os.getpid() != _MAIN_PID:       # a forked DataLoader worker: terminate as by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Interrupted()


# The run folder of this process's run, set by ``engine.setup``: an interrupt says how to continue it.
RUN = {'folder': None}


def interrupt_message():
    """What an interrupted run prints: how to continue it (``--resume``), or that nothing was saved yet."""
    folder = RUN['folder']
    last = os.path.join(folder, 'last.pth') if folder else None
    if last and os.path.isfile(last):
        return f'interrupted; the last complete checkpoint is intact: continue with --resume {last}'
    return 'interrupted before the first checkpoint (written after each epoch): nothing to resume'


def error_line(error):
    """The one line of a :class:`UserError`, also one re-raised by a DataLoader worker (whose message
    holds the worker's traceback: the original message is its last line)."""
    message = str(error).strip()
    if '\n' in message:
        message = message.splitlines()[-1].split('UserError: ', 1)[-1]
    return message


def run_cli(main):
    """Run ``main()``; a :class:`UserError`, Ctrl-C or SIGTERM becomes a one-line message and a non-zero exit."""
    prog = os.path.basename(sys.argv[0])
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        main()
    except UserError as e:
        print(f'{prog}: error: {error_line(e)}', file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        print(f'{prog}: {interrupt_message()}', file=sys.stderr)
        sys.exit(143 if isinstance(e, Interrupted) else 130)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def progress(iterable, desc, total=None):
    """A tqdm bar on a terminal (rank 0 only under torchrun); plain periodic lines otherwise."""
    quiet = dist.is_available() and dist.is_initialized() and dist.get_rank() != 0
    return tqdm(iterable, desc=desc, total=total, disable=True if quiet else None, leave=False,
                dynamic_ncols=True)


class AverageMeter:
    """Running average of a scalar."""

    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += float(val) * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def accuracy(output, target, topk=(1,)):
    """Top-k accuracies (in %) of ``output`` logits ``[N, C]`` against ``target`` ``[N]``."""
    with torch.no_grad():
        maxk = min(max(topk), output.shape[1])
        pred = output.topk(maxk, 1, True, True).indices.t()
        correct = pred.eq(target.reshape(1, -1))
        return [correct[:min(k, maxk)].any(0).float().mean() * 100.0 for k in topk]


# ---------------------------------------------------------------- schedule
def lr_at_epoch(opt, epoch):
    """SupContrast's per-epoch learning rate (epochs count from 1)."""
    lr = opt.learning_rate
    if opt.cosine:
        eta_min = lr * opt.lr_decay_rate ** 3
        return eta_min + (lr - eta_min) * (1 + math.cos(math.pi * epoch / opt.epochs)) / 2
    steps = int(np.sum(epoch > np.asarray(opt.lr_decay_epochs)))
    return lr * opt.lr_decay_rate ** steps


def warmup_target(opt):
    """The learning rate the warm-up ramps to (SupContrast's ``warmup_to``)."""
    if opt.cosine:
        eta_min = opt.learning_rate * opt.lr_decay_rate ** 3
        return eta_min + (opt.learning_rate - eta_min) * (
            1 + math.cos(math.pi * opt.warm_epochs / opt.epochs)) / 2
    return opt.learning_rate


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group['lr'] = lr


def adjust_learning_rate(opt, optimizer, epoch):
    set_lr(optimizer, lr_at_epoch(opt, epoch))


def warmup_learning_rate(opt, epoch, batch_id, total_batches, optimizer):
    """Per-iteration linear warm-up from ``warmup_from`` during the first ``warm_epochs`` epochs."""
    if opt.warm and epoch <= opt.warm_epochs:
        p = (batch_id + (epoch - 1) * total_batches) / (opt.warm_epochs * total_batches)
        set_lr(optimizer, opt.warmup_from + p * (warmup_target(opt) - opt.warmup_from))


def _schedule_defaults(opt, script, given, method):
    if opt.batch_size > 256:      # SupContrast: large batches always warm up; 10 epochs from 0.01
        opt.warm = True
    opt.warm_epochs, opt.warmup_from = 10, 0.01


SCHEDULE = Feature(
    'learning-rate schedule', check=_schedule_defaults, resume_may_change=('warm_epochs', 'warmup_from'),
    flags={'--cosine': dict(action='store_true', help='cosine annealing (else step decay at --lr_decay_epochs)'),
           '--warm': dict(action='store_true', help='10-epoch linear warm-up from 0.01 (always on above batch 256)')},
    run_name=lambda opt: ('_cosine' if opt.cosine else '') + ('_warm' if opt.warm else ''))


def set_optimizer(opt, params):
    return torch.optim.SGD(params, lr=opt.learning_rate, momentum=opt.momentum,
                           weight_decay=opt.weight_decay)


# ---------------------------------------------------------------- seeds and devices
def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


GENERATORS = {}     # name -> torch.Generator of this process whose state travels with the RNG states


def register_generator(name, generator):
    """Make ``generator``'s state part of :func:`get_rng_state` / :func:`set_rng_state` (checkpoints, ``--resume``)."""
    GENERATORS[name] = generator
    return generator


def get_rng_state():
    """All RNG states as tensors and plain values (loadable with ``weights_only=True``). CUDA: the state of this
    process's device only (``cuda_device``: its index), so that a checkpoint resumes on a node with any number of
    visible GPUs; registered generators with their device type."""
    np_state = np.random.get_state()
    state = {'torch': torch.get_rng_state(), 'python': random.getstate(),
             'numpy': {'keys': torch.from_numpy(np_state[1].astype(np.int64)), 'pos': int(np_state[2]),
                       'has_gauss': int(np_state[3]), 'cached_gaussian': float(np_state[4])}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state(torch.cuda.current_device())
        state['cuda_device'] = torch.cuda.current_device()
    if GENERATORS:
        state['generators'] = {name: g.get_state() for name, g in GENERATORS.items()}
        state['generator_devices'] = {name: g.device.type for name, g in GENERATORS.items()}
    return state


def cuda_state_for_this_device(state, device_index):
    """The saved CUDA RNG state to restore on device ``device_index``, or ``None`` with the reason. A state saved
    by this project is one device's (``state['cuda']`` a tensor); older checkpoints hold a list of every visible
    device's: take entry ``device_index`` when it exists."""
    saved = state.get('cuda')
    if saved is None:
        return None, 'the checkpoint holds no CUDA RNG state (written on a CPU)'
    if isinstance(saved, torch.Tensor) and saved.dim() == 1:
        return saved, None
    saved = list(saved)
    if device_index < len(saved):
        return saved[device_index], None
    return None, f'the checkpoint holds CUDA RNG states of {len(saved)} devices, none for cuda:{device_index}'


def set_rng_state(state, reseed=None):
    """Restore :func:`get_rng_state`'s ``state``. A part that cannot be restored here (a CUDA state without a
    matching device, a generator saved on another device type) is re-seeded with ``reseed`` (an int) instead
    of failing. Returns the notices (one line each) of what was re-seeded."""
    notices = []
    torch.set_rng_state(state['torch'])
    py = state['python']
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state['numpy']
    np.random.set_state(('MT19937', n['keys'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['cached_gaussian']))
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        cuda_state, why = cuda_state_for_this_device(state, index)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, index)
        else:
            torch.cuda.manual_seed(reseed or 0)
            notices.append(f'CUDA RNG re-seeded ({why})')
    saved_devices = state.get('generator_devices', {})
    for name, g_state in state.get('generators', {}).items():
        if name not in GENERATORS:
            continue
        g = GENERATORS[name]
        saved_type = saved_devices.get(name)
        try:
            if saved_type not in (None, g.device.type):
                raise RuntimeError(f'saved on {saved_type}')
            g.set_state(g_state)
        except RuntimeError as e:
            g.manual_seed((reseed or 0) % 2 ** 63)
            notices.append(f'the {name} generator re-seeded (its saved state cannot be loaded on '
                           f'{g.device.type}: {str(e).splitlines()[0][:80]})')
    return notices


def rank_rng_state(ckpt, rank, world_size):
    """The RNG state this process resumes from: its own when the checkpoint was written by as many processes (or
    by one process and this is one process), else ``None`` with the reason (every process is then re-seeded: one
    saved state given to several processes would make them draw the same numbers)."""
    ranks = ckpt.get('rng_ranks')
    saved_world = len(ranks) if ranks else 1
    if saved_world == world_size:
        return (ranks[rank] if ranks else ckpt['rng']), None
    return None, f'the checkpoint was written by {saved_world} process(es), this run has {world_size}'


def resolve_device(name):
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f'unknown --device {name!r} (auto, cpu, cuda, cuda:N)') from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise UserError(f'--device {name} asked for, but no CUDA device is available')
    return device


def keep_freed_memory():
    """Have glibc keep freed memory for reuse instead of handing it back to the OS (a no-op elsewhere). By default
    glibc serves each block over 128 KB from a fresh ``mmap`` and trims freed heap tops over 128 KB, so work that
    allocates such temporaries at every operation (the batched augmentation of ``--augment device`` on a CPU,
    a CPU training step) pays a page fault per 4 KB page at each use: on a 2-core machine a third of the time
    of ``augment.BatchAugment``. Blocks up to 32 MB now come from the heap and up to 256 MB of freed heap stays
    mapped (PyTorch's CPU tuning guide recommends jemalloc or tcmalloc for the same reason). Returns whether the
    setting took effect."""
    import ctypes
    import platform
    if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
        return False
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 256 << 20))


AMP_DTYPES = {'none': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def autocast(opt):
    """The autocast context for ``--amp``."""
    dtype = AMP_DTYPES[opt.amp]
    return torch.autocast(device_type=opt.device.type, dtype=dtype or torch.float32,
                          enabled=dtype is not None)


PRECISION = Feature(
    'precision and memory layout', resume_may_change=('amp', 'channels_last'),
    flags={'--amp': dict(choices=list(AMP_DTYPES), default='none',
                         help='mixed precision autocast (losses still compute in float32)'),
           '--channels_last': dict(action='store_true', help='channels-last memory format')},
    run_name=lambda opt: f'_{opt.amp}' if opt.amp != 'none' else '')


def grad_scaler(opt):
    return torch.amp.GradScaler(opt.device.type, enabled=opt.amp == 'fp16')


def prepare_model(opt, model):
    """Move to the device (channels-last if asked); cudnn autotuning on CUDA unless ``--deterministic``."""
    model = model.to(opt.device)
    if opt.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if opt.device.type == 'cuda':
        torch.backends.cudnn.benchmark = not opt.deterministic
    return model


def set_deterministic(enabled):
    """``--deterministic``: deterministic algorithms everywhere (``torch.use_deterministic_algorithms``; an
    operation without one raises), cuDNN deterministic and not autotuned, cuBLAS with a fixed workspace (set
    before the first CUDA call). The project's own code has no atomic reduction in any case (docs/USAGE.md,
    "Reproducibility"); this covers the libraries'."""
    if not enabled:
        return
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


REPRODUCIBILITY = Feature(
    'reproducibility', resume_may_change=('deterministic',),
    flags={'--deterministic': dict(action='store_true',
                                   help='bit-for-bit reproducible runs and resumes on CUDA too (deterministic '
                                        'kernels, no cuDNN autotuning; slower): docs/USAGE.md, "Reproducibility"')})


def to_device(opt, images):
    images = images.to(opt.device, non_blocking=True)
    if opt.channels_last and images.dim() == 4:
        images = images.contiguous(memory_format=torch.channels_last)
    return images


# ---------------------------------------------------------------- run logging
def _write_csv(path, rows):
    """Rewrite ``path`` with ``rows`` through a temporary file and a rename (never half a file)."""
    with open(path + '.tmp', 'w', newline='') as f:
        csv.writer(f).writerows(rows)
    os.replace(path + '.tmp', path)


class RunLogger:
    """Per-epoch metrics to TensorBoard (``<run>/tensorboard``) and ``<run>/metrics.csv``.

    On resume, rows of epochs after ``start_epoch - 1`` are dropped so the file
    matches the restored state.
    """

    def __init__(self, folder, start_epoch=1):
        from torch.utils.tensorboard import SummaryWriter
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.csv_path = os.path.join(folder, 'metrics.csv')
        self.hist_path = os.path.join(folder, 'histograms.csv')   # epoch, name, bucket counts over [0, 1]
        self.rows, self.hist_rows = [], []
        for path, rows in ((self.csv_path, self.rows), (self.hist_path, self.hist_rows)):
            if start_epoch > 1 and os.path.exists(path):
                with open(path, newline='') as f:
                    rows.extend(r for r in csv.reader(f) if r[0] == 'epoch' or int(r[0]) < start_epoch)
            elif os.path.exists(path):
                os.remove(path)
        if self.rows:   # back to dicts (header first)
            self.rows = [dict(zip(self.rows[0], r)) for r in self.rows[1:]]
        self.hist_rows = [r for r in self.hist_rows if r[0] != 'epoch']
        self.writer = SummaryWriter(os.path.join(folder, 'tensorboard'), purge_step=start_epoch)

    def log(self, epoch, metrics, histograms=None):
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, epoch)
        for key, counts in (histograms or {}).items():
            self._histogram(key, counts, epoch)
            self.hist_rows.append([epoch, key] + [int(c) for c in torch.as_tensor(counts).tolist()])
        self.writer.flush()
        if histograms:
            _write_csv(self.hist_path, [['epoch', 'name', 'counts...']] + self.hist_rows)
        self.rows.append({'epoch': epoch, **{k: f'{v:.6g}' for k, v in metrics.items()}})
        fields = ['epoch'] + sorted({k for r in self.rows for k in r} - {'epoch'})
        _write_csv(self.csv_path, [fields] + [[r.get(k, '') for k in fields] for r in self.rows])

    def note(self, epoch, text):
        """A one-line message (a warning) to TensorBoard's text tab and ``<run>/warnings.txt``."""
        self.writer.add_text('warnings', text, epoch)
        self.writer.flush()
        with open(os.path.join(self.folder, 'warnings.txt'), 'a') as f:
            f.write(f'epoch {epoch}: {text}\n')

    def _histogram(self, key, counts, epoch):
        """``counts``: bucket counts over equal bins of [0, 1]."""
        counts = torch.as_tensor(counts, dtype=torch.float64).cpu()
        num = float(counts.sum())
        if num == 0:
            return
        edges = torch.linspace(0, 1, len(counts) + 1, dtype=torch.float64)
        centers = (edges[1:] + edges[:-1]) / 2
        nonzero = torch.nonzero(counts).flatten()
        self.writer.add_histogram_raw(key, min=float(edges[nonzero[0]]), max=float(edges[nonzero[-1] + 1]),
                                      num=num, sum=float((counts * centers).sum()),
                                      sum_squares=float((counts * centers ** 2).sum()),
                                      bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(),
                                      global_step=epoch)

    def close(self):
        self.writer.close()
