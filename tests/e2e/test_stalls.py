"""Stalls below the operator, named on the run within one resync, played by the real programs: the PV
controller on a control plane without a StorageClass (its FailedBinding Event), and the scheduler with
every node cordoned (PodScheduled=False/Unschedulable)."""

from __future__ import annotations

from tests.e2e.conftest import Cluster, eventually, run_manifest

NO_CLASS = "no storage class is set"


def _condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def test_a_claim_that_cannot_bind_is_the_runs_reason_and_no_stage_starts(kube: Cluster, namespace: str) -> None:
    """The control plane has no StorageClass and no provisioner: the claim the operator creates stays Pending."""
    assert kube.apply(run_manifest("nosc", namespace, storage={"pvc": {"size": "10Gi"}})).returncode == 0

    def named() -> dict | None:
        status = kube.run_status("nosc", namespace)
        return status if NO_CLASS in (status.get("message") or "") and _condition(status, "Stalled").get("status") == "True" else None

    status = eventually("the unbound claim as the run's reason", named, timeout=45, show=lambda: kube.run_status("nosc", namespace))
    assert len(status["message"]) <= 200
    storage = _condition(status, "StorageReady")
    assert (storage.get("status"), storage.get("reason")) == ("False", "FailedBinding") and "nosc-data" in storage["message"]
    assert all(s.get("attempt", 0) == 0 for s in status.get("stages", []))
    assert "started" not in _condition(status, "Ready").get("message", "")
    assert not kube.get("job", "nosc-prepare-1", namespace)
    printed = kube.kubectl("get", "retoolrun", "nosc", "-n", namespace).stdout
    assert NO_CLASS in printed and "nosc-data" in printed, printed  # the Message column
    assert "OBSERVED" in printed.splitlines()[0] and status.get("observedAt"), (printed, status.get("observedAt"))  # when the operator last looked
    described = kube.kubectl("describe", "retoolrun", "nosc", "-n", namespace).stdout
    assert NO_CLASS in described
    assert any(e["reason"] == "ChildRefused" and NO_CLASS in e["message"] for e in kube.events(namespace, "nosc"))


def test_a_stage_pod_the_scheduler_cannot_place_is_named_and_clears_once_placed(kube: Cluster, namespace: str) -> None:
    nodes = [n["metadata"]["name"] for n in kube.items("nodes", "default")]
    for node in nodes:
        kube.kubectl("cordon", node)
    try:
        assert kube.apply(run_manifest("cordoned", namespace)).returncode == 0

        def named() -> dict | None:
            status = kube.run_status("cordoned", namespace)
            stalled = _condition(status, "Stalled")
            return status if stalled.get("status") == "True" and "cannot be scheduled" in stalled.get("message", "") else None

        status = eventually("the unschedulable prepare pod on the run", named, timeout=45, show=lambda: kube.run_status("cordoned", namespace))
        prepare = next(s for s in status["stages"] if s["name"] == "prepare")
        assert prepare["message"].startswith("attempt 1 cannot start: pod cordoned-prepare-1-") and "unschedulable" in prepare["message"]
        assert len(status["message"]) <= 200
    finally:
        for node in nodes:
            kube.kubectl("uncordon", node, check=False)

    def cleared() -> bool:
        status = kube.run_status("cordoned", namespace)
        return _condition(status, "Stalled").get("status") == "False" and "cannot" not in (status.get("message") or "")

    eventually("Stalled cleared once the pod is placed", cleared, timeout=45, show=lambda: kube.run_status("cordoned", namespace))


def test_a_refused_submitter_pod_is_named_while_kuberay_keeps_the_rayjob_running(kube: Cluster, namespace: str) -> None:
    """A LimitRange the Ray head meets (8 CPUs) and KubeRay's submitter pod does not (500m): the Job
    controller refuses the submitter pod, KubeRay keeps the RayJob Running, the run names the refusal."""
    assert kube.apply(run_manifest("subm", namespace)).returncode == 0
    kube.wait_stage("subm", namespace, "prepare", "Running")
    kube.finish_pods("subm-prepare-1", namespace, 0)
    kube.wait_stage("subm", namespace, "preflight", "Running")
    eventually("the preflight pod", lambda: kube.pods_of_job("subm-preflight-1", namespace))
    # In place before the preflight ends: the operator creates the sft RayJob in the pass that records the
    # preflight's success, and KubeRay its submitter as soon as kwok makes the head Ready (milliseconds).
    limits = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "min-cpu", "namespace": namespace},
              "spec": {"limits": [{"type": "Container", "min": {"cpu": "1"}}]}}
    assert kube.apply(limits).returncode == 0
    kube.finish_pods("subm-preflight-1", namespace, 0)
    sft = kube.wait_stage("subm", namespace, "sft", "Running", timeout=60)

    def named() -> dict | None:
        status = kube.run_status("subm", namespace)
        stalled = _condition(status, "Stalled")
        return status if stalled.get("status") == "True" and "submitter pod of RayJob" in stalled.get("message", "") else None

    status = eventually("the refused submitter pod on the run", named, timeout=120,
                        show=lambda: (kube.run_status("subm", namespace).get("conditions"), kube.get("job", sft["job"], namespace),
                                      kube.events(namespace, sft["job"])))
    assert "minimum cpu usage per Container" in _condition(status, "Stalled")["message"]
    entry = next(s for s in status["stages"] if s["name"] == "sft")
    assert entry["message"].startswith("attempt 1 cannot start: the Job controller cannot create the submitter pod")
    assert (kube.get("rayjob", sft["job"], namespace) or {})["status"]["jobDeploymentStatus"] == "Running"


def test_a_sandbox_replica_that_stays_pending_stalls_the_run_naming_the_scheduler_and_the_fix(kube: Cluster, namespace: str) -> None:
    """The sandbox is scaled up for the preflight after prepare; with every node cordoned by then its replica stays
    Pending. Scaling a Deployment is not a rollout, so Kubernetes' progress deadline never comes: the run's own bound
    (spec.sandbox.readyTimeoutSeconds) ends the wait, and the run names the scheduler's verdict and the fix."""
    assert kube.apply(run_manifest("sbpend", namespace, sandbox={"readyTimeoutSeconds": 8})).returncode == 0
    kube.wait_stage("sbpend", namespace, "prepare", "Running")
    nodes = [n["metadata"]["name"] for n in kube.items("nodes", "default")]
    for node in nodes:
        kube.kubectl("cordon", node)
    try:
        kube.finish_pods("sbpend-prepare-1", namespace, 0)

        def stalled() -> dict | None:
            status = kube.run_status("sbpend", namespace)
            return status if _condition(status, "Stalled").get("status") == "True" else None

        status = eventually("the pending sandbox stalls the run", stalled, timeout=90, show=lambda: kube.run_status("sbpend", namespace))
        preflight = next(s for s in status["stages"] if s["name"] == "preflight")
        assert preflight["state"] == "Failed" and preflight.get("attempt", 0) == 0, preflight
        message = preflight["message"]
        assert message.startswith("not started: the sandbox was not ready 8 s after its replica was created (spec.sandbox.readyTimeoutSeconds): pod sbpend-sandbox-"), message
        assert "cannot be scheduled (Unschedulable: 0/" in message and "Fix: free or add nodes that fit spec.sandbox.resources" in message, message
        assert any(e["reason"] == "SandboxNotProgressing" and "Unschedulable" in e["message"] for e in kube.events(namespace, "sbpend"))
        assert not kube.get("job", "sbpend-preflight-1", namespace), "the preflight never started"
    finally:
        for node in nodes:
            kube.kubectl("uncordon", node, check=False)
