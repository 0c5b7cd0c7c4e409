"""docs/agent.md's "Privileges by rung", the shipped units and ``healer doctor`` agree: the doctor, given
what the systemd unit and the DaemonSet grant, allows exactly the rungs the table says each allows, and
the table's "needs" column is the doctor's own text."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from healer import config
from healer.agent import doctor, doctor_host, doctor_rules

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNGS = frozenset(doctor_rules.NEEDS)
PORTS = frozenset({"Ethernet", "InfiniBand"})


def table() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "agent.md").read_text()
    section = text.split("## Privileges by rung", 1)[1].split("\n## ", 1)[0]
    rows = [r.strip().strip("|").split(" | ") for r in section.splitlines() if r.startswith("| `")]
    return {cells[0].strip("` "): [c.strip() for c in cells[1:]] for cells in rows}


def allowed(p: doctor_rules.Privileges, netlink: bool) -> dict[str, bool]:
    checks = doctor_rules.rung_checks(RUNGS, p, netlink=netlink)
    return {c.data["rung"]: c.status is doctor.Status.OK for c in checks}


def systemd_privileges() -> tuple[doctor_rules.Privileges, bool]:
    unit: dict[str, str] = {}
    for line in (ROOT / "deploy" / "systemd" / "healer-agent.service").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            unit[key.strip()] = value.strip()
    caps = frozenset(unit["CapabilityBoundingSet"].split()) & frozenset(doctor_host.CAPABILITIES)
    p = doctor_rules.Privileges(
        caps=caps, root=unit["User"] == "root", link_layers=PORTS,
        umad=unit.get("PrivateDevices") == "no", reboot_command=config.AgentSettings().reboot_command,
    )  # fmt: skip
    return p, "AF_NETLINK" in unit["RestrictAddressFamilies"].split()


def daemonset_privileges() -> tuple[doctor_rules.Privileges, bool]:
    docs = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "agent-daemonset.yaml").read_text())
        if d
    ]
    pod: dict[str, Any] = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    caps = frozenset(f"CAP_{c}" for c in sc["capabilities"]["add"]) & frozenset(doctor_host.CAPABILITIES)
    mounts = {m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])}
    p = doctor_rules.Privileges(
        caps=caps, root=sc.get("runAsUser") == 0, link_layers=PORTS,
        umad=any(m.startswith("/dev/infiniband") for m in mounts),
        reboot_command=config.AgentSettings().reboot_command, host_pid=bool(pod.get("hostPID")),
    )  # fmt: skip
    return p, bool(pod.get("hostNetwork"))


def test_the_table_lists_every_rung_with_the_doctors_needs() -> None:
    rows = table()
    assert set(rows) == RUNGS
    for rung, cells in rows.items():
        assert cells[0] == doctor_rules.NEEDS[rung], rung


@pytest.mark.parametrize(("column", "unit"), [(1, systemd_privileges), (2, daemonset_privileges)])
def test_the_doctor_allows_what_the_table_says_each_unit_grants(column: int, unit: Any) -> None:
    privileges, netlink = unit()
    said = {rung: cells[column].split(":")[0] for rung, cells in table().items()}
    assert set(said.values()) <= {"yes", "no"}
    assert {r: s == "yes" for r, s in said.items()} == allowed(privileges, netlink)


def test_the_shipped_units_allow_the_power_cap() -> None:
    """The containment every default rule pack relies on works as shipped, on both."""
    for unit in (systemd_privileges, daemonset_privileges):
        privileges, netlink = unit()
        assert allowed(privileges, netlink)["power_limit"]
