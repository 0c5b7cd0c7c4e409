"""A real multi-node Slurm (munged + slurmctld + 4 slurmd) for tests, started from start.sh.

``slurm_cluster`` is a session fixture: one cluster for the whole run, on free loopback ports, in a temp
directory, torn down by the PIDs in its pid files. Without the Slurm packages the tests skip, unless the
``CI`` environment variable is set: there a missing Slurm is a failure.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

HERE = pathlib.Path(__file__).resolve().parent
NODES = ("gpu01", "gpu02", "gpu03", "gpu04")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "squeue", "sinfo", "sbatch", "scancel")


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    state_dir: pathlib.Path
    conf: pathlib.Path
    nodes: tuple[str, ...] = NODES

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=check)


def _missing() -> list[str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [d for d in DAEMONS if shutil.which(d, path=path) is None]


def _free_ports(count: int) -> int:
    """A base port with ``count`` consecutive free loopback ports after it."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base + count > 65000:
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free loopback ports")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = _missing()
    message = ""
    if missing:
        message = f"Slurm is not installed (missing {', '.join(missing)}); .ci/run installs it"
    elif os.geteuid() != 0:
        message = "the test Slurm runs its daemons as SlurmUser=root and needs root"
    if message:
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # Not under pytest's tmp dirs: munged wants every directory above its socket executable by all.
    state_dir = pathlib.Path(tempfile.mkdtemp(prefix="healer-slurm-"))
    state_dir.chmod(0o711)
    base = _free_ports(5)
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    try:
        started = subprocess.run(
            [str(HERE / "start.sh"), str(state_dir), str(base), str(base + 1)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if started.returncode != 0:
            logs = "\n".join(p.read_text()[-2000:] for p in sorted((state_dir / "log").glob("*.log")))
            pytest.fail(f"start.sh failed ({started.returncode}): {started.stderr}\n{logs}")
        yield SlurmCluster(state_dir=state_dir, conf=state_dir / "etc" / "slurm.conf")
    finally:
        subprocess.run([str(HERE / "stop.sh"), str(state_dir)], env=env, timeout=60, check=False)
        shutil.rmtree(state_dir, ignore_errors=True)
