"""Both columnar frame decoders give exactly codec's verdicts, and exactly the values pydantic reads.

``framecols.decode_into`` (the compiled decoder, which leaves every document it cannot decide exactly to
Python) and ``framecols.decode_into_python`` (the pure-Python path, what runs without a C compiler) are
held to the reference ``codec.decode_frame`` here, and on every document tests/schemas/test_fastwire.py
feeds the strict decoder (its ``assert_same`` calls ``assert_columns_same``): the same error reason and
detail, or the same header values (types included) and the same plane rows, NaN for null, the sign of
zero included. If the compiled decoder ever accepted a document pydantic rejects, or read a number
differently, these tests see it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healer import errors
from healer.evals import frame_publisher
from healer.schemas import codec, fabric, fastwire, framecols, telemetry
from tests.schemas.test_schemas import good_frame

Decode = Callable[[bytes, framecols.F64, int], framecols.Frame]
DECODERS: dict[str, Decode] = {"python": framecols.decode_into_python}
if framecols.ACCELERATED:
    DECODERS["compiled"] = framecols.decode_into
HEADER = (
    "schema_", "node", "ts", "seq", "boot_id", "agent_version", "source", "gpus_expected",
    "fabric_manager_up", "gpu_count", "max_index", "has_ports", "lax",
)  # fmt: skip
ROW = 5
"""Frames are written from this row of the plane (not 0: an offset bug shows)."""


def reference(data: bytes) -> tuple[str, Any]:
    """What a columnar decoder must give: codec's error, or pydantic's values as header and rows."""
    try:
        frame = codec.decode_frame(data)
    except errors.DecodeError as e:
        return e.reason, e.detail
    try:
        framecols._STRICT.decode(data)
        lax = False
    except fastwire.Error:
        lax = True
    header = {
        "schema_": frame.schema_, "node": frame.node, "ts": frame.ts, "seq": frame.seq,
        "boot_id": frame.boot_id, "agent_version": frame.agent_version, "source": frame.source,
        "gpus_expected": frame.gpus_expected, "fabric_manager_up": frame.fabric_manager_up,
        "gpu_count": len(frame.gpus), "max_index": max((g.index for g in frame.gpus), default=-1),
        "has_ports": frame.ports is not None, "lax": lax,
    }  # fmt: skip
    rows = [
        [math.nan if (v := getattr(g, c)) is None else float(v) for c in framecols.COLUMNS]
        for g in frame.gpus
    ]
    return "ok", (_typed(header), rows, frame.gpus, frame.ports)


def _typed(header: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {k: (type(v), v) for k, v in header.items()}


def columnar(decode: Decode, data: bytes) -> tuple[str, Any]:
    plane = np.full((ROW + framecols.ROWS_MAX, framecols.WIDTH), -7.0)
    try:
        f = decode(data, plane, ROW)
    except errors.DecodeError as e:
        return e.reason, e.detail
    header = _typed({k: getattr(f, k) for k in HEADER})
    return "ok", (header, plane[ROW : ROW + f.gpu_count].tolist(), f.gpus, f.ports)


def _same_rows(got: list[list[float]], want: list[list[float]]) -> bool:
    a, b = np.array(got, dtype=np.float64), np.array(want, dtype=np.float64)
    return (
        a.shape == b.shape
        and np.array_equal(a, b, equal_nan=True)
        and np.array_equal(np.signbit(a), np.signbit(b))  # 0.0 and -0.0 told apart
    )


def _dump(objects: Any) -> Any:
    """GPUs or ports as plain data (pydantic models and msgspec structs alike)."""
    if objects is None:
        return None
    return [
        o.model_dump()
        if isinstance(o, pydantic.BaseModel)
        else {k: getattr(o, k) for k in o.__struct_fields__}
        for o in objects
    ]


def assert_columns_same(data: bytes) -> str:
    """Every columnar decoder gives the reference's verdict and values for ``data``; its reason."""
    want = reference(data)
    for name, decode in DECODERS.items():
        got = columnar(decode, data)
        assert got[0] == want[0], (name, got, want)
        if want[0] != "ok":
            assert got == want, name
            continue
        (h, rows, gpus, ports), (wh, wrows, wgpus, wports) = got[1], want[1]
        assert h == wh, name
        assert _same_rows(rows, wrows), (name, rows, wrows)
        assert _dump(gpus) == _dump(wgpus), name  # the objects decoded on first use
        assert _dump(ports) == _dump(wports), name
    return want[0]


def compiled_decides(data: bytes) -> bool:
    """The compiled decoder decided ``data`` itself instead of leaving it to the pure-Python path."""
    plane = np.empty((framecols.ROWS_MAX, framecols.WIDTH))
    return framecols.compiled().decode(data, plane, 0) is not None


def test_the_compiled_decoder_is_built_where_ci_runs() -> None:
    """pip builds it with the machine's C compiler; CI has one, so there it must be in use."""
    if not framecols.ACCELERATED:
        if os.environ.get("CI"):
            pytest.fail("healer/schemas/_framec.c was not built: the controller decodes in pure Python")
        pytest.skip("the compiled decoder was not built (no C compiler at install)")
    assert framecols.compiled() is not None


needs_compiled = pytest.mark.skipif(not framecols.ACCELERATED, reason="the compiled decoder was not built")


def doc() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(codec.encode(good_frame()))
    return out


def ports_doc() -> dict[str, Any]:
    port = fabric.PortSample(device="mlx5_0", port=1, link_layer="InfiniBand", state=4, phys_state=5,
                             rate_gbps=400.0, symbol_error=0)  # fmt: skip
    return {**doc(), "schema": telemetry.SCHEMA_V2, "ports": [json.loads(port.model_dump_json())],
            "fabric_manager_up": True}  # fmt: skip


@needs_compiled
@pytest.mark.parametrize(
    "document",
    [
        pytest.param(lambda: codec.encode(good_frame()), id="simulator-frame"),
        pytest.param(lambda: frame_publisher.templates(1, set())[0][1], id="bench-frame"),
        pytest.param(lambda: json.dumps(doc(), indent=2).encode(), id="indented"),
        pytest.param(lambda: json.dumps(ports_doc()).encode(), id="v2-with-ports"),
        pytest.param(
            lambda: json.dumps(
                {**doc(), "gpus": [{**g, "jobs": ["7", "slurm-12"]} for g in doc()["gpus"]]}
            ).encode(),
            id="jobs",
        ),
        pytest.param(lambda: json.dumps({**doc(), "gpus": []}).encode(), id="no-gpus"),
        pytest.param(
            lambda: json.dumps(
                {**doc(), "gpus": [{**doc()["gpus"][0], "index": i} for i in range(256)]}
            ).encode(),
            id="256-gpus",
        ),
        pytest.param(
            lambda: json.dumps(
                {**doc(), "gpus": [dict(reversed(g.items())) for g in doc()["gpus"]]}
            ).encode(),
            id="keys-in-another-order",
        ),
    ],
)
def test_the_compiled_decoder_decides_the_frames_agents_send(document: Callable[[], bytes]) -> None:
    data = document()
    assert compiled_decides(data)
    assert assert_columns_same(data) == "ok"


@pytest.mark.parametrize(
    ("path", "value", "decided"),
    [
        ("gpus.0.temp_c", -0.0, True),  # the sign of zero is kept
        ("gpus.0.energy_j", 1e22, True),
        ("gpus.0.energy_j", 123456789.12345678, True),  # 17 digits: Python's own conversion
        ("gpus.0.energy_j", 0.1 + 0.2, True),
        ("gpus.0.energy_j", 5e-324, False),  # subnormal: left to msgspec
        ("gpus.0.ecc_sbe_volatile", 2**53, True),
        ("gpus.0.ecc_sbe_volatile", 2**53 + 1, False),  # float64 would round it: left to Python
        ("gpus.0.ecc_sbe_volatile", 10**18, False),  # 19 digits
        ("seq", 10**17, True),  # not a plane column: exact as an int
        ("gpus.0.nvlink_links_up", 256, True),
        ("gpus.0.nvlink_links_up", 257, False),
        ("gpus.0.util_gpu_pct", 100, True),
        ("gpus.0.util_gpu_pct", 100.0000000001, False),
        ("ts", 1e-300, True),
        ("node", "a" * 253, True),
        ("node", "a" * 254, False),
        ("node", "gpu 01", False),  # not in the node pattern
        ("node", "é", False),  # non-ASCII: left to msgspec
        ("boot_id", "", False),
        ("boot_id", 'a"b', False),  # escapes: left to msgspec
        ("agent_version", "", True),
        ("gpus.0.model", "x" * 96, True),
        ("gpus.0.model", "x" * 97, False),
        ("gpus.0.row_remap_pending", True, True),
        ("gpus.0.row_remap_pending", None, True),
        ("gpus.0.row_remap_pending", 1, False),
        ("gpus.0.fabric_state", 3, True),
        ("gpus.0.fabric_state", 4, False),
        ("gpus.0.jobs", ["a"] * 16, True),
        ("gpus.0.jobs", ["a"] * 17, False),
        ("gpus.0.jobs", [1], False),
        ("gpus_expected", None, True),
        ("fabric_manager_up", False, True),
        ("source", "replay", True),
        ("source", "Sim", False),
        ("gpus.0.index", 0.0, False),
    ],
)
def test_edge_values_are_decided_or_left_to_python_with_the_same_verdict(
    path: str, value: Any, decided: bool
) -> None:
    d = doc()
    target: Any = d
    *head, last = path.split(".")
    for part in head:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    data = json.dumps(d).encode()
    assert_columns_same(data)
    if framecols.ACCELERATED:
        assert compiled_decides(data) is decided


@pytest.mark.parametrize(
    "data",
    [
        json.dumps(doc()).replace('"seq": 3', '"seq": -0').encode(),
        json.dumps(doc()).replace('"seq": 3', '"seq": 03').encode(),
        json.dumps(doc()).replace('"seq": 3', '"seq": 3.').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": 1.7E9').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": 17e+8').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": .5').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": -1').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": 1e400').encode(),
        json.dumps(doc()).replace('"ts": 1700000000.0', '"ts": 1e-400').encode(),
        json.dumps(doc()).replace('"temp_c": ', '"temp_c": -0, "x": ', 1).encode(),
        json.dumps(doc()).replace('"temp_c": ', '"temp_c": -0, "temp_c": ', 1).encode(),
        json.dumps(doc()).replace('"index": 0', '"index": 0, "index": 0', 1).encode(),
        json.dumps(doc()).replace('"node": "n1"', '"node": "n\\u0031"').encode(),
        json.dumps(doc()).replace('"schema"', '"sch\\u0065ma"').encode(),
        json.dumps(doc()).replace('"schema"', '"schema_"').encode(),
        json.dumps(doc()).replace(": ", ":\t\r\n ").encode(),
        json.dumps(doc()).encode() + b" \n",
        json.dumps(doc()).encode() + b" x",
        json.dumps(doc()).encode() + b"{}",
        b"\xef\xbb\xbf" + json.dumps(doc()).encode(),
        json.dumps(doc()).replace("true", "True").encode(),
        json.dumps(doc()).replace("null", "nul", 1).encode(),
        json.dumps(doc()).replace("[", "[,", 1).encode(),
        json.dumps(doc()).replace("}]", "},]", 1).encode(),
        json.dumps({**doc(), "gpus": {}}).encode(),
        json.dumps({**doc(), "gpus": [[]]}).encode(),
        json.dumps({**doc(), "gpus": [1]}).encode(),
        json.dumps({**ports_doc(), "ports": [{"device": "-x", "port": 1}]}).encode(),
        json.dumps({**ports_doc(), "ports": [{"device": "x", "port": 1}] * 65}).encode(),
        json.dumps({**ports_doc(), "ports": [{"device": "x"}]}).encode(),
        json.dumps({**ports_doc(), "ports": None}).encode(),
        b"{}",
        b'{"schema": "healer.telemetry.v1"}',
        b"null",
        b" ",
    ],
)
def test_unusual_documents_get_the_same_verdict(data: bytes) -> None:
    assert_columns_same(data)


def test_every_truncation_of_a_frame_gets_the_same_verdict() -> None:
    d = {**doc(), "gpus": doc()["gpus"][:2]}
    data = json.dumps(d).encode()
    for end in range(len(data) + 1):
        assert_columns_same(data[:end])


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(
    field=st.sampled_from(framecols.COLUMNS),
    value=st.integers(min_value=-(2**64), max_value=2**64) | st.floats(allow_nan=False, allow_infinity=False),
)
def test_any_number_in_any_gpu_column_reads_as_pydantic_reads_it(field: str, value: float) -> None:
    d = doc()
    d["gpus"][2][field] = value
    assert_columns_same(json.dumps(d).encode())


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(text=st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?", fullmatch=True))
def test_any_number_text_reads_as_pydantic_reads_it(text: str) -> None:
    d = json.dumps(doc())
    start = d.index('"energy_j": ') + len('"energy_j": ')
    stop = d.index(",", start)
    assert_columns_same((d[:start] + text + d[stop:]).encode())


def test_a_plane_with_too_few_rows_is_refused() -> None:
    data = codec.encode(good_frame())
    for decode in DECODERS.values():
        with pytest.raises(ValueError, match="rows free"):
            decode(data, np.empty((framecols.ROWS_MAX, framecols.WIDTH)), 1)


def test_gpus_and_ports_are_decoded_only_when_read() -> None:
    data = json.dumps(ports_doc()).encode()
    plane = np.empty((framecols.ROWS_MAX, framecols.WIDTH))
    frame = framecols.decode_into(data, plane, 0)
    if framecols.ACCELERATED:
        assert not hasattr(frame, "_gpus")
    assert frame.ports is not None
    assert frame.ports[0].device == "mlx5_0"
    assert frame.gpus[3].index == 3
    assert frame.gpus[3].power_limit_w == plane[3, framecols.COLUMN["power_limit_w"]]


def test_models_it_cannot_translate_exactly_are_refused() -> None:
    class Unanchored(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
        x: str = pydantic.Field(pattern="^[a-z]+")

    class Mapping(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
        x: dict[str, int]

    class Infinite(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        x: float

    class Misplaced(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
        x: bool = pydantic.Field(ge=0)

    for model, problem in [
        (Unanchored, "patterns"),
        (Mapping, "not translated"),
        (Infinite, "allow_inf_nan"),
        (Misplaced, "does not apply"),
    ]:
        with pytest.raises(TypeError, match=problem):
            framecols._struct(model, outputs=False)
