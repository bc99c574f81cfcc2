"""Is the run's sandbox up for the preflight? Decided from its Deployment and pods, not from a fixed wait.

The sandbox Deployment is scaled up when the preflight stage comes (``desired_sandbox_replicas``),
so the preflight would otherwise race the sandbox's first image pull, which on a fresh node can
take longer than any fixed wait (and a smoke run with ``maxRetries: 0`` would fail on it). The
operator creates the preflight Job once a sandbox replica is ready. Until then it waits, saying what
the replicas do, for at most ``spec.sandbox.readyTimeoutSeconds`` after the oldest waiting replica's
pod was created; then the wait fails naming the cause and its fix, and the run turns Stalled.

Why our own bound and not the Deployment's ``progressDeadlineSeconds``: the operator creates the
Deployment with 0 replicas, so its first rollout completes at once, and scaling it to 1 later is not
a rollout (``pkg/controller/deployment/progress.go``, Kubernetes v1.36: the deadline is checked only
while a rollout is in progress), so ``ProgressDeadlineExceeded`` never comes for a replica that stays
Pending. It is still honoured when it does come (an image change is a rollout).

The causes named (from the pods; Kueue's from the Workload it holds the pod for):

- Kueue's admission gate (``PodScheduled=False/SchedulingGated`` with the
  ``kueue.x-k8s.io/admission`` gate): Kueue's own reason, from its Workload's conditions;
- the scheduler's verdict (``Unschedulable`` and its message: resources, node selector, taints);
- an image that cannot be pulled (``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``: the
  kubelet's waiting reasons, ``pkg/kubelet/images/types.go``), reported as soon as it is seen;
- any other waiting reason of a container (``CrashLoopBackOff``, ``CreateContainerConfigError``...).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
KUEUE_GATE = "kueue.x-k8s.io/admission"
REASON_WAITING = "WaitingForSandbox"
REASON_PULL_FAILING = "SandboxImagePullFailing"
REASON_NOT_PROGRESSING = "SandboxNotProgressing"

FIX_KUEUE = (
    "give the Kueue ClusterQueue behind the namespace's LocalQueue room for the sandbox's CPU and memory, or keep the sandbox "
    "out of Kueue (docs/install.md, 'Kueue')"
)
FIX_UNSCHEDULABLE = "free or add nodes that fit spec.sandbox.resources, nodeSelector and tolerations"
FIX_PULL = "check spec.sandbox.image (or the operator's sandbox image) and the namespace's image pull secret"
FIX_OTHER = "read the pod's events and logs (kubectl describe pod, kubectl logs)"


@dataclass(frozen=True)
class SandboxGate:
    state: Literal["ready", "waiting", "failed"]
    reason: str
    message: str


@dataclass(frozen=True)
class Cause:
    """Why one replica is not ready, and what to do about it."""

    text: str
    fix: str


def _name(pod: Mapping[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "?")


def _pull_failures(pods: Sequence[dict[str, Any]]) -> list[str]:
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                image = cs.get("image") or "its image"
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                found.append(f"pod {_name(pod)} cannot pull {image}: {waiting['reason']}{detail}")
    return found


def _cause(pod: Mapping[str, Any], kueue: Mapping[str, str]) -> Cause | None:
    """What keeps one pod from being Ready (None when nothing is known yet: starting)."""
    name = _name(pod)
    status = pod.get("status") or {}
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    scheduled = next((cond for cond in status.get("conditions") or [] if cond.get("type") == "PodScheduled"), None)
    if KUEUE_GATE in gates or (scheduled and scheduled.get("reason") == "SchedulingGated" and name in kueue):
        return Cause(f"pod {name} is held by Kueue: {kueue.get(name) or 'waiting for admission'}", FIX_KUEUE)
    if scheduled is not None and scheduled.get("status") == "False":
        reason = scheduled.get("reason") or "not scheduled"
        detail = f": {scheduled['message']}" if scheduled.get("message") else ""
        fix = FIX_UNSCHEDULABLE if reason == "Unschedulable" else FIX_OTHER
        return Cause(f"pod {name} cannot be scheduled ({reason}{detail})", fix)
    pulls = _pull_failures([dict(pod)])
    if pulls:
        return Cause(pulls[0], FIX_PULL)
    waiting = [((cs.get("state") or {}).get("waiting") or {}) for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]]
    reasons = [w["reason"] + (f": {w['message']}" if w.get("message") else "") for w in waiting if w.get("reason")]
    if reasons:
        return Cause(f"pod {name}: {'; '.join(reasons)}", FIX_OTHER)
    return None


def _created(pod: Mapping[str, Any]) -> dt.datetime | None:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def _waiting(pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replicas being waited for: pods not being deleted (a replaced replica's old pod does not count)."""
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def sandbox_gate(
    deployment: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    *,
    now: dt.datetime | None = None,
    ready_timeout_s: float | None = None,
    kueue: Mapping[str, str] | None = None,
) -> SandboxGate:
    """Whether the preflight may start: a ready replica; else waiting (with what the pods do) or failed.

    ``kueue``: pod name -> Kueue's reason for holding it (from its Workload); ``now`` and
    ``ready_timeout_s`` bound the wait from the oldest waiting pod's creation.
    """
    status = (deployment or {}).get("status") or {}
    if int(status.get("readyReplicas") or 0) >= 1:
        return SandboxGate("ready", "", "")
    kueue = kueue or {}
    waiting = _waiting(pods)
    causes = [cause for pod in waiting if (cause := _cause(pod, kueue)) is not None]
    pulls = _pull_failures(waiting)
    conditions = status.get("conditions") or []
    stalled = next((cond for cond in conditions if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("Progressing", "False", DEADLINE_EXCEEDED)), None)
    if stalled is not None:
        why = "; ".join(pulls) if pulls else stalled.get("message") or "no progress"
        return SandboxGate("failed", REASON_NOT_PROGRESSING, f"the sandbox never became ready (its Deployment exceeded its progress deadline): {why}")
    created = [t for pod in waiting if (t := _created(pod)) is not None]
    if now is not None and ready_timeout_s is not None and created and (now - min(created)).total_seconds() >= ready_timeout_s:
        if causes:
            fixes = list(dict.fromkeys(c.fix for c in causes))
            why = "; ".join(c.text for c in causes) + ". Fix: " + "; ".join(fixes)
        else:
            why = f"no replica became Ready ({FIX_OTHER})"
        text = f"the sandbox was not ready {ready_timeout_s:g} s after its replica was created (spec.sandbox.readyTimeoutSeconds): {why}"
        return SandboxGate("failed", REASON_NOT_PROGRESSING, text)
    if pulls:
        text = "waiting for the sandbox: " + "; ".join(pulls) + " (the kubelet keeps retrying until spec.sandbox.readyTimeoutSeconds)"
        return SandboxGate("waiting", REASON_PULL_FAILING, text)
    detail = f" ({'; '.join(c.text for c in causes)})" if causes else ""
    return SandboxGate("waiting", REASON_WAITING, f"waiting for the sandbox: no replica ready yet{detail}")
