"""``python tests/with_shim.py <script> args``: ``<script>`` in this real interpreter (a test's signals, SIGKILL
included, reach the script itself), but with ``sys.executable`` the suite's shim, so that the scripts it starts are
forked from the worker's script server (tests/script_server.py, "The scripts' own children"). For the tests that
kill a sweep: ``helpers.own_process``."""
import os
import runpy
import sys

sys.executable = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'python_shim')
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name='__main__')
