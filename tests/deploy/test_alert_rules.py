"""deploy/prometheus/healer-alerts.yaml, checked and unit-tested by Prometheus's own promtool: a shard
none of whose controllers sees a lease holder alerts; one whose leader is up does not; storage that
would refuse writes alerts."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "healer-alerts.yaml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Prometheus) is not installed")

UNIT = """
rule_files: [{rules}]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'healer_controller_leaderless{{shard="0", pod="a"}}'
        values: '1x10'
      - series: 'healer_controller_leaderless{{shard="0", pod="b"}}'
        values: '1x10'
      - series: 'healer_controller_leaderless{{shard="1", pod="c"}}'
        values: '1x10'
      - series: 'healer_controller_leaderless{{shard="1", pod="d"}}'
        values: '0x10'
      - series: 'healer_controller_leader{{pod="d"}}'
        values: '1x10'
      - series: 'healer_jetstream_storage_ok{{pod="a"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 2m
        alertname: HealerShardLeaderless
        exp_alerts:
          - exp_labels: {{severity: critical, shard: "0"}}
            exp_annotations:
              summary: "no controller has led shard 0 for longer than the lease TTL"
              description: >-
                Nothing is healed on this shard. `healer nats status` shows the lease; the controllers'
                log line lease.acquire_failed says why they cannot take it; /readyz shows jetstream.
      - eval_time: 2m
        alertname: HealerNoControllerReports
        exp_alerts: []
      - eval_time: 2m
        alertname: HealerJetStreamStorageProblem
        exp_alerts:
          - exp_labels: {{severity: critical}}
            exp_annotations:
              summary: JetStream storage would refuse healer's writes, or a stream has no byte limit
              description: >-
                The controller's log line jetstream.storage_problem says which stream and why; `healer nats
                status` shows every stream. Run `healer nats provision` so every stream reserves its space.
"""


def test_the_alert_rules_load() -> None:
    done = subprocess.run(
        [PROMTOOL or "promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_leaderless_shard_and_a_storage_problem_alert(tmp_path: pathlib.Path) -> None:
    unit = tmp_path / "unit.yaml"
    unit.write_text(UNIT.format(rules=RULES))
    done = subprocess.run(
        [PROMTOOL or "promtool", "test", "rules", str(unit)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
