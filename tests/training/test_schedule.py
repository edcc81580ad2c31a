"""training/schedule.py: SupContrast's learning-rate schedule."""
import math

import pytest
import torch

from training.schedule import Schedule


def sched(**kw):
    base = dict(learning_rate=0.5, lr_decay_rate=0.1, lr_decay_epochs=[70, 80, 90], epochs=100, cosine=False,
                warm=False, warm_epochs=10, warmup_from=0.01)
    return Schedule(**{**base, **kw})


def test_step_decay():
    opt = sched()
    assert opt.lr_at(70) == 0.5 and opt.lr_at(71) == pytest.approx(0.05)
    assert opt.lr_at(100) == pytest.approx(0.0005)


def test_cosine_to_eta_min():
    opt = sched(cosine=True)
    eta_min = 0.5 * 0.1 ** 3
    assert opt.lr_at(100) == pytest.approx(eta_min)
    assert opt.lr_at(50) == pytest.approx(eta_min + (0.5 - eta_min) / 2)


def test_warmup_per_iteration():
    opt = sched(cosine=True, warm=True)
    optim = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    opt.warmup(optim, 1, 0, 5)
    assert optim.param_groups[0]['lr'] == pytest.approx(0.01)
    opt.warmup(optim, 10, 5, 5)      # end of epoch 10 reaches the target
    assert optim.param_groups[0]['lr'] == pytest.approx(opt.warmup_target())
    eta_min = 0.5e-3
    assert opt.warmup_target() == pytest.approx(eta_min + (0.5 - eta_min) * (1 + math.cos(math.pi * 10 / 100)) / 2)
    opt.warmup(optim, 11, 0, 5)      # after warm-up: untouched
    assert optim.param_groups[0]['lr'] == pytest.approx(opt.warmup_target())


# ---------------------------------------------------------------- optimizers
def lars_reference(weights, grads_per_step, lr, momentum, weight_decay, eta, scaled):
    """LARS written per tensor from its definition: d = g + wd w; d *= eta ||w|| / ||d|| (when both are non-zero and
    the tensor is scaled); buf = momentum buf + d; w -= lr buf. Float64."""
    weights = [w.clone().double() for w in weights]
    bufs = [None] * len(weights)
    for grads in grads_per_step:
        for i, (w, g) in enumerate(zip(weights, grads)):
            wd = weight_decay if scaled[i] else 0.0
            d = g.double() + wd * w
            if scaled[i] and float(w.norm()) > 0 and float(d.norm()) > 0:
                d = d * (eta * float(w.norm()) / float(d.norm()))
            bufs[i] = d if bufs[i] is None else momentum * bufs[i] + d
            weights[i] = w - lr * bufs[i]
    return weights


def test_lars_matches_its_definition_and_keeps_biases_and_norms_out():
    """LARS (schedule.LARS through set_optimizer) equals the per-tensor loop over three steps; biases and 1-D
    weights get neither the trust ratio nor weight decay; a zero tensor is not scaled. Power: plain SGD differs."""
    from training.schedule import set_optimizer
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True),
              torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True),
              torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)]
    start = [p.detach().clone() for p in params]
    grads = [[torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params] for _ in range(3)]
    optimizer = set_optimizer(params, 0.5, 0.9, 1e-2, optimizer='lars', lars_eta=0.02)
    for step in grads:
        for p, grad in zip(params, step):
            p.grad = grad.clone()
        optimizer.step()
    want = lars_reference(start, grads, 0.5, 0.9, 1e-2, 0.02, scaled=[True, False, True])
    for got, w in zip(params, want):
        torch.testing.assert_close(got.detach(), w, rtol=1e-12, atol=1e-12)
    sgd = set_optimizer([s.clone().requires_grad_(True) for s in start], 0.5, 0.9, 1e-2)
    for step in grads:
        for p, grad in zip(sgd.param_groups[0]['params'], step):
            p.grad = grad.clone()
        sgd.step()
    assert not torch.allclose(sgd.param_groups[0]['params'][0], params[0])


def test_optimizer_groups_and_exclusions():
    """SGD (SupContrast's) is one group with weight decay on everything; --exclude_bias_norm (and always LARS) puts
    the 1-D tensors (biases, BatchNorm/LayerNorm weights) in a group without weight decay; AdamW is AdamW."""
    from networks import SupConResNet
    from training.schedule import LARS, set_optimizer
    model = SupConResNet('resnet_tiny')
    plain = set_optimizer(model.parameters(), 0.1, 0.9, 1e-4)
    assert isinstance(plain, torch.optim.SGD) and len(plain.param_groups) == 1
    adamw = set_optimizer(model.parameters(), 1e-3, 0.9, 0.05, optimizer='adamw', exclude_bias_norm=True)
    assert isinstance(adamw, torch.optim.AdamW) and [g['weight_decay'] for g in adamw.param_groups] == [0.05, 0.0]
    assert all(p.ndim > 1 for p in adamw.param_groups[0]['params'])
    assert all(p.ndim == 1 for p in adamw.param_groups[1]['params']) and adamw.param_groups[1]['params']
    lars = set_optimizer(model.parameters(), 0.1, 0.9, 1e-4, optimizer='lars')
    assert isinstance(lars, LARS) and [g['lars'] for g in lars.param_groups] == [True, False]
    assert sum(p.numel() for g in lars.param_groups for p in g['params']) == sum(
        p.numel() for p in model.parameters())


# ---------------------------------------------------------------- warm-up start
@pytest.mark.parametrize('optimizer', ['sgd', 'adamw', 'lars'])
@pytest.mark.parametrize('lr', [1e-4, 1e-3, 0.05, 0.5, 5.0])
def test_every_optimizers_warmup_starts_below_its_target_and_rises(optimizer, lr):
    """The first warm-up steps of every optimizer, through parse_option as a script builds them: the learning rate
    starts below the target and never decreases up to it (SupContrast's absolute 0.01 made AdamW's 1e-3 a
    cool-down: 0.0059 -> 0.0014 -> 0.001)."""
    from config.options import parse_option
    from core.flags import call_hook
    from training.schedule import optimizer_for
    opt = parse_option('supcon', ['--optimizer', optimizer, '--learning_rate', str(lr), '--warm', '--cosine',
                                  '--epochs', '20', '--warm_epochs', '2'])
    schedule = call_hook(Schedule, opt)
    optim = optimizer_for(opt, [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))])
    seen = []
    for epoch in (1, 2):
        schedule.adjust(optim, epoch)
        for it in range(4):
            schedule.warmup(optim, epoch, it, 4)
            seen.append(optim.param_groups[0]['lr'])
    target = schedule.warmup_target()
    assert seen[0] < target and all(a <= b for a, b in zip(seen, seen[1:])) and seen[-1] <= target
    assert seen[0] == pytest.approx(min(0.01, 0.1 * target))


def test_supcontrast_settings_keep_their_exact_warmup():
    """SupContrast's recommended settings (lr 0.5, batch 1024, cosine, 1000 epochs): the start is its 0.01 exactly,
    and every warm-up step is its formula."""
    from config.options import parse_option
    from core.flags import call_hook
    opt = parse_option('supcon', ['--learning_rate', '0.5', '--batch_size', '1024', '--cosine', '--epochs', '1000'])
    assert opt.warm and opt.warmup_from == 0.01
    schedule = call_hook(Schedule, opt)
    eta_min = 0.5 * 0.1 ** 3
    warmup_to = eta_min + (0.5 - eta_min) * (1 + math.cos(math.pi * 10 / 1000)) / 2
    optim = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    for epoch, idx in ((1, 0), (3, 7), (10, 9)):
        schedule.warmup(optim, epoch, idx, 10)
        p = (idx + (epoch - 1) * 10) / (10 * 10)
        assert optim.param_groups[0]['lr'] == 0.01 + p * (warmup_to - 0.01)


def test_warm_start_sets_the_fraction_and_is_checked():
    from config.options import parse_option
    from core.flags import UserError
    opt = parse_option('supcon', ['--learning_rate', '0.5', '--warm', '--warm_start', '0.5', '--epochs', '100'])
    assert opt.warmup_from == pytest.approx(0.25) and opt.run_name.endswith('_warm_start_0.5')
    for argv in (['--warm', '--warm_start', '1.5'], ['--warm_start', '0.1']):
        with pytest.raises(UserError, match='--warm_start'):
            parse_option('supcon', argv)


def test_a_warm_up_as_long_as_the_run_is_one_line():
    """SupContrast's rule (batch above 256: a 10-epoch warm-up) on a short run would ramp through every epoch and end
    below the learning rate: one line naming the cause and the fix, for each script; --warm_epochs 0 turns it off."""
    from config.options import parse_option
    from core.flags import UserError
    from helpers import assert_one_line_error, run_in_process
    # the mechanism: 6 epochs inside a 10-epoch warm-up end below half the rate (what the check prevents)
    schedule = sched(learning_rate=0.1, epochs=6, cosine=True, warm=True)
    optim = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    schedule.adjust(optim, 6)
    schedule.warmup(optim, 6, 9, 10)
    assert optim.param_groups[0]["lr"] < 0.5 * 0.1
    for script in ('supcon', 'ce', 'linear'):
        with pytest.raises(UserError, match=r'--batch_size 512: above 256.*--warm_epochs 10, not shorter than '
                                            r'--epochs 6.*give --warm_epochs below 6 \(0: no warm-up\)'):
            parse_option(script, ['--batch_size', '512', '--epochs', '6', *(['--ckpt', 'x.pth'] if script == 'linear'
                                                                            else [])])
    with pytest.raises(UserError, match='--warm_epochs 10, not shorter than --epochs 10'):
        parse_option('supcon', ['--batch_size', '512', '--epochs', '10'])
    with pytest.raises(UserError, match=r'\(--warm\) lasts --warm_epochs 10.*--epochs 1\b.*leave --warm out'):
        parse_option('supcon', ['--warm', '--epochs', '1'])
    with pytest.raises(UserError, match=r'--epochs 1\b.*give --warm_epochs 0 \(no warm-up\)'):
        parse_option('supcon', ['--batch_size', '512', '--epochs', '1'])
    for argv, message in ((['--warm', '--warm_epochs', '0'], '--warm needs --warm_epochs >= 1'),
                          (['--warm_epochs', '-1'], '--warm_epochs must be >= 0')):
        with pytest.raises(UserError, match=message):
            parse_option('supcon', argv)
    off = parse_option('supcon', ['--batch_size', '512', '--epochs', '6', '--warm_epochs', '0'])
    assert not off.warm and off.run_name.endswith('_warm_epochs_0')
    short = parse_option('supcon', ['--batch_size', '512', '--epochs', '6', '--warm_epochs', '5'])
    assert short.warm and short.run_name.endswith('_warm_warm_epochs_5')
    assert parse_option('supcon', ['--batch_size', '1024']).warm            # SupContrast's 1000 epochs: unchanged
    assert_one_line_error(run_in_process('main_supcon.py', '--batch_size', 512, '--epochs', 3, '--device', 'cpu'),
                          'not shorter than --epochs 3')


@pytest.mark.slow
def test_adamw_warmup_rises_through_the_real_script(tmp_path):
    """The logged learning rates of a warm-up with AdamW at 1e-3 rise to it (they fell from 0.0059 before)."""
    from helpers import FAST, only_run_folder, read_metrics, run_script
    run_script('main_supcon.py', '--optimizer', 'adamw', '--learning_rate', 1e-3, '--warm', '--warm_epochs', 2,
               '--epochs', 3, '--save_folder', tmp_path, *FAST)
    lrs = [float(r['train/lr']) for r in read_metrics(only_run_folder(tmp_path))]
    assert lrs[0] < lrs[1] <= lrs[2] == 1e-3, lrs


@pytest.mark.parametrize('optimizer', ['sgd', 'adamw'])
def test_the_fused_update_is_the_multi_tensor_one_within_a_rounding(optimizer):
    """``fused`` (``--compile``): torch's one-kernel SGD and AdamW, the same updates as the default over three steps,
    to within the rounding of a fused multiply-add per step (float32: a few ulps of the parameters). Power: the flag
    reaches the optimizer."""
    from training.schedule import set_optimizer
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 3, generator=g), torch.randn(64, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in start] for _ in range(3)]
    runs = []
    for fused in (False, True):
        params = [s.clone().requires_grad_(True) for s in start]
        lr = 0.5 if optimizer == 'sgd' else 1e-2
        opt = set_optimizer(params, lr, 0.9, 1e-2, optimizer=optimizer, fused=fused)
        assert bool(opt.param_groups[0]['fused']) == fused
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.clone()
            opt.step()
        runs.append(params)
    for a, b in zip(*runs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)
