"""``--compile`` and the training step (training/steps.py, runtime/device.py ``Compiler``): the encoder and the
heads are compiled, and so is the loss step (``Pretraining.loss_from_parts``: the loss, the statistics) of a method
that traces it whole (``Method.compiles``). Here: the graph breaks that ``torch._dynamo.explain`` counts in each
method mode's loss step (0 for those methods; the others may not break more often than recorded, so a change that
adds a break fails); the compiled step equals the eager one (``aot_eager``: bit for bit over three SGD steps;
``inductor``: within a stated tolerance); and the power checks, that a host read in the loss is counted and that the
loss step of those methods is compiled at all."""
import pytest
import torch

import sync_count
from data.views import PendingViews
from helpers import STEP_BSZ, build_training, method_modes, step_batch
from methods import METHODS
from runtime.device import dynamic_sizes, traces_grad

pytestmark = pytest.mark.slow

# measured with torch 2.14, in the accelerator's forms (the breaks: the host plans built from labels and ids with
# torch.unique and per-class blocks of data-dependent size, in the variants and CARROT; CARROT's torch.autograd.grad).
# RASCAL builds its plan before the loss step (losses.Loss.host_plan): none
BREAKS = {
    'SupCon': 0, 'SupCon + queue + CARROT': 0, 'SupCon --simclr_loss=ntlogistic': 0,
    'SupCon --simclr_loss=margin_triplet': 0,
    'SimCLR': 0, 'SimCLR --simclr_loss=ntlogistic': 0, 'SimCLR --simclr_loss=margin_triplet': 0,
    'RASCAL': 0, 'RASCAL + queue + CARROT': 0, 'RASCAL --rascal_weighting=current': 0,
    'RASCAL --rascal_weighting=uniform': 0,
    'KCL': 0, 'SINCERE': 0, 'EpsSupInfoNCE': 0, 'SupDCL': 0, 'Spread': 0, 'BCL': 0,
    'BCL --bcl_classifier=linear': 0, 'PaCo': 0, 'GPaCo': 0, 'TSC': 0, 'TSC --tsc_assign=step': 6,
    'SymNCE': 0, 'RINCE': 0, 'SelCL': 0,
}
# modes of a compiled method that read the host by design: TSC's authors' schedule matches the targets to the
# centroids on the host after every step
BY_DESIGN = {'TSC --tsc_assign=step'}
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
        dynamic_sizes(plan)
        # as --compile traces it: CARROT's torch.autograd.grad into the graph where the compiler can
        with sync_count.accelerator_forms(), torch._dynamo.config.patch(trace_autograd_ops=traces_grad()):
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
        sent = f.read()
    _, status = os.waitpid(pid, 0)
    assert sent, f'the child ended without a result (wait status {status})'
    kind, value = pickle.loads(sent)
    assert kind == 'ok', value
    return value


def compiled_alone(argv):
    """Whether ``--compile`` compiles the loss step of the mode ``argv`` (in one process; with CARROT where the
    compiler traces ``torch.autograd.grad``)."""
    return METHODS[argv[argv.index('--method') + 1]].compiles and ('--carrot' not in argv or traces_grad())


@pytest.mark.parametrize('mode', list(MODES))
def test_the_loss_step_breaks_no_more_often_than_recorded(mode):
    argv = MODES[mode]
    assert mode in BREAKS, f'{mode}: count its graph breaks (graph_breaks) and record them in BREAKS'
    breaks = graph_breaks(build_training(argv))
    assert breaks <= BREAKS[mode], f'{mode}: {breaks} graph breaks, {BREAKS[mode]} recorded'
    if compiled_alone(argv) and mode not in BY_DESIGN:        # Method.compiles: by design, none
        assert breaks == 0, f'{mode}: {breaks} graph breaks in a loss step that --compile compiles'


def pending_batch(seed, n_views=2):
    """``step_batch(seed)``'s labels and ids with views still to be augmented (:class:`PendingViews`, as the device
    loader yields them under ``--compile``): ``STEP_BSZ`` uint8 images of 20 px, SupContrast's contrastive pipeline to
    16 px, its parameters drawn from a generator seeded by ``seed``."""
    from data.augment import BatchAugment
    _, labels, ids = step_batch(seed)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (STEP_BSZ, 3, 20, 20), generator=g, dtype=torch.uint8).repeat(n_views, 1, 1, 1)
    augment = BatchAugment(16, (0.5,) * 3, (0.25,) * 3, 'natural', 'contrastive', g)
    params = augment.sample(images.shape[0], 20, 20, images.device)
    return PendingViews(images, params, augment.apply_in_graph, n_views), labels, ids


def sgd_steps(argv, steps=3, ce=False, pending=False):
    """Three SGD steps of ``Pretraining.step`` (``CETraining.step`` with ``ce``: the first view) with BatchNorm in
    train mode on fixed batches (``pending``: :func:`pending_batch`'s); the losses and the parameters after them, and
    the training."""
    torch._dynamo.reset()
    training = build_training(argv, train=True, ce=ce)
    parameters = list(training.model.parameters() if ce else training.parameters())
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)
    losses = []
    for seed in range(steps):
        views, labels, ids = pending_batch(seed, 1 if ce else 2) if pending else step_batch(seed)
        optimizer.zero_grad()
        if ce:
            loss, _ = training.step(views if pending else views[0], labels)
        else:
            loss, _ = training.step(views, labels, ids)
        optimizer.step()
        losses.append(loss)
    return torch.stack(losses), [p.detach().clone() for p in parameters], training


COMPILED_MODES = {'SupCon': ['--method', 'SupCon'], 'SimCLR + queue': ['--method', 'SimCLR', '--queue_size', '64'],
                  'RASCAL': ['--method', 'RASCAL'], 'RASCAL + queue': ['--method', 'RASCAL', '--queue_size', '64'],
                  'BCL': ['--method', 'BCL'], 'PaCo + queue': ['--method', 'PaCo', '--queue_size', '64'],
                  'CE': [], 'CE logit-adjusted': ['--loss', 'logit_adjusted'],
                  'KCL': ['--method', 'KCL'], 'SINCERE + queue': ['--method', 'SINCERE', '--queue_size', '64'],
                  'Spread': ['--method', 'Spread'], 'TSC': ['--method', 'TSC'],
                  'TSC --tsc_assign step': ['--method', 'TSC', '--tsc_assign', 'step'],
                  'SupCon + CARROT': ['--carrot'],
                  'RASCAL + queue + CARROT': ['--method', 'RASCAL', '--queue_size', '64', '--carrot'],
                  'CE + CARROT': ['--carrot']}


@pytest.mark.parametrize('mode', list(COMPILED_MODES))
def test_the_compiled_step_equals_the_eager_one_bit_for_bit_with_aot_eager(mode):
    """``aot_eager`` runs the graphs that inductor gets (augmentation, encoder, head, loss, and their backward)
    without generating code: the same operators in the same order, so the same bits. Half the modes take their views
    to be augmented in the step (:class:`PendingViews`). Power: the forward and loss are compiled."""
    ce = mode.startswith('CE')
    if 'CARROT' in mode and not traces_grad():
        pytest.skip('this torch does not trace torch.autograd.grad: CARROT keeps an eager loss step')
    pending = list(COMPILED_MODES).index(mode) % 2 == 0

    def compare():
        eager_losses, eager_params, _ = sgd_steps(COMPILED_MODES[mode], ce=ce, pending=pending)
        losses, params, training = sgd_steps([*COMPILED_MODES[mode], '--compile', '--compile_backend', 'aot_eager'],
                                             ce=ce, pending=pending)
        assert hasattr(training.forward_loss.compiled, '_torchdynamo_orig_callable'), 'the forward is not compiled'
        assert torch.equal(losses, eager_losses), 'the losses differ'
        assert all(torch.equal(a, b) for a, b in zip(params, eager_params)), 'the parameters differ'
    in_a_child(compare) if 'CARROT' in mode else compare()       # CARROT traces torch.autograd.grad: see in_a_child


@pytest.mark.parametrize('mode', ['SupCon', 'RASCAL + queue', 'PaCo + queue', 'CE'])
def test_the_forward_and_the_loss_are_one_graph(mode):
    """Under ``--compile`` the plain step's forward (the device augmentation of the uint8 images, the views made one
    batch, the compiled encoder and head, the loss and its statistics, ``_forward_loss``) traces as one graph without
    a break, the loss's host plan given to it. Power: a host read in the loss splits it."""
    ce = mode == 'CE'
    training = build_training([*COMPILED_MODES[mode], '--compile', '--compile_backend', 'aot_eager'], train=True,
                              ce=ce)
    views, labels, ids = pending_batch(0, 1 if ce else 2)

    def explain():
        torch._dynamo.reset()
        if ce:
            return torch._dynamo.explain(training._forward_loss)(views, labels, None)
        plan = training.host_plan(labels, ids, 2)
        dynamic_sizes(plan or ())
        return torch._dynamo.explain(training._forward_loss)(views, labels, ids, plan, None)
    out = explain()
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    if not ce:
        forward = type(training.criterion).forward

        def reads_the_host(self, features, *args, **kwargs):
            return forward(self, features, *args, **kwargs) * (1.0 if float(features.detach().sum()) > -1e9 else 0.0)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(type(training.criterion), 'forward', reads_the_host)
            assert explain().graph_break_count >= 1


def test_one_compiled_rascal_step_fits_every_batch():
    """RASCAL's plan (class blocks, id table, the queue's columns) changes its sizes from batch to batch; they are
    marked dynamic, so the graphs of the first step take the next batches (other class sizes, repeated ids, the
    queue filling up) without compiling again: the compiler's ``fail_on_recompile`` stance raises otherwise. The
    values equal the eager step's. Power: without the marks the second batch recompiles."""
    import runtime.device
    argv = ['--method', 'RASCAL', '--queue_size', '64']
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


def without_compiles(monkeypatch, name='KCL'):
    """The registry's ``name`` as a method whose loss does not trace whole (``Method.compiles`` false)."""
    import dataclasses

    import methods
    monkeypatch.setitem(methods.METHODS, name, dataclasses.replace(methods.METHODS[name], compiles=False))


def test_carrot_and_a_method_with_breaks_keep_an_eager_loss_step(monkeypatch):
    """A method whose loss breaks (``Method.compiles`` false) compiles the augmentation and the model as one graph
    (``forward_parts``) and runs the loss eagerly; with CARROT, where the compiler does not trace
    ``torch.autograd.grad`` (torch before 2.11), the modules stay compiled apart (its balance takes the gradient of the
    loss with respect to the encoder's output, which must then be a graph's input, not an inner value) and the loss
    step eager."""
    import runtime.device
    import training.carrot
    without_compiles(monkeypatch)
    monkeypatch.setattr(training.carrot, 'traces_grad', lambda: False)
    assert runtime.device.traces_grad() == hasattr(torch._dynamo.config, 'trace_autograd_ops')
    eager = ((['--method', 'SupCon', '--carrot'], False), (['--method', 'KCL'], False), (['--carrot'], True))
    for argv, ce in eager:
        training = build_training([*argv, '--compile', '--compile_backend', 'aot_eager'], ce=ce)
        assert training.loss_step == training.loss_from_parts, argv
        assert training.forward_loss == training._forward_loss, argv
        if not ce:
            parts_compiled = training.forward_parts != training._forward_parts
            assert parts_compiled == ('--carrot' not in argv), argv


def test_a_method_with_breaks_compiles_its_augmentation_and_model_bit_for_bit(monkeypatch):
    """``forward_parts`` under aot_eager: three SGD steps with the augmentation in the graph, bit-equal to eager."""
    without_compiles(monkeypatch, 'SINCERE')
    argv = ['--method', 'SINCERE', '--queue_size', '64']
    eager_losses, eager_params, _ = sgd_steps(argv, pending=True)
    losses, params, training = sgd_steps([*argv, '--compile', '--compile_backend', 'aot_eager'], pending=True)
    assert hasattr(training.forward_parts.compiled, '_torchdynamo_orig_callable')
    assert torch.equal(losses, eager_losses)
    assert all(torch.equal(a, b) for a, b in zip(params, eager_params))


@pytest.mark.parametrize('argv', [[], ['--loss', 'logit_adjusted'], ['--supcon_weight', '1'], ['--carrot']],
                         ids=['CE', 'CE logit-adjusted', 'CE + SupCon', 'CE + CARROT'])
def test_the_ce_loss_step_breaks_only_with_carrot(argv):
    """CE's loss step has no break, with CARROT too where the compiler traces ``torch.autograd.grad`` (its host plan
    given as the step gives it); elsewhere CARROT's two gradients break it."""
    from training.steps import device_batch
    training = build_training(argv, ce=True)
    views, labels, _ = step_batch()
    views = views if '--supcon_weight' in argv else views[:1]
    h, out = training.ddp_model(device_batch(training.runtime, views), parts=True)
    leaf = lambda t: t.detach().requires_grad_()                                 # noqa: E731
    h, out = leaf(h), tuple(map(leaf, out)) if isinstance(out, tuple) else leaf(out)
    rows = labels.repeat(len(views))
    plan = training.carrot.host_plan(rows, 'cpu') if training.carrot is not None else None

    def count():
        torch._dynamo.reset()
        with sync_count.accelerator_forms(), torch._dynamo.config.patch(trace_autograd_ops=traces_grad()):
            return torch._dynamo.explain(lambda h, out: training.loss_from_parts(h, out, labels, len(views), None,
                                                                                 plan)[0])(h, out).graph_break_count
    breaks = in_a_child(count)
    assert breaks == 0 if traces_grad() or '--carrot' not in argv else breaks <= 6


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


RANDOM_OPS = ('rand', 'randn', 'randint', 'randperm', 'rand_like', 'randn_like', 'randint_like', 'bernoulli',
              'dropout', 'normal', 'uniform', 'multinomial', 'exponential', 'geometric', 'cauchy', 'log_normal')


def recorded_graphs(training, views, labels, ids, ce=False):
    """The graphs ``torch.compile`` makes of the step's forward and loss (``_forward_loss``) on one batch, and their
    example inputs, recorded by a backend that keeps them."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward
    torch._dynamo.reset()
    if ce:
        torch.compile(training._forward_loss, backend=record)(views, labels, None)
    else:
        plan = training.host_plan(labels, ids, views.n_views)
        dynamic_sizes(plan or ())
        torch.compile(training._forward_loss, backend=record)(views, labels, ids, plan, None)
    return graphs


def random_ops(gm):
    return [n for n in gm.graph.nodes if n.op in ('call_function', 'call_method')
            and getattr(n.target, '__name__', str(n.target)).strip('_') in RANDOM_OPS]


def dynamic_inputs(example_inputs):
    return [x for x in example_inputs if isinstance(x, torch.SymInt)
            or isinstance(x, torch.Tensor) and not all(isinstance(s, int) for s in x.shape)]


@pytest.mark.parametrize('mode', ['SupCon', 'SimCLR + queue', 'CE'])
def test_the_compiled_step_of_fixed_shapes_is_capturable(mode):
    """What CUDA graphs (``--compile_mode reduce-overhead``) need of the compiled step, shown on the CPU: its
    augmentation, forward and loss are one graph (a host read would be a break), its inputs have fixed shapes, and it
    draws no random number (the augmentation's parameters come drawn by the loader, from its generator, before the
    graph). Power: a dropout layer puts a random op in the graph; RASCAL's plan has sizes that change from batch to
    batch (marked dynamic: CUDA graphs would record one graph per size)."""
    ce = mode == 'CE'
    argv = [*COMPILED_MODES[mode], '--compile', '--compile_backend', 'aot_eager']
    views, labels, ids = pending_batch(0, 1 if ce else 2)
    graphs = recorded_graphs(build_training(argv, train=True, ce=ce), views, labels, ids, ce)
    assert len(graphs) == 1
    gm, inputs = graphs[0]
    assert not random_ops(gm) and not dynamic_inputs(inputs)
    if not ce:
        with_dropout = recorded_graphs(build_training(argv, train=True, dropout=True), views, labels, ids)
        assert random_ops(with_dropout[0][0])
        rascal = recorded_graphs(build_training(['--method', 'RASCAL', '--compile', '--compile_backend', 'aot_eager'],
                                                train=True), views, labels, ids)
        assert len(rascal) == 1 and dynamic_inputs(rascal[0][1])


def test_only_a_compiled_forward_takes_the_augmentation(monkeypatch):
    """The loader hands its augmentation over (``pending``) only to a step whose forward is compiled: without
    ``--compile`` the views come augmented as before (on a CPU the CPU's own form of the augmentation). Power: a
    loader without ``pending`` is left alone."""
    from data.views import pend_augmentation
    without_compiles(monkeypatch)
    cases = {(): (False, False), ('--compile',): (True, False), ('--compile', '--method', 'KCL'): (False, True),
             ('--compile', '--carrot'): (traces_grad(), False), ('--compile', '--chunk_size', '4'): (False, False)}
    for argv, want in cases.items():
        chunk = int(argv[-1]) if '--chunk_size' in argv else 0
        argv = [a for a in argv if a not in ('--chunk_size', '4')]
        training = build_training([*argv, '--compile_backend', 'aot_eager'] if argv else [], chunk=chunk)
        assert (training.loss_in_graph, training.parts_in_graph) == want, argv
        loader = EmptyLoader()
        training.train_epoch(loader, optim_of(training), 1)
        assert loader.pending == any(want), argv
    plain = object()
    pend_augmentation(plain, True)
    assert not hasattr(plain, 'pending')


class EmptyLoader(list):
    """A loader of no batches that can take its augmentation's hand-over (as ``data.augment.DeviceLoader``)."""
    sampler, pending = None, None


def optim_of(training):
    from training.loop import Optimization
    from training.schedule import Schedule
    return Optimization(torch.optim.SGD(training.parameters(), lr=0.1), torch.amp.GradScaler('cpu', enabled=False),
                        Schedule(learning_rate=0.1, epochs=1))


@pytest.mark.skipif(not traces_grad(), reason='this torch does not trace torch.autograd.grad')
def test_carrot_in_the_graph_under_a_loss_scale_equals_the_eager_step():
    """``--amp fp16``: CARROT's balance takes its gradients of the scaled terms (the ``GradScaler``'s scale enters the
    graph as a tensor); two steps through a real scaled backward and ``GradScaler.step`` end bit-equal to eager."""
    from training.loop import ScaledBackward

    def run(argv):
        torch._dynamo.reset()
        training = build_training(argv, train=True)
        params = list(training.parameters())
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
        losses = []
        for seed in range(2):
            views, labels, ids = step_batch(seed)
            optimizer.zero_grad()
            losses.append(training.step(views, labels, ids, backward=ScaledBackward(scaler))[0])
            scaler.step(optimizer)
            scaler.update()
        return torch.stack(losses), params

    def compare():
        eager_losses, eager_params = run(['--carrot', '--amp', 'fp16'])
        losses, params = run(['--carrot', '--amp', 'fp16', '--compile', '--compile_backend', 'aot_eager'])
        assert torch.equal(losses, eager_losses), 'the losses differ'
        assert all(torch.equal(a, b) for a, b in zip(params, eager_params)), 'the parameters differ'
    in_a_child(compare)          # the traced torch.autograd.grad: see in_a_child
