"""What every section of the GPU check shares: the repository root and Python, a command run under a time bound,
the section's context and its result."""
import os
import signal
import subprocess
import sys
import time

from runtime import processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
RESULT_MARK = 'GPU_CHECK_SECTION_RESULT '


def tail(text, lines=15):
    return '\n'.join(str(text).rstrip().splitlines()[-lines:])


def run(cmd, log, timeout, env=None):
    """``cmd`` in the repo root, its output appended to ``log``; ``(exit status or 'timed out', output)``. A
    process group of its own, killed whole on the timeout."""
    with open(log, 'a') as f:
        f.write(f'\n$ {" ".join(map(str, cmd))}\n')
        f.flush()
        proc = processes.start([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})},
                               start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            code = 'timed out'
        f.write(out)
    return code, out


class Context:
    """What a section knows: ``dry`` (tiny sizes: ``--dry-run`` or no CUDA), ``cuda``, ``device``, ``work`` (a
    scratch folder), ``log`` (this section's log file), ``deadline`` (``time.monotonic()`` by which to end)."""

    def __init__(self, dry, cuda, work, log, deadline):
        self.dry, self.cuda, self.work, self.log, self.deadline = dry or not cuda, cuda, work, log, deadline
        self.device = 'cuda' if cuda else 'cpu'

    def left(self, reserve=5):
        return max(1.0, self.deadline - time.monotonic() - reserve)


def outcome(ctx, ok, summary, data=None, needs_cuda=True, status_ok='passed'):
    """A section's result: ``passed`` (or ``status_ok``) / ``failed``; without CUDA a section that needs it is
    ``skipped: no CUDA`` when its CPU run worked."""
    if not ok:
        status = 'failed'
    elif needs_cuda and not ctx.cuda:
        status = 'skipped: no CUDA'
    else:
        status = status_ok
    return {'status': status, 'summary': summary, 'data': data or {}}
