"""The real operator (kopf) against kmock's Kubernetes emulator: the issue's scenarios end to end.

Each test starts an emulator and the operator in this event loop, plays KubeRay / the Job
controller by patching child status, and checks what the operator does. Every test ends by
checking that each API request the operator made is covered by ``permissions.RULES``.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import pytest

from retool_operator.config import OperatorConfig
from retool_operator.kube import KINDS
from retool_operator.permissions import allows
from tests.operator.emulator import (
    DEPLOYMENTS,
    JOBS,
    RAYJOBS,
    RUNS,
    TEST_AGENT,
    ObserverClient,
    ScalableEmulator,
    credentials_for,
    declare,
    eventually,
    operator_requests,
    running_operator,
    write_kubeconfig,
)
from tests.operator.helpers import document, job_status, rayjob_status

pytestmark = pytest.mark.slow
NS = "ml"
USED: set[tuple[str, str, str]] = set()
"""Every (group, resource, verb) the operator requested in the integration tests (the RBAC check in test_zz_rbac)."""
USED_BY: set[str] = set()
"""The tests (node ids) that contributed to ``USED``, in this process."""
CONFIG = OperatorConfig(_env_file=None, resync_seconds=3600, mlflow_parent_runs=False)


@dataclass
class Cluster:
    k8s: ScalableEmulator
    api: ObserverClient
    config: OperatorConfig

    async def run(self, name: str) -> dict[str, Any]:
        obj = await self.api.get(RUNS, NS, name)
        assert obj is not None
        return obj

    async def status(self, name: str) -> dict[str, Any]:
        return (await self.run(name)).get("status") or {}

    async def phase_is(self, name: str, phase: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.status(name)
            return status if status.get("phase") == phase else None

        return await eventually(probe, what=f"{name} phase {phase}")

    async def child(self, kind: Any, name: str, timeout: float = 15.0) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            return await self.api.get(kind, NS, name)

        return await eventually(probe, timeout=timeout, what=f"{kind.plural}/{name}")

    async def finish(self, kind: Any, name: str, status: dict[str, Any]) -> None:
        await self.child(kind, name)
        await self.api.patch(kind, NS, name, status, subresource="status")

    async def names(self, kind: Any) -> list[str]:
        return sorted(o["metadata"]["name"] for o in await self.api.list(kind, NS))

    def creates(self, plural: str) -> int:
        return sum(1 for g, r, v in operator_requests(self.k8s) if r == plural and v == "create")


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(server.url))))
        api = ObserverClient(credentials_for(str(server.url)))
        await api.create(claim_object("retool-data", ["ReadWriteOnce"]))  # the claim helpers.document() names
        try:
            yield Cluster(k8s, api, CONFIG)
        finally:
            await api.close()
        used = operator_requests(k8s)
        USED.update(used)
        USED_BY.add(request.node.nodeid)
        uncovered = sorted({r for r in used if not allows(*r)})
        assert uncovered == [], f"operator requests not covered by permissions.RULES: {uncovered}"
        children = [r for r in k8s.requests if r.resource is not None and r.resource.plural in ("jobs", "rayjobs") and r.action is not None and r.action.value in ("LIST", "WATCH")]
        children = [r for r in children if r.headers.get("User-Agent", "") != TEST_AGENT]
        assert children and all(r.params.get("labelSelector") == "retool.dev/run,retool.dev/component=stage" for r in children), [
            (r.resource.plural, dict(r.params)) for r in children
        ]


def claim_object(name: str, modes: list[str], *, bound: bool = False) -> dict[str, Any]:
    """A PersistentVolumeClaim as an administrator (or a provisioner, with ``bound``) leaves it."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"accessModes": modes, "resources": {"requests": {"storage": "100Gi"}}},
    }
    if bound:
        obj["status"] = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": "100Gi"}}
    return obj


def stage_of(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in status["stages"] if s["name"] == name)


def spec_doc(name: str, **spec: Any) -> dict[str, Any]:
    doc = document(name=name, namespace=NS, uid=f"uid-{name}", **spec)
    doc["metadata"]["generation"] = 1
    doc["metadata"]["resourceVersion"] = "1"  # the emulator keeps no versions; kopf's JSON patches test this one
    return doc


async def test_run_creates_sandbox_and_walks_every_stage_to_success(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("happy"))
        job = await cluster.child(JOBS, "happy-prepare-1")
        assert job["metadata"]["ownerReferences"][0] == {
            "apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "name": "happy", "uid": "uid-happy", "controller": True, "blockOwnerDeletion": True,
        }
        sandbox = await cluster.child(DEPLOYMENTS, "happy-sandbox")
        assert sandbox["spec"]["replicas"] == 0  # nothing calls the sandbox before rl
        for plural in ("services", "networkpolicies", "poddisruptionbudgets", "configmaps"):
            assert plural in {r for _, r, v in operator_requests(cluster.k8s) if v == "create"}
        status = await cluster.phase_is("happy", "Preparing")
        assert status["sandbox"] == {"replicas": 0, "readyReplicas": 0, "url": "http://happy-sandbox.ml.svc:8080"}
        assert status["mlflow"]["url"] == "http://retool-mlflow.ml.svc:5000"
        mlflow = await cluster.child(DEPLOYMENTS, "retool-mlflow")
        assert "ownerReferences" not in mlflow["metadata"]  # deleting a run never deletes tracking history

        prepare = await cluster.status("happy")
        assert stage_of(prepare, "prepare")["message"] == "attempt 1 created; waiting for its pods" and not stage_of(prepare, "prepare").get("runningTime")
        assert not await _events(cluster, {"StageStarted"}), "created is not started: no pod runs yet"
        await _pod_of(cluster, "happy-prepare-1-abcde", job["spec"]["template"], "Running")
        running = await eventually(lambda: _started(cluster, "happy", "prepare"), what="the prepare stage seen started once its pod runs")
        assert stage_of(running, "prepare")["message"] == "attempt 1 running" and running["message"] == "stage prepare started: attempt 1 running (happy-prepare-1)"
        await eventually(lambda: _events(cluster, {"StageCreated", "StageStarted"}), what="StageCreated, then StageStarted")
        await cluster.api.patch(PODS, NS, "happy-prepare-1-abcde", {"status": {"phase": "Succeeded"}}, subresource="status")
        await cluster.finish(JOBS, "happy-prepare-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "happy-sft-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(JOBS, "happy-merge-1", job_status("Complete"))
        rl = await cluster.child(RAYJOBS, "happy-rl-1")
        env = {e["name"]: e.get("value") for e in rl["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_SANDBOX_URL"] == "http://happy-sandbox.ml.svc:8080"
        assert (await cluster.status("happy"))["phase"] == "RL"
        await eventually(lambda: _replicas(cluster, "happy-sandbox", 2), what="sandbox up for rl")
        await cluster.finish(RAYJOBS, "happy-rl-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(RAYJOBS, "happy-eval-1", rayjob_status("Complete", "SUCCEEDED"))
        status = await cluster.phase_is("happy", "Succeeded")
        assert [(s["name"], s["state"]) for s in status["stages"]] == [
            ("prepare", "Succeeded"), ("preflight", "Skipped"), ("sft", "Succeeded"), ("merge", "Succeeded"), ("rl", "Succeeded"), ("eval", "Succeeded")
        ]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
        replicas = await eventually(lambda: _replicas(cluster, "happy-sandbox", 0), what="sandbox scaled to zero")
        assert replicas == "zero"
        assert await cluster.names(JOBS) == ["happy-merge-1", "happy-prepare-1"]
        assert await cluster.names(RAYJOBS) == ["happy-eval-1", "happy-rl-1", "happy-sft-1"]
        await eventually(lambda: _events(cluster, {"StageStarted", "StageSucceeded", "PipelineCompleted"}), what="Normal events")


async def _started(cluster: Cluster, run: str, stage: str) -> dict[str, Any] | None:
    status = await cluster.status(run)
    return status if stage_of(status, stage).get("runningTime") else None


async def _events(cluster: Cluster, reasons: set[str], type_: str = "Normal") -> bool:
    """Events the operator posted (kopf posts them asynchronously, hence polled)."""
    posted = {r.data.get("reason") for r in cluster.k8s.requests if r.resource is not None and r.resource.plural == "events" and r.data and r.data.get("type") == type_}
    return reasons <= posted


async def _warned(cluster: Cluster, reasons: set[str]) -> bool:
    return await _events(cluster, reasons, "Warning")


async def _replicas(cluster: Cluster, name: str, want: int) -> str | None:
    dep = await cluster.api.get(DEPLOYMENTS, NS, name)
    return {0: "zero"}.get(want, str(want)) if dep and dep["spec"]["replicas"] == want else None


async def test_complete_but_failed_retries_then_fails_the_run(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("flaky", failurePolicy={"maxRetries": 1, "backoffSeconds": 1}))
        await cluster.finish(JOBS, "flaky-prepare-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "flaky-sft-1", rayjob_status("Complete", "FAILED", message="NCCL timeout"))
        status = await cluster.phase_is("flaky", "SFT")
        retry = await cluster.child(RAYJOBS, "flaky-sft-2")  # after the 1 s backoff
        env = {e["name"]: e.get("value") for e in retry["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_ATTEMPT"] == "2"
        await cluster.finish(RAYJOBS, "flaky-sft-2", rayjob_status("Failed", message="deadline exceeded"))
        status = await cluster.phase_is("flaky", "Failed")
        sft = stage_of(status, "sft")
        assert (sft["state"], sft["attempt"], sft["job"]) == ("Failed", 2, "flaky-sft-2")
        failed = {c["type"]: c for c in status["conditions"]}["Failed"]
        assert failed["status"] == "True" and failed["reason"] == "StageFailed" and "deadline exceeded" in failed["message"]
        await eventually(lambda: _warned(cluster, {"StageRetrying", "StageFailed"}), what="Warning events StageRetrying and StageFailed")
        assert await cluster.names(RAYJOBS) == ["flaky-sft-1", "flaky-sft-2"]


async def test_rescale_suspend_and_resume(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("elastic"))
        await cluster.finish(JOBS, "elastic-prepare-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "elastic-sft-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(JOBS, "elastic-merge-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "elastic-rl-1")
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 2), what="sandbox up for rl")
        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"sandbox": {"maxConcurrent": 64}}})
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 4), what="sandbox rescaled to 4")

        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"suspend": True}})
        status = await cluster.phase_is("elastic", "Suspended")
        assert (await cluster.api.get(RAYJOBS, NS, "elastic-rl-1"))["spec"]["suspend"] is True
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 0), what="sandbox scaled to zero")
        assert stage_of(status, "rl")["state"] == "Suspended"

        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"suspend": False}})
        await cluster.phase_is("elastic", "RL")
        assert (await cluster.api.get(RAYJOBS, NS, "elastic-rl-1"))["spec"]["suspend"] is False
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 4), what="sandbox back to 4")
        assert await cluster.names(RAYJOBS) == ["elastic-rl-1", "elastic-sft-1"]


async def test_operator_restart_resumes_without_duplicates(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("sturdy"))
        await cluster.child(JOBS, "sturdy-prepare-1")
        await cluster.phase_is("sturdy", "Preparing")
    # The operator is down while the Job finishes.
    await cluster.api.patch(JOBS, NS, "sturdy-prepare-1", job_status("Complete"), subresource="status")
    async with running_operator(cluster.config):
        await cluster.child(RAYJOBS, "sturdy-sft-1")
        await cluster.phase_is("sturdy", "SFT")
    async with running_operator(cluster.config):  # and once more, with nothing to do
        await cluster.phase_is("sturdy", "SFT")
        assert await cluster.names(JOBS) == ["sturdy-prepare-1"]
        assert await cluster.names(RAYJOBS) == ["sturdy-sft-1"]
    assert cluster.creates("jobs") == 1
    assert cluster.creates("rayjobs") == 1
    # Sandbox and tracker are create-or-patch (a restart's POST gets 409): still one of each.
    assert await cluster.names(DEPLOYMENTS) == ["retool-mlflow", "sturdy-sandbox"]


async def test_invalid_spec_fails_with_a_field_named_message_and_creates_nothing(cluster: Cluster) -> None:
    bad = spec_doc("broken")
    bad["spec"]["rl"] = {"miniBatchSize": 1000}
    bad["spec"]["sandbox"]["perReplicaConcurrency"] = 64
    async with running_operator(cluster.config):
        await cluster.api.create(bad)
        status = await cluster.phase_is("broken", "Failed")
        assert "spec.rl.miniBatchSize" in status["message"] and "spec.sandbox.perReplicaConcurrency" in status["message"]
        valid = {c["type"]: c for c in status["conditions"]}["SpecValid"]
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        # Fixing the spec lets the run start.
        fixed = copy.deepcopy(bad["spec"])
        fixed["rl"] = {"miniBatchSize": 64}
        fixed["sandbox"]["perReplicaConcurrency"] = 16
        await cluster.api.patch(RUNS, NS, "broken", {"spec": fixed})
        await cluster.child(JOBS, "broken-prepare-1")
    assert [r for r in operator_requests(cluster.k8s) if r[2] == "create" and r[1] in ("jobs", "rayjobs")] == [("batch", "jobs", "create")]


async def test_without_the_webhook_a_run_over_the_sandbox_replica_limit_fails_and_creates_nothing(cluster: Cluster) -> None:
    """The operator's replica cap (chart limits.sandboxReplicas) holds on clusters that run without the webhook."""
    capped = CONFIG.model_copy(update={"sandbox_max_replicas": 4})
    doc = spec_doc("wide", sandbox={"maxConcurrent": 80, "perReplicaConcurrency": 16, "resources": {"limits": {"memory": "16Gi"}}})
    async with running_operator(capped):
        await cluster.api.create(doc)
        status = await cluster.phase_is("wide", "Failed")
        assert "sandboxMaxReplicas" in status["message"] and "5" in status["message"], status["message"]
    assert [r for r in operator_requests(cluster.k8s) if r[2] == "create" and r[1] in ("jobs", "rayjobs", "deployments")] == []


async def test_delete_leaves_children_to_owner_references_and_keeps_tracking(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("gone"))
        await cluster.child(JOBS, "gone-prepare-1")
        await cluster.phase_is("gone", "Preparing")
        await cluster.api._request("DELETE", RUNS.path(NS, "gone"))
        await eventually(lambda: _absent(cluster, "gone"), what="run deleted")
        children = [o for kind in (JOBS, DEPLOYMENTS) for o in await cluster.api.list(kind, NS)]
        owned = {o["metadata"]["name"] for o in children if o["metadata"].get("ownerReferences")}
        assert owned == {"gone-prepare-1", "gone-sandbox"}  # the API server's GC removes these with the run
        assert "retool-mlflow" in {o["metadata"]["name"] for o in children}  # history stays
    assert [r for r in operator_requests(cluster.k8s) if r[2] == "delete"] == []  # never deletes anything itself


async def _absent(cluster: Cluster, name: str) -> bool:
    return await cluster.api.get(RUNS, NS, name) is None


async def test_parent_mlflow_run_reaches_status_and_stage_env(cluster: Cluster, mlflow_server: str) -> None:
    """With a real MLflow server: status.mlflow carries the parent run, stages log under it."""
    config = OperatorConfig(_env_file=None, resync_seconds=3600, mlflow_parent_runs=True, mlflow_tracking_uri=mlflow_server)
    async with running_operator(config):
        await cluster.api.create(spec_doc("tracked"))
        job = await cluster.child(JOBS, "tracked-prepare-1", timeout=90)  # a first MLflow experiment and ~100 params
        status = await cluster.phase_is("tracked", "Preparing")
        mlflow = status["mlflow"]
        assert mlflow["runId"] and mlflow["experimentId"] and mlflow_server in mlflow["url"]
        env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_MLFLOW_PARENT_RUN_ID"] == mlflow["runId"]
        assert env["MLFLOW_TRACKING_URI"] == mlflow_server
        assert env["MLFLOW_EXPERIMENT_NAME"] == "ml/tracked"
    async with running_operator(config):  # a restart finds the same parent run
        await cluster.finish(JOBS, "tracked-prepare-1", job_status("Complete"))
        sft = await cluster.child(RAYJOBS, "tracked-sft-1", timeout=60)
        env = {e["name"]: e.get("value") for e in sft["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_MLFLOW_PARENT_RUN_ID"] == mlflow["runId"]
        assert (await cluster.status("tracked"))["mlflow"] == mlflow


# ---------------------------------------------------------------- lifecycle on a real cluster's terms

PODS = KINDS[("v1", "Pod")]
HPAS = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
FAST = OperatorConfig(_env_file=None, resync_seconds=0.3, mlflow_parent_runs=False, mlflow_retry_seconds=0.5)


async def _pod_of(cluster: Cluster, name: str, template: dict[str, Any], phase: str) -> None:
    """What KubeRay / the Job controller would create from ``template``: a pod with its labels."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": dict(template["metadata"]["labels"])}, "spec": template["spec"]}
    await cluster.api.create(pod)
    await cluster.api.patch(PODS, NS, name, {"status": {"phase": phase}}, subresource="status")


def _request_index(cluster: Cluster, plural: str, action: str, name: str) -> int:
    for i, r in enumerate(cluster.k8s.requests):
        if r.resource is None or r.resource.plural != plural or r.action is None or r.action.value != action:
            continue
        if (r.name or (r.data or {}).get("metadata", {}).get("name")) == name:
            return i
    raise AssertionError(f"no {action} of {plural}/{name}")


async def test_a_retry_starts_only_after_the_failed_attempts_pods_are_gone(cluster: Cluster) -> None:
    """Attempt 2 would write attempt 1's checkpoint directory and want its GPUs: it is created
    only once attempt 1's Ray pods have terminated (a finished submitter pod does not hold it)."""
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("orderly", failurePolicy={"maxRetries": 1, "backoffSeconds": 1}))
        await cluster.finish(JOBS, "orderly-prepare-1", job_status("Complete"))
        sft1 = await cluster.child(RAYJOBS, "orderly-sft-1")
        await _pod_of(cluster, "orderly-sft-1-head-abc", sft1["spec"]["rayClusterSpec"]["headGroupSpec"]["template"], "Running")
        await _pod_of(cluster, "orderly-sft-1-submitter-xyz", sft1["spec"]["submitterPodTemplate"], "Succeeded")
        await cluster.finish(RAYJOBS, "orderly-sft-1", rayjob_status("Complete", "FAILED", message="NCCL timeout"))

        async def waiting() -> dict[str, Any] | None:
            status = await cluster.status("orderly")
            sft = stage_of(status, "sft")
            return status if sft["state"] == "Retrying" and "orderly-sft-1-head-abc" in (sft.get("message") or "") else None

        status = await eventually(waiting, timeout=10, what="attempt 2 waiting for attempt 1's pods")
        assert "orderly-sft-1-submitter-xyz" not in stage_of(status, "sft")["message"]
        assert {c["type"]: c["reason"] for c in status["conditions"]}["Reconciling"] == "WaitingForPods"
        assert await cluster.api.get(RAYJOBS, NS, "orderly-sft-2") is None  # the 1 s backoff is long over
        await cluster.api._request("DELETE", PODS.path(NS, "orderly-sft-1-head-abc"))
        await cluster.child(RAYJOBS, "orderly-sft-2", timeout=15)
    assert _request_index(cluster, "pods", "DELETE", "orderly-sft-1-head-abc") < _request_index(cluster, "rayjobs", "CREATE", "orderly-sft-2")


async def test_a_rayjob_kuberay_refuses_ends_the_attempt_with_kuberays_reason(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("refused", failurePolicy={"maxRetries": 0}))
        await cluster.finish(JOBS, "refused-prepare-1", job_status("Complete"))
        message = "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
        await cluster.finish(RAYJOBS, "refused-sft-1", {"status": {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": message}})
        status = await cluster.phase_is("refused", "Failed")
        assert "ValidationFailed" in stage_of(status, "sft")["message"] and "shutdownAfterJobFinishes" in stage_of(status, "sft")["message"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "True"


async def test_a_stage_child_deleted_from_outside_ends_its_attempt(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("vanished", failurePolicy={"maxRetries": 0}))
        await cluster.child(JOBS, "vanished-prepare-1")
        await cluster.phase_is("vanished", "Preparing")
        await cluster.api._request("DELETE", JOBS.path(NS, "vanished-prepare-1"))
        status = await cluster.phase_is("vanished", "Failed")
        assert "deleted outside the operator" in status["stages"][0]["message"]
    assert cluster.creates("jobs") == 1  # not silently re-created


async def test_a_refused_create_is_a_warning_event_and_a_condition_with_the_api_servers_message(cluster: Cluster) -> None:
    quota = (
        'rayjobs.ray.io "quota-sft-1" is forbidden: exceeded quota: gpu-quota, '
        "requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"
    )
    cluster.k8s.refusals = [lambda r: (403, quota) if r.resource.plural == "rayjobs" and r.action is not None and r.action.value == "CREATE" else None]
    async with running_operator(FAST):
        await cluster.api.create(spec_doc("quota"))
        await cluster.finish(JOBS, "quota-prepare-1", job_status("Complete"))

        async def stalled() -> dict[str, Any] | None:
            status = await cluster.status("quota")
            conds = {c["type"]: c for c in status.get("conditions", [])}
            return status if conds.get("Stalled", {}).get("status") == "True" else None

        status = await eventually(stalled, what="Stalled condition")
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["Stalled"]["reason"] == "ChildRefused" and "exceeded quota: gpu-quota" in conds["Stalled"]["message"]
        assert conds["Ready"]["status"] == "False" and "exceeded quota" in conds["Ready"]["message"]
        sft = stage_of(status, "sft")
        assert (sft["state"], sft["attempt"], sft.get("job")) == ("Pending", 0, None)  # the status names no child that does not exist
        await eventually(lambda: _warned(cluster, {"ChildRefused"}), what="Warning event ChildRefused")
        cluster.k8s.refusals = []  # the quota is raised: the next pass creates the RayJob
        await cluster.child(RAYJOBS, "quota-sft-1")
        status = await cluster.phase_is("quota", "SFT")
        assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "False"


async def test_a_throttled_create_is_retried_and_requeued_never_shown_as_a_refusal(cluster: Cluster) -> None:
    """API Priority and Fairness answers 429 with Retry-After: 1. Twelve throttled creates outlast the
    client's back-off (six tries) twice, so two passes fail; a later pass creates the RayJob and the run
    never says "refused" (the requeue itself: tests/operator/test_pass_requeue.py)."""
    throttled: list[str] = []

    def throttle(r: Any) -> Any:
        if r.resource.plural == "rayjobs" and r.action is not None and r.action.value == "CREATE" and len(throttled) < 12:
            throttled.append(r.resource.plural)
            return 429, "Too many requests, please try again later.", {"Retry-After": "1"}
        return None

    cluster.k8s.refusals = [throttle]
    async with running_operator(CONFIG):
        await cluster.api.create(spec_doc("busy"))
        await cluster.finish(JOBS, "busy-prepare-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "busy-sft-1", timeout=22)
        status = await cluster.phase_is("busy", "SFT")
    assert len(throttled) == 12
    assert stage_of(status, "sft")["attempt"] == 1 and cluster.creates("rayjobs") == 13
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Stalled"]["status"] == "False" and "refused" not in str(status) and "429" not in str(status)
    assert not await _warned(cluster, {"ChildRefused"})


async def test_children_edited_behind_the_operators_back_are_repaired_and_an_hpa_keeps_the_replicas(cluster: Cluster) -> None:
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "tidy-sandbox", "namespace": NS}}
    hpa["spec"] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tidy-sandbox"}, "minReplicas": 3, "maxReplicas": 9}
    await cluster.api.create(hpa)  # before the run: no pass ever sees the sandbox without it
    async with running_operator(FAST):
        await cluster.api.create(spec_doc("tidy"))
        await cluster.child(JOBS, "tidy-prepare-1")
        await cluster.phase_is("tidy", "Preparing")
        # Nothing calls the sandbox while preparing: zero, which also holds the HPA off (it never scales a target at zero).
        assert (await cluster.api.get(DEPLOYMENTS, NS, "tidy-sandbox"))["spec"]["replicas"] == 0
        # Suspending a batch stage patches its Job.
        await cluster.api.patch(RUNS, NS, "tidy", {"spec": {"suspend": True}})
        await cluster.phase_is("tidy", "Suspended")
        assert (await cluster.api.get(JOBS, NS, "tidy-prepare-1"))["spec"]["suspend"] is True
        # (The attempt's spec snapshot, <child>-spec, is a record written once: see test_integration_upstream.)
        kinds = [("v1", "Service"), ("networking.k8s.io/v1", "NetworkPolicy"), ("policy/v1", "PodDisruptionBudget"), ("v1", "PersistentVolumeClaim")]
        services, policies, pdbs, claims = (KINDS[k] for k in kinds)
        await cluster.api.patch(services, NS, "tidy-sandbox", {"spec": {"selector": {"retool.dev/run": "someone-else"}}})
        await cluster.api.patch(policies, NS, "tidy-sandbox", {"spec": {"policyTypes": ["Ingress"]}})
        await cluster.api.patch(pdbs, NS, "tidy-sandbox", {"spec": {"maxUnavailable": 5}})
        await cluster.api.patch(claims, NS, "retool-mlflow", {"metadata": {"labels": {"app.kubernetes.io/component": "edited"}}})
        await cluster.api.patch(DEPLOYMENTS, NS, "tidy-sandbox", {"spec": {"replicas": 3}})  # someone scales it by hand
        await eventually(lambda: _sleep_true(0.4), what="the client's verification interval")
        await cluster.api.patch(RUNS, NS, "tidy", {"spec": {"suspend": False}})
        await cluster.phase_is("tidy", "Preparing")

        async def repaired() -> bool:
            svc = await cluster.api.get(services, NS, "tidy-sandbox")
            pol = await cluster.api.get(policies, NS, "tidy-sandbox")
            pdb = await cluster.api.get(pdbs, NS, "tidy-sandbox")
            pvc = await cluster.api.get(claims, NS, "retool-mlflow")
            return (
                svc["spec"]["selector"]["retool.dev/run"] == "tidy"
                and pol["spec"]["policyTypes"] == ["Ingress", "Egress"]
                and pdb["spec"]["maxUnavailable"] == 1
                and pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "mlflow"
            )

        await eventually(repaired, what="children repaired")
        await eventually(lambda: _replicas(cluster, "tidy-sandbox", 0), what="sandbox back at zero: no stage calls it")


async def _sleep_true(seconds: float) -> bool:
    import asyncio

    await asyncio.sleep(seconds)
    return True
