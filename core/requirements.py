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


def check():
    gone = missing()
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
