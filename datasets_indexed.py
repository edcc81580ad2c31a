"""``IndexedDataset``: a dataset wrapper that also returns each sample's index."""
from torch.utils.data import Dataset


class IndexedDataset(Dataset):
    """Wraps any ``(x, y)`` dataset so that ``ds[i]`` is ``(x, y, i)``.

    Losses that keep per-sample state (RASCAL's feature cache) need the index.
    ``len`` and attributes such as ``classes`` and ``targets`` pass through to ``base``.
    """

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x, y, index

    def __getattr__(self, name):
        if name == 'base':  # not set yet (e.g. while unpickling in a worker)
            raise AttributeError(name)
        return getattr(self.base, name)
