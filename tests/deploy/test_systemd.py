"""The systemd units run the documented command lines with the hardening docs/deployment.md promises."""

from __future__ import annotations

import configparser
import shlex

from tests.deploy import manifests as m


def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    """Section → key → values (a key may repeat, as systemd allows)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (m.DEPLOY / "systemd" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def _flags(exec_start: str) -> dict[str, str]:
    return m.flags(shlex.split(exec_start))


def test_units_parse_as_ini_with_the_three_sections() -> None:
    for name in ("healer-agent.service", "healer-controller.service"):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string((m.DEPLOY / "systemd" / name).read_text())
        assert {"Unit", "Service", "Install"} <= set(parser.sections())


def test_agent_unit_runs_the_nvml_agent_as_root_with_only_cap_sys_admin_and_cap_syslog() -> None:
    svc = _unit("healer-agent.service")["Service"]
    (exec_start,) = svc["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[1] == "agent"
    f = _flags(exec_start)
    assert f["--source"] == "nvml"
    assert f["--state-dir"] == "/var/lib/healer"
    assert f["--metrics-port"] == "9741"
    assert svc["StateDirectory"] == ["healer"]  # systemd creates /var/lib/healer
    assert svc["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN CAP_SYSLOG"]  # CAP_SYSLOG: /dev/kmsg
    assert svc["ProtectKernelLogs"] == ["no"]  # yes would hide /dev/kmsg from the kernel-log source
    assert "DynamicUser" not in svc
    assert svc["NoNewPrivileges"] == ["yes"]
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["PrivateDevices"] == ["no"]  # NVML needs /dev/nvidia*
    assert svc["Restart"] == ["always"]


def test_controller_unit_starts_in_dry_run_as_an_unprivileged_user() -> None:
    svc = _unit("healer-controller.service")["Service"]
    (exec_start,) = svc["ExecStart"]
    assert shlex.split(exec_start)[1] == "controller"
    f = _flags(exec_start)
    assert f["--mode"] == "dry-run"
    assert f["--rules"] == "/etc/healer/rules"
    assert f["--metrics-port"] == "9742"
    assert svc["User"] == ["healer"]
    assert svc["CapabilityBoundingSet"] == [""]
    assert svc["PrivateDevices"] == ["yes"]
    assert svc["NoNewPrivileges"] == ["yes"]


def test_units_tell_systemd_when_started_and_keep_a_watchdog() -> None:
    for name in ("healer-agent.service", "healer-controller.service"):
        svc = _unit(name)["Service"]
        assert svc["Type"] == ["notify"], name
        assert svc["NotifyAccess"] == ["main"], name
        assert int(svc["WatchdogSec"][0]) >= 10, name  # the heartbeat sends WATCHDOG=1 every second
