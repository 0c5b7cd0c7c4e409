"""Evaluation and bench harnesses, outside the runtime packages: ``healer bench controller``
(``controller_bench``), ``healer bench power`` (``power_bench``, and the closed loop ``power_eval``) and
``healer bench stragglers`` (``straggler_eval``, ``straggler_sim_eval``), and the backtest on recordings
behind ``healer model eval --recorded`` and ``healer rules backtest`` (``backtest``, reading with
``backtest_input``, counting with ``backtest_figures``, grouping GPU firings node-wide as the controller
does with ``grouping``). They drive the controller, the
simulator and simulated agents; no runtime package imports them (tests/test_imports.py), and the CLI
imports them only when a bench or backtest command runs.
"""
