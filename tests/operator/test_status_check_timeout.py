"""KubeRay >= 1.7 fails a RayJob whose Ray dashboard it could not poll for 300 s (reason
JobStatusCheckTimeoutExceeded, ray-operator/controllers/ray/rayjob_controller.go v1.7.0): the stage is
retried on a fresh cluster with resume, the retry is not counted as a training failure, a bounded
number of times, and the message says what happened."""

from __future__ import annotations

import datetime as dt
from typing import Any

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.attempts import MAX_STATUS_CHECK_TIMEOUTS
from retool_operator.reconcile import CreateChild, Observed, decide
from retool_operator.status import rfc3339
from tests.operator.helpers import T0, rayjob_status, run_of

KUBERAY_MESSAGE = "Job status checks have been failing since 2026-01-01 11:55:00; exceeded timeout of 300s"


def timed_out() -> dict[str, Any]:
    """A RayJob as KubeRay 1.7's checkJobStatusCheckTimeoutAndUpdateStatusIfNeeded leaves it."""
    obj = rayjob_status("Failed", "RUNNING", message=KUBERAY_MESSAGE)
    obj["status"].update(reason="JobStatusCheckTimeoutExceeded", jobStatusCheckFailureStartTime="2026-01-01T11:55:00Z")
    return obj


def status(stage: str, attempt: int, **extra: Any) -> RetoolRunStatus:
    """``stage`` running its attempt ``attempt``, every stage before it succeeded."""
    before = {"sft": ("prepare",), "rl": ("prepare", "sft", "merge")}[stage]
    done = [StageStatus(name=n, state="Succeeded", attempt=1, job=f"demo-{n}-1") for n in before]
    return RetoolRunStatus(stages=[*done, StageStatus(name=stage, state="Running", attempt=attempt, job=f"demo-{stage}-{attempt}", **extra)])


def entry(decision: Any, stage: str) -> StageStatus:
    return next(s for s in decision.status.stages if s.name == stage)


def test_a_status_check_timeout_retries_without_using_a_retry_and_says_why() -> None:
    run = run_of(failurePolicy={"maxRetries": 0, "backoffSeconds": 10})  # no retry at all: a failure would end the run
    decision = decide(run, status("rl", 1), Observed(children={"demo-rl-1": timed_out()}), T0)
    rl = entry(decision, "rl")
    assert (rl.state, rl.status_check_timeouts, rl.next_attempt_time) == ("Retrying", 1, rfc3339(T0 + dt.timedelta(seconds=10)))
    assert "JobStatusCheckTimeoutExceeded" in rl.message and KUBERAY_MESSAGE in rl.message
    assert "not counted as a training failure" in rl.message and "fresh Ray cluster" in rl.message and "resuming from the last checkpoint" in rl.message
    assert decision.status.phase == "RL" and decision.requeue_after == 10.0
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "RayJobStatusCheckTimeout")]
    # once due, the next attempt starts (a new RayJob: a fresh cluster)
    later = decide(run, decision.status, Observed(), T0 + dt.timedelta(seconds=11))
    assert later.create == [CreateChild("rl", 2)] and entry(later, "rl").state == "Running"


def test_the_retry_after_a_status_check_timeout_keeps_every_retry_of_the_failure_policy() -> None:
    run = run_of(failurePolicy={"maxRetries": 1, "backoffSeconds": 10})
    after = status("sft", 2, status_check_timeouts=1)
    decision = decide(run, after, Observed(children={"demo-sft-2": rayjob_status("Complete", "FAILED")}), T0)
    sft = entry(decision, "sft")
    assert sft.state == "Retrying" and "1 retry left" in sft.message  # attempt 2 is the first failed attempt


def test_status_check_timeouts_are_bounded_then_count_as_failures() -> None:
    run = run_of(failurePolicy={"maxRetries": 0})
    current = status("sft", MAX_STATUS_CHECK_TIMEOUTS + 1, status_check_timeouts=MAX_STATUS_CHECK_TIMEOUTS)
    decision = decide(run, current, Observed(children={f"demo-sft-{MAX_STATUS_CHECK_TIMEOUTS + 1}": timed_out()}), T0)
    sft = entry(decision, "sft")
    assert sft.state == "Failed" and "JobStatusCheckTimeoutExceeded" in sft.message and decision.status.phase == "Failed"


def test_other_kuberay_failures_still_use_a_retry() -> None:
    run = run_of(failurePolicy={"maxRetries": 0})
    deadline = timed_out()
    deadline["status"].update(reason="DeadlineExceeded", message="the RayJob has passed the activeDeadlineSeconds")
    decision = decide(run, status("sft", 1), Observed(children={"demo-sft-1": deadline}), T0)
    assert entry(decision, "sft").state == "Failed"


def test_the_status_field_round_trips_through_the_crd_name() -> None:
    dumped = StageStatus(name="rl", status_check_timeouts=2).model_dump(by_alias=True, exclude_none=True)
    assert dumped["statusCheckTimeouts"] == 2
