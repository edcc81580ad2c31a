"""TensorBoard: the one writer of a run folder (``<run>/tensorboard``), opened by ``runtime/run_log.py``."""


def open_writer(folder, purge_step):
    """A ``SummaryWriter`` in ``folder`` that drops the events of steps from ``purge_step`` on (a resumed run's)."""
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(folder, purge_step=purge_step)
