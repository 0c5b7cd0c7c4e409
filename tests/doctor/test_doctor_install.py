"""``healer doctor`` runs on an agent-only install: its whole path (the rule pack included) imports none
of the controller's extras."""

from __future__ import annotations

import subprocess
import sys

from tests.packaging import test_agent_install

PROBE = """
import sys
from healer import cli
from healer.agent import doctor_host, doctor_run
from tests.fakes import fake_pynvml
cli.build_parser().parse_args(["doctor", "--json"])
options = doctor_run.Options(node="n", nvml=fake_pynvml.FakeNvml(2).module(),
                             paths=doctor_host.HostPaths(sysfs_root="/nonexistent"))
report = doctor_run.run(options)
assert report.by_id("rules.fed") and report.by_id("nvml.fields"), report.lines()
print("HEAVY=" + ",".join(sorted({m.split(".")[0] for m in sys.modules} & HEAVY)))
"""


def test_the_doctor_imports_nothing_from_the_controller_extras() -> None:
    code = f"HEAVY = {set(test_agent_install.HEAVY)!r}\n{PROBE}"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=test_agent_install.ROOT, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line == "HEAVY=", f"the doctor imported {line.removeprefix('HEAVY=')}"
