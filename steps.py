"""What one training step computes: the loss of a batch and its statistics, for ``main_supcon.py``
(any registered method, optionally with CARROT) and ``main_ce.py`` (cross-entropy, optionally with
CARROT). The training loop (``engine.train_loop``) back-propagates and steps the optimizer."""
import torch
import torch.nn.functional as F

from distributed import all_reduce_sum, gather, gather_with_grad
from losses_carrot import grad_balanced_total_loss
from monitors import collapse_statistics
from util import accuracy, autocast, to_device


def carrot_term(opt, carrot, base, h, labels, params=()):
    """``base + alpha * CARROT(h, labels)`` (alpha gradient-balanced unless ``--carrot_weight``) and
    the step's statistics. ``params``: parameters between ``h`` and ``base`` (head, classifier)."""
    # under torchrun: corridor and R on the global batch, alpha from norms over the global batch
    reg = carrot(gather_with_grad(h), gather(labels))
    total, alpha = grad_balanced_total_loss(base, reg, h, params=params, weight=opt.carrot_weight,
                                            alpha_max=opt.carrot_alpha_max, reduce_sum=all_reduce_sum)
    return total, {**{f'carrot/{k}': v for k, v in carrot.last_stats.items()}, 'carrot/alpha': alpha}


def contrastive_loss(opt, method, ddp_model, model, criterion, carrot, views, labels, sample_idx=None):
    """One step's loss and statistics on a batch of ``views`` (a list of ``[b, C, H, W]``).

    ``method`` is the registry entry of ``--method``; ``ddp_model`` is what the forward goes through
    (DDP under torchrun), ``model`` the module itself. Under torchrun the loss sees the global batch
    (samples in rank order).
    """
    labels = labels.to(opt.device)
    bsz, n_views = labels.shape[0], len(views)
    images = to_device(opt, torch.cat(views, dim=0))            # view-major rows: v * bsz + b
    with autocast(opt):
        h_enc, h_proj = ddp_model(images, parts=True)
    features = F.normalize(h_proj, dim=1)
    features = torch.stack(torch.split(features, bsz, dim=0), dim=1)  # [bsz, n_views, feat_dim]
    features = gather_with_grad(features)                       # no-op in one process
    args = (features, gather(labels) if method.uses_labels else None)
    if method.uses_ids:
        args += (gather(sample_idx.to(opt.device)),)
    loss = criterion(*args)
    stats = {f'{method.stats_prefix}{k}': v for k, v in criterion.last_stats.items()}
    # collapse monitors of the global batch (the projections are gathered already)
    stats.update(collapse_statistics(gather(h_enc.detach()), 'enc'),
                 **collapse_statistics(features.detach().reshape(-1, features.shape[-1]), 'proj'))
    if carrot is not None:
        # rows of h are view-major like the images, so labels are repeated (not interleaved)
        h, params = (h_enc, model.head.parameters()) if opt.carrot_on == 'encoder' else (h_proj, ())
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels.repeat(n_views), params)
        stats.update(carrot_stats)
    return loss, stats


def ce_loss(opt, ddp_model, model, carrot, images, labels):
    """One step's cross-entropy (+ CARROT on the penultimate features) and statistics. ``ddp_model``
    is what the forward goes through (DDP under torchrun), ``model`` the module itself."""
    images, labels = to_device(opt, images), labels.to(opt.device)
    with autocast(opt):
        h, logits = ddp_model(images, parts=True)
    loss = F.cross_entropy(logits.float(), labels)   # this process's batch; DDP averages the gradients
    stats = {'acc': accuracy(logits, labels)[0], **collapse_statistics(h, 'enc')}
    if carrot is not None:
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels, model.fc.parameters())
        stats.update(carrot_stats)
    return loss, stats
