"""Is the run's sandbox up for the preflight? Decided from its Deployment and pods, not from a fixed wait.

The sandbox Deployment is scaled up when the preflight stage comes (``desired_sandbox_replicas``),
so the preflight would otherwise race the sandbox's first image pull, which on a fresh node can
take longer than any fixed wait (and a smoke run with ``maxRetries: 0`` would fail on it). The
operator creates the preflight Job once a sandbox replica is ready. Until then it waits as long as
the Deployment makes progress: Kubernetes sets the Deployment's ``Progressing`` condition to False
with reason ``ProgressDeadlineExceeded`` after ``progressDeadlineSeconds`` (600 s by default)
without progress (``pkg/controller/deployment/progress.go`` and ``util/deployment_util.go``,
Kubernetes v1.36), and that ends the wait. A pod whose image cannot be pulled
(``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``: the kubelet's waiting reasons,
``pkg/kubelet/images/types.go``) is reported as such while the Deployment still retries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
REASON_WAITING = "WaitingForSandbox"
REASON_PULL_FAILING = "SandboxImagePullFailing"
REASON_NOT_PROGRESSING = "SandboxNotProgressing"


@dataclass(frozen=True)
class SandboxGate:
    state: Literal["ready", "waiting", "failed"]
    reason: str
    message: str


def _pull_failures(pods: Sequence[dict[str, Any]]) -> list[str]:
    found = []
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                image = cs.get("image") or "its image"
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                found.append(f"pod {name} cannot pull {image}: {waiting['reason']}{detail}")
    return found


def _pending_reasons(pods: Sequence[dict[str, Any]]) -> list[str]:
    """What the not-ready pods are doing (ContainerCreating, Unschedulable ...), for the waiting message."""
    out = []
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                out.append(f"{name}: {cond.get('reason', 'not scheduled')}")
                break
        else:
            waiting = [((cs.get("state") or {}).get("waiting") or {}).get("reason") for cs in status.get("containerStatuses") or []]
            reasons = [w for w in waiting if w]
            if reasons:
                out.append(f"{name}: {', '.join(reasons)}")
    return out


def sandbox_gate(deployment: dict[str, Any] | None, pods: Sequence[dict[str, Any]]) -> SandboxGate:
    """Whether the preflight may start: a ready replica; else waiting (with what the pods do) or failed."""
    status = (deployment or {}).get("status") or {}
    if int(status.get("readyReplicas") or 0) >= 1:
        return SandboxGate("ready", "", "")
    pulls = _pull_failures(pods)
    conditions = status.get("conditions") or []
    stalled = next((cond for cond in conditions if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("Progressing", "False", DEADLINE_EXCEEDED)), None)
    if stalled is not None:
        why = "; ".join(pulls) if pulls else stalled.get("message") or "no progress"
        return SandboxGate("failed", REASON_NOT_PROGRESSING, f"the sandbox never became ready (its Deployment exceeded its progress deadline): {why}")
    if pulls:
        text = "waiting for the sandbox: " + "; ".join(pulls) + " (the kubelet keeps retrying until the Deployment's progress deadline)"
        return SandboxGate("waiting", REASON_PULL_FAILING, text)
    pending = _pending_reasons(pods)
    detail = f" ({'; '.join(pending)})" if pending else ""
    return SandboxGate("waiting", REASON_WAITING, f"waiting for the sandbox: no replica ready yet{detail}")
