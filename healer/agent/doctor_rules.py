"""What the doctor's findings mean for the rule pack: rules this node cannot feed, rungs that would fail.

A rule's inputs come from its parsed expressions (``when`` and ``resolve.when``: every metric reference
in the tree, resolved through the metric catalogue to the GpuSample field, the RDMA ports or Fabric
Manager behind it) and from its ``on_event`` (XIDs: NVML events or the kernel log). Nothing is listed
by hand: a rule added to the pack is judged by what it reads.

A rung's needs are the privileges its agent command uses (docs/agent.md, "Privileges by rung"):
``power_limit`` and ``reset_gpu`` root with CAP_SYS_ADMIN (``reset_gpu`` also nvidia-smi),
``reset_port`` CAP_NET_ADMIN and a netlink socket for RoCE ports, the umad devices for InfiniBand ports,
``reboot_node`` an ``agent.reboot_command``.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from typing import Final

from healer import actions
from healer.agent import doctor
from healer.rules import loader, metric_catalog, ruleset, tree

PORTS: Final = "rdma_ports"
XID_SOURCE: Final = "xid_source"


@dataclasses.dataclass(frozen=True, slots=True)
class Feeds:
    """What this node can feed, from the GPU and host checks."""

    unsupported: frozenset[str] = frozenset()
    failing: frozenset[str] = frozenset()
    ports: bool = False
    xid: bool = False


def inputs(rule: ruleset.Rule) -> frozenset[str]:
    """GpuSample fields and sources (``rdma_ports``, ``xid_source``) a rule reads. ``fabric_manager_up``
    is read from /proc wherever the GPUs report a fabric: fed on every node that has one."""
    needs: set[str] = set()
    for expr in (rule.when, rule.resolve_when):
        if expr is None:
            continue
        for node in tree.walk(expr):
            if isinstance(node, tree.Ref | tree.Range):
                needs.update(_metric_inputs(node.name))
    if rule.on_event is not None and rule.on_event.kind == "xid":
        needs.add(XID_SOURCE)
    return frozenset(needs)


def _metric_inputs(name: str) -> set[str]:
    if name in metric_catalog.SAMPLE:
        return {name}
    if name in metric_catalog.DERIVED:
        return {"clocks_event_reasons"}
    if name in metric_catalog.PORT or name == "ports_present":
        return {PORTS}
    return set()


def unfed(rules: ruleset.RuleSet, feeds: Feeds) -> dict[str, dict[str, list[str]]]:
    """rule id -> {"not_supported": fields, "error": fields, "missing": sources}, for rules with any."""
    out: dict[str, dict[str, list[str]]] = {}
    missing_sources = {PORTS} if not feeds.ports else set()
    if not feeds.xid:
        missing_sources.add(XID_SOURCE)
    for rule in rules.rules:
        needs = inputs(rule)
        found = {
            "not_supported": sorted(needs & feeds.unsupported),
            "error": sorted(needs & feeds.failing),
            "missing": sorted(needs & missing_sources),
        }
        if any(found.values()):
            out[rule.id] = found
    return out


def load(rules_dir: str) -> ruleset.RuleSet | str:
    """The rule pack, or why it could not be read."""
    result = loader.load_paths([rules_dir])
    if result.ruleset is None:
        errs = [d for d in result.diagnostics if d.severity == "error"]
        return (
            f"{len(errs)} errors, first: {errs[0].path}:{errs[0].line}: {errs[0].message}"
            if errs
            else "no rules"
        )
    return result.ruleset


def rules_check(rules: ruleset.RuleSet, feeds: Feeds) -> doctor.Check:
    gaps = unfed(rules, feeds)
    data = {"rules": len(rules.rules), "unfed": gaps}
    if not gaps:
        return doctor.Check(
            "rules.fed", doctor.Status.OK, f"this node feeds all {len(rules.rules)} rules", data=data
        )
    blocked = sorted(r for r, g in gaps.items() if g["error"] or set(g["missing"]) - {PORTS})
    if blocked:
        return doctor.Check(
            "rules.fed",
            doctor.Status.WARN,
            f"{len(blocked)} rules cannot fire until a check above is fixed: "
            f"{', '.join(blocked)} ({len(gaps) - len(blocked)} more read what this node has not)",
            "fix the failing checks above (data.unfed says what each rule lacks)",
            data=data,
        )
    return doctor.Check(
        "rules.fed",
        doctor.Status.INFO,
        f"{len(gaps)} rules read what this node has not (NotSupported fields, no RDMA ports): "
        f"{', '.join(sorted(gaps))}",
        data=data,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Privileges:
    caps: frozenset[str]
    root: bool
    link_layers: frozenset[str]
    """Link layers of this node's RDMA ports (``Ethernet``, ``InfiniBand``)."""
    umad: bool
    reboot_command: Sequence[str] | None
    nvidia_smi: bool = True
    nvml: bool = True
    """NVML answered: without it no GPU action can run, whatever the privileges."""
    host_pid: bool = True
    """In the host's PID namespace: the processes NVML lists on a GPU are visible (a reset waits on them)."""
    power_write: bool | None = None
    """The write test's outcome where it ran."""


def netlink_allowed() -> bool:
    """Whether this process may open a netlink route socket (``RestrictAddressFamilies`` may forbid it)."""
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
    except (OSError, AttributeError):
        return False
    return True


NEEDS: Final = {
    "power_limit": "root with CAP_SYS_ADMIN (nvmlDeviceSetPowerManagementLimit)",
    "reset_gpu": "root with CAP_SYS_ADMIN, the host's PID namespace, and nvidia-smi (nvidia-smi --gpu-reset)",
    "reset_port": "RoCE: CAP_NET_ADMIN and AF_NETLINK (ip link set); "
    "InfiniBand: read-write /dev/infiniband/umad* (ibportstate)",
    "reboot_node": "agent.reboot_command (the command's own needs: systemctl reboot as root)",
}
"""What each agent-side action needs; docs/agent.md's "Privileges by rung" table says the same (tested)."""


def rung_checks(rungs: frozenset[str], p: Privileges, *, netlink: bool) -> list[doctor.Check]:
    """One check per action the pack uses on this node: ``ok`` or why it would fail."""
    admin = p.root and "CAP_SYS_ADMIN" in p.caps
    power = p.power_write if p.power_write is not None else admin
    no_nvml = "NVML does not answer (see nvml.library)"
    why: dict[str, str | None] = {
        "power_limit": no_nvml if not p.nvml else None if power else f"needs {NEEDS['power_limit']}",
        "reset_gpu": no_nvml
        if not p.nvml
        else None
        if admin and p.host_pid and p.nvidia_smi
        else f"needs {NEEDS['reset_gpu']}",
        "reboot_node": None if p.reboot_command else "agent.reboot_command is unset: the rung fails at once",
        "reset_port": _port_reset(p, netlink),
    }
    out = []
    for rung in sorted(rungs):
        reason = why.get(rung)
        data = {"rung": rung, "needs": NEEDS.get(rung, "")}
        if reason is None:
            out.append(doctor.Check("rungs", doctor.Status.OK, f"{rung}: allowed", data=data))
        elif reason.startswith("n/a"):
            out.append(doctor.Check("rungs", doctor.Status.INFO, f"{rung}: {reason}", data=data))
        else:
            fix = "docs/agent.md, Privileges by rung"
            out.append(
                doctor.Check("rungs", doctor.Status.WARN, f"{rung} would fail: {reason}", fix, data=data)
            )
    return out


def _port_reset(p: Privileges, netlink: bool) -> str | None:
    if not p.link_layers:
        return "n/a: no RDMA ports"
    missing = []
    if "Ethernet" in p.link_layers and not ("CAP_NET_ADMIN" in p.caps and netlink):
        missing.append("RoCE ports need CAP_NET_ADMIN and AF_NETLINK (ip link set)")
    if "InfiniBand" in p.link_layers and not p.umad:
        missing.append("InfiniBand ports need read-write /dev/infiniband/umad* (ibportstate)")
    return "; ".join(missing) or None


def rungs_used(rules: ruleset.RuleSet) -> frozenset[str]:
    """The agent-side actions the pack can ask for: ladder rungs and the power cap (the catalogue's
    ``caps_power`` kind)."""
    used: set[str] = {step for ladder in rules.ladders for step in ladder.steps}
    used.update(a.kind for r in rules.rules for a in r.actions if actions.spec(a.kind).caps_power)
    return frozenset(used)
