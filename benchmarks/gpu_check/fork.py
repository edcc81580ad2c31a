"""A function run in a forked child under a time bound, its output in a log (the field's runs)."""
import json
import os
import signal
import sys
import tempfile
import time
import traceback

from benchmarks.gpu_check.common import tail


class Forked:
    """``fn(*args)`` in a forked child (the imports are the parent's; the child alone touches CUDA), its output into
    ``log`` (a file of its own); :meth:`poll` is ``None`` while it runs, then its JSON-able result, or raises
    ``RuntimeError`` with the output's last lines (or the time-out)."""

    def __init__(self, fn, args, log, timeout):
        self.log, self.timeout, self.start = log, timeout, time.monotonic()
        self.result = tempfile.NamedTemporaryFile(suffix='.json', delete=False).name
        sys.stdout.flush()                          # the child must not print the parent's buffered output again
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:                           # the child
            code = 1
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(fd, 'w', buffering=1, closefd=False)   # also where they were replaced
                value = fn(*args)
                with open(self.result, 'w') as f:
                    json.dump(value, f)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self):
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if not done:
            if time.monotonic() - self.start <= self.timeout:
                return None
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.unlink(self.result)
            raise RuntimeError(f'timed out after {self.timeout:.0f} s')
        try:
            if os.waitstatus_to_exitcode(status) != 0:
                with open(self.log) as f:
                    raise RuntimeError(tail(f.read(), 8))
            with open(self.result) as f:
                return json.load(f)
        finally:
            os.unlink(self.result)


def forked(fn, args, log, timeout):
    """:class:`Forked`, waited for: its result, or ``RuntimeError``."""
    child = Forked(fn, args, log, timeout)
    while True:
        out = child.poll()
        if out is not None:
            return out
        time.sleep(0.2)
