"""Evaluation and bench harnesses, outside the runtime packages: ``healer bench controller``
(``controller_bench``), ``healer bench power`` (``power_bench``, and the closed loop ``power_eval``) and
``healer bench stragglers`` (``straggler_eval``, ``straggler_sim_eval``). They drive the controller, the
simulator and simulated agents; no runtime package imports them (tests/test_imports.py), and the CLI
imports them only when a bench command runs.
"""
