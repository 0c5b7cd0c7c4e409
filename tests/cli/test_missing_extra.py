"""An agent-only install (``pip install healer``: no numpy, scikit-learn, Kubernetes client or aiohttp)
running a command that needs an extra: one line naming the extra, exit 2, no traceback (issue #23).

The agent-only install is simulated in a subprocess by an import hook that refuses the extras' modules,
as Python does when they are not installed (``ModuleNotFoundError`` with the module's name)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.cli.test_first_contact import dead_url

BLOCKED = ("numpy", "sklearn", "skops", "scipy", "kubernetes", "aiohttp")
"""Top-level modules only the extras install."""

AGENT_ONLY = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}
class AgentOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, AgentOnly())
from healer import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def agent_only(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEALER_LOG_FORMAT": "json"}
    env.pop("HEALER_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-c", AGENT_ONLY, *args],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL, cwd=cwd,
    )  # fmt: skip


def commands(tmp: pathlib.Path) -> list[tuple[list[str], str]]:
    url = dead_url()
    (tmp / "t.yaml").write_text("tests: []\n")
    return [
        (["demo", "--duration", "1"], "controller"),
        (["ui", "--nats", url, "--port", "0"], "controller"),
        (["sim", "--nats", url, "--nodes", "1"], "sim"),
        (["replay", str(tmp / "recording"), "--nats", url], "sim"),
        (["controller", "--nats", url, "--metrics-port", "0"], "controller"),
        (["rules", "test", str(tmp / "t.yaml")], "controller"),
        (["model", "info", "models/default"], "controller"),
        (["bench", "controller", "--nodes", "1"], "controller"),
        (["act", "kubernetes", "cordon", "n1"], "controller"),
    ]


@pytest.mark.parametrize("index", range(9), ids=lambda i: f"command{i}")
def test_a_command_missing_an_extra_names_the_extra_in_one_line(index: int, tmp_path: pathlib.Path) -> None:
    argv, extra = commands(tmp_path)[index]
    root = pathlib.Path(__file__).resolve().parents[2]
    done = agent_only(*argv, cwd=root)
    assert "Traceback" not in done.stderr, f"{argv}: {done.stderr[-3000:]}"
    assert done.returncode == 2, f"{argv}: rc={done.returncode} {done.stderr[-2000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"{argv}: {done.stderr}"
    assert f"pip install 'healer[{extra}]'" in lines[0], lines[0]
    assert lines[0].startswith(f"healer {argv[0]}"), lines[0]


def test_a_module_no_extra_provides_keeps_its_traceback() -> None:
    from healer import cli

    assert cli.missing_extra("demo", "numpy.linalg") == "controller"
    assert cli.missing_extra("sim", "numpy") == "sim"
    assert cli.missing_extra("demo", "healer.nonexistent") is None
