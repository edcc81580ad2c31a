"""training/loop.py: the training loop's fp16 skipped steps and its stops on a non-finite loss, and the evaluation (shot
groups, per-class accuracy, the calibration bins against torchmetrics)."""
import math

import pytest
import torch
import torch.nn.functional as F

from training import loop


def test_evaluate_shot_groups_and_per_class_accuracy():
    from runtime.device import Runtime
    from training.loop import evaluate
    opt = Runtime(torch.device('cpu'))
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2])
    logits = F.one_hot(torch.tensor([0, 1, 1, 1, 0, 2, 2, 0]), 3).float() * 5   # class acc: 50, 100, 50 %
    loader = [(logits[:5], labels[:5]), (logits[5:], labels[5:])]
    out = evaluate(opt, loader, lambda x: x, 'test', 3, class_counts=[500, 50, 5])
    assert out['test/per_class_acc'] == [50.0, 100.0, 50.0]
    assert (out['test/many_acc'], out['test/medium_acc'], out['test/few_acc']) == (50.0, 100.0, 50.0)
    assert out['test/acc'] == 62.5
    assert 'test/few_acc' not in evaluate(opt, loader, lambda x: x, 'test', 3, class_counts=[500, 500, 50])


# ---------------------------------------------------------------- runs that never lose work (through the scripts)
class _Batches(list):
    """A list of batches that ``loop.train_loop`` takes for a loader (it asks for a sampler)."""
    sampler = None


def _loop(scaler, losses_of_steps, max_skipped=None, monkeypatch=None):
    """``loop.train_loop`` over steps whose loss is ``factor * model(x).sum()`` for each factor given."""


    if max_skipped is not None:
        monkeypatch.setattr(loop, "MAX_SKIPPED_STEPS", max_skipped)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    from training.schedule import Schedule
    schedule = Schedule(learning_rate=0.1, epochs=1)
    batches = _Batches([(torch.randn(8, 4), factor) for factor in losses_of_steps])

    def step(batch, backward):
        x, factor = batch
        loss = model(x).sum() * factor
        backward(loss)
        return loss.detach(), x.shape[0], {'stat': loss.detach() * 0 + 1}
    out = loop.train_loop(batches, loop.Optimization(optimizer, scaler, schedule), 1, step, 'test', print_freq=1000)
    return out, model, scaler


def test_fp16_non_finite_step_is_skipped_and_counted():
    """A step whose loss (and so its gradients) is not finite under fp16 is skipped by the GradScaler, counted
    in ``train/amp/skipped``, left out of the means, and the run goes on; the scale backs off."""
    scaler = torch.amp.GradScaler('cpu', enabled=True, init_scale=1024.0)
    out, model, scaler = _loop(scaler, [1.0, float('inf'), 1.0, 1.0])
    assert out['train/amp/skipped'] == 1 and math.isfinite(out['train/loss']) and out['train/stat'] == 1
    assert scaler.get_scale() == 512.0
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_fp16_stops_after_max_skipped_steps_in_a_row(monkeypatch):
    from core.flags import UserError
    scaler = torch.amp.GradScaler('cpu', enabled=True)
    with pytest.raises(UserError, match='3 steps in a row had non-finite gradients'):
        _loop(scaler, [1.0, float('inf'), float('inf'), float('inf'), 1.0], max_skipped=3, monkeypatch=monkeypatch)
    _loop(torch.amp.GradScaler('cpu', enabled=True), [float('inf'), float('inf'), 1.0, float('inf')],
          max_skipped=3, monkeypatch=monkeypatch)                          # not in a row: goes on


def test_non_finite_loss_without_fp16_stops_at_once():
    from core.flags import UserError
    with pytest.raises(UserError, match='the loss became -?inf at epoch 1, iteration 2'):
        _loop(torch.amp.GradScaler('cpu', enabled=False), [1.0, float('inf'), 1.0])


def test_calibration_bins_equal_torchmetrics():
    """``loop.CalibrationBins`` (per-bin sums on the device, read once) gives torchmetrics' ECE, also with
    confidences on bin edges and at 1."""
    from torchmetrics.classification import MulticlassCalibrationError

    from training.loop import CalibrationBins
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(50, 4, generator=g) * 3).softmax(1) for _ in range(3)]
    batches.append(torch.tensor([[1.0, 0, 0, 0], [0.6, 0.4, 0, 0], [0.2, 0.2, 0.2, 0.4]]))
    ours, theirs = CalibrationBins(15, torch.device('cpu')), MulticlassCalibrationError(4, n_bins=15, norm='l1')
    for probs in batches:
        labels = torch.randint(0, 4, (probs.shape[0],), generator=g)
        ours.update(probs, labels)
        theirs.update(probs, labels)
    assert ours.compute() == pytest.approx(float(theirs.compute()), abs=1e-6)


def test_calibration_bins_hold_their_lower_edge():
    """bin b holds confidences in [b/n, (b+1)/n) (a confidence on an edge goes to the bin above it) and a
    confidence of 1 has a bin of its own, as the docstring says."""
    from training.loop import CalibrationBins
    bins = CalibrationBins(4, torch.device('cpu'))
    conf = torch.tensor([0.5, 0.75, 0.7499, 1.0], dtype=torch.float64)
    probs = torch.stack([conf, (1 - conf) / 2, (1 - conf) / 2], 1)
    bins.update(probs, torch.zeros(4, dtype=torch.long))
    assert bins.sums[1].tolist() == pytest.approx([0, 0, 0.5 + 0.7499, 0.75, 1.0])


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                        torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x)


def test_a_compiled_run_keeps_its_first_steps_graphs_and_runs_other_shapes_eagerly(monkeypatch):
    """``--compile``: after the loop's first step, an epoch's last, smaller batch and an eval-mode call run eagerly
    instead of compiling again (on an H100 the recompile of ResNet-50 for CIFAR-10's last batch took over 80 s); the
    full batches keep the compiled graphs. Dynamo's ``eager`` backend stands in for inductor (the same graphs and
    recompiles, no code generation). Power check: without the loop's call, the smaller batch compiles new graphs."""
    from torch._dynamo.utils import counters

    from runtime import device
    from training.schedule import Schedule

    def graphs_of_a_run(keep):
        torch._dynamo.reset()
        counters.clear()
        if not keep:
            monkeypatch.setattr(loop, 'keep_compiled_shapes', lambda: None)
        torch.manual_seed(0)
        model = _Net()      # a module of ours, as the scripts' models: torch 2.11 compiles no torch.nn.Sequential
        device.Compiler(True, 'eager').modules(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = _Batches([(torch.randn(16, 4),), (torch.randn(16, 4),), (torch.randn(12, 4),)])

        def step(batch, backward):
            loss = model(batch[0]).pow(2).mean()
            backward(loss)
            return loss.detach(), batch[0].shape[0], {}
        try:
            scaler = torch.amp.GradScaler('cpu', enabled=False)
            out = loop.train_loop(batches, loop.Optimization(optimizer, scaler, Schedule(learning_rate=0.1, epochs=1)),
                                  1, step, 'test', print_freq=1000)
            model.eval()
            with torch.no_grad():
                model(torch.randn(5, 4))
        finally:
            torch.compiler.set_stance('default')
            device._compiled = False
        assert math.isfinite(out['train/loss'])
        return counters['stats']['unique_graphs']

    assert graphs_of_a_run(keep=True) == 1                     # the first step's graph alone
    assert graphs_of_a_run(keep=False) > 1                     # power: the smaller batch and eval mode recompile


def test_a_long_epoch_says_its_length_after_its_first_steps(capsys, monkeypatch):
    """Without a progress bar, an epoch that the pace of its first steps projects past LONG_EPOCH_S says so after
    PACE_STEPS steps (not only at its end); a short one says nothing."""
    from training import loop
    loop.say_long_epoch(1, 5, 37.5, 469)
    line = capsys.readouterr().out.strip()
    assert line == 'epoch 1: about 58:38 an epoch at this pace (5 steps of 469 in 37.5s)', line
    loop.say_long_epoch(1, 5, 1.0, 469)
    assert capsys.readouterr().out == ''
    monkeypatch.setattr(loop, 'LONG_EPOCH_S', 0.0)
    steps = []

    def step(batch, backward):
        steps.append(1)
        loss = torch.ones((), requires_grad=True) * 2
        backward(loss)
        return loss.detach(), 1, {}
    model = torch.nn.Linear(1, 1)
    from training.schedule import Schedule
    optim = loop.Optimization(torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler('cpu', enabled=False),
                              Schedule(learning_rate=0.1, epochs=1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 1), torch.zeros(8)))
    loop.train_loop(loader, optim, 1, step, 'T', print_freq=1000)
    out = capsys.readouterr().out
    assert 'epoch 1: about' in out and f'({loop.PACE_STEPS} steps of 8 in' in out
