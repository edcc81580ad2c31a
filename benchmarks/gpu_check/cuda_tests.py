"""2. ``pytest -m cuda`` on the test files that mark a test ``cuda``."""
import os
import re

from benchmarks.gpu_check.common import PY, ROOT, outcome, run, tail


def cuda_test_files():
    """The test files that mark a test ``cuda`` (``mark.cuda`` in their text), relative to the repository: what
    ``pytest -m cuda`` selects from, without importing the whole suite to find them (``['tests']`` if none does)."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, 'tests')):
        for name in sorted(files):
            if name.startswith('test_') and name.endswith('.py'):
                with open(os.path.join(folder, name), encoding='utf-8') as f:
                    if re.search(r'\bmark\.cuda\b', f.read()):
                        found.append(os.path.relpath(os.path.join(folder, name), ROOT))
    return sorted(found) or ['tests']


def section_cuda_tests(ctx):
    import xml.etree.ElementTree as ET
    junit = os.path.join(ctx.work, 'junit.xml')
    workers = ['-n', '0'] if not ctx.cuda else ['-n', str(min(8, os.cpu_count() or 1))]
    code, out = run([PY, '-m', 'pytest', '-m', 'cuda', '-q', '-p', 'no:cacheprovider', *workers,
                     f'--junitxml={junit}', *cuda_test_files()], ctx.log, ctx.left(10))
    if code == 'timed out' or not os.path.isfile(junit):
        return outcome(ctx, False, f'pytest {"timed out" if code == "timed out" else "wrote no report"}:\n\n'
                                   f'```\n{tail(out, 25)}\n```')
    counts = {'tests': 0, 'failures': 0, 'errors': 0, 'skipped': 0}
    failed = []
    for case in ET.parse(junit).getroot().iter('testcase'):
        counts['tests'] += 1
        for kind in ('failure', 'error', 'skipped'):
            node = case.find(kind)
            if node is not None:
                counts['failures' if kind == 'failure' else kind if kind == 'skipped' else 'errors'] += 1
                if kind != 'skipped':
                    name = f'{case.get("classname", "")}::{case.get("name")}'
                    failed.append((name, tail((node.get('message') or '') + '\n' + (node.text or ''), 12)))
    counts['passed'] = counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']
    lines = [f'{counts["tests"]} collected: {counts["passed"]} passed, {counts["failures"]} failed, '
             f'{counts["errors"]} errors, {counts["skipped"]} skipped (pytest exit status {code}).']
    for name, text in failed:
        lines += ['', f'**{name}**', '', '```', text, '```']
    ok = not failed and counts['tests'] > 0 and (counts['passed'] > 0 if ctx.cuda else True)
    return outcome(ctx, ok, '\n'.join(lines), {**counts, 'failed': [n for n, _ in failed]})
