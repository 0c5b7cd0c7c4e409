"""GPU fabric state through the NVML choke point: read where NVML has it, null where it does not."""

from __future__ import annotations

import operator

from healer.schemas import codec, telemetry
from healer.telemetry import nvml
from tests.fakes import fake_pynvml as fp


def _sample(fake: fp.FakeNvml) -> list[tuple[int | None, int | None]]:
    src = nvml.NvmlSource("n1", nvml=fake.module())
    src.open()
    try:
        return [(g.fabric_state, g.fabric_status) for g in src.sample().gpus]
    finally:
        src.close()


def test_fabric_state_and_status_are_read_per_gpu() -> None:
    fake = fp.FakeNvml(3)
    fake.gpus[1].fabric_state = fp.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    fake.gpus[2].fabric_status = fp.NVML_ERROR_NOT_SUPPORTED
    assert _sample(fake) == [(3, 0), (2, 0), (3, 3)]


def test_a_gpu_outside_any_fabric_reads_null_and_is_not_asked_again() -> None:
    fake = fp.FakeNvml(2)
    fake.gpus[0].fabric_state = fp.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    fake.gpus[1].unsupported.add("nvmlDeviceGetGpuFabricInfo")  # an older GPU: the call itself fails
    src = nvml.NvmlSource("n1", nvml=fake.module())
    src.open()
    try:
        for _ in range(3):
            assert [(g.fabric_state, g.fabric_status) for g in src.sample().gpus] == [(None, None)] * 2
    finally:
        src.close()
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 2


def test_fabric_fields_travel_through_the_strict_decoder() -> None:
    fake = fp.FakeNvml(1)
    fake.gpus[0].fabric_state = fp.NVML_GPU_FABRIC_STATE_NOT_STARTED
    src = nvml.NvmlSource("n1", nvml=fake.module())
    src.open()
    try:
        sample = src.sample()
    finally:
        src.close()
    frame = telemetry.NodeFrame(
        node="n1", ts=1.0, seq=0, boot_id="b", agent_version="t", source="nvml", gpus=sample.gpus
    )
    view = codec.decode_frame_view(codec.encode(frame))
    # Beyond the hot path's GpuView fields, the controller reads a field by name, as here.
    assert operator.attrgetter("fabric_state", "fabric_status")(view.gpus[0]) == (1, 0)
