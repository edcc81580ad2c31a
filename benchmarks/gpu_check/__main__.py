"""``python -m benchmarks.gpu_check`` (scripts/gpu_check.sh)."""
import contextlib
import sys

from benchmarks.gpu_check.plan import main

with contextlib.suppress(KeyboardInterrupt):
    sys.exit(main())
sys.exit(130)
