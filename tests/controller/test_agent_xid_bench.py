"""The agent-to-cordon figure (``healer bench controller --agent-xid N``, benchmarks/agent_to_cordon.py) at
toy scale: real agent processes, a real nats-server, the real controller; every stage of every fault is
stamped, in causal order (the speed itself is the benchmark's business, not a test's)."""

from __future__ import annotations

from healer.evals import agent_xid


async def test_every_fault_is_stamped_at_every_stage_from_the_nvml_event_to_the_cordon() -> None:
    stamps = await agent_xid.run(processes=2, per=1, gap_s=0.1)
    assert len(stamps) == 2
    for s in stamps:
        assert set(agent_xid.STAGES) <= set(s), f"a stage not stamped: {sorted(s)}"
        causal = [s[k] for k in agent_xid.STAGES if k != "stored"]
        assert causal == sorted(causal), "each hand-over after the one before it"
        assert s["spooled"] <= s["stored"], "spooled (fsynced) before it is published"
        assert s["in_tick"] in (0.0, 1.0)
        assert 0 <= s["behind"] < len(agent_xid.HOLDERS)
    summary = agent_xid.summarise(stamps)
    assert (summary.faults, summary.acted) == (2, 2)
    assert summary.p50_s is not None
    assert summary.p99_s is not None
    assert summary.max_s is not None
    assert 0 < summary.p50_s <= summary.p99_s <= summary.max_s
    assert set(summary.stages_p50_ms) == set(agent_xid.STAGES[1:])
    assert len(summary.slowest) == 2
    assert sum(int(b["faults"]) for b in summary.behind.values()) == 2, "each fault under what held the turn"
    assert "2/2 acted on" in agent_xid.line(summary)
