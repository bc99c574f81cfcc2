"""Refusals below the operator: what the controllers that make the pods and volumes report (pure).

The operator's own requests succeed, yet the cluster may still refuse what they asked for: Pod
Security admission (a namespace at ``restricted``), a ResourceQuota or a LimitRange turn down the
*pods*, which the Job controller and KubeRay create, not the operator; a storage class may fail to
provision the run's claim. Nothing of that reaches a stage's own status (the Job stays active with 0
pods, the RayJob Initializing), so the run would wait without a word. Each controller says it in its
own place, and this module reads it there:

- KubeRay: ``status.rayClusterStatus.conditions[type=ReplicaFailure]`` of the RayJob (the RayCluster's
  condition, reasons ``FailedCreateHeadPod``/``FailedCreateWorkerPod``; copied into the RayJob while
  it waits for the cluster: rayjob_controller.go and raycluster_controller.go ``calculateStatus``,
  KubeRay v1.6.1/v1.7.0);
- the Job controller: Warning Events with reason ``FailedCreate`` on the Job
  (``FailedCreatePodReason``, pkg/controller/controller_utils.go, Kubernetes v1.36.3);
- the volume controller: Warning Events with reason ``ProvisioningFailed`` on a Pending claim
  (pkg/controller/volume/events/event.go, Kubernetes v1.36.3).

The run's status then says so: Stalled=True with the refusal, a Warning Event, and for the claim
StorageReady=False.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

EVENTS_AFTER_SECONDS = 10.0
"""Events are read only for a Job or claim at least this old: a fresh Job has no pod and a fresh claim is
Pending for a moment anyway, and a run's first passes then cost no extra requests (the resync comes
back for what stays that way)."""
JOB_FAILED_CREATE = "FailedCreate"
CLAIM_PROVISIONING_FAILED = "ProvisioningFailed"


def rayjob_replica_failure(obj: dict[str, Any] | None) -> str | None:
    """KubeRay's ReplicaFailure condition of the RayJob's cluster, as ``reason: message``; None when absent."""
    cluster = ((obj or {}).get("status") or {}).get("rayClusterStatus") or {}
    for cond in cluster.get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x) or "ReplicaFailure"
    return None


def job_without_pods(obj: dict[str, Any] | None) -> bool:
    """A Job that should be running (not suspended, not finished) but has no active pod: worth asking its Events why."""
    if obj is None:
        return False
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("suspend") or int(status.get("active") or 0) > 0:
        return False
    return not any(cond.get("type") in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget") for cond in status.get("conditions") or [])


def latest_warning(events: list[dict[str, Any]], reason: str) -> str | None:
    """The message of the most recent Warning Event with ``reason`` (by lastTimestamp / eventTime), or None."""
    matching = [e for e in events if e.get("reason") == reason and e.get("type", "Warning") == "Warning"]
    if not matching:
        return None

    def when(event: dict[str, Any]) -> str:
        return str(event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get("creationTimestamp") or "")

    return str(max(matching, key=when).get("message") or reason)


def child_refusal(kind: str, name: str, obj: dict[str, Any] | None, events: list[dict[str, Any]] | None) -> str | None:
    """Why the pods of a running stage child cannot be created, in one line; None when nothing refuses them."""
    if kind == "RayJob":
        failure = rayjob_replica_failure(obj)
        return f"KubeRay cannot create the pods of RayJob {name}: {failure}" if failure else None
    message = latest_warning(events or [], JOB_FAILED_CREATE)
    return f"the Job controller cannot create the pod of Job {name}: {message}" if message else None


def claim_refusal(name: str, obj: dict[str, Any] | None, events: list[dict[str, Any]] | None) -> str | None:
    """Why a Pending claim is not provisioned, in one line; None when it is bound or nothing failed."""
    if obj is None or ((obj.get("status") or {}).get("phase") or "Pending") != "Pending":
        return None
    message = latest_warning(events or [], CLAIM_PROVISIONING_FAILED)
    return f"PersistentVolumeClaim {name} cannot be provisioned: {message}" if message else None


def old_enough(obj: dict[str, Any] | None, now: dt.datetime) -> bool:
    """Whether ``obj`` was created at least ``EVENTS_AFTER_SECONDS`` ago (no timestamp: yes)."""
    stamp = ((obj or {}).get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return True
    created = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return (now - created).total_seconds() >= EVENTS_AFTER_SECONDS
