"""What ``main_supcon.py`` (:class:`Pretraining`: any registered method, optionally with CARROT and the memory queue)
and ``main_ce.py`` (:class:`CETraining`: cross-entropy, optionally with CARROT) train: each is a ``loop.Trainer`` that
owns its epoch (``train_epoch``: its modules in training mode, ``loop.train_loop`` over its step, what the epoch
reports) and its evaluation (``evaluate_epoch``); the loop zeroes the gradients before a step and steps the optimizer
after it.

Each step runs in one of two ways with the same loss code (``Pretraining.loss_from_parts``,
``CETraining.loss_from_parts``):

- plain: the model on the whole batch, one backward (under ``--compile`` the augmentation, the model and the loss
  as one graph, ``_forward_loss``, after the host has built the loss's and CARROT's plans, :class:`HostPlans`);
- gradient caching (``--chunk_size N``, ``training/chunks.py``): the encoder per chunk, the loss on the whole
  batch, the same parameter gradients as the plain step with the memory of one chunk's graph.
"""
import math
from collections import defaultdict
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from core.flags import Feature, call_hook, check
from data.views import PendingViews, pend_augmentation
from losses import LogitAdjustedLoss, SupConLoss, cross_entropy, flatten_views
from losses_noise import GCELoss, SCELoss
from methods import Method, get_method
from networks import SupCEResNet, SupConResNet
from runtime.device import Compiler, Runtime, dynamic_sizes
from runtime.distributed import (
    all_reduce_grads,
    broadcast_state,
    gather,
    gather_labels,
    gather_with_grad,
    is_distributed,
    wrap_model,
)
from training.carrot import carrot_term, compiles_with
from training.chunks import cached_step
from training.loop import Optimization, evaluate_parts, parts_after, train_loop
from training.memory_queue import MemoryQueue, MomentumEncoder, key_features, sample_keys
from training.monitors import collapse_statistics
from util import accuracy


class HostPlans(NamedTuple):
    """What a step builds on the host before its compiled graph, from the values of the labels and ids: the loss's
    plan (``losses.Loss.host_plan``) and CARROT's (:meth:`CarrotTerm.host_plan`), each ``None`` where there is
    none."""
    loss: object = None
    carrot: object = None


NO_PLANS = HostPlans()


# ---------------------------------------------------------------- stage 1: the pre-training object
class Pretraining:
    """What ``main_supcon.py`` trains, built once from ``opt``, and its step.

    Builds the model (``SupConResNet``; on ``opt.device``, wrapped in DDP under torchrun as ``ddp_model``),
    the method's loss (``criterion``, from the registry in ``methods.py``), ``carrot`` (``--carrot``),
    the memory ``queue`` and the momentum ``key_encoder`` (``--queue_size``, ``--moco_m``; docs/QUEUE.md).
    ``checkpointed()`` names the objects whose state travels in checkpoints besides the model.

    ``num_samples``: the training set's size (RASCAL's cache); ``class_counts``: training samples per class (a loss
    with a classifier of its own: BCL's priors). ``model``: an unprepared ``SupConResNet`` to use instead of a new
    one (tests put dropout into it). ``monitor``: ``monitor(encoder, epoch) -> metrics`` after each epoch (the kNN
    monitor, ``knn.knn_monitor``), or none. :meth:`parameters` are what the optimizer trains: the model's and the
    loss's own (a classifier, prototypes)."""

    def __init__(self, opt, num_samples: int, model: Optional[SupConResNet] = None, class_counts=None, monitor=None):
        self.runtime = runtime = call_hook(Runtime, opt)
        self.monitor, self.print_freq, self.desc = monitor, opt.print_freq, opt.method
        self.epoch_hists = defaultdict(lambda: 0)         # the loss's histogram counts, summed over an epoch
        self.method: Method = get_method(opt.method)
        self.chunk_size, self.shuffle_bn_splits = opt.chunk_size, opt.shuffle_bn_splits
        self.carrot_on = opt.carrot_on
        if model is None:
            model = SupConResNet(opt.model, head=opt.head, feat_dim=opt.feat_dim, stem=opt.stem, size=opt.size,
                                 model_args=opt.model_args)
        self.model = runtime.prepare_model(model)
        self.criterion = call_hook(self.method.build, opt, num_samples=num_samples, class_counts=class_counts,
                                   enc_dim=model.dim).to(runtime.device)
        broadcast_state(self.model, self.criterion)      # under torchrun every process starts from rank 0's
        # a copy of the model as it starts (rank 0's), before --syncBN converts its BatchNorm: the key encoder's
        # statistics stay its own (shuffled BatchNorm, docs/QUEUE.md)
        self.key_encoder = MomentumEncoder(self.model, opt.moco_m) if opt.queue_size and opt.moco_m > 0 else None
        compiler = call_hook(Compiler, opt)
        compiler.modules(self.model.encoder, self.model.head)      # after the key encoder's copy
        self.ddp_model = wrap_model(self.model, runtime.device, opt.syncBN, bool(opt.chunk_size))   # itself alone
        self.carrot = call_hook(carrot_term, opt)
        self.queue = MemoryQueue(opt.queue_size, opt.feat_dim).to(runtime.device) if opt.queue_size else None
        # --compile: the augmentation, the model and the loss as one graph where the loss traces whole
        # (Method.compiles, and CARROT where it compiles; torchrun's gathers break it), the augmentation and the model
        # for the other methods (CARROT needs the encoder's output as a graph's input: its modules stay apart); with
        # gradient caching the loss step alone
        self.compiled_loss = traced = (opt.compile and self.method.compiles and not is_distributed()
                                       and compiles_with(self.carrot, opt.chunk_size))
        self.loss_in_graph = traced and not opt.chunk_size
        self.parts_in_graph = opt.compile and not (traced or opt.chunk_size or self.carrot or is_distributed())
        self.forward_loss = compiler.function(self._forward_loss, enabled=self.loss_in_graph,
                                              trace_grad=self.carrot is not None)
        self.forward_parts = compiler.function(self._forward_parts, enabled=self.parts_in_graph)
        self.loss_step = compiler.function(self.loss_from_parts, enabled=traced and bool(opt.chunk_size))

    def parameters(self) -> list[torch.nn.Parameter]:
        """The model's parameters, then the loss's own (none for most methods)."""
        return list(self.model.parameters()) + list(self.criterion.parameters())

    def train_epoch(self, loader, optim: Optimization, epoch: int) -> dict:
        """One epoch of :meth:`step` over ``loader``; then the loss's work that belongs to an epoch (``end_epoch``).
        The metrics: the epoch means, and the loss's histograms summed over the epoch (``hist/...``)."""
        self.ddp_model.train()
        self.epoch_hists.clear()
        # --compile: the augmentation into the graph
        pend_augmentation(loader, self.loss_in_graph or self.parts_in_graph)
        metrics = train_loop(loader, optim, epoch, self.loop_step, self.desc, self.print_freq)
        self.criterion.end_epoch()
        prefix = self.method.stats_prefix
        metrics.update({f'hist/{prefix}{name}': counts.cpu().clone() for name, counts in self.epoch_hists.items()})
        return metrics

    def loop_step(self, batch, backward):
        """``loop.train_loop``'s step: :meth:`step` on a loader's batch ``(views, labels[, ids])``, its histogram
        counts added to the epoch's."""
        loss, stats = self.step(*batch, backward=backward)
        for name, counts in self.criterion.last_hists.items():
            self.epoch_hists[name] = self.epoch_hists[name] + counts
        return loss, batch[1].shape[0], stats

    def evaluate_epoch(self, epoch: int) -> dict:
        """The monitor's metrics after ``epoch`` (the kNN monitor's, on its epochs), else none."""
        return self.monitor(self.model.encoder, epoch) if self.monitor is not None else {}

    def checkpointed(self) -> dict[str, torch.nn.Module]:
        """``{key: module}`` of the state saved next to the model: the loss's own state (RASCAL's cache),
        the queue and the key encoder, where they exist and hold state."""
        parts = (('criterion', self.criterion), ('queue', self.queue), ('key_encoder', self.key_encoder))
        return {name: obj for name, obj in parts if obj is not None and obj.state_dict()}

    def step(self, views: list[torch.Tensor], labels: torch.Tensor, ids: Optional[torch.Tensor] = None,
             backward=torch.Tensor.backward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step on ``views`` (a list of ``[b, C, H, W]``), ``labels`` ``[b]`` and dataset ``ids`` ``[b]``:
        computes the loss, calls ``backward(loss)`` (``GradScaler``'s scaled backward in training) and returns
        ``(loss, statistics)``. Plain or gradient caching (``--chunk_size``). With a queue the loss also
        contrasts with its keys, and after the backward this step's keys are enqueued.

        ``labels`` and ``ids`` are used where they are: a loader's host tensors stay on the host, where the losses
        build what depends on their values, so the step never waits for the device (docs/USAGE.md,
        "Host synchronizations")."""
        runtime, model = self.runtime, self.model
        pending = isinstance(views, PendingViews)        # augmented by the compiled forward (pend_augmentation)
        n_views = views.n_views if pending else len(views)
        # on the device once: the step's forward(s) and the key encoder read the same copies (no-ops when there)
        views = views if pending else [v.to(runtime.device, non_blocking=True) for v in views]
        kept = {}
        queue_stats = self.queue.statistics(self._global_labels(labels)) if self.queue is not None else {}
        scale = backward.scale(runtime.device) if hasattr(backward, 'scale') else None
        plan = self.host_plan(labels, ids, n_views)            # out of the compiled graph: built on the host

        def loss_from(h_enc, h_proj):
            loss, stats, kept['features'] = self.loss_step(h_enc, h_proj, labels, ids, n_views, scale, plan)
            return loss, stats
        if self.chunk_size:
            views = views.views() if pending else views
            loss, stats = cached_step(runtime, model, model.head, views, self.chunk_size, loss_from, backward)
        elif self.loss_in_graph:                                # compiled: the loss in the graph
            # the labels on the device: a graph without host inputs (CUDA graphs can take it)
            graph_labels = labels.to(runtime.device, non_blocking=True)
            loss, stats, kept['features'], views = self.forward_loss(views, graph_labels, ids, plan, scale)
        else:
            h_enc, h_proj, views = self.forward_parts(views)
            loss, stats = loss_from(h_enc, h_proj)
        if not self.chunk_size:
            backward(loss)                      # under --compile the compiled graphs' backward (AOTAutograd's)
            loss = loss.detach()
        # the loss's own parameters (BCL's, PaCo's classifier): DDP does not see them; the mean over processes
        all_reduce_grads(self.criterion.parameters())
        if self.queue is not None:
            stats.update(queue_stats, **self.enqueue_keys(views, labels, ids, kept['features']))
        return loss, stats

    def _forward_parts(self, views):
        """The augmentation of :class:`PendingViews` and the model on the whole batch (its views on the device,
        view-major rows ``v * bsz + b``): ``(h_enc, h_proj, views)``, the views being the key encoder's input."""
        views = views.views() if isinstance(views, PendingViews) else views
        images = device_batch(self.runtime, views)
        with self.runtime.autocast():
            h_enc, h_proj = self.ddp_model(images, parts=True)
        return h_enc, h_proj, views

    def _forward_loss(self, views, labels, ids, plan, scale):
        """The plain step's forward: :meth:`_forward_parts` and :meth:`loss_from_parts`. ``--compile`` compiles it as
        one graph, whose backward AOTAutograd compiles with it. Returns the loss, statistics, features and views."""
        h_enc, h_proj, views = self._forward_parts(views)
        return (*self.loss_step(h_enc, h_proj, labels, ids, len(views), scale, plan), views)

    def _global_labels(self, labels):
        return gather_labels(labels, self.runtime.device) if self.method.uses_labels else None

    def host_plan(self, labels, ids, n_views):
        """The (global) batch's :class:`HostPlans` (``losses.Loss.host_plan``, CARROT's: built before the loss
        step, out of its compiled graph), their sizes marked dynamic for the compiler: one graph fits every batch."""
        device = self.runtime.device
        global_ids = gather_labels(ids, device) if self.method.uses_ids else None
        plans = HostPlans(self.criterion.host_plan(self._global_labels(labels), global_ids, n_views,
                                                   self.queue.view() if self.queue is not None else None, device),
                          self.carrot.host_plan(labels.repeat(n_views), device) if self.carrot is not None else None)
        if self.compiled_loss:
            dynamic_sizes(plans)
        return plans

    def loss_from_parts(self, h_enc, h_proj, labels, ids, n_views, scale=None, plan=None):
        """The loss, statistics and the (global, detached) unit features ``[B, V, D]`` from the encoder
        output ``h_enc`` and the projection ``h_proj`` (``[V*b, .]``, view-major rows ``v*b + j``). Under
        torchrun the loss sees the global batch (samples in rank order); the queue is read as it was before
        this step. The projection is normalized in float32 whatever the autocast dtype (unit features, queue keys
        and RASCAL's similarities are not rounded to 16 bits; an all-zero row stays finite). ``scale``: the loss
        scale of the backward (``--amp fp16``), for CARROT's balance; ``plan``: the :class:`HostPlans`
        (:meth:`host_plan`; without one the loss and CARROT build theirs)."""
        method, plan = self.method, plan or NO_PLANS
        bsz = labels.shape[0]
        features = F.normalize(h_proj.float(), dim=1)
        features = torch.stack(torch.split(features, bsz, dim=0), dim=1)  # [bsz, n_views, feat_dim]
        features = gather_with_grad(features)                       # no-op in one process
        args = (features, self._global_labels(labels))
        if method.uses_ids:
            args += (gather_labels(ids, self.runtime.device),)
        kwargs = {'queue': self.queue.view(host=plan.loss is None)} if self.queue is not None else {}
        if plan.loss is not None:
            kwargs['plan'] = plan.loss
        if method.uses_encoder_features:       # the global batch's rows, view-major as the features
            per_sample = torch.stack(torch.split(h_enc, bsz, dim=0), dim=1)      # [bsz, n_views, E]
            kwargs['h_enc'] = flatten_views(gather_with_grad(per_sample))[0]
        loss = self.criterion(*args, **kwargs)
        stats = {f'{method.stats_prefix}{k}': v for k, v in self.criterion.last_stats.items()}
        # collapse monitors of the global batch (the projections are gathered already)
        stats.update(collapse_statistics(gather(h_enc.detach()), 'enc'),
                     **collapse_statistics(features.detach().reshape(-1, features.shape[-1]), 'proj'))
        if self.carrot is not None:
            # rows of h are view-major like the images, so labels are repeated (not interleaved)
            # the parameters between h and the loss: the head's, and the loss's own (a classifier on h_enc)
            h, params = ((h_enc, [*self.model.head.parameters(), *self.criterion.parameters()])
                         if self.carrot_on == 'encoder' else (h_proj, ()))
            loss, carrot_stats = self.carrot(loss, h, labels.repeat(n_views), params, scale, plan.carrot)
            stats.update(carrot_stats)
        return loss, stats, features.detach()

    @torch.no_grad()
    def enqueue_keys(self, views, labels, ids, features):
        """This step's keys into the queue, one per sample of the global batch, with labels and ids: the
        normalized view mean of the key encoder's features (updated from the model first; shuffled BatchNorm),
        or of the detached query ``features`` ``[B, V, D]`` without a key encoder. Returns
        ``queue/key_query_cos`` (with a key encoder)."""
        runtime = self.runtime
        queries = sample_keys(features)
        stats = {}
        if self.key_encoder is None:
            keys = queries
        else:
            self.key_encoder.update(self.model)
            images = device_batch(runtime, views)

            def forward(key_model, part):
                with runtime.autocast():
                    return key_model(part).float()
            out = key_features(self.key_encoder.model, images, self.shuffle_bn_splits, forward)   # [V*b, D]
            keys = gather(sample_keys(torch.stack(torch.split(out, labels.shape[0], dim=0), dim=1)))
            stats['queue/key_query_cos'] = (keys * queries).sum(1).mean()
        self.queue.enqueue(keys, gather_labels(labels, runtime.device), gather_labels(ids, runtime.device))
        return stats


# ---------------------------------------------------------------- cross-entropy (main_ce.py)
class CETraining:
    """What ``main_ce.py`` trains, built once from ``opt``, and its step: the model (``SupCEResNet``, an
    encoder and a linear classifier, and with ``--supcon_weight`` a projection head; ``ddp_model`` under
    torchrun), the loss (``--loss``: cross-entropy, or :class:`losses.LogitAdjustedLoss` from ``class_counts``, the
    training samples per class), one-stage SupCon (``--supcon_weight w``: ``+ w * SupCon`` of the projections of
    the batch's views) and ``carrot`` (``--carrot``, on the penultimate features). ``model``: an unprepared
    ``SupCEResNet`` to use instead of a new one. ``eval_loaders``: ``{part: loader}`` that :meth:`evaluate_epoch`
    measures after every epoch (``val``: the held-out part; ``test``), with ``eval_counts`` (the training samples per
    class, for the shot groups)."""

    def __init__(self, opt, num_classes: int, class_counts=None, model: Optional[SupCEResNet] = None,
                 eval_loaders=None, eval_counts=None):
        self.runtime = runtime = call_hook(Runtime, opt)
        self.num_classes, self.print_freq = num_classes, opt.print_freq
        self.eval_loaders, self.eval_counts = eval_loaders or {}, eval_counts
        self.test_every, self.epochs = opt.test_every, opt.epochs
        self.chunk_size = opt.chunk_size
        if not opt.supcon_weight:          # one view: a batch (or chunk) of one image cannot train BatchNorm
            per = f'each of the {opt.world_size} processes' if opt.world_size > 1 else 'each step'
            check(opt.local_batch_size >= 2, f'--batch_size {opt.batch_size} gives {per} one image, and BatchNorm '
                                             'cannot train on one: use at least 2 per process')
            check(opt.chunk_size != 1, '--chunk_size 1 puts single images through BatchNorm, which cannot train on '
                                       'one: use --chunk_size 2 or more (or 0)')
        # --loss: plain cross-entropy, or the logits shifted by tau log(prior) (priors: class_counts, the training
        # labels after the long-tail subset and label noise)
        self.criterion = ce_criterion(opt.loss, class_counts, opt.la_tau, opt.gce_q, opt.sce_alpha, opt.sce_beta)
        self.criterion = self.criterion.to(runtime.device) if self.criterion is not None else None
        self.supcon_weight = opt.supcon_weight
        self.supcon = SupConLoss(temperature=opt.temp) if opt.supcon_weight else None
        if model is None:
            model = SupCEResNet(opt.model, num_classes=num_classes, head=opt.head if self.supcon else None,
                                feat_dim=opt.feat_dim, stem=opt.stem, size=opt.size, model_args=opt.model_args)
        self.model = runtime.prepare_model(model)
        broadcast_state(self.model)                      # under torchrun every process starts from rank 0's
        compiler = call_hook(Compiler, opt)
        compiler.modules(*self.model.children())
        self.ddp_model = wrap_model(self.model, runtime.device, opt.syncBN, bool(opt.chunk_size))   # itself alone
        self.carrot = call_hook(carrot_term, opt)
        # --compile: the forward and the loss as one graph, as Pretraining's (torchrun's gathers break it)
        traced = opt.compile and not is_distributed() and compiles_with(self.carrot, opt.chunk_size)
        self.loss_in_graph = traced and not opt.chunk_size
        self.forward_loss = compiler.function(self._forward_loss, enabled=self.loss_in_graph,
                                              trace_grad=self.carrot is not None)
        self.loss_step = compiler.function(self.loss_from_parts, enabled=traced and bool(opt.chunk_size))

    def checkpointed(self) -> dict:
        """Nothing but the model travels in its checkpoints."""
        return {}

    def train_epoch(self, loader, optim: Optimization, epoch: int) -> dict:
        """One epoch of :meth:`step` over ``loader``; the epoch means."""
        self.ddp_model.train()
        pend_augmentation(loader, self.loss_in_graph)    # --compile: the augmentation into the graph
        return train_loop(loader, optim, epoch, self.loop_step, 'CE', self.print_freq)

    def loop_step(self, batch, backward):
        """``loop.train_loop``'s step: :meth:`step` on a loader's batch ``(images or views, labels)``."""
        loss, stats = self.step(*batch, backward=backward)
        return loss, batch[1].shape[0], stats

    def evaluate_epoch(self, epoch: int) -> dict:
        """Loss, top-1, ECE, per-class and shot-group accuracy of every part of ``eval_loaders`` measured after
        ``epoch`` (``loop.evaluate``; ``--test_every end``: the test split after the last epoch only)."""
        if not self.eval_loaders:
            return {}
        self.model.eval()
        return evaluate_parts(self.runtime, self.eval_loaders, self.model,
                              parts_after(self.eval_loaders, self.test_every, epoch, self.epochs), self.num_classes,
                              self.eval_counts)

    def step(self, images, labels: torch.Tensor,
             backward=torch.Tensor.backward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step on ``images`` ``[b, C, H, W]`` (or a list of views, one-stage SupCon) and ``labels`` ``[b]``: as
        :meth:`Pretraining.step`, without a queue. Returns ``(loss, statistics)``."""
        runtime = self.runtime
        views = images if isinstance(images, (list, tuple, PendingViews)) else [images]
        n_views = views.n_views if isinstance(views, PendingViews) else len(views)
        scale = backward.scale(runtime.device) if hasattr(backward, 'scale') else None

        plan = self.carrot.host_plan(labels.repeat(n_views), runtime.device) if self.carrot is not None else None
        if plan is not None and self.loss_in_graph:
            dynamic_sizes(plan)

        def loss_from(h, out):
            return self.loss_step(h, out, labels, n_views, scale, plan)
        if self.chunk_size:
            views = views.views() if isinstance(views, PendingViews) else views
            return cached_step(runtime, self.model, self.model.outputs, views, self.chunk_size, loss_from, backward)
        graph_labels = labels.to(runtime.device, non_blocking=True) if self.loss_in_graph else labels
        loss, stats = self.forward_loss(views, graph_labels, scale, plan)    # (on the device when compiled)
        backward(loss)                          # under --compile the backward of the same graph (AOTAutograd's)
        return loss.detach(), stats

    def _forward_loss(self, views, labels, scale, plan=None):
        """The plain step's forward: the augmentation of :class:`PendingViews`, the model on the whole batch and
        :meth:`loss_from_parts`; one graph under ``--compile``, as :meth:`Pretraining._forward_loss`."""
        views = views.views() if isinstance(views, PendingViews) else views
        with self.runtime.autocast():
            h, out = self.ddp_model(device_batch(self.runtime, views), parts=True)
        return self.loss_step(h, out, labels, len(views), scale, plan)

    def loss_from_parts(self, h, out, labels, n_views=1, scale=None, plan=None):
        """Cross-entropy over every view's logits (``+ w * SupCon`` of the projections, global batch under
        torchrun; ``+ CARROT`` on the penultimate features ``h``) and statistics, from the encoder output ``h`` and
        :meth:`SupCEResNet.outputs` ``out`` (view-major rows). ``labels`` where the loader put them (CARROT and
        SupCon read them on the host)."""
        logits, proj = out if self.supcon is not None else (out, None)
        rows = labels.repeat(n_views)
        on_device = rows.to(logits.device, non_blocking=True)
        # this process's batch; DDP averages the gradients
        loss = (self.criterion or cross_entropy)(logits.float(), on_device)
        stats = {'acc': accuracy(logits, on_device)[0], **collapse_statistics(h, 'enc')}
        params = list(self.model.fc.parameters())
        if self.supcon is not None:
            bsz = labels.shape[0]
            features = torch.stack(torch.split(F.normalize(proj.float(), dim=1), bsz, dim=0), dim=1)   # [b, V, D]
            supcon = self.supcon(gather_with_grad(features), gather_labels(labels, self.runtime.device))
            stats['ce'], stats['supcon'] = loss.detach(), supcon.detach()
            loss = loss + self.supcon_weight * supcon
            params += list(self.model.head.parameters())
        if self.carrot is not None:
            loss, carrot_stats = self.carrot(loss, h, rows, params, scale, plan)
            stats.update(carrot_stats)
        return loss, stats


# ---------------------------------------------------------------- the batch on the device
def device_batch(runtime, views):
    """The views of a batch as one view-major tensor on the device: each view is copied on its own (from the
    loader's pinned memory, asynchronously) and concatenated there, not on the host in pageable memory. Views of
    different sizes (multi-crop: the large ones first) give a list of such tensors, one per run of equal sizes,
    which the model encodes one by one in a single forward (``SupConResNet.forward``)."""
    groups = [[views[0]]]
    for view in views[1:]:
        if view.shape == groups[-1][0].shape:
            groups[-1].append(view)
        else:
            groups.append([view])
    batches = [runtime.to_device(torch.cat([v.to(runtime.device, non_blocking=True) for v in group], dim=0))
               for group in groups]
    return batches[0] if len(batches) == 1 else batches


# ---------------------------------------------------------------- the flags of the CE loss and of one stage
def ce_criterion(loss, class_counts, la_tau, gce_q, sce_alpha, sce_beta):
    """``--loss``'s module, or ``None`` for plain cross-entropy: logit-adjusted (``la_tau``; balanced softmax is tau =
    1; priors from ``class_counts``, the training labels after the long-tail subset and label noise), GCE or SCE."""
    if loss == 'gce':
        return GCELoss(gce_q)
    if loss == 'sce':
        return SCELoss(sce_alpha, sce_beta)
    tau = {'ce': None, 'logit_adjusted': la_tau, 'balanced_softmax': 1.0}[loss]
    return None if tau is None else LogitAdjustedLoss(class_counts, tau)


CE_LOSS_FLAGS = {'la_tau': ('logit_adjusted',), 'gce_q': ('gce',), 'sce_alpha': ('sce',), 'sce_beta': ('sce',)}


def _check_ce_loss(loss, la_tau, gce_q, sce_alpha, sce_beta, given):
    for flag, losses in CE_LOSS_FLAGS.items():
        check(loss in losses or flag not in given, f'--{flag} needs --loss {" or ".join(losses)}, got --loss {loss}'
              + (' (balanced_softmax is tau = 1)' if flag == 'la_tau' else ''))
    check(la_tau >= 0, f'--la_tau must be >= 0, got {la_tau}')
    check(0 < gce_q <= 1, f'--gce_q must be in (0, 1], got {gce_q}')
    check(math.isfinite(sce_alpha + sce_beta) and sce_alpha >= 0 and sce_beta >= 0 and sce_alpha + sce_beta > 0,
          f'--sce_alpha and --sce_beta must be finite, >= 0 and not both 0, got {sce_alpha} and {sce_beta}')


CE_LOSS = Feature(
    'the cross-entropy family (docs/USAGE.md, "Long tail"; docs/FIELD.md, "GCE and SCE")', scripts=('ce',),
    check=_check_ce_loss,
    flags={'--loss': dict(choices=['ce', 'logit_adjusted', 'balanced_softmax', 'gce', 'sce'], default='ce',
                          help='ce; logit_adjusted (Menon et al. 2021: logits + la_tau log prior in training); '
                               'balanced_softmax (Ren et al. 2020: the same with tau 1); gce (Zhang & Sabuncu '
                               '2018, L_q); sce (Wang et al. 2019, symmetric cross-entropy): robust to label noise'),
           '--la_tau': dict(type=float, default=1.0, help='logit_adjusted: tau (default 1.0)'),
           '--gce_q': dict(type=float, default=0.7, help='gce: q in (0, 1] (default 0.7, the paper\'s)'),
           '--sce_alpha': dict(type=float, default=0.1,
                               help='sce: weight alpha of the cross-entropy (default 0.1, the paper\'s CIFAR-10)'),
           '--sce_beta': dict(type=float, default=1.0,
                              help='sce: weight beta of the reverse cross-entropy (default 1.0)')},
    run_name=lambda loss, la_tau, gce_q, sce_alpha, sce_beta: {
        'ce': '', 'logit_adjusted': f'_la_tau_{la_tau}', 'balanced_softmax': '_balanced_softmax',
        'gce': f'_gce_q_{gce_q}', 'sce': f'_sce_a_{sce_alpha}_b_{sce_beta}'}[loss])


def _check_one_stage(supcon_weight, given):
    check(supcon_weight >= 0, f'--supcon_weight must be >= 0, got {supcon_weight}')
    stray = [f for f in ('temp', 'head', 'feat_dim') if f in given]
    check(supcon_weight > 0 or not stray, f'--{stray[0] if stray else ""} needs --supcon_weight > 0 in main_ce.py')


ONE_STAGE = Feature(
    'one-stage CE + SupCon (docs/USAGE.md)', scripts=('ce',), check=_check_one_stage,
    flags={'--supcon_weight': dict(type=float, default=0.0,
                                   help='one stage: cross-entropy + this weight x SupCon on a projection head over two '
                                        'views (SupCon\'s augmentation; 0: off)')},
    run_name=lambda supcon_weight, temp: f'_supcon_{supcon_weight}_temp_{temp}' if supcon_weight else '')
