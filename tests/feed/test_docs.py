"""docs/events.md stays true: every JSON example decodes, each event type has one, the tail line is real."""

from __future__ import annotations

import pathlib
import re

import orjson

from healer.feed import envelope, tail
from healer.schemas import incidents

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "events.md"


def examples() -> list[envelope.Item]:
    blocks = re.findall(r"```json\n(.*?)\n```", DOC.read_text(), flags=re.DOTALL)
    return [envelope.classify(block.encode()) for block in blocks]


def test_every_incident_type_has_a_valid_example() -> None:
    types = [item.envelope.type for item in examples() if item.incident is not None]
    assert sorted(types) == sorted(incidents.event_type(c) for c in incidents.Change)


def test_rules_rejected_example_has_the_documented_fields() -> None:
    (rejected,) = [i for i in examples() if i.rules_rejected is not None]
    text = DOC.read_text()
    for name in incidents.RulesRejectedData.model_fields:
        assert f"| `{name}` |" in text, name
    for name in incidents.RuleProblem.model_fields:
        assert f"| `errors[].{name}` |" in text, name
    assert orjson.loads(rejected.raw)["data"]["errors"]


def test_documented_tail_line_is_what_tail_prints() -> None:
    (action,) = [i for i in examples() if i.incident is not None and i.incident.change == "action"]
    assert f"\n{tail.render(action)}\n" in DOC.read_text()


def test_every_data_field_is_documented() -> None:
    text = DOC.read_text()
    for name, field in incidents.IncidentData.model_fields.items():
        assert f"| `{field.alias or name}` |" in text, name
    for name in incidents.ActionRecord.model_fields:
        assert f"| `{name}` |" in text, name
    for name in incidents.IncidentEvent.model_fields:
        assert f"| `{name}` |" in text, name


def test_the_documented_domain_incident_is_valid_v2_data() -> None:
    (block,) = re.findall(r"```json5\n(.*?)\n```", DOC.read_text(), flags=re.DOTALL)
    data = incidents.IncidentData.model_validate(orjson.loads(block))
    assert data.schema_ == incidents.SCHEMA_V2
    assert data.domain is not None
    assert ",".join(data.domain.members) == data.evidence["members"]
    for name in incidents.Domain.model_fields:
        assert f"`{name}`" in DOC.read_text(), name
