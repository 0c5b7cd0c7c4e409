"""``healer doctor``'s host checks on fixture trees: RDMA ports from recorded sysfs, privileges from a
procfs status, Fabric Manager from /proc, and the rungs an unprivileged agent could not climb."""

from __future__ import annotations

import pathlib

import pytest

from healer.agent import doctor, doctor_host, doctor_rules
from tests.doctor import helpers
from tests.fakes import fake_pynvml as f

Status = doctor.Status


def rungs(report: doctor.Report) -> dict[str, doctor.Status]:
    return {c.data["rung"]: c.status for c in report.by_id("rungs")}


def test_roce_ports_are_read_with_their_counters(tmp_path: pathlib.Path) -> None:
    report = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path, "cx6dx-roce-healthy.txt"))
    ports = report.by_id("rdma.ports")
    assert ports
    assert all(c.status is Status.OK for c in ports)
    first = ports[0].data
    assert first["port"] == "mlx5_0/1"
    assert first["link_layer"] == "Ethernet"
    assert first["state"] == 4
    assert "symbol_error" in first["counters"]
    assert "port_xmit_data_bytes" in first["counters"]
    assert "rdma-port-down" not in helpers.one(report, "rules.fed").data["unfed"]


def test_a_node_without_rdma_ports_leaves_the_port_rules_unfed_as_a_fact(tmp_path: pathlib.Path) -> None:
    report = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path))
    assert helpers.one(report, "rdma.ports").status is Status.INFO
    unfed = helpers.one(report, "rules.fed").data["unfed"]
    assert unfed["rdma-port-down"]["missing"] == ["rdma_ports"]
    assert rungs(report)["reset_port"] is Status.INFO


def test_roce_port_reset_needs_cap_net_admin(tmp_path: pathlib.Path) -> None:
    """The shipped systemd unit's capabilities (CAP_SYS_ADMIN, CAP_SYSLOG) cannot bounce a RoCE link."""
    shipped = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path / "a", "cx6dx-roce-healthy.txt"))
    assert rungs(shipped)["reset_port"] is Status.WARN
    granted = helpers.paths(tmp_path / "b", "cx6dx-roce-healthy.txt", caps=helpers.ROCE_CAPS)
    allowed = rungs(helpers.run(f.FakeNvml(1), granted))["reset_port"]
    assert allowed is (Status.OK if doctor_rules.netlink_allowed() else Status.WARN)


def test_infiniband_port_reset_needs_the_umad_device(tmp_path: pathlib.Path) -> None:
    host = helpers.paths(tmp_path, "cx7-ib-congested.txt")
    assert rungs(helpers.run(f.FakeNvml(1), host))["reset_port"] is Status.WARN  # no umad device
    (pathlib.Path(host.dev_root) / "infiniband").mkdir()
    (pathlib.Path(host.dev_root) / "infiniband" / "umad0").write_bytes(b"")
    assert rungs(helpers.run(f.FakeNvml(1), host))["reset_port"] is Status.OK


def test_an_unprivileged_agent_is_told_which_rungs_would_fail(tmp_path: pathlib.Path) -> None:
    host = helpers.paths(tmp_path, "cx6dx-roce-healthy.txt", uid=1000, caps=0, kmsg=False)
    report = helpers.run(f.FakeNvml(1), host, reboot_command=["systemctl", "reboot"])
    assert helpers.one(report, "host.privileges").data == {"uid": 1000, "capabilities": [], "host_pid": True}
    got = rungs(report)
    assert got["power_limit"] is Status.WARN
    assert got["reset_gpu"] is Status.WARN
    assert got["reset_port"] is Status.WARN
    assert got["reboot_node"] is Status.OK  # a command is configured; running it is the operator's call
    assert report.exit_code in (1, 2)


def test_reboot_node_without_a_command_would_fail(tmp_path: pathlib.Path) -> None:
    report = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path))
    assert rungs(report)["reboot_node"] is Status.WARN


def test_fabric_manager_must_run_where_gpus_report_a_fabric(tmp_path: pathlib.Path) -> None:
    down = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path / "a", fabric_manager=False))
    assert helpers.one(down, "fabric_manager").status is Status.FAIL
    pcie = f.FakeNvml(1)
    pcie.gpus[0].unsupported.add("nvmlDeviceGetGpuFabricInfo")  # a PCIe card: no NVLink fabric
    alone = helpers.run(pcie, helpers.paths(tmp_path / "b", fabric_manager=False))
    assert helpers.one(alone, "fabric_manager").status is Status.INFO


def test_the_job_map_directory_is_checked_when_set(tmp_path: pathlib.Path) -> None:
    missing = doctor_host.run(
        doctor_host.HostPaths(job_map_dir=str(tmp_path / "nope"), sysfs_root=str(tmp_path)),
        fabric_expected=False,
    )
    assert [c.status for c in missing.checks if c.id == "job_map"] == [Status.WARN]
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "0").write_text("job-1\n")
    found = doctor_host.run(
        doctor_host.HostPaths(job_map_dir=str(tmp_path / "jobs"), sysfs_root=str(tmp_path)),
        fabric_expected=False,
    )
    assert [c.data.get("files") for c in found.checks if c.id == "job_map"] == [1]


def test_dcgmi_version_is_read_when_installed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in dcgmi on PATH prints what DCGM 3.3 prints; without one the check warns."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    facts = doctor_host.run(doctor_host.HostPaths(sysfs_root=str(tmp_path)), fabric_expected=False)
    assert [c.status for c in facts.checks if c.id == "dcgmi"] == [Status.WARN]
    dcgmi = bin_dir / "dcgmi"
    dcgmi.write_text("#!/bin/sh\necho 'dcgmi  version: 3.3.5'\n")
    dcgmi.chmod(0o755)
    facts = doctor_host.run(doctor_host.HostPaths(sysfs_root=str(tmp_path)), fabric_expected=False)
    check = next(c for c in facts.checks if c.id == "dcgmi")
    assert check.status is Status.OK
    assert check.data["version"] == "3.3.5"


def test_the_identity_is_read_from_procfs(tmp_path: pathlib.Path) -> None:
    proc = helpers.proc_tree(tmp_path, uid=0, caps=helpers.ROCE_CAPS)
    assert doctor_host.identity(proc) == (0, frozenset({"CAP_SYS_ADMIN", "CAP_SYSLOG", "CAP_NET_ADMIN"}))


def test_without_the_rule_pack_rules_and_rungs_are_not_judged(tmp_path: pathlib.Path) -> None:
    report = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path), rules_dir=str(tmp_path / "no-rules"))
    assert helpers.one(report, "rules.fed").status is Status.INFO
    assert not report.by_id("rungs")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.yaml").write_text("rules:\n  - id: broken\n    when: temp_c >>> 3\n")
    broken = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path / "b"), rules_dir=str(tmp_path / "bad"))
    assert helpers.one(broken, "rules.fed").status is Status.WARN
