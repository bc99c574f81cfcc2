# ruff: noqa: F811  (the tests take test_integration's `cluster` fixture, imported below)
"""The real operator against the emulator on what a shared cluster adds: a Kueue queue (its suspend
semantics played by ``FakeKueue``), the run's claim, and its storage checks.

Every test ends with the RBAC check of ``test_integration``'s fixture (each request the operator made
is covered by ``permissions.RULES``).
"""

from __future__ import annotations

from typing import Any

import pytest

from retool_operator import constants as c
from tests.operator.emulator import JOBS, RAYJOBS, RUNS, eventually, operator_requests, running_operator
from tests.operator.helpers import job_status, rayjob_status
from tests.operator.kueue import WORKLOADS, FakeKueue
from tests.operator.test_integration import NS, Cluster, claim_object, cluster, spec_doc  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
CLAIMS_PLURAL = "persistentvolumeclaims"


def suspend_patches(cluster: Cluster, plural: str) -> list[Any]:
    """Every patch of the operator that wrote ``spec.suspend`` of a child."""
    out = []
    for request in cluster.k8s.requests:
        if request.headers.get("User-Agent") != "retool-operator" or request.resource is None or request.resource.plural != plural:
            continue
        if str(request.method.value).upper() == "PATCH" and "suspend" in ((request.data or {}).get("spec") or {}):
            out.append(request.data)
    return out


async def stage_state(cluster: Cluster, run: str, stage: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await cluster.status(run)
        entry = next((s for s in status.get("stages", []) if s["name"] == stage), None)
        return status if entry and entry["state"] == state else None

    return await eventually(probe, what=f"{run} stage {stage} {state}")


async def test_kueue_owns_suspend_admission_preemption_and_spec_suspend(cluster: Cluster) -> None:
    kueue = FakeKueue(cluster.api, NS)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("queued", scheduling={"queueName": "team-a", "priorityClassName": "ml-research"}))
        job = await cluster.child(JOBS, "queued-prepare-1")
        assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert job["spec"]["template"]["spec"]["priorityClassName"] == "ml-research"
        status = await stage_state(cluster, "queued", "prepare", "Queued")
        assert status["phase"] == "Preparing"

        # Kueue admits the Job; the stage runs, and finishes.
        await kueue.admit(JOBS, "queued-prepare-1")
        await stage_state(cluster, "queued", "prepare", "Running")
        await cluster.finish(JOBS, "queued-prepare-1", job_status("Complete"))

        # The SFT RayJob is created suspended too; admitted; then preempted by a higher priority.
        sft = await cluster.child(RAYJOBS, "queued-sft-1")
        assert sft["spec"]["suspend"] is True
        await kueue.admit(RAYJOBS, "queued-sft-1")
        await cluster.api.patch(RAYJOBS, NS, "queued-sft-1", rayjob_status("Running", "RUNNING"), subresource="status")
        await stage_state(cluster, "queued", "sft", "Running")
        await kueue.preempt(RAYJOBS, "queued-sft-1")
        status = await stage_state(cluster, "queued", "sft", "Queued")
        sft_status = next(s for s in status["stages"] if s["name"] == "sft")
        assert (sft_status["attempt"], sft_status["preemptions"]) == (1, 1)
        assert status["phase"] == "SFT" and {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "False"
        assert (await cluster.api.get(RAYJOBS, NS, "queued-sft-1"))["spec"]["suspend"] is True  # left to Kueue

        # spec.suspend: the operator deactivates the Workload; Kueue keeps the RayJob suspended.
        await kueue.admit(RAYJOBS, "queued-sft-1")
        await stage_state(cluster, "queued", "sft", "Running")
        await cluster.api.patch(RUNS, NS, "queued", {"spec": {"suspend": True}})
        await cluster.phase_is("queued", "Suspended")
        wl = await kueue.workload_of(RAYJOBS, "queued-sft-1")

        async def deactivated() -> bool:
            current = await cluster.api.get(WORKLOADS, NS, wl["metadata"]["name"])
            return current is not None and current["spec"]["active"] is False

        await eventually(deactivated, what="workload deactivated")
        await kueue.enforce(RAYJOBS, "queued-sft-1")
        assert (await cluster.api.get(RAYJOBS, NS, "queued-sft-1"))["spec"]["suspend"] is True

        # Resume: the operator reactivates only its own deactivation; Kueue admits again.
        await cluster.api.patch(RUNS, NS, "queued", {"spec": {"suspend": False}})

        async def reactivated() -> bool:
            current = await cluster.api.get(WORKLOADS, NS, wl["metadata"]["name"])
            return current is not None and current["spec"]["active"] is True

        await eventually(reactivated, what="workload reactivated")
        await kueue.admit(RAYJOBS, "queued-sft-1")
        await stage_state(cluster, "queued", "sft", "Running")
        await cluster.finish(RAYJOBS, "queued-sft-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.child(JOBS, "queued-merge-1")
    assert suspend_patches(cluster, "jobs") == [] and suspend_patches(cluster, "rayjobs") == [], "the operator wrote suspend of a queued child"
    assert await cluster.names(RAYJOBS) == ["queued-sft-1"]  # the preemption made no new attempt


async def test_a_preempted_batch_job_gets_a_new_attempt_without_using_a_retry(cluster: Cluster) -> None:
    kueue = FakeKueue(cluster.api, NS)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("evicted", scheduling={"queueName": "team-a"}, failurePolicy={"maxRetries": 0}))
        await cluster.child(JOBS, "evicted-prepare-1")
        await kueue.admit(JOBS, "evicted-prepare-1")
        await stage_state(cluster, "evicted", "prepare", "Running")
        # Preempted: Kueue suspends the Job, the Job controller deletes its pod and fails it (backoffLimit 0).
        await kueue.preempt(JOBS, "evicted-prepare-1")
        await cluster.api.patch(JOBS, NS, "evicted-prepare-1", job_status("Failed", "BackoffLimitExceeded"), subresource="status")
        retry = await cluster.child(JOBS, "evicted-prepare-2")
        assert retry["spec"]["suspend"] is True
        status = await stage_state(cluster, "evicted", "prepare", "Queued")
        assert status["phase"] == "Preparing"  # maxRetries 0, yet not Failed: a preemption is no failure


async def test_the_operator_creates_the_claim_and_keeps_it_when_the_run_is_deleted(cluster: Cluster) -> None:
    from retool_operator.kube import KINDS

    claims = KINDS[("v1", "PersistentVolumeClaim")]
    async with running_operator(cluster.config):
        doc = spec_doc("fresh", model={"base": "Qwen/Qwen2.5-7B-Instruct"})
        del doc["spec"]["storage"]
        await cluster.api.create(doc)
        await cluster.child(JOBS, "fresh-prepare-1")
        claim = await cluster.child(claims, "fresh-data")
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"] == "450Gi"
        assert "ownerReferences" not in claim["metadata"]
        status = await cluster.phase_is("fresh", "Preparing")
        assert status["storage"] == {"claimName": "fresh-data", "managed": True, "retain": "keep", "size": "450Gi", "accessModes": ["ReadWriteOnce"]}
        job = await cluster.api.get(JOBS, NS, "fresh-prepare-1")
        volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "fresh-data"}
    assert sum(1 for g, r, v in operator_requests(cluster.k8s) if r == CLAIMS_PLURAL and v == "create") >= 1
    assert [r for r in operator_requests(cluster.k8s) if r[1] == CLAIMS_PLURAL and r[2] == "patch"] == []  # a claim is never patched


async def test_a_two_node_run_on_a_readwriteonce_claim_fails_before_any_stage(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(claim_object("single-node-disk", ["ReadWriteOnce"], bound=True))
        await cluster.api.create(spec_doc("wide", hardware={"nodes": 2}, storage={"pvc": {"claimName": "single-node-disk"}}))
        status = await cluster.phase_is("wide", "Failed")
        conditions = {c["type"]: c for c in status["conditions"]}
        assert conditions["StorageReady"]["status"] == "False" and conditions["StorageReady"]["reason"] == "ClaimNotShared"
        assert "ReadWriteMany" in conditions["Failed"]["message"] and "single-node-disk" in conditions["Failed"]["message"]
        assert status["stages"][0]["state"] == "Failed" and status["stages"][0]["attempt"] == 0

        async def warned() -> bool:
            return any(
                r.resource is not None and r.resource.plural == "events" and (r.data or {}).get("reason") == "ClaimNotShared" for r in cluster.k8s.requests
            )

        await eventually(warned, what="ClaimNotShared Warning event")
    assert await cluster.names(JOBS) == [] and await cluster.names(RAYJOBS) == []


async def test_a_missing_claim_holds_the_run_until_it_exists(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("retool_operator.reconcile.CLAIM_RECHECK_SECONDS", 0.5)  # claims are not watched: the run looks again
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("patient", storage={"pvc": {"claimName": "later"}}))

        async def waiting() -> dict[str, Any] | None:
            status = await cluster.status("patient")
            ready = {c["type"]: c for c in status.get("conditions", [])}.get("StorageReady")
            return status if ready and ready["reason"] == "ClaimNotFound" else None

        status = await eventually(waiting, what="StorageReady ClaimNotFound")
        assert status["phase"] == "Pending" and await cluster.names(JOBS) == []
        await cluster.api.create(claim_object("later", ["ReadWriteOnce"]))
        await cluster.child(JOBS, "patient-prepare-1")


async def test_the_operator_knows_the_workloads_it_deactivated_from_those_kueue_deactivated(cluster: Cluster) -> None:
    """spec.suspend deactivates the Workload with the operator's mark; resuming reactivates it and removes
    the mark, so when Kueue later deactivates the same Workload itself (waitForPodsReady's requeue limit)
    the operator takes it as Kueue's verdict (the attempt ends with Kueue's reason), never as its own
    deactivation to undo."""
    kueue = FakeKueue(cluster.api, NS)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("marks", scheduling={"queueName": "team-a"}))
        await cluster.child(JOBS, "marks-prepare-1")
        await kueue.admit(JOBS, "marks-prepare-1")
        await cluster.finish(JOBS, "marks-prepare-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "marks-sft-1")
        await kueue.admit(RAYJOBS, "marks-sft-1")
        await stage_state(cluster, "marks", "sft", "Running")
        name = (await kueue.workload_of(RAYJOBS, "marks-sft-1"))["metadata"]["name"]

        async def workload_is(active: bool) -> dict[str, Any] | None:
            current = await cluster.api.get(WORKLOADS, NS, name)
            return current if current is not None and current["spec"]["active"] is active else None

        await cluster.api.patch(RUNS, NS, "marks", {"spec": {"suspend": True}})
        ours = await eventually(lambda: workload_is(False), what="the workload deactivated by the operator")
        assert ours["metadata"]["annotations"][c.ANNOTATION_DEACTIVATED] == "retool-operator"
        await cluster.api.patch(RUNS, NS, "marks", {"spec": {"suspend": False}})
        again = await eventually(lambda: workload_is(True), what="the workload reactivated")
        assert c.ANNOTATION_DEACTIVATED not in (again["metadata"].get("annotations") or {})  # the mark goes with the reactivation
        await kueue.admit(RAYJOBS, "marks-sft-1")
        await stage_state(cluster, "marks", "sft", "Running")

        await kueue.give_up(RAYJOBS, "marks-sft-1")
        status = await stage_state(cluster, "marks", "sft", "Retrying")
        sft = next(s for s in status["stages"] if s["name"] == "sft")
        assert "Kueue deactivated its workload" in sft["message"] and "re-queuing retries" in sft["message"]
        assert await workload_is(False) is not None  # left as Kueue set it
    reactivations = [
        r for r in cluster.k8s.requests
        if r.headers.get("User-Agent") == "retool-operator" and r.resource is not None and r.resource.plural == "workloads"
        and str(r.method.value).upper() == "PATCH" and ((r.data or {}).get("spec") or {}).get("active") is True
    ]  # fmt: skip
    assert len(reactivations) == 1, "the operator reactivated a workload Kueue deactivated"
