"""Table tests of the decisions the queue and the claim add: who owns ``suspend``, what counts as
a preemption, and when a run on the wrong storage fails (before its first stage)."""

from __future__ import annotations

from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator import constants as c
from retool_operator.builders import run_claim
from retool_operator.claims import ClaimObservation, check_claim, storage_status
from retool_operator.reconcile import CreateChild, Observed, SetWorkloadActive, decide
from tests.operator.helpers import CONFIG, T0, job_status, rayjob_status, run_of

QUEUE = {"queueName": "team-a"}


def queued_run(**spec: Any):
    return run_of(scheduling=QUEUE, **spec)


def child(state: dict[str, Any], *, suspend: bool, uid: str = "uid-child", queue: str | None = "team-a") -> dict[str, Any]:
    """A stage child as the API server holds it; ``queue``: its ``kueue.x-k8s.io/queue-name`` label."""
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"metadata": {"uid": uid, "labels": labels}, "spec": {"suspend": suspend}, **state}


def workload(name: str = "rayjob-demo-sft-1-abcde", *, active: bool = True, ours: bool = False, message: str | None = None) -> dict[str, Any]:
    wl: dict[str, Any] = {"metadata": {"name": name, "labels": {c.KUEUE_JOB_UID_LABEL: "uid-child"}}, "spec": {"active": active}}
    if ours:
        wl["metadata"]["annotations"] = {c.ANNOTATION_DEACTIVATED: "retool-operator"}
    if message:
        wl["status"] = {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}]}
    return wl


def sft(state: str, attempt: int = 1, **extra: Any) -> RetoolRunStatus:
    return RetoolRunStatus(
        stages=[
            StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"),
            StageStatus(name="sft", state=state, attempt=attempt, job=f"demo-sft-{attempt}", **extra),
        ]
    )


def sft_entry(decision) -> StageStatus:
    return next(s for s in decision.status.stages if s.name == "sft")


def test_a_queued_run_creates_its_first_stage_waiting_for_admission() -> None:
    decision = decide(queued_run(), RetoolRunStatus(), Observed(), T0)
    assert decision.create == [CreateChild("prepare", 1)]
    entry = decision.status.stages[0]
    assert entry.state == "Queued" and "waiting for admission by Kueue queue team-a" in (entry.message or "")
    assert {cond.type: cond.reason for cond in decision.status.conditions}["Ready"] == c.REASON_QUEUED


QUEUE_CASES = [
    # id, status, child object, workloads, spec.suspend, expected state, workload actions, expected message fragment
    (
        "kueue holds it suspended: queued, suspend left alone",
        sft("Queued"),
        child(rayjob_status("Suspended"), suspend=True),
        [workload(message="couldn't assign flavors to pod set head: insufficient quota for nvidia.com/gpu")],
        False,
        "Queued",
        [],
        "insufficient quota for nvidia.com/gpu",
    ),
    ("admitted: running", sft("Queued"), child(rayjob_status("Initializing"), suspend=False), [workload()], False, "Running", [], "running"),
    (
        "admitted but KubeRay still reports Suspended: running",
        sft("Queued"),
        child(rayjob_status("Suspended"), suspend=False),
        [workload()],
        False,
        "Running",
        [],
        "running",
    ),
    ("preempted while running: queued, counted", sft("Running"), child(rayjob_status("Suspending"), suspend=True), [workload()], False, "Queued", [], "waiting"),
    (
        "spec.suspend deactivates the workload instead of touching the child",
        sft("Running"),
        child(rayjob_status("Running", "RUNNING"), suspend=False),
        [workload()],
        True,
        "Suspended",
        [SetWorkloadActive("sft", "rayjob-demo-sft-1-abcde", False)],
        "suspended by spec.suspend",
    ),
    (
        "already deactivated: nothing more to do",
        sft("Suspended"),
        child(rayjob_status("Suspended"), suspend=True),
        [workload(active=False, ours=True)],
        True,
        "Suspended",
        [],
        "suspended",
    ),
    (
        "resume reactivates the workload the operator deactivated",
        sft("Suspended"),
        child(rayjob_status("Suspended"), suspend=True),
        [workload(active=False, ours=True)],
        False,
        "Queued",
        [SetWorkloadActive("sft", "rayjob-demo-sft-1-abcde", True)],
        "waiting",
    ),
    (
        "a workload kueue deactivated itself ends the attempt with kueue's reason (it is never admitted again)",
        sft("Queued"),
        child(rayjob_status("Suspended"), suspend=True),
        [workload(active=False)],
        False,
        "Retrying",
        [],
        "Kueue deactivated its workload rayjob-demo-sft-1-abcde",
    ),
    ("no Kueue on the cluster: said so", sft("Queued"), child(rayjob_status("Suspended"), suspend=True), None, False, "Queued", [], "is Kueue installed?"),
]


@pytest.mark.parametrize(("status", "obj", "workloads", "suspend", "state", "actions", "fragment"), [c[1:] for c in QUEUE_CASES], ids=[c[0] for c in QUEUE_CASES])
def test_kueue_owns_suspend_of_a_queued_child(status, obj, workloads, suspend: bool, state: str, actions, fragment: str) -> None:
    run = queued_run(suspend=suspend)
    decision = decide(run, status, Observed(children={"demo-sft-1": obj}, workloads={"demo-sft-1": workloads}), T0)
    assert decision.suspend == []  # the operator never writes spec.suspend of a queued child
    assert decision.create == []
    entry = sft_entry(decision)
    assert entry.state == state
    assert decision.workloads == actions
    assert fragment in (entry.message or "")
    assert decision.status.phase == ("Suspended" if suspend else "SFT")


def evicted(wl: dict[str, Any]) -> dict[str, Any]:
    """``wl`` as Kueue leaves it after taking its admission back (SetEvictedCondition, pkg/workload/workload.go, v0.19.0)."""
    return {**wl, "status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"}]}}


def test_a_stage_captured_by_a_queue_before_it_ran_is_not_preempted() -> None:
    """The namespace's ``default`` LocalQueue labels and suspends a child at creation (the run named no
    queue, so the stage was recorded Running): waiting for admission, no preemption counted, no Warning."""
    run = run_of()
    status = sft("Running")
    captured = child(rayjob_status("Suspended"), suspend=True, queue="default")
    decision = decide(run, status, Observed(children={"demo-sft-1": captured}, workloads={"demo-sft-1": [workload()]}), T0)
    entry = sft_entry(decision)
    assert (entry.state, entry.preemptions) == ("Queued", None)
    assert c.REASON_STAGE_PREEMPTED not in [e.reason for e in decision.events]
    # Its Workload not created yet (the webhook suspends first): the same.
    early = decide(run, status, Observed(children={"demo-sft-1": captured}, workloads={"demo-sft-1": []}), T0)
    assert (sft_entry(early).state, sft_entry(early).preemptions) == ("Queued", None)


def test_a_preemption_is_counted_and_is_no_failed_attempt() -> None:
    run = queued_run()
    decision = decide(run, sft("Running"), Observed(children={"demo-sft-1": child(rayjob_status("Suspended"), suspend=True)}, workloads={"demo-sft-1": [evicted(workload())]}), T0)
    entry = sft_entry(decision)
    assert (entry.state, entry.attempt, entry.preemptions) == ("Queued", 1, 1)
    assert [e.reason for e in decision.events] == [c.REASON_STAGE_PREEMPTED]
    assert decision.status.phase == "SFT" and not any(cond.type == "Failed" and cond.status == "True" for cond in decision.status.conditions)
    # Re-admitted: the same attempt runs on (it resumes from its checkpoint).
    again = decide(run, decision.status, Observed(children={"demo-sft-1": child(rayjob_status("Initializing"), suspend=False)}, workloads={"demo-sft-1": [workload()]}), T0)
    assert (sft_entry(again).state, sft_entry(again).attempt, sft_entry(again).preemptions) == ("Running", 1, 1)
    assert [e.reason for e in again.events] == [c.REASON_STAGE_ADMITTED]


def test_a_preempted_batch_job_is_replaced_without_using_a_retry() -> None:
    """The Job controller fails a suspended Job whose pods it deleted (backoffLimit 0): under a queue
    that is a preemption, so a new attempt waits for admission and the retry budget is untouched."""
    run = queued_run(failurePolicy={"maxRetries": 0})
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    preempted = child(job_status("Failed", "BackoffLimitExceeded"), suspend=True)
    decision = decide(run, status, Observed(children={"demo-prepare-1": preempted}), T0)
    entry = decision.status.stages[0]
    assert decision.create == [CreateChild("prepare", 2)]
    assert (entry.state, entry.attempt, entry.preempted_attempts, entry.preemptions) == ("Queued", 2, 1, 1)
    # Attempt 2 then fails for real: maxRetries 0 means that is the end, whatever the preemption.
    failed = decide(run, decision.status, Observed(children={"demo-prepare-2": child(job_status("Failed", "BackoffLimitExceeded"), suspend=False)}), T0)
    assert failed.status.stages[0].state == "Failed" and failed.status.phase == "Failed"


def test_without_a_queue_a_failed_suspended_job_is_a_failure() -> None:
    run = run_of(failurePolicy={"maxRetries": 0})
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    decision = decide(run, status, Observed(children={"demo-prepare-1": child(job_status("Failed"), suspend=True, queue=None)}), T0)
    assert decision.status.phase == "Failed"


def test_retries_after_a_preempted_attempt_still_allow_max_retries_failures() -> None:
    run = queued_run(failurePolicy={"maxRetries": 1, "backoffSeconds": 10})
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=2, job="demo-prepare-2", preempted_attempts=1)])
    decision = decide(run, status, Observed(children={"demo-prepare-2": child(job_status("Failed"), suspend=False)}), T0)
    entry = decision.status.stages[0]
    assert entry.state == "Retrying" and "1 retry left" in (entry.message or "")
    assert decision.requeue_after == 10.0  # the first failure's backoff, not the second's


# ---------------------------------------------------------------- the claim


def claim(modes: list[str], *, bound: bool = False, name: str = "retool-data") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {"accessModes": modes, "resources": {"requests": {"storage": "1Ti"}}}}
    if bound:
        obj["status"] = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": "1Ti"}}
    return obj


CLAIM_CASES = [
    # id, hardware, claim object (None = absent), expected check state, reason
    ("one node on ReadWriteOnce", {}, claim(["ReadWriteOnce"]), "ready", c.REASON_CLAIM_READY),
    ("two nodes on ReadWriteMany", {"nodes": 2}, claim(["ReadWriteMany"]), "ready", c.REASON_CLAIM_READY),
    ("two nodes on ReadWriteOnce fails", {"nodes": 2}, claim(["ReadWriteOnce"]), "failed", c.REASON_CLAIM_NOT_SHARED),
    (
        "the bound volume's modes count",
        {"nodes": 2},
        {**claim(["ReadWriteMany"]), "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]}},
        "failed",
        c.REASON_CLAIM_NOT_SHARED,
    ),
    ("a missing existing claim is waited for", {}, None, "waiting", c.REASON_CLAIM_NOT_FOUND),
]


@pytest.mark.parametrize(("hardware", "obj", "state", "reason"), [x[1:] for x in CLAIM_CASES], ids=[x[0] for x in CLAIM_CASES])
def test_claim_check(hardware: dict[str, Any], obj: dict[str, Any] | None, state: str, reason: str) -> None:
    run = run_of(hardware=hardware)
    check = check_claim(run, ClaimObservation(run_claim(run, CONFIG), obj))
    assert (check.state, check.reason) == (state, reason)


def test_a_multi_node_run_on_a_claim_that_cannot_be_shared_fails_before_its_first_stage() -> None:
    run = run_of(hardware={"nodes": 2})
    decision = decide(run, RetoolRunStatus(), Observed(claim=ClaimObservation(run_claim(run, CONFIG), claim(["ReadWriteOnce"], bound=True))), T0)
    assert decision.create == []
    assert decision.status.phase == "Failed"
    prepare = decision.status.stages[0]
    assert (prepare.state, prepare.attempt) == ("Failed", 0)
    conditions = {cond.type: cond for cond in decision.status.conditions}
    assert conditions["StorageReady"].status == "False" and conditions["StorageReady"].reason == c.REASON_CLAIM_NOT_SHARED
    assert conditions["Failed"].status == "True" and "ReadWriteMany" in conditions["Failed"].message
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", c.REASON_CLAIM_NOT_SHARED)]
    assert decision.status.storage is not None and decision.status.storage.access_modes == ["ReadWriteOnce"]


def test_a_missing_claim_holds_the_first_stage_and_is_looked_at_again() -> None:
    run = run_of()
    decision = decide(run, RetoolRunStatus(), Observed(claim=ClaimObservation(run_claim(run, CONFIG), None)), T0)
    assert decision.create == [] and decision.status.phase == "Pending"
    assert decision.requeue_after == 30.0
    assert "does not exist" in (decision.status.stages[0].message or "")
    # Created: the run starts.
    started = decide(run, decision.status, Observed(claim=ClaimObservation(run_claim(run, CONFIG), claim(["ReadWriteOnce"]))), T0)
    assert started.create == [CreateChild("prepare", 1)]
    assert {cond.type: cond.status for cond in started.status.conditions}["StorageReady"] == "True"


def test_the_claim_is_not_checked_once_a_stage_started() -> None:
    run = run_of(hardware={"nodes": 2})
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    decision = decide(run, status, Observed(children={"demo-prepare-1": job_status(None)}, claim=ClaimObservation(run_claim(run, CONFIG), claim(["ReadWriteOnce"]))), T0)
    assert decision.status.phase == "Preparing"


def test_status_shows_the_claim_the_operator_creates() -> None:
    run = run_of(storage={"pvc": {}, "retain": "delete"}, model={"base": "Qwen/Qwen2.5-7B-Instruct"}, hardware={"nodes": 2})
    seen = ClaimObservation(run_claim(run, CONFIG.model_copy(update={"default_storage_class": "cephfs"})), None)
    status = storage_status(run, seen)
    assert status.model_dump(by_alias=True, exclude_none=True) == {
        "claimName": "demo-data",
        "managed": True,
        "retain": "delete",
        "size": "450Gi",
        "storageClassName": "cephfs",
        "accessModes": ["ReadWriteMany"],
    }
