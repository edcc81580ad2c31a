"""The command line's run-time side and the run's records: one-line errors and interrupts (:func:`run_cli`),
progress bars, meters and top-k accuracy, per-epoch logging (:class:`RunLogger`). Devices, precision, seeds and
RNG states live in ``runtime.py``; the learning-rate schedule and the optimizer in ``schedule.py``."""
import csv
import os
import signal
import sys

import torch
import torch.distributed as dist
from tqdm import tqdm

from flags import UserError


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
