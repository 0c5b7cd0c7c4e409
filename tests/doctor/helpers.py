"""Fixture trees for ``healer doctor``: a procfs with this process's status, a device tree, sysfs."""

from __future__ import annotations

import pathlib

from healer.agent import doctor, doctor_host, doctor_run
from healer.telemetry import rdma
from tests.fakes import fake_pynvml

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures"
ROOT_CAPS = 1 << 21 | 1 << 34  # CAP_SYS_ADMIN, CAP_SYSLOG: the shipped systemd unit's bounding set
ROCE_CAPS = ROOT_CAPS | 1 << 12  # and CAP_NET_ADMIN


def proc_tree(base: pathlib.Path, *, uid: int = 0, caps: int = ROOT_CAPS, fabric_manager: bool = True) -> str:
    """A procfs with ``self/status`` (uid, CapEff) and, if asked, a running nv-fabricmanager."""
    (base / "self").mkdir(parents=True)
    (base / "self" / "status").write_text(
        f"Name:\thealer\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapEff:\t{caps:016x}\n"
    )
    (base / "2").mkdir()
    (base / "2" / "comm").write_text("kthreadd\n")  # the host's PID namespace
    if fabric_manager:
        (base / "4242").mkdir()
        (base / "4242" / "comm").write_text("nv-fabricmanager\n")
    return str(base)


def sysfs_tree(base: pathlib.Path, *recordings: str) -> str:
    base.mkdir(parents=True, exist_ok=True)
    for name in recordings:
        rdma.write_tree((FIXTURES / "sysfs" / name).read_text(), base)
    return str(base)


def paths(tmp: pathlib.Path, *recordings: str, uid: int = 0, caps: int = ROOT_CAPS,
          fabric_manager: bool = True, kmsg: bool = True) -> doctor_host.HostPaths:  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    kmsg_path = tmp / "kmsg"
    if kmsg:
        kmsg_path.write_bytes(b"6,1,0,-;hello\n")
    (tmp / "dev").mkdir()
    return doctor_host.HostPaths(
        kmsg=str(kmsg_path),
        sysfs_root=sysfs_tree(tmp / "sys", *recordings),
        proc_root=proc_tree(tmp / "proc", uid=uid, caps=caps, fabric_manager=fabric_manager),
        self_proc=str(tmp / "proc"),
        dev_root=str(tmp / "dev"),
    )


def run(fake: fake_pynvml.FakeNvml, host: doctor_host.HostPaths, **kw: object) -> doctor.Report:
    options = doctor_run.Options(node="gpu-017", nvml=fake.module(), paths=host, **kw)  # type: ignore[arg-type]
    return doctor_run.run(options)


def one(report: doctor.Report, check_id: str, gpu: int | None = None) -> doctor.Check:
    found = [c for c in report.checks if c.id == check_id and c.gpu == gpu]
    assert len(found) == 1, (check_id, gpu, [c.line() for c in report.checks])
    return found[0]
