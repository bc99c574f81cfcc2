"""Retry on the Ray cluster already up (``retool_operator.cluster_reuse``): which failures and which clusters
keep the cluster for the next attempt, the RayJob that runs there, when the kept cluster is given up or
deleted, and how its device time is split between the attempts. The KubeRay objects are shaped as KubeRay
1.6.1 leaves them (rayjob_controller.go: reason AppFailed with jobStatus FAILED; the RayCluster's
``status.state`` ``ready``; pods labelled ``ray.io/cluster`` and ``ray.io/node-type``); tests/e2e/test_rayjob.py
runs the same paths against KubeRay itself."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from retool.spec.status import KeptCluster, RetoolRunStatus, StageStatus
from retool_operator import cluster_reuse, cost
from retool_operator.builders.meta import Tracking
from retool_operator.builders.stages import build_stage_rayjob, cluster_fingerprint
from retool_operator.reconcile import CreateChild, Observed, decide
from retool_operator.status import rfc3339
from tests.operator.helpers import CONFIG, T0, run_of

CLUSTER = "demo-sft-1-raycluster-abcde"
SUBMITTED = T0 - dt.timedelta(minutes=30)


def pod(name: str, node_type: str, *, attempt: int = 1, created: dt.datetime = SUBMITTED - dt.timedelta(minutes=2), **status: Any) -> dict[str, Any]:
    labels = {"retool.dev/run": "demo", "retool.dev/stage": "sft", "retool.dev/attempt": str(attempt), "ray.io/cluster": CLUSTER, "ray.io/node-type": node_type}
    st: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(created)}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "ray-head", "restartCount": 0}],
    }
    st.update(status)
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, "creationTimestamp": rfc3339(created)},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "ray", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
        "status": st,
    }


def submitter(attempt: int = 1) -> dict[str, Any]:
    labels = {"retool.dev/run": "demo", "retool.dev/stage": "sft", "retool.dev/attempt": str(attempt), "retool.dev/pod-role": "submitter"}
    return {"metadata": {"name": f"demo-sft-{attempt}-x", "labels": labels, "creationTimestamp": rfc3339(SUBMITTED)}, "spec": {}, "status": {"phase": "Succeeded"}}


def failed_rayjob(reason: str = "AppFailed", job: str = "FAILED") -> dict[str, Any]:
    return {"metadata": {"name": "demo-sft-1"}, "spec": {"rayClusterSpec": {}, "shutdownAfterJobFinishes": True},
            "status": {"jobDeploymentStatus": "Failed", "reason": reason, "jobStatus": job, "rayClusterName": CLUSTER}}  # fmt: skip


def started(at: dt.datetime) -> dict[str, Any]:
    """A failed RayJob whose job Ray started at ``at`` (KubeRay copies it to ``status.rayJobInfo``)."""
    obj = failed_rayjob()
    obj["status"]["rayJobInfo"] = {"startTime": rfc3339(at)}
    return obj


def ray_cluster(state: str = "ready", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": CLUSTER}
    if deleting:
        meta["deletionTimestamp"] = rfc3339(T0)
    return {"metadata": meta, "status": {"state": state}}


def observed(*, rayjob: dict[str, Any] | None = None, pods: list[dict[str, Any]] | None = None, cluster: dict[str, Any] | None = None,
             same: bool = True, nodes: dict[str, Any] | None = None) -> Observed:  # fmt: skip
    stage_pods = [submitter(), pod("head", "head")] if pods is None else pods
    children = {"demo-sft-1": rayjob if rayjob is not None else failed_rayjob()}
    return Observed(
        children=children,
        stage_pods=stage_pods,
        ray_clusters={CLUSTER: cluster if cluster is not None else ray_cluster()},
        same_cluster_spec={CLUSTER: same},
        nodes=nodes if nodes is not None else {"gpu-node-1": {"metadata": {"name": "gpu-node-1"}, "spec": {}}},
    )


def running_sft(attempt: int = 1, **extra: Any) -> RetoolRunStatus:
    done = [StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1")]
    return RetoolRunStatus(stages=[*done, StageStatus(name="sft", state="Running", attempt=attempt, job=f"demo-sft-{attempt}", **extra)])


def sft_of(status: RetoolRunStatus) -> StageStatus:
    return next(s for s in status.stages if s.name == "sft")


def test_a_job_failure_on_a_healthy_cluster_keeps_it_and_the_retry_runs_there_on_the_same_pods() -> None:
    run = run_of()
    failed = decide(run, running_sft(), observed(), T0)
    sft = sft_of(failed.status)
    assert sft.state == "Retrying" and sft.ray_cluster == KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))
    assert [(k.stage, k.rayjob, k.cluster) for k in failed.keep] == [("sft", "demo-sft-1", CLUSTER)]
    assert f"attempt 2 will run on the same Ray cluster {CLUSTER}" in sft.message and f"same Ray cluster {CLUSTER}" in failed.events[0].message
    due = T0 + dt.timedelta(seconds=11)
    # The cluster's pods still carry attempt 1's label: they are handed over, not waited for.
    later = decide(run, failed.status, replace_pods(observed(), active_pods={"demo-sft-1": ["head"]}), due)
    assert later.create == [CreateChild("sft", 2, on_cluster=CLUSTER)] and sft_of(later.status).state == "Running"
    assert f"on the Ray cluster {CLUSTER} kept from attempt 1" in later.events[0].message
    assert cluster_reuse.to_release(later.status.stages) == []  # attempt 2 runs on it


def replace_pods(seen: Observed, **fields: Any) -> Observed:
    from dataclasses import replace

    return replace(seen, **fields)


NOT_KEPT = {
    # Failures that are not the job's alone.
    "a deadline (KubeRay's DeadlineExceeded)": ({"rayjob": failed_rayjob("DeadlineExceeded", "RUNNING")}, None),
    "AppFailed without Ray's FAILED: the job vanished with a restarted head": ({"rayjob": failed_rayjob("AppFailed", "")}, None),
    "the submitter's timeout (TransitionGracePeriodExceeded)": ({"rayjob": failed_rayjob("JobDeploymentStatusTransitionGracePeriodExceeded")}, None),
    # Clusters that are not healthy.
    "KubeRay deleting the cluster": ({"cluster": ray_cluster(deleting=True)}, "being deleted"),
    "a cluster KubeRay no longer calls ready": ({"cluster": ray_cluster("suspended")}, "is suspended"),
    "a restarted head": ({"pods": [submitter(), pod("head", "head", containerStatuses=[{"name": "ray-head", "restartCount": 1}])]}, "restarted 1 time"),
    "a head made after the job was submitted": ({"pods": [submitter(), pod("head", "head", created=SUBMITTED + dt.timedelta(minutes=1))]}, "replaced one"),
    "a head made after Ray started the job (KubeRay's rayJobInfo.startTime)": (
        {"rayjob": started(SUBMITTED + dt.timedelta(minutes=1)), "pods": [submitter(), pod("head", "head", created=SUBMITTED + dt.timedelta(minutes=2))]},
        "replaced one",
    ),
    "a pod that is not ready": ({"pods": [submitter(), pod("head", "head", conditions=[{"type": "Ready", "status": "False"}])]}, "not running and ready"),
    "a lost pod": ({"pods": [submitter()]}, "0 of its 1 pods"),
    "a cordoned node": ({"nodes": {"gpu-node-1": {"metadata": {"name": "gpu-node-1"}, "spec": {"unschedulable": True}}}}, "node gpu-node-1 is going"),
    "a run that renders another cluster now": ({"same": False}, "renders a different cluster"),
}


@pytest.mark.parametrize(("seen", "why"), NOT_KEPT.values(), ids=NOT_KEPT.keys())
def test_any_other_failure_or_an_unhealthy_cluster_gets_a_fresh_cluster(seen: dict[str, Any], why: str | None) -> None:
    decision = decide(run_of(), running_sft(), observed(**seen), T0)
    sft = sft_of(decision.status)
    assert sft.state == "Retrying" and sft.ray_cluster is None and decision.keep == []
    if why is not None:  # a job failure on a cluster that cannot take the retry says why
        assert "attempt 2 gets a fresh Ray cluster" in sft.message and why in sft.message, sft.message
    later = decide(run_of(), decision.status, Observed(), T0 + dt.timedelta(seconds=11))
    assert later.create == [CreateChild("sft", 2)]


RUNS_NEVER_KEEPING = {
    "retryOnSameCluster false": {"failurePolicy": {"retryOnSameCluster": False}},
    "queued by Kueue (it does not manage a clusterSelector RayJob)": {"scheduling": {"queueName": "team"}},
}


@pytest.mark.parametrize("spec", RUNS_NEVER_KEEPING.values(), ids=RUNS_NEVER_KEEPING.keys())
def test_runs_that_opt_out_or_are_queued_never_keep_a_cluster(spec: dict[str, Any]) -> None:
    decision = decide(run_of(**spec), running_sft(), observed(), T0)
    assert sft_of(decision.status).ray_cluster is None and decision.keep == []


def test_a_cluster_is_kept_once_a_second_failure_there_gets_a_fresh_one_and_releases_it() -> None:
    kept = KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))
    status = running_sft(2, ray_cluster=kept)
    seen = observed(rayjob={}, pods=[submitter(2), pod("head", "head", attempt=2)])
    seen = replace_pods(seen, children={"demo-sft-2": failed_rayjob()})
    decision = decide(run_of(), status, seen, T0)
    sft = sft_of(decision.status)
    assert sft.state == "Retrying" and "attempt 3 gets a fresh Ray cluster (this attempt already ran on a kept one)" in sft.message
    assert decision.keep == [] and cluster_reuse.to_release(decision.status.stages) == [kept]


def test_a_kept_cluster_that_fails_before_the_retry_is_given_up_and_the_retry_waits_for_its_pods() -> None:
    kept = KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))
    retrying = running_sft(1, ray_cluster=kept).model_copy()
    retrying.stages[1] = retrying.stages[1].model_copy(update={"state": "Retrying", "next_attempt_time": rfc3339(T0)})
    restarted = [submitter(), pod("head", "head", containerStatuses=[{"name": "ray-head", "restartCount": 2}])]
    decision = decide(run_of(), retrying, replace_pods(observed(pods=restarted), active_pods={"demo-sft-1": ["head"]}), T0)
    sft = sft_of(decision.status)
    assert decision.create == [] and sft.ray_cluster is not None and "restarted 2 time" in (sft.ray_cluster.released or "")
    assert [e.reason for e in decision.events] == ["ClusterNotReused", "WaitingForPods"] and "gets a fresh one" in decision.events[0].message
    assert cluster_reuse.to_release(decision.status.stages) == [sft.ray_cluster]
    # Once a read finds it gone, the stage forgets it and the retry gets its own cluster.
    gone = decide(run_of(), decision.status, Observed(ray_clusters={CLUSTER: None}, stage_pods=[]), T0 + dt.timedelta(seconds=5))
    assert sft_of(gone.status).ray_cluster is None and gone.create == [CreateChild("sft", 2)]


def test_a_pod_replaced_while_the_cluster_waits_for_the_retry_gives_it_up() -> None:
    kept = KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0 - dt.timedelta(seconds=30)))
    retrying = running_sft(1, ray_cluster=kept)
    retrying.stages[1] = retrying.stages[1].model_copy(update={"state": "Retrying", "next_attempt_time": rfc3339(T0)})
    replaced = [submitter(), pod("head", "head", created=T0 - dt.timedelta(seconds=10))]  # after it was kept
    decision = decide(run_of(), retrying, observed(pods=replaced), T0)
    assert decision.create == [] and "replaced one" in (sft_of(decision.status).ray_cluster.released or "")


def test_the_kept_cluster_is_deleted_once_its_attempt_succeeds_and_forgotten_once_gone() -> None:
    kept = KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))
    done = {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "rayClusterName": CLUSTER}}
    decision = decide(run_of(), running_sft(2, ray_cluster=kept), Observed(children={"demo-sft-2": done}, ray_clusters={CLUSTER: ray_cluster()}), T0)
    assert sft_of(decision.status).state == "Succeeded" and cluster_reuse.to_release(decision.status.stages) == [kept]
    gone = decide(run_of(), decision.status, Observed(ray_clusters={CLUSTER: None}), T0)
    assert sft_of(gone.status).ray_cluster is None


def test_spec_suspend_ends_an_attempt_on_a_kept_cluster_without_using_a_retry() -> None:
    kept = KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))
    running = {"spec": {"clusterSelector": {"ray.io/cluster": CLUSTER}}, "status": {"jobDeploymentStatus": "Running", "rayClusterName": CLUSTER}}
    decision = decide(run_of(suspend=True), running_sft(2, ray_cluster=kept), Observed(children={"demo-sft-2": running}), T0)
    sft = sft_of(decision.status)
    assert (sft.state, sft.preempted_attempts, decision.delete, decision.suspend) == ("Retrying", 1, ["demo-sft-2"], [])
    assert "cannot be suspended" in sft.message and "(no retry used)" in sft.message and decision.status.phase == "Suspended"
    assert cluster_reuse.to_release(decision.status.stages) == [sft.ray_cluster]
    resumed = decide(run_of(), decision.status, Observed(ray_clusters={CLUSTER: None}, stage_pods=[]), T0 + dt.timedelta(seconds=1))
    assert resumed.create == [CreateChild("sft", 3)] and "2 retries left" not in (sft_of(resumed.status).message or "")


def test_the_retry_rayjob_names_the_cluster_and_passes_kuberays_validation_for_that_mode() -> None:
    run = run_of()
    tracking = Tracking(uri="http://mlflow:5000", experiment="e", parent_run_id="p")
    own = build_stage_rayjob(run, "sft", 1, config=CONFIG, tracking=tracking)
    retry = build_stage_rayjob(run, "sft", 2, config=CONFIG, tracking=tracking, on_cluster=CLUSTER)
    spec = retry["spec"]
    # ValidateRayJobSpec (utils/validation.go v1.6.1): no suspend, no backoffLimit > 0, no TTL without shutdownAfterJobFinishes.
    assert spec["clusterSelector"] == {"ray.io/cluster": CLUSTER} and "rayClusterSpec" not in spec and "suspend" not in spec
    assert (spec["shutdownAfterJobFinishes"], spec.get("ttlSecondsAfterFinished", 0), spec["backoffLimit"]) == (False, 0, 0)
    assert spec["entrypoint"] == f"RETOOL_ATTEMPT=2 {own['spec']['entrypoint']}"
    assert spec["submitterPodTemplate"]["metadata"]["labels"]["retool.dev/attempt"] == "2"
    # The kept RayJob after the operator's patch: validateDeletionConfiguration (utils/validation.go v1.6.1) runs on
    # every reconcile and refuses a TTL above 0 without shutdownAfterJobFinishes (the RayJob would turn ValidationFailed).
    kept = {**own["spec"], **cluster_reuse.keep_patch()["spec"]}
    assert own["spec"]["ttlSecondsAfterFinished"] == cluster_reuse.KEEP_WINDOW_SECONDS > 0
    assert kept["shutdownAfterJobFinishes"] is False and kept["ttlSecondsAfterFinished"] == 0
    assert cluster_reuse.ANNOTATION_FINGERPRINT not in (retry["metadata"].get("annotations") or {})
    recorded = own["metadata"]["annotations"][cluster_reuse.ANNOTATION_FINGERPRINT]
    assert cluster_fingerprint(run, "sft", 1, config=CONFIG, tracking=tracking) == recorded
    edited = run_of(sft={"epochs": 7})
    assert cluster_fingerprint(edited, "sft", 1, config=CONFIG, tracking=tracking) != recorded  # the spec snapshot the pods mount changed


def test_an_unkept_cluster_is_deleted_at_once_only_when_kuberay_would_hold_it_for_the_window() -> None:
    ended = running_sft()
    after = ended.model_copy(update={"stages": [ended.stages[0], ended.stages[1].model_copy(update={"state": "Retrying"})]})
    children = {"demo-sft-1": failed_rayjob()}
    assert cluster_reuse.ended_unkept(run_of(), ended.stages, after.stages, children) == [CLUSTER]
    assert cluster_reuse.ended_unkept(run_of(failurePolicy={"clusterGraceSeconds": 60}), ended.stages, after.stages, children) == []
    kept = after.stages[1].model_copy(update={"ray_cluster": KeptCluster(name=CLUSTER, owner="demo-sft-1", attempt=2, kept_time=rfc3339(T0))})
    assert cluster_reuse.ended_unkept(run_of(), ended.stages, [after.stages[0], kept], children) == []
    assert cluster_reuse.ended_unkept(run_of(), ended.stages, ended.stages, children) == []  # still followed
    # Patched to keep (KubeRay will never delete it) but not kept after all: deleted whatever the grace.
    patched = {"demo-sft-1": {**failed_rayjob(), "spec": {"rayClusterSpec": {}, "shutdownAfterJobFinishes": False}}}
    assert cluster_reuse.ended_unkept(run_of(failurePolicy={"clusterGraceSeconds": 60}), ended.stages, after.stages, patched) == [CLUSTER]


def test_a_handed_over_pod_splits_its_device_hours_between_the_attempts() -> None:
    status = running_sft(2)
    first = pod("head", "head", created=T0 - dt.timedelta(hours=2))
    ledger = cost.account(status, None, [first], device_resource="nvidia.com/gpu", now=T0 - dt.timedelta(hours=1))
    handed = copy.deepcopy(first)
    handed["metadata"]["labels"]["retool.dev/attempt"] = "2"
    handed["metadata"]["annotations"] = {cluster_reuse.ANNOTATION_ATTEMPT_SINCE: rfc3339(T0 - dt.timedelta(minutes=90))}
    after = cost.account(status, ledger, [handed], device_resource="nvidia.com/gpu", now=T0)
    by_attempt = {a.attempt: a for a in after.attempts}
    assert by_attempt[1].device_hours == pytest.approx(8 * 0.5) and by_attempt[1].lost  # 2 h ago to the handover, 8 GPUs
    assert by_attempt[2].device_hours == pytest.approx(8 * 1.5) and not by_attempt[2].lost  # the handover to now
    assert after.device_hours == pytest.approx(8 * 2)
