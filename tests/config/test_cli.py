"""config/cli.py: how a run under torchrun ends (the rest of ``run_cli`` is tested through the scripts)."""
import gc
import os

import pytest
import torch
import torch.multiprocessing as mp

from config import cli
from helpers import free_port

WORLD = 2


def _threads():
    return len(os.listdir('/proc/self/task'))


def _rank(rank, port, folder, collect):
    """One process of a torchrun-like run: gloo's group held in a reference cycle, as a run's objects hold it; the
    process's threads counted before the group and after ``run_cli``."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS='1')
    torch.set_num_threads(1)
    gc.disable()                    # no collection but the one under test
    if not collect:                 # power: what ending a run did before
        gc.collect = lambda *args: 0
    before = _threads()

    def main():
        dist.init_process_group('gloo')
        cycle = []
        cycle.extend([cycle, dist.group.WORLD])
        out = [None] * WORLD
        dist.all_gather_object(out, torch.ones(3) * rank)
        dist.barrier()
    cli.run_cli(main)
    with open(os.path.join(folder, str(rank)), 'w') as f:
        f.write(f'{before} {_threads()}')


def threads_before_and_after(folder, collect):
    mp.start_processes(_rank, args=(free_port(), str(folder), collect), nprocs=WORLD, join=True, start_method='fork')
    return [tuple(int(n) for n in open(os.path.join(folder, str(r))).read().split()) for r in range(WORLD)]


@pytest.mark.skipif(not os.path.isdir('/proc/self/task'), reason="counts the process's threads in /proc")
def test_a_run_that_ended_well_joins_the_process_groups_threads_before_the_interpreter_ends(tmp_path):
    """gloo's worker threads, left running into the interpreter's shutdown, abort a process now and then when they
    drop their last collective (SIGABRT after a good run: a failed torchrun). After ``run_cli`` they are gone.
    Power: without the collection the group and its threads outlive the run."""
    (tmp_path / 'fixed').mkdir()
    (tmp_path / 'broken').mkdir()
    assert all(after == before for before, after in threads_before_and_after(tmp_path / 'fixed', collect=True))
    assert all(after > before for before, after in threads_before_and_after(tmp_path / 'broken', collect=False))
