"""Where every command starts its child processes: a sweep its stages, the GPU check its sections and their runs.

``start(cmd, **popen_kwargs)`` is ``Popen(cmd, **popen_kwargs)``, with :data:`Popen` ``subprocess.Popen``. It is one
name so that a caller can start them another way: the test suite puts a ``Popen`` here that forks a Python script
from a process that has imported torch already, instead of starting a fresh interpreter (tests/script_server.py).
"""
import subprocess

Popen = subprocess.Popen


def start(cmd, **popen_kwargs):
    """Start ``cmd`` (a list: the program, then its arguments) as ``subprocess.Popen`` would; returns the handle."""
    return Popen(cmd, **popen_kwargs)
