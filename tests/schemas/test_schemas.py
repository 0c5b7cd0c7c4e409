"""Wire schemas: committed JSON Schemas match the models; bad input is a DecodeError, never a crash."""

from __future__ import annotations

import contextlib
import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer import errors
from healer.schemas import codec, commands, events, export, incidents, telemetry
from healer.sim import node_source

ROOT = pathlib.Path(__file__).resolve().parents[2]


def good_frame() -> telemetry.NodeFrame:
    src = node_source.SimSource("n1", gpus=8, seed=1)
    return telemetry.NodeFrame(
        node="n1", ts=1.7e9, seq=3, boot_id="b", agent_version="t", source="sim", gpus_expected=8,
        gpus=src.sample().gpus,
    )  # fmt: skip


def test_committed_json_schemas_match_the_models() -> None:
    rendered = export.render()
    for name, text in rendered.items():
        path = ROOT / "docs" / "schemas" / name
        assert path.exists(), f"{path} missing: run `healer schema export`"
        assert path.read_text() == text, f"{path} drifted from the models: run `healer schema export`"


def test_frame_round_trips_through_the_codec() -> None:
    frame = good_frame()
    assert codec.decode_frame(codec.encode(frame)) == frame
    assert json.loads(codec.encode(frame))["schema"] == "healer.telemetry.v1"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(schema="healer.telemetry.v3"), "schema_version"),
        (lambda d: d.pop("schema"), "schema_version"),
        (lambda d: d.update(node="bad node"), "validation"),
        (lambda d: d.update(seq=-1), "validation"),
        (lambda d: d["gpus"][0].update(temp_c="hot"), "validation"),
        (lambda d: d["gpus"][0].update(util_gpu_pct=250), "validation"),
        (lambda d: d["gpus"][0].update(surprise=1), "validation"),
        (lambda d: d.update(source="martian"), "validation"),
    ],
)
def test_bad_frames_are_rejected_with_a_reason(mutate: object, reason: str) -> None:
    doc = json.loads(codec.encode(good_frame()))
    assert callable(mutate)
    mutate(doc)
    with pytest.raises(errors.DecodeError) as info:
        codec.decode_frame(json.dumps(doc).encode())
    assert info.value.reason == reason
    assert info.value.kind == "frame"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temp_c", 1e300),
        ("temp_c", -273.0),
        ("mem_temp_c", 400.0),
        ("power_w", -100.0),
        ("power_limit_w", 1e9),
        ("sm_clock_mhz", 1e7),
        ("mem_total_mib", 1e12),
        ("energy_j", -1.0),
        ("pcie_width", 1024),
        ("nvlink_links_up", 100_000),
        ("ecc_dbe_volatile", -1),
    ],
)
def test_physically_impossible_readings_are_rejected_and_named(field: str, value: float) -> None:
    """Both decoders (the controller's strict one first) refuse a reading past its physical bounds and
    name the field, for the per-field count; nothing from the input becomes a field name."""
    doc = json.loads(codec.encode(good_frame()))
    doc["gpus"][3][field] = value
    data = json.dumps(doc).encode()
    for decode in (codec.decode_frame, codec.decode_frame_view):
        with pytest.raises(errors.DecodeError) as info:
            decode(data)
        assert (info.value.reason, info.value.fields) == ("validation", (f"gpus.{field}",))


def test_an_unknown_field_is_not_counted_by_its_name() -> None:
    doc = json.loads(codec.encode(good_frame()))
    doc["gpus"][0]["attacker_chosen_name"] = -1
    with pytest.raises(errors.DecodeError) as info:
        codec.decode_frame(json.dumps(doc).encode())
    assert info.value.fields == ()


def test_unknown_schema_version_names_both_versions() -> None:
    doc = json.loads(codec.encode(good_frame()))
    doc["schema"] = "healer.telemetry.v7"
    with pytest.raises(
        errors.DecodeError, match=r"'healer.telemetry.v7' is not supported.*healer.telemetry.v1"
    ):
        codec.decode_frame(json.dumps(doc))


def test_oversized_message_is_refused_before_parsing() -> None:
    with pytest.raises(errors.DecodeError) as info:
        codec.decode_frame(b" " * (codec.MAX_MESSAGE_BYTES + 1))
    assert info.value.reason == "too_large"


def decoded_or_reason(data: bytes) -> str:
    """ "ok" for a valid frame, else the DecodeError reason; any other exception fails the test."""
    try:
        codec.decode_frame(data)
    except errors.DecodeError as e:
        return e.reason
    return "ok"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=30,
)


@given(st.binary(max_size=400))
def test_random_bytes_never_crash_any_decoder(data: bytes) -> None:
    for decode in (codec.decode_frame, codec.decode_event, codec.decode_command, codec.decode_incident):
        with contextlib.suppress(errors.DecodeError):
            decode(data)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(field=st.sampled_from(sorted(telemetry.GpuSample.model_fields)), value=json_values)
def test_hostile_field_values_are_accepted_or_rejected_cleanly(field: str, value: object) -> None:
    doc = json.loads(codec.encode(good_frame()))
    doc["gpus"][3][field] = value
    reason = decoded_or_reason(json.dumps(doc).encode())
    assert reason in {"ok", "validation"}


@given(doc=st.dictionaries(st.sampled_from(["schema", "node", "ts", "seq", "gpus", "x"]), json_values))
def test_hostile_documents_never_crash_the_frame_decoder(doc: dict[str, object]) -> None:
    assert decoded_or_reason(json.dumps(doc).encode()) in {"schema_version", "validation"}


def test_decode_stats_count_by_kind_and_reason() -> None:
    stats = codec.DecodeStats()
    for data in [b"{", b'{"schema":"x"}', codec.encode(good_frame())]:
        try:
            codec.decode_frame(data)
            stats.ok("frame")
        except errors.DecodeError as e:
            stats.bad(e)
    assert stats.rejected == {("frame", "json"): 1, ("frame", "schema_version"): 1}
    assert stats.accepted["frame"] == 1
    assert stats.total_rejected == 2


def test_incident_event_is_a_cloudevent() -> None:
    data = incidents.IncidentData(
        incident_id="inc-1", rule_id="ecc-uncorrectable", severity="critical", node="n1", gpu_index=3,
        state="open", summary="DBE on GPU 3", evidence={"ecc_dbe_volatile": 1}, mode="enforce",
    )  # fmt: skip
    ev = incidents.build(event_id="e-1", cluster="prod", change=incidents.Change.OPENED, data=data, ts=1.7e9)
    doc = json.loads(codec.encode(ev))
    assert doc["specversion"] == "1.0"
    assert doc["type"] == "io.healer.incident.opened.v1"
    assert doc["source"] == "healer://prod/controller"
    assert doc["subject"] == "node/n1/gpu/3"
    assert doc["time"].startswith("2023-11-14T22:13:20")
    assert codec.decode_incident(codec.encode(ev)).change == "opened"


def test_a_domain_incident_is_v2_with_its_domain_and_every_other_incident_stays_v1() -> None:
    plain = incidents.IncidentData(
        incident_id="inc-1", rule_id="ib-down", severity="major", node="n1", state="open", summary="s",
        mode="enforce",
    )  # fmt: skip
    doc = json.loads(
        codec.encode(
            incidents.build(event_id="e", cluster="c", change=incidents.Change.OPENED, data=plain, ts=1e9)
        )
    )
    assert doc["data"]["schema"] == "healer.incident.v1"
    assert "domain" not in doc["data"], "a v1 incident is what a v1 decoder accepts"
    assert "domain" not in json.loads(codec.encode(plain))
    domain = incidents.Domain(
        key="switch", value="leaf-07", suspected="switch leaf-07", signal_rule="ib-down",
        members=["n1", "n2", "n3"], member_incidents=["i1", "i2", "i3"], member_count=3, size=16,
    )  # fmt: skip
    data = plain.model_copy(
        update={"schema_": incidents.SCHEMA_V2, "domain": domain, "node": "switch.leaf-07"}
    )
    ev = incidents.build(event_id="e", cluster="c", change=incidents.Change.OPENED, data=data, ts=1e9)
    doc = json.loads(codec.encode(ev))
    assert doc["type"] == "io.healer.incident.opened.v1", "the envelope is unchanged"
    assert doc["data"]["schema"] == "healer.incident.v2"
    assert doc["data"]["domain"]["members"] == ["n1", "n2", "n3"]
    assert codec.decode_incident(codec.encode(ev)).data.domain == domain
    v1_with_domain = dict(doc, data={**doc["data"], "schema": "healer.incident.v1"})
    with pytest.raises(errors.DecodeError):
        codec.decode_incident(json.dumps(v1_with_domain))


def test_event_and_command_round_trip() -> None:
    ev = events.new("n1", "xid", gpu_index=2, xid=79, message="fell off the bus")
    assert codec.decode_event(codec.encode(ev)) == ev
    cmd = commands.Command(
        id="c1",
        node="n1",
        action="set_power_limit",
        watts=500,
        fencing_token=3,
        issued_at=1.0,
        expires_at=2.0,
    )
    assert codec.decode_command(codec.encode(cmd)) == cmd
