"""The run around a trainer (``engine/run.py``): set-up (device, torchrun, the run folder and its run.json, seeds,
the resume check), ``fit`` (epochs, checkpoints, logging) and ``results.json``. Above configuration: it reads the
features' resume rules."""
