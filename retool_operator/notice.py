"""Is a node under the running rl stage going? The signs Kubernetes and its add-ons leave, read as they are (pure).

A cloud takes a Spot or preemptible node after 30-120 s of notice; a drain or a scale-down starts with a
cordon or a taint. The operator turns the first sign it sees into a save request to the trainer
(``retool.tracking.request_save``; docs/operations.md, "Save on notice"). The signs:

- a cordon: ``spec.unschedulable`` (``kubectl cordon``/``drain``; the node lifecycle controller adds the
  ``node.kubernetes.io/unschedulable`` taint for it);
- a taint a known party sets on a node it is about to take (``GOING_TAINTS``);
- the pod's ``DisruptionTarget`` condition (Kubernetes >= 1.26, on by default from 1.31): the pod is
  about to be deleted by a preemption, the taint manager, an eviction (a drain) or the kubelet's
  graceful node shutdown (pkg/apis/core/types.go, ``DisruptionTarget``);
- Kueue's ``Evicted`` condition on the stage's Workload (preemption, a lost admission check).

Only the device pods of the rl stage's current attempt count (the Ray head and workers): the submitter
pod holds no training state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from retool_operator import constants as c

GOING_TAINTS: dict[str, str] = {
    # cluster-autoscaler: utils/taints/taints.go, ToBeDeletedTaint (set before it drains and deletes the node)
    "ToBeDeletedByClusterAutoscaler": "the cluster autoscaler is removing it",
    # Karpenter v1: pkg/apis/v1/taints.go, DisruptedTaintKey (set before it drains a node it disrupts)
    "karpenter.sh/disrupted": "Karpenter is disrupting it",
    # GKE: set on Spot and preemptible VMs when the termination notice arrives (graceful node shutdown)
    "cloud.google.com/impending-node-termination": "GKE is terminating it",
    # aws-node-termination-handler: pkg/node/node.go, the taints of each interruption it handles
    "aws-node-termination-handler/spot-itn": "AWS announced its Spot interruption",
    "aws-node-termination-handler/rebalance-recommendation": "AWS recommends rebalancing it away",
    "aws-node-termination-handler/scheduled-maintenance": "AWS scheduled maintenance on it",
    "aws-node-termination-handler/asg-lifecycle-termination": "its Auto Scaling group is terminating it",
    # Kubernetes non-graceful node shutdown (KEP-2268)
    "node.kubernetes.io/out-of-service": "it was marked out of service",
}


def node_going(node: Mapping[str, Any] | None) -> str | None:
    """Why the node is going, or None: a known taint first (it names who takes the node), then a cordon."""
    if not node:
        return None
    spec = node.get("spec") or {}
    for taint in spec.get("taints") or []:
        why = GOING_TAINTS.get(str(taint.get("key") or ""))
        if why is not None:
            return f"{why} (taint {taint.get('key')})"
    if spec.get("unschedulable"):
        return "it is cordoned (spec.unschedulable)"
    return None


def pod_disrupted(pod: Mapping[str, Any]) -> str | None:
    """The pod's ``DisruptionTarget`` condition, when True: its reason and message."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return " ".join(x for x in (cond.get("reason"), cond.get("message")) if x) or "DisruptionTarget"
    return None


def workload_evicted(workloads: Iterable[Mapping[str, Any]] | None) -> str | None:
    for workload in workloads or []:
        for cond in (workload.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Evicted" and cond.get("status") == "True":
                return " ".join(x for x in (cond.get("reason"), cond.get("message")) if x) or "Evicted"
    return None


def attempt_pods(pods: Iterable[Mapping[str, Any]] | None, stage: str, attempt: int) -> list[Mapping[str, Any]]:
    """The Ray head and worker pods of one stage attempt that are on a node (KubeRay labels them
    ``ray.io/node-type``; the submitter pod, which holds no training state, has no such label)."""
    found = []
    for pod in pods or []:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        ours = labels.get(c.LABEL_STAGE) == stage and labels.get(c.LABEL_ATTEMPT) == str(attempt)
        if ours and labels.get(c.RAY_NODE_TYPE_LABEL) in ("head", "worker") and (pod.get("spec") or {}).get("nodeName"):
            found.append(pod)
    return found


def nodes_of(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({str((pod.get("spec") or {}).get("nodeName")) for pod in pods if (pod.get("spec") or {}).get("nodeName")})


def notice(pods: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any] | None], workloads: Iterable[Mapping[str, Any]] | None) -> str | None:
    """The first sign that the attempt's nodes are going, as one line naming the node or the pod; None when there is none."""
    pods = list(pods)
    for name in nodes_of(pods):
        why = node_going(nodes.get(name))
        if why is not None:
            return f"node {name} is going: {why}"
    for pod in pods:
        why = pod_disrupted(pod)
        if why is not None:
            return f"pod {(pod.get('metadata') or {}).get('name')} is being disrupted: {why}"
    evicted = workload_evicted(workloads)
    if evicted is not None:
        return f"Kueue is evicting the stage's workload: {evicted}"
    return None
