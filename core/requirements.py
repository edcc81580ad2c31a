"""Imported first by every command, before numpy or torch (the import sorter keeps it there: pyproject.toml): a
Python without requirements.txt installed gets one line naming what is missing and the environment to use, exit 2,
not a ``ModuleNotFoundError`` traceback."""
import importlib.util
import os
import sys

NEEDED = ('torch', 'torchvision', 'numpy', 'yaml', 'sklearn', 'scipy', 'tqdm')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def missing(names=NEEDED):
    """The packages of ``names`` this Python cannot import (looked up, not imported)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def needed(argv):
    """What the command line ``argv`` needs: ``sweep.py FILE --status`` reads the sweep's files only (PyYAML;
    docs/USAGE.md says it needs no torch), every other command all of :data:`NEEDED`."""
    script = os.path.basename(argv[0]) if argv and argv[0] else ''
    if script == 'sweep.py' and '--status' in argv[1:]:
        return ('yaml',)
    return NEEDED


def check():
    gone = missing(needed(sys.argv))
    if not gone:
        return
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'
    venv = os.path.join(ROOT, '.venv', 'bin', 'python')
    if os.path.exists(venv):
        how = f'run it with the project\'s environment: {venv} {script} ... (or source .venv/bin/activate first)'
    else:
        how = f'bash scripts/test.sh makes .venv with requirements.txt once; then run .venv/bin/python {script}'
    print(f'{script}: error: {", ".join(gone)} not installed in this Python ({sys.executable}): {how}',
          file=sys.stderr)
    sys.exit(2)


check()
