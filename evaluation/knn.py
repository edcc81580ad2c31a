"""Weighted kNN classification of frozen features: the online monitor of ``main_supcon.py --knn_every``.

As in the instance-discrimination literature (Wu et al. 2018, InstDisc; MoCo and others use the same
monitor): cosine similarity to every training feature, the k nearest neighbours vote for their class
with weight ``exp(sim / t)``, and the class with the largest total wins.
"""
import numpy as np
import torch
import torch.nn.functional as F

from core.flags import Feature, UserError, call_hook, check, check_temperature
from data import build_dataset, build_loader, build_transform, coarse_labels, num_classes
from runtime.device import Runtime
from util import progress


@torch.no_grad()
def rankme(features, eps=1e-7):
    """Effective rank ``exp(-sum_k p_k log p_k)`` with ``p_k = s_k / sum(s) + eps`` over the singular
    values ``s`` of ``features`` ``[N, D]`` (RankMe, Garrido et al. 2023). Between 1 and ``min(N, D)``."""
    s = torch.linalg.svdvals(features.double())
    p = s / s.sum().clamp(min=1e-300) + eps
    return float(torch.exp(-(p * p.log()).sum()))

def few_shot_indices(targets, shots, seed):
    """Indices of ``shots`` training images per class (sorted), drawn uniformly without replacement with
    ``seed``; a class with fewer images is a :class:`UserError`. (``docs/PROBES.md``, few-shot probes.)"""
    targets = np.asarray(targets)
    rng = np.random.RandomState(seed % 2 ** 32)
    chosen = []
    for c in np.unique(targets):
        members = np.flatnonzero(targets == c)
        if len(members) < shots:
            raise UserError(f'class {c} has {len(members)} training images, fewer than --shots {shots}')
        chosen.extend(rng.choice(members, shots, replace=False).tolist())
    return sorted(chosen)


@torch.no_grad()
def extract_features(runtime: Runtime, encoder, loader):
    """L2-normalized encoder features and labels of a whole loader: ``([N, D] float32, [N])``."""
    feats, labels = [], []
    for images, y in progress(loader, 'features'):
        with runtime.autocast():
            h = encoder(runtime.to_device(images))
        feats.append(F.normalize(h.float(), dim=1))
        labels.append(y.to(runtime.device, non_blocking=True))
    return torch.cat(feats), torch.cat(labels)


def top_k_neighbours(sims, k):
    """Indices ``[n, k]`` of the ``k`` largest entries of each row of ``sims`` ``[n, N]``, in increasing index
    order. Ties at the k-th value go to the lowest training index (a stable sort keeps equal values in index
    order), so the neighbours do not depend on how a device's ``topk`` orders equal values (equal similarities
    are common: duplicated images). Fixed shapes: no host synchronization."""
    order = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :k]
    return order.sort(dim=1).values


KNN_MEMORY_BUDGET = 256 * 2 ** 20   # bytes of the per-chunk work ([rows, N] similarities and their sort)


def knn_chunk_rows(n_train, k, num_classes, budget=KNN_MEMORY_BUDGET):
    """Test rows per chunk so that a chunk's work stays within ``budget`` bytes: per row, the ``[N]`` float32
    similarities, their sorted copy and its int64 indices (16 bytes per training sample) and the ``[k, C]``
    float32 votes with their class matches (5 bytes per entry); at least one row."""
    return max(1, budget // (16 * max(1, n_train) + 5 * k * num_classes))


@torch.no_grad()
def knn_predict(train_feats, train_labels, test_feats, num_classes, k=200, t=0.1, chunk=None):
    """Predicted classes ``[M]`` of ``test_feats`` ``[M, D]`` from ``train_feats`` ``[N, D]`` (both
    L2-normalized) and ``train_labels`` ``[N]``: ``argmax_c sum_{j in topk(i)} exp((s_ij - max_j s_ij) / t) [y_j = c]``
    (the row maximum is subtracted so that a small ``t`` cannot overflow; the argmax is unchanged).

    ``k`` is capped at N. Deterministic on every device: ties at the k-th similarity go to the lowest
    training index (:func:`top_k_neighbours`), votes are summed in index order (no atomic scatter), and a
    tie between classes goes to the lowest class. Rows are processed ``chunk`` at a time (default: within
    ``KNN_MEMORY_BUDGET``, :func:`knn_chunk_rows`), so memory does not grow with the test split.
    """
    k = min(k, train_feats.shape[0])
    chunk = chunk or knn_chunk_rows(train_feats.shape[0], k, num_classes)
    classes = torch.arange(num_classes, device=train_labels.device)
    preds = []
    for start in range(0, test_feats.shape[0], chunk):
        sims = test_feats[start:start + chunk] @ train_feats.T
        top_idx = top_k_neighbours(sims, k)
        top = sims.gather(1, top_idx)
        weights = ((top - top.max(1, keepdim=True).values) / t).exp()
        votes = ((train_labels[top_idx][:, :, None] == classes).to(weights.dtype) * weights[:, :, None]).sum(1)
        preds.append(votes.argmax(1))
    return torch.cat(preds)


def knn_monitor(opt):
    """``monitor(encoder, epoch)`` for ``main_supcon.py --knn_every N``: weighted kNN top-1 of the encoder's
    features, every N epochs and at the last, with the training part as the bank and as queries the held-out part
    (``--val_split``: ``knn/val_acc``) or else the test split (``knn/acc``); with coarse training also the fine
    labels' (``knn/val_acc_fine``, ``knn/acc_fine``), and the effective rank of the unit query features
    (``collapse/rankme_val`` or ``collapse/rankme_test``, :func:`rankme`). Features are extracted once per
    evaluation; coarse labels are the fine ones mapped. With ``--knn_shots K`` each accuracy is also given for a
    bank of only ``K`` labelled training images per class (``..._Kshot``; ``k = min(--knn_k, K * classes)``), the
    same draw (seed 0) at every evaluation, so the curve follows the encoder, not the draw."""
    transform = build_transform(opt, 'eval')
    part = 'val' if opt.val_split > 0 else 'test'       # never the test split when a part is held out
    memory = build_loader(opt, build_dataset(opt, 'train', transform, 'fine'), train=False)
    queries = build_loader(opt, build_dataset(opt, part, transform, 'fine'), train=False)
    n_fine = num_classes(memory.dataset)
    runtime = call_hook(Runtime, opt)
    name = 'knn/val_acc' if part == 'val' else 'knn/acc'
    # metric -> (fine label -> training label, number of classes)
    label_maps = {name: (torch.arange(n_fine, device=opt.device), n_fine)}
    if opt.label_granularity == 'coarse':
        mapping, classes = coarse_labels(opt.dataset)
        label_maps = {name: (torch.as_tensor(mapping, device=opt.device), len(classes)),
                      f'{name}_fine': label_maps[name]}

    # the test split at the last epoch only under --test_every end (a tuned sweep's seeded cells: read it once)
    every = opt.epochs if part == 'test' and opt.test_every == 'end' else opt.knn_every

    def monitor(encoder, epoch):
        if epoch % every and epoch != opt.epochs:
            return {}
        encoder.eval()
        bank, bank_y = extract_features(runtime, encoder, memory)
        feats, y = extract_features(runtime, encoder, queries)
        out = {}
        for key, (to, n_cls) in label_maps.items():
            pred = knn_predict(bank, to[bank_y], feats, n_cls, opt.knn_k, opt.knn_t)
            out[key] = 100.0 * (pred == to[y]).float().mean().item()
            if opt.knn_shots:
                labels = to[bank_y]
                idx = torch.as_tensor(few_shot_indices(labels.cpu().numpy(), opt.knn_shots, 0), device=labels.device)
                pred = knn_predict(bank[idx], labels[idx], feats, n_cls, min(opt.knn_k, idx.numel()), opt.knn_t)
                out[f'{key}_{opt.knn_shots}shot'] = 100.0 * (pred == to[y]).float().mean().item()
        out[f'collapse/rankme_{part}'] = rankme(feats)      # effective rank of the unit query features
        return out
    return monitor


# ---------------------------------------------------------------- the monitor's flags (core/flags.py)
def _check_monitor(knn_every, knn_k, knn_t, knn_shots):
    check(knn_every >= 0 and knn_k >= 1, '--knn_every must be >= 0 and --knn_k >= 1')
    check_temperature('--knn_t', knn_t)
    check(knn_shots >= 0, f'--knn_shots must be >= 0 (K labelled images per class; 0: off), got {knn_shots}')
    check(not knn_shots or knn_every, '--knn_shots is a setting of the kNN monitor: give --knn_every N too')


MONITOR = Feature(
    'kNN monitor', scripts=('supcon',), check=_check_monitor,
    resume_may_change=('knn_every', 'knn_k', 'knn_t', 'knn_shots'),
    flags={'--knn_every': dict(type=int, default=0, help='every N epochs (and at the last), weighted kNN accuracy of '
                                                         'encoder features on the held-out part (--val_split), '
                                                         'else on the test split (0: off)'),
           '--knn_k': dict(type=int, default=200, help='kNN monitor: neighbours'),
           '--knn_t': dict(type=float, default=0.1, help='kNN monitor: temperature of the vote weights'),
           '--knn_shots': dict(type=int, default=0, help='kNN monitor: also the accuracy with only K labelled '
                                                         'training images per class (0: off)')})
