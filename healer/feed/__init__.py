"""Consumers of the incident feed (stream ``HEALER_INCIDENTS``): reading it and forwarding it.

``tail`` reads the feed with an ephemeral ordered consumer for people (``healer incidents tail``);
``forward`` delivers it at-least-once to an HTTP receiver from a durable consumer (``healer forward``),
as CloudEvents in structured or binary mode (``webhook``); ``alertmanager`` sends it through the same
delivery to Alertmanager as alerts (``healer alertmanager``). All decode at the edge with
``envelope.classify`` and survive anything malformed in the stream.
"""
