"""SupConLoss against a plain per-row loop written from the paper's equation."""

import pytest
import torch
import torch.nn.functional as F

from losses import SupConLoss


def reference_supcon(features, labels=None, mask=None, temperature=0.07, base_temperature=0.07,
                     mode='all'):
    """One anchor at a time, one positive at a time (SupContrast semantics)."""
    bsz, n_views = features.shape[:2]
    f = features.reshape(bsz, n_views, -1)
    rows = [f[b, v] for v in range(n_views) for b in range(bsz)]       # view-major
    sample = [b for v in range(n_views) for b in range(bsz)]
    if labels is not None:
        weight = lambda i, j: float(labels[i] == labels[j])
    elif mask is not None:
        weight = lambda i, j: float(mask[i, j])
    else:
        weight = lambda i, j: float(i == j)
    anchors = range(len(rows)) if mode == 'all' else range(bsz)
    total = features.sum() * 0.0  # keeps the graph when no anchor has a positive
    for a in anchors:
        others = [c for c in range(len(rows)) if c != a]
        if not others:
            continue
        logits = torch.stack([rows[a] @ rows[c] / temperature for c in others])
        log_denom = torch.logsumexp(logits, 0)
        num, den = features.new_zeros(()), 0.0
        for k, c in enumerate(others):
            w = weight(sample[a], sample[c])
            if w:
                num = num + w * (logits[k] - log_denom)
                den += w
        if den > 0:
            total = total - (temperature / base_temperature) * num / den
    return total / len(anchors)


def unit(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


def check(features, **kw):
    temps = dict(temperature=kw.pop('temperature', 0.1), base_temperature=kw.pop('base_temperature', 0.07))
    mode = kw.pop('mode', 'all')
    x1 = features.clone().requires_grad_(True)
    x2 = features.clone().requires_grad_(True)
    got = SupConLoss(contrast_mode=mode, **temps)(x1, **kw)
    want = reference_supcon(x2, mode=mode, **kw, **temps)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    got.backward()
    want.backward()
    assert torch.isfinite(x1.grad).all()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-7)
    return got


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
    hi = reference_supcon(features, labels)
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
    both = reference_supcon(features, labels)
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
