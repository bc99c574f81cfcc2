"""Kueue's documented suspend semantics, played by the test against the emulator (which has no Kueue).

What Kueue does with a Job or RayJob that carries ``kueue.x-k8s.io/queue-name`` (Kueue docs "Run A
RayJob" / "Run A Kubernetes Job", and its job reconciler ``pkg/controller/jobframework``):

- it creates a Workload for the job, labelled ``kueue.x-k8s.io/job-uid=<job uid>``;
- the job is (created) suspended until the Workload is admitted; on admission Kueue sets
  ``spec.suspend: false`` "regardless of its previous value";
- an admitted job that is suspended by anyone else is started again (reconciler step 7: "start
  the job if the workload has been admitted, and the job is still suspended");
- preemption evicts the Workload and sets ``spec.suspend: true`` (KubeRay then deletes the Ray
  cluster: jobDeploymentStatus Suspending -> Suspended); the Workload is requeued;
- ``Workload.spec.active: false`` evicts the Workload and keeps it out of the queue: the job is
  suspended until the Workload is reactivated.

The methods act once when called, so each test step says exactly what Kueue did.
"""

from __future__ import annotations

from typing import Any

from retool_operator import constants as c
from retool_operator.kube import KINDS
from tests.operator.emulator import JOBS, RAYJOBS, ObserverClient

WORKLOADS = KINDS[("kueue.x-k8s.io/v1beta2", "Workload")]
"""Kueue 0.19's storage version (v1beta1 is deprecated there)."""


def default_local_queue(request: Any) -> None:
    """Kueue's Job/RayJob defaulting webhook with a LocalQueue named ``default`` in the namespace
    (``Default`` in pkg/controller/jobs/{job,rayjob}/*_webhook.go calling ``ApplyDefaultLocalQueue`` and
    ``ApplyDefaultForSuspend``, pkg/controller/jobframework/defaults.go, Kueue v0.19.0): an unlabelled
    job gets ``kueue.x-k8s.io/queue-name: default`` and is created suspended."""
    if request.resource is None or request.resource.plural not in ("jobs", "rayjobs") or request.action is None or request.action.value != "CREATE":
        return
    if not isinstance(request.data, dict) or "ray.io/originated-from-crd" in ((request.data.get("metadata") or {}).get("labels") or {}):
        return  # a job KubeRay owns (its submitter) has an owner Kueue manages: not defaulted
    labels = request.data.setdefault("metadata", {}).setdefault("labels", {})
    if not labels.get(QUEUE_LABEL):
        labels[QUEUE_LABEL] = "default"
    request.data.setdefault("spec", {})["suspend"] = True


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class FakeKueue:
    def __init__(self, api: ObserverClient, namespace: str, workloads: Any = WORKLOADS):
        """``workloads``: the Workload API version this Kueue serves (v1beta2; v1beta1 before Kueue 0.16)."""
        self.api = api
        self.namespace = namespace
        self.workloads = workloads

    async def workload_of(self, kind: Any, name: str) -> dict[str, Any]:
        """The child's Workload, created as Kueue does when it first sees a queued job."""
        job = await self.api.get(kind, self.namespace, name)
        assert job is not None, name
        uid = job["metadata"]["uid"]
        for wl in await self.api.list(self.workloads, self.namespace):
            if wl["metadata"].get("labels", {}).get(c.KUEUE_JOB_UID_LABEL) == uid:
                return wl
        queue = job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        wl = {
            "apiVersion": f"{self.workloads.group}/{self.workloads.version}",
            "kind": "Workload",
            "metadata": {"name": f"{kind.plural[:-1]}-{name}-1a2b3", "namespace": self.namespace, "labels": {c.KUEUE_JOB_UID_LABEL: uid}},
            "spec": {"active": True, "queueName": queue},
        }
        await self.api.create(wl)
        return wl

    async def admit(self, kind: Any, name: str) -> None:
        wl = await self.workload_of(kind, name)
        assert wl["spec"].get("active", True), "Kueue never admits a deactivated workload"
        await self.api.patch(self.workloads, self.namespace, wl["metadata"]["name"], {"status": {"conditions": [{"type": "Admitted", "status": "True"}]}})
        await self.api.patch(kind, self.namespace, name, {"spec": {"suspend": False}})

    async def preempt(self, kind: Any, name: str) -> None:
        wl = await self.workload_of(kind, name)
        await self.api.patch(self.workloads, self.namespace, wl["metadata"]["name"], {"status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted"}]}})
        await self.api.patch(kind, self.namespace, name, {"spec": {"suspend": True}})
        if kind is RAYJOBS:  # KubeRay tears the cluster down
            await self.api.patch(kind, self.namespace, name, {"status": {"jobDeploymentStatus": "Suspended", "jobStatus": "NEW"}}, subresource="status")

    async def give_up(self, kind: Any, name: str) -> None:
        """waitForPodsReady's requeue limit: ``triggerDeactivation`` sets a DeactivationTarget condition,
        the workload reconciler then sets ``spec.active: false`` and evicts with reason Deactivated
        (pkg/controller/core/workload_controller.go, v0.19.0); the job is suspended."""
        wl = await self.workload_of(kind, name)
        message = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
        conditions = [{"type": "Admitted", "status": "False"}, {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": message}]
        await self.api.patch(self.workloads, self.namespace, wl["metadata"]["name"], {"spec": {"active": False}, "status": {"conditions": conditions}})
        await self.api.patch(kind, self.namespace, name, {"spec": {"suspend": True}})

    async def enforce(self, kind: Any, name: str) -> None:
        """One pass of Kueue's job reconciler over an existing job."""
        wl = await self.workload_of(kind, name)
        job = await self.api.get(kind, self.namespace, name)
        assert job is not None
        suspended = bool(job["spec"].get("suspend"))
        active = wl["spec"].get("active", True)
        admitted = any(cond.get("type") == "Admitted" and cond.get("status") == "True" for cond in (wl.get("status") or {}).get("conditions") or [])
        if not active:
            # Deactivation evicts: the workload loses its admission and the job is suspended.
            conditions = [{"type": "Admitted", "status": "False"}, {"type": "Evicted", "status": "True", "reason": "InactiveWorkload"}]
            await self.api.patch(self.workloads, self.namespace, wl["metadata"]["name"], {"status": {"conditions": conditions}})
            if not suspended:
                await self.api.patch(kind, self.namespace, name, {"spec": {"suspend": True}})
        elif active and admitted and suspended:
            await self.api.patch(kind, self.namespace, name, {"spec": {"suspend": False}})  # step 7: an admitted job runs


__all__ = ["JOBS", "RAYJOBS", "WORKLOADS", "FakeKueue", "default_local_queue"]
