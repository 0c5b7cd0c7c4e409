"""The anomaly model: learns healthy GPU behaviour from telemetry and scores how far each GPU is from it.

Modules: ``features`` (window features, numpy, whole fleet at once), ``window`` (the controller's cheap
ingest ring), ``model`` (IsolationForest + thermal regressions + counter rates, combined and calibrated),
``persist`` (skops + JSON model card), ``scoring`` (the controller's API), ``dataset`` (training data
from recordings or the stream), ``training``, ``evaluation`` (against ground truth and the rules).
See docs/anomaly.md.
"""
