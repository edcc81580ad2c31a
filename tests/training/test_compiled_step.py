"""``--compile`` and the training step (training/steps.py, runtime/device.py ``compile_function``): the encoder and the
heads are compiled, and so is the loss step (``Pretraining.loss_from_parts``: the loss, the statistics) of a method
that traces it whole (``Method.compiles``). Here: the graph breaks that ``torch._dynamo.explain`` counts in each
method mode's loss step (0 for those methods; the others may not break more often than recorded, so a change that
adds a break fails); the compiled step equals the eager one (``aot_eager``: bit for bit over three SGD steps;
``inductor``: within a stated tolerance); and the power checks, that a host read in the loss is counted and that the
loss step of those methods is compiled at all."""
import pytest
import torch

import sync_count
from helpers import STEP_BSZ, build_training, method_modes, step_batch
from methods import METHODS
from runtime.device import dynamic_sizes

pytestmark = pytest.mark.slow

# measured with torch 2.14, in the accelerator's forms (the breaks: the host plans built from labels and ids with
# torch.unique and per-class blocks of data-dependent size, in the variants and CARROT; CARROT's torch.autograd.grad).
# RASCAL builds its plan before the loss step (losses.Loss.host_plan): none
BREAKS = {
    'SupCon': 0, 'SupCon + queue + CARROT': 7, 'SupCon --simclr_loss=ntlogistic': 0,
    'SupCon --simclr_loss=margin_triplet': 0,
    'SimCLR': 0, 'SimCLR --simclr_loss=ntlogistic': 0, 'SimCLR --simclr_loss=margin_triplet': 0,
    'RASCAL': 0, 'RASCAL + queue + CARROT': 7, 'RASCAL --rascal_weighting=current': 0,
    'RASCAL --rascal_weighting=uniform': 0,
    'KCL': 10, 'SINCERE': 10, 'EpsSupInfoNCE': 10, 'SupDCL': 0, 'Spread': 10, 'BCL': 0,
    'BCL --bcl_classifier=linear': 0, 'PaCo': 0, 'GPaCo': 0, 'TSC': 10, 'TSC --tsc_assign=step': 14,
}
# every method mode alone; CARROT (and the queue) with SupCon and RASCAL only: CARROT's breaks are its own, the same
# on top of any method (each of them measured 6 to 10 more), and each of those modes costs seconds to explain
MODES = {name: argv for name, argv in method_modes().items()
         if ' + ' not in name or name in ('SupCon + queue + CARROT', 'RASCAL + queue + CARROT')}


def graph_breaks(training):
    """The graph breaks of one ``loss_from_parts`` on a batch of ``STEP_BSZ`` samples, 2 views, 3 classes, in the
    forms an accelerator runs (``sync_count.accelerator_forms``: CARROT's sync-free quantiles and masked positives,
    where the CPU's own forms read the host by design)."""
    torch.manual_seed(1)
    h_enc = torch.randn(2 * STEP_BSZ, training.model.dim, requires_grad=True)
    h_proj = torch.randn(2 * STEP_BSZ, 128, requires_grad=True)
    labels, ids = torch.randint(0, 3, (STEP_BSZ,)), torch.randperm(200)[:STEP_BSZ]

    def count():
        torch._dynamo.reset()
        plan = training.host_plan(labels, ids, 2)           # as the step builds it: outside the compiled call
        dynamic_sizes(plan or ())
        with sync_count.accelerator_forms():
            return torch._dynamo.explain(
                lambda h, p: training.loss_from_parts(h, p, labels, ids, 2, None, plan)[0])(h_enc, h_proj)\
                .graph_break_count
    return in_a_child(count)


def in_a_child(fn):
    """``fn()`` in a forked child, its result sent back. Tracing ``torch.autograd.grad`` (CARROT's) starts autograd's
    worker threads, after which a process forked from this one cannot back-propagate (the distributed step tests in
    this worker fork theirs), so the tracing happens in a child that ends with it."""
    import os
    import pickle
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        torch.set_num_threads(1)        # a thread pool the parent used does not survive the fork
        try:
            out = ('ok', fn())
        except BaseException as e:          # noqa: B036  (any failure goes back to the test)
            out = ('error', f'{type(e).__name__}: {e}')
        with os.fdopen(write, 'wb') as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, 'rb') as f:
        kind, value = pickle.load(f)
    os.waitpid(pid, 0)
    assert kind == 'ok', value
    return value


def compiled_alone(argv):
    """Whether ``--compile`` compiles the loss step of the mode ``argv`` (in one process)."""
    return METHODS[argv[argv.index('--method') + 1]].compiles and '--carrot' not in argv


@pytest.mark.parametrize('mode', list(MODES))
def test_the_loss_step_breaks_no_more_often_than_recorded(mode):
    argv = MODES[mode]
    assert mode in BREAKS, f'{mode}: count its graph breaks (graph_breaks) and record them in BREAKS'
    breaks = graph_breaks(build_training(argv))
    assert breaks <= BREAKS[mode], f'{mode}: {breaks} graph breaks, {BREAKS[mode]} recorded'
    if compiled_alone(argv):        # Method.compiles: by design, none
        assert breaks == 0, f'{mode}: {breaks} graph breaks in a loss step that --compile compiles'


def sgd_steps(argv, steps=3, ce=False):
    """Three SGD steps of ``Pretraining.step`` (``CETraining.step`` with ``ce``: the first view) with BatchNorm in
    train mode on fixed batches; the losses and the parameters after them, and the training."""
    torch._dynamo.reset()
    training = build_training(argv, train=True, ce=ce)
    parameters = list(training.model.parameters() if ce else training.parameters())
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)
    losses = []
    for seed in range(steps):
        views, labels, ids = step_batch(seed)
        optimizer.zero_grad()
        loss, _ = training.step(views[0], labels) if ce else training.step(views, labels, ids)
        optimizer.step()
        losses.append(loss)
    return torch.stack(losses), [p.detach().clone() for p in parameters], training


COMPILED_MODES = {'SupCon': ['--method', 'SupCon'], 'SimCLR + queue': ['--method', 'SimCLR', '--queue_size', '64'],
                  'RASCAL': ['--method', 'RASCAL'], 'RASCAL + queue': ['--method', 'RASCAL', '--queue_size', '64'],
                  'RASCAL current': ['--method', 'RASCAL', '--rascal_weighting', 'current'],
                  'BCL': ['--method', 'BCL'], 'PaCo + queue': ['--method', 'PaCo', '--queue_size', '64'],
                  'CE': [], 'CE logit-adjusted': ['--loss', 'logit_adjusted']}


@pytest.mark.parametrize('mode', list(COMPILED_MODES))
def test_the_compiled_step_equals_the_eager_one_bit_for_bit_with_aot_eager(mode):
    """``aot_eager`` runs the graphs that inductor gets (encoder, head, loss step, and their backward) without
    generating code: the same operators in the same order, so the same bits. Power: the loss step is compiled."""
    ce = mode.startswith('CE')
    eager_losses, eager_params, _ = sgd_steps(COMPILED_MODES[mode], ce=ce)
    losses, params, training = sgd_steps([*COMPILED_MODES[mode], '--compile', '--compile_backend', 'aot_eager'],
                                         ce=ce)
    assert hasattr(training.loss_step, '_torchdynamo_orig_callable'), 'the loss step is not compiled'
    assert torch.equal(losses, eager_losses)
    assert all(torch.equal(a, b) for a, b in zip(params, eager_params))


@pytest.mark.parametrize('queue', [False, True], ids=['RASCAL', 'RASCAL + queue'])
def test_one_compiled_rascal_step_fits_every_batch(queue):
    """RASCAL's plan (class blocks, id table, the queue's columns) changes its sizes from batch to batch; they are
    marked dynamic, so the graphs of the first step take the next batches (other class sizes, repeated ids, the
    queue filling up) without compiling again: the compiler's ``fail_on_recompile`` stance raises otherwise. The
    values equal the eager step's. Power: without the marks the second batch recompiles."""
    import runtime.device
    argv = ['--method', 'RASCAL', *(['--queue_size', '64'] if queue else [])]
    batches = [step_batch(seed) for seed in range(3)]
    views, labels, ids = batches[0]
    batches.append((views, torch.tensor([0] * 14 + [1, 2]), torch.tensor([5] * 2 + list(range(20, 34)))))

    def run(compiled, marks=True):
        torch._dynamo.reset()
        training = build_training([*argv, *(['--compile', '--compile_backend', 'aot_eager'] if compiled else [])])
        losses = []
        try:
            for i, batch in enumerate(batches):
                if i == 1 and compiled:
                    torch.compiler.set_stance('fail_on_recompile')
                losses.append(training.step(*batch, backward=lambda loss: None)[0])
        finally:
            torch.compiler.set_stance('default')
        return torch.stack(losses)
    assert torch.equal(run(compiled=True), run(compiled=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.device.torch._dynamo, 'maybe_mark_dynamic', lambda t, dim: None)
        with pytest.raises(Exception, match='ecompil'):
            run(compiled=True)


def test_carrot_and_the_other_methods_keep_an_eager_loss_step():
    eager = ((['--method', 'SupCon', '--carrot'], False), (['--method', 'KCL'], False), (['--carrot'], True))
    for argv, ce in eager:
        training = build_training([*argv, '--compile', '--compile_backend', 'aot_eager'], ce=ce)
        assert training.loss_step == training.loss_from_parts, argv


@pytest.mark.parametrize('argv', [[], ['--loss', 'logit_adjusted'], ['--supcon_weight', '1'], ['--carrot']],
                         ids=['CE', 'CE logit-adjusted', 'CE + SupCon', 'CE + CARROT'])
def test_the_ce_loss_step_breaks_only_with_carrot(argv):
    from training.steps import device_batch
    training = build_training(argv, ce=True)
    views, labels, _ = step_batch()
    views = views if '--supcon_weight' in argv else views[:1]
    h, out = training.ddp_model(device_batch(training.runtime, views), parts=True)

    def count():
        torch._dynamo.reset()
        with sync_count.accelerator_forms():
            return torch._dynamo.explain(lambda h, out: training.loss_from_parts(h, out, labels, len(views))[0])(
                h, out).graph_break_count
    breaks = in_a_child(count)
    assert breaks <= 6 if '--carrot' in argv else breaks == 0


def c_compiler():
    import shutil
    return shutil.which('g++') or shutil.which('c++') or shutil.which('clang++')


@pytest.mark.skipif(not c_compiler(), reason='inductor compiles C++ on a CPU: no C++ compiler here')
def test_the_inductor_loss_step_is_within_float32_rounding_of_the_eager_one():
    """inductor fuses and reorders the sums: each gradient entry of the loss step is a sum over at most ``N = 2B``
    rows (32 here) of float32 products, and reordering such a sum changes it by at most ``N * eps * sum |terms|``
    (``eps`` = 2^-23); the tolerance is that bound with ``sum |terms|`` at most 1 + max |g| (unit features,
    temperature 0.1: terms of the order of the gradients). The loss value: the same bound on its sums."""
    training = build_training(['--method', 'SupCon'])
    torch.manual_seed(1)
    h_enc = torch.randn(2 * STEP_BSZ, training.model.dim)
    h_proj = torch.randn(2 * STEP_BSZ, 128)
    labels, ids = torch.randint(0, 3, (STEP_BSZ,)), torch.arange(STEP_BSZ)

    def value_and_grad(fn):
        p = h_proj.clone().requires_grad_()
        loss = fn(h_enc, p, labels, ids, 2)[0]
        loss.backward()
        return loss.detach(), p.grad
    torch._dynamo.reset()
    eager = value_and_grad(training.loss_from_parts)
    compiled = value_and_grad(torch.compile(training.loss_from_parts, backend='inductor'))
    eps, n = torch.finfo(torch.float32).eps, 2 * STEP_BSZ
    assert (compiled[0] - eager[0]).abs() <= n * eps * (1 + eager[0].abs())
    bound = n * eps * (1 + eager[1].abs().max())
    assert (compiled[1] - eager[1]).abs().max() <= bound


def test_a_host_read_in_the_loss_is_counted(monkeypatch):
    """The power check: a loss that reads a value on the host (``float(loss)``) breaks the graph."""
    training = build_training(['--method', 'SupCon'])
    assert graph_breaks(training) == 0
    forward = type(training.criterion).forward

    def reads_the_host(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        return loss * (1.0 if float(loss) > -1 else 0.0)
    monkeypatch.setattr(type(training.criterion), 'forward', reads_the_host)
    assert graph_breaks(training) >= 1
