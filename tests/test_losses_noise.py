"""losses_noise.py against the per-row loops of tests/reference.py (values and gradients, float64), on random
batches and on hand-built edge cases (a class with one sample, every label wrong, q -> 0); Sel-CL's selection
against the authors' code path; the methods' and --loss flags' guards."""
import math

import pytest
import torch

import reference
from helpers import LOSS_CASES, loss_case, loss_queue, run_in_process, unit
from losses_field import sincere_loss
from losses_noise import (
    GCELoss,
    RINCELoss,
    SCELoss,
    SelCLLoss,
    SymNCELoss,
    rince_loss,
    selcl_selection,
)

TAU = 0.5
CASES = list(LOSS_CASES)


# ---------------------------------------------------------------- SymNCE and RINCE
@pytest.mark.parametrize('name', CASES)
@pytest.mark.parametrize('with_queue', [False, True])
@pytest.mark.parametrize('beta', [0.0, 1.0, 3.0])
def test_symnce_matches_reference(name, with_queue, beta):
    feats, labels = loss_case(name)
    queue = loss_queue() if with_queue else None
    loss = SymNCELoss(beta, temperature=TAU)
    reference.assert_value_and_grad_close(lambda f: loss(f, labels, queue=queue),
                                          lambda f: reference.symnce(f, labels, TAU, beta, queue), feats)


@pytest.mark.parametrize('name', CASES)
@pytest.mark.parametrize('with_queue', [False, True])
@pytest.mark.parametrize('q,lam', [(0.5, 0.01), (1.0, 1.0), (0.1, 0.5)])
def test_rince_matches_reference(name, with_queue, q, lam):
    feats, labels = loss_case(name)
    queue = loss_queue() if with_queue else None
    loss = RINCELoss(q, lam, temperature=TAU)
    reference.assert_value_and_grad_close(lambda f: loss(f, labels, queue=queue),
                                          lambda f: reference.rince(f, labels, TAU, q, lam, queue), feats)


def test_rince_tends_to_sincere_plus_log_lambda_as_q_goes_to_0():
    feats, labels = loss_case('random')
    lam = 0.3
    near = rince_loss(feats, labels, TAU, q=1e-7, lam=lam)
    # every anchor of 'random' has a positive, so the constant log(lam) is added to each
    torch.testing.assert_close(near, sincere_loss(feats, labels, TAU) + math.log(lam), rtol=1e-5, atol=1e-5)


def test_every_label_wrong_gives_finite_values_and_gradients():
    """Each sample alone in its class (no positive) or all in one (no negative): finite, and the robust terms
    behave as their definitions say."""
    feats = unit(6, 2, 5, seed=3)
    for labels in (torch.arange(6), torch.zeros(6, dtype=torch.long)):
        for loss in (SymNCELoss(1.0, TAU), RINCELoss(0.5, 0.1, TAU)):
            f = feats.clone().requires_grad_(True)
            value = loss(f, labels)
            value.backward()
            assert torch.isfinite(value) and torch.isfinite(f.grad).all()


def test_loss_guards():
    for bad in (dict(q=0.0), dict(q=1.5), dict(lam=0.0), dict(lam=2.0)):
        with pytest.raises(ValueError):
            RINCELoss(**bad)
    with pytest.raises(ValueError):
        SymNCELoss(-1.0)
    with pytest.raises(ValueError):
        GCELoss(0.0)
    with pytest.raises(ValueError):
        SCELoss(0.0, 0.0)
    with pytest.raises(ValueError):
        SelCLLoss(10, 4, 2, warmup=0)


# ---------------------------------------------------------------- GCE and SCE
LOGITS = {'random': (torch.randn(7, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
                     torch.tensor([0, 1, 2, 3, 0, 1, 2])),
          'one row, confident': (torch.tensor([[30.0, -30.0, 0.0]], dtype=torch.float64), torch.tensor([1])),
          'every label wrong': (torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0]], dtype=torch.float64),
                                torch.tensor([1, 2, 0]))}


@pytest.mark.parametrize('name', list(LOGITS))
@pytest.mark.parametrize('q', [1e-4, 0.7, 1.0])
def test_gce_matches_reference(name, q):
    logits, labels = LOGITS[name]
    reference.assert_value_and_grad_close(lambda x: GCELoss(q)(x, labels), lambda x: reference.gce(x, labels, q),
                                          logits)


def test_gce_tends_to_cross_entropy_as_q_goes_to_0():
    logits, labels = LOGITS['random']
    torch.testing.assert_close(GCELoss(1e-7)(logits, labels), torch.nn.functional.cross_entropy(logits, labels),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', list(LOGITS))
@pytest.mark.parametrize('alpha,beta', [(0.1, 1.0), (1.0, 0.0), (0.0, 2.0)])
def test_sce_matches_reference(name, alpha, beta):
    logits, labels = LOGITS[name]
    reference.assert_value_and_grad_close(lambda x: SCELoss(alpha, beta)(x, labels),
                                          lambda x: reference.sce(x, labels, alpha, beta), logits)


# ---------------------------------------------------------------- Sel-CL
def clustered(n_per_class=12, n_classes=3, d=5, flip=0.3, seed=0):
    """Unit features around one centre per class, and labels of which a share ``flip`` is moved to another class."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(n_classes, d, generator=g, dtype=torch.float64), dim=1)
    true = torch.arange(n_classes).repeat_interleave(n_per_class)
    feat = torch.nn.functional.normalize(centres[true] + 0.35 * torch.randn(len(true), d, generator=g,
                                                                             dtype=torch.float64), dim=1)
    noisy = true.clone()
    moved = torch.rand(len(true), generator=g) < flip
    noisy[moved] = (true[moved] + 1 + torch.randint(0, n_classes - 1, (int(moved.sum()),), generator=g)) % n_classes
    return feat, noisy, true


@pytest.mark.parametrize('k,alpha,beta', [(5, 0.5, 0.25), (3, 0.25, 0.5), (10, 1.0, 0.0), (7, 0.0, 1.0)])
@pytest.mark.parametrize('seed', [0, 1])
def test_selcl_selection_matches_the_authors_code_path(k, alpha, beta, seed):
    feat, noisy, _ = clustered(seed=seed)
    got, threshold = selcl_selection(feat, noisy, k, alpha, beta, 3)
    want, want_threshold = reference.selcl_selection_authors(feat, noisy, k, alpha, beta, 3)
    assert got.tolist() == want.tolist()
    assert threshold == pytest.approx(want_threshold, rel=1e-9, abs=1e-12)


def test_selcl_selection_keeps_mostly_clean_examples():
    """Power: on well-separated classes with 30 % of the labels moved, the selected examples are far cleaner than
    the training set, and a shuffled feature bank (nothing to vote with) loses that."""
    feat, noisy, true = clustered(n_per_class=40, flip=0.3)
    selected, _ = selcl_selection(feat, noisy, 10, 0.5, 0.25, 3)
    clean = (noisy == true)
    assert clean[selected].double().mean() > 0.95 > clean.double().mean() + 0.15
    shuffled = feat[torch.randperm(len(feat), generator=torch.Generator().manual_seed(0))]
    bad, _ = selcl_selection(shuffled, noisy, 10, 0.5, 0.25, 3)
    assert clean[bad].double().mean() < 0.85


def selcl_after_a_selection(feat, noisy, **kw):
    """A SelCLLoss whose bank holds ``feat`` and ``noisy`` (as one epoch would leave them) and whose warm-up is
    over."""
    loss = SelCLLoss(len(noisy), feat.shape[1], 3, warmup=1, temperature=TAU, **kw).double()
    loss.bank.copy_(feat)
    loss.bank_label.copy_(noisy)
    loss.end_epoch()
    assert loss.selecting
    return loss


def partner_oracle(loss, feat, noisy):
    selected, thr = loss.selected, float(loss.threshold)

    def partner(a, ya, b, yb):
        return a != b and ya == yb and ((bool(selected[a]) and bool(selected[b]))
                                        or float(feat[a] @ feat[b]) >= thr - 1e-6)
    return partner


@pytest.mark.parametrize('n_views', [1, 2, 3])
@pytest.mark.parametrize('with_queue', [False, True])
@pytest.mark.parametrize('seed', [0, 1])
def test_selcl_step_matches_reference(n_views, with_queue, seed):
    feat, noisy, _ = clustered(seed=seed)
    loss = selcl_after_a_selection(feat, noisy, k=5)
    partner = partner_oracle(loss, feat, noisy)
    g = torch.Generator().manual_seed(seed + 10)
    ids = torch.randperm(len(noisy), generator=g)[:9]
    labels = noisy[ids]
    views = unit(9, n_views, 5, seed=seed + 20)
    queue = None
    if with_queue:
        q = loss_queue(k=8, d=5, seed=seed)
        queue = q._replace(idx=torch.randperm(len(noisy), generator=g)[:8], label=noisy[q.idx % len(noisy)])
        queue = queue._replace(idx=torch.cat([ids[:2], queue.idx[2:]]), label=torch.cat([labels[:2], queue.label[2:]]))

    def step(f):
        loss.bank.copy_(feat)                  # the step writes the bank; the selection is what counts here
        return loss(f, labels, ids, queue=queue)
    reference.assert_value_and_grad_close(step, lambda f: reference.selcl(f, labels, ids, partner, TAU, queue), views)


def test_selcl_warm_up_is_the_instance_term_and_the_bank_follows_the_steps():
    feat, noisy, _ = clustered()
    loss = SelCLLoss(len(noisy), 5, 3, warmup=2, temperature=TAU).double()
    ids = torch.arange(0, 36, 4)
    views = unit(9, 2, 5, seed=4)
    value = loss(views, noisy[ids], ids)
    never = reference.selcl(views, noisy[ids], ids, lambda *a: False, TAU)
    torch.testing.assert_close(value, never)
    mean = torch.nn.functional.normalize(views.mean(1), dim=1)
    torch.testing.assert_close(loss.bank[ids], mean)
    assert loss.bank_label[ids].tolist() == noisy[ids].tolist()
    loss.end_epoch()
    assert not loss.selecting and not loss.selected.any()        # still warming up after one of two epochs
    loss.end_epoch()
    assert loss.selecting


def test_selcl_state_travels_in_its_state_dict():
    feat, noisy, _ = clustered()
    loss = selcl_after_a_selection(feat, noisy, k=5)
    copy = SelCLLoss(len(noisy), 5, 3, k=5, temperature=TAU).double()
    copy.load_state_dict(loss.state_dict())
    assert copy.epochs == loss.epochs and copy.selecting
    assert torch.equal(copy.selected, loss.selected) and torch.equal(copy.threshold, loss.threshold)


# ---------------------------------------------------------------- the flags, through the scripts
@pytest.mark.parametrize('args,words', [
    (('main_supcon.py', '--method', 'RINCE', '--rince_q', '0'), ('--rince_q',)),
    (('main_supcon.py', '--method', 'RINCE', '--rince_lambda', '1.5'), ('--rince_lambda',)),
    (('main_supcon.py', '--method', 'SymNCE', '--symnce_beta', '-1'), ('--symnce_beta',)),
    (('main_supcon.py', '--method', 'SelCL', '--selcl_warmup', '0'), ('--selcl_warmup',)),
    (('main_supcon.py', '--method', 'SelCL', '--selcl_alpha', '2'), ('--selcl_alpha',)),
    (('main_supcon.py', '--method', 'SupCon', '--rince_q', '0.5'), ('--rince_q', 'RINCE')),
    (('main_ce.py', '--loss', 'gce', '--gce_q', '0'), ('--gce_q',)),
    (('main_ce.py', '--loss', 'sce', '--sce_alpha', '0', '--sce_beta', '0'), ('--sce_alpha',)),
    (('main_ce.py', '--gce_q', '0.5'), ('--gce_q', 'gce')),
    (('main_ce.py', '--loss', 'gce', '--sce_beta', '0.5'), ('--sce_beta', 'sce')),
])
def test_out_of_range_values_are_one_line_errors(args, words):
    from helpers import assert_one_line_error
    assert_one_line_error(run_in_process(*args, '--dataset', 'digits'), *words)


@pytest.mark.parametrize('with_queue', [False, True])
def test_selcl_step_after_a_selection_never_waits_for_the_device(with_queue):
    """The step that uses a selection (partners from the snapshot, the bank written) reads nothing back: the
    sync counter of tests/sync_count.py counts none; the selection itself runs after the epoch."""
    from sync_count import SyncCounter
    feat, noisy, _ = clustered()
    loss = selcl_after_a_selection(feat, noisy, k=5)
    ids = torch.arange(0, 36, 4)
    labels = noisy[ids]
    views = unit(9, 2, 5, seed=4)
    queue = loss_queue(k=8, d=5) if with_queue else None
    with SyncCounter() as counter:
        counter.host(labels, ids)
        device_views = views.to(torch.device('cpu'))
        loss(device_views, labels, ids, queue=queue)
    assert dict(counter.counts) == {}
