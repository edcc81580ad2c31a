"""The GPU check's command line and plan: which sections, alone or side by side in process chains, under one
--budget (the package's docstring says what each section measures)."""
import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time

from benchmarks.gpu_check.common import PY, RESULT_MARK, ROOT, Context, run, tail
from benchmarks.gpu_check.cuda_tests import section_cuda_tests
from benchmarks.gpu_check.environment import section_environment
from benchmarks.gpu_check.field import section_field
from benchmarks.gpu_check.forms import section_forms
from benchmarks.gpu_check.recipe import section_recipe
from benchmarks.gpu_check.report import write_report
from benchmarks.gpu_check.syncs import section_loop_syncs
from benchmarks.gpu_check.throughput import section_throughput
from benchmarks.gpu_check.user_recipe import section_user_recipe

# number, key, title, needs CUDA, time bound on a GPU (s), time bound in the dry run (s)
SECTIONS = [
    (1, 'environment', 'Environment', False, 60, 60),
    (2, 'cuda_tests', '`pytest -m cuda`', True, 240, 90),
    (3, 'loop_syncs', 'Host synchronizations per iteration of the training loop', True, 120, 90),
    (4, 'throughput', 'Throughput against the targets (`benchmarks/gpu_throughput.py --compile`)', True, 300, 90),
    (5, 'forms', 'The accelerator forms', True, 200, 120),
    (6, 'recipe', 'A real recipe: SupCon resnet18 on CIFAR-10-layout files, `--deterministic`', True, 240, 150),
    (7, 'field', 'The field on the GPU (digits, 32 px, resnet18, one seed)', True, 300, 240),
    (8, 'user_recipe', 'A user\'s recipe as it runs: `scripts/supcon_cifar.sh` on CIFAR-10-layout files', True,
     170, 120),
]
# The default plan: the environment, then the throughput alone on the machine (its timings must not share it), then
# the correctness sections side by side, each group in a process chain of its own (their timings are under load, and
# the reports say so). ``--serial`` runs every section alone, in order.
ALONE = (1, 4, 8)
SIDE_BY_SIDE = ((2,), (3, 5), (6,), (7,))
DEFAULT_BUDGET = 560          # seconds: one 10-minute call on one H100, with room for the transfers
SECTION_FUNCTIONS = {'environment': section_environment, 'cuda_tests': section_cuda_tests,
                     'loop_syncs': section_loop_syncs, 'throughput': section_throughput, 'forms': section_forms,
                     'recipe': section_recipe, 'field': section_field, 'user_recipe': section_user_recipe}


def run_section(key, dry, cuda, work, log, seconds):
    """In the section's own process: run it, print its result as one marked JSON line."""
    sys.path.insert(0, ROOT)
    ctx = Context(dry, cuda, work, log, time.monotonic() + seconds)
    sabotage = os.environ.get('GPU_CHECK_SABOTAGE', '')        # the suite's power check: 'key:fail' or 'key:hang'
    if sabotage == f'{key}:fail':
        raise RuntimeError(f'sabotaged section {key}')
    if sabotage == f'{key}:hang':
        time.sleep(3600)
    if sabotage == 'nap' and key != 'environment':       # the driver's test: every section a 3-second pass
        time.sleep(3)
        print(RESULT_MARK + json.dumps({'status': 'passed', 'summary': 'a nap', 'data': {}}), flush=True)
        return
    result = SECTION_FUNCTIONS[key](ctx)
    print(RESULT_MARK + json.dumps(result, default=str), flush=True)


class ArgumentError(Exception):
    """A bad argument of the GPU check: one line, exit status 2, before anything runs."""


def parse_sections(text):
    """``'2-4,7'`` -> ``{1, 2, 3, 4, 7}`` (the environment always runs); :class:`ArgumentError` for anything else: an
    empty or malformed list, a reversed range, a number that is no section."""
    known = {n for n, *_ in SECTIONS}
    if not re.fullmatch(r'\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*', text or ''):
        raise ArgumentError(f'--sections takes numbers and ranges of 1-{max(known)} separated by commas (e.g. '
                            f'1-3,5), got {text!r}')
    chosen = set()
    for part in text.split(','):
        a, _, b = (x.strip() for x in part.partition('-'))
        first, last = int(a), int(b or a)
        if last < first:
            raise ArgumentError(f'--sections: the range {part.strip()} is reversed (write {last}-{first})')
        chosen.update(range(first, last + 1))
    if not chosen <= known:
        raise ArgumentError(f'--sections takes numbers in 1-{max(known)}, got {text}')
    return chosen | {1}          # the environment always


def usable_out(out):
    """Create ``out`` and check that a file can be written there, and that it holds no report yet (a report never
    replaces another); :class:`ArgumentError` naming the cause otherwise."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ArgumentError(f'--out {out} is a file: give a folder (default $OUT, else ./gpu_check_out)')
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ArgumentError(f'cannot write the report into {out} ({e.strerror or type(e).__name__}): give another '
                            '--out (or $OUT)') from None
    if os.path.exists(os.path.join(out, 'gpu_report.md')):
        raise ArgumentError(f'{out} holds a report already (gpu_report.md): give another --out, or move that report '
                            'away first')
    return out


def machine_slack():
    """``--slack auto``: 1 plus the load the machine carries per core (its 1-minute load average), so the time bounds
    follow a machine that other work shares."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return round(1.0 + load / (os.cpu_count() or 1), 1)


def main(argv=None):
    sys.path.insert(0, ROOT)
    from core.flags import Parser  # one-line errors, full flag names only
    parser = Parser(prog='gpu_check.sh', description=sys.modules['benchmarks.gpu_check'].__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dry-run', action='store_true', help='tiny sizes, any device (the suite runs this)')
    parser.add_argument('--sections', default=f'1-{len(SECTIONS)}',
                        help='which sections, e.g. 1-3,5 (1 always runs)')
    parser.add_argument('--budget', type=float, default=None,
                        help=f'seconds for everything (default {DEFAULT_BUDGET}: one 10-minute call; dry run: the '
                             'bounds of the sections run alone plus the longest group side by side): a section that '
                             'would start later is skipped, one that runs past it is stopped')
    parser.add_argument('--chains', type=int, default=None,
                        help='process chains run side by side at most (default: all four on CUDA; without CUDA half '
                             'the CPU cores, at least 1, so that the dry run\'s bounds hold on a small machine)')
    parser.add_argument('--serial', action='store_true',
                        help='every section alone, in order (default: the throughput alone, then the correctness '
                             'sections side by side)')
    parser.add_argument('--slack', default='auto',
                        help='multiply every section\'s time bound by this (default auto: 1 + the load average per '
                             'core, so a loaded machine gets more time)')
    parser.add_argument('--out', default=os.environ.get('OUT') or os.path.join(ROOT, 'gpu_check_out'),
                        help='the report\'s folder (default $OUT, else ./gpu_check_out); one that holds a report is '
                             'refused')
    parser.add_argument('--run-section', help=argparse.SUPPRESS)
    parser.add_argument('--work', help=argparse.SUPPRESS)
    parser.add_argument('--log', help=argparse.SUPPRESS)
    parser.add_argument('--seconds', type=float, help=argparse.SUPPRESS)
    parser.add_argument('--cuda', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_section:
        return run_section(args.run_section, args.dry_run, bool(args.cuda), args.work, args.log, args.seconds)
    try:
        chosen = parse_sections(args.sections)
        slack = machine_slack() if args.slack == 'auto' else float(args.slack)
        if not slack > 0 or slack == float('inf'):
            raise ArgumentError(f'--slack must be a number > 0 or auto, got {args.slack}')
        if args.chains is not None and args.chains < 1:
            raise ArgumentError(f'--chains must be >= 1, got {args.chains}')
        if args.budget is not None and not (0 < args.budget < float('inf')):
            raise ArgumentError(f'--budget must be a number of seconds > 0, got {args.budget:g}')
        usable_out(args.out)
    except ValueError:
        parser.error(f'--slack must be a number > 0 or auto, got {args.slack}')
    except ArgumentError as e:
        parser.error(str(e))
    import torch
    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    if args.serial:
        alone, together = [[n] for n in sorted(chosen)], []
    else:
        alone = [[n] for n in ALONE if n in chosen]
        together = [g for g in ([n for n in group if n in chosen] for group in SIDE_BY_SIDE) if g]
    chains = args.chains or (len(SIDE_BY_SIDE) if cuda else max(1, (os.cpu_count() or 1) // 2))
    bounds = {n: (dry_bound if dry else bound) for n, _, _, _, bound, dry_bound in SECTIONS}
    longest = sorted((sum(bounds[n] for n in g) for g in together), reverse=True)
    default = sum(bounds[g[0]] for g in alone) + sum(longest[::chains])        # the chains, `chains` at a time
    budget = args.budget or (slack * default if dry else DEFAULT_BUDGET)
    log = os.path.join(args.out, 'gpu_check.log')
    open(log, 'w').close()
    start = time.monotonic()
    meta = {'command': ' '.join(['bash scripts/gpu_check.sh', *(argv if argv is not None else sys.argv[1:])]),
            'dry_run': args.dry_run, 'cuda': cuda, 'budget_s': budget, 'slack': slack, 'elapsed_s': 0,
            'plan': {'alone': alone, 'side_by_side': together, 'chains': chains}}
    results, lock = [], threading.Lock()
    print(f'GPU check ({"dry run, " if args.dry_run else ""}{"CUDA" if cuda else "no CUDA: tiny sizes on the CPU"}); '
          f'report in {args.out}; alone: {", ".join(str(g[0]) for g in alone)}'
          + (f'; then side by side ({chains} at a time): {" | ".join(",".join(map(str, g)) for g in together)}'
             if together else ''), flush=True)
    with tempfile.TemporaryDirectory(prefix='gpu_check_') as scratch:
        def run_group(numbers, group_log):
            for number in numbers:
                _, key, title, _, bound, dry_bound = SECTIONS[number - 1]
                left = budget - (time.monotonic() - start)
                seconds = min(slack * (dry_bound if dry else bound), left - 3)
                entry = {'number': number, 'key': key, 'title': title, 'seconds': 0.0}
                if seconds < 10:
                    entry.update(status='skipped: out of time', summary=f'{left:.0f} s of the --budget left', data={})
                else:
                    print(f'[{number}/{len(SECTIONS)}] {title} (at most {seconds:.0f} s) ...', flush=True)
                    work = os.path.join(scratch, key)
                    os.makedirs(work)
                    t = time.monotonic()
                    entry['started_s'] = t - start
                    with open(group_log, 'a') as f:
                        f.write(f'\n\n===== {number}. {title}\n')
                    code, out = run([PY, '-m', 'benchmarks.gpu_check', '--run-section', key, '--work', work, '--log',
                                     group_log, '--seconds', seconds - 5, '--cuda', int(cuda),
                                     *(['--dry-run'] if args.dry_run else [])], group_log, seconds)
                    entry['seconds'] = time.monotonic() - t
                    marked = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
                    if marked:
                        entry.update(json.loads(marked[-1][len(RESULT_MARK):]))
                    else:
                        why = 'timed out' if code == 'timed out' else f'exited {code} without a result'
                        entry.update(status='timed out' if code == 'timed out' else 'failed', data={},
                                     summary=f'The section {why} after {entry["seconds"]:.0f} s; the last lines of '
                                             f'its output:\n\n```\n{tail(out, 20)}\n```')
                    print(f'      {number}. {entry["status"]} ({entry["seconds"]:.0f} s)', flush=True)
                with lock:
                    results.append(entry)
                    results.sort(key=lambda r: r['number'])
                    meta['elapsed_s'] = time.monotonic() - start
                    write_report(args.out, results, meta)
        for group in alone:
            run_group(group, log)
        waiting = list(together)

        def worker():                       # one of `chains` workers: takes the next chain until none is left
            while True:
                with lock:
                    if not waiting:
                        return
                    group = waiting.pop(0)
                run_group(group, os.path.join(args.out, f'gpu_check_{"-".join(map(str, group))}.log'))
        threads = [threading.Thread(target=worker) for _ in range(min(chains, len(together)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failed = [r for r in results if r['status'] in ('failed', 'timed out')]
    print(f'report: {os.path.join(args.out, "gpu_report.md")}; '
          f'{len(failed)} of {len(results)} sections failed or timed out', flush=True)
    return 1 if failed else 0
