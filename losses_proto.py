"""The published SupCon variants with parameters of their own: class prototypes and a classifier inside the loss
(definitions in our words: docs/FIELD.md, "BCL", "PaCo" and "TSC"): BCL, PaCo and GPaCo, TSC.

Such a loss is an ``nn.Module`` with parameters; the methods registry says that it reads the encoder's features
(``Method.uses_encoder_features``), and ``steps.Pretraining`` optimizes its parameters with the model's, saves them
in checkpoints (its ``state_dict``) and passes it the global batch's encoder features. Its gradient is exact under
``--chunk_size`` (gradient caching calls the loss once, on the whole batch's features); under torchrun its parameters
start from rank 0's and their gradients are averaged over processes (``steps.Pretraining``).
"""
import math

import numpy as np
import torch
import torch.nn as nn

from losses import (
    LogitAdjustedLoss,
    Loss,
    flatten_views,
    float32_under_autocast,
    positive_dots,
    queue_logsumexp,
    upcast,
)
from losses_field import KCLLoss


@float32_under_autocast
def bcl_loss(features, labels, prototypes, temperature=0.1):
    """The balanced contrastive term of BCL (Zhu et al., CVPR 2022), docs/FIELD.md, "BCL"::

        rows i = 1..M (M = V*B unit projections, view-major) and C unit prototypes p_c (columns only);
        A(i): every row and prototype but i;  n_c(i): the members of class c in A(i);
        L = mean_i -1/|P(i)| sum_{k in P(i)} [ s_ik - log sum_c 1/n_c(i) sum_{a in A(i), y_a = c} exp(s_ia) ]
        s_ia = z_i.a / tau

    with ``P(i)`` the members of ``i``'s class in ``A(i)`` (its other views, same-class rows and its prototype:
    never empty). Class-averaging: each class's terms of the denominator are averaged, so a head class
    weighs as much as a tail class; class-complement: every class is in every batch through its prototype.

    Shapes: ``features`` ``[B, V, D]`` unit rows, ``labels`` ``[B]`` in ``[0, C)``, ``prototypes`` ``[C, D]`` unit
    rows. Output: scalar (float32, float64 for float64 input). Every per-class sum is a product with the ``[B, C]``
    one-hot labels (deterministic on every device, unlike an atomic ``index_add``; fixed shapes, no host
    synchronization): the positive sums from the class sums of the rows, the denominator from one stabilized
    exponential of the ``[M, M + C]`` logits summed per class (``[M, C]``) and divided by ``n_c(i)``.
    """
    z, bsz, n_views = flatten_views(features)
    z = upcast(z)
    protos = prototypes.to(z.dtype)
    n_classes, n_rows = protos.shape[0], z.shape[0]
    labels = labels.reshape(-1).to(z.device, non_blocking=True)
    one_hot = (labels[:, None] == torch.arange(n_classes, device=z.device)).to(z.dtype)     # [B, C]
    counts = n_views * one_hot.sum(0) + 1                            # [C] views + one prototype per class
    row_class = one_hot.repeat(n_views, 1)                            # [M, C]
    logits = z @ torch.cat([z, protos]).T / temperature              # [M, M + C]
    logits[:, :n_rows].diagonal().fill_(-math.inf)                   # i is not in A(i)
    shift = logits.detach().amax(1, keepdim=True)
    per_class = torch.exp(logits - shift) @ torch.cat([row_class, torch.eye(n_classes, dtype=z.dtype,
                                                                           device=z.device)])   # [M, C]
    in_class = counts[None, :] - row_class                          # n_c(i): i itself is not counted
    log_denominator = torch.log((per_class / in_class).sum(1)) + shift[:, 0]             # [M]
    class_sums = one_hot.T @ z.reshape(n_views, bsz, -1).sum(0) + protos                 # [C, D]
    positive_dots = (z * (row_class @ class_sums - z)).sum(1) / temperature           # sum over P(i) of z_i.a / tau
    n_positive = row_class @ counts - 1
    return (log_denominator - positive_dots / n_positive).mean()


class CosineClassifier(nn.Module):
    """The cosine classifier of BCL's code (its ``NormedLinear``): ``logits = s * normalize(h) @ normalize(W).T``,
    ``W`` ``[C, E]`` (rows: the classes, as ``nn.Linear``'s weight, so BCL's prototypes read the same rows), each row
    drawn uniformly on ``[-1, 1]`` and scaled to unit length; ``s`` the scale (30 in the authors' code)."""

    def __init__(self, in_features, n_classes, scale=30.0):
        super().__init__()
        self.scale = scale
        self.weight = nn.Parameter(nn.functional.normalize(torch.empty(n_classes, in_features).uniform_(-1, 1), dim=1))

    def forward(self, h):
        return self.scale * nn.functional.normalize(h, dim=1) @ nn.functional.normalize(self.weight, dim=1).T


class BCLLoss(Loss):
    """BCL (Zhu et al., CVPR 2022, "Balanced Contrastive Learning for Long-Tailed Visual Recognition";
    docs/FIELD.md, "BCL"): a classifier on the encoder features trained with logit-adjusted cross-entropy
    (the training labels' priors) on both views, plus the balanced contrastive term :func:`bcl_loss` over the
    projections and one prototype per class, ``p_c = normalize(g(w_c))``, where ``w_c`` is the classifier's row of
    class ``c`` and ``g`` a two-layer MLP (Linear, ReLU, Linear) onto the projection space::

        L = ce_weight * LA-CE(f(h), y) + bcl_weight * L_BCL(z, y, p)

    ``f`` is the authors' cosine classifier by default, ``f(h)_c = s * cos(h, w_c)`` (:class:`CosineClassifier`):
    its logits are bounded by ``s``. A plain linear layer (``classifier='linear'``, ``f(h) = W h + b``) has logits
    that grow with ``|h|^2`` after one SGD step: on a ResNet-18's 512-dimensional features at learning rate 0.2 the
    cross-entropy reaches 40 within four steps and the representation collapses (docs/FIELD.md, "BCL").

    Args:
        class_counts: training samples per class ``[C]`` (the logit adjustment's priors; ``C`` classes).
        enc_dim: the encoder's feature dimension; ``feat_dim``: the projections'.
        temperature: ``tau`` of :func:`bcl_loss`.
        ce_weight, bcl_weight: the weights of the two terms (``--bcl_ce_weight``, ``--bcl_weight``).
        classifier: ``'cosine'`` (the authors') or ``'linear'``; scale: ``s`` of the cosine classifier.

    ``forward(features [B, V, D], labels [B], h_enc=[V*B, E])``: ``h_enc`` the encoder features of the same rows
    (view-major). Statistics: ``bcl/ce`` and ``bcl/contrastive``.
    """

    def __init__(self, class_counts, enc_dim, feat_dim, temperature=0.1, ce_weight=2.0, bcl_weight=0.6,
                 classifier='cosine', scale=30.0):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f'temperature must be > 0, got {temperature}')
        if not (ce_weight >= 0 and bcl_weight >= 0):
            raise ValueError(f'the weights must be >= 0, got {ce_weight} and {bcl_weight}')
        if classifier not in ('cosine', 'linear') or not scale > 0:
            raise ValueError(f'need classifier in (cosine, linear) and scale > 0, got {classifier!r} and {scale}')
        self.temperature, self.ce_weight, self.bcl_weight = temperature, ce_weight, bcl_weight
        self.classifier = (CosineClassifier(enc_dim, len(class_counts), scale) if classifier == 'cosine'
                           else nn.Linear(enc_dim, len(class_counts)))
        self.prototype_head = nn.Sequential(nn.Linear(enc_dim, enc_dim), nn.ReLU(inplace=True),
                                            nn.Linear(enc_dim, feat_dim))
        self.adjusted_ce = LogitAdjustedLoss(class_counts, tau=1.0)

    def prototypes(self):
        """``[C, D]`` unit prototypes from the classifier's rows."""
        return nn.functional.normalize(self.prototype_head(self.classifier.weight), dim=1)

    def forward(self, features, labels, h_enc=None):
        if labels is None or h_enc is None:
            raise ValueError('BCL needs labels and the encoder features (h_enc=)')
        n_views = features.shape[1]
        logits = self.classifier(h_enc.to(self.classifier.weight.dtype))
        ce = self.adjusted_ce(logits, labels.reshape(-1).to(logits.device, non_blocking=True).repeat(n_views))
        contrastive = bcl_loss(features, labels, self.prototypes(), self.temperature)
        self.last_stats = {'ce': ce.detach(), 'contrastive': contrastive.detach()}
        return self.ce_weight * ce + self.bcl_weight * contrastive


@float32_under_autocast
def paco_loss(features, labels, class_logits, temperature=0.05, alpha=0.01, beta=1.0, gamma=1.0, queue=None):
    """Parametric contrastive loss (PaCo, Cui et al., ICCV 2021), docs/FIELD.md, "PaCo"::

        rows i = 1..M (M = V*B unit projections, view-major); s_ia = z_i.a / tau;
        l_ic: the class logits of row i (the classifier's, plus log pi_c for PaCo), c = 1..C;
        D_i = sum_c exp(l_ic) + gamma * sum_{a != i} exp(s_ia)   (a: the other rows and the valid queue keys)
        L = mean_i [ log D_i - (beta * l_{i,y_i} + alpha * sum_{p in P(i)} s_ip) / (beta + alpha * |P(i)|) ]

    ``P(i)``: the rows and valid queue keys of ``i``'s label but ``i`` (its other views included). The class
    entries are part of every contrast set; the own-class entry is a positive of weight ``beta``, each
    same-label sample one of weight ``alpha``, and ``gamma`` scales the samples' part of the denominator.

    Shapes: ``features`` ``[B, V, D]`` unit rows, ``labels`` ``[B]`` in ``[0, C)``, ``class_logits`` ``[V*B, C]``
    (view-major, as the rows); ``queue``: a ``memory_queue.QueueView``. Output: scalar (float32, float64 for
    float64 input). One logsumexp over each of ``[M, C]``, ``[M, M]`` (and ``[M, K]``), added; the positive sums
    from per-class sums (:func:`losses.positive_dots`); no host synchronization.
    """
    z, bsz, n_views = flatten_views(features)
    z = upcast(z)
    class_logits = class_logits.to(z.dtype)
    labels = labels.reshape(-1).to(z.device, non_blocking=True)
    log_gamma = math.log(gamma) if gamma > 0 else -math.inf
    logits = z @ z.T / temperature
    logits.diagonal().fill_(-math.inf)                                      # i is not in its own sums
    log_denominator = torch.logaddexp(torch.logsumexp(class_logits, dim=1), torch.logsumexp(logits, dim=1) + log_gamma)
    if queue is not None:                     # no [M, C + M + K] copy: the logsumexps added, the queue's in blocks
        log_denominator = torch.logaddexp(log_denominator, queue_logsumexp(z, queue, temperature) + log_gamma)
    own_class = class_logits.gather(1, labels.repeat(n_views)[:, None])[:, 0]
    positive_sum, n_positive = positive_dots(z, z, bsz, n_views, labels, queue=queue)
    weighted = (beta * own_class + alpha * positive_sum / temperature) / (beta + alpha * n_positive)
    return (log_denominator - weighted).mean()


class PaCoLoss(Loss):
    """PaCo (Cui et al., ICCV 2021, "Parametric Contrastive Learning") and, with ``prior=False``, GPaCo (its
    balanced-data form, Cui et al., TPAMI 2023); docs/FIELD.md, "PaCo". A linear classifier on the normalized
    encoder features gives every row ``C`` class entries in its contrast set (:func:`paco_loss`); PaCo adds the
    log class prior of the training labels to them (a class without a training sample counts as one).

    Args:
        class_counts: training samples per class ``[C]``.
        enc_dim: the encoder's feature dimension.
        temperature: ``tau``; alpha, beta, gamma: as :func:`paco_loss` (``--paco_alpha/_beta/_gamma``).
        prior: add ``log pi_c`` to the class logits (PaCo) or not (GPaCo).

    ``forward(features [B, V, D], labels [B], h_enc=[V*B, E], queue=None)``. Statistics: ``paco/class_acc``,
    the share of rows whose largest class logit is their label's.
    """

    def __init__(self, class_counts, enc_dim, temperature=0.05, alpha=0.01, beta=1.0, gamma=1.0, prior=True):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f'temperature must be > 0, got {temperature}')
        if not (alpha >= 0 and beta > 0 and gamma >= 0 and all(map(math.isfinite, (alpha, beta, gamma)))):
            raise ValueError(f'need alpha >= 0, beta > 0, gamma >= 0 (finite), got {alpha}, {beta}, {gamma}')
        self.temperature, self.alpha, self.beta, self.gamma = temperature, alpha, beta, gamma
        self.classifier = nn.Linear(enc_dim, len(class_counts))
        counts = torch.as_tensor(class_counts, dtype=torch.float64).clamp(min=1)
        offset = torch.log(counts / counts.sum()) if prior else torch.zeros_like(counts)
        self.register_buffer('offset', offset.float(), persistent=False)

    def forward(self, features, labels, h_enc=None, queue=None):
        if labels is None or h_enc is None:
            raise ValueError('PaCo needs labels and the encoder features (h_enc=)')
        h = nn.functional.normalize(h_enc.to(self.classifier.weight.dtype), dim=1)
        class_logits = self.classifier(h) + self.offset.to(h.dtype)
        loss = paco_loss(features, labels, class_logits, self.temperature, self.alpha, self.beta, self.gamma, queue)
        rows = labels.reshape(-1).to(h.device, non_blocking=True).repeat(features.shape[1])
        self.last_stats = {'class_acc': (class_logits.detach().argmax(1) == rows).float().mean()}
        return loss


# ---------------------------------------------------------------- TSC
def uniform_targets(n_classes, dim, seed=0, steps=10_000, temperature=0.07, lr=1e-3, device='cpu'):
    """TSC's targets: ``n_classes`` unit vectors in ``dim`` dimensions spread uniformly over the sphere, under a
    random rotation drawn from ``seed``; returned ``[C, dim]`` float32 on the CPU. With ``C <= dim + 1`` they are the
    regular simplex (every pair at cosine ``-1/(C-1)``, the optimum), built directly in float64; otherwise the
    authors' optimization: ``steps`` of Adam (``lr``) on the uniformity energy
    ``mean_i log sum_{j != i} exp(u_i.u_j / T)`` (``T = temperature``) of the normalized vectors, from a seeded
    Gaussian start, in float32 on ``device`` (1,000 classes in 128 dimensions: 10,000 steps of a
    ``[1000, 1000]`` product, seconds on a GPU; the start is drawn on the CPU, so every device starts alike)."""
    g = torch.Generator().manual_seed(int(seed) % 2 ** 63)
    if n_classes <= dim + 1:
        centered = torch.eye(n_classes, dtype=torch.float64) - 1.0 / n_classes      # the simplex, in R^C
        _, _, vh = torch.linalg.svd(centered)
        coords = centered @ vh[:max(n_classes - 1, 1)].T                           # the same, in R^(C-1)
        u = torch.zeros(n_classes, dim, dtype=torch.float64)
        u[:, :coords.shape[1]] = coords
        if n_classes == 1:
            u[0, 0] = 1.0
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
        rotation = q * torch.sign(torch.diagonal(r))[None, :]                          # uniform over rotations
        return nn.functional.normalize(u @ rotation.T, dim=1).float()
    start = nn.functional.normalize(torch.randn(n_classes, dim, generator=g, dtype=torch.float64), dim=1)
    u = start.float().to(device).requires_grad_(True)
    optimizer = torch.optim.Adam([u], lr=lr)
    off_diagonal = ~torch.eye(n_classes, dtype=torch.bool, device=u.device)
    for _ in range(steps):
        optimizer.zero_grad()
        unit_u = nn.functional.normalize(u, dim=1)
        logits = (unit_u @ unit_u.T / temperature).masked_fill(~off_diagonal, -math.inf)
        torch.logsumexp(logits, dim=1).mean().backward()
        optimizer.step()
    return nn.functional.normalize(u.detach(), dim=1).cpu()


def target_spread(targets):
    """``(max cosine, energy)`` of unit ``targets`` ``[C, D]``: the largest cosine between two targets and the
    uniformity energy ``mean_i log sum_{j != i} exp(u_i.u_j / 0.07)`` (float64)."""
    u = targets.double()
    cos = (u @ u.T).fill_diagonal_(-math.inf)
    return float(cos.max()), float(torch.logsumexp(cos / 0.07, dim=1).mean())


def assign_targets(class_means, present, targets):
    """The Hungarian matching of classes to targets: the permutation ``[C]`` (class -> target index) that
    maximizes the summed cosine between each present class's mean feature (``class_means`` ``[C, D]``,
    ``present`` ``[C]`` bool) and its target (``targets`` ``[C, D]`` unit rows); absent classes take what is left.
    The ``[C, C]`` cost is made where the inputs are and read back once (one wait for the device); the matching
    runs on the host (``scipy.optimize.linear_sum_assignment``): at the end of an epoch, or after every step under
    ``assign='step'``."""
    from scipy.optimize import linear_sum_assignment
    means = nn.functional.normalize(class_means.detach().double(), dim=1)
    cost = (-(means @ targets.to(means).T) * present.to(means)[:, None]).cpu()
    classes, chosen = linear_sum_assignment(cost.numpy())
    out = np.empty(len(classes), dtype=np.int64)
    out[classes] = chosen
    return torch.from_numpy(out)


@float32_under_autocast
def tsc_loss(features, labels, chosen, valid, targets, assignment, temperature=0.07, weight=1.0):
    """Targeted supervised contrastive loss (TSC, Li et al., CVPR 2022), docs/FIELD.md, "TSC"::

        rows i = 1..M (M = V*B unit projections, view-major); s_ia = z_i.a / tau; targets u_1..u_C (unit);
        A(i): every row but i, and every target;  t(i) = u_{assignment[y_i]}: the target of i's class;
        P(i) = O(i) + K(i): KCL's positives (i's other views and its drawn same-class rows);
        l_i = -( sum_{p in P(i)} log p_ip + lambda * log p_{i,t(i)} ) / ( |P(i)| + 1 ),
        log p_ia = s_ia - log sum_{a' in A(i)} exp(s_ia')

    mean over the ``M`` rows: the target's term is weighted by ``lambda`` but counts as one positive in the
    normalization (the authors' code; with ``lambda = 1`` the plain mean over ``P(i)`` and the target).

    Shapes: ``features`` ``[B, V, D]``, ``labels`` ``[B]``, ``chosen``/``valid`` ``[M, k]`` (from
    :func:`losses_field.kcl_positives`), ``targets`` ``[C, D]``, ``assignment`` ``[C]`` (long). Output: scalar
    (float32, float64 for float64 input). One logsumexp over ``[M, M + C]``; no host synchronization.
    """
    z, bsz, n_views = flatten_views(features)
    z = upcast(z)
    labels = labels.reshape(-1).to(z.device, non_blocking=True)
    targets = targets.to(z.device, z.dtype)
    logits = z @ z.T / temperature
    logits.diagonal().fill_(-math.inf)
    target_logits = z @ targets.T / temperature                                          # [M, C]
    log_denominator = torch.logsumexp(torch.cat([logits, target_logits], 1), dim=1)
    own_dot, n_own = positive_dots(z, z, bsz, n_views)                                   # O(i)
    chosen, valid = chosen.to(z.device, non_blocking=True), valid.to(z.device, non_blocking=True)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    drawn = torch.where(valid, logits.gather(1, chosen), zero).sum(1)                    # K(i)
    own_target = target_logits.gather(1, assignment.to(z.device)[labels].repeat(n_views)[:, None])[:, 0]
    n_rows_pos = n_own + valid.sum(1).to(z.dtype)                                       # |P(i)|
    logit_sum = own_dot / temperature + drawn + weight * own_target
    return (((n_rows_pos + weight) * log_denominator - logit_sum) / (n_rows_pos + 1)).mean()


class TSCLoss(KCLLoss):
    """TSC (Li et al., CVPR 2022, "Targeted Supervised Contrastive Learning for Long-Tailed Recognition";
    docs/FIELD.md, "TSC"): KCL's positives (drawn as :class:`losses_field.KCLLoss` draws them: seeded per call,
    the call count in checkpoints) plus ``C`` fixed targets spread uniformly on the sphere
    (:func:`uniform_targets`, seeded), all in every contrast set, each class's own target a positive. Each
    epoch (``assign='epoch'``) the targets are re-assigned to classes by a Hungarian matching to the class means of
    that epoch's projections (:meth:`end_epoch`, :func:`assign_targets`); the first epoch uses target ``c`` for class
    ``c``. ``assign='step'`` is the authors' schedule: after every step, against class centroids that follow the
    batches' class means by an exponential moving average (``ema``), which reads the centroids back to the host
    every step (one wait for the device per step). Targets, assignment, the running class sums and centroids are
    buffers: saved in checkpoints, resumed exactly.

    Args:
        n_classes: ``C``; feat_dim: the projections' dimension.
        k: KCL's drawn positives per anchor; temperature: ``tau``; weight: ``lambda`` of :func:`tsc_loss`.
        seed: seeds the targets and the draws; device: where the targets are optimized (:func:`uniform_targets`).
        assign: ``'epoch'`` or ``'step'``; ema: the centroids' decay under ``'step'``.

    Statistics: ``tsc/target_cos``, the mean cosine between the rows and their class's target.
    """

    def __init__(self, n_classes, feat_dim, k=6, temperature=0.07, weight=1.0, seed=0, assign='epoch', ema=0.9,
                 device='cpu'):
        super().__init__(k, temperature, seed)
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f'weight must be finite and >= 0, got {weight}')
        if assign not in ('epoch', 'step') or not 0 <= ema < 1:
            raise ValueError(f'need assign in (epoch, step) and ema in [0, 1), got {assign!r} and {ema}')
        self.weight, self.assign, self.ema = weight, assign, ema
        self.register_buffer('targets', uniform_targets(n_classes, feat_dim, seed, device=device))
        self.register_buffer('assignment', torch.arange(n_classes))
        self.register_buffer('class_sums', torch.zeros(n_classes, feat_dim))     # float32: any device has it
        self.register_buffer('class_counts', torch.zeros(n_classes))
        if assign == 'step':
            self.register_buffer('centroids', torch.zeros(n_classes, feat_dim))
            self.register_buffer('seen', torch.zeros(n_classes, dtype=torch.bool))

    def forward(self, features, labels, plan=None):
        """``plan``: the step's draw of KCL's positives (:meth:`host_plan`) when made already, else drawn here."""
        if features.dim() < 3:
            flatten_views(features)                                                  # its error message
        chosen, valid = self.host_plan(labels, None, features.shape[1], device=features.device) if plan is None \
            else plan
        with torch.no_grad():      # this epoch's class sums of the projections (a one-hot product: deterministic)
            z, _, n_views = flatten_views(features.detach().float())
            rows = labels.reshape(-1).to(z.device, non_blocking=True).repeat(n_views)
            one_hot = (rows[:, None] == torch.arange(self.targets.shape[0], device=z.device)).float()
            sums, counts = one_hot.T @ z, one_hot.sum(0)
            self.class_sums += sums
            self.class_counts += counts
            target_cos = (z * self.targets[self.assignment[rows]]).sum(1).mean()
        self.last_stats = {'target_cos': target_cos}
        loss = tsc_loss(features, labels, chosen, valid, self.targets, self.assignment, self.temperature, self.weight)
        if self.assign == 'step':
            self._assign_step(sums, counts)
        return loss

    @torch.no_grad()
    def _assign_step(self, sums, counts):
        """The authors' schedule: the batch's class means into the centroids (a class's first mean as it is), then
        the Hungarian matching against them, for the next step (a host read of the centroids)."""
        present = counts > 0
        mean = sums / counts.clamp(min=1)[:, None]
        moved = torch.where(self.seen[:, None], self.ema * self.centroids + (1 - self.ema) * mean, mean)
        self.centroids.copy_(torch.where(present[:, None], moved, self.centroids))
        self.seen |= present
        chosen = assign_targets(self.centroids, self.seen, self.targets)
        if self.assignment.is_cuda:      # from pinned memory without waiting (a pageable host copy waits)
            chosen = chosen.pin_memory()
        self.assignment.copy_(chosen, non_blocking=True)

    def end_epoch(self):
        """Re-assign the targets to the classes seen this epoch (Hungarian matching; ``assign='epoch'``), then clear
        the sums."""
        present = self.class_counts > 0
        if self.assign == 'epoch' and bool(present.any()):
            self.assignment.copy_(assign_targets(self.class_sums, present, self.targets))
        self.class_sums.zero_()
        self.class_counts.zero_()
