"""Helpers shared by the rule engine tests: build frames and engines without ceremony."""

from __future__ import annotations

from typing import Any

from healer.rules import baseline, engine, loader
from healer.schemas import telemetry

T0 = 1_700_000_000.0


def frame(
    node: str, t: float, gpus: int = 2, expected: int | None = None, **per_gpu: Any
) -> telemetry.NodeFrame:
    """A healthy frame at T0+t; ``per_gpu`` values are scalars (every GPU) or {index: value}."""
    samples = []
    for g in range(gpus):
        values = baseline.healthy(None)
        for name, value in per_gpu.items():
            if isinstance(value, dict):
                if g in value:
                    values[name] = value[g]
            else:
                values[name] = value
        samples.append(telemetry.GpuSample(index=g, uuid=f"GPU-{node}-{g}", **values))
    return telemetry.NodeFrame(
        node=node,
        ts=T0 + t,
        seq=max(0, int(t)),
        boot_id="b",
        agent_version="t",
        source="sim",
        gpus_expected=expected,
        gpus=samples,
    )


def make_engine(text: str, **options: Any) -> engine.Engine:
    result = loader.load_text(text)
    assert result.ruleset is not None, [str(d) for d in result.errors]
    return engine.Engine(result.ruleset, **options)


def rule(when: str, *, scope: str = "gpu", extra: str = "") -> str:
    """A one-rule file around a condition."""
    return (
        "rules:\n"
        "  - id: r\n"
        "    description: test rule\n"
        f"    scope: {scope}\n"
        f"    when: {when!r}\n"
        "    severity: warning\n"
        "    actions: [notify]\n"
        f"{extra}"
    )
