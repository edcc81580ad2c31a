"""5. The accelerator forms (CARROT's quantiles, the queue's memory, class blocks, TSC's targets)."""

from benchmarks.gpu_check.common import PY, outcome, run, tail


def section_forms(ctx):
    d = ['--device', ctx.device]
    runs = [('CARROT\'s quantiles: kthvalue against topk', ['benchmarks/carrot_quantile.py', *d] + (
                ['--batch_sizes', '64', '--reps', '1'] if ctx.dry else
                ['--batch_sizes', '1024', '4096', '--reps', '5'])),
            ('The queue\'s peak memory, dense against blocked (B 4096, K 65536)', ['benchmarks/queue_memory.py', *d] + (
                ['--batch', '64', '--queue', '512'] if ctx.dry else [])),
            ('Class blocks and KCL\'s draw at a long tail (host work)', ['benchmarks/class_blocks_cost.py'] + (
                ['--batch', '256', '--reps', '1'] if ctx.dry else [])),
            ('TSC\'s targets at C = 1000', ['benchmarks/tsc_targets.py', *d] + (
                ['--classes', '20', '--steps', '50'] if ctx.dry else ['--classes', '1000']))]
    lines, ok, data = [], True, {}
    for title, cmd in runs:
        code, out = run([PY, *cmd], ctx.log, ctx.left(5))
        ok &= code == 0
        data[title] = {'status': code, 'output': out.strip().splitlines()[-12:]}
        lines += [f'**{title}** (`python {" ".join(cmd)}`{"" if code == 0 else f", exit {code}"})', '', '```',
                  tail(out, 12), '```', '']
    return outcome(ctx, ok, '\n'.join(lines).strip(), data)
