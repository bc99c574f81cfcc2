"""Stalls below the operator named on the run: a claim that cannot bind (no default StorageClass), KubeRay's
submitter pod refused, pods the scheduler cannot place; no false "started"; a queued preflight keeps its sandbox.

The Event reasons and conditions are the upstream controllers' own (cited in ``retool_operator.below``):
FailedBinding (a *Normal* Event, pv_controller.go, Kubernetes v1.36.3), FailedCreate on KubeRay's submitter
Job (named as the RayJob, rayjob_controller.go, KubeRay v1.6.1), PodScheduled=False/Unschedulable
(pkg/scheduler/schedule_one.go, v1.36.3).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from retool_operator import below
from retool_operator import constants as c
from retool_operator.builders import run_claim
from retool_operator.claims import ClaimObservation
from retool_operator.reconcile import Observed, decide, stalls_below

from retool.spec.status import RetoolRunStatus, StageStatus
from tests.operator.helpers import CONFIG, T0, rayjob_status, run_of

NO_CLASS = "no persistent volumes available for this claim and no storage class is set"
QUOTA = 'pods "demo-sft-1-abcde" is forbidden: exceeded quota: one-pod, requested: pods=1, used: pods=1, limited: pods=1'
NO_NODE = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. no new claims to deallocate"
OLD = (T0 - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(reason: str, message: str, type_: str = "Warning") -> dict[str, Any]:
    return {"reason": reason, "message": message, "type": type_, "lastTimestamp": OLD}


def pending_claim(name: str = "demo-data") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": OLD}, "spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Pending"}}


CLAIM_CASES = [
    ("no default StorageClass: a Normal FailedBinding names it", pending_claim(), [event("FailedBinding", NO_CLASS, "Normal")], ("FailedBinding", NO_CLASS)),
    (
        "a provisioner's refusal comes first",
        pending_claim(),
        [event("FailedBinding", NO_CLASS, "Normal"), event("ProvisioningFailed", "class gone")],
        ("ProvisioningFailed", "class gone"),
    ),
    ("waiting for the first consumer is no failure", pending_claim(), [event("WaitForFirstConsumer", "waiting for first consumer", "Normal")], None),
    ("a bound claim has no failure", {**pending_claim(), "status": {"phase": "Bound"}}, [event("FailedBinding", NO_CLASS, "Normal")], None),
]


@pytest.mark.parametrize(("obj", "events", "expected"), [x[1:] for x in CLAIM_CASES], ids=[x[0] for x in CLAIM_CASES])
def test_claim_failure(obj: dict[str, Any], events: list[dict[str, Any]], expected: tuple[str, str] | None) -> None:
    assert below.claim_failure(obj, events) == expected


def test_a_claim_that_cannot_bind_holds_the_first_stage_and_is_the_runs_reason() -> None:
    run = run_of()
    claim = ClaimObservation(run_claim(run, CONFIG), pending_claim())
    decision = decide(run, RetoolRunStatus(), Observed(claim=claim, claim_events=[event("FailedBinding", NO_CLASS, "Normal")]), T0)
    assert decision.create == []
    assert all(s.attempt == 0 for s in decision.status.stages)
    storage = next(cond for cond in decision.status.conditions if cond.type == c.COND_STORAGE_READY)
    assert (storage.status, storage.reason) == ("False", "FailedBinding")
    assert NO_CLASS in (decision.status.message or "") and len(decision.status.message or "") <= 200
    ready = next(cond for cond in decision.status.conditions if cond.type == c.COND_READY)
    assert "started" not in ready.message
    # The same claim once bound: the first stage starts.
    bound = ClaimObservation(claim.claim, {**pending_claim(), "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]}})
    assert [a.stage for a in decide(run, RetoolRunStatus(), Observed(claim=bound), T0).create] == ["prepare"]


def sft_running(job: str = "demo-sft-1") -> RetoolRunStatus:
    return RetoolRunStatus(
        stages=[
            StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"),
            StageStatus(name="sft", state="Running", attempt=1, job=job, message="attempt 1 started"),
        ]
    )


def rayjob(deployment: str, job: str | None = None, cluster: str | None = None) -> dict[str, Any]:
    obj = {"metadata": {"name": "demo-sft-1", "creationTimestamp": OLD}, **rayjob_status(deployment, job)}
    if cluster:
        obj["status"]["rayClusterStatus"] = {"state": cluster}
    return obj


def submitter(active: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": "demo-sft-1", "creationTimestamp": OLD}, "spec": {}, "status": {"active": active} if active else {}}


def unschedulable_pod(since: str = OLD) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_NODE, "lastTransitionTime": since}
    return {"metadata": {"name": "demo-sft-1-head-x"}, "status": {"phase": "Pending", "conditions": [cond]}}


def test_a_refused_submitter_pod_is_named_on_the_stage() -> None:
    """KubeRay keeps the RayJob Running while its submitter Job has no pod: the Job's FailedCreate Event says why."""
    children = {"demo-sft-1": rayjob("Running", cluster="ready")}
    observed = Observed(children=children, submitter_jobs={"demo-sft-1": submitter()}, submitter_events={"demo-sft-1": [event("FailedCreate", QUOTA)]})
    status, texts = stalls_below(sft_running(), observed, T0)
    assert texts == [f"the Job controller cannot create the submitter pod of RayJob demo-sft-1: {QUOTA}"]
    sft = status.stages[1]
    assert sft.message.startswith("attempt 1 cannot start: the Job controller cannot create the submitter pod") and len(sft.message) <= 200
    # A submitter pod that runs: nothing to say, the stage message is left alone.
    running = Observed(children=children, submitter_jobs={"demo-sft-1": submitter(active=1)}, submitter_events={"demo-sft-1": [event("FailedCreate", QUOTA)]})
    status, texts = stalls_below(sft_running(), running, T0)
    assert texts == [] and status.stages[1].message == "attempt 1 started"


def test_an_unschedulable_pod_is_named_once_it_stays_so() -> None:
    assert below.unschedulable([unschedulable_pod()], T0) == f"pod demo-sft-1-head-x cannot be scheduled: {NO_NODE}"
    fresh = (T0 - dt.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert below.unschedulable([unschedulable_pod(fresh)], T0) is None  # a nominated preemption may still place it
    scheduled = {"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert below.unschedulable([scheduled], T0) is None
    seen = below.unschedulable([unschedulable_pod()], T0) or ""
    status, texts = stalls_below(sft_running(), Observed(children={"demo-sft-1": rayjob("Initializing")}, unschedulable={"demo-sft-1": seen}), T0)
    assert texts == [f"pod demo-sft-1-head-x cannot be scheduled: {NO_NODE}"]
    assert "cannot start" in status.stages[1].message
    # Placed at last: the stage and the run no longer say it cannot start.
    stalled = status.model_copy(update={"message": texts[0]})
    cleared, texts = stalls_below(stalled, Observed(children={"demo-sft-1": rayjob("Running", "RUNNING", cluster="ready")}), T0)
    assert texts == [] and cleared.stages[1].message == "attempt 1 running" and cleared.message == "stage sft: attempt 1 running"


@pytest.mark.parametrize(
    ("kind", "obj", "pending", "submitter_read"),
    [
        ("RayJob", rayjob("Initializing"), True, False),
        ("RayJob", rayjob("Running", cluster="ready"), False, True),
        ("RayJob", rayjob("Running", "RUNNING", cluster="ready"), False, False),
        ("Job", {"status": {"active": 1, "ready": 0}}, True, False),
        ("Job", {"status": {"active": 1, "ready": 1}}, False, False),
    ],
    ids=["ray-cluster-coming-up", "submitter-not-started", "job-running", "job-pod-not-ready", "job-pod-ready"],
)
def test_what_is_read_while_a_stage_starts(kind: str, obj: dict[str, Any], pending: bool, submitter_read: bool) -> None:
    """Pods and the submitter Job are read only while they may be what holds the stage (requests per pass)."""
    assert below.pods_pending(kind, obj) is pending
    assert (kind == "RayJob" and below.wants_submitter(obj)) is submitter_read


def test_a_queued_preflight_keeps_its_sandbox() -> None:
    """The preflight child is created once a sandbox replica is ready; waiting for admission must not undo that."""
    run = run_of(scheduling={"queueName": "team-a"})
    status = RetoolRunStatus(
        stages=[
            StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"),
            StageStatus(name="preflight", state="Queued", attempt=1, job="demo-preflight-1"),
        ]
    )
    child = {"metadata": {"uid": "u", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "spec": {"suspend": True}, "status": {}}
    decision = decide(run, status, Observed(children={"demo-preflight-1": child}, workloads={"demo-preflight-1": []}), T0)
    assert decision.status.stages[1].state == "Queued"
    assert decision.sandbox_replicas == 1


def test_a_claim_created_a_moment_ago_holds_the_first_stage_until_the_volume_controller_saw_it() -> None:
    """The pass that creates the claim reads it back Pending with no Event yet: the first stage waits
    ``CLAIM_SETTLE_SECONDS`` so that a claim that cannot bind is named before anything starts."""
    run = run_of()
    fresh = {**pending_claim(), "metadata": {"name": "demo-data", "creationTimestamp": T0.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    decision = decide(run, RetoolRunStatus(), Observed(claim=ClaimObservation(run_claim(run, CONFIG), fresh)), T0)
    assert decision.create == [] and decision.requeue_after == below.CLAIM_SETTLE_SECONDS
    later = T0 + dt.timedelta(seconds=below.CLAIM_SETTLE_SECONDS)
    assert [a.stage for a in decide(run, RetoolRunStatus(), Observed(claim=ClaimObservation(run_claim(run, CONFIG), fresh)), later).create] == ["prepare"]
