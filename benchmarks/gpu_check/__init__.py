"""The GPU check in one command: everything CUDA-side measured with the machine's own Python as it is, into one report.

    bash scripts/gpu_check.sh [--sections 1-8] [--budget SECONDS] [--out DIR]     # on the GPU machine
    bash scripts/gpu_check.sh --dry-run                                           # tiny sizes, any device

Writes ``<out>/gpu_report.md`` (ready to paste into docs/results.md), ``<out>/gpu_report.json`` and
``<out>/gpu_check.log`` (the output of the sections run alone; the others' in ``gpu_check_<sections>.log``), rewritten
after each section so that a run cut short still leaves
its report. ``<out>`` is ``$OUT`` when set, else ``./gpu_check_out``; a folder that holds a report already is refused
(a report never replaces another), as is a bad ``--sections``, ``--budget`` or ``--slack``: one line, exit 2, before
anything runs.

Each section runs in a process of its own under its own time bound (and the whole under ``--budget``, by default
560 s: one 10-minute call on one H100): one that fails or runs out of time is recorded with the last lines of its
output, and the next one runs. The plan: the environment, then the throughput and the user's recipe alone on the
machine (their timings must not share it), then the correctness sections side by side in four process chains (2 |
3, 5 | 6 | 7; their timings are under load, and the report says so), each writing its own
``gpu_check_<sections>.log``; ``--serial`` runs every section alone, in order. The report is rewritten as each
section ends, in section order.

1. environment: GPU, memory, driver, versions, commit (``GPU_CHECK_COMMIT`` where the tree has no ``.git``), date;
2. ``pytest -m cuda`` on the test files that mark a test ``cuda`` (found by their text, not by importing the whole
   suite): counts, and each failure's last lines;
3. host synchronizations per iteration of whole training loops under ``torch.cuda.set_sync_debug_mode``
   (``benchmarks/loop_syncs.py``), by mode, with the line where each fires;
4. ``benchmarks/gpu_throughput.py --compile``: images/s of ours, the baseline and the bound against the targets,
   with a ``torch.profiler`` table where a target is missed;
5. the accelerator forms: ``carrot_quantile.py``, ``queue_memory.py --device cuda``, ``class_blocks_cost.py``,
   ``tsc_targets.py`` at C = 1000;
6. a real recipe: SupCon, resnet18 at 32 px, on generated files in CIFAR-10's layout (``--dataset cifar10``),
   ``--deterministic``: two runs bit-equal, 2 epochs + ``--resume`` to 5 bit-equal to 5; epoch time; linear
   evaluation;
7. the field: every ``--method`` (and ``--carrot``, CE, CE + SupCon) on digits at 32 px with resnet18, one seed,
   pre-training + linear evaluation: seconds per epoch and test accuracy;
8. a user's recipe as the user runs it: ``bash scripts/supcon_cifar.sh cifar10`` (ResNet-50, batch 1024, the
   defaults the device resolves to, ``compile: true``) for a few epochs on 50,000 generated images in CIFAR-10's
   layout, alone on the machine: its images/s against section 4's best rate for resnet50 at batch 1024, and the
   1000-epoch projection from its own wall clock.

Without a CUDA device (and with ``--dry-run``) every section runs at tiny sizes on the CPU (``resnet_nano`` at 8 px;
sections 3 and 7 a few of their modes and runs: the suite runs each of them), and a section that needs CUDA reports
``skipped: no CUDA`` when its CPU run worked (``failed`` when it did not): never ``passed``.
"""
from benchmarks.gpu_check.common import ROOT, Context, outcome, run, tail  # noqa: F401
from benchmarks.gpu_check.cuda_tests import cuda_test_files  # noqa: F401
from benchmarks.gpu_check.field import FIELD_DRY_RUN, field_runs, section_field  # noqa: F401
from benchmarks.gpu_check.fork import Forked, forked  # noqa: F401
from benchmarks.gpu_check.plan import SECTIONS, ArgumentError, main, parse_sections  # noqa: F401
from benchmarks.gpu_check.recipe import state_differences, write_cifar10  # noqa: F401
from benchmarks.gpu_check.user_recipe import benchmark_best, epoch_ends, user_recipe_rates  # noqa: F401
