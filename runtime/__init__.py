"""The process ground that every command stands on, below data, training and the sweeps:

- ``device.py`` (the device, mixed precision and memory layout, compilation, deterministic kernels, the CPU
  allocator setting), ``rng.py`` (seeds and RNG states: what a checkpoint carries for an exact ``--resume``);
- ``distributed.py`` (torchrun: the process group, shards, gathers), ``checkpoint.py`` (atomic save, safe load,
  encoders from checkpoints);
- ``run_folder.py`` (a run folder's name, check and lock), ``run_log.py`` (metrics.csv, TensorBoard);
- ``processes.py`` (where every command starts its child processes).

It imports the ground floor (``core``) and ``networks``; nothing above them.
"""
