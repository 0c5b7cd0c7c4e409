"""CommandExecutor safety rules, without a bus: idempotency, expiry, fencing, clamping, restore."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

from healer import errors
from healer.agent import execution, power_limits
from healer.schemas import codec, commands
from healer.sim import node_source
from healer.telemetry import source


def cmd(
    action: str, *, token: int = 1, ttl: float = 30, cid: str | None = None, **kw: object
) -> commands.Command:
    now = time.time()
    return commands.Command.model_validate(
        {
            "id": cid or f"c-{action}-{token}-{kw}",
            "node": kw.pop("node", "n1"),
            "action": action,
            "fencing_token": token,
            "issued_at": now - 60,
            "expires_at": now + ttl,
            **kw,
        }
    )


@pytest.fixture
def power() -> node_source.SimSource:
    return node_source.SimSource("n1", gpus=2)


def executor(power: power_limits.PowerControl, path: pathlib.Path | None) -> execution.CommandExecutor:
    return execution.CommandExecutor("n1", power, path, gpu_indices=lambda: [0, 1])


def test_whole_node_cap_applies_to_every_gpu(power: node_source.SimSource) -> None:
    res = executor(power, None).execute(cmd("set_power_limit", watts=500))
    assert res.status == "applied"
    assert [(c.index, c.applied_w) for c in res.gpus] == [(0, 500.0), (1, 500.0)]
    assert power.power_limits(1).current_w == 500.0


def test_repeated_command_id_is_answered_not_rerun(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    first = ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, cid="same"))
    power.set_power_limit(0, 650)  # an operator acts in between
    again = ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, cid="same"))
    assert again == first
    assert power.power_limits(0).current_w == 650.0


def test_stale_token_is_refused_and_newer_token_accepted(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    assert ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=10)).status == "applied"
    stale = ex.execute(cmd("restore_power_limit", gpu_index=0, token=9))
    assert stale.status == "refused"
    assert "stale fencing token 9 < 10" in stale.detail
    assert power.power_limits(0).current_w == 500.0
    assert ex.execute(cmd("restore_power_limit", gpu_index=0, token=11)).status == "applied"


def test_expired_and_misaddressed_commands_are_refused(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    assert "expired" in ex.execute(cmd("set_power_limit", watts=500, ttl=-1)).detail
    assert "delivered to" in ex.execute(cmd("set_power_limit", watts=500, node="n2")).detail
    assert power.power_limits(0).current_w == 700.0


def test_restore_survives_an_agent_restart(power: node_source.SimSource, tmp_path: pathlib.Path) -> None:
    state = tmp_path / "power.json"
    power.set_power_limit(0, 650)  # the operator's limit before healer
    executor(power, state).execute(cmd("set_power_limit", gpu_index=0, percent_of_default=50, token=3))
    assert power.power_limits(0).current_w == 350.0
    restarted = executor(power, state)
    assert restarted.fencing_token == 3
    res = restarted.execute(cmd("restore_power_limit", gpu_index=0, token=3))
    assert res.status == "applied"
    assert power.power_limits(0).current_w == 650.0
    assert json.loads(state.read_text())["originals"] == {}


def test_second_cap_keeps_the_first_original(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=600, token=1))
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=400, token=2))
    ex.execute(cmd("restore_power_limit", gpu_index=0, token=3))
    assert power.power_limits(0).current_w == 700.0


def test_two_holders_the_tighter_limit_holds_and_the_original_returns_only_when_both_lifted(
    power: node_source.SimSource,
) -> None:
    """A hot GPU's incident and its rack's power budget cap one GPU: each is its own holder. Before
    holders, whichever restored first put back the original limit under the other's cap."""
    power.set_power_limit(0, 650)  # the operator's limit
    ex = executor(power, None)
    thermal, budget = "inc-hot", "inc-rack"
    assert (
        ex.execute(cmd("set_power_limit", gpu_index=0, percent_of_default=80, holder=thermal)).status
        == "applied"
    )
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=525, token=2, holder=budget))
    assert power.power_limits(0).current_w == 525.0, "the tighter of the two"
    raised = ex.execute(cmd("set_power_limit", gpu_index=0, watts=630, token=3, holder=budget))
    assert power.power_limits(0).current_w == 560.0, "the budget's step up stops at the thermal cap"
    assert raised.gpus[0].detail == "held at 560 W by inc-hot"
    lifted = ex.execute(cmd("restore_power_limit", gpu_index=0, token=4, holder=budget))
    assert lifted.status == "already"
    assert power.power_limits(0).current_w == 560.0, "the budget's release leaves the thermal cap"
    ex.execute(cmd("restore_power_limit", gpu_index=0, token=5, holder=thermal))
    assert power.power_limits(0).current_w == 650.0, "both lifted: the operator's limit"
    assert ex.originals == {}


def test_the_thermal_restore_under_a_budget_cap_leaves_the_budget_cap(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, holder="inc-rack"))
    ex.execute(cmd("set_power_limit", gpu_index=0, percent_of_default=80, token=2, holder="inc-hot"))
    assert power.power_limits(0).current_w == 500.0
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=600, token=3, holder="inc-rack"))  # a budget step
    assert power.power_limits(0).current_w == 560.0
    res = ex.execute(cmd("restore_power_limit", gpu_index=0, token=4, holder="inc-hot"))
    assert res.status == "applied"
    assert res.gpus[0].applied_w == 600.0, "the thermal cap lifted: the budget's own limit, not 700 W"
    assert power.power_limits(0).current_w == 600.0
    ex.execute(cmd("restore_power_limit", gpu_index=0, token=5, holder="inc-rack"))
    assert power.power_limits(0).current_w == 700.0


def test_holders_survive_a_restart_and_a_restore_without_one_lifts_them_all(
    power: node_source.SimSource, tmp_path: pathlib.Path
) -> None:
    state = tmp_path / "power.json"
    ex = executor(power, state)
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=560, holder="inc-hot"))
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=2, holder="inc-rack"))
    restarted = executor(power, state)
    restarted.execute(cmd("restore_power_limit", gpu_index=0, token=3, holder="inc-rack"))
    assert power.power_limits(0).current_w == 560.0, "inc-hot's hold came back from disk"
    restarted.execute(cmd("set_power_limit", gpu_index=0, watts=450, token=4, holder="inc-rack"))
    restarted.execute(cmd("restore_power_limit", gpu_index=0, token=5))  # an older controller: no holder
    assert power.power_limits(0).current_w == 700.0


def test_a_record_from_before_holders_is_lifted_by_any_holder(
    power: node_source.SimSource, tmp_path: pathlib.Path
) -> None:
    state = tmp_path / "power.json"
    power.set_power_limit(0, 500)
    original = {"original_w": 700.0, "applied_w": 500.0, "reason": "healer: inc-old", "at": 1.0}
    state.write_text(json.dumps({"fencing_token": 1, "originals": {"0": original}, "recent": {}}))
    ex = executor(power, state)
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=450, token=2, holder="inc-rack"))
    ex.execute(cmd("restore_power_limit", gpu_index=0, token=3, holder="inc-rack"))
    assert power.power_limits(0).current_w == 700.0, "the unnamed hold went with it, as before holders"


def test_a_holder_is_left_out_of_the_encoding_while_empty_and_only_power_limits_take_one() -> None:
    assert b'"holder"' not in codec.encode(cmd("set_power_limit", watts=500)), "what an older agent decodes"
    assert b'"holder":"inc-1"' in codec.encode(cmd("restore_power_limit", holder="inc-1"))
    with pytest.raises(ValueError, match="reboot_node takes no holder"):
        cmd("reboot_node", holder="inc-1")


def test_restore_leaves_a_limit_an_operator_changed_after_healer(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=1))
    power.set_power_limit(0, 450)
    res = ex.execute(cmd("restore_power_limit", gpu_index=0, token=2))
    assert res.status == "refused"
    assert "changed by someone else" in res.detail
    assert power.power_limits(0).current_w == 450.0


def test_restore_with_nothing_held_is_already_done(power: node_source.SimSource) -> None:
    res = executor(power, None).execute(cmd("restore_power_limit", gpu_index=1))
    assert res.status == "already"


def test_nvml_refusal_is_reported_as_failed(power: node_source.SimSource) -> None:
    class Locked:
        def power_limits(self, index: int) -> source.PowerLimits:
            return source.PowerLimits(700, 700, 200, 700)

        def set_power_limit(self, index: int, watts: float) -> None:
            raise errors.PermanentError("NVML: insufficient permissions")

    res = executor(Locked(), None).execute(cmd("set_power_limit", gpu_index=0, watts=500))
    assert res.status == "failed"
    assert "permanent: NVML: insufficient permissions" in res.detail


def test_unreadable_state_file_starts_empty_and_logs(
    power: node_source.SimSource, tmp_path: pathlib.Path
) -> None:
    from structlog import testing

    state = tmp_path / "power.json"
    state.write_text("{broken")
    with testing.capture_logs() as logs:
        ex = executor(power, state)
    assert ex.originals == {}
    assert any(e["event"] == "commands.state_unreadable" for e in logs)


def test_command_model_rejects_ambiguous_targets() -> None:
    with pytest.raises(ValueError, match="exactly one of watts or percent_of_default"):
        cmd("set_power_limit", watts=500, percent_of_default=80)
    with pytest.raises(ValueError, match="takes no watts"):
        cmd("restore_power_limit", watts=500)


def test_a_new_token_beyond_every_live_lease_is_refused_and_not_persisted(
    power: node_source.SimSource, tmp_path: pathlib.Path
) -> None:
    """A controller credential used from elsewhere sent fencing_token=1e15, which the agent persisted,
    locking the real leader out of the node's power control (restore included)."""
    ex = executor(power, tmp_path / "power.json")
    assert ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=7), LIVE_7).status == "applied"
    forged = ex.execute(cmd("set_power_limit", gpu_index=0, watts=300, token=10**15), LIVE_7)
    assert forged.status == "refused"
    assert "no lease's" in forged.detail
    assert ex.fencing_token == 7
    assert ex.fencing_refused == 1
    reloaded = executor(power, tmp_path / "power.json")
    assert reloaded.fencing_token == 7, "the forged token never reached the disk"
    restore = reloaded.execute(cmd("restore_power_limit", gpu_index=0, token=7), LIVE_7)
    assert restore.status == "applied", "the real leader keeps control"


def test_a_new_token_is_refused_while_the_lease_cannot_be_read(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    unreadable = execution.LiveTokens(frozenset(), error="KV unreachable")
    res = ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=3), unreadable)
    assert res.status == "failed"
    assert res.detail.startswith("temporary: ")
    assert "cannot be read" in res.detail
    assert ex.fencing_token == 0
    assert ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=3), LIVE_3).status == "applied"


def test_a_token_already_seen_needs_no_lease(power: node_source.SimSource) -> None:
    ex = executor(power, None)
    assert ex.execute(cmd("set_power_limit", gpu_index=0, watts=500, token=3), LIVE_3).status == "applied"
    again = cmd("restore_power_limit", gpu_index=0, token=3)
    assert not ex.needs_lease(again)
    assert ex.execute(again).status == "applied"


LIVE_3 = execution.LiveTokens(frozenset({3}))
LIVE_7 = execution.LiveTokens(frozenset({7}))
