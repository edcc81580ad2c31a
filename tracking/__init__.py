"""The experiment trackers: every call to W&B, MLflow and TensorBoard lives here (``trackers.py``: ``--tracker``, a
run's W&B and MLflow runs, the calls a sweep's records make; ``tensorboard.py``: the run folder's writer). It imports
only the ground floor (``core``), so the run log below the training code can use it."""
