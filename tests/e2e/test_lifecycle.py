"""A RetoolRun against the real controllers: the Job controller runs its batch stages (pods scheduled by
kube-scheduler onto kwok's nodes, ended by the test through kwok), KubeRay turns its first RayJob into a
RayCluster and a submitter Job, the garbage collector removes its children, and the operator picks up
where it left after a restart."""

from __future__ import annotations

from retool.preflight.checks import PERMANENT_EXIT_CODES
from tests.e2e.conftest import Cluster, eventually, run_manifest


def _children(kube: Cluster, namespace: str, run: str) -> dict[str, list[str]]:
    out = {}
    for kind in ("jobs", "rayjobs", "configmaps", "deployments", "services"):
        out[kind] = sorted(
            o["metadata"]["name"] for o in kube.items(kind, namespace)
            if any(ref.get("kind") == "RetoolRun" and ref.get("name") == run for ref in o["metadata"].get("ownerReferences", []))
        )
    return out


def test_batch_stages_advance_on_success_retry_on_failure_and_the_first_rayjob_gets_its_cluster(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("walk", namespace)).returncode == 0

    prepare = kube.wait_stage("walk", namespace, "prepare", "Running")
    assert prepare["job"] == "walk-prepare-1"
    pod = eventually("the prepare pod on an H200 node", lambda: kube.pods_of_job("walk-prepare-1", namespace))[0]
    assert pod["spec"]["nodeName"].startswith("h200-"), "kube-scheduler placed it by the profile's nodeSelector"
    kube.finish_pods("walk-prepare-1", namespace, 0)
    kube.wait_stage("walk", namespace, "prepare", "Succeeded")

    # preflight: a retryable failure (exit 1) is a new attempt, a Job of its own
    kube.wait_stage("walk", namespace, "preflight", "Running")
    kube.finish_pods("walk-preflight-1", namespace, 1)
    job = eventually("the Job controller's Failed condition",
                     lambda: [c for c in (kube.get("job", "walk-preflight-1", namespace) or {}).get("status", {}).get("conditions", [])
                              if c["type"] == "Failed" and c["status"] == "True"])
    assert job[0]["reason"] == "BackoffLimitExceeded"
    retried = eventually("attempt 2 of preflight",
                         lambda: (s := kube.stage("walk", namespace, "preflight")).get("attempt") == 2 and s.get("state") == "Running" and s,
                         show=lambda: kube.stage("walk", namespace, "preflight"))
    assert retried["job"] == "walk-preflight-2"
    kube.finish_pods("walk-preflight-2", namespace, 0)
    kube.wait_stage("walk", namespace, "preflight", "Succeeded")

    # sft: a RayJob; KubeRay makes the RayCluster, kwok runs its pods, KubeRay then makes the submitter Job
    sft = kube.wait_stage("walk", namespace, "sft", "Running", "Initializing", "Queued", timeout=60)
    rayjob = eventually("the sft RayJob", lambda: kube.get("rayjob", sft["job"], namespace))
    cluster_name = eventually("KubeRay's RayCluster name in the RayJob status",
                              lambda: (kube.get("rayjob", sft["job"], namespace) or {}).get("status", {}).get("rayClusterName"))
    raycluster = eventually("the RayCluster", lambda: kube.get("raycluster", cluster_name, namespace))
    assert raycluster["metadata"]["ownerReferences"][0]["name"] == rayjob["metadata"]["name"]
    head = eventually("the Ray head pod Running",
                      lambda: [p for p in kube.items("pods", namespace, "-l", f"ray.io/cluster={cluster_name},ray.io/node-type=head")
                               if p["status"].get("phase") == "Running"])
    assert head
    submitter = eventually("KubeRay's submitter Job", lambda: kube.get("job", sft["job"], namespace), timeout=90)
    assert submitter["metadata"]["ownerReferences"][0]["kind"] == "RayJob"


def test_a_permanent_preflight_failure_fails_the_job_by_its_pod_failure_policy_and_the_run_without_retry(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("permanent", namespace)).returncode == 0
    kube.wait_stage("permanent", namespace, "prepare", "Running")
    kube.finish_pods("permanent-prepare-1", namespace, 0)
    kube.wait_stage("permanent", namespace, "preflight", "Running")
    kube.finish_pods("permanent-preflight-1", namespace, PERMANENT_EXIT_CODES[0])
    failed = eventually("the Job's Failed condition",
                        lambda: [c for c in (kube.get("job", "permanent-preflight-1", namespace) or {}).get("status", {}).get("conditions", [])
                                 if c["type"] == "Failed" and c["status"] == "True"])
    assert failed[0]["reason"] == "PodFailurePolicy"
    stage = kube.wait_stage("permanent", namespace, "preflight", "Failed")
    assert stage.get("attempt") == 1
    assert eventually("phase Failed", lambda: kube.run_status("permanent", namespace).get("phase") == "Failed")
    assert kube.get("job", "permanent-preflight-2", namespace) is None


def test_deleting_a_run_mid_stage_removes_it_and_the_garbage_collector_removes_its_children(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("doomed", namespace)).returncode == 0
    kube.wait_stage("doomed", namespace, "prepare", "Running")
    assert eventually("the run's Job", lambda: _children(kube, namespace, "doomed")["jobs"]) == ["doomed-prepare-1"]
    kube.kubectl("delete", "retoolrun", "doomed", "-n", namespace, "--wait=true", "--timeout=60s")
    assert kube.get("retoolrun", "doomed", namespace) is None, "the finalizer was released"
    eventually("the garbage collector removing the run's children",
               lambda: not any(_children(kube, namespace, "doomed").values()) and not kube.pods_of_job("doomed-prepare-1", namespace),
               timeout=60)
    assert kube.get("pvc", "retool-data", namespace) is not None, "the claim the run named is not the run's to delete"


def test_a_run_deleted_during_a_ray_stage_takes_its_held_rayjob_and_ray_cluster_with_it(kube: Cluster, namespace: str) -> None:
    """A stage's RayJob carries the operator's outcome finalizer; deleting the run must not leave it (and its
    Ray cluster's accelerators) Terminating: the garbage collector deletes it, the operator sees its run gone
    and lets it go, also in foreground deletion, where the run itself waits for it."""
    assert kube.apply(run_manifest("doomed-ray", namespace)).returncode == 0
    for stage in ("prepare", "preflight"):
        kube.wait_stage("doomed-ray", namespace, stage, "Running")
        kube.finish_pods(f"doomed-ray-{stage}-1", namespace, 0)
    sft = kube.wait_stage("doomed-ray", namespace, "sft", "Running", "Initializing", "Queued", timeout=60)
    cluster = eventually("the sft RayJob's cluster", lambda: (kube.get("rayjob", sft["job"], namespace) or {}).get("status", {}).get("rayClusterName"))
    assert "retool.dev/stage-outcome" in kube.get("rayjob", sft["job"], namespace)["metadata"]["finalizers"]
    kube.kubectl("delete", "retoolrun", "doomed-ray", "-n", namespace, "--cascade=foreground", "--wait=true", "--timeout=60s")
    assert kube.get("retoolrun", "doomed-ray", namespace) is None
    eventually("the RayJob and its RayCluster gone",
               lambda: kube.get("rayjob", sft["job"], namespace) is None and kube.get("raycluster", cluster, namespace) is None, timeout=60)


def test_the_operator_restarted_mid_stage_continues_from_the_cluster(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("restart", namespace)).returncode == 0
    kube.wait_stage("restart", namespace, "prepare", "Running")
    kube.operator.stop()
    try:
        kube.finish_pods("restart-prepare-1", namespace, 0)
        eventually("the Job complete while the operator is down",
                   lambda: (kube.get("job", "restart-prepare-1", namespace) or {}).get("status", {}).get("succeeded") == 1)
        assert kube.stage("restart", namespace, "prepare")["state"] == "Running", "nobody observed it yet"
    finally:
        kube.operator.start()
    kube.wait_stage("restart", namespace, "prepare", "Succeeded")
    preflight = kube.wait_stage("restart", namespace, "preflight", "Running")
    assert preflight["job"] == "restart-preflight-1"
    assert _children(kube, namespace, "restart")["jobs"] == ["restart-preflight-1", "restart-prepare-1"]
