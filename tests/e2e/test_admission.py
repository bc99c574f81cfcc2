"""Refusals and queues below the operator, played by the real programs: Pod Security admission and the
ResourceQuota admission plugin in kube-apiserver (refusing the Job controller's pod creation), and Kueue's
manager with its webhooks (admission, quota, its default LocalQueue)."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import Cluster, eventually, run_manifest

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _queues(kube: Cluster, namespace: str, local_queue: str, *, gpus: int, cpu: int | str = 1000, preemption: dict | None = None) -> None:
    """A ResourceFlavor, a ClusterQueue for this namespace with the given quota (and preemption policy), and a LocalQueue."""
    cq = f"cq-{namespace}"
    resources = [("cpu", str(cpu)), ("memory", "16Ti"), ("nvidia.com/gpu", str(gpus))]
    for doc in (
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "e2e-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                  "resourceGroups": [{"coveredResources": [r for r, _ in resources],
                                      "flavors": [{"name": "e2e-flavor",
                                                   "resources": [{"name": r, "nominalQuota": q} for r, q in resources]}]}],
                  **({"preemption": preemption} if preemption else {})}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": local_queue, "namespace": namespace},
         "spec": {"clusterQueue": cq}},
    ):
        proc = kube.apply(doc)
        assert proc.returncode == 0, proc.stderr
    eventually("the LocalQueue active", lambda: any(
        c["type"] == "Active" and c["status"] == "True"
        for c in (kube.get("localqueue", local_queue, namespace) or {}).get("status", {}).get("conditions", [])))


def _workload_of(kube: Cluster, namespace: str, job: str) -> dict:
    return next((w for w in kube.items("workloads.kueue.x-k8s.io", namespace)
                 if any(r.get("name") == job for r in w["metadata"].get("ownerReferences", []))), {})


def _pending(workload: dict) -> str | None:
    """Kueue's message when it evaluated the Workload and reserved no quota (QuotaReserved False, reason Pending)."""
    return next((c.get("message") or "pending" for c in workload.get("status", {}).get("conditions", [])
                 if c["type"] == "QuotaReserved" and c["status"] == "False" and c.get("reason") == "Pending"), None)


def _admitted(workload: dict) -> bool:
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in workload.get("status", {}).get("conditions", []))


def test_kueue_admits_a_queued_stage_and_unsuspends_its_job(kube: Cluster, namespace: str) -> None:
    _queues(kube, namespace, "team", gpus=16)
    assert kube.apply(run_manifest("queued", namespace, scheduling={"queueName": "team"})).returncode == 0
    job = eventually("the prepare Job", lambda: kube.get("job", "queued-prepare-1", namespace))
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team"
    workload = eventually("Kueue's Workload admitted", lambda: _admitted(w := _workload_of(kube, namespace, "queued-prepare-1")) and w)
    assert workload["spec"]["queueName"] == "team"
    eventually("Kueue unsuspending the Job", lambda: (kube.get("job", "queued-prepare-1", namespace) or {}).get("spec", {}).get("suspend") is False)
    kube.wait_stage("queued", namespace, "prepare", "Running")
    # StageStarted once the admitted Job's pod runs (kwok runs it), never while it was queued.
    stage = eventually("the run saying its stage started", lambda: (st := kube.stage("queued", namespace, "prepare")).get("runningTime") and st)
    assert stage["runningTime"] >= stage["startTime"] and stage["message"] == "attempt 1 running", stage
    reasons = {e["reason"] for e in kube.events(namespace, "queued")}
    assert {"StageCreated", "StageAdmitted", "StageStarted"} <= reasons, reasons
    kube.finish_pods("queued-prepare-1", namespace, 0)
    kube.wait_stage("queued", namespace, "prepare", "Succeeded")


def test_a_stage_beyond_the_queues_quota_stays_queued_and_says_so(kube: Cluster, namespace: str) -> None:
    _queues(kube, namespace, "small", gpus=0, cpu=0)
    assert kube.apply(run_manifest("waits", namespace, scheduling={"queueName": "small"})).returncode == 0
    workload = eventually("Kueue's Workload", lambda: _workload_of(kube, namespace, "waits-prepare-1"))
    stage = kube.wait_stage("waits", namespace, "prepare", "Queued")
    assert "small" in (stage.get("message") or ""), stage
    # Kueue's verdict, not a pause: it reserves no quota and says why (QuotaReserved=False, reason Pending).
    verdict = eventually("Kueue's pending verdict on the Workload", lambda: _pending(_workload_of(kube, namespace, "waits-prepare-1")))
    assert "small" in verdict or "quota" in verdict.lower() or "insufficient" in verdict.lower(), verdict
    assert not _admitted(_workload_of(kube, namespace, "waits-prepare-1")), workload
    assert kube.get("job", "waits-prepare-1", namespace)["spec"]["suspend"] is True
    assert not kube.pods_of_job("waits-prepare-1", namespace)
    status = kube.run_status("waits", namespace)
    assert "started" not in (status.get("message") or "") and "queued" in (status.get("message") or ""), status.get("message")
    assert "StageStarted" not in [e["reason"] for e in kube.events(namespace, "waits")], "a queued stage has not started"


def test_kueues_default_local_queue_holds_an_unqueued_stage_and_the_operator_does_not_fight_it(kube: Cluster, namespace: str) -> None:
    _queues(kube, namespace, "default", gpus=0, cpu=0)  # LocalQueueDefaulting (on by default since Kueue 0.12)
    assert kube.apply(run_manifest("defaulted", namespace)).returncode == 0
    job = eventually("the prepare Job", lambda: kube.get("job", "defaulted-prepare-1", namespace))
    assert job["metadata"]["labels"].get(QUEUE_LABEL) == "default", "Kueue's webhook put the Job in the default LocalQueue"
    samples = []
    for _ in range(20):  # ~10 s: several operator passes (resync 5 s) and Kueue reconciles
        samples.append((kube.get("job", "defaulted-prepare-1", namespace) or {}).get("spec", {}).get("suspend"))
        time.sleep(0.5)
    assert all(s is True for s in samples), f"spec.suspend over 10 s: {samples}"
    assert kube.stage("defaulted", namespace, "prepare").get("state") == "Queued"
    assert not kube.pods_of_job("defaulted-prepare-1", namespace)
    # Captured at creation, never admitted: no preemption (its Workload was never evicted).
    assert not kube.stage("defaulted", namespace, "prepare").get("preemptions")
    assert not [e for e in kube.events(namespace, "defaulted") if e["reason"] == "StagePreempted"]


def _pods_requests_cpu(workload: dict) -> str:
    """The CPU the Workload's pods request in all, as Kueue counts it against the quota."""
    total = 0.0
    for pod_set in workload["spec"]["podSets"]:
        for container in pod_set["template"]["spec"]["containers"]:
            value = str(((container.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
            total += (float(value[:-1]) / 1000 if value.endswith("m") else float(value)) * pod_set.get("count", 1)
    return f"{int(total * 1000)}m"


def _running_pods(kube: Cluster, namespace: str, job: str) -> list[dict]:
    return [p for p in kube.pods_of_job(job, namespace) if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def test_kueue_preempts_a_lower_priority_stage_which_waits_without_using_a_retry_and_runs_again(kube: Cluster, namespace: str) -> None:
    """Kueue (v0.19.0, pkg/scheduler/preemption; the Job integration suspends the evicted Job and the Job
    controller deletes its pods) makes room for a higher WorkloadPriorityClass within the ClusterQueue;
    the operator shows the lower stage Queued and preempted, counts it, and uses none of its retries."""
    for name, value in (("e2e-low", 10), ("e2e-high", 1000)):
        doc = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        assert kube.apply(doc).returncode == 0
    _queues(kube, namespace, "batch", gpus=0, cpu=0, preemption={"withinClusterQueue": "LowerPriority"})
    assert kube.apply(run_manifest("low", namespace, scheduling={"queueName": "batch", "workloadPriorityClassName": "e2e-low"})).returncode == 0
    workload = eventually("the low run's Workload", lambda: _workload_of(kube, namespace, "low-prepare-1"))
    # room for exactly one prepare stage, now that its request is known
    quota = _pods_requests_cpu(workload)
    patch = {"spec": {"resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{"name": "e2e-flavor", "resources": [
        {"name": "cpu", "nominalQuota": quota}, {"name": "memory", "nominalQuota": "16Ti"}, {"name": "nvidia.com/gpu", "nominalQuota": "0"}]}]}]}}
    kube.kubectl("patch", "clusterqueue", f"cq-{namespace}", "--type=merge", "-p", json.dumps(patch))
    kube.wait_stage("low", namespace, "prepare", "Running", timeout=60)
    eventually("the low stage's pod Running", lambda: _running_pods(kube, namespace, "low-prepare-1"))

    assert kube.apply(run_manifest("high", namespace, scheduling={"queueName": "batch", "workloadPriorityClassName": "e2e-high"})).returncode == 0
    preempted = kube.wait_stage("low", namespace, "prepare", "Queued", timeout=90)
    assert preempted.get("preemptions") == 1, preempted
    assert preempted.get("attempt") == 1 and preempted.get("job") == "low-prepare-1", "a preemption is not a failed attempt"
    assert kube.get("job", "low-prepare-1", namespace)["spec"]["suspend"] is True, "Kueue suspended the Job"
    assert any(e["reason"] == "StagePreempted" for e in kube.events(namespace, "low")), "the run says why it stopped"
    kube.wait_stage("high", namespace, "prepare", "Running", timeout=90)
    high_pod = eventually("the high stage's pod Running", lambda: _running_pods(kube, namespace, "high-prepare-1"))
    assert high_pod
    eventually("the low stage's pod gone", lambda: not _running_pods(kube, namespace, "low-prepare-1"), timeout=60)

    kube.finish_pods("high-prepare-1", namespace, 0)  # the quota comes back: Kueue admits the low stage again
    kube.wait_stage("high", namespace, "prepare", "Succeeded")
    resumed = kube.wait_stage("low", namespace, "prepare", "Running", timeout=120)
    assert resumed.get("attempt") == 1 and resumed.get("preemptions") == 1
    eventually("the low stage's pod Running again", lambda: _running_pods(kube, namespace, "low-prepare-1"), timeout=60)


def _label_namespace(kube: Cluster, namespace: str, *labels: str) -> None:
    kube.kubectl("label", "namespace", namespace, "--overwrite", *labels)


def _failed_create(kube: Cluster, namespace: str, job: str) -> list[str]:
    return [e["message"] for e in kube.events(namespace, job) if e["reason"] == "FailedCreate"]


def test_a_resource_quota_refusal_happens_in_the_job_controller_below_the_operator(kube: Cluster, namespace: str) -> None:
    """The operator's own create succeeds; the ResourceQuota admission plugin refuses the Job controller's pod."""
    assert kube.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace": namespace},
                       "spec": {"hard": {"pods": "0"}}}).returncode == 0
    assert kube.apply(run_manifest("quota", namespace)).returncode == 0
    # Kueue's pod webhook may deny the first tries ("Job.batch ... not found" until its cache has the Job).
    eventually("the Job controller's FailedCreate Event naming the quota",
               lambda: [m for m in _failed_create(kube, namespace, "quota-prepare-1") if "exceeded quota: no-pods" in m],
               show=lambda: _failed_create(kube, namespace, "quota-prepare-1"))
    assert kube.get("job", "quota-prepare-1", namespace)["status"].get("active", 0) == 0


def test_a_resource_quota_refusal_is_visible_in_the_runs_status(kube: Cluster, namespace: str) -> None:
    assert kube.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace": namespace},
                       "spec": {"hard": {"pods": "0"}}}).returncode == 0
    assert kube.apply(run_manifest("capped", namespace)).returncode == 0
    eventually("the Job controller's FailedCreate Event", lambda: _failed_create(kube, namespace, "capped-prepare-1"))

    def says_quota() -> bool:
        status = kube.run_status("capped", namespace)
        texts = [status.get("message") or "", kube.stage("capped", namespace, "prepare").get("message") or ""]
        texts += [c.get("message") or "" for c in status.get("conditions", [])]
        return any("exceeded quota" in t and "no-pods" in t for t in texts)

    eventually("the quota refusal in the run's status", says_quota, timeout=20)


def test_nvidia_stage_pods_are_admitted_under_pod_security_restricted(kube: Cluster, namespace: str) -> None:
    _label_namespace(kube, namespace, "pod-security.kubernetes.io/enforce=restricted")
    assert kube.apply(run_manifest("restricted", namespace)).returncode == 0
    eventually("the prepare Job", lambda: kube.get("job", "restricted-prepare-1", namespace))
    kube.wait_stage("restricted", namespace, "prepare", "Running")
    # The stage is Running once its Job exists; the Job controller creates the pod after that.
    eventually("the prepare Job's pod", lambda: kube.pods_of_job("restricted-prepare-1", namespace), timeout=60,
               show=lambda: _failed_create(kube, namespace, "restricted-prepare-1"))
    # Read after the pod exists: a Pod Security refusal would have come first. Other FailedCreate Events
    # can precede a success (Kueue's pod webhook answers "Job not found" until its cache has the Job).
    refusals = [m for m in _failed_create(kube, namespace, "restricted-prepare-1") if "PodSecurity" in m or "violates" in m]
    assert not refusals, refusals


def test_a_run_naming_a_missing_priority_class_is_admitted_with_a_warning_and_its_pods_are_refused_by_the_api_server(kube: Cluster, namespace: str) -> None:
    """The warning's claim checked on the real API server: its Priority admission plugin refuses the stage's pod."""
    applied = kube.apply(run_manifest("no-prio", namespace, scheduling={"priorityClassName": "retool-missing"}))
    assert applied.returncode == 0, applied.stderr
    assert "Warning: spec.scheduling.priorityClassName" in applied.stderr and "'retool-missing'" in applied.stderr, applied.stderr
    refused = eventually("the Job controller's refused pod", lambda: [m for m in _failed_create(kube, namespace, "no-prio-prepare-1") if "retool-missing" in m], timeout=60)
    assert "no PriorityClass with name retool-missing was found" in refused[0], refused
    kube.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "retool-present"}, "value": 100})
    try:
        again = kube.apply(run_manifest("with-prio", namespace, scheduling={"priorityClassName": "retool-present"}))
        assert again.returncode == 0 and "PriorityClass" not in again.stderr, again.stderr
    finally:
        kube.kubectl("delete", "priorityclass", "retool-present", "--ignore-not-found", check=False)
