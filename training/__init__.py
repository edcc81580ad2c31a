"""Training: what a run does between its options and its data, by concern:

- ``schedule.py`` (the learning-rate schedule, the optimizers);
- ``loop.py`` (the loop inside an epoch, the evaluation, the ``Trainer`` protocol), ``steps.py`` (the trainers of
  main_supcon.py and main_ce.py), ``carrot.py`` (CARROT as they add it), ``chunks.py`` (gradient caching),
  ``memory_queue.py`` (the queue and key encoder);
- ``monitors.py`` (collapse statistics).

It stands on ``runtime`` (device, RNG, distributed, checkpoints, the run folder and log) and imports the ground
floor (``core``), the loss files, the registry and ``networks``; never data, evaluation or configuration.
"""
