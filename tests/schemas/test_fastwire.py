"""The controller's strict msgspec frame decoder gives exactly the pydantic decoder's verdicts and values.

``codec.decode_frame_view`` tries the struct that schemas/fastwire.py derives from NodeFrame and falls
back to ``codec.decode_frame``; if the strict path ever accepted a document pydantic rejects, or decoded a
value differently, these tests see a different verdict or a different dump. Every document here also
goes through both columnar decoders (schemas/framecols.py, compiled and pure Python), held to the same.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer import errors
from healer.schemas import codec, fastwire, telemetry
from tests.schemas import test_framecols
from tests.schemas.test_schemas import good_frame, json_values

STRICT = fastwire.decoder(telemetry.NodeFrame)


def _dump(frame: Any) -> bytes:
    if isinstance(frame, pydantic.BaseModel):
        doc = frame.model_dump(by_alias=True)
    else:
        doc = msgspec.to_builtins(frame)
    return json.dumps(doc, sort_keys=True).encode()  # tells 1 from 1.0


def verdict(decode: Any, data: bytes) -> tuple[str, str | bytes]:
    try:
        return "ok", _dump(decode(data))
    except errors.DecodeError as e:
        return e.reason, e.detail


def assert_same(data: bytes) -> tuple[str, str | bytes]:
    """The strict decoder and both columnar decoders (tests/schemas/test_framecols.py) give pydantic's
    verdict and values for ``data``."""
    reference = verdict(codec.decode_frame, data)
    assert verdict(codec.decode_frame_view, data) == reference
    assert test_framecols.assert_columns_same(data) == reference[0]
    return reference


def strict_accepts(data: bytes) -> bool:
    try:
        STRICT.decode(data)
    except fastwire.Error:
        return False
    return True


def doc() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(codec.encode(good_frame()))
    return out


def test_a_good_frame_takes_the_strict_path_with_identical_values() -> None:
    data = codec.encode(good_frame())
    assert strict_accepts(data)
    view = codec.decode_frame_view(data)
    assert not isinstance(view, telemetry.NodeFrame)
    assert assert_same(data)[0] == "ok"
    assert view.gpus[3].power_limit_w == good_frame().gpus[3].power_limit_w


def set_path(d: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target: Any = d
    *head, last = path.split(".")
    for part in head:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "strict", "reason"),
    [
        ("seq", 3.0, False, "ok"),  # pydantic's lax int takes a whole float
        ("seq", 3.5, False, "validation"),
        ("gpus.0.ecc_dbe_volatile", True, False, "ok"),  # lax int takes a bool
        ("gpus.0.row_remap_pending", 1, False, "ok"),  # lax bool takes 0/1
        ("gpus.0.row_remap_pending", "yes", False, "ok"),
        ("gpus.0.temp_c", "41.5", False, "ok"),  # lax float takes a numeric string
        ("gpus.0.temp_c", 41, True, "ok"),  # an int for a float is not coercion in either
        ("gpus.0.ecc_sbe_volatile", 2**63 - 1, True, "ok"),
        ("gpus.0.ecc_sbe_volatile", 2**64 - 1, False, "ok"),  # past i64: pydantic's path, up to u64
        ("gpus.0.ecc_sbe_volatile", 2**64, False, "validation"),
        ("gpus.0.ecc_sbe_volatile", -1, False, "validation"),
        ("gpus.0.util_gpu_pct", 100.5, False, "validation"),
        ("node", "gpu-01\n", False, "validation"),  # Python's $ would take the newline; \\Z does not
        ("node", "gpu-01", True, "ok"),
        ("node", "-gpu", False, "validation"),
        ("gpus.0.model", "é" * 96, True, "ok"),  # lengths count characters in both
        ("gpus.0.model", "é" * 97, False, "validation"),
        ("gpus.0.uuid", None, True, "ok"),
        ("gpus_expected", 257, False, "validation"),
        ("schema", "healer.telemetry.v3", False, "schema_version"),
        ("source", "martian", False, "validation"),
        ("gpus.1.surprise", 1, False, "validation"),
        ("surprise", {}, False, "validation"),
        ("ts", 0, False, "validation"),
    ],
)
def test_edge_values_get_the_same_verdict_on_both_paths(
    path: str, value: Any, strict: bool, reason: str
) -> None:
    data = json.dumps(set_path(doc(), path, value)).encode()
    assert strict_accepts(data) is strict
    assert assert_same(data)[0] == reason


@pytest.mark.parametrize(
    "data",
    [
        b'{"schema": "healer.telemetry.v1", "schema": "healer.telemetry.v1"}',
        json.dumps(doc()).replace('"seq": 3', '"seq": 1e400').encode(),
        json.dumps(doc()).replace('"temp_c": ', '"temp_c": NaN, "x": ', 1).encode(),
        json.dumps(doc()).replace('"boot_id": "b"', '"boot_id": "\\ud800"').encode(),
        json.dumps(doc()).replace('"seq": 3', '"seq": 3, "seq": 4').encode(),
        json.dumps({**doc(), "gpus": [doc()["gpus"][0]] * 257}).encode(),
        json.dumps({k: v for k, v in doc().items() if k != "schema"}).encode(),
        b"[]",
        b"",
        b"\xff\xfe",
    ],
)
def test_malformed_documents_get_the_same_verdict_on_both_paths(data: bytes) -> None:
    assert_same(data)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(field=st.sampled_from(sorted(telemetry.GpuSample.model_fields)), value=json_values)
def test_any_gpu_field_value_gets_the_same_verdict(field: str, value: object) -> None:
    assert_same(json.dumps(set_path(doc(), f"gpus.3.{field}", value)).encode())


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(field=st.sampled_from(sorted(doc())), value=json_values)
def test_any_frame_field_value_gets_the_same_verdict(field: str, value: object) -> None:
    assert_same(json.dumps(set_path(doc(), field, value)).encode())


@given(st.binary(max_size=300))
def test_random_bytes_get_the_same_verdict(data: bytes) -> None:
    assert_same(data)


def test_models_it_cannot_translate_exactly_are_refused() -> None:
    class Validated(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        x: int

        @pydantic.field_validator("x")
        @classmethod
        def _even(cls, v: int) -> int:
            return v

    class Mapping(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        x: dict[str, int]

    class Unanchored(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        x: str = pydantic.Field(pattern="[a-z]+")

    class Lenient(pydantic.BaseModel):
        x: int

    for model, problem in [
        (Validated, "validators"),
        (Mapping, "not translated"),
        (Unanchored, "anchored"),
        (Lenient, "config"),
    ]:
        with pytest.raises(TypeError, match=problem):
            fastwire.struct_for(model)
