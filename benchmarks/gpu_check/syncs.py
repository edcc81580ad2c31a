"""3. Host synchronizations per iteration of whole training loops (``benchmarks/loop_syncs.py``)."""
import sys

from benchmarks.gpu_check.common import ROOT, outcome


def section_loop_syncs(ctx):
    sys.path.insert(0, ROOT)
    from benchmarks import loop_syncs
    # the dry run: one mode (tests/training/test_sync.py counts every mode on the CPU)
    modes = list(loop_syncs.MODES) if not ctx.dry else ['SupCon']
    size, batch = (8, 32) if ctx.dry else (16, 64)
    results = loop_syncs.measure(modes, ctx.device, iterations=8, size=size, batch_size=batch, save_folder=ctx.work)
    ok = all(not r['error'] and r['steady_total'] and set(r['steady_total']) == {1} for r in results.values())
    counter = 'CUDA\'s sync debug mode (`warn`)' if ctx.cuda else 'the CPU counter (tests/sync_count.py)'
    summary = (f'Digits at {size} px, batch {batch}, `--augment device` (the multi-crop row: its DataLoader, 2 '
               f'workers), 8 iterations of `loop.train_loop` each; counted with {counter}. Expected: one wait per '
               f'iteration from the third on, the loop\'s read of the previous step\'s values.\n\n'
               + loop_syncs.table(results))
    return outcome(ctx, ok, summary, results)
