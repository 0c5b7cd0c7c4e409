"""Exit codes and messages a new SRE meets (issue #23): every setting to fix is exit 2 with one line
naming it, success prints a line, times read as times. Real processes, dead or busy ports."""

from __future__ import annotations

import pathlib
import shutil

from healer.cli import controller_cmd
from tests.cli.test_first_contact import ENV, EXIT_USAGE, busy_port, dead_url, last_line, run

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_config_show_with_a_bad_file_is_exit_2_in_one_line_naming_the_setting(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nats: [1\n")
    done = run("config", "show", "--config", str(bad))
    assert done.returncode == EXIT_USAGE
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    line = last_line(done)
    assert str(bad) in line
    assert "line 2" in line
    assert "--config / HEALER_CONFIG" in line
    done = run("config", "show", "--config", str(tmp_path / "missing.yaml"))
    assert done.returncode == EXIT_USAGE
    assert "No such file" in last_line(done)


def test_ui_on_a_busy_port_is_exit_2_naming_ui_port_before_nats_is_tried() -> None:
    with busy_port() as port:
        done = run("ui", "--port", str(port), "--nats", dead_url())
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert f":{port}" in line
    assert "ui.port" in line
    assert "--port" in line
    assert "nats.connect_retry" not in done.stderr  # found before connecting


def test_rules_check_and_test_of_a_missing_path_are_exit_2() -> None:
    for action in ("check", "test"):
        done = run("rules", action, "/nonexistent")
        assert done.returncode == EXIT_USAGE, done
        assert "/nonexistent" in last_line(done)


def test_demo_with_too_few_nodes_for_its_scenario_is_exit_2_naming_nodes() -> None:
    done = run("demo", "--nodes", "10", "--duration", "1", timeout=60)
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert "--nodes 10" in line
    assert "give --nodes" in line
    assert "nats-server" not in done.stdout  # nothing was started


def test_demo_with_broken_rules_names_the_users_file_not_a_temporary_copy(tmp_path: pathlib.Path) -> None:
    pack = tmp_path / "my-rules"
    shutil.copytree(ROOT / "rules", pack)
    target = pack / "anomaly.yaml"
    target.write_text(target.read_text().replace("severity: ", "severity: bogus-", 1))
    done = run("demo", "--rules", str(pack), "--duration", "1", timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"{target}:" in done.stderr
    assert "healer-demo-" not in done.stderr


def test_a_log_actuator_controller_without_admission_fails_before_connecting() -> None:
    env = {k: v for k, v in ENV.items() if k != "HEALER_CONTROLLER_ADMISSION"}
    done = run("controller", "--nats", dead_url(), "--metrics-port", "0", env=env)
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert "controller.admission" in line
    assert "'log' actuator lists no nodes" in line
    assert "nats.connect_retry" not in done.stderr


def test_breaker_status_prints_times_people_read() -> None:
    now = 1_780_000_000.0
    state = {
        "open": True,
        "opened_at": now - 120,
        "reason": "4 nodes in 3600s would exceed 3",
        "entries": [["gpu-01", now - 600, "inc-1"], ["gpu-02", now - 300, "inc-2"]],
    }
    text = "\n".join(controller_cmd.breaker_lines(state, 3600.0, now=now))
    assert text.startswith("breaker OPEN since 2026-05-28 20:24:40 UTC (2 min ago): 4 nodes")
    assert "gpu-01  2026-05-28 20:16:40 UTC (10 min ago)  incident inc-1" in text
    assert str(int(now - 600)) not in text  # no unix timestamps
    assert controller_cmd.when(None) == "never"
