"""A duplicate or late frame never moves a counter backwards (#38): each node's ``(boot_id, seq)`` decides,
and a recording replayed with frames duplicated and swapped gives every rule the firings of the clean
replay (without the check, the older counter read as a reset and ``rate()`` spiked)."""

from __future__ import annotations

import pathlib
import random

from healer import config, testing
from healer.bus import base, subjects
from healer.controller.core import frame_order, service
from healer.schemas import codec, telemetry
from tests import conftest

V = frame_order.Verdict

COUNTER_RULES = """
rules:
  - id: nvlink-crc-fast
    description: NVLink CRC flits climbing
    scope: gpu
    when: rate(nvlink_crc_flit_errors[1m]) > 100
    severity: major
    actions: [notify]
  - id: sbe-burst
    description: many corrected ECC errors
    scope: gpu
    when: increase(ecc_sbe_volatile[2m]) > 400
    severity: warning
    actions: [notify]
  - id: pcie-replays
    description: PCIe replays
    scope: gpu
    when: delta(pcie_replay_count[1m]) > 200
    severity: warning
    actions: [notify]
"""


def test_each_nodes_boot_and_seq_decide() -> None:
    order = frame_order.FrameOrder()
    assert order.verdict("n1", "boot-a", 1) is V.FRESH
    assert order.verdict("n1", "boot-a", 2) is V.FRESH
    assert order.verdict("n1", "boot-a", 2) is V.DUPLICATE
    assert order.verdict("n1", "boot-a", 1) is V.LATE
    assert order.verdict("n2", "boot-x", 1) is V.FRESH, "nodes are apart"
    assert order.verdict("n1", "boot-b", 0) is V.FRESH, "a new boot starts afresh"
    assert order.verdict("n1", "boot-a", 3) is V.OLD_BOOT, "a replaced boot's frame is late"
    assert order.verdict("n1", "boot-b", 1) is V.FRESH
    order.forget("n1")
    assert order.verdict("n1", "boot-a", 1) is V.FRESH, "a forgotten node starts afresh"


def recording(nodes: int = 3, seconds: int = 600) -> list[telemetry.NodeFrame]:
    """Counters as a healthy fleet climbs them, and one real fault: n1's GPU 0 CRC flits at 500/s for
    three minutes from t=300 (its rule fires and resolves in the clean replay too)."""
    rng = random.Random(7)
    crc = {(n, g): 0.0 for n in range(nodes) for g in range(2)}
    sbe = dict.fromkeys(crc, 0.0)
    replays = dict.fromkeys(crc, 0.0)
    frames = []
    for t in range(seconds):
        for n in range(nodes):
            gpus = []
            for g in range(2):
                fault = n == 1 and g == 0 and 300 <= t < 480
                crc[(n, g)] += 500 if fault else rng.randint(0, 20)
                sbe[(n, g)] += rng.randint(0, 2)
                replays[(n, g)] += rng.randint(0, 1)
                gpus.append(
                    telemetry.GpuSample(
                        index=g, temp_c=50.0, nvlink_crc_flit_errors=int(crc[(n, g)]),
                        ecc_sbe_volatile=int(sbe[(n, g)]), pcie_replay_count=int(replays[(n, g)]),
                    )
                )  # fmt: skip
            frames.append(
                telemetry.NodeFrame(
                    node=f"n{n}", ts=1000.0 + t, seq=t, boot_id=f"boot-{n}", agent_version="t",
                    source="replay", gpus_expected=2, gpus=gpus,
                )
            )  # fmt: skip
    return frames


def disorder(frames: list[telemetry.NodeFrame], seed: int = 3) -> list[telemetry.NodeFrame]:
    """As an independently written fleet delivers them, heavier: 2 % repeated later, 3 % swapped."""
    rng = random.Random(seed)
    out = list(frames)
    for i in range(len(out) - 1):
        if rng.random() < 0.03:
            out[i], out[i + 1] = out[i + 1], out[i]
    for i in sorted(rng.sample(range(len(frames)), len(frames) // 50), reverse=True):
        out.insert(min(len(out), i + rng.randint(1, 40)), frames[i])
    return out


async def replay(
    tmp_path: pathlib.Path, frames: list[telemetry.NodeFrame]
) -> list[tuple[str, str, int | None, str]]:
    """The frames through the controller's own ingest (decoder, admission, frame order) and engine, in
    the order given, one every 1/nodes s of receive time; every rule evaluated every 5 s; the new and
    resolved firings in order."""
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    rules = tmp_path / "rules"
    rules.mkdir(parents=True)
    (rules / "counters.yaml").write_text(COUNTER_RULES)
    now = [1000.0]
    settings = config.Settings(
        controller=config.ControllerSettings.model_validate(
            {"rules_dir": str(rules), "mode": "observe", "admission": "first-seen", "max_clock_skew_s": 1e9}
        )
    )
    ctl = await service.build(settings, bus, scheduler=testing.RecordingActuator(), clock=lambda: now[0])
    seen: list[tuple[str, str, int | None, str]] = []
    step = 1.0 / 3
    for i, frame in enumerate(frames):
        now[0] = 1000.0 + i * step
        ctl.ingest.on_frame(base.Msg(subj.telemetry(frame.node), codec.encode(frame)))
        if i % 15 == 14:
            for f in ctl.engine.evaluate(now[0]):
                if f.status in ("fired", "resolved"):
                    seen.append((f.rule_id, f.node, f.gpu, f.status))
    return seen


async def test_a_replay_with_frames_repeated_and_swapped_fires_as_the_clean_one(
    tmp_path: pathlib.Path,
) -> None:
    clean_frames = recording()
    dirty_frames = disorder(clean_frames)
    assert len(dirty_frames) > len(clean_frames)
    clean = await replay(tmp_path / "clean", clean_frames)
    dirty = await replay(tmp_path / "dirty", dirty_frames)
    assert ("nvlink-crc-fast", "n1", 0, "fired") in clean, "the real fault fires"
    assert [f[:3] for f in dirty] == [f[:3] for f in clean]
    assert dirty == clean
