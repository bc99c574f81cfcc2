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
  (pkg/controller/volume/events/event.go, Kubernetes v1.36.3), and Events with reason
  ``FailedBinding`` — of type *Normal* for "no persistent volumes available for this claim and no
  storage class is set" (a cluster without a default StorageClass; pv_controller.go
  ``syncUnboundClaim``, v1.36.3), Warning for a volume bound elsewhere;
- KubeRay's submitter Job of a RayJob in K8sJobMode (named as the RayJob,
  ``rayjob_controller.go`` ``createK8sJobIfNeed``, v1.6.1/v1.7.0): its ``FailedCreate`` Events when the
  Job controller cannot create the submitter pod (quota, LimitRange, policy). KubeRay keeps the
  RayJob ``Running`` while the submitter has not finished, so without this the stage holds its GPUs
  and says nothing;
- the scheduler: a pod's ``PodScheduled=False`` condition with reason ``Unschedulable`` and the
  scheduler's message (``handleSchedulingFailure``, pkg/scheduler/schedule_one.go, v1.36.3).

The run's status then says so: Stalled=True with the refusal, a Warning Event, and for the claim
StorageReady=False.

A failed pod creation is a refusal only when the API server *refused* it (``refuses``): while etcd or
the API server restarts, the same controllers record the same Event reasons and conditions with a
timeout or an internal error, which their next try gets past. Those say nothing about the run. Nor,
for a while, does a webhook denying a pod because its cache has not seen the pod's owner yet
(``owner_unseen``).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from retool_operator.status import short_message

EVENTS_AFTER_SECONDS = 10.0
"""Events are read only for a Job or claim at least this old: a fresh Job has no pod and a fresh claim is
Pending for a moment anyway, and a run's first passes then cost no extra requests (the resync comes
back for what stays that way)."""
CLAIM_SETTLE_SECONDS = 2.0
"""A Pending claim younger than this holds the first stage: the PV controller reports a claim it cannot
bind (``FailedBinding``) on its first sync of it, but not before the operator's pass that created it
reads it back; a claim it binds or provisions, or leaves to its first consumer, lets the stage start."""
JOB_FAILED_CREATE = "FailedCreate"
POD_CREATED = "SuccessfulCreate"
"""The Job controller's (and the ReplicaSet controller's) Normal Event for each pod it created."""
CLAIM_PROVISIONING_FAILED = "ProvisioningFailed"
CLAIM_FAILED_BINDING = "FailedBinding"
POD_UNSCHEDULABLE = "Unschedulable"


REFUSED = re.compile(r'\bis forbidden: |\bis invalid: |admission webhook "[^"]*" denied the request')
"""How the API server words a refusal, whoever reports it: ``NewForbidden`` (``%s %q is forbidden: %v``:
Pod Security, ResourceQuota, LimitRange, a ValidatingAdmissionPolicy, a missing ServiceAccount) and
``NewInvalid`` (``%s %q is invalid: %s``) in k8s.io/apimachinery pkg/api/errors/errors.go, and a webhook's
denial (``admission webhook %q denied the request``, k8s.io/apiserver
pkg/admission/plugin/webhook/errors/statuserror.go ``ToStatusErr``), all Kubernetes v1.36.3. A
controller's Event or condition carries ``err.Error()``, so the same words. Anything else (``etcdserver:
request timed out``, ``Timeout: request did not complete within requested timeout``, ``Internal error
occurred``, a closed connection) is the control plane being unwell, which the controller retries."""


OWNER_UNSEEN = re.compile(r'admission webhook "[^"]*" denied the request: [A-Za-z]+\.[a-z0-9.-]+ "([^"]+)" not found')
"""A webhook's denial that carries a NotFound of a named object (``%s %q not found``, ``NewNotFound``,
k8s.io/apimachinery errors.go v1.36.3): Kueue's pod webhook (``mpod.kb.io``) walks the pod's owner chain
in its informer cache (``jobframework.FindAncestorJobManagedByKueue``, sigs.k8s.io/kueue v0.19.0
pkg/controller/jobframework/reconciler.go) and denies with that error while its cache lags the API
server: a Job seconds old, or every object for as long as its watches take to come back after etcd
restarts (``Job.batch "demo-prepare-1" not found``, seen in CI)."""
STALE_CACHE_SECONDS = 60.0
"""How long a denial naming a pod's existing owner as not found is taken for a cache that lags (the
controller retries): past it, the webhook is shown, as it will not come round by itself."""


def owner_unseen(message: str | None, owners: tuple[str, ...]) -> bool:
    """Whether ``message`` is a webhook denying a pod because it cannot find one of the pod's ``owners``,
    which the operator has just read: the webhook's cache has not seen them yet (``OWNER_UNSEEN``)."""
    found = OWNER_UNSEEN.search(message or "")
    return found is not None and found.group(1) in owners


def refuses(message: str | None) -> bool:
    """Whether a controller's reported creation error is the API server refusing the object (``REFUSED``)."""
    return message is not None and REFUSED.search(message) is not None


def _refused_replicas(conditions: list[dict[str, Any]] | None, now: dt.datetime, owners: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The ``ReplicaFailure=True`` condition whose message is a refusal (``refuses``) and that has held for
    ``EVENTS_AFTER_SECONDS``, if any: KubeRay's RayCluster and the Deployment controller both report failed
    pod creations this way, and both retry. A refusal that clears within seconds is not one to show: in a
    namespace created a moment before (GitOps applying the Namespace and the run together), the first pod
    creation meets the ServiceAccount admission before the controller made ``default`` ("error looking up
    service account ... not found", a Forbidden) and the next creation succeeds. A webhook that cannot find
    one of the pod's ``owners`` yet (``owner_unseen``) is given ``STALE_CACHE_SECONDS``."""
    for cond in conditions or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True" and refuses(cond.get("message")):
            hold = STALE_CACHE_SECONDS if owner_unseen(cond.get("message"), owners) else EVENTS_AFTER_SECONDS
            return cond if held_since(cond.get("lastTransitionTime"), now, hold) else None
    return None


def replicas_refusal_settling(deployment: dict[str, Any] | None, now: dt.datetime) -> bool:
    """A Deployment whose pods were refused less than ``EVENTS_AFTER_SECONDS`` ago: read it again then."""
    conditions = ((deployment or {}).get("status") or {}).get("conditions")
    return any(
        cond.get("type") == "ReplicaFailure" and cond.get("status") == "True" and refuses(cond.get("message")) and not held_since(cond.get("lastTransitionTime"), now)
        for cond in conditions or []
    )


def held_since(stamp: Any, now: dt.datetime, seconds: float = EVENTS_AFTER_SECONDS) -> bool:
    """Whether a condition that changed at ``stamp`` (RFC 3339; none: yes) has held for ``seconds``."""
    when = timestamp(stamp)
    return when is None or (now - when).total_seconds() >= seconds


def timestamp(stamp: Any) -> dt.datetime | None:
    """An API timestamp (``2026-11-27T06:13:06Z``, or with microseconds as Events' ``eventTime``), None when absent or unreadable."""
    if not stamp:
        return None
    try:
        when = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def short(text: str) -> str:
    """``text`` on one line, cut for the run's columns (``status.short_message``); the full text goes in an Event."""
    return short_message(text)


def rayjob_replica_failure(name: str, obj: dict[str, Any] | None, now: dt.datetime) -> str | None:
    """KubeRay's ReplicaFailure condition of RayJob ``name``'s cluster, as ``reason: message``; None when absent."""
    status = (obj or {}).get("status") or {}
    owners = tuple(str(n) for n in (name, status.get("rayClusterName")) if n)
    cond = _refused_replicas((status.get("rayClusterStatus") or {}).get("conditions"), now, owners)
    return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x) if cond else None


def replica_failure(deployment: dict[str, Any] | None, now: dt.datetime) -> str | None:
    """Why a Deployment's pods cannot be created, from its ``ReplicaFailure`` condition (True while its
    ReplicaSet's pod creations fail: Pod Security admission, quota, a missing RuntimeClass); None otherwise.

    Without it a refused sandbox pod shows only as missing ready replicas; the reason lives in the
    ReplicaSet's events, which nobody watching the run reads.
    """
    cond = _refused_replicas(((deployment or {}).get("status") or {}).get("conditions"), now)
    return " ".join(x for x in (cond.get("reason"), cond.get("message")) if x) if cond else None


def job_without_pods(obj: dict[str, Any] | None) -> bool:
    """A Job that should be running (not suspended, not finished) but has no active pod: worth asking its Events why."""
    if obj is None:
        return False
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("suspend") or int(status.get("active") or 0) > 0:
        return False
    if int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1):
        return False  # its pod succeeded and the controller has yet to mark it complete: it creates no more
    return not any(cond.get("type") in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget") for cond in status.get("conditions") or [])


def latest_warning(events: list[dict[str, Any]], reason: str, *, any_type: bool = False) -> str | None:
    """The message of the most recent Warning Event with ``reason`` (by lastTimestamp / eventTime), or None.

    ``any_type``: Normal Events count too (the volume controller reports a missing StorageClass as Normal)."""
    found = _latest(events, reason, any_type=any_type)
    return None if found is None else str(found.get("message") or reason)


def creation_refusal(events: list[dict[str, Any]], now: dt.datetime, owners: tuple[str, ...] = ()) -> str | None:
    """The newest ``FailedCreate`` Warning of a Job, unless a pod was created after it (``SuccessfulCreate``:
    the controller's retry got through, e.g. once a fresh namespace's ``default`` ServiceAccount existed).
    A Job whose pod has just ended has no active pod until its controller marks it finished, and its
    Events still hold that early refusal: it is not refused now. A webhook that cannot find one of the
    pod's ``owners`` (the Job itself, the RayJob above it) counts once it has been the answer for
    ``STALE_CACHE_SECONDS`` since its first time: before that it is a cache that lags."""
    failed = _latest(events, JOB_FAILED_CREATE)
    if failed is None:
        return None
    created = _latest(events, POD_CREATED, any_type=True)
    if created is not None and _event_time(created) >= _event_time(failed):
        return None
    message = str(failed.get("message") or JOB_FAILED_CREATE)
    if owner_unseen(message, owners) and (now - _first_time(failed)).total_seconds() < STALE_CACHE_SECONDS:
        return None
    return message


def _latest(events: list[dict[str, Any]], reason: str, *, any_type: bool = False) -> dict[str, Any] | None:
    matching = [e for e in events if e.get("reason") == reason and (any_type or e.get("type", "Warning") == "Warning")]
    return max(matching, key=_event_time) if matching else None


def _event_time(event: dict[str, Any]) -> dt.datetime:
    """When an Event last happened: ``lastTimestamp`` (core/v1, seconds), else ``eventTime`` (events.k8s.io
    series, microseconds), else its creation; compared as times, not strings (``06Z`` sorts after ``06.5Z``)."""
    return _stamp(event, "lastTimestamp", "eventTime", "creationTimestamp")


def _first_time(event: dict[str, Any]) -> dt.datetime:
    """When an Event first happened: ``firstTimestamp`` (the recorder keeps it as it counts repeats), else
    ``eventTime``, else its creation, else its last time."""
    return _stamp(event, "firstTimestamp", "eventTime", "creationTimestamp", "lastTimestamp")


def _stamp(event: dict[str, Any], *fields: str) -> dt.datetime:
    """The first of ``fields`` (the Event's own, or its metadata's) that holds a readable time; the earliest time when none does."""
    metadata = event.get("metadata") or {}
    for field in fields:
        when = timestamp(event.get(field) or metadata.get(field))
        if when is not None:
            return when
    return dt.datetime.min.replace(tzinfo=dt.UTC)


def child_refusal(kind: str, name: str, obj: dict[str, Any] | None, events: list[dict[str, Any]] | None, now: dt.datetime) -> str | None:
    """Why the pods of a running stage child cannot be created, in one line; None when nothing refuses them."""
    if kind == "RayJob":
        failure = rayjob_replica_failure(name, obj, now)
        return f"KubeRay cannot create the pods of RayJob {name}: {failure}" if failure else None
    message = creation_refusal(events or [], now, (name,))
    return f"the Job controller cannot create the pod of Job {name}: {message}" if refuses(message) else None


def claim_refusal(name: str, obj: dict[str, Any] | None, events: list[dict[str, Any]] | None) -> str | None:
    """Why a Pending claim is not provisioned or bound, in one line; None when it is bound or nothing failed."""
    found = claim_failure(obj, events)
    if found is None:
        return None
    reason, message = found
    verb = "cannot be provisioned" if reason == CLAIM_PROVISIONING_FAILED else "cannot bind"
    return f"PersistentVolumeClaim {name} {verb}: {message}"


def claim_failure(obj: dict[str, Any] | None, events: list[dict[str, Any]] | None) -> tuple[str, str] | None:
    """(event reason, message) of why a Pending claim has no volume: ProvisioningFailed first, else FailedBinding."""
    if obj is None or ((obj.get("status") or {}).get("phase") or "Pending") != "Pending":
        return None
    for reason in (CLAIM_PROVISIONING_FAILED, CLAIM_FAILED_BINDING):
        message = latest_warning(events or [], reason, any_type=reason == CLAIM_FAILED_BINDING)
        if message:
            return reason, message
    return None


def submitter_refusal(
    rayjob: str, rayjob_obj: dict[str, Any] | None, submitter: dict[str, Any] | None, events: list[dict[str, Any]] | None, now: dt.datetime
) -> str | None:
    """Why KubeRay's submitter pod of a Running RayJob does not exist, in one line; None when nothing refuses it."""
    if rayjob_obj is None or submitter is None or not job_without_pods(submitter):
        return None
    owners = (rayjob, str(((submitter.get("metadata") or {}).get("name")) or rayjob))
    message = creation_refusal(events or [], now, owners)
    return f"the Job controller cannot create the submitter pod of RayJob {rayjob}: {message}" if refuses(message) else None


def wants_submitter(rayjob_obj: dict[str, Any] | None) -> bool:
    """A RayJob whose submitter should be running but whose job has not started: worth reading its submitter Job."""
    status = (rayjob_obj or {}).get("status") or {}
    return status.get("jobDeploymentStatus") == "Running" and (status.get("jobStatus") or "PENDING") == "PENDING"


def unschedulable(pods: list[dict[str, Any]], now: dt.datetime) -> str | None:
    """The scheduler's words for the first pod it could not place for ``EVENTS_AFTER_SECONDS`` (``pod: message``), or None.

    A pod the scheduler marked Unschedulable a moment ago may still be placed by a preemption it
    nominated; one that stays so is named."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") not in (None, "Pending"):
            continue
        for cond in status.get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) != ("PodScheduled", "False", POD_UNSCHEDULABLE):
                continue
            since = cond.get("lastTransitionTime")
            if since and (now - dt.datetime.fromisoformat(str(since).replace("Z", "+00:00"))).total_seconds() < EVENTS_AFTER_SECONDS:
                continue
            name = (pod.get("metadata") or {}).get("name", "?")
            return f"pod {name} cannot be scheduled: {cond.get('message') or POD_UNSCHEDULABLE}"
    return None


def pods_pending(kind: str, obj: dict[str, Any] | None) -> bool:
    """A running child whose pods may not all be up yet: a Job with an active pod not ready, a RayJob whose cluster is not ready."""
    status = (obj or {}).get("status") or {}
    if kind == "RayJob":
        cluster = status.get("rayClusterStatus") or {}
        return status.get("jobDeploymentStatus") in (None, "", "Initializing", "Running") and cluster.get("state") != "ready"
    return int(status.get("active") or 0) > int(status.get("ready") or 0)


def old_enough(obj: dict[str, Any] | None, now: dt.datetime, seconds: float = EVENTS_AFTER_SECONDS) -> bool:
    """Whether ``obj`` was created at least ``seconds`` ago (no timestamp: yes)."""
    stamp = ((obj or {}).get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return True
    created = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return (now - created).total_seconds() >= seconds


def claim_settling(obj: dict[str, Any] | None, now: dt.datetime) -> bool:
    """A Pending claim the volume controller may not have looked at yet (``CLAIM_SETTLE_SECONDS``)."""
    if obj is None or ((obj.get("status") or {}).get("phase") or "Pending") != "Pending":
        return False
    return not old_enough(obj, now, CLAIM_SETTLE_SECONDS)
