"""A training step never waits for the device: the operations that would make the host wait for a CUDA device,
counted on a CPU (tests/sync_count.py), for every method and mode, in steady state (after the steps that fill
RASCAL's cache and the queue's host copy). The host reads a step's statistics once, in ``loop.train_loop``,
outside the step."""
import numpy as np
import pytest
import torch

import sync_count
from benchmarks import loop_syncs
from helpers import build_training, method_modes, step_batch
from sync_count import READS_BY_DESIGN, SyncCounter

# every method of the registry (alone, with the queue and CARROT where it takes them, each choice of its flags), and
# the modes that are not a method's
MODES = {**method_modes(),
         'SupCon queue no key encoder': ['--queue_size', '64', '--moco_m', '0'],
         'SupCon + CARROT on the head': ['--carrot', '--carrot_on', 'head'],
         'SupCon bf16': ['--amp', 'bf16']}


@pytest.fixture
def accelerator_forms():
    """The forms the code takes on an accelerator where a CPU form differs (``sync_count.accelerator_forms``)."""
    with sync_count.accelerator_forms():
        yield


def steady_state_syncs(training, steps=3, inject=None):
    """The counted operations of the last of ``steps`` steps on one fixed batch (labels and ids: host data)."""
    views, labels, ids = step_batch()
    with SyncCounter() as counter:
        counter.host(labels, ids)
        for i in range(steps):
            if i == steps - 1:
                counter.counts.clear()
                if inject is not None:
                    inject()
            training.model.zero_grad()
            if hasattr(training, 'method'):
                training.step(views, labels, ids)
            else:
                training.step(views[0], labels)
    return dict(counter.counts)




@pytest.mark.parametrize('mode', list(MODES))
def test_pretraining_step_never_waits_for_the_device(mode, accelerator_forms):
    assert steady_state_syncs(build_training(MODES[mode], train=True)) == READS_BY_DESIGN.get(mode, {})


@pytest.mark.parametrize('argv', [[], ['--method', 'RASCAL'], ['--carrot']], ids=['SupCon', 'RASCAL', 'CARROT'])
def test_chunked_step_never_waits_for_the_device(argv, accelerator_forms):
    assert steady_state_syncs(build_training(argv, chunk=6, train=True)) == {}


@pytest.mark.parametrize('argv', [[], ['--carrot'], ['--supcon_weight', '1', '--loss', 'logit_adjusted'],
                                  ['--loss', 'gce'], ['--loss', 'sce', '--carrot']],
                         ids=['CE', 'CE + CARROT', 'CE + SupCon, logit-adjusted', 'GCE', 'SCE + CARROT'])
def test_ce_step_never_waits_for_the_device(argv, accelerator_forms):
    assert steady_state_syncs(build_training(argv, ce=True, train=True)) == {}


def test_power_the_counter_sees_a_read_of_device_data(accelerator_forms, monkeypatch):
    """A deliberate ``.item()`` of a value computed from device data is counted, and so are reading the labels back
    from the device (``.cpu()`` of device data) and a boolean mask on them; the host marking hides none of it."""
    import losses
    training = build_training(['--method', 'RASCAL'], train=True)
    original = losses.SupConLoss.forward

    def read_back(loss, features, labels=None, mask=None, queue=None):
        value = original(loss, features, labels, mask, queue)
        value.item()
        return value
    plain = build_training([], train=True)
    monkeypatch.setattr(losses.SupConLoss, 'forward', read_back)
    assert steady_state_syncs(plain) == {'_local_scalar_dense': 1}
    monkeypatch.undo()

    import losses_rascal
    original_blocks = losses_rascal.class_blocks

    def blocks_from_the_device(labels, device=None):
        on_device = labels.to(torch.device('cpu'))            # what a GPU copy is: device data
        on_device[on_device >= 0]                             # a boolean mask on device data
        return original_blocks(on_device.cpu(), device)       # and read back
    monkeypatch.setattr(losses_rascal, 'class_blocks', blocks_from_the_device)
    counts = steady_state_syncs(training)
    assert counts.get('Tensor.cpu') == 1 and counts.get('index (boolean mask)') == 1, counts


def test_device_loader_batches_never_wait_for_the_device():
    """``--augment device``: a batch's augmentation (the accelerator form: every operation on every row) and its
    indexing need nothing from the device; labels and ids come on the host."""
    import numpy as np

    from data.augment import BatchAugment
    images = torch.randint(0, 256, (12, 3, 16, 16), dtype=torch.uint8)
    augment = BatchAugment(16, (0.5,) * 3, (0.25,) * 3, 'natural', 'contrastive', torch.Generator().manual_seed(0))
    with SyncCounter() as counter:
        params = augment.sample(24, 16, 16, images.device)
        augment._apply(images.repeat(2, 1, 1, 1), params, sync_free=True)
    assert dict(counter.counts) == {}
    assert np.isfinite(augment._apply(images, augment.sample(12, 16, 16, images.device), sync_free=True).numpy()).all()


def test_evaluation_never_waits_for_the_device_per_batch():
    """``loop.evaluate`` accumulates on the device and reads its totals once, after the last batch: the counts
    do not grow with the number of batches."""
    from runtime.device import Runtime
    from training.loop import evaluate
    opt = Runtime(torch.device('cpu'))

    def count(n_batches):
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(8, 5, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(n_batches)]
        with SyncCounter() as counter:
            for _, y in batches:
                counter.host(y)
            out = evaluate(opt, batches, lambda x: x, 'test', 5)
        assert 0 <= out['test/acc'] <= 100
        return dict(counter.counts)
    few = count(2)
    assert count(6) == few and sum(few.values()) <= 4, few


# ---------------------------------------------------------------- whole iterations of the training loop
LOOP_ITERATIONS = 6


@pytest.mark.slow
@pytest.mark.parametrize('mode', list(loop_syncs.MODES))
def test_training_loop_iterations_wait_for_the_device_once(mode, accelerator_forms, tmp_path):
    """Whole iterations of ``loop.train_loop`` in the real scripts (``--augment device``: the loader
    and the batched augmentation; the step; the statistics and the progress line), counted on a CPU, including
    blocking host-to-device copies: after the first two iterations each one waits for the device exactly once,
    in the loop's one read of the previous step's values (``Tensor.tolist``). The harness is the GPU check's
    (``benchmarks/loop_syncs.py``), which counts the same loops under CUDA's sync debug mode."""
    script, argv = loop_syncs.MODES[mode]
    per = loop_syncs.iteration_counts(script, [*loop_syncs.base_flags('cpu'), '--save_folder', str(tmp_path), *argv],
                                      SyncCounter(), LOOP_ITERATIONS)
    assert len(per) == LOOP_ITERATIONS
    assert loop_syncs.steady(per) == [{'Tensor.tolist': 1}] * (LOOP_ITERATIONS - 2), per


def test_power_blocking_copies_and_host_constants_are_counted():
    """A constant made on the host per batch and copied to the device (the pre-issue-41 ``augment.normalize``,
    ``rotate`` and fixed CARROT weight), a blocking ``.to(device)`` of host data and host indices into device data
    are each counted; the non-blocking copy is not."""
    device = torch.device('cpu')
    x = torch.randn(4, 3)
    with SyncCounter() as counter:
        host = torch.as_tensor([0.5, 0.25, 0.125], dtype=torch.float64)
        x * host.to(torch.float32).to(device)
        x * torch.tensor([2.0, 3.0, 4.0], device=x.device)
        torch.as_tensor(0.5, device=x.device)
        idx = torch.as_tensor([0, 2])
        x[idx]
        x * host.to(device, non_blocking=True)
    assert dict(counter.counts) == {'Tensor.to(device) (blocking copy)': 1,
                                    'torch.tensor(device=...) (blocking copy)': 1,
                                    'torch.as_tensor(device=...) (blocking copy)': 1,
                                    'index (host indices into device data)': 1}


def test_power_host_values_assigned_into_device_data_are_counted():
    """``dev[idx] = True`` (a Python number: on CUDA a host scalar tensor that ``index_put_`` copies to the device)
    and ``dev[idx] = host_tensor`` wait for the device; a fill of a slice, ``index_fill_`` with a number, an
    assignment of device data and any assignment into host data do not (the H100 report of 2026-11-26 found the
    first form in RASCAL's cache and the queue, which this counter did not see)."""
    device_flags, device_rows = torch.zeros(8, dtype=torch.bool), torch.zeros(8, 3)     # made before: device data
    device_values = torch.ones(2, 3)
    with SyncCounter() as counter:
        idx = torch.tensor([1, 4]).to(torch.device('cpu'), non_blocking=True)          # indices on the device
        device_flags[idx] = True                                                   # counted
        device_rows[idx] = torch.ones(2, 3)                                        # a host tensor: counted
        device_flags[2:4] = True                                                   # a fill: not counted
        device_flags.index_fill_(0, idx, True)                                     # not counted
        device_rows[idx] = device_values                                           # device data: not counted
        host_flags = torch.zeros(8, dtype=torch.bool)
        host_flags[torch.tensor([1, 4])] = True                                    # host into host: not counted
    assert dict(counter.counts) == {'index_put_ (host value into device data)': 2}
    assert device_flags.tolist() == [False, True, True, True, True, False, False, False]


def test_power_a_blocking_copy_of_host_data_into_device_data_is_counted():
    """``dev.copy_(host)`` waits for the device (the H100 check of 2026-11-27 saw TSC's per-step assignment, a NumPy
    array made a tensor, copied so); with ``non_blocking=True`` (from pinned memory on CUDA) it does not, nor does a
    copy of device data or one into host data."""
    device_rows, device_values = torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64)
    with SyncCounter() as counter:
        chosen = torch.from_numpy(np.arange(4))                              # host data
        device_rows.copy_(chosen)                                            # counted
        device_rows.copy_(torch.tensor([3, 2, 1, 0]))                        # counted
        device_rows.copy_(chosen, non_blocking=True)                         # not counted
        device_rows.copy_(device_values)                                     # device data: not counted
        torch.zeros(4, dtype=torch.int64).copy_(chosen)                      # into host data: not counted
    assert dict(counter.counts) == {'copy_ (host data into device data, blocking)': 2}
