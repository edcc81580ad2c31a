"""The machinery of ``sweep.py``: ``plan.py`` (a sweep file into cells and stages, each command line through its
script's parser), ``launch.py`` (a stage as a process and its record; the local pool and the SLURM launcher) and
``report.py`` (table.md, figure.png, sweep.json); ``entries.py`` (a file's entries as command lines and folder
names), ``tracking.py`` (the sweep's runs in the trackers) and ``tuning/`` (a tuned sweep's tuning)."""
