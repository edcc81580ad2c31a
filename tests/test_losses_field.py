"""losses_field.py against the per-row loops of tests/reference.py (values and gradients, float64), on random
batches and on hand-built edge cases; KCL's draw; the methods' guards."""
import collections
import math

import pytest
import torch

import reference
from helpers import LOSS_CASES, loss_case, loss_queue
from losses import SupConLoss
from losses_field import (
    EpsSupInfoNCELoss,
    KCLLoss,
    SINCERELoss,
    SpreadLoss,
    SupDCLLoss,
    kcl_loss,
    kcl_positives,
    sincere_loss,
    spread_loss,
    supdcl_loss,
)

TAU = 0.5
CASES = LOSS_CASES
case = loss_case


a_queue = loss_queue


def drawn_lists(chosen, valid):
    return [[int(c) for c, ok in zip(row, oks) if ok] for row, oks in zip(chosen, valid)]


# ---------------------------------------------------------------- values and gradients against the loops
@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('k', [0, 2, 50])
def test_kcl_matches_reference(name, k):
    feats, labels = case(name)
    chosen, valid = kcl_positives(labels, feats.shape[1], k, torch.Generator().manual_seed(1))
    drawn = drawn_lists(chosen, valid)
    reference.assert_value_and_grad_close(lambda f: kcl_loss(f, labels, chosen, valid, TAU),
                                          lambda f: reference.kcl(f, labels, drawn, TAU), feats)


@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('margin', [0.0, 0.3])
@pytest.mark.parametrize('with_queue', [False, True])
def test_sincere_and_eps_match_reference(name, margin, with_queue):
    feats, labels = case(name)
    queue = a_queue() if with_queue else None
    reference.assert_value_and_grad_close(lambda f: sincere_loss(f, labels, TAU, margin, queue),
                                          lambda f: reference.sincere(f, labels, TAU, margin, queue), feats)


@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('with_queue', [False, True])
def test_supdcl_matches_reference(name, with_queue):
    feats, labels = case(name)
    queue = a_queue() if with_queue else None
    reference.assert_value_and_grad_close(lambda f: supdcl_loss(f, labels, TAU, queue),
                                          lambda f: reference.supdcl(f, labels, TAU, queue), feats)


@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('alpha', [0.0, 0.3, 1.0])
@pytest.mark.parametrize('with_queue', [False, True])
def test_spread_matches_reference(name, alpha, with_queue):
    feats, labels = case(name)
    queue = a_queue() if with_queue else None
    reference.assert_value_and_grad_close(lambda f: spread_loss(f, labels, TAU, alpha, queue),
                                          lambda f: reference.spread(f, labels, TAU, alpha, queue), feats)


def test_power_the_references_tell_the_losses_apart():
    """Each loop is specific: SINCERE's differs from SupDCL's and SupCon's on the same batch, epsilon moves it, and
    a SINCERE that keeps same-class rows in its denominator (SupCon's) fails the SINCERE oracle."""
    feats, labels = case('random')
    values = {'sincere': reference.sincere(feats, labels, TAU), 'eps': reference.sincere(feats, labels, TAU, 0.3),
              'supdcl': reference.supdcl(feats, labels, TAU),
              'supcon': reference.contrastive(feats, labels, temperature=TAU, base_temperature=TAU)}
    assert len({round(float(v), 6) for v in values.values()}) == 4
    with pytest.raises(AssertionError):
        reference.assert_value_and_grad_close(lambda f: SupConLoss(TAU, base_temperature=TAU)(f, labels),
                                              lambda f: reference.sincere(f, labels, TAU), feats)


def test_one_class_values_by_definition():
    """One class, no queue: SupDCL and SINCERE have no negatives (0 and, with a margin, -eps: logit units since
    6d42068); L_spread's
    class-conditional term is SimCLR's NT-Xent with tau_base = tau."""
    feats, labels = case('one class')
    assert float(supdcl_loss(feats, labels, TAU)) == 0.0
    assert float(sincere_loss(feats, labels, TAU)) == 0.0
    assert math.isclose(float(sincere_loss(feats, labels, TAU, 0.3)), -0.3, rel_tol=1e-12)
    simclr = SupConLoss(TAU, base_temperature=TAU)(feats)
    torch.testing.assert_close(spread_loss(feats, labels, TAU, 1.0), simclr)


def test_float32_close_to_float64_and_bf16_autocast():
    feats, labels = case('random', d=16)
    for fn in (lambda f: sincere_loss(f, labels, 0.1, 0.2), lambda f: supdcl_loss(f, labels, 0.1),
               lambda f: spread_loss(f, labels, 0.1, 0.5), lambda f: EpsSupInfoNCELoss(0.2, 0.1)(f, labels)):
        want = fn(feats)
        torch.testing.assert_close(fn(feats.float()).double(), want, rtol=1e-5, atol=1e-5)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got = fn(feats.float())
        assert got.dtype == torch.float32


# ---------------------------------------------------------------- KCL's draw
def test_kcl_draw_is_within_class_outside_own_sample_and_without_replacement():
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 0, 1, 3, 3])
    bsz, n_views, k = labels.shape[0], 2, 3
    chosen, valid = kcl_positives(labels, n_views, k, torch.Generator().manual_seed(0))
    row_label, row_sample = labels.repeat(n_views), torch.arange(bsz).repeat(n_views)
    for i, row in enumerate(drawn_lists(chosen, valid)):
        candidates = [j for j in range(bsz * n_views)
                      if row_label[j] == row_label[i] and row_sample[j] != row_sample[i]]
        assert len(row) == len(set(row)) == min(k, len(candidates))
        assert set(row) <= set(candidates)


def test_kcl_draw_is_uniform():
    """Over many draws every candidate of an anchor is drawn with probability k / n (chi-square, 6 candidates)."""
    labels = torch.tensor([0] * 4 + [1] * 3)
    n_views, k, draws = 2, 2, 3000
    counts = collections.Counter()
    gen = torch.Generator().manual_seed(0)
    for _ in range(draws):
        chosen, valid = kcl_positives(labels, n_views, k, gen)
        counts.update(int(c) for c, ok in zip(chosen[0], valid[0]) if ok)
    candidates = [1, 2, 3, 8, 9, 10]                       # class 0's rows outside sample 0 (rows 0 and 7)
    assert set(counts) == set(candidates)
    expected = draws * k / len(candidates)
    chi2 = sum((counts[c] - expected) ** 2 / expected for c in candidates)
    assert chi2 < 20.5                                     # p = 0.001 at 5 degrees of freedom


def test_kcl_draws_are_seeded_per_call_and_resume_exactly():
    feats, labels = case('random')
    a, b = KCLLoss(2, TAU, seed=5), KCLLoss(2, TAU, seed=5)
    values = [float(a(feats, labels)) for _ in range(4)]
    assert len(set(values)) > 1                            # a new draw per call
    assert [float(b(feats, labels)) for _ in range(4)] == values
    resumed = KCLLoss(2, TAU, seed=5)
    state = KCLLoss(2, TAU, seed=5)
    state(feats, labels), state(feats, labels)
    resumed.load_state_dict(state.state_dict())
    assert [float(resumed(feats, labels)) for _ in range(2)] == values[2:]
    assert float(KCLLoss(2, TAU, seed=6)(feats, labels)) != values[0]


def test_kcl_with_k_covering_the_class_is_supcon():
    """k at least the class size: every same-class row is a positive, so KCL equals SupCon (tau_base = tau)."""
    feats, labels = case('random')
    torch.testing.assert_close(KCLLoss(100, TAU)(feats, labels), SupConLoss(TAU, base_temperature=TAU)(feats, labels))


# ---------------------------------------------------------------- guards
def test_bad_arguments():
    with pytest.raises(ValueError):
        KCLLoss(-1)
    with pytest.raises(ValueError):
        KCLLoss(1.5)
    with pytest.raises(ValueError):
        SINCERELoss(0)
    with pytest.raises(ValueError):
        EpsSupInfoNCELoss(-0.1)
    with pytest.raises(ValueError):
        EpsSupInfoNCELoss(math.inf)
    with pytest.raises(ValueError):
        SpreadLoss(1.5)
    feats, labels = case('random')
    for loss in (SINCERELoss(), SupDCLLoss(), SpreadLoss()):
        with pytest.raises(ValueError):
            loss(feats, labels[:-1])
        with pytest.raises(ValueError):
            loss(feats, None)
        with pytest.raises(ValueError):
            loss(feats[:, 0], labels)
