"""Step time of SupCon with a memory queue and a momentum key encoder / SupCon without, measured in one run.

    python benchmarks/queue_overhead.py [--model resnet18] [--size 32] [--batch 256] [--queue 8192] [--reps 3]

Both are the real ``steps.Pretraining.step`` (two views, SGD step included); the queue is full, so the loss
is the M x (M + K) problem. The key encoder's forward is the expected cost (about a third of a training
step); the loss should be noise next to it. Target: ratio <= 1.5 at batch 256.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import time_interleaved  # noqa: E402
from config.options import parse_option  # noqa: E402
from engine.run import setup  # noqa: E402
from training.schedule import set_optimizer  # noqa: E402
from training.steps import Pretraining  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', default='resnet_tiny')
    p.add_argument('--size', type=int, default=32)
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--queue', type=int, default=8192)
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--device', default='auto')
    args = p.parse_args()
    argv = ['--batch_size', str(args.batch), '--model', args.model, '--size', str(args.size), '--device', args.device]
    opt = setup(parse_option('supcon', [*argv, '--queue_size', str(args.queue)]), run_folder=False)
    torch.manual_seed(0)
    queued = Pretraining(opt, args.queue)          # with the queue and the key encoder
    plain = Pretraining(setup(parse_option('supcon', argv), run_folder=False), args.queue, model=queued.model)
    queued.model.train()
    optimizer = set_optimizer(queued.model.parameters(), opt.learning_rate, opt.momentum, opt.weight_decay)
    queued.queue.enqueue(torch.randn(args.queue, opt.feat_dim), torch.randint(0, 10, (args.queue,)),
                         torch.arange(args.queue))                              # a full queue
    views = [torch.randn(args.batch, 3, args.size, args.size) for _ in range(2)]
    labels, ids = torch.randint(0, 10, (args.batch,)), torch.arange(args.batch)

    def step(training):
        def call():
            optimizer.zero_grad(set_to_none=True)
            training.step(views, labels, ids)
            optimizer.step()
        return call
    t = time_interleaved({'plain': step(plain), 'queue': step(queued)}, opt.device, reps=args.reps, warmup=1)
    print(f'{opt.model} at {args.size}x{args.size}, batch {args.batch} x 2 views, {opt.device}, '
          f'{torch.get_num_threads()} threads')
    print(f'SupCon step {t["plain"]:.3f} s; with a queue of {args.queue} and a key encoder {t["queue"]:.3f} s; '
          f'ratio {t["queue"] / t["plain"]:.2f} (target <= 1.5)')


if __name__ == '__main__':
    main()
