"""The bus side of scripts/gpu-check.sh: watch a real agent's frames and drive its power-limit commands.

Run by the script against the agent it started (``--source nvml``) and the nats-server it started, both
on loopback. For ``--seconds`` it keeps every frame of ``--node`` and checks them: each decodes, comes
from ``nvml``, carries every expected GPU, ``seq`` rises by one. After ``--power-after`` seconds it sends
GPU 0 a ``set_power_limit`` 10 W below its current limit through the agent's command path (a lease in
``healer-leases`` gives the fencing token, as the controller's would), waits for a frame showing it,
sends ``restore_power_limit`` and waits for a frame showing the old limit. The result is one JSON
document on stdout and in ``--out``; exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
import uuid
from typing import Any

from healer import config
from healer.bus import base, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, commands, telemetry

STEP_W = 10.0
FIRST_FRAME_S = 30.0
"""How long the check waits for the agent's first frame before its clock (``--seconds``) starts."""


async def run(url: str, node: str, seconds: float, power_after: float, source: str) -> dict[str, Any]:
    subj = subjects.Subjects()
    bus = await natsbus.NatsBus.connect(url, name="gpu-check", nats_settings=config.NatsSettings(url=url))
    frames: list[telemetry.NodeFrame] = []
    bad: list[str] = []
    arrived = asyncio.Event()

    async def on_frame(msg: base.Msg) -> None:
        arrived.set()
        try:
            frames.append(codec.decode_frame(msg.data))
        except Exception as e:
            bad.append(str(e)[:200])

    await bus.subscribe(subj.telemetry(node), on_frame)
    with contextlib.suppress(TimeoutError):  # an agent still starting (a loaded host) is no failed check
        await asyncio.wait_for(arrived.wait(), FIRST_FRAME_S)
    started = time.monotonic()
    power: dict[str, Any] = {"ran": False}
    try:
        await asyncio.sleep(power_after)
        power = await power_test(bus, subj, node, frames)
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
    finally:
        await bus.close()
    return {"frames": frame_report(frames, bad, source), "power": power}


def frame_report(frames: list[telemetry.NodeFrame], bad: list[str], source: str) -> dict[str, Any]:
    seqs = [f.seq for f in frames]
    gaps = sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    short = sum(1 for f in frames if f.gpus_expected is not None and len(f.gpus) < f.gpus_expected)
    sources = sorted({f.source for f in frames})
    nulls: dict[str, int] = {}
    if frames:
        for gpu in frames[-1].gpus:
            for name, value in gpu.model_dump().items():
                if value is None:
                    nulls[name] = nulls.get(name, 0) + 1
    ok = bool(frames) and not bad and gaps == 0 and short == 0 and sources == [source]
    return {
        "ok": ok, "count": len(frames), "undecodable": bad[:5], "seq_gaps": gaps,
        "frames_missing_gpus": short, "sources": sources, "gpus": len(frames[-1].gpus) if frames else 0,
        "null_fields_last_frame": nulls,
    }  # fmt: skip


async def power_test(
    bus: natsbus.NatsBus, subj: subjects.Subjects, node: str, frames: list[telemetry.NodeFrame]
) -> dict[str, Any]:
    if not frames or not frames[-1].gpus or frames[-1].gpus[0].power_limit_w is None:
        return {"ran": False, "ok": False, "why": "no frame with GPU 0's power limit yet"}
    before = frames[-1].gpus[0].power_limit_w
    target = before - STEP_W
    kv = await bus.key_value(subj.kv_leases)
    token = await kv.put("leader.shard-0", json.dumps({"holder": "gpu-check"}).encode())
    out: dict[str, Any] = {"ran": True, "before_w": before, "target_w": target}
    set_result = await command(bus, subj, node, "set_power_limit", token, watts=target)
    out["set"] = set_result.status
    out["set_seen_in_frame_s"] = await seen(frames, target)
    restore = await command(bus, subj, node, "restore_power_limit", token)
    out["restore"] = restore.status
    out["restore_seen_in_frame_s"] = await seen(frames, before)
    out["ok"] = (
        set_result.status == "applied" and restore.status == "applied"
        and out["set_seen_in_frame_s"] is not None and out["restore_seen_in_frame_s"] is not None
    )  # fmt: skip
    if not out["ok"]:
        out["detail"] = [set_result.detail, restore.detail]
    return out


async def command(
    bus: natsbus.NatsBus, subj: subjects.Subjects, node: str, action: commands.CommandAction, token: int,
    **params: Any,
) -> commands.CommandResult:  # fmt: skip
    now = time.time()
    cmd = commands.Command(
        id=f"gpu-check:{action}:{uuid.uuid4().hex[:8]}", node=node, action=action, gpu_index=0,
        fencing_token=token, issued_at=now, expires_at=now + 30, issuer="gpu-check", reason="gpu-check",
        holder="gpu-check", **params,
    )  # fmt: skip
    reply = await bus.request(subj.command(node), codec.encode(cmd), timeout=15.0)
    return codec.decode_command_result(reply.data)


async def seen(frames: list[telemetry.NodeFrame], watts: float, timeout_s: float = 10.0) -> float | None:
    """Seconds until a frame shows GPU 0 at ``watts`` (within 0.5 W); None if none did in time."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        last = frames[-1].gpus[0].power_limit_w if frames and frames[-1].gpus else None
        if last is not None and abs(last - watts) <= 0.5:
            return round(time.monotonic() - start, 3)
        await asyncio.sleep(0.1)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nats", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--power-after", type=float, default=15.0)
    p.add_argument("--out", required=True)
    p.add_argument("--expect-source", default="nvml", help="the frames' source (sim: the script's own test)")
    args = p.parse_args()
    result = asyncio.run(run(args.nats, args.node, args.seconds, args.power_after, args.expect_source))
    result["ok"] = result["frames"]["ok"] and result["power"].get("ok", False)
    text = json.dumps(result, indent=2)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
