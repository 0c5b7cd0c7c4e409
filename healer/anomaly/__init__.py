"""The anomaly model: learns healthy GPU behaviour and scores how far each GPU is from it.

Modules: ``features`` (window features, numpy, whole fleet at once), ``window`` (the controller's cheap
ingest ring), ``thermal`` (per-GPU and per-node baselines learned on the watched fleet), ``model``
(IsolationForest + thermal components + counter rates, combined and calibrated), ``persist`` (skops +
JSON model card), ``scoring`` (the controller's API: score, explain, export/import state), ``state``
(the learned state in a key-value store), ``calibration`` (learning a fleet's baselines from recorded
telemetry), ``dataset`` (windows from recordings or the stream), ``training``, ``evaluation`` and
``diagnosis`` (against ground truth and the rules). See docs/anomaly.md.
"""
