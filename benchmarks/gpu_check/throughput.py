"""4. ``benchmarks/gpu_throughput.py --compile``: images/s against the targets."""
import json
import os

from benchmarks.gpu_check.common import PY, outcome, run, tail


def section_throughput(ctx):
    out_json = os.path.join(ctx.work, 'throughput.json')
    flags = ['--smoke', '--profile', 'always'] if ctx.dry else \
        ['--compile', '--batches', '1024', '--steps', '20', '--warmup', '3']
    code, out = run([PY, 'benchmarks/gpu_throughput.py', *flags, '--device', ctx.device, '--json', out_json],
                    ctx.log, ctx.left(5))
    report = {}
    if os.path.isfile(out_json):
        with open(out_json) as f:
            report = json.load(f)
    lines = []
    for config in report.get('configs', []):
        rates = config['rates']
        lines += ['', f'**{config["model"]}, batch {config["batch"]}** ({report.get("steps")} timed steps)', '',
                  '| row | images/s | ours/baseline | ours/bound |', '| --- | --- | --- | --- |']
        for row, rate in rates.items():
            over = 'bound compiled' if 'compiled' in row and 'bound compiled' in rates else 'bound'
            ratios = ('', '') if row.startswith(('baseline', 'bound')) else \
                (f'{rate / rates["baseline"]:.2f}', f'{rate / rates[over]:.2f}' + (' (compiled bound)'
                                                                                   if over != 'bound' else ''))
            lines.append(f'| {row} | {rate:.0f} | {ratios[0]} | {ratios[1]} |')
        for m in config['missed']:
            lines.append(f'\nTarget missed: {m["row"]} / {m["over"]} = {m["ratio"]:.2f} < {m["target"]}.')
        for method, table in config['profiles'].items():
            lines += ['', f'Profile of ours {method} (top operators by self time):', '', '```', tail(table, 22),
                      '```']
    if code != 0:
        lines += ['', f'gpu_throughput.py {"timed out" if code == "timed out" else f"exited {code}"}:', '',
                  '```', tail(out, 20), '```']
    missed = any(c['missed'] for c in report.get('configs', []))
    return outcome(ctx, code == 0, '\n'.join(lines).strip(), report,
                   status_ok='passed, targets missed' if missed else 'passed')
