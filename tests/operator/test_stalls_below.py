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

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator import below
from retool_operator import constants as c
from retool_operator.builders import run_claim
from retool_operator.claims import ClaimObservation
from retool_operator.reconcile import Observed, decide, stalls_below
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


def limit_range_refusals(generate_name: str, generated: str) -> list[str]:
    """How the API server turns down a pod under a LimitRange (plugin/pkg/admission/limitranger/admission.go,
    Kubernetes v1.36.3), in the words a controller's Event or condition carries (``err.Error()``):

    - a maximum it enforces: a Forbidden, named with the pod's generateName (``admission.NewForbidden``: the
      name is not generated yet when admission runs);
    - a default limit it fills in below the container's request: the pod's validation refuses it once the name
      is generated, an Invalid (``ValidateResourceRequirements``, pkg/apis/core/validation/validation.go; the
      example of kubernetes/website content/en/docs/concepts/policy/limit-range.md).
    """
    return [
        f'pods "{generate_name}" is forbidden: maximum cpu usage per Container is 4, but limit is 8',
        f'Pod "{generated}" is invalid: spec.containers[0].resources.requests: Invalid value: "8": must be less than or equal to cpu limit of 4',
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["maximum-forbidden", "default-limit-below-the-request-invalid"])
def test_a_pod_a_limitrange_turns_down_is_named_on_the_stage_and_stalls_the_run(which: int) -> None:
    """The Job controller records ``Error creating: <err>`` as a FailedCreate Warning (pkg/controller/controller_utils.go,
    v1.36.3) and keeps the Job active with no pod: without the refusal named the run would wait silently."""
    from retool_operator.status import with_refusals

    refusal = limit_range_refusals("demo-prepare-1-", "demo-prepare-1-x7k2p")[which]
    job = {"metadata": {"name": "demo-prepare-1", "creationTimestamp": OLD}, "spec": {}, "status": {}}
    current = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1", message="attempt 1 created; waiting for its pods")])
    observed = Observed(children={"demo-prepare-1": job}, child_events={"demo-prepare-1": [event("FailedCreate", f"Error creating: {refusal}")]})
    status, texts = stalls_below(current, observed, T0)
    assert texts == [f"the Job controller cannot create the pod of Job demo-prepare-1: Error creating: {refusal}"]
    assert (status.stages[0].message or "").startswith("attempt 1 cannot start: the Job controller cannot create the pod of Job demo-prepare-1")
    stalled = next(cond for cond in with_refusals(status, texts, previous=[], now=T0, generation=None).conditions if cond.type == c.COND_STALLED)
    assert (stalled.status, stalled.reason) == ("True", c.REASON_CHILD_REFUSED) and refusal in stalled.message
    # The same words from KubeRay (its RayCluster's ReplicaFailure, copied into the RayJob) and from the sandbox's ReplicaSet.
    head = limit_range_refusals("demo-sft-1-raycluster-abcde-head-", "demo-sft-1-raycluster-abcde-head-x7k2p")[which]
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod", "message": head, "lastTransitionTime": OLD}
    rayjob = {"status": {"jobDeploymentStatus": "Initializing", "rayClusterName": "demo-sft-1-raycluster-abcde", "rayClusterStatus": {"conditions": [failure]}}}
    assert below.child_refusal("RayJob", "demo-sft-1", rayjob, None, T0) == f"KubeRay cannot create the pods of RayJob demo-sft-1: FailedCreateHeadPod: {head}"
    replica = limit_range_refusals("demo-sandbox-6b9c7d8f5-", "demo-sandbox-6b9c7d8f5-x7k2p")[which]
    deployment = {"status": {"conditions": [{**failure, "reason": "FailedCreate", "message": replica}]}}
    assert below.replica_failure(deployment, T0) == f"FailedCreate {replica}"


def test_one_refused_replica_of_a_ready_sandbox_does_not_stall_the_run() -> None:
    """rl wants two sandbox replicas and a ResourceQuota admits one: the ReplicaSet controller keeps its
    ReplicaFailure condition True while the second pod is refused (pkg/controller/replicaset/replica_set.go
    ``calculateStatus``), and the Deployment controller copies it (pkg/controller/deployment/sync.go, v1.36.3).
    SandboxReady says so; the run is not Stalled, since rollouts go to the ready replica. With no replica
    ready the same refusal stalls it."""
    from dataclasses import replace

    from retool_operator.runner import Reconciler

    run = run_of()
    done = [StageStatus(name=n, state="Succeeded", attempt=1, job=f"demo-{n}-1") for n in ("prepare", "sft", "merge")]
    current = RetoolRunStatus(stages=[*done, StageStatus(name="rl", state="Running", attempt=1, job="demo-rl-1", message="attempt 1 running")])
    quota = 'pods "demo-sandbox-6b9c7d8f5-" is forbidden: exceeded quota: sandbox, requested: limits.cpu=4, used: limits.cpu=4, limited: limits.cpu=6'
    conditions = [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability.", "lastTransitionTime": OLD},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": quota, "lastTransitionTime": OLD},
    ]
    deployment = {"spec": {"replicas": 2}, "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 1, "conditions": conditions}}
    rl = {"metadata": {"name": "demo-rl-1", "creationTimestamp": OLD}, **rayjob_status("Running", "RUNNING")}
    rl["status"]["rayClusterStatus"] = {"state": "ready"}
    observed = Observed(
        children={"demo-rl-1": rl},
        sandbox_ready_replicas=int(deployment["status"]["readyReplicas"]),
        sandbox_spec_replicas=deployment["spec"]["replicas"],
        sandbox_pods_refused=below.replica_failure(deployment, T0),
    )
    decision = decide(run, current, observed, T0)
    assert decision.sandbox_replicas == 2 and observed.sandbox_pods_refused == f"FailedCreate {quota}"
    assert Reconciler._sandbox_refused(run, decision, observed) is None, "one refused replica of a ready sandbox stalls the run"
    sandbox = next(cond for cond in decision.status.conditions if cond.type == c.COND_SANDBOX_READY)
    assert (sandbox.status, sandbox.reason) == ("False", c.REASON_SANDBOX_PODS_REFUSED) and sandbox.message.startswith("1/2 replicas ready")
    assert next(cond for cond in decision.status.conditions if cond.type == c.COND_STALLED).status == "False"
    none_ready = replace(observed, sandbox_ready_replicas=0)
    stalled = Reconciler._sandbox_refused(run, decide(run, current, none_ready, T0), none_ready)
    assert stalled == f"the pods of the sandbox Deployment demo-sandbox are refused: FailedCreate {quota}"
