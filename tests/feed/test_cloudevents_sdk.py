"""CloudEvents interoperability, checked with the official SDK (``cloudevents`` on PyPI, both its APIs).

What healer emits (``healer forward`` in structured and binary mode, to a real HTTP receiver) must parse
with the SDK's ``from_http``; what the SDK emits (``to_structured``/``to_binary``) must be accepted by
healer's consumers, extension attributes and ``dataschema`` included.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import jsonschema
import orjson
import pytest
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent
from cloudevents.v1 import http as ce_v1_http

from healer import errors
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.feed import envelope, forward, tail, webhook
from healer.schemas import codec, incidents
from tests import conftest
from tests.feed import helpers
from tests.feed.test_forward import FAST, Running

SCHEMA_FILE = "docs/schemas/incident-event.v1.json"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _parse_core(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], Any]:
    ev = ce_http.from_http(ce_http.HTTPMessage(headers=headers, body=body), JSONFormat())
    return dict(ev.get_attributes()), ev.get_data()


def _parse_v1(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], Any]:
    ev = ce_v1_http.from_http(headers, body)
    return dict(ev.get_attributes()), ev.get_data()


PARSERS: dict[str, Callable[[dict[str, str], bytes], tuple[dict[str, Any], Any]]] = {
    "core": _parse_core,
    "v1": _parse_v1,
}


def _with_extensions(n: int) -> bytes:
    """A healer incident event as another producer might write it: extensions, dataschema, a charset."""
    doc = orjson.loads(codec.encode(helpers.event(n)))
    doc.update(
        traceparent=TRACEPARENT,
        partitionkey="gpu-node-1",
        sequence=7,
        dataschema="https://healer.invalid/schemas/incident-event.v1.json",
        datacontenttype="application/json; charset=utf-8",
    )
    return orjson.dumps(doc)


def _foreign() -> bytes:
    return orjson.dumps(
        {
            "specversion": "1.0",
            "id": "other-1",
            "source": "urn:example:other",
            "type": "com.example.other.v1",
            "time": "2026-11-30T00:00:00Z",
            "traceparent": TRACEPARENT,
            "data": {"hello": "world", "n": 1},
        }
    )


@pytest.fixture
def receiver() -> Iterator[helpers.Receiver]:
    r = helpers.Receiver(embedded.free_port())
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.mark.parametrize("mode", webhook.CONTENT_MODES)
async def test_the_official_sdk_parses_every_event_healer_forwards(
    nats_bus: natsbus.NatsBus, receiver: helpers.Receiver, mode: webhook.ContentMode
) -> None:
    stored = [
        codec.encode(helpers.event(1)),
        _with_extensions(2),
        codec.encode(helpers.rules_rejected("rules-1")),
        _foreign(),
    ]
    subjects = [helpers.SUBJ.incident(incidents.Change.OPENED, "gpu-node-1")] * 2 + [
        helpers.SUBJ.rules_rejected,
        helpers.SUBJ.incident(incidents.Change.OPENED, "other"),
    ]
    for subject, body in zip(subjects, stored, strict=True):
        await helpers.publish_raw(nats_bus, subject, body)
    run = Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, FAST, content_mode=mode))
    await conftest.until(lambda: run.count("healer_forward_delivered_total") == len(stored))
    await run.finish()
    assert run.count("healer_forward_malformed_total") == 0

    requests = receiver.snapshot()
    assert len(requests) == len(stored)
    for req, body in zip(requests, stored, strict=True):
        has_ce_headers = any(h.lower().startswith("ce-") for h in req.headers)
        assert has_ce_headers is (mode == "binary")
        doc = orjson.loads(body)
        for name, parse in PARSERS.items():
            attrs, data = parse(req.headers, req.body)
            assert data == doc["data"], name
            for attr, value in doc.items():
                if attr == "data":
                    continue
                got = attrs[attr]
                if attr == "time":
                    got = got if isinstance(got, str) else got.isoformat()
                    assert datetime.fromisoformat(got) == datetime.fromisoformat(value), name
                elif attr == "sequence" and mode == "binary":
                    assert got == str(value), name  # a header carries the canonical string form
                else:
                    assert got == value, (name, attr)
        assert webhook.event_json(req.headers, req.body) == body or mode == "binary"
        # and healer reads its own binary-mode message back to the same event
        assert envelope.classify(webhook.event_json(req.headers, req.body)).envelope.id == doc["id"]


def _incident_doc(n: int) -> dict[str, Any]:
    return dict(orjson.loads(codec.encode(helpers.event(n))))


@pytest.mark.parametrize("convert", [ce_http.to_structured, ce_http.to_binary], ids=["structured", "binary"])
def test_healer_accepts_what_the_official_sdk_emits(convert: Callable[..., ce_http.HTTPMessage]) -> None:
    doc = _incident_doc(5)
    attributes = {
        "id": doc["id"],
        "source": doc["source"],
        "type": doc["type"],
        "subject": doc["subject"],
        "time": datetime.fromisoformat(doc["time"]),
        "datacontenttype": "application/json; charset=utf-8",
        "dataschema": "https://healer.invalid/schemas/incident-event.v1.json",
        "traceparent": TRACEPARENT,
        "partitionkey": "gpu-node-1",
    }
    msg = convert(SdkEvent(attributes=attributes, data=doc["data"]), JSONFormat())
    item = envelope.classify(webhook.event_json(msg.headers, msg.body))
    assert item.incident is not None
    ev = item.incident
    assert ev.data == helpers.event(5).data.model_copy(update={"summary": doc["data"]["summary"]})
    assert ev.extensions == {"traceparent": TRACEPARENT, "partitionkey": "gpu-node-1"}
    assert ev.dataschema == attributes["dataschema"]
    assert ev.datacontenttype == "application/json; charset=utf-8"
    again = orjson.loads(codec.encode(ev))
    assert again["traceparent"] == TRACEPARENT, "extensions are passed on when healer re-encodes"
    assert codec.decode_incident(codec.encode(ev)) == ev


def test_sdk_events_with_defaults_are_accepted() -> None:
    """The SDK leaves out ``datacontenttype`` unless told; JSON data is then implied."""
    doc = _incident_doc(6)
    attributes = {k: doc[k] for k in ("id", "source", "type", "subject")}
    sdk = SdkEvent(attributes={**attributes, "time": datetime.fromisoformat(doc["time"])}, data=doc["data"])
    body = ce_http.to_structured(sdk, JSONFormat()).body
    assert b"datacontenttype" not in body
    assert codec.decode_incident(body).datacontenttype == "application/json"


def test_specversion_is_required_on_the_wire() -> None:
    doc = _incident_doc(7)
    del doc["specversion"]
    raw = orjson.dumps(doc)
    for decode in (codec.decode_incident, envelope.classify):
        with pytest.raises(errors.DecodeError, match="specversion"):
            decode(raw)
    with pytest.raises(ValueError, match="specversion"):
        incidents.IncidentEvent.model_validate_json(raw)
    # in code the default still applies
    assert helpers.event(7).specversion == "1.0"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"Trace-Parent": "x"}, "not a CloudEvents attribute name"),
        ({"ratio": 0.5}, "string, integer or boolean"),
        ({"nested": {"a": 1}}, "string, integer or boolean"),
        ({"datacontenttype": "text/plain"}, "datacontenttype"),
        ({"specversion": "0.3"}, "specversion"),
    ],
)
def test_what_the_spec_forbids_is_still_refused(change: dict[str, object], match: str) -> None:
    doc = {**_incident_doc(8), **change}
    with pytest.raises(errors.DecodeError, match=match):
        codec.decode_incident(orjson.dumps(doc))


def test_healer_built_events_carry_no_empty_optional_attributes() -> None:
    doc = _incident_doc(9)
    assert "dataschema" not in doc
    assert doc["datacontenttype"] == "application/json"
    assert doc["specversion"] == "1.0"


async def test_tail_accepts_and_passes_on_extension_attributes(nats_bus: natsbus.NatsBus) -> None:
    raw = _with_extensions(3)
    await helpers.publish_raw(nats_bus, helpers.SUBJ.incident(incidents.Change.OPENED, "gpu-node-1"), raw)
    items: list[envelope.Item] = []
    bad: list[errors.DecodeError] = []
    await tail.read(nats_bus, helpers.SUBJ, tail.Query(), items.append, lambda _s, _q, e: bad.append(e))
    assert bad == []
    assert [i.incident is not None for i in items] == [True]
    line = orjson.loads(tail.as_json_line(items[0]))
    assert line["traceparent"] == TRACEPARENT
    assert line["sequence"] == 7
    incident = items[0].incident
    assert incident is not None
    assert incident.extensions["partitionkey"] == "gpu-node-1"
    assert " opened " in tail.render(items[0])


def test_the_published_json_schema_takes_valid_cloudevents_and_refuses_invalid_ones() -> None:
    schema = orjson.loads((pathlib.Path(__file__).resolve().parents[2] / SCHEMA_FILE).read_bytes())
    validator = jsonschema.Draft202012Validator(schema)
    doc = _incident_doc(11)
    sdk = SdkEvent(
        attributes={
            **{k: doc[k] for k in ("id", "source", "type", "subject")},
            "time": datetime.fromisoformat(doc["time"]),
            "traceparent": TRACEPARENT,
        },
        data=doc["data"],
    )
    for good in (
        doc,
        orjson.loads(_with_extensions(11)),
        orjson.loads(ce_http.to_structured(sdk, JSONFormat()).body),
    ):
        validator.validate(good)
    without_specversion = {k: v for k, v in doc.items() if k != "specversion"}
    for bad in (
        without_specversion,
        {**doc, "ratio": 0.5},
        {**doc, "Trace-Parent": "x"},
        {**doc, "datacontenttype": "text/plain"},
        {**doc, "data": {**doc["data"], "unknown": 1}},
    ):
        assert not validator.is_valid(bad), bad
