"""The anomaly model: learns healthy GPU behaviour and scores how far each GPU is from it.

Modules: ``features`` (window features, numpy, whole fleet at once), ``window`` (the controller's cheap
ingest ring), ``thermal`` (per-GPU and per-node baselines learned on the watched fleet), ``model``
(IsolationForest + thermal components + counter rates, combined and calibrated), ``cfar`` (each
deciding component's threshold per pool from the watched fleet's own tail, shadow until calibrated),
``persist`` (skops +
JSON model card), ``scoring`` (the controller's API: score, explain, export/import state), ``state``
(the learned state in a key-value store), ``calibration`` (learning a fleet's baselines from recorded
telemetry), ``dataset`` (windows from recordings or the stream), ``training`` and ``diagnosis``
(what drove a score). The evaluation against ground truth and the rules (``healer model eval``) and the
backtests on recordings (``--recorded``, ``healer rules backtest``) are evaluation code:
``healer.evals.model_eval`` and ``healer.evals.backtest``. See
docs/anomaly.md.
"""
