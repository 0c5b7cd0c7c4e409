"""What a rule can read: the metric catalog, in one place.

Every numeric or boolean field of ``GpuSample`` is a GPU metric under its own name (booleans read as 0/1),
and also under the dcgm-exporter name SREs already know (``DCGM_FI_DEV_GPU_TEMP`` is ``temp_c``), always
in healer's units. Derived GPU metrics split the NVML clocks-event bitmask into named 0/1 flags. Node
metrics describe the frame itself (``gpus_missing`` against ``gpus_expected``, ``ports_present``). Port
metrics (level ``port``) are the numeric PortSample fields of the node's RDMA ports, named ``port_<field>``
(``port_state``, ``port_rate_gbps``, ``port_symbol_error``; a field already named ``port_...`` keeps its
name), read aggregated over the node's ports (rules/port_state.py). ``anomaly_score`` is fed
by the anomaly model and reads 0 until one is loaded. The rule checker resolves names here at load time.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Final, Literal

from healer.schemas import dcgm, fabric, fields, telemetry

Level = fields.Scope
"""A metric's level: the scope of the value it reads."""
Kind = Literal["gauge", "counter", "bool"]

COUNTERS: Final = frozenset(fields.COUNTERS)
"""Cumulative fields (from the telemetry field catalogue, ``healer.schemas.fields``)."""

DCGM_ALIASES: Final = dcgm.ALIASES
"""dcgm-exporter field names → healer metric names (the catalogue lives beside the schema)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Metric:
    name: str
    level: Level
    kind: Kind
    description: str
    source: Literal["sample", "derived", "node", "external", "port"] = "sample"
    history: bool = True
    """Whether range functions (``rate(x[5m])``) may read it."""
    field: str | None = None
    """The PortSample field of a port metric."""


def _sample_metrics() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for name, field in telemetry.GpuSample.model_fields.items():
        ann = field.annotation
        args = set(typing.get_args(ann)) if isinstance(ann, types.UnionType) else {ann}
        args.discard(type(None))
        if args == {bool}:
            kind: Kind = "bool"
        elif args <= {int, float} and name != "index":
            kind = "counter" if name in COUNTERS else "gauge"
        else:
            continue
        out[name] = Metric(name, fields.Scope.GPU, kind, field.description or name.replace("_", " "))
    return out


SAMPLE: Final = _sample_metrics()
"""GpuSample fields readable by rules, in field order (the ingest column order)."""

DERIVED: Final = {
    name: Metric(name, fields.Scope.GPU, "bool", f"{desc} (clocks_event_reasons & {int(bit):#x})", "derived")
    for name, (bit, desc) in fields.CLOCK_BITS.items()
}

NODE: Final = {
    "gpus_expected": Metric(
        "gpus_expected", fields.Scope.NODE, "gauge", "GPUs configured for the node", "node", False
    ),
    "gpus_present": Metric(
        "gpus_present", fields.Scope.NODE, "gauge", "GPUs in the node's latest frame", "node", False
    ),
    "gpus_missing": Metric(
        "gpus_missing",
        fields.Scope.NODE,
        "gauge",
        "gpus_expected - gpus_present, 0 when none missing",
        "node",
        False,
    ),
    "fabric_manager_up": Metric(
        "fabric_manager_up",
        fields.Scope.NODE,
        "bool",
        "NVIDIA Fabric Manager runs (1) or not (0); unknown where the agent does not check (no fabric)",
        "node",
        False,
    ),
    "ports_present": Metric(
        "ports_present",
        fields.Scope.NODE,
        "gauge",
        "RDMA ports in the node's latest frame (unknown from an agent that does not read them)",
        "node",
        False,
    ),
}


def _port_metrics() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for name, field in fabric.PortSample.model_fields.items():
        ann = field.annotation
        args = set(typing.get_args(ann)) if isinstance(ann, types.UnionType) else {ann}
        args.discard(type(None))
        if not args <= {int, float} or name == "port":
            continue
        metric = name if name.startswith("port_") else f"port_{name}"
        kind: Kind = "counter" if name in fabric.ALL_COUNTERS else "gauge"
        out[metric] = Metric(
            metric, fields.Scope.PORT, kind, field.description or name.replace("_", " "), "port", field=name
        )
    return out


PORT: Final = {
    **_port_metrics(),
    "port_infiniband": Metric(
        "port_infiniband",
        fields.Scope.PORT,
        "bool",
        "1 for an InfiniBand port, 0 for Ethernet (RoCE): link_layer",
        "port",
        False,
        field="link_layer",
    ),
}
"""PortSample fields readable by rules, as port-level metrics (``port_<field>``), and ``port_infiniband``
(the ``link_layer`` string as a 0/1 flag)."""

EXTERNAL: Final = {
    "anomaly_score": Metric(
        "anomaly_score",
        fields.Scope.GPU,
        "gauge",
        "anomaly model output, 0..1 (0 until a model is loaded)",
        "external",
        False,
    ),
    "straggler_score": Metric(
        "straggler_score",
        fields.Scope.GPU,
        "gauge",
        "fail-slow scorer: 1 while the GPU (or its node) persistently lags its job's peers or its own "
        "history under load (docs/fail-slow.md), else 0",
        "external",
        False,
    ),
}

ALL: Final[dict[str, Metric]] = {**SAMPLE, **DERIVED, **NODE, **EXTERNAL, **PORT}

TELEMETRY: Final = "telemetry"
"""Pseudo-metric for ``absent(telemetry[2m])``: no frame at all from the node."""


def resolve(name: str) -> Metric | None:
    """A metric by healer or dcgm-exporter name, or None if there is no such metric."""
    return ALL.get(DCGM_ALIASES.get(name, name))
