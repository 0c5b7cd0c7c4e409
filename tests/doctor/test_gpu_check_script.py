"""scripts/gpu-check.sh, the first real-GPU run, kept runnable here: its syntax, its no-GPU exit, and its
bus side (scripts/gpu_check.py) against a real agent and nats-server, with the simulated source
standing in for NVML (the only part that differs on a GPU machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from healer.bus import embedded

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_without_a_gpu_the_script_says_so_and_exits_0(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_DEVICE": str(tmp_path / "nvidia0"),
        "GPU_CHECK_OUT": str(tmp_path / "out"),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU on this machine" in done.stdout
    assert not (tmp_path / "out").exists(), "nothing was built or started"


def test_the_bus_check_sees_frames_and_drives_the_power_commands(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    agent = subprocess.Popen(
        [sys.executable, "-m", "healer", "agent", "--node", "gc-1", "--source", "sim", "--sim-gpus", "2",
         "--nats", nats_server.url, "--provision", "--interval", "0.5",
         "--state-dir", str(tmp_path / "state"), "--metrics-port", "0"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        out = tmp_path / "bus.json"
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--nats", nats_server.url,
             "--node", "gc-1", "--seconds", "6", "--power-after", "2", "--out", str(out),
             "--expect-source", "sim"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    result = json.loads(out.read_text())
    assert done.returncode == 0, (result, done.stderr[-2000:])
    assert result["frames"]["count"] >= 4
    assert result["frames"]["seq_gaps"] == 0
    assert result["power"]["set"] == "applied"
    assert result["power"]["restore"] == "applied"
    assert result["power"]["set_seen_in_frame_s"] is not None
    assert result["power"]["restore_seen_in_frame_s"] is not None


def test_frames_from_another_source_fail_the_check() -> None:
    expected = "nvml"
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    from healer.schemas import telemetry

    frame = telemetry.NodeFrame(
        node="n", ts=1.0, seq=0, boot_id="b", agent_version="t", source="sim", gpus=[]
    )
    assert gpu_check.frame_report([frame], [], expected)["ok"] is False
    assert gpu_check.frame_report([], [], expected)["ok"] is False


@pytest.mark.nats
@pytest.mark.slow
@pytest.mark.skipif(
    pathlib.Path("/dev/nvidia0").exists(), reason="a real GPU answers here: run the script itself"
)
def test_on_a_machine_whose_driver_does_not_answer_the_script_fails_with_a_summary(
    tmp_path: pathlib.Path,
) -> None:
    """A device node without a working NVML: the script still runs every step (reusing this venv), stops
    everything it started, and its summary says what failed: the doctor, no frames, the agent's exit."""
    device = tmp_path / "nvidia0"
    device.touch()
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": str(device), "GPU_CHECK_OUT": str(out), "GPU_CHECK_SECONDS": "3",
           "GPU_CHECK_VENV": str(pathlib.Path(sys.executable).parent.parent)}  # fmt: skip
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu-check summary" in done.stdout
    assert "FAIL" in done.stdout
    assert "agent ran to the end: no, it exited early" in done.stdout
    assert json.loads((out / "doctor.json").read_text())["schema"] == "healer.doctor.v1"
    assert json.loads((out / "bus.json").read_text())["frames"]["count"] == 0
    left = subprocess.run(["pgrep", "-f", str(out / "nats")], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", "the script stopped the nats-server it started"
