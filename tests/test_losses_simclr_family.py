"""NT-Logistic and Marginal Triplet against per-pair loops written from their equations."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_value_and_grad_close
from losses import MarginalTripletLoss, NTLogisticLoss, SupConLoss


def _rows(features, labels=None):
    """(rows, is_positive(i, j)) with view-major rows, one pair at a time."""
    bsz, n_views = features.shape[:2]
    rows = [features[b, v].reshape(-1) for v in range(n_views) for b in range(bsz)]
    sample = [b for v in range(n_views) for b in range(bsz)]
    if labels is None:
        same = lambda i, j: sample[i] == sample[j]
    else:
        same = lambda i, j: bool(labels[sample[i]] == labels[sample[j]])
    return rows, same


def reference_ntlogistic(features, labels=None, temperature=0.5):
    rows, same = _rows(features, labels)
    total = features.sum() * 0.0
    for i in range(len(rows)):
        pos, neg = [], []
        for j in range(len(rows)):
            if j == i:
                continue
            s = rows[i] @ rows[j] / temperature
            if same(i, j):
                pos.append(math.log(1.0) - torch.log1p(torch.exp(-s)))      # log sigmoid(s)
            else:
                neg.append(-torch.log1p(torch.exp(s)))                       # log sigmoid(-s)
        if pos:
            total = total - sum(pos) / len(pos)
        if neg:
            total = total - sum(neg) / len(neg)
    return total / len(rows)


def reference_triplet(features, labels=None, margin=1.0):
    rows, same = _rows(features, labels)
    total = features.sum() * 0.0
    for i in range(len(rows)):
        pos = [j for j in range(len(rows)) if j != i and same(i, j)]
        neg = [k for k in range(len(rows)) if k != i and not same(i, k)]
        if not pos or not neg:
            continue
        per_pos = []
        for p in pos:
            hinges = [F.relu(rows[i] @ rows[n] - rows[i] @ rows[p] + margin) for n in neg]  # relu: 0 slope at 0
            per_pos.append(sum(hinges) / len(neg))
        total = total + sum(per_pos) / len(pos)
    return total / len(rows)


def unit(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


LOSSES = {
    'ntlogistic': (lambda: NTLogisticLoss(temperature=0.5), lambda f, y: reference_ntlogistic(f, y, 0.5)),
    'margin_triplet': (lambda: MarginalTripletLoss(margin=0.7), lambda f, y: reference_triplet(f, y, 0.7)),
}


def check(name, features, labels=None):
    make, reference = LOSSES[name]
    return assert_value_and_grad_close(lambda x: make()(x, labels=labels), lambda x: reference(x, labels), features)


@pytest.mark.parametrize('name', sorted(LOSSES))
@pytest.mark.parametrize('n_views', [2, 3])
@pytest.mark.parametrize('supervised', [False, True])
def test_matches_reference(name, n_views, supervised):
    features = unit(10, n_views, 8, seed=n_views)
    labels = torch.randint(0, 3, (10,), generator=torch.Generator().manual_seed(5)) if supervised else None
    check(name, features, labels)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_float32_close_to_float64(name):
    features = unit(64, 2, 16, seed=7)
    make, _ = LOSSES[name]
    torch.testing.assert_close(make()(features.float()).double(), make()(features), rtol=1e-5, atol=1e-6)


def test_triplet_ties_and_hinge_boundary():
    # entries +-0.5 in 4-D: unit vectors whose dot products are exact multiples of 0.25, so many
    # similarities tie exactly and many hinges are exactly 0 (slope 0 there, as relu)
    g = torch.Generator().manual_seed(3)
    features = (torch.randint(0, 2, (8, 2, 4), generator=g).double() - 0.5)
    for margin in (0.0, 0.5):
        assert_value_and_grad_close(MarginalTripletLoss(margin), lambda x: reference_triplet(x, None, margin),
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


@pytest.mark.parametrize('name', sorted(LOSSES))
@pytest.mark.parametrize('case', ['B=1', 'one_view', 'one_class', 'identical', 'all_distinct'])
def test_degenerate_batches_are_finite(name, case):
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
    make, reference = LOSSES[name]
    loss = make()(x, labels=labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(loss.double(), reference(features.double(), labels), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_bf16_autocast_computes_in_float32(name):
    features = unit(16, 2, 8, seed=4, dtype=torch.float32)
    make, _ = LOSSES[name]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = make()(features.bfloat16())
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, make()(features.bfloat16().float()))


def test_mask_equals_labels_and_bad_arguments():
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
