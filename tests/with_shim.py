"""``python tests/with_shim.py <script> args`` (or ``-m <module> args``): the script (the module) in this real
interpreter (a test's signals, SIGKILL included, reach the script itself), but with ``sys.executable`` the suite's
shim, so that the scripts it starts are forked from the worker's script server (tests/script_server.py, "The scripts'
own children"). For the tests that kill a sweep (``helpers.own_process``), and for ``<shim> -m module`` (a SLURM
job's ``submitit.core._submit``: the job's process is SLURM's, its stages are forked)."""
import os
import runpy
import sys

sys.executable = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'python_shim')
if sys.argv[1] == '-m':                 # as ``python -m``: the working folder first on the path
    sys.argv = sys.argv[2:]
    sys.path[0] = os.getcwd()
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name='__main__')
