"""CARROT: the same-class similarity corridor regularizer (definition: ``docs/CARROT.md``)."""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from losses import ClassGroups, Loss, block_pairs, class_groups, on_host

FORMS = ('masked', 'blocks')     # the positives' two forms (CARROT's ``form``): the same sums, by definition


def default_form(device):
    """CARROT's form of the positives on ``device`` when none is given: ``blocks`` on a CPU, ``masked`` elsewhere."""
    return 'blocks' if device.type == 'cpu' else 'masked'

STAT_NAMES = ('L', 'U', 'num_pos', 'num_neg', 'pos_mean', 'pos_max', 'frac_pos_above_U', 'frac_pos_below_L',
              'reg')


def pair_quantiles(values, valid, qs, count=None, bins=4096, sync_free=None):
    """Linear-interpolation quantiles (``torch.quantile``'s default) of the ordered-pair multiset.

    ``values`` ``[n, n]`` symmetric with entries in ``[-1, 1]`` (cosine similarities), ``valid``
    ``[n, n]`` symmetric bool with a zero diagonal. Each unordered pair appears twice among the
    ordered pairs, so the k-th smallest ordered value is the (k // 2)-th smallest unordered one and
    the selection runs on the upper triangle. Exact, with no size cap (``torch.quantile`` refuses
    more than 2**24 elements). ``count``: the number of valid unordered pairs, if known on the host.
    Returns a tensor of ``len(qs)`` values.

    Two forms select the same order statistics (so they return the same numbers, by definition): on a CPU
    (``sync_free`` false, the default there) one histogram of ``bins`` buckets locates every order statistic
    needed (both quantiles and their interpolation neighbours), then ``kthvalue`` runs on the few values of
    those buckets (:func:`_bucket_select`, over the triangle a chunk of rows at a time); elsewhere (``sync_free``,
    the default on an accelerator) ``topk`` selects from the whole upper triangle, invalid entries set to ``+inf``
    (``-inf`` for the largest), from whichever side of each order statistic is nearer, so nothing is read back to the
    host (``count`` must then be given, or it is read once; ``python benchmarks/carrot_quantile.py`` times it against
    ``kthvalue``).
    """
    sync_free = values.device.type != 'cpu' if sync_free is None else sync_free
    upper = valid.triu(1) if sync_free or count is None else None
    if count is None:
        count = int(upper.sum())
    plans = quantile_plan(count, qs)
    ranks = sorted({r for a, b, _ in plans for r in (a, b)})
    found = {}
    if sync_free:
        # the k smallest (or largest) valid values, from the side nearer each rank: one topk per side, k at most
        # half the pairs (CUDA's topk runs on many blocks; its kthvalue on one 1-D tensor runs on one)
        low = [r for r in ranks if r < count - r]
        high = [r for r in ranks if r >= count - r]
        if low:
            flat = values.masked_fill(~upper, float('inf')).flatten()
            smallest = torch.topk(flat, max(low) + 1, largest=False, sorted=True).values
            found.update({r: smallest[r] for r in low})
        if high:
            flat = values.masked_fill(~upper, -float('inf')).flatten()
            largest = torch.topk(flat, count - min(high), largest=True, sorted=True).values
            found.update({r: largest[count - 1 - r] for r in high})
    else:
        found.update(_bucket_select(values, valid, ranks, bins))
    return torch.stack([found[a] + (found[b] - found[a]) * frac for a, b, frac in plans])


def quantile_plan(count, qs):
    """``[(a, b, frac), ...]`` per quantile of ``qs``: the ranks among the ``count`` unordered pairs between which it
    interpolates (linear, ``torch.quantile``'s rule on the ``2 count`` ordered pairs) and the fraction."""
    n_ordered = 2 * count
    plans = []
    for q in qs:
        pos = q * (n_ordered - 1)                                 # position among ordered pairs
        lo = min(int(pos), n_ordered - 1)
        plans.append((lo // 2, min(lo + 1, n_ordered - 1) // 2, pos - lo))
    return plans


def sorted_quantiles(values, valid, lo, hi, frac):
    """:func:`pair_quantiles`' form of fixed shapes, for a compiled graph: the upper triangle's valid values sorted
    (invalid ones ``+inf``, last), read at the ranks ``lo`` and ``hi`` ``[Q]`` (long tensors, from
    :func:`quantile_plan`) and interpolated by ``frac`` ``[Q]`` (float32): the same order statistics as the other
    forms select, so the same values, with no shape that depends on the count and nothing read on the host."""
    ordered = values.masked_fill(~valid.triu(1), float('inf')).flatten().sort().values
    found_lo, found_hi = ordered[lo], ordered[hi]
    return found_lo + (found_hi - found_lo) * frac


def _row_chunks(values, valid, bins, rows):
    """The upper triangle of ``values`` ``[n, n]`` where ``valid``, ``rows`` rows at a time: per chunk, its values
    right of the diagonal ``[c, n - start]`` and their bucket ids (``floor((v + 1) * bins / 2)``, clamped to
    ``[0, bins)``; ``bins`` where not valid or not above the diagonal; 16-bit integers). Only the triangle is read, a
    chunk at a time (a chunk's temporaries stay in the cache), where a pass over the whole ``[n, n]`` per operation
    would read all of it from memory each time."""
    n = values.shape[0]
    dtype = torch.int16 if bins < 2 ** 15 else torch.int32
    invalid = ~valid
    on_or_below = torch.ones(rows, rows, dtype=torch.bool, device=values.device).tril_()
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        v = values[start:stop, start:]
        ids = v.add(1).mul_(bins / 2).to(dtype).clamp_(0, bins - 1).masked_fill_(invalid[start:stop, start:], bins)
        ids[:, :stop - start].masked_fill_(on_or_below[:stop - start, :stop - start], bins)   # the diagonal block
        yield v, ids


def _bucket_select(values, valid, ranks, bins, rows=128):
    """:func:`pair_quantiles`' CPU form: ``{rank: the rank-th smallest valid value of the upper triangle}``. One
    pass counts the values per bucket and locates each rank's bucket; a second picks the values of those buckets
    (a handful), where ``kthvalue`` finds each rank. Both passes run over the triangle in chunks of ``rows`` rows
    (:func:`_row_chunks`; at n = 2048, 128 rows of float32 are 1 MB)."""
    chunks = list(_row_chunks(values, valid, bins, rows))        # the ids kept for the second pass (2 bytes a pair)
    hist = sum(torch.bincount(ids.flatten(), minlength=bins + 1) for _, ids in chunks)
    cum = hist[:bins].cumsum(0)
    where = torch.searchsorted(cum, torch.tensor(ranks), right=True)
    before = torch.cat([cum.new_zeros(1), cum])[where]                # values in lower buckets
    where, before = where.tolist(), before.tolist()
    needed = sorted(set(where))
    runs = [[needed[0], needed[0]]]                    # the needed buckets as runs of consecutive ids
    for bucket in needed[1:]:
        if bucket == runs[-1][1] + 1:
            runs[-1][1] = bucket
        else:
            runs.append([bucket, bucket])
    picked, picked_ids = [], []
    for v, ids in chunks:
        inside = None
        for first, last in runs:
            run = (ids == first) if first == last else (ids >= first) & (ids <= last)
            inside = run if inside is None else inside | run
        at = inside.nonzero(as_tuple=True)
        picked.append(v[at])
        picked_ids.append(ids[at])
    few, few_ids = torch.cat(picked), torch.cat(picked_ids)
    cache = {bucket: few[few_ids == bucket] for bucket in needed}
    return {r: torch.kthvalue(cache[bucket], r - n_below + 1).values
            for r, bucket, n_below in zip(ranks, where, before)}


class CarrotPlan(NamedTuple):
    """What CARROT builds on the host from the values of the labels ``y`` ``[n]`` (:meth:`CARROT.host_plan`): ``y``
    on the device; the ordered positive and negative pair counts, as host ints (``pos_pairs``, ``neg_pairs``) and as
    float32 0-d tensors on the device (``num_pos``, ``num_neg``, what a compiled graph reads: no value to specialize
    on); ``degenerate`` (no positive or no negative pair: ``R = 0``); the walls' ranks among the negative pairs and
    their interpolation (``lo``, ``hi`` long ``[2]``, ``frac`` float32 ``[2]``, :func:`quantile_plan`); and the
    same-class blocks by size (``groups``, the blocks form only)."""
    y: torch.Tensor
    pos_pairs: int
    neg_pairs: int
    num_pos: torch.Tensor
    num_neg: torch.Tensor
    degenerate: bool
    lo: torch.Tensor
    hi: torch.Tensor
    frac: torch.Tensor
    groups: Optional[ClassGroups]


class CARROT(Loss):
    """Same-class corridor regularizer ``R(h, y)`` (``docs/CARROT.md``, "The regularizer").

    ``z = normalize(h)``, ``S = clamp(z z^T, -1, 1)`` in float32 (also under autocast), one ``[n, n]`` product:
    without gradient for the walls, and through a same-class mask for the positives (fixed shapes: the number of
    kernels a step launches does not grow with the number of classes). Walls from the
    batch's negative pairs (``y_i != y_j``): ``L = quantile(S_neg, q_hi)``,
    ``U = 1 - max(quantile(S_neg, q_hi) - quantile(S_neg, q_lo), 0)`` clipped to ``[L + 1e-3, 0.999]``;
    both detached. Over the ordered positive pairs (``i != j``, ``y_i = y_j``)::

        R = mean_{(i,j) positive} relu(L - S_ij)^2 + relu(S_ij - U)^2

    ``R = 0`` (with zero gradient) when the batch has no positive or no negative pair.

    Shapes: ``h`` ``[n, D]`` (any float dtype; flatten ``[B, V, D]`` yourself and repeat ``y`` in the
    same order), ``y`` ``[n]``. Returns ``reg``, a float32 scalar; ``last_stats`` holds the statistics
    (``STAT_NAMES``) as 0-d tensors (no host sync).

    ``form`` chooses how the positive pairs' sum is formed (the same terms, summed in another order): ``masked``,
    one masked pass over the ``[n, n]`` product, whose gradient flows through the whole product (a fixed number of
    kernels: what an accelerator wants); ``blocks``, the same-class blocks ``z_c z_c^T`` grouped by size
    (``losses.class_groups``), whose gradient flows through ``sum_c n_c^2`` entries only (a tenth of the work with 10
    balanced classes: what a CPU wants). ``None`` (the default): ``blocks`` on a CPU, ``masked`` elsewhere.
    """

    def __init__(self, q_hi=0.9, q_lo=0.1, form=None):
        super().__init__()
        if not 0 <= q_lo < q_hi <= 1:
            raise ValueError(f'need 0 <= q_lo < q_hi <= 1, got q_lo={q_lo}, q_hi={q_hi}')
        if form is not None and form not in FORMS:
            raise ValueError(f'form must be one of {FORMS} or None, got {form!r}')
        self.q_hi, self.q_lo, self.form = q_hi, q_lo, form

    def host_plan(self, y, device):
        """The :class:`CarrotPlan` of the labels ``y`` ``[n]`` (read on the host: no wait when they are there), its
        tensors on ``device``; the class groups for the blocks form."""
        y_host = on_host(y.reshape(-1))
        n = y_host.shape[0]
        counts = torch.unique(y_host, return_counts=True)[1]
        sq = int((counts * counts).sum())
        pos_pairs, neg_pairs = sq - n, n * n - sq                            # ordered pairs
        plans = quantile_plan(max(neg_pairs // 2, 1), (self.q_hi, self.q_lo))
        lo, hi, frac = zip(*plans)
        device = torch.device(device)
        blocks = (self.form or default_form(device)) == 'blocks'

        def there(values, dtype=None):
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
        return CarrotPlan(y_host.to(device, non_blocking=True), pos_pairs, neg_pairs, there(float(pos_pairs)),
                          there(float(neg_pairs)), pos_pairs == 0 or neg_pairs == 0, there(lo), there(hi),
                          there(frac, torch.float32), class_groups(y_host, device) if blocks else None)

    def forward(self, h, y, plan=None):
        """``plan``: the labels' :class:`CarrotPlan` (:meth:`host_plan`) when built already; ``y`` is then not
        read (the training step builds it before its compiled graph)."""
        if h.dim() != 2:
            raise ValueError(f'h must be [n, D], got {list(h.shape)}; flatten views first')
        plan = self.host_plan(y, h.device) if plan is None else plan
        if plan.y.shape[0] != h.shape[0]:
            raise ValueError(f'{plan.y.shape[0]} labels for {h.shape[0]} rows')
        with torch.autocast(device_type=h.device.type, enabled=False):
            z = F.normalize(h.float(), dim=1)
            y, num_pos, num_neg = plan.y, plan.num_pos, plan.num_neg
            zero = z.new_zeros(())
            if plan.degenerate:
                reg = (z * 0).sum()
                self.last_stats = dict(L=zero, U=zero, num_pos=zero + num_pos, num_neg=zero + num_neg,
                                       pos_mean=zero, pos_max=zero, frac_pos_above_U=zero, frac_pos_below_L=zero,
                                       reg=zero)
                return reg
            same = y[:, None] == y[None, :]
            masked = plan.groups is None
            s = z @ z.T if masked else (z.detach() @ z.detach().T)          # [n, n]: the walls (and the positives)
            s = s.clamp(-1, 1)
            sd = s.detach()
            with torch.no_grad():   # the walls: quantiles of all negative similarities, no gradient
                if torch.compiler.is_compiling():       # the form of fixed shapes (the same values)
                    q_hi, q_lo = sorted_quantiles(sd, ~same, plan.lo, plan.hi, plan.frac)
                else:
                    q_hi, q_lo = pair_quantiles(sd, ~same, (self.q_hi, self.q_lo), count=plan.neg_pairs // 2)
                lower = q_hi
                upper = (1 - (q_hi - q_lo).clamp(min=0)).clamp(min=lower + 1e-3).clamp(max=0.999)
            if masked:              # the positives: one masked pass over [n, n]
                terms = [(s, same.fill_diagonal_(False))]
            else:                   # the positives: each size group's same-class blocks z_c z_c^T, [c, k, k]
                terms = [((z[rows] @ z[rows].transpose(1, 2)).clamp(-1, 1), block_pairs(present))
                         for rows, present in plan.groups.blocks]
            sums, maxima = [], []   # per term: squared excursions, similarity sum, above U, below L; and the max
            for s_pos, pair in terms:
                # L < U, so at most one wall is crossed: relu(L - s)^2 + relu(s - U)^2 = (relu(L - s) + relu(s - U))^2
                outside = torch.where(pair, F.relu(lower - s_pos) + F.relu(s_pos - upper), zero)
                sp = s_pos.detach()
                sums.append(torch.stack([outside.square().sum(), torch.where(pair, sp, zero).sum(),
                                         ((sp > upper) & pair).sum().to(zero.dtype),
                                         ((sp < lower) & pair).sum().to(zero.dtype)]))
                maxima.append(sp.masked_fill(~pair, -2.0).max())
            total = torch.stack(sums).sum(0) if len(sums) > 1 else sums[0]
            reg = total[0] / num_pos
            with torch.no_grad():
                pos_sum, above, below = (total[1:].detach() / num_pos).unbind()
                self.last_stats = dict(L=lower, U=upper, num_pos=zero + num_pos, num_neg=zero + num_neg,
                                       pos_mean=pos_sum, pos_max=torch.stack(maxima).max(),
                                       frac_pos_above_U=above, frac_pos_below_L=below, reg=reg.detach())
        return reg


class _InjectGrad(torch.autograd.Function):
    """A scalar whose backward hands precomputed gradients (times the incoming one, over ``scale``) to ``inputs``.

    The gradients were taken of the terms multiplied by ``scale`` (the fp16 loss scale; ``None``: 1) and are kept
    in float32; the incoming gradient is that same scale when the total is back-propagated through a
    ``GradScaler``, so the factor is 1 and the inputs receive the scaled gradients, rounded to their dtype only
    at the end (no float16 underflow)."""

    @staticmethod
    def forward(ctx, value, grads, scale, *inputs):
        ctx.grads, ctx.scale, ctx.dtypes = grads, scale, [x.dtype for x in inputs]
        return value.clone()

    @staticmethod
    def backward(ctx, grad_out):
        factor = grad_out.float() if ctx.scale is None else grad_out.float() / ctx.scale
        return (None, None, None, *[(factor * g).to(dtype) if g is not None else None
                                    for g, dtype in zip(ctx.grads, ctx.dtypes)])


def grad_balanced_total_loss(loss_base, reg, h, params=(), weight=None, alpha_max=1.0, reduce_sum=None, stats=None,
                             scale=None):
    """``total = loss_base + alpha * reg`` with ``alpha = min(alpha_max, ||d base/d h|| / (||d reg/d h|| + 1e-12))``
    (``docs/CARROT.md``, "The weight alpha").

    ``h`` is the one tensor both terms depend on (e.g. the encoder output). ``alpha`` is detached;
    ``0`` when ``reg`` has no gradient (every positive inside the corridor). ``alpha_max`` caps the
    balanced ratio (default 1: ``reg`` is never amplified above its own strength; ``None`` or ``inf``:
    no cap). ``weight`` fixes alpha instead of balancing (no cap applies to it).

    The two gradients w.r.t. ``h`` are computed once and reused: ``total.backward()`` sends
    ``d base/d h + alpha * d reg/d h`` into ``h`` (the backbone is back-propagated once) and the base
    loss's gradients to ``params``, the parameters between ``h`` and the base loss (a projection head,
    a classifier), so the loss head is not back-propagated twice. Every parameter the base loss
    reaches without passing through ``h`` must be in ``params``.

    ``scale`` (mixed precision, ``--amp fp16``): the loss scale of the backward that will run on ``total``
    (a 0-d tensor). The gradients are taken of ``scale * base`` and ``scale * reg``, as the scaled backward
    would, so that small gradients of float16 tensors do not underflow to 0; ``alpha`` is a ratio of norms and
    does not depend on it (the ``1e-12`` is scaled too), and the sum is formed in float32.

    ``reduce_sum`` (distributed training): a function summing a tensor over processes. When ``h``
    is one process's slice of the batch, the two squared norms are summed over processes before
    the ratio, so ``alpha`` is the norm ratio over the whole batch (a common factor of all slices'
    gradients, such as the world size a gradient-keeping gather introduces, cancels).
    ``stats``: a dict that receives ``ratio`` (the uncapped norm ratio, also with a fixed ``weight``) and
    ``cap_binds`` (1 when the cap lowered alpha, else 0), 0-d tensors, so the balance can be seen.
    Returns ``(total, alpha)``.
    """
    params = [p for p in params if p.requires_grad]
    inputs = [h, *params]
    factor = 1.0 if scale is None else scale.detach().float()
    g_base = torch.autograd.grad(loss_base * factor, inputs, retain_graph=reg.requires_grad, allow_unused=True)
    g_base = [torch.zeros_like(x, dtype=torch.float32) if g is None else g.float() for g, x in zip(g_base, inputs)]
    g_reg = None
    if reg.requires_grad:
        (g_reg,) = torch.autograd.grad(reg * factor, h, allow_unused=True)
    g_reg = torch.zeros_like(h, dtype=torch.float32) if g_reg is None else g_reg.float()
    sq = torch.stack([g_base[0].square().sum(), g_reg.square().sum()])
    if reduce_sum is not None:
        sq = reduce_sum(sq)
    base_norm, reg_norm = sq.sqrt().unbind()
    ratio = torch.where(reg_norm > 0, base_norm / (reg_norm + 1e-12 * factor), torch.zeros_like(reg_norm))
    if weight is not None:
        alpha = torch.full((), float(weight), device=h.device)      # a fill on the device: no copy from the host
        binds = torch.zeros((), device=h.device)
    else:
        alpha = ratio.clamp(max=float(alpha_max)) if alpha_max is not None else ratio
        binds = (alpha < ratio).float()
    if stats is not None:
        stats.update(ratio=ratio.detach(), cap_binds=binds)
    g_h = g_base[0] + alpha * g_reg
    value = loss_base.detach() + (alpha * reg.detach().float()).to(loss_base.dtype)
    total = _InjectGrad.apply(value, [g_h, *g_base[1:]], None if scale is None else factor, h, *params)
    return total, alpha.detach()
