"""`make demo` must keep working: a short run sees frames, the XID and the power cap through NATS."""

from __future__ import annotations

from healer import demo


async def test_short_demo_shows_frames_event_and_command() -> None:
    lines: list[str] = []
    summary = await demo.run(nodes=2, duration_s=10.0, out=lines.append)
    assert summary.frames >= 2 * 8
    assert summary.bad_frames == 0
    assert summary.events.get("xid") == 1
    assert summary.events.get("agent_start") == 2
    assert [c["status"] for c in summary.commands] == ["applied"]
    assert summary.commands[0]["applied_w"] == 350.0
    assert any("XID 79" in line for line in lines)
