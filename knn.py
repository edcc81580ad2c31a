"""Weighted kNN classification of frozen features: the online monitor of ``main_supcon.py --knn_every``.

As in the instance-discrimination literature (Wu et al. 2018, InstDisc; MoCo and others use the same
monitor): cosine similarity to every training feature, the k nearest neighbours vote for their class
with weight ``exp(sim / t)``, and the class with the largest total wins.
"""
import torch
import torch.nn.functional as F

from engine import progress
from util import autocast, to_device


@torch.no_grad()
def extract_features(opt, encoder, loader):
    """L2-normalized encoder features and labels of a whole loader: ``([N, D] float32, [N])``."""
    feats, labels = [], []
    for images, y in progress(loader, 'features'):
        with autocast(opt):
            h = encoder(to_device(opt, images))
        feats.append(F.normalize(h.float(), dim=1))
        labels.append(y.to(opt.device))
    return torch.cat(feats), torch.cat(labels)


@torch.no_grad()
def knn_predict(train_feats, train_labels, test_feats, num_classes, k=200, t=0.1, chunk=1024):
    """Predicted classes ``[M]`` of ``test_feats`` ``[M, D]`` from ``train_feats`` ``[N, D]`` (both
    L2-normalized) and ``train_labels`` ``[N]``: ``argmax_c sum_{j in topk(i)} exp(s_ij / t) [y_j = c]``.

    ``k`` is capped at N. Rows are processed ``chunk`` at a time ([chunk, N] similarities).
    """
    k = min(k, train_feats.shape[0])
    preds = []
    for start in range(0, test_feats.shape[0], chunk):
        sims = test_feats[start:start + chunk] @ train_feats.T
        top_sims, top_idx = sims.topk(k, dim=1)
        votes = torch.zeros(sims.shape[0], num_classes, device=sims.device, dtype=sims.dtype)
        votes.scatter_add_(1, train_labels[top_idx], (top_sims / t).exp())
        preds.append(votes.argmax(1))
    return torch.cat(preds)


def knn_accuracy(opt, encoder, train_loader, test_loader, num_classes, k=200, t=0.1):
    """Top-1 (%) of the weighted kNN classifier on ``test_loader``'s features."""
    train_feats, train_labels = extract_features(opt, encoder, train_loader)
    test_feats, test_labels = extract_features(opt, encoder, test_loader)
    pred = knn_predict(train_feats, train_labels, test_feats, num_classes, k, t)
    return 100.0 * (pred == test_labels).float().mean().item()
