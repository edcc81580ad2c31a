"""Experiment trackers beside TensorBoard (``--tracker``)."""
