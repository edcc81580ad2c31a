"""How torchrun runs end: many short two-process runs, several at once (a loaded machine, where races at exit show),
each followed by a ``--resume`` for one more epoch, as ``tests/runtime/test_distributed.py`` runs them. Counts the
runs that ended well, those where a process aborted at its exit (SIGABRT after its last checkpoint: gloo's worker
threads outliving the interpreter, mended by ``config.cli.end_process_groups``) and any other failure.

    python benchmarks/torchrun_exits.py [--runs 40] [--parallel 3]
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runtime.processes import start  # noqa: E402

FLAGS = ['--dataset', 'digits', '--size', '8', '--augment', 'device', '--batch_size', '128', '--num_workers', '0',
         '--print_freq', '1000']


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def torchrun(*args):
    """'ok', 'abort' (a process ended by SIGABRT) or 'failed', and the output's tail."""
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()),
           os.path.join(ROOT, 'main_supcon.py'), *FLAGS, *args]
    proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 env={**os.environ, 'OMP_NUM_THREADS': '1'})
    out, _ = proc.communicate()
    if proc.returncode == 0:
        return 'ok', ''
    return ('abort' if 'SIGABRT' in out else 'failed'), out[-2000:]


def one_run(folder, resume):
    """A 1-epoch run, then (``resume``) its ``--resume`` to epoch 2: the outcomes of both."""
    first = torchrun('--epochs', '1', '--save_folder', folder)
    outcomes = [first]
    if resume and first[0] == 'ok':
        last = next(os.path.join(d, 'last.pth') for d, _, files in os.walk(folder) if 'last.pth' in files)
        outcomes.append(torchrun('--epochs', '2', '--resume', last))
    shutil.rmtree(folder, ignore_errors=True)
    return outcomes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=40, help='runs, each with its --resume')
    parser.add_argument('--parallel', type=int, default=3, help='runs at once')
    parser.add_argument('--no_resume', action='store_true', help='the 1-epoch runs alone')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.parallel) as pool:
        results = [o for outcomes in pool.map(lambda i: one_run(os.path.join(tmp, str(i)), not args.no_resume),
                                              range(args.runs)) for o in outcomes]
    counts = {kind: sum(kind == k for k, _ in results) for kind in ('ok', 'abort', 'failed')}
    print(f'torchrun calls: {len(results)} ({args.runs} runs, {args.parallel} at once); ended well {counts["ok"]}, '
          f'a process aborted at exit {counts["abort"]}, other failures {counts["failed"]}')
    for kind, tail in results:
        if kind != 'ok':
            print(f'--- {kind}:\n{tail}')
    return 0 if counts['ok'] == len(results) else 1


if __name__ == '__main__':
    sys.exit(main())
