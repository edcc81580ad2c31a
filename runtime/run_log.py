"""A run's records: per-epoch metrics to ``<run>/metrics.csv`` and TensorBoard (:class:`RunLogger`), histograms to
``<run>/histograms.csv``, warnings to ``<run>/warnings.txt``; :func:`read_metrics` reads metrics.csv back."""
import csv
import os

import torch


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

    def __init__(self, folder, start_epoch=1, tensorboard=True, trackers=()):
        from tracking.tensorboard import open_writer
        os.makedirs(folder, exist_ok=True)
        self.trackers = list(trackers)          # tracking.trackers' open runs (W&B, MLflow): every epoch's scalars
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
        self.writer = open_writer(os.path.join(folder, 'tensorboard'), start_epoch) if tensorboard else None

    def log(self, epoch, metrics, histograms=None):
        for tracker in self.trackers:
            tracker.log(epoch, metrics)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, epoch)
        for key, counts in (histograms or {}).items():
            if self.writer is not None:
                self._histogram(key, counts, epoch)
            self.hist_rows.append([epoch, key] + [int(c) for c in torch.as_tensor(counts).tolist()])
        if self.writer is not None:
            self.writer.flush()
        if histograms:
            _write_csv(self.hist_path, [['epoch', 'name', 'counts...']] + self.hist_rows)
        self.rows.append({'epoch': epoch, **{k: f'{v:.6g}' for k, v in metrics.items()}})
        fields = ['epoch'] + sorted({k for r in self.rows for k in r} - {'epoch'})
        _write_csv(self.csv_path, [fields] + [[r.get(k, '') for k in fields] for r in self.rows])

    def note(self, epoch, text):
        """A one-line message (a warning) to TensorBoard's text tab and ``<run>/warnings.txt``."""
        if self.writer is not None:
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
        """TensorBoard's files closed; the trackers stay open for the run's results (``tracking.trackers.finish``)."""
        if self.writer is not None:
            self.writer.close()
