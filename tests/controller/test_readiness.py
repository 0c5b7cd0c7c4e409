"""``Controller.ready()``, which /readyz serves: ready once started with rules loaded and its role
known; not ready once disconnected from NATS or when one of its own tasks has stopped."""

from __future__ import annotations

import pytest

from healer import testing
from tests.controller.conftest import Harness

pytestmark = pytest.mark.nats


async def test_a_started_controller_is_ready_and_says_why(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    verdict = ctl.ready()
    assert verdict.ready, verdict.summary()
    assert verdict.checks["rules"].detail == "1 rules"
    assert verdict.checks["model"].detail.startswith("off")
    assert verdict.checks["role"].detail in ("leader", "standby")


async def test_a_disconnected_controller_is_not_ready(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    await harness.crash(ctl)  # tasks stopped, connection closed
    verdict = ctl.ready()
    assert not verdict.ready
    assert verdict.checks["nats"].ok is False
    assert verdict.checks["tasks"].ok is False
    assert "controller-ticks" in verdict.checks["tasks"].detail
