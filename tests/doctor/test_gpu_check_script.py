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
