"""Table tests of the decision function: (run, status, observed children, now) -> next status and actions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.below import replica_failure
from retool_operator.reconcile import CreateChild, Observed, SetSuspend, child_outcome, decide
from retool_operator.status import load, rfc3339
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
        ("sft", rayjob_status("ValidationFailed", message="resource fields should not be set in both"), "failed"),
        ("sft", rayjob_status("Retrying"), "running"),
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
        "rayjob-validation-failed-is-a-failure-not-running-forever",
        "rayjob-retrying-is-running",
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
        "child-deleted-outside-the-operator-ends-the-attempt",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {},
        "SFT",
        [],
        [],
        10.0,
    ),
    (
        "due-retry-waits-while-the-failed-attempts-pods-live",
        {},
        stages(prepare=("Succeeded", 1), sft=("Retrying", 1, EARLIER)),
        {"__pods__": {SFT1: ["demo-sft-1-head-x"]}},
        "SFT",
        [],
        [],
        5.0,
    ),
    (
        "due-retry-ignores-terminated-pods-of-other-runs-stages-only-its-own-run-listed",
        {},
        stages(prepare=("Succeeded", 1), sft=("Retrying", 1, EARLIER)),
        {"__pods__": {SFT1: []}},
        "SFT",
        [CreateChild("sft", 2)],
        [],
        None,
    ),
    (
        "next-stage-waits-for-the-previous-stages-pods",
        {},
        stages(prepare=("Succeeded", 1), sft=("Running", 1)),
        {SFT1: rayjob_status("Complete", "SUCCEEDED"), "__pods__": {SFT1: ["demo-sft-1-head-x", "demo-sft-1-worker-y"]}},
        "Merging",
        [],
        [],
        5.0,
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
    pods = children.pop("__pods__", {}) if "__pods__" in children else {}
    decision = decide(run, RetoolRunStatus(stages=current), Observed(children=children, active_pods=pods), T0)
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
    sft = next(s for s in decision.status.stages if s.name == "sft")
    assert sft.state == "Retrying"
    assert sft.next_attempt_time == rfc3339(T0 + dt.timedelta(seconds=10))
    assert "2 retries left" in (sft.message or "")


def test_status_fields_and_conditions_keep_transition_times() -> None:
    run = run_of()
    first = decide(run, RetoolRunStatus(), Observed(sandbox_ready_replicas=0), T0)
    status = first.status
    assert status.sandbox is not None and (status.sandbox.replicas, status.sandbox.ready_replicas) == (0, 0)  # no sandbox while preparing
    assert status.sandbox.url == "http://demo-sandbox.ml.svc:8080"
    assert status.progress == "prepare 1/5"
    assert {c.type: c.status for c in status.conditions} == {
        "SpecValid": "True",
        "Ready": "False",
        "Reconciling": "True",
        "Stalled": "False",
        "Failed": "False",
        "Succeeded": "False",
        "Suspended": "False",
        "SandboxReady": "False",
        "SandboxIsolation": "Unknown",  # no replica has reported its isolation yet
    }
    later = decide(run, status, Observed(children={"demo-prepare-1": job_status(None)}), T0 + dt.timedelta(hours=1))
    assert [c.last_transition_time for c in later.status.conditions] == [c.last_transition_time for c in status.conditions]


def test_results_give_the_headline_score() -> None:
    run = run_of()
    done = stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Succeeded", 1), eval=("Succeeded", 1))
    decision = decide(run, RetoolRunStatus(stages=done), Observed(results={"aime_2024": {"mean@30": 0.67, "maj@30": 0.7}}), T0)
    assert decision.status.score == 0.67
    assert decision.status.phase == "Succeeded"


def test_load_tolerates_foreign_status_fields() -> None:
    assert load({"phase": "RL", "kopf": {"progress": {}}}).phase == "RL"


@pytest.mark.parametrize(
    ("desired", "observed", "expected"),
    [
        ({"spec": {"replicas": 2}}, {"spec": {"replicas": 2, "revisionHistoryLimit": 10}}, True),
        ({"spec": {"replicas": 2}}, {"spec": {"replicas": 4}}, False),
        ({"ports": [{"port": 8080}]}, {"ports": [{"port": 8080, "protocol": "TCP"}]}, True),
        ({"ports": [{"port": 8080}]}, {"ports": [{"port": 8080}, {"port": 9090}]}, False),
        ({"labels": {"a": "1"}}, {}, False),
    ],
    ids=["server-defaults-are-extra", "changed-value", "list-items-compared-as-subsets", "list-length-differs", "missing-key"],
)
def test_is_subset_decides_whether_a_child_needs_a_patch(desired: dict, observed: dict, expected: bool) -> None:
    from retool_operator.kube import is_subset

    assert is_subset(desired, observed) is expected


def test_status_patch_nulls_removed_top_level_keys() -> None:
    from retool_operator.runner import status_patch

    assert status_patch({"phase": "RL", "score": 0.5}, {"phase": "Failed"}) == {"phase": "Failed", "score": None}


@pytest.mark.parametrize(
    "spec",
    [{}, {"sft": {"enabled": False}}, {"rl": {"enabled": False}}, {"eval": {"enabled": False}}, {"sft": {"enabled": False}, "eval": {"enabled": False}}],
    ids=["all", "no-sft", "no-rl", "no-eval", "rl-only"],
)
def test_pipeline_matches_the_stage_renderers(spec: dict) -> None:
    """The operator runs exactly the stages the stage entrypoint knows how to render."""
    from retool.recipe.render import stages as render
    from retool_operator.reconcile import enabled_stages

    run = run_of(**spec)
    assert tuple(s for s, on in enabled_stages(run).items() if on) == render.enabled_stages(run)


def test_a_persisting_refusal_writes_no_new_status() -> None:
    """decide() says Reconciling/not Stalled on every pass and the refusal flips them back: the
    transition times must come from the stored conditions, or every pass would write status."""
    import datetime as dt

    from retool_operator.status import with_refusals

    run = run_of()
    refusal = ["create RayJob demo-sft-1 refused: exceeded quota"]
    first = decide(run, RetoolRunStatus(stages=stages(prepare=("Succeeded", 1))), Observed(), T0).status
    stored = with_refusals(first, refusal, previous=first.conditions, now=T0, generation=None)
    later = T0 + dt.timedelta(minutes=5)
    again = with_refusals(decide(run, stored, Observed(), later).status, refusal, previous=stored.conditions, now=later, generation=None)
    assert again.conditions == stored.conditions
    assert {c.type: c.status for c in again.conditions}["Stalled"] == "True"


REFUSED = {
    "type": "ReplicaFailure",
    "status": "True",
    "reason": "FailedCreate",
    "message": 'pods "demo-sandbox-7d9f-x" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities (container "sandbox" must not include "SYS_ADMIN")',
}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([REFUSED], f"FailedCreate {REFUSED['message']}"),
        ([{**REFUSED, "status": "False"}], None),  # the ReplicaSet creates pods again
        ([{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"}], None),
        ([], None),
    ],
    ids=["refused", "recovered", "only-unavailable", "no-conditions"],
)
def test_replica_failure_reads_the_deployments_condition(conditions: list[dict[str, Any]], expected: str | None) -> None:
    assert replica_failure({"status": {"conditions": conditions}}, T0) == expected
    assert replica_failure(None, T0) is None


@pytest.mark.parametrize(
    ("current", "ready", "reason"),
    [
        (stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Running", 1)), 0, "PodsRefused"),
        (stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Running", 1)), 4, "ReplicasReady"),
        (stages(prepare=("Running", 1)), 0, "ScaledDown"),  # no replicas wanted: nothing to refuse
    ],
    ids=["rl-refused", "rl-ready-again", "prepare"],
)
def test_refused_sandbox_pods_show_why_in_sandbox_ready(current: list[StageStatus], ready: int, reason: str) -> None:
    run = run_of()
    refused = replica_failure({"status": {"conditions": [REFUSED]}}, T0)
    decision = decide(run, RetoolRunStatus(stages=current), Observed(sandbox_ready_replicas=ready, sandbox_pods_refused=refused), T0)
    cond = next(c for c in decision.status.conditions if c.type == "SandboxReady")
    assert cond.reason == reason
    if reason == "PodsRefused":
        assert cond.status == "False" and 'violates PodSecurity "baseline:latest"' in cond.message and cond.message.startswith("0/")


@pytest.mark.parametrize(("unconfirmed", "state"), [(True, "Running"), (False, "Retrying")], ids=["just-found-gone-waits-for-the-watch", "gone-past-the-window-failed"])
def test_a_child_found_gone_is_taken_for_deleted_only_once_the_watch_had_time_to_bring_its_last_state(unconfirmed: bool, state: str) -> None:
    from retool_operator.reconcile import MISSING_CONFIRM_SECONDS

    run = run_of()
    current = stages(prepare=("Succeeded", 1), sft=("Running", 1))
    decision = decide(run, RetoolRunStatus(stages=current), Observed(missing_unconfirmed={"demo-sft-1"} if unconfirmed else set()), T0)
    sft = next(s for s in decision.status.stages if s.name == "sft")
    assert sft.state == state
    if unconfirmed:
        assert sft.attempt == 1 and decision.requeue_after is not None and decision.requeue_after <= MISSING_CONFIRM_SECONDS
        assert not decision.create and not decision.events
    else:
        assert "deleted outside the operator" in (sft.message or "")


def test_a_created_stage_is_not_started_until_a_pod_of_its_attempt_runs() -> None:
    """StageCreated when the child is created; StageStarted, runningTime and "started" only once a pod runs."""
    run = run_of()
    created = decide(run, RetoolRunStatus(), Observed(), T0)
    assert [e.reason for e in created.events] == ["StageCreated"] and created.create == [CreateChild("prepare", 1)]
    assert "started" not in (created.status.message or "") and created.status.stages[0].message == "attempt 1 created; waiting for its pods"
    children = {"demo-prepare-1": job_status(None)}
    pending = decide(run, created.status, Observed(children=children, active_pods={"demo-prepare-1": ["demo-prepare-1-x"]}), T0)
    assert pending.events == [] and pending.status.stages[0].running_time is None
    running = Observed(children=children, active_pods={"demo-prepare-1": ["demo-prepare-1-x"]}, running_pods={"demo-prepare-1": ["demo-prepare-1-x"]})
    later = T0 + dt.timedelta(seconds=42)
    started = decide(run, pending.status, running, later)
    assert [e.reason for e in started.events] == ["StageStarted"] and started.status.message == "stage prepare started: attempt 1 running (demo-prepare-1)"
    assert started.status.stages[0].running_time == rfc3339(later) and started.status.stages[0].message == "attempt 1 running"
    assert decide(run, started.status, running, later).events == [], "posted once per attempt"


def test_a_queued_stage_says_queued_with_its_queue_never_started() -> None:
    run = run_of(scheduling={"queueName": "team-a"})
    created = decide(run, RetoolRunStatus(), Observed(), T0)
    assert created.status.message == "stage prepare queued: waiting for admission by Kueue queue team-a (demo-prepare-1)"
    assert [e.reason for e in created.events] == ["StageCreated"] and created.status.stages[0].state == "Queued"
