"""SupContrast's helpers: progress bars, running averages (:class:`AverageMeter`) and top-k accuracy. The rest of what
this module once held has homes of its own: the command line's run-time side in ``config/cli.py``, the run folder
(name, lock, writability) in ``runtime/run_folder.py``, the per-epoch records in ``runtime/run_log.py``; devices,
precision in ``runtime/device.py``, seeds in ``runtime/rng.py``, the learning-rate schedule and the optimizer in
``training/schedule.py``."""
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
