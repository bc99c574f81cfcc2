"""Table tests of the decision function: (run, status, observed children, now) -> next status and actions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from retool_operator.reconcile import CreateChild, Observed, SetSuspend, child_outcome, decide
from retool_operator.status import load, rfc3339

from retool.spec.status import RetoolRunStatus, StageStatus
from tests.operator.helpers import T0, job_status, rayjob_status, run_of


@pytest.mark.parametrize(
    ("stage", "obj", "state"),
    [
        ("sft", None, "missing"),
        ("sft", rayjob_status("Initializing"), "running"),
        ("sft", rayjob_status("Running", "RUNNING"), "running"),
        ("sft", rayjob_status("Complete", "SUCCEEDED"), "succeeded"),
        ("sft", rayjob_status("Complete", "FAILED"), "failed"),
        ("sft", rayjob_status("Complete", "STOPPED"), "failed"),
        ("sft", rayjob_status("Complete"), "failed"),
        ("sft", rayjob_status("Failed", message="deadline exceeded"), "failed"),
        ("sft", rayjob_status("Suspended"), "suspended"),
        ("prepare", job_status(None), "running"),
        ("prepare", job_status("Complete"), "succeeded"),
        ("prepare", job_status("Failed", "BackoffLimitExceeded"), "failed"),
        ("merge", job_status("Suspended"), "suspended"),
    ],
    ids=[
        "rayjob-absent",
        "rayjob-initializing-is-running",
        "rayjob-running",
        "rayjob-complete-and-succeeded-is-success",
        "rayjob-complete-but-failed-is-failure",
        "rayjob-complete-but-stopped-is-failure",
        "rayjob-complete-without-job-status-is-not-success",
        "rayjob-failed",
        "rayjob-suspended",
        "job-active",
        "job-complete",
        "job-failed",
        "job-suspended",
    ],
)
def test_child_outcome(stage: str, obj: dict[str, Any] | None, state: str) -> None:
    assert child_outcome(stage, obj).state == state


def stages(**states: tuple[str, int] | tuple[str, int, str]) -> list[StageStatus]:
    """stages(prepare=("Succeeded", 1), sft=("Running", 2)) -> StageStatus entries (the rest Pending)."""
    out = []
    for name in ("prepare", "sft", "merge", "rl", "eval"):
        state, attempt, *rest = states.get(name, ("Pending", 0))
        extra = {"next_attempt_time": rest[0]} if rest else {}
        job = f"demo-{name}-{attempt}" if attempt else None
        out.append(StageStatus(name=name, state=state, attempt=attempt, job=job, **extra))
    return out


SFT1 = "demo-sft-1"
LATER = rfc3339(T0 + dt.timedelta(seconds=30))
EARLIER = rfc3339(T0 - dt.timedelta(seconds=1))

CASES = [
    # id, spec overrides, status stages, children, expected phase, creates, suspends, requeue
    ("new-run-starts-prepare", {}, [], {}, "Preparing", [CreateChild("prepare", 1)], [], None),
    ("prepare-running-waits", {}, stages(prepare=("Running", 1)), {"demo-prepare-1": job_status(None)}, "Preparing", [], [], None),
    (
        "prepare-done-starts-sft-in-the-same-pass",
        {},
        stages(prepare=("Running", 1)),
        {"demo-prepare-1": job_status("Complete")},
        "SFT",
        [CreateChild("sft", 1)],
        [],
        None,
    ),
    (
        "sft-complete-and-succeeded-starts-merge",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {SFT1: rayjob_status("Complete", "SUCCEEDED")},
        "Merging",
        [CreateChild("merge", 1)],
        [],
        None,
    ),
    (
        "sft-complete-but-failed-schedules-a-retry",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {SFT1: rayjob_status("Complete", "FAILED")},
        "SFT",
        [],
        [],
        10.0,
    ),
    (
        "second-failure-doubles-the-backoff",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 2)),
        {"demo-sft-2": rayjob_status("Failed")},
        "SFT",
        [],
        [],
        20.0,
    ),
    (
        "retry-not-due-yet-waits",
        {},
        stages(prepare=("Succeeded", 1), sft=("Retrying", 1, LATER)),
        {},
        "SFT",
        [],
        [],
        30.0,
    ),
    (
        "retry-due-starts-the-next-attempt",
        {},
        stages(prepare=("Succeeded", 1), sft=("Retrying", 1, EARLIER)),
        {},
        "SFT",
        [CreateChild("sft", 2)],
        [],
        None,
    ),
    (
        "last-attempt-failing-fails-the-run",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 3)),
        {"demo-sft-3": rayjob_status("Complete", "STOPPED")},
        "Failed",
        [],
        [],
        None,
    ),
    (
        "no-retries-configured-fails-at-once",
        {"failurePolicy": {"maxRetries": 0}},
        stages(prepare=("Running", 1)),
        {"demo-prepare-1": job_status("Failed")},
        "Failed",
        [],
        [],
        None,
    ),
    (
        "missing-child-of-a-running-stage-is-recreated",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {},
        "SFT",
        [CreateChild("sft", 1)],
        [],
        None,
    ),
    (
        "suspend-suspends-the-running-rayjob",
        {"suspend": True},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {SFT1: rayjob_status("Running", "RUNNING")},
        "Suspended",
        [],
        [SetSuspend("sft", SFT1, True)],
        None,
    ),
    (
        "suspended-and-already-suspended-does-nothing",
        {"suspend": True},
        stages(prepare=("Succeeded", 1), sft=("Suspended", 1)),
        {SFT1: {"spec": {"suspend": True}, **rayjob_status("Suspended")}},
        "Suspended",
        [],
        [],
        None,
    ),
    (
        "unsuspend-resumes-the-rayjob",
        {},
        stages(prepare=("Succeeded", 1), sft=("Suspended", 1)),
        {SFT1: {"spec": {"suspend": True}, **rayjob_status("Suspended")}},
        "SFT",
        [],
        [SetSuspend("sft", SFT1, False)],
        None,
    ),
    ("suspended-new-run-starts-nothing", {"suspend": True}, [], {}, "Suspended", [], [], None),
    (
        "sft-disabled-skips-to-rl-after-prepare",
        {"sft": {"enabled": False}},
        stages(prepare=("Running", 1)),
        {"demo-prepare-1": job_status("Complete")},
        "RL",
        [CreateChild("rl", 1)],
        [],
        None,
    ),
    (
        "eval-success-finishes-the-run",
        {},
        stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Succeeded", 1), eval=("Running", 1)),
        {"demo-eval-1": rayjob_status("Complete", "SUCCEEDED")},
        "Succeeded",
        [],
        [],
        None,
    ),
]


@pytest.mark.parametrize(("spec", "current", "children", "phase", "creates", "suspends", "requeue"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(spec: dict, current: list[StageStatus], children: dict, phase: str, creates: list, suspends: list, requeue: float | None) -> None:
    run = run_of(**spec)
    decision = decide(run, RetoolRunStatus(stages=current), Observed(children=children), T0)
    assert decision.status.phase == phase
    assert decision.create == creates
    assert decision.suspend == suspends
    assert decision.requeue_after == requeue


def test_decide_is_idempotent_once_applied() -> None:
    """Feeding a decision's status back with the child it asked for gives no new actions."""
    run = run_of()
    first = decide(run, RetoolRunStatus(), Observed(), T0)
    again = decide(run, first.status, Observed(children={"demo-prepare-1": job_status(None)}), T0 + dt.timedelta(seconds=5))
    assert again.create == [] and again.suspend == [] and again.events == []
    assert again.status == first.status


def test_failure_records_reason_condition_and_warning_event() -> None:
    run = run_of(failurePolicy={"maxRetries": 0})
    current = RetoolRunStatus(stages=stages(prepare=("Running", 1)))
    decision = decide(run, current, Observed(children={"demo-prepare-1": job_status("Failed", "DeadlineExceeded")}), T0)
    failed = {c.type: c for c in decision.status.conditions}["Failed"]
    assert failed.status == "True" and failed.reason == "StageFailed"
    assert "DeadlineExceeded" in failed.message
    assert decision.status.stages[0].state == "Failed"
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "StageFailed")]
    assert decision.sandbox_replicas == 0


def test_retry_records_when_the_next_attempt_starts() -> None:
    run = run_of()
    current = RetoolRunStatus(stages=stages(prepare=("Succeeded", 1), sft=("Running", 1)))
    decision = decide(run, current, Observed(children={SFT1: rayjob_status("Complete", "FAILED")}), T0)
    sft = decision.status.stages[1]
    assert sft.state == "Retrying"
    assert sft.next_attempt_time == rfc3339(T0 + dt.timedelta(seconds=10))
    assert "2 retries left" in (sft.message or "")


def test_status_fields_and_conditions_keep_transition_times() -> None:
    run = run_of()
    first = decide(run, RetoolRunStatus(), Observed(sandbox_ready_replicas=2), T0)
    status = first.status
    assert status.sandbox is not None and (status.sandbox.replicas, status.sandbox.ready_replicas) == (2, 2)
    assert status.sandbox.url == "http://demo-sandbox.ml.svc:8080"
    assert status.progress == "prepare 1/5"
    assert {c.type: c.status for c in status.conditions} == {
        "SpecValid": "True",
        "Failed": "False",
        "Succeeded": "False",
        "Suspended": "False",
        "Ready": "True",
        "SandboxReady": "True",
    }
    later = decide(run, status, Observed(children={"demo-prepare-1": job_status(None)}, sandbox_ready_replicas=2), T0 + dt.timedelta(hours=1))
    assert [c.last_transition_time for c in later.status.conditions] == [c.last_transition_time for c in status.conditions]


def test_results_give_the_headline_score() -> None:
    run = run_of()
    done = stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Succeeded", 1), eval=("Succeeded", 1))
    decision = decide(run, RetoolRunStatus(stages=done), Observed(results={"aime_2024": {"mean@30": 0.67, "maj@30": 0.7}}), T0)
    assert decision.status.score == 0.67
    assert decision.status.phase == "Succeeded"


def test_load_tolerates_foreign_status_fields() -> None:
    assert load({"phase": "RL", "kopf": {"progress": {}}}).phase == "RL"
