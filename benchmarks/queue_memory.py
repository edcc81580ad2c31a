"""Peak memory of one SupCon step with a full memory queue and a key encoder at MoCo's sizes (B = 4096, K = 65536,
two views, D = 128; a small model on 8-pixel images; on a CPU, or a GPU with ``--device cuda``), ours against the
dense baseline (the pre-issue-41 forms: a ``[B, K]`` float label-match matrix for the queue's positives and a
``[B, K]`` bool for its statistic, the ``[M, M + K]`` concatenation of the logits), each in its own process.

    python benchmarks/queue_memory.py [--batch 4096] [--queue 65536] [--model resnet_tiny] [--size 8] [--device cuda]

The figure is the step's peak memory above the memory just before the step, so the model, the queue and the images
are not counted: on a CPU the resident memory (``ru_maxrss`` after the step minus the resident set before it, MB),
on CUDA the allocator's (``torch.cuda.max_memory_allocated`` over the step minus ``memory_allocated`` before it).
Last line: ``ratio X`` (ours / dense).
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resident_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


def dense_forms():
    """Patch in the pre-issue-41 forms (the baseline)."""
    import torch

    import losses
    from training import memory_queue

    def queue_positive_sums(labels, queue, q_feat):
        same = ((labels.reshape(-1, 1) == queue.label[None, :]) & queue.valid[None, :]).to(q_feat.dtype)   # [B, K]
        return same @ q_feat, same.sum(1)

    def forward(self, features, labels=None, mask=None, queue=None):
        contrast, bsz, n_views = losses.flatten_views(features)
        labels = labels.to(features.device)
        contrast = losses.upcast(contrast)
        logits = contrast @ contrast.T / self.temperature
        logits.diagonal().fill_(-math.inf)
        q_logits = (contrast @ queue.feat.to(contrast.dtype).T / self.temperature).masked_fill(~queue.valid,
                                                                                                -math.inf)
        log_denom = torch.logsumexp(torch.cat([logits, q_logits], dim=1), dim=1)
        pos_dot, n_pos = losses.positive_dots(contrast, contrast, bsz, n_views, labels, None, queue)
        mean_log_prob_pos = (pos_dot / self.temperature - n_pos * log_denom) / n_pos.clamp(min=1)
        return -(self.temperature / self.base_temperature) * mean_log_prob_pos.mean()

    def statistics(self, labels=None):
        valid = self.valid.float()
        labels = labels.to(self.label.device, non_blocking=True).reshape(-1, 1)          # the loader's, on the host
        same = (self.label[None, :] == labels) & self.valid                               # [B, K] bool
        return {'queue/fill': valid.mean(), 'queue/pos_per_anchor': same.sum(1).float().mean()}

    losses.queue_positive_sums = queue_positive_sums
    losses.SupConLoss.forward = forward
    memory_queue.MemoryQueue.statistics = statistics


def worker(args):
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.mode == 'dense':
        dense_forms()
    from config.options import parse_option
    from engine.run import setup
    from training.steps import Pretraining
    opt = setup(parse_option('supcon', ['--batch_size', str(args.batch), '--queue_size', str(args.queue),
                                        '--moco_m', '0.99', '--model', args.model, '--size', str(args.size),
                                        '--device', args.device]), run_folder=False)
    pre = Pretraining(opt, args.batch * 4)
    g = torch.Generator().manual_seed(0)
    pre.queue.enqueue(torch.randn(args.queue, 128, generator=g).to(opt.device),
                      torch.randint(0, 10, (args.queue,), generator=g), torch.randint(0, args.batch * 4, (args.queue,),
                                                                                       generator=g))
    views = [torch.randn(args.batch, 3, args.size, args.size, generator=g).to(opt.device) for _ in range(2)]
    labels, ids = torch.randint(0, 10, (args.batch,), generator=g), torch.arange(args.batch)
    if opt.device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2 ** 20
        loss, _ = pre.step(views, labels, ids)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        before = resident_mb()
        loss, _ = pre.step(views, labels, ids)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({'extra_mb': peak - before, 'loss': float(loss)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch', type=int, default=4096)
    parser.add_argument('--queue', type=int, default=65536)
    parser.add_argument('--model', default='resnet_tiny')
    parser.add_argument('--size', type=int, default=8)
    parser.add_argument('--device', default='cpu', help='cpu (resident memory) or cuda (the allocator\'s peak)')
    parser.add_argument('--worker', choices=['ours', 'dense'])
    args = parser.parse_args(argv)
    if args.worker:
        args.mode = args.worker
        return worker(args)
    print(f'one SupCon step, B = {args.batch} (two views), a full queue of K = {args.queue}, key encoder, '
          f'{args.model} at {args.size} px, {args.device}')
    out = {}
    for mode in ('dense', 'ours'):
        cmd = [sys.executable, os.path.abspath(__file__), '--worker', mode, '--batch', str(args.batch), '--queue',
               str(args.queue), '--model', args.model, '--size', str(args.size), '--device', args.device]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            sys.exit(f'{mode} failed: {proc.stderr[-2000:]}')
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f'{mode}: step peak {out[mode]["extra_mb"]:.0f} MB above the memory before it '
              f'(loss {out[mode]["loss"]:.6f})', flush=True)
    print(f'ratio {out["ours"]["extra_mb"] / out["dense"]["extra_mb"]:.3f}')


if __name__ == '__main__':
    main()
