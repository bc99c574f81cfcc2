"""KubeRay's RayJob controller, played by the test against the emulator (which runs no KubeRay).

Each method does once what the controller does at one step, as written in
``ray-operator/controllers/ray/rayjob_controller.go`` (KubeRay v1.7.0, K8sJobMode):

- ``start``: the RayCluster's head and worker pods from the RayJob's group templates, and the
  submitter Job named after the RayJob (``createNewK8sJob``: ``backoffLimit`` from
  ``spec.submitterConfig.backoffLimit``, default 2; labels ``ray.io/originated-from-*``) whose pod
  the Job controller makes from ``submitterPodTemplate`` (with its ``batch.kubernetes.io/job-name``
  label, pkg/controller/job in Kubernetes v1.36.3);
- ``end``: the terminal transition; with ``shutdownAfterJobFinishes`` the RayCluster (head and
  workers) is deleted and the submitter Job is kept ("We don't need to delete the submitter
  Kubernetes Job"); ``hung_submitter`` leaves its pod running (a ``ray job logs --follow`` that
  never returns), as when the RayJob turned terminal on ``activeDeadlineSeconds`` or the 300 s
  job-status timeout;
- ``submitter_pod_fails``: the Job controller's answer to a failed submitter pod: a replacement
  while failures <= backoffLimit; from v1.7 the replacement loops forever waiting for the deleted
  head's GCS (common/job.go v1.7.0), so it stays Running;
- ``delete_finished``: ``DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true`` deletes the RayJob itself
  instead of only its cluster.

The RayCluster (v1.6.1): ``start`` makes one named ``<rayjob>-raycluster`` (``status.state`` ready) whose pods carry
``ray.io/cluster``, or, for a RayJob with a ``clusterSelector``, runs on the cluster it names
(``getOrCreateRayClusterInstance``); ``end(..., ttl_passed=False)`` leaves the cluster for
``ttl_passes``, which deletes it only while the RayJob still says ``shutdownAfterJobFinishes`` and has no
clusterSelector (``handleShutdownAfterJobFinishes``); ``collect`` plays the garbage collector for the pods of a
deleted RayCluster.
"""

from __future__ import annotations

from typing import Any

from retool_operator.kube import KINDS, ApiError
from tests.operator.emulator import JOBS, RAYJOBS, ObserverClient

PODS = KINDS[("v1", "Pod")]
RAYCLUSTERS = KINDS[("ray.io/v1", "RayCluster")]
READY = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
DEFAULT_SUBMITTER_BACKOFF_LIMIT = 2


class FakeKubeRay:
    def __init__(self, api: ObserverClient, namespace: str):
        self.api = api
        self.namespace = namespace

    async def _pod(self, name: str, template: dict[str, Any], extra_labels: dict[str, str], phase: str, conditions: list[dict[str, str]] | None = None) -> None:
        labels = {**(template.get("metadata") or {}).get("labels", {}), **extra_labels}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": self.namespace, "labels": labels}, "spec": template["spec"]}
        await self.api.create(pod)
        status: dict[str, Any] = {"phase": phase}
        if conditions:
            status["conditions"] = conditions
        await self.api.patch(PODS, self.namespace, name, {"status": status}, subresource="status")

    async def start(self, name: str) -> None:
        rayjob = await self.api.get(RAYJOBS, self.namespace, name)
        assert rayjob is not None, name
        spec = rayjob["spec"]
        cluster_name = (spec.get("clusterSelector") or {}).get("ray.io/cluster") or f"{name}-raycluster"
        if "clusterSelector" not in spec:
            cluster = spec["rayClusterSpec"]
            await self.api.create({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": cluster_name, "namespace": self.namespace}, "spec": cluster})
            on = {"ray.io/cluster": cluster_name}
            await self._pod(f"{name}-head-x1", cluster["headGroupSpec"]["template"], {"ray.io/node-type": "head", **on}, "Running", READY)
            for group in cluster.get("workerGroupSpecs") or []:
                for i in range(group.get("replicas", 0)):
                    await self._pod(f"{name}-{group['groupName']}-w{i}", group["template"], {"ray.io/node-type": "worker", **on}, "Running", READY)
            await self.api.patch(RAYCLUSTERS, self.namespace, cluster_name, {"status": {"state": "ready"}}, subresource="status")
        await self.api.patch(RAYJOBS, self.namespace, name, {"status": {"rayClusterName": cluster_name}}, subresource="status")
        limit = (spec.get("submitterConfig") or {}).get("backoffLimit", DEFAULT_SUBMITTER_BACKOFF_LIMIT)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {"ray.io/originated-from-cr-name": name, "ray.io/originated-from-crd": "RayJob", "app.kubernetes.io/created-by": "kuberay-operator"},
            },
            "spec": {"backoffLimit": limit, "template": spec["submitterPodTemplate"]},
        }
        await self.api.create(job)
        await self.api.patch(JOBS, self.namespace, name, {"status": {"active": 1, "failed": 0}}, subresource="status")
        await self._pod(f"{name}-submit-0", spec["submitterPodTemplate"], {"batch.kubernetes.io/job-name": name, "job-name": name}, "Running")
        await self.api.patch(RAYJOBS, self.namespace, name, {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, subresource="status")

    async def end(
        self, name: str, deployment: str, job_status: str | None, *, hung_submitter: bool = False, message: str | None = None, reason: str | None = None, ttl_passed: bool = True
    ) -> None:
        status: dict[str, Any] = {"jobDeploymentStatus": deployment}
        if job_status:
            status["jobStatus"] = job_status
        if message:
            status["message"] = message
        if reason:
            status["reason"] = reason
        await self.api.patch(RAYJOBS, self.namespace, name, {"status": status}, subresource="status")
        if ttl_passed:
            await self.ttl_passes(name)
        if not hung_submitter:
            await self.api.patch(PODS, self.namespace, f"{name}-submit-0", {"status": {"phase": "Succeeded"}}, subresource="status")

    async def submitter_pod_fails(self, name: str, pod: str) -> str | None:
        """The Job controller after ``pod`` failed: the replacement pod's name, or None past backoffLimit."""
        await self.api.patch(PODS, self.namespace, pod, {"status": {"phase": "Failed"}}, subresource="status")
        job = await self.api.get(JOBS, self.namespace, name)
        assert job is not None
        failed = int((job.get("status") or {}).get("failed") or 0) + 1
        await self.api.patch(JOBS, self.namespace, name, {"status": {"failed": failed}}, subresource="status")
        if failed > int(job["spec"].get("backoffLimit", 6)):
            failed_condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
            await self.api.patch(JOBS, self.namespace, name, {"status": {"active": 0, "conditions": [failed_condition]}}, subresource="status")
            return None
        replacement = f"{name}-submit-{failed}"
        await self._pod(replacement, job["spec"]["template"], {"batch.kubernetes.io/job-name": name, "job-name": name}, "Running")  # waits for the gone GCS
        return replacement

    async def delete_finished(self, name: str) -> None:
        await self.api._request("DELETE", RAYJOBS.path(self.namespace, name))

    async def ttl_passes(self, name: str) -> None:
        """``handleShutdownAfterJobFinishes`` once ``ttlSecondsAfterFinished`` has passed: the cluster goes only while
        the RayJob still asks for it and did not select an existing cluster."""
        rayjob = await self.api.get(RAYJOBS, self.namespace, name)
        assert rayjob is not None, name
        spec = rayjob["spec"]
        if not spec.get("shutdownAfterJobFinishes") or spec.get("clusterSelector"):
            return
        cluster = (rayjob.get("status") or {}).get("rayClusterName") or f"{name}-raycluster"
        if await self.api.get(RAYCLUSTERS, self.namespace, cluster) is not None:
            await self._delete(RAYCLUSTERS.path(self.namespace, cluster))
        await self.collect(cluster, legacy_prefix=name)

    async def _delete(self, path: str) -> None:
        """DELETE, an object already gone included: the operator may delete an ended attempt's cluster itself
        (``cluster_reuse.ended_unkept``) between KubeRay's read and its delete. KubeRay's
        ``deleteClusterResources`` (rayjob_controller.go v1.6.1) then returns the delete's error, and its next
        pass reads NotFound as deleted: the same end state, one requeue later."""
        try:
            await self.api._request("DELETE", path)
        except ApiError as err:
            if err.status != 404:
                raise

    async def collect(self, cluster: str, *, legacy_prefix: str | None = None) -> None:
        """The garbage collector: the pods of a deleted RayCluster go."""
        for pod in await self.api.list(PODS, self.namespace):
            labels = pod["metadata"].get("labels") or {}
            ours = labels.get("ray.io/cluster") == cluster or (legacy_prefix is not None and pod["metadata"]["name"].startswith(f"{legacy_prefix}-"))
            if ours and "ray.io/node-type" in labels:
                await self._delete(PODS.path(self.namespace, pod["metadata"]["name"]))
