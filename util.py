"""SupContrast's helpers: progress bars, running averages (:class:`AverageMeter`), top-k accuracy, and the clock
format (``1:02:03``) of the time lines."""
import torch
import torch.distributed as dist
from tqdm import tqdm


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


def clock(seconds):
    """``1:02:03`` / ``2:03``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{secs:02d}' if hours else f'{minutes}:{secs:02d}'
