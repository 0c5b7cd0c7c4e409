"""The rule engine: SRE-written rule files parsed once, checked against the telemetry schema, and evaluated
for the whole fleet at once with numpy.

Modules, bottom up: ``metrics`` (what a rule may read), ``lexer`` and ``parser`` (the expression language,
never ``eval``), ``actions`` (the action catalog), ``spec`` (the rule-file document), ``loader`` (YAML with
file:line:column for every error), ``state`` (per-metric ring buffers for the fleet), ``evaluate``
(expression trees over that state), ``engine`` (``for``/``resolve`` hysteresis and event rules),
``series``/``baseline``/``ruletests`` (promtool-style unit tests) and ``schema`` (JSON Schema for editors).

The controller needs three calls: ``loader.load_paths`` (a RuleSet, or every error so it keeps the old
one), ``engine.Engine(ruleset)`` with ``ingest``/``ingest_event``, and ``Engine.evaluate(now)``.
"""
