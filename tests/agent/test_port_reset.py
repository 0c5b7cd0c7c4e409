"""The agent's port link reset (``reset_port``), through the real execution path: a CommandExecutor with
the real LinkResetter on a recorded ConnectX sysfs tree, its bounce commands replaced by a small script
run as a real process (it rewrites the fixture's ``state``, ``phys_state`` and ``rate`` files, as the
kernel would once the link trained), and a port that does not come back."""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

from healer import config, errors
from healer.agent import execution, link_reset
from healer.schemas import codec, commands
from healer.sim import node_source
from healer.telemetry import rdma

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
BOUNCE = """\
import json, pathlib, sys
root, log, device, port, netdev, what = sys.argv[1:7]
with open(log, "a") as f:
    f.write(json.dumps([device, port, netdev, what]) + "\\n")
d = pathlib.Path(root, "class", "infiniband", device, "ports", port)
if what == "down":
    d.joinpath("state").write_text("1: DOWN\\n")
    d.joinpath("phys_state").write_text("3: Disabled\\n")
elif what.startswith("up"):  # up:<rate>: the link trained at that rate; "stuck": it never does
    d.joinpath("state").write_text("4: ACTIVE\\n")
    d.joinpath("phys_state").write_text("5: LinkUp\\n")
    d.joinpath("rate").write_text(what.split(":")[1] + " Gb/sec (4X)\\n")
elif what == "fail":
    sys.exit("ibportstate: can't open UMAD port")
"""


@pytest.fixture
def script(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "bounce.py"
    path.write_text(BOUNCE)
    return path


def tree(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    return rdma.write_tree((FIXTURES / name).read_text(), tmp_path / "sys")


def argv(
    script: pathlib.Path, root: pathlib.Path, log: pathlib.Path, what: str, netdev: str = "-"
) -> list[str]:
    """The bounce script's command line (``netdev``: ``{netdev}`` for a RoCE port's template)."""
    return [sys.executable, str(script), str(root), str(log), "{device}", "{port}", netdev, what]


def command(ports: list[str], action: str = "reset_port", **kw: object) -> commands.Command:
    now = time.time()
    return commands.Command.model_validate(
        {"id": f"i1:{action}:{','.join(ports)}", "node": "n1", "action": action, "ports": ports,
         "fencing_token": 1, "issued_at": now, "expires_at": now + 30, **kw}
    )  # fmt: skip


def executor(resetter: link_reset.LinkResetter, src: node_source.SimSource) -> execution.CommandExecutor:
    return execution.CommandExecutor("n1", src, None, gpu_indices=lambda: [0, 1], gpu=src, ports=resetter)


def calls(log: pathlib.Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_roce_port_is_bounced_through_its_netdev_and_reported_active(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx6dx-roce-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(
        root,
        ethernet=[argv(script, root, log, "down", "{netdev}"), argv(script, root, log, "up:100", "{netdev}")],
        infiniband=[],
    )
    result = executor(resetter, node_source.SimSource("n1", gpus=2)).execute(command(["mlx5_0/1"]))
    assert result.status == "applied", result.detail
    assert calls(log) == [["mlx5_0", "1", "ens1f0np0", "down"], ["mlx5_0", "1", "ens1f0np0", "up:100"]]
    (report,) = result.port_resets
    assert (report.port, report.status, report.link_layer) == ("mlx5_0/1", "applied", "Ethernet")
    assert (report.state, report.phys_state, report.rate_gbps, report.expected_rate_gbps) == (
        4,
        5,
        100.0,
        100.0,
    )
    again = codec.decode_command_result(codec.encode(result))
    assert again == result, "the report travels on the wire"


def test_an_infiniband_port_comes_back_at_its_peers_rate_and_validation_then_passes(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "up:400")])
    src = node_source.SimSource("n1", gpus=2)
    ex = executor(resetter, src)
    health = execution.Health(list(src.sample().gpus), 2, [], ports=None)
    ex.health = lambda since: health
    before = ex.execute(command(["mlx5_3/1"], action="validate", id="v0"))
    assert before.validation is not None
    assert not before.validation.passed
    assert {c.name: c.ok for c in before.validation.checks}["rdma_port_up"] is False
    result = ex.execute(command(["mlx5_3/1"]))
    assert result.status == "applied", result.detail
    assert calls(log) == [["mlx5_3", "1", "-", "up:400"]]
    assert result.port_resets[0].expected_rate_gbps == 400.0
    after = ex.execute(command(["mlx5_3/1"], action="validate", id="i1:validate:after"))
    assert after.validation is not None
    assert after.validation.passed, after.detail
    checks = {c.name: c for c in after.validation.checks}
    assert checks["rdma_port_up"].ok
    assert checks["rdma_port_up"].detail == "mlx5_3/1: ACTIVE LinkUp 400 Gb/s"
    assert checks["rdma_ports_active"].ok, "read fresh from sysfs, not from a frame"


def test_a_port_that_does_not_come_back_fails_the_reset_within_its_time(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "stuck")], poll_s=0.05)
    ex = executor(resetter, node_source.SimSource("n1", gpus=2))
    result = ex.execute(command(["mlx5_3/1"], timeout_s=0.5))
    assert result.status == "failed"
    assert result.detail.startswith("permanent: mlx5_3/1 did not come back in 0.5s: not up: DOWN Polling")
    assert [r.status for r in result.port_resets] == ["failed"]
    assert len(calls(log)) == 1
    assert ex.execute(command(["mlx5_3/1"], timeout_s=0.5)) == result, "remembered: never bounced twice"
    assert len(calls(log)) == 1


def test_a_port_that_trains_back_slower_than_its_peers_fails(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "up:200")], poll_s=0.05)
    result = executor(resetter, node_source.SimSource("n1", gpus=2)).execute(
        command(["mlx5_3/1"], timeout_s=0.5)
    )
    assert result.status == "failed"
    assert "at 200.0 Gb/s, expected 400 Gb/s" in result.detail
    assert (result.port_resets[0].state, result.port_resets[0].rate_gbps) == (4, 200.0)


def test_a_failing_bounce_command_fails_the_reset_with_its_message(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "fail")])
    result = executor(resetter, node_source.SimSource("n1", gpus=2)).execute(command(["mlx5_3/1"]))
    assert result.status == "failed"
    assert "exit 1: ibportstate: can't open UMAD port" in result.detail


def test_unknown_ports_are_refused_and_nothing_is_bounced(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "up:400")])
    result = executor(resetter, node_source.SimSource("n1", gpus=2)).execute(
        command(["mlx5_3/1", "mlx5_9/1"])
    )
    assert result.status == "failed"
    assert result.detail.startswith("permanent: no such port mlx5_9/1 (sysfs lists mlx5_0/1, ")
    assert calls(log) == [], "not even the known port"


def test_a_reset_is_refused_while_work_runs_and_without_a_port_reader(
    tmp_path: pathlib.Path, script: pathlib.Path
) -> None:
    root, log = tree(tmp_path, "cx7-ib-link-down.txt"), tmp_path / "calls"
    resetter = link_reset.LinkResetter(root, infiniband=[argv(script, root, log, "up:400")])
    src = node_source.SimSource("n1", gpus=2)
    src.processes[1] = [4242]
    busy = executor(resetter, src).execute(command(["mlx5_3/1"]))
    assert (busy.status, busy.detail) == ("refused", "compute processes still run: GPU 1: pids 4242")
    assert calls(log) == []
    plain = execution.CommandExecutor("n1", src, None).execute(command(["mlx5_3/1"], id="other"))
    assert plain.status == "failed"
    assert "cannot reset RDMA ports" in plain.detail


def test_the_default_bounce_commands_are_ip_link_and_ibportstate_by_direct_route(
    tmp_path: pathlib.Path,
) -> None:
    roce = link_reset.LinkResetter(tree(tmp_path, "cx6dx-roce-healthy.txt"))
    (port,) = [p for p in roce.read_ports() if p.name == "mlx5_1/1"]
    assert roce._argvs(port) == [
        ["ip", "link", "set", "dev", port.netdev, "down"], ["ip", "link", "set", "dev", port.netdev, "up"]
    ]  # fmt: skip
    ib = link_reset.LinkResetter(
        rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), tmp_path / "ib")
    )
    (port,) = [p for p in ib.read_ports() if p.name == "mlx5_3/1"]
    assert ib._argvs(port) == [["ibportstate", "-C", "mlx5_3", "-P", "1", "-D", "0", "1", "reset"]]
    with pytest.raises(ValueError, match=r"unknown placeholder \{ifname\}"):
        config.AgentSettings(port_reset_ethernet=[["ip", "link", "set", "{ifname}", "down"]])


def test_commands_name_ports_only_where_they_take_them() -> None:
    with pytest.raises(ValueError, match="reset_port needs ports"):
        command([])
    with pytest.raises(ValueError, match="reboot_node takes no ports"):
        command(["mlx5_0/1"], action="reboot_node")
    with pytest.raises(ValueError, match="pattern"):
        command(["mlx5_0 1"])
    plain = command([], action="validate")
    assert b'"ports"' not in codec.encode(plain), "left out while empty: what an older agent decodes"


def test_the_bounce_commands_come_from_the_environment_as_json() -> None:
    argv = ["ibportstate", "-C", "{device}", "-P", "{port}", "-D", "0", "{port}", "reset"]
    s = config.load(env={"HEALER_AGENT_PORT_RESET_INFINIBAND": json.dumps([argv])})
    assert s.agent.port_reset_infiniband == [argv]
    with pytest.raises(errors.PermanentError, match="not a JSON list of argument lists"):
        config.load(env={"HEALER_AGENT_PORT_RESET_ETHERNET": "ip link set dev {netdev} down"})
