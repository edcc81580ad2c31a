"""Training: everything a run does between its options and its data, by concern:

- ``runtime.py`` (device, precision, seeds and RNG states), ``distributed.py`` (torchrun), ``schedule.py`` (the
  learning-rate schedule, SGD), ``checkpoint.py`` (atomic save, safe load, encoders from checkpoints);
- ``loop.py`` (the loop inside an epoch, the evaluation, the ``Trainer`` protocol), ``steps.py`` (the trainers of
  main_supcon.py and main_ce.py), ``chunks.py`` (gradient caching), ``memory_queue.py`` (the queue and key encoder);
- ``monitors.py`` (collapse statistics), ``run_folder.py`` (a run folder's name, check and lock), ``run_log.py``
  (metrics.csv, TensorBoard).

It imports the ground floor (``core``), the loss files, the registry and ``networks``; never data, evaluation or
configuration.
"""
