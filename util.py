"""The command line's run-time side and the run's records: one-line errors and interrupts (:func:`run_cli`),
progress bars, meters and top-k accuracy, per-epoch logging (:class:`RunLogger`). Devices, precision, seeds and
RNG states live in ``runtime.py``; the learning-rate schedule and the optimizer in ``schedule.py``."""
import csv
import hashlib
import os
import re
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from flags import UserError


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is (as Ctrl-C raises KeyboardInterrupt)."""


_MAIN_PID = os.getpid()


def _raise_interrupted(signum, frame):
    """SIGTERM and SIGINT: the first raises where the program is (:class:`Interrupted`, ``KeyboardInterrupt``) and
    makes the process ignore the rest, so a burst of signals gives one message while the run winds down (a
    signal raised in a finalizer or at exit would print an 'Exception ignored' traceback each)."""
    if os.getpid() != _MAIN_PID:       # a forked DataLoader worker: as by default
        if signum == signal.SIGINT:
            raise KeyboardInterrupt()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted() if signum == signal.SIGTERM else KeyboardInterrupt()


# The run folder of this process's run, set by ``engine.setup``: an interrupt says how to continue it; the open
# file of the folder's lock (:func:`hold_run_folder`), closed when the script ends.
RUN = {'folder': None, 'lock': None}


def hold_run_folder(folder):
    """Take the exclusive lock of ``folder`` (``flock`` on ``<folder>/.lock``, released by the system when the
    process ends, however it ends, or when :func:`run_cli` returns) and write who holds it there. Returns ``None``,
    or, without waiting, why the folder cannot be had: its holder's pid, host, start time and command line."""
    try:
        import fcntl
    except ImportError:       # no flock on this system: folders are not locked
        return None
    release_run_folder()       # one folder per process (and flock would refuse a second open of the same file)
    f = open(os.path.join(folder, '.lock'), 'a+')
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or 'another process'
        f.close()
        return (f'{folder} is in use by {holder}: wait for it to finish, or start this run with a new --trial or '
                f'--save_folder')
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on {socket.gethostname()} since {time.strftime("%Y-%m-%d %H:%M:%S")} '
            f'({" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]})\n')
    f.flush()
    RUN['lock'] = f
    return None


def release_run_folder():
    """Give the run folder's lock back (a script run in-process, as the tests run some, outlives its run)."""
    if RUN['lock'] is not None:
        RUN['lock'].close()
        RUN['lock'] = None


def interrupt_message(what='interrupted'):
    """What a run stopped by ``what`` prints: how to continue it (``--resume``), or that nothing was saved yet."""
    folder = RUN['folder']
    last = os.path.join(folder, 'last.pth') if folder else None
    if last and os.path.isfile(last):
        return f'{what}; the last complete checkpoint is intact: continue with --resume {last}'
    return f'{what} before the first checkpoint (written after each epoch): nothing to resume'


def writable_folder(folder, flag):
    """Create ``folder`` (and its parents) and check that a file can be written there, before any work; a
    :class:`UserError` naming ``flag`` otherwise."""
    import tempfile
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f'cannot write to {folder} ({e.strerror or type(e).__name__}); choose another {flag}') \
            from None
    return folder


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
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:    # not where SIGINT is ignored (nohup, &)
        signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        main()
    except UserError as e:
        print(f'{prog}: error: {error_line(e)}', file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        under_torchrun = isinstance(e, Interrupted) and int(os.environ.get('WORLD_SIZE', '1')) > 1
        print(f'{prog}: ' + interrupt_message('interrupted (torchrun stops every process when one fails or when it is '
                                              'stopped itself)' if under_torchrun else 'interrupted'), file=sys.stderr)
        sys.exit(143 if isinstance(e, Interrupted) else 130)
    except Exception as e:
        if not (dist.is_available() and dist.is_initialized() and peer_died(e)):
            raise
        detail = re.sub(r'^\[[^\]]*\]\s*', '', error_line(e)).split('. ')[0][:100]      # gloo: [file:line] text.
        print(f'{prog}: error: ' + interrupt_message(f'another torchrun process died ({detail}; torchrun\'s report '
                                                    f'names it)'), file=sys.stderr)
        sys.exit(1)
    finally:
        # the process is ending: a signal now (torchrun stopping the other processes) has nothing left to interrupt
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        release_run_folder()
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:      # a process group whose peer is gone may not shut down cleanly: nothing to add
                pass


PEER_FAILURES = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe', 'Connection refused',
                 'communicator was aborted', 'NCCL communicator', 'Socket Timeout')


def peer_died(error):
    """Whether ``error``, raised by a collective under torchrun, says that another process of the group is gone
    (gloo's and NCCL's wordings) rather than that this one failed."""
    text = f'{type(error).__name__}: {error}'
    return isinstance(error, RuntimeError) and any(w in text for w in PEER_FAILURES)


def progress(iterable, desc, total=None):
    """A tqdm bar on a terminal (rank 0 only under torchrun); plain periodic lines otherwise."""
    quiet = dist.is_available() and dist.is_initialized() and dist.get_rank() != 0
    return tqdm(iterable, desc=desc, total=total, disable=True if quiet else None, leave=False,
                dynamic_ncols=True)


class AverageMeter:
    """Running average of a scalar (``val``: the last value)."""

    def __init__(self):
        self.val, self.sum, self.count = 0.0, 0.0, 0

    def update(self, val, n=1):
        self.val = float(val)
        self.sum += self.val * n
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


# ---------------------------------------------------------------- run logging
def _write_csv(path, rows):
    """Rewrite ``path`` with ``rows`` through a temporary file and a rename (never half a file)."""
    with open(path + '.tmp', 'w', newline='') as f:
        csv.writer(f).writerows(rows)
    os.replace(path + '.tmp', path)


def read_metrics(folder):
    """The rows of ``<folder>/metrics.csv`` (what :class:`RunLogger` writes) as dicts of strings; ``[]`` without the
    file."""
    path = os.path.join(folder, 'metrics.csv')
    if not os.path.isfile(path):
        return []
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


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


# ---------------------------------------------------------------- run folder names (options.run_name)
NAME_MAX = 255     # bytes of one file name on common file systems (ext4, XFS, APFS, NTFS)
HASH_CHARS = 12


def fit_name(name, limit=NAME_MAX):
    """``name`` if it fits in ``limit`` bytes; otherwise its first bytes and ``_`` and the first 12 hex digits of its
    SHA-1 (stable: the same settings always give the same folder, and different ones differ). The full name is
    in the folder's ``run.json`` (``engine.prepare_run_folder``)."""
    encoded = name.encode()
    if len(encoded) <= limit:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:HASH_CHARS]
    head = encoded[:limit - HASH_CHARS - 1].decode(errors='ignore')
    return f'{head}_{digest}'
