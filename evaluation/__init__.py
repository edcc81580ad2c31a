"""Evaluation of a frozen encoder: ``knn.py`` (the weighted kNN classifier, the ``--knn_every`` monitor, feature
extraction) and ``probes.py`` (few-shot and within-superclass probes, main_linear.py's ``LinearProbe``)."""
