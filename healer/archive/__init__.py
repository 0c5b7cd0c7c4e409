"""The incident archive: the feed kept in an embedded database, and the figures read from it.

``consumer`` is ``healer archive``, a durable consumer of ``HEALER_INCIDENTS`` writing every event into
SQLite (``store``: events, incidents, actions, ladder outcomes, operators' verdicts), idempotent by event
id. ``figures`` computes the report (``healer report``) from the archive, ``page`` renders it as one
self-contained page. docs/archive.md is the contract: the schema, the figures and their definitions.
"""
