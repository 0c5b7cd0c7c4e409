"""Job-level slowdown incidents (controller/failslow/job_slowdowns.py): opened for a slower job nobody is
blamed in, updated when the slowdown moves, resolved when the job is back at its baseline or a straggler is
named."""

from __future__ import annotations

from healer.controller.failslow import detector, job_slowdowns
from healer.controller.incidents import book
from healer.schemas import incidents

T0 = 1_800_000_000.0


def slow(job: str, pct: float = 12.0) -> detector.JobSlowdown:
    return detector.JobSlowdown(job, pct, T0, ("n1", "n2"), f"job {job} runs {pct:g} % slower since T")


def opened(job: str, pct: float = 12.0) -> book.Incident:
    return job_slowdowns.new_incident(slow(job, pct), f"i-{job}", T0, incidents.Mode.ENFORCE)


def test_a_slower_job_with_nobody_named_opens_one_info_incident_about_the_job() -> None:
    plan = job_slowdowns.plan([], [slow("41")], {"41"}, set())
    (new,) = plan.open
    inc = job_slowdowns.new_incident(new, "i1", T0, incidents.Mode.ENFORCE)
    assert (inc.rule_id, inc.severity, inc.node) == ("job-slowdown", "info", "job.41")
    assert inc.domain is not None
    assert (inc.domain.key, inc.domain.value, inc.domain.members) == ("job", "41", ["n1", "n2"])
    assert inc.actions == []
    assert inc.evidence["slower_pct"] == 12.0
    assert "nobody is named" in inc.summary
    # already open: not again
    assert job_slowdowns.plan([inc], [slow("41")], {"41"}, set()).open == ()


def test_an_open_job_slowdown_is_updated_when_it_moves_and_resolved_when_it_ends() -> None:
    inc = opened("41")
    assert job_slowdowns.plan([inc], [slow("41", 14.0)], {"41"}, set()) == job_slowdowns.Plan()
    ((same, moved),) = job_slowdowns.plan([inc], [slow("41", 20.0)], {"41"}, set()).update
    assert (same, moved.slower_pct) == (inc, 20.0)
    assert job_slowdowns.plan([inc], [], {"41"}, set()) == job_slowdowns.Plan()  # held: a GPU lags, unnamed
    assert job_slowdowns.plan([inc], [], set(), set()).resolve == ((inc, job_slowdowns.RECOVERED),)
    assert job_slowdowns.plan([inc], [], {"41"}, {"41"}).resolve == ((inc, job_slowdowns.NAMED),)


def test_other_incidents_are_left_alone() -> None:
    other = opened("41").model_copy(update={"rule_id": "gpu-straggler"})
    resolved = opened("42").model_copy(update={"state": incidents.IncidentState.RESOLVED})
    plan = job_slowdowns.plan([other, resolved], [slow("42")], {"42"}, set())
    assert plan.resolve == ()
    assert [s.job for s in plan.open] == ["42"]
