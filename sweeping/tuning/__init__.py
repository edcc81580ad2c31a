"""A tuned sweep's tuning (docs/USAGE.md, "Tuning"): ``spec.py`` (the ``tune:`` section read and checked),
``tuner.py`` (the ``Tuner``: the trials, their budget, the best values), ``confirm.py`` (``confirm:``'s runs and
choice), ``trials.py`` (a trial's run
on this machine or through SLURM, its epochs' values), ``status.py`` (a study's state as recorded), ``report.py``
(the tuning's tables and figures) and ``show.py`` (what ``sweep.py`` prints of it: ``--status``, ``--dry-run``)."""
