"""Retry on the Ray cluster already up (pure): when a failed attempt's cluster is kept, whether the next
attempt may run on it, and when the operator deletes it (docs/operations.md, "Retry on the same cluster").

What KubeRay does (ray-operator v1.6.1, controllers/ray/rayjob_controller.go and utils/validation.go):

- A RayJob whose ``spec.clusterSelector`` is ``{ray.io/cluster: <name>}`` runs its job on that existing
  RayCluster (``getOrCreateRayClusterInstance``) and deletes nothing when it ends ("RayJob is using an
  existing RayCluster via clusterSelector; skipping resource deletion"). The mode refuses ``suspend`` and a
  ``backoffLimit`` above 0 (``ValidateRayJobSpec``).
- A terminal RayJob with ``shutdownAfterJobFinishes`` deletes its cluster ``ttlSecondsAfterFinished`` after its
  end (``handleShutdownAfterJobFinishes``); with it false it deletes nothing. Validation runs on every
  reconcile, terminal RayJobs included, and refuses a TTL above 0 without ``shutdownAfterJobFinishes``
  (``validateDeletionConfiguration``), so keeping a cluster patches both fields.

So the operator's RayJobs keep ``shutdownAfterJobFinishes`` (KubeRay frees the devices even while the
operator is down) and, where a retry may reuse the cluster, a TTL of at least ``KEEP_WINDOW_SECONDS``: the
window in which the operator, which watches its RayJobs, keeps a failed attempt's cluster. A cluster it does
not keep it deletes itself at once when ``clusterGraceSeconds`` is 0, so the window costs no device time.

Which failures: only the job's. KubeRay's reason ``AppFailed`` with Ray's own ``jobStatus`` ``FAILED`` (the
driver exited with an error); ``AppFailed`` alone also covers "Submitter completed but Ray job not found in
RayCluster", which a restarted head gives. Which clusters: a healthy one (``cluster_health``): KubeRay says
``ready``, every pod it started for the attempt still runs, ready, never restarted, none replaced since the
job was submitted, no node under it going (``notice``), and the run renders the same cluster and spec
snapshot as when it was made (``builders.stages.cluster_fingerprint``). Once per cluster: an attempt that fails on a kept cluster
gets a fresh one (the failure may be the hardware's).

Never for a run queued by Kueue: Kueue's RayJob integration does not manage a RayJob with a clusterSelector
(v0.19.2, pkg/controller/jobs/rayjob/rayjob_controller.go, ``RayJob.Skip``: "These jobs are not managed by Kueue"), so the retry would run outside the queue's quota while the kept
cluster, whose Workload Kueue has finished, holds devices the queue counts as free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES
from retool.spec.status import KeptCluster, StageStatus
from retool_operator import constants as c
from retool_operator import notice
from retool_operator.builders.scheduling import queued
from retool_operator.status import parse_time

KEEP_WINDOW_SECONDS = 30
"""The least ttlSecondsAfterFinished of a RayJob whose cluster a retry may reuse: how long the operator has to
keep it after KubeRay marks the job Failed (it acts on the watch event, normally within a second)."""
ANNOTATION_FINGERPRINT = "retool.dev/cluster-fingerprint"
"""On a RayJob that creates its cluster: what the cluster runs (``builders.stages.cluster_fingerprint``)."""
ANNOTATION_ATTEMPT_SINCE = "retool.dev/attempt-since"
"""On a kept cluster's pods: when the attempt in their ``retool.dev/attempt`` label took them over (``cost``)."""
JOB_FAILED_REASON = "AppFailed"


def enabled(run: RetoolRun, stage: str) -> bool:
    """Whether a failed attempt of ``stage`` may leave its cluster to the next one."""
    return stage in RAY_STAGES and run.spec.failure_policy.retry_on_same_cluster and not queued(run)


def cluster_ttl(run: RetoolRun, stage: str) -> int:
    """ttlSecondsAfterFinished of a RayJob that creates its cluster."""
    grace = run.spec.failure_policy.cluster_grace_seconds
    return max(grace, KEEP_WINDOW_SECONDS) if enabled(run, stage) else grace


def job_failed(rayjob: Mapping[str, Any] | None) -> bool:
    """KubeRay failed the RayJob because Ray says its job FAILED (not a deadline, a submission, a lost head)."""
    st = (rayjob or {}).get("status") or {}
    return st.get("jobDeploymentStatus") == "Failed" and st.get("reason") == JOB_FAILED_REASON and st.get("jobStatus") == "FAILED"


def cluster_pods(pods: Iterable[Mapping[str, Any]] | None, cluster: str) -> list[Mapping[str, Any]]:
    """The pods KubeRay started for ``cluster`` (head and workers) that the API server has."""
    out = []
    for pod in pods or []:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(c.RAY_CLUSTER_LABEL) == cluster and labels.get(c.RAY_NODE_TYPE_LABEL) in ("head", "worker"):
            out.append(pod)
    return out


def _ready(pod: Mapping[str, Any]) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def cluster_health(
    cluster: Mapping[str, Any] | None,
    pods: list[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any] | None],
    *,
    expected_pods: int,
    submitted: str | None,
) -> str | None:
    """None when the cluster can run the next attempt, else why not (one line).

    ``pods``: the cluster's (``cluster_pods``); ``submitted``: when the failed attempt's job started (Ray's
    start time, else its submitter pod's creation), or, once the cluster is kept, when it was kept: a pod made
    after it replaced one the job ran on or the retry would run on."""
    if cluster is None:
        return "the RayCluster is gone"
    name = (cluster.get("metadata") or {}).get("name", "?")
    if (cluster.get("metadata") or {}).get("deletionTimestamp"):
        return f"RayCluster {name} is being deleted"
    state = (cluster.get("status") or {}).get("state")
    if state != "ready":
        return f"RayCluster {name} is {state or 'not ready'}"
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if len(live) != expected_pods or sum(1 for p in live if ((p.get("metadata") or {}).get("labels") or {}).get(c.RAY_NODE_TYPE_LABEL) == "head") != 1:
        return f"RayCluster {name} has {len(live)} of its {expected_pods} pods"
    since = parse_time(submitted) if submitted else None
    for pod in live:
        pod_name = (pod.get("metadata") or {}).get("name", "?")
        if not _ready(pod):
            return f"pod {pod_name} is not running and ready"
        restarts = sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])
        if restarts:
            return f"pod {pod_name} restarted {restarts} time(s)"
        created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
        if since is not None and created is not None and created > since:
            return f"pod {pod_name} replaced one the failed job ran on"
    going = notice.notice(live, nodes, None)
    if going is not None:
        return going
    return None


def job_started(rayjob: Mapping[str, Any] | None) -> str | None:
    """When Ray started the RayJob's job, as KubeRay copied it from the dashboard (``status.rayJobInfo.startTime``)."""
    return (((rayjob or {}).get("status") or {}).get("rayJobInfo") or {}).get("startTime")


def submitted_time(pods: Iterable[Mapping[str, Any]] | None, stage: str, attempt: int) -> str | None:
    """When the attempt's job was submitted: its first submitter pod's creation (KubeRay creates the
    submitter Job once the cluster is ready)."""
    times = []
    for pod in pods or []:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        ours = labels.get(c.LABEL_POD_ROLE) == "submitter" and labels.get(c.LABEL_STAGE) == stage and labels.get(c.LABEL_ATTEMPT) == str(attempt)
        if ours and meta.get("creationTimestamp"):
            times.append(meta["creationTimestamp"])
    return min(times, key=parse_time) if times else None


def keep_patch() -> dict[str, Any]:
    """The patch of a failed attempt's RayJob that makes KubeRay leave its cluster up (valid on every
    reconcile: no TTL without shutdownAfterJobFinishes)."""
    return {"spec": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0}}


def handover_patch(attempt: int, now: str) -> dict[str, Any]:
    """The patch of a kept cluster's pod that hands it to ``attempt``: every reader of "the attempt's pods"
    (cost, notice, the stage's start) then counts it there, from ``now``."""
    return {"metadata": {"labels": {c.LABEL_ATTEMPT: str(attempt)}, "annotations": {ANNOTATION_ATTEMPT_SINCE: now}}}


def kept_for(entry: StageStatus) -> KeptCluster | None:
    """The cluster the stage keeps for its next attempt or runs its current attempt on (None: none needed).

    A kept cluster is needed while the stage waits to retry on it, and while the attempt that runs on it
    is followed; otherwise (that attempt ended, the stage finished, the kept cluster was given up) the
    operator deletes it: ``to_release``."""
    kept = entry.ray_cluster
    if kept is None or kept.released:
        return None
    if entry.state == "Retrying" and kept.attempt == entry.attempt + 1:
        return kept
    if entry.state in ("Running", "Queued") and kept.attempt == entry.attempt:
        return kept
    return None


def to_release(stages: Iterable[StageStatus]) -> list[KeptCluster]:
    """Kept clusters no attempt needs any more: the operator deletes them (KubeRay will not)."""
    return [s.ray_cluster for s in stages if s.ray_cluster is not None and kept_for(s) is None]


def ended_unkept(run: RetoolRun, before: Iterable[StageStatus], after: Iterable[StageStatus], children: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Clusters to delete now: those of Ray attempts that ended this pass with their own cluster, not kept, whose
    RayJob's TTL is the reuse window only (``clusterGraceSeconds`` 0: KubeRay would hold their devices
    ``KEEP_WINDOW_SECONDS`` longer), or whose RayJob was patched to keep it (KubeRay will not delete it at all:
    a keep whose status write was lost, then not renewed). With a grace above 0 KubeRay deletes the others."""
    grace = run.spec.failure_policy.cluster_grace_seconds
    out = []
    now_by_name = {s.name: s for s in after}
    for old in before:
        new = now_by_name.get(old.name)
        if new is None or old.state not in c.FOLLOWED_STATES or not old.job or (new.job == old.job and new.state in c.FOLLOWED_STATES):
            continue
        obj = children.get(old.job) or {}
        spec, st = obj.get("spec") or {}, obj.get("status") or {}
        if st.get("jobDeploymentStatus") not in ("Complete", "Failed") or "rayClusterSpec" not in spec:
            continue
        cluster = st.get("rayClusterName")
        kept = new.ray_cluster is not None and new.ray_cluster.name == cluster and not new.ray_cluster.released
        left_up = not spec.get("shutdownAfterJobFinishes")
        if cluster and not kept and (left_up or (not grace and enabled(run, old.name))):
            out.append(str(cluster))
    return out
