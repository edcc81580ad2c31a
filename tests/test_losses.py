"""losses.py: SupConLoss, NTLogisticLoss and MarginalTripletLoss against the per-row / per-pair loops of
``tests/reference.py``, written from their equations."""
import math

import pytest
import torch
import torch.nn.functional as F

import reference
from helpers import unit
from losses import MarginalTripletLoss, NTLogisticLoss, SupConLoss
from reference import assert_value_and_grad_close


def check(features, **kw):
    temps = dict(temperature=kw.pop('temperature', 0.1), base_temperature=kw.pop('base_temperature', 0.07))
    mode = kw.pop('mode', 'all')
    return assert_value_and_grad_close(lambda x: SupConLoss(contrast_mode=mode, **temps)(x, **kw),
                                       lambda x: reference.contrastive(x, mode=mode, **kw, **temps), features,
                                       atol=1e-7)


@pytest.mark.parametrize('n_views', [1, 2, 3])
@pytest.mark.parametrize('mode', ['all', 'one'])
@pytest.mark.parametrize('supervision', ['labels', 'mask', 'none'])
def test_matches_reference(n_views, mode, supervision):
    bsz = 12
    features = unit(bsz, n_views, 16, seed=n_views)
    labels = torch.randint(0, 4, (bsz,), generator=torch.Generator().manual_seed(1))
    kw = {}
    if supervision == 'labels':
        kw['labels'] = labels
    elif supervision == 'mask':
        kw['mask'] = (labels[:, None] == labels[None, :]).float()
    check(features, mode=mode, **kw)


def test_asymmetric_mask_and_extra_dims():
    features = unit(6, 2, 2, 4, seed=3)               # [B, V, 2, 4] is flattened to D = 8
    mask = (torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    check(features, mask=mask)


def test_float32_matches_float64():
    features = unit(16, 2, 32, seed=4)
    labels = torch.arange(16) % 3
    lo = SupConLoss()(features.float(), labels)
    hi = reference.contrastive(features, labels)
    assert lo.dtype == torch.float32
    torch.testing.assert_close(lo.double(), hi, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('case', ['B1_V1', 'B1_V2', 'identical', 'one_class', 'no_positives', 'large_logits'])
def test_degenerate_inputs_are_finite(case):
    if case == 'B1_V1':
        loss = check(unit(1, 1, 8), labels=torch.tensor([0]))
        assert loss.item() == 0.0  # nothing to contrast: contributes 0
    elif case == 'B1_V2':
        check(unit(1, 2, 8))
    elif case == 'identical':
        check(unit(1, 1, 8).expand(5, 2, 8).contiguous(), labels=torch.tensor([0, 1, 0, 1, 2]))
    elif case == 'one_class':
        check(unit(7, 2, 8), labels=torch.zeros(7, dtype=torch.long))
    elif case == 'no_positives':
        loss = check(unit(5, 1, 8), labels=torch.arange(5))
        assert loss.item() == 0.0
    else:  # unnormalized features with far-apart logits: no underflow to log(0)
        check(unit(6, 2, 8) * 30, labels=torch.tensor([0, 0, 1, 1, 2, 2]), temperature=0.05)


def test_anchor_without_positive_counts_in_mean():
    features = unit(3, 1, 8)
    labels = torch.tensor([0, 0, 1])   # the third anchor has no positive
    full = SupConLoss()(features, labels)
    pair = SupConLoss()(features, mask=torch.tensor([[1., 1, 0], [1, 1, 0], [0, 0, 0]]))
    torch.testing.assert_close(full, pair)
    both = reference.contrastive(features, labels)
    torch.testing.assert_close(full, both)


def test_simclr_is_labels_of_distinct_samples():
    features = unit(8, 2, 16)
    torch.testing.assert_close(SupConLoss()(features), SupConLoss()(features, labels=torch.arange(8)))


def test_temperature_scaling():
    features, labels = unit(8, 2, 16), torch.arange(8) % 2
    a = SupConLoss(temperature=0.1, base_temperature=0.1)(features, labels)
    b = SupConLoss(temperature=0.1, base_temperature=0.2)(features, labels)
    torch.testing.assert_close(b, a / 2)


def test_bf16_autocast_computes_in_float32():
    features, labels = unit(16, 2, 32, dtype=torch.float32), torch.arange(16) % 4
    want = SupConLoss()(features, labels)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = SupConLoss()(features.bfloat16(), labels)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        same = SupConLoss()(features, labels)   # float32 input under autocast: computed in float32
    torch.testing.assert_close(same, want, rtol=1e-6, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match='at least 3'):
        SupConLoss()(torch.randn(4, 8))
    with pytest.raises(ValueError, match='both'):
        SupConLoss()(unit(4, 2, 8), labels=torch.arange(4), mask=torch.eye(4))
    with pytest.raises(ValueError, match='Num of labels'):
        SupConLoss()(unit(4, 2, 8), labels=torch.arange(3))
    with pytest.raises(ValueError, match='mask'):
        SupConLoss()(unit(4, 2, 8), mask=torch.eye(3))
    with pytest.raises(ValueError, match='> 0'):
        SupConLoss(temperature=-0.1)
    with pytest.raises(ValueError, match='Unknown mode'):
        SupConLoss(contrast_mode='some')


FAMILY = {
    'ntlogistic': (lambda: NTLogisticLoss(temperature=0.5), lambda f, y: reference.ntlogistic(f, y, 0.5)),
    'margin_triplet': (lambda: MarginalTripletLoss(margin=0.7), lambda f, y: reference.triplet(f, y, 0.7)),
}


def check_family(name, features, labels=None):
    make, oracle = FAMILY[name]
    return assert_value_and_grad_close(lambda x: make()(x, labels=labels), lambda x: oracle(x, labels), features)


@pytest.mark.parametrize('name', sorted(FAMILY))
@pytest.mark.parametrize('n_views', [2, 3])
@pytest.mark.parametrize('supervised', [False, True])
def test_family_matches_reference(name, n_views, supervised):
    features = unit(10, n_views, 8, seed=n_views)
    labels = torch.randint(0, 3, (10,), generator=torch.Generator().manual_seed(5)) if supervised else None
    check_family(name, features, labels)


@pytest.mark.parametrize('name', sorted(FAMILY))
def test_family_float32_close_to_float64(name):
    features = unit(64, 2, 16, seed=7)
    make, _ = FAMILY[name]
    torch.testing.assert_close(make()(features.float()).double(), make()(features), rtol=1e-5, atol=1e-6)


def test_triplet_ties_and_hinge_boundary():
    # entries +-0.5 in 4-D: unit vectors whose dot products are exact multiples of 0.25, so many
    # similarities tie exactly and many hinges are exactly 0 (slope 0 there, as relu)
    g = torch.Generator().manual_seed(3)
    features = (torch.randint(0, 2, (8, 2, 4), generator=g).double() - 0.5)
    for margin in (0.0, 0.5):
        assert_value_and_grad_close(MarginalTripletLoss(margin), lambda x, m=margin: reference.triplet(x, None, m),
                                    features)


def test_triplet_zero_when_margin_is_satisfied():
    # two far-apart samples, identical views: s_pos = 1, s_neg = -1, hinge max(-2 + m, 0) = 0 for m <= 2
    f = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[-1.0, 0.0], [-1.0, 0.0]]])
    assert MarginalTripletLoss(1.0)(f).item() == 0.0
    assert MarginalTripletLoss(3.0)(f).item() == pytest.approx(1.0)


def test_ntlogistic_balances_positives_and_negatives():
    # the positive side has weight 1 in total, whatever the number of negatives
    features = unit(40, 2, 8, seed=1)
    x = features.clone().requires_grad_(True)
    loss = NTLogisticLoss(0.5)(x)
    rows = features.transpose(0, 1).reshape(80, 8)
    s = rows @ rows.T / 0.5
    pos = torch.roll(torch.eye(80, dtype=torch.bool), 40, dims=1)
    neg = ~pos & ~torch.eye(80, dtype=torch.bool)
    want = -(F.logsigmoid(s[pos]).mean() + F.logsigmoid(-s[neg]).mean())
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize('name', sorted(FAMILY))
@pytest.mark.parametrize('case', ['B=1', 'one_view', 'one_class', 'identical', 'all_distinct'])
def test_family_degenerate_batches_are_finite(name, case):
    features, labels = unit(6, 2, 4, seed=2), None
    if case == 'B=1':
        features = features[:1]
    elif case == 'one_view':
        features = features[:, :1]
    elif case == 'one_class':
        labels = torch.zeros(6, dtype=torch.long)
    elif case == 'identical':
        features = torch.ones(6, 2, 4) / 2
    elif case == 'all_distinct':
        features, labels = features[:, :1], torch.arange(6)
    x = features.clone().requires_grad_(True)
    make, oracle = FAMILY[name]
    loss = make()(x, labels=labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(loss.double(), oracle(features.double(), labels), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', sorted(FAMILY))
def test_family_bf16_autocast_computes_in_float32(name):
    features = unit(16, 2, 8, seed=4, dtype=torch.float32)
    make, _ = FAMILY[name]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = make()(features.bfloat16())
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, make()(features.bfloat16().float()))


def test_family_mask_equals_labels_and_bad_arguments():
    features = unit(8, 2, 4, seed=6)
    labels = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])
    mask = (labels[:, None] == labels[None, :]).float()
    for loss in (NTLogisticLoss(), MarginalTripletLoss()):
        torch.testing.assert_close(loss(features, labels=labels), loss(features, mask=mask))
        with pytest.raises(ValueError):
            loss(features, labels=labels, mask=mask)
        with pytest.raises(ValueError):
            loss(features[:, 0], labels=labels)
    with pytest.raises(ValueError):
        NTLogisticLoss(temperature=0)
    with pytest.raises(ValueError):
        MarginalTripletLoss(margin=-0.1)
    # the family shares SupConLoss's argument checks
    with pytest.raises(ValueError):
        SupConLoss()(features, labels=labels[:3])


# ---------------------------------------------------------------- logit-adjusted cross-entropy, balanced softmax
@pytest.mark.parametrize('counts,labels', [([50, 20, 5, 1], [0, 1, 2, 3, 0, 0]),     # a long tail
                                           ([7, 0, 3, 9], [0, 2, 3, 3]),             # a class absent from training
                                           ([5], [0, 0, 0])])                        # one class
@pytest.mark.parametrize('tau', [0.0, 1.0, 1.7])
def test_logit_adjusted_matches_reference(counts, labels, tau):
    from losses import LogitAdjustedLoss
    logits = torch.randn(len(labels), len(counts), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor(labels)
    loss = LogitAdjustedLoss(counts, tau).double()
    reference.assert_value_and_grad_close(lambda x: loss(x, labels),
                                          lambda x: reference.logit_adjusted(x, labels, counts, tau), logits)
    if tau == 0:
        torch.testing.assert_close(loss(logits, labels), F.cross_entropy(logits, labels))


def test_logit_adjustment_power_and_arguments():
    """The shift favours rare classes in the loss (a head-class prediction costs more), and bad tau is refused."""
    from losses import LogitAdjustedLoss
    logits, labels = torch.zeros(1, 2), torch.tensor([0])
    head = LogitAdjustedLoss([90, 10], 1.0)(logits, labels)
    assert float(head) < float(F.cross_entropy(logits, labels))     # the head class's label is cheap when adjusted
    for tau in (-1.0, math.inf):
        with pytest.raises(ValueError):
            LogitAdjustedLoss([1, 2], tau)


# ---------------------------------------------------------------- class blocks grouped by size
def test_class_groups_cover_every_row_once_and_bound_the_padding():
    """``class_groups`` puts every row in exactly one block entry of its class, ``per_row`` reads it back,
    and the padded entries stay within 4 sum_c n_c^2 on a long tail where one block padded to the largest class
    takes far more (the power check: 10 classes of 2^9 .. 1 rows)."""
    from losses import class_blocks, class_groups
    labels = torch.cat([torch.full((2 ** (9 - c),), c) for c in range(10)])[torch.randperm(1023)]
    groups = class_groups(labels)
    seen = torch.cat([rows[present] for rows, present in groups.blocks])
    assert sorted(seen.tolist()) == list(range(labels.shape[0]))
    for rows, present in groups.blocks:
        assert (labels[rows] == labels[rows[:, :1]]).masked_fill(~present, True).all()     # one class per block
    values = [rows.double() + 0.5 for rows, _ in groups.blocks]                          # each entry names its row
    assert torch.equal(groups.per_row(values), torch.arange(labels.shape[0]).double() + 0.5)
    sq = float(sum(2 ** (2 * (9 - c)) for c in range(10)))
    padded = sum(rows.shape[0] * rows.shape[1] ** 2 for rows, _ in groups.blocks)
    one_block = class_blocks(labels)[0]
    assert padded <= 4 * sq < one_block.shape[0] * one_block.shape[1] ** 2
    balanced = class_groups(torch.arange(12) % 3)
    assert len(balanced.blocks) == 1 and balanced.blocks[0][0].shape == (3, 4)           # as class_blocks


def test_queue_positive_sums_in_blocks_equal_one_block():
    """The queue's per-sample positive sums, built from [B, chunk] blocks of the label match (bounded memory
    at MoCo's queue sizes), equal the single [B, K] product; the counts exactly."""
    from helpers import loss_queue
    from losses import queue_positive_sums
    queue = loss_queue(k=23, d=6, n_classes=3, seed=2)
    labels = torch.tensor([0, 1, 2, 1, 0, 5])
    whole = queue_positive_sums(labels, queue, queue.feat, chunk=1000)
    for chunk in (1, 4, 7):
        blocks = queue_positive_sums(labels, queue, queue.feat, chunk=chunk)
        torch.testing.assert_close(blocks[0], whole[0], rtol=1e-12, atol=1e-12)
        assert torch.equal(blocks[1], whole[1])
    assert whole[1].tolist()[-1] == 0 and whole[1].sum() > 0


def test_queue_logsumexp_in_blocks_equals_the_dense_logsumexp():
    """The queue's logsumexp over [M, chunk] blocks, recomputed in the backward, equals autograd through the
    dense [M, K] logsumexp in value and gradient (a weighted sum of the rows), every key invalid included (-inf, no
    gradient)."""
    from helpers import loss_queue
    from losses import queue_logsumexp
    queue = loss_queue(k=23, d=6, n_classes=3, seed=2)
    assert not queue.valid.all()
    weights = torch.randn(10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def dense(z):
        return ((z / 0.3 @ queue.feat.T).masked_fill(~queue.valid, -math.inf).logsumexp(1) * weights).sum()
    for chunk in (1, 5, 23, 100):
        assert_value_and_grad_close(lambda z, c=chunk: (queue_logsumexp(z, queue, 0.3, chunk=c) * weights).sum(), dense,
                                    unit(10, 6, seed=4))
    z = unit(10, 6, seed=4).requires_grad_(True)
    out = queue_logsumexp(z, queue._replace(valid=torch.zeros_like(queue.valid)), 0.3, chunk=5)
    out.backward(torch.ones_like(out))
    assert torch.isinf(out).all() and torch.equal(z.grad, torch.zeros_like(z))
