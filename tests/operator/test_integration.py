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
from retool_operator.permissions import allows

from tests.operator.emulator import (
    DEPLOYMENTS,
    JOBS,
    RAYJOBS,
    RUNS,
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

    async def child(self, kind: Any, name: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            return await self.api.get(kind, NS, name)

        return await eventually(probe, what=f"{kind.plural}/{name}")

    async def finish(self, kind: Any, name: str, status: dict[str, Any]) -> None:
        await self.child(kind, name)
        await self.api.patch(kind, NS, name, status, subresource="status")

    async def names(self, kind: Any) -> list[str]:
        return sorted(o["metadata"]["name"] for o in await self.api.list(kind, NS))

    def creates(self, plural: str) -> int:
        return sum(1 for g, r, v in operator_requests(self.k8s) if r == plural and v == "create")


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(server.url))))
        api = ObserverClient(credentials_for(str(server.url)))
        try:
            yield Cluster(k8s, api, CONFIG)
        finally:
            await api.close()
        uncovered = sorted({r for r in operator_requests(k8s) if not allows(*r)})
        assert uncovered == [], f"operator requests not covered by permissions.RULES: {uncovered}"


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
        assert sandbox["spec"]["replicas"] == 2
        for plural in ("services", "networkpolicies", "poddisruptionbudgets", "configmaps"):
            assert plural in {r for _, r, v in operator_requests(cluster.k8s) if v == "create"}
        status = await cluster.phase_is("happy", "Preparing")
        assert status["sandbox"] == {"replicas": 2, "readyReplicas": 0, "url": "http://happy-sandbox.ml.svc:8080"}
        assert status["mlflow"]["url"] == "http://retool-mlflow.ml.svc:5000"
        mlflow = await cluster.child(DEPLOYMENTS, "retool-mlflow")
        assert "ownerReferences" not in mlflow["metadata"]  # deleting a run never deletes tracking history

        await cluster.finish(JOBS, "happy-prepare-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "happy-sft-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(JOBS, "happy-merge-1", job_status("Complete"))
        rl = await cluster.child(RAYJOBS, "happy-rl-1")
        env = {e["name"]: e.get("value") for e in rl["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_SANDBOX_URL"] == "http://happy-sandbox.ml.svc:8080"
        assert (await cluster.status("happy"))["phase"] == "RL"
        await cluster.finish(RAYJOBS, "happy-rl-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(RAYJOBS, "happy-eval-1", rayjob_status("Complete", "SUCCEEDED"))
        status = await cluster.phase_is("happy", "Succeeded")
        assert [s["state"] for s in status["stages"]] == ["Succeeded"] * 5
        assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
        replicas = await eventually(lambda: _replicas(cluster, "happy-sandbox", 0), what="sandbox scaled to zero")
        assert replicas == "zero"
        assert await cluster.names(JOBS) == ["happy-merge-1", "happy-prepare-1"]
        assert await cluster.names(RAYJOBS) == ["happy-eval-1", "happy-rl-1", "happy-sft-1"]
        await eventually(lambda: _events(cluster, {"StageStarted", "StageSucceeded", "PipelineCompleted"}), what="Normal events")


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
        sft = status["stages"][1]
        assert (sft["state"], sft["attempt"], sft["job"]) == ("Failed", 2, "flaky-sft-2")
        failed = {c["type"]: c for c in status["conditions"]}["Failed"]
        assert failed["status"] == "True" and failed["reason"] == "StageFailed" and "deadline exceeded" in failed["message"]
        await eventually(lambda: _warned(cluster, {"StageRetrying", "StageFailed"}), what="Warning events StageRetrying and StageFailed")
        assert await cluster.names(RAYJOBS) == ["flaky-sft-1", "flaky-sft-2"]


async def test_rescale_suspend_and_resume(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("elastic"))
        await cluster.finish(JOBS, "elastic-prepare-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "elastic-sft-1")
        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"sandbox": {"maxConcurrent": 64}}})
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 4), what="sandbox rescaled to 4")

        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"suspend": True}})
        status = await cluster.phase_is("elastic", "Suspended")
        assert (await cluster.api.get(RAYJOBS, NS, "elastic-sft-1"))["spec"]["suspend"] is True
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 0), what="sandbox scaled to zero")
        assert status["stages"][1]["state"] == "Suspended"

        await cluster.api.patch(RUNS, NS, "elastic", {"spec": {"suspend": False}})
        await cluster.phase_is("elastic", "SFT")
        assert (await cluster.api.get(RAYJOBS, NS, "elastic-sft-1"))["spec"]["suspend"] is False
        await eventually(lambda: _replicas(cluster, "elastic-sandbox", 4), what="sandbox back to 4")
        assert await cluster.names(RAYJOBS) == ["elastic-sft-1"]


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
