"""The actuator contract: outcomes instead of exceptions, retries of temporary failures only, deadlines,
node-name mapping, the log actuator."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pydantic
import pytest
import structlog

from healer import actions, config, errors
from healer.actuators import base

FAST = config.ActuatorSettings(retry_attempts=3, retry_initial_delay_s=0.0, retry_max_delay_s=0.0)


def req(**kw: object) -> base.ActionRequest:
    return base.ActionRequest.model_validate(
        {"incident_id": "inc-1", "kind": "cordon", "node": "gpu01", **kw}
    )


async def test_temporary_failures_are_retried_then_reported() -> None:
    calls = 0

    async def work() -> base.ActionOutcome:
        nonlocal calls
        calls += 1
        raise errors.TemporaryError("controller away", delay=0.0)

    outcome = await base.guarded("t", FAST, req(), work)
    assert calls == 3
    assert outcome.status == "failed-temporary"
    assert outcome.detail == "controller away"


async def test_a_temporary_failure_that_clears_ends_done() -> None:
    results: list[Exception | None] = [errors.TemporaryError("busy", delay=0.0), None]

    async def work() -> base.ActionOutcome:
        error = results.pop(0)
        if error:
            raise error
        return base.ActionOutcome(status="done")

    assert (await base.guarded("t", FAST, req(), work)).status == "done"


async def test_permanent_failures_are_not_retried() -> None:
    calls = 0

    async def work() -> base.ActionOutcome:
        nonlocal calls
        calls += 1
        raise errors.PermanentError("no such node")

    outcome = await base.guarded("t", FAST, req(), work)
    assert (calls, outcome.status, outcome.detail) == (1, "failed-permanent", "no such node")


async def test_an_unexpected_exception_never_leaks() -> None:
    async def work() -> base.ActionOutcome:
        raise KeyError("boom")

    with structlog.testing.capture_logs() as logs:
        outcome = await base.guarded("t", FAST, req(), work)
    assert outcome.status == "failed-permanent"
    assert "KeyError" in outcome.detail
    assert any(e["event"] == "actuator.crashed" for e in logs)


async def test_a_past_deadline_refuses_without_acting() -> None:
    async def work() -> base.ActionOutcome:
        raise AssertionError("must not run")

    outcome = await base.guarded("t", FAST, req(deadline=time.time() - 1), work)
    assert outcome.status == "refused"


def test_node_names_are_identity_by_default_and_follow_template_then_map() -> None:
    assert base.NodeNames()("gpu01.dc1.example") == "gpu01.dc1.example"
    names = base.NodeNames("{short}", {"odd.dc1": "gpu-a01"})
    assert names("gpu01.dc1.example") == "gpu01"
    assert names("odd.dc1") == "gpu-a01"


def test_node_map_file_is_read_from_settings(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("gpu01.dc1: slurm-gpu-01\n")
    names = base.NodeNames.from_settings(config.ActuatorSettings(node_map_file=str(path)))
    assert names("gpu01.dc1") == "slurm-gpu-01"
    assert names("gpu02.dc1") == "gpu02.dc1"


def test_a_bad_template_is_a_permanent_error() -> None:
    with pytest.raises(errors.PermanentError):
        base.NodeNames("{rack}-{node}")


def test_worst_item_decides_the_overall_status() -> None:
    done = base.ItemResult(item="a", status="done")
    already = base.ItemResult(item="b", status="already-done")
    stuck = base.ItemResult(item="c", status="failed-permanent", detail="no requeue")
    assert base.worst([done, already]) == "done"
    assert base.worst([already]) == "already-done"
    assert base.worst([done, stuck]) == "failed-permanent"
    record = base.ActionOutcome(status="failed-permanent", detail="1 of 2", items=[done, stuck]).record(
        "migrate", 5.0
    )
    assert record.detail == "1 of 2; c: failed-permanent: no requeue"


async def test_log_actuator_only_logs_and_dry_run_says_so() -> None:
    actuator = base.LogActuator()
    with structlog.testing.capture_logs() as logs:
        done = await actuator.apply(req(kind="notify", summary="hot"))
        planned = await actuator.apply(req(kind="notify", dry_run=True))
    assert done.status == "done"
    assert planned.status == "planned"
    assert planned.plan == ["log notify node=gpu01 incident=inc-1"]
    assert [e["summary"] for e in logs if e["event"] == "actuator.logged"] == ["hot"]


def test_the_request_kinds_are_the_catalogues() -> None:
    """``RequestKind`` is what the registry says actuators are asked (#40: derived, not a second list):
    every scheduler verb and every kind with an actuator, and notify; anything else is refused."""
    for kind in actions.REQUESTS:
        assert base.ActionRequest(incident_id="i", kind=kind, node="n").kind == kind
    with pytest.raises(pydantic.ValidationError, match="no actuator is asked for 'drain'"):
        base.ActionRequest(incident_id="i", kind="drain", node="n")
    assert "drain" not in actions.REQUESTS  # a drain asks for a cordon
    assert "cordon" in actions.REQUESTS
    assert "hardware_replacement" not in actions.REQUESTS  # recorded, never sent


async def test_each_retry_is_logged_with_its_attempt_number_across_the_first_bare_attempt() -> None:
    calls = 0

    async def work() -> base.ActionOutcome:
        nonlocal calls
        calls += 1
        raise errors.TemporaryError("busy", delay=0.0)

    with structlog.testing.capture_logs() as logs:
        outcome = await base.guarded("t", FAST, req(), work)
    assert (calls, outcome.status) == (3, "failed-temporary")
    assert [e["attempt"] for e in logs if e["event"] == "actuator.retry"] == [1, 2]


def test_the_wait_after_each_attempt_doubles_up_to_the_cap_and_honours_the_errors_own_delay() -> None:
    s = config.ActuatorSettings(retry_attempts=5, retry_initial_delay_s=0.01, retry_max_delay_s=0.04)
    assert [base._delay(s, n, None) for n in (1, 2, 3, 4, 200)] == [0.01, 0.02, 0.04, 0.04, 0.04]
    assert base._delay(s, 1, errors.TemporaryError("x", delay=0.03)) == 0.03
    assert base._delay(s, 1, errors.TemporaryError("x", delay=9.0)) == 0.04


async def test_a_deadline_passed_during_the_first_attempt_ends_it_without_a_retry() -> None:
    calls = 0

    async def work() -> base.ActionOutcome:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.06)
        raise errors.TemporaryError("busy", delay=0.0)

    outcome = await base.guarded("t", FAST, req(deadline=time.time() + 0.05), work)
    assert (calls, outcome.status) == (1, "failed-temporary")
