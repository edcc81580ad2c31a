"""Distributed training on CPU (gloo, 2 processes): one step equals one process on the concatenated
batch, RASCAL caches stay identical, and torchrun runs the real scripts end to end."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.run
import torch.multiprocessing as mp

from helpers import (
    ROOT,
    STEP_BSZ,
    build_training,
    free_port,
    load,
    method_modes,
    only_run_folder,
    read_metrics,
    run_script,
    scaled,
    script_env,
    step_batch,
    take_steps,
)

WORLD = 2
BSZ = STEP_BSZ       # global batch: 8 per process
# every method of the registry (helpers.method_modes: alone, with a queue and CARROT where it takes them, each choice
# of its flags), the cross-entropy family, and settings of a method's own flags
CASES = {**method_modes(queue=('--queue_size', '64', '--moco_m', '0.9')),
         'SimCLR-queue-m0': ['--method', 'SimCLR', '--queue_size', '64', '--moco_m', '0'],
         'RASCAL+CARROT-head': ['--method', 'RASCAL', '--carrot', '--carrot_on', 'head'],
         'CE+CARROT': ['--carrot'],
         'CE+SupCon': ['--supcon_weight', '0.5', '--loss', 'balanced_softmax'],
         'KCL k 2': ['--method', 'KCL', '--kcl_k', '2'],
         # RINCE's terms are exp(q s_ij) with s up to 1 / tau: at the default 0.07, e^7 (a loss of -1000, gradients of
         # 80), whose float32 sums in another order differ beyond the tolerance; at 0.5 they are of SupCon's size
         'RINCE': ['--method', 'RINCE', '--temp', '0.5'],
         'RINCE + queue + CARROT': ['--method', 'RINCE', '--temp', '0.5', '--queue_size', '64', '--moco_m', '0.9',
                                    '--carrot'],
         'PaCo alpha 0.3': ['--method', 'PaCo', '--paco_alpha', '0.3']}


CHUNK_CASES = ['SupCon', 'RASCAL+CARROT-head', 'CE+CARROT']


def one_step(case, rank=0, world=1, train=False, chunk=0):
    """The scripts' own steps (``tests/helpers.build_training``) on this process's slice of the global batch:
    RASCAL runs a first step to warm its cache, then the step that is compared. ``train``: BatchNorm in train
    mode; ``chunk``: gradient caching with chunks of that many samples. Returns loss, gradients and state."""
    training = build_training(CASES[case], ce=case.startswith('CE'), chunk=chunk, train=train)
    part = slice(rank * BSZ // world, (rank + 1) * BSZ // world)
    views, labels, ids = step_batch()
    views, labels, ids = [v[part] for v in views], labels[part], ids[part]
    queue = getattr(training, 'queue', None)
    if queue is not None:     # a partly filled queue (the same on every process), key-encoder BN in eval mode
        g = torch.Generator().manual_seed(5)
        queue.enqueue(torch.randn(40, 128, generator=g), torch.randint(0, 3, (40,), generator=g),
                      torch.randint(0, 200, (40,), generator=g))
    loss, stats, grads = take_steps(training, views, labels, ids)
    out = {}
    if queue is not None:
        out['queue'] = {k: v.clone() for k, v in queue.state_dict().items()}
    if not case.startswith('CE') and training.method.uses_ids:      # the loss's state: RASCAL's cache, Sel-CL's bank
        state = training.criterion.state_dict()
        if 'cache_feat' in state:
            out['cache'], out['cache_valid'] = state['cache_feat'].clone(), state['cache_valid'].clone()
        if 'bank' in state:
            out['bank'], out['bank_label'] = state['bank'].clone(), state['bank_label'].clone()
    out.update(loss=loss.detach(), stats={k: torch.as_tensor(v).detach() for k, v in stats.items()}, grads=grads)
    return out


def _worker(rank, port, folder):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), WORLD_SIZE=str(WORLD),
                      RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS='1')
    torch.set_num_threads(1)
    import torch.distributed as dist
    results = {}
    for case in CASES:
        results[case] = one_step(case, rank, WORLD)
    for case in CHUNK_CASES:     # DDP in train mode (BatchNorm per process), and chunks of the local batch
        results[f'train-{case}'] = one_step(case, rank, WORLD, train=True)
        results[f'chunked-{case}'] = one_step(case, rank, WORLD, chunk=3)
    torch.save(results, os.path.join(folder, f'rank{rank}.pt'))
    dist.destroy_process_group()


def two_processes(fn, *args):
    """``fn(rank, *args)`` in two processes forked from this one (its imports theirs: no interpreter start and torch
    import each, as ``mp.spawn`` would pay), waited for."""
    mp.start_processes(fn, args=args, nprocs=WORLD, join=True, start_method='fork')


# Once per session (a module's fixture was set up again after pytest-xdist's teardown between its tests), and the
# tests that read it share one xdist group: one pytest-xdist worker runs the two processes' steps, once.
@pytest.fixture(scope='session')
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp('ddp')
    two_processes(_worker, free_port(), str(folder))
    return [torch.load(folder / f'rank{r}.pt', weights_only=True) for r in range(WORLD)]


@pytest.mark.xdist_group('ddp_steps')
@pytest.mark.parametrize('case', sorted(CASES))
def test_step_equals_one_process_on_the_concatenated_batch(ranks, case):
    single = one_step(case)
    # CE is each process's own batch mean (what is logged is the mean over processes)
    mean_loss = sum(ranks[r][case]['loss'] for r in range(WORLD)) / WORLD
    torch.testing.assert_close(mean_loss, single['loss'], rtol=1e-5, atol=1e-6)
    for r in range(WORLD):
        got = ranks[r][case]
        if not case.startswith('CE'):   # the contrastive losses: the global loss on every process
            torch.testing.assert_close(got['loss'], single['loss'], rtol=1e-5, atol=1e-6)
        assert got['grads'].keys() == single['grads'].keys()
        for name, grad in single['grads'].items():
            # DDP leaves the same averaged gradient on every process
            torch.testing.assert_close(got['grads'][name], grad, rtol=1e-5, atol=1e-6, msg=f'{case} {name}')
        if 'carrot/alpha' in single['stats']:
            assert single['stats']['carrot/alpha'] > 0
            torch.testing.assert_close(got['stats']['carrot/alpha'], single['stats']['carrot/alpha'],
                                       rtol=1e-5, atol=1e-7)
        if not case.startswith('CE'):   # statistics of the global batch (CE's are per process)
            for key, value in single['stats'].items():
                torch.testing.assert_close(got['stats'][key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.xdist_group('ddp_steps')
@pytest.mark.parametrize('case', CHUNK_CASES)
def test_chunks_of_half_the_batch_equal_two_processes_in_train_mode(ranks, case):
    """--chunk_size b/2 in one process normalizes each half of the batch by its own BatchNorm statistics,
    as two processes with b/2 each do: the gradients are equal (this pins down "BN per chunk")."""
    single = one_step(case, train=True, chunk=BSZ // 2)
    plain = one_step(case, train=True)
    for r in range(WORLD):
        for name, grad in single['grads'].items():
            torch.testing.assert_close(ranks[r][f'train-{case}']['grads'][name], grad, rtol=1e-5, atol=1e-6,
                                       msg=f'{case} {name}')
    # power: one process without chunks (BatchNorm over the whole batch) differs
    assert any(not torch.allclose(plain['grads'][n], g, rtol=1e-5, atol=1e-6) for n, g in single['grads'].items())


@pytest.mark.xdist_group('ddp_steps')
@pytest.mark.parametrize('case', CHUNK_CASES)
def test_chunks_under_torchrun_equal_one_process(ranks, case):
    """Gradient caching inside each process (chunks of 3 of the local 8 samples), BatchNorm in eval mode:
    the gradients equal one process's plain step on the whole batch."""
    single = one_step(case)
    for r in range(WORLD):
        for name, grad in single['grads'].items():
            torch.testing.assert_close(ranks[r][f'chunked-{case}']['grads'][name], grad, rtol=1e-5, atol=1e-6,
                                       msg=f'{case} {name}')


@pytest.mark.xdist_group('ddp_steps')
@pytest.mark.parametrize('case', [c for c in CASES if 'queue' in c])
def test_queues_identical_on_every_rank(ranks, case):
    """After the step(s) every process holds the same queue as one process on the concatenated batch."""
    single = one_step(case)
    for r in range(WORLD):
        for key, value in single['queue'].items():
            torch.testing.assert_close(ranks[r][case]['queue'][key], value, rtol=1e-5, atol=1e-6, msg=key)
    warm = case.startswith(('RASCAL', 'SelCL'))                 # a method with ids takes a first step (take_steps)
    assert int(single['queue']['ptr']) == (40 + BSZ * (2 if warm else 1)) % 64   # wraps


@pytest.mark.xdist_group('ddp_steps')
def test_rascal_caches_identical_on_every_rank(ranks):
    single = one_step('RASCAL')
    assert single['stats']['rascal/cache_hit_rate'] == 1.0     # the compared step had a warm cache
    for r in range(WORLD):
        assert torch.equal(ranks[r]['RASCAL']['cache_valid'], single['cache_valid'])
        torch.testing.assert_close(ranks[r]['RASCAL']['cache'], single['cache'], rtol=1e-5, atol=1e-6)
    assert torch.equal(ranks[0]['RASCAL']['cache'], ranks[1]['RASCAL']['cache'])


@pytest.mark.xdist_group('ddp_steps')
def test_selcl_banks_identical_on_every_rank(ranks):
    """Sel-CL's feature bank holds the global batch's samples on every process, as one process would."""
    single = one_step('SelCL')
    assert int((single['bank_label'] >= 0).sum()) == BSZ
    for r in range(WORLD):
        assert torch.equal(ranks[r]['SelCL']['bank_label'], single['bank_label'])
        torch.testing.assert_close(ranks[r]['SelCL']['bank'], single['bank'], rtol=1e-5, atol=1e-6)
    assert torch.equal(ranks[0]['SelCL']['bank'], ranks[1]['SelCL']['bank'])


# the modes whose processes trained different models before 6d42068: the bare model of --chunk_size, the loss's
# own parameters (BCL's classifier and prototype head, PaCo's classifier), the key encoder (copied from the model)
SEEDED_CASES = {
    'SupCon chunked': (['--method', 'SupCon'], False, 4),
    'BCL': (['--method', 'BCL'], False, 0),
    'BCL chunked': (['--method', 'BCL', '--carrot'], False, 4),
    'PaCo queue': (['--method', 'PaCo', '--queue_size', '64', '--moco_m', '0.9'], False, 0),
    'PaCo queue chunked': (['--method', 'PaCo', '--queue_size', '64', '--moco_m', '0.9'], False, 4),
    'CE chunked': (['--carrot'], True, 4),
}
BN_STATISTICS = ('running_mean', 'running_var', 'num_batches_tracked')


def trained_states(case, rank, steps=3):
    """``steps`` SGD steps of ``case`` on this process's part of the global batch, the model built from this
    process's own seed (``--seed + rank``) as the scripts build it; returns every state the processes must share:
    the model's parameters, the key encoder's, the loss's parameters and buffers, the queue. BatchNorm's running
    statistics are left out: each process updates them from its own part of the batch in the forward, and DDP (or
    the chunked step) gives every process rank 0's before the next."""
    from training.schedule import set_optimizer
    argv, ce, chunk = SEEDED_CASES[case]
    training = build_training(argv, ce=ce, chunk=chunk, train=True, same_init=False)
    params = list(training.model.parameters()) + list(getattr(training, 'criterion', None) and
                                                      training.criterion.parameters() or [])
    optimizer = set_optimizer(params, 0.5, 0.9, 1e-4)
    for step in range(steps):
        views, labels, ids = step_batch(seed=step)
        part = slice(rank * BSZ // WORLD, (rank + 1) * BSZ // WORLD) if world_size() > 1 else slice(None)
        views, labels, ids = [v[part] for v in views], labels[part], ids[part]
        optimizer.zero_grad(set_to_none=True)
        if ce:
            training.step(views[0], labels)
        else:
            training.step(views, labels, ids)
        optimizer.step()
    parts = {'model': training.model, 'key_encoder': getattr(training, 'key_encoder', None),
             'criterion': getattr(training, 'criterion', None), 'queue': getattr(training, 'queue', None)}
    return {f'{name}.{key}': value.clone() for name, module in parts.items() if isinstance(module, torch.nn.Module)
            for key, value in module.state_dict().items() if not key.endswith(BN_STATISTICS)}


def world_size():
    from runtime import distributed
    return distributed.world_size()


def _seeded_worker(rank, port, folder, broadcast):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), WORLD_SIZE=str(WORLD),
                      RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS='1')
    torch.set_num_threads(1)
    import torch.distributed as dist

    from training import steps
    if not broadcast:          # the power check: the processes start from their own weights, as before 6d42068
        steps.broadcast_state = lambda *modules: None
    results = {case: trained_states(case, rank) for case in SEEDED_CASES}
    torch.save(results, os.path.join(folder, f'rank{rank}.pt'))
    dist.destroy_process_group()


def seeded_ranks(folder, broadcast=True):
    os.makedirs(folder)
    two_processes(_seeded_worker, free_port(), str(folder), broadcast)
    return [torch.load(os.path.join(folder, f'rank{r}.pt'), weights_only=True) for r in range(WORLD)]


def test_processes_seeded_differently_train_one_model(tmp_path):
    """Every process seeds ``--seed + rank`` before building (as torchrun runs do), yet after three SGD
    steps every process holds bit for bit the same model, key encoder, loss parameters and buffers, and queue, in
    every mode (gradient caching's bare model, BCL's and PaCo's own classifiers, the key encoder); the power check
    (no broadcast after building) leaves every one of these modes with different weights per process."""
    good = seeded_ranks(tmp_path / 'fixed')
    for case in SEEDED_CASES:
        assert good[0][case].keys() == good[1][case].keys()
        for key, value in good[0][case].items():
            assert torch.equal(value, good[1][case][key]), f'{case}: {key} differs between the processes'
        assert any(k.startswith('criterion.') for k in good[0][case]) or case.startswith(('SupCon', 'CE'))
    broken = seeded_ranks(tmp_path / 'broken', broadcast=False)
    for case in SEEDED_CASES:
        differ = [key for key, value in broken[0][case].items() if not torch.equal(value, broken[1][case][key])]
        assert differ, case
        if case.startswith(('BCL', 'PaCo')):      # the loss's own classifier too
            assert any(k.startswith('criterion.') for k in differ), case
        if 'queue' in case:
            assert any(k.startswith('key_encoder.') for k in differ), case


def torchrun(script, *args, check=True):
    proc = run_script(torch.distributed.run.__file__, '--nproc_per_node', WORLD, '--master_port', free_port(), script,
                      *args, check=False, env={'OMP_NUM_THREADS': '1'})
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize('method', ['SupCon', 'RASCAL'])
def test_torchrun_supcon_then_linear(tmp_path, method):
    # 8 px; SupCon augments on the device (three torchrun calls), RASCAL in the DataLoader's workers
    small = ['--size', 8, *(['--augment', 'device'] if method == 'SupCon' else [])]
    out = torchrun('main_supcon.py', '--dataset', 'digits', '--method', method, '--epochs', 1, *small,
                   '--batch_size', 128, '--num_workers', 0, '--print_freq', 1000, '--save_folder', tmp_path / 'pre')
    assert out.stdout.count('epoch 1/1') == 1          # rank 0 alone prints
    run = only_run_folder(tmp_path / 'pre')
    assert sorted(f for f in os.listdir(run) if f.endswith('.pth')) == ['last.pth']
    assert len(read_metrics(run)) == 1
    ckpt = load(os.path.join(run, 'last.pth'))
    assert not any(k.startswith('module.') for k in ckpt['model']) and len(ckpt['rng_ranks']) == WORLD
    if method == 'RASCAL':   # every sample seen once: the whole cache is filled
        assert bool(ckpt['extra']['criterion']['cache_valid'].all())
    else:                    # --resume under torchrun continues the run
        out = torchrun('main_supcon.py', '--dataset', 'digits', '--epochs', 2, '--batch_size', 128, *small,
                       '--num_workers', 0, '--print_freq', 1000, '--resume', os.path.join(run, 'last.pth'))
        assert 'resumed from' in out.stdout and out.stdout.count('epoch 2/2') == 1
        assert [r['epoch'] for r in read_metrics(run)] == ['1', '2']
        assert load(os.path.join(run, 'last.pth'))['epoch'] == 2
        torchrun('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1, '--batch_size', 128,
                 '--num_workers', 0, '--learning_rate', 1, '--augment', 'device', '--save_folder', tmp_path / 'lin')
        results = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
        assert 10 < results['final_test_acc'] <= 100      # linear evaluation under torchrun (once is enough)


@pytest.mark.slow
def test_torchrun_resume_equals_the_uninterrupted_run(tmp_path):
    """Under torchrun, 1 epoch + ``--resume`` 1 epoch ends bit for bit where 2 epochs do, in the mode
    where every per-process state must start from rank 0's: gradient caching (the bare model), PaCo's own classifier
    and the momentum key encoder with its queue. Before the fix the uninterrupted run trained each process from its
    own weights and the resume re-synchronized them from rank 0's checkpoint: the two runs differed."""
    common = ['--dataset', 'digits_lt', '--imb_factor', 0.1, '--method', 'PaCo', '--queue_size', 256, '--moco_m', 0.9,
              '--chunk_size', 32, '--size', 8, '--augment', 'device', '--batch_size', 128, '--num_workers', 0,
              '--print_freq', 1000]
    torchrun('main_supcon.py', *common, '--epochs', 2, '--save_folder', tmp_path / 'whole')
    torchrun('main_supcon.py', *common, '--epochs', 1, '--save_folder', tmp_path / 'parts')
    part = os.path.join(only_run_folder(tmp_path / 'parts'), 'last.pth')
    torchrun('main_supcon.py', *common, '--epochs', 2, '--resume', part)
    whole, resumed = load(os.path.join(only_run_folder(tmp_path / 'whole'), 'last.pth')), load(part)
    assert resumed['epoch'] == whole['epoch'] == 2
    for group in ('model', 'extra'):
        flat_whole, flat_resumed = _flat(whole[group]), _flat(resumed[group])
        assert flat_whole.keys() == flat_resumed.keys()
        for key, value in flat_whole.items():
            assert torch.equal(value, flat_resumed[key]), f'{group}.{key}'


def _flat(tree, prefix=''):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f'{prefix}{key}.').items()}
    return {prefix[:-1]: tree} if isinstance(tree, torch.Tensor) else {}


@pytest.mark.slow
def test_torchrun_bad_input(tmp_path):
    for args, words in [(['--batch_size', 127], '--batch_size 127'), (['--syncBN'], '--syncBN needs CUDA')]:
        proc = torchrun('main_supcon.py', *args, '--epochs', 1, '--num_workers', 0, '--device', 'cpu',
                        '--save_folder', tmp_path, check=False)
        assert proc.returncode != 0 and f'main_supcon.py: error: {words}' in proc.stderr
        assert os.path.join(ROOT, 'main_supcon.py') not in proc.stderr    # torchrun's report, not ours


def test_sync_bn_note_in_one_process():
    from config.options import parse_option
    opt = parse_option('supcon', ['--syncBN'])
    assert opt.world_size == 1 and opt.local_batch_size == opt.batch_size


def _child_with_rank(parent, rank):
    """The pid of ``parent``'s child process whose environment has ``RANK=rank`` (a torchrun worker), or None."""
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            with open(f'/proc/{pid}/environ', 'rb') as f:
                env = f.read().split(b'\0')
        except OSError:
            continue
        if ppid == parent and f'RANK={rank}'.encode() in env:
            return int(pid)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='finds the worker through /proc')
def test_a_dead_peer_gives_the_survivor_one_line(tmp_path):
    """Rank 1 killed after the first checkpoint; rank 0 says in one line that another process
    died (not gloo's traceback) or, when torchrun's SIGTERM comes first, that torchrun stopped it; the checkpoint
    is intact."""
    import signal
    import time
    env = script_env(OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()),
           'main_supcon.py', *map(str, ['--epochs', 50, '--batch_size', 64, '--num_workers', 0, '--print_freq', 1000,
                                        '--device', 'cpu', '--size', 8, '--augment', 'device',
                                        '--save_folder', tmp_path])]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline, victim = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        if any('last.pth' in fs for _, _, fs in os.walk(tmp_path)):
            victim = _child_with_rank(proc.pid, 1)
            break
        time.sleep(0.05)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=scaled(300))
    assert proc.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith('main_supcon.py:')]
    # rank 0 either meets the dead peer in a collective, or torchrun's SIGTERM reaches it first
    assert len(ours) == 1 and ('another torchrun process died' in ours[0]
                               or 'torchrun stops every process when one fails' in ours[0]), err[-3000:]
    # no traceback through our code (torchrun's own report, after, has one through torch's)
    import re
    assert not re.search(rf'File "{re.escape(ROOT)}/\w+\.py"', err) and 'Exception ignored' not in err, err[-3000:]
    assert load(os.path.join(only_run_folder(tmp_path), 'last.pth'))['epoch'] >= 1
