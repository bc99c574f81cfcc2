"""The signs that a node under the running rl stage is going (retool_operator.notice), as the API server shows them.

The objects are shaped as their owners leave them: ``kubectl cordon`` sets ``spec.unschedulable``; the
cluster autoscaler, Karpenter, GKE and aws-node-termination-handler add their taints; the API server
sets a pod's ``DisruptionTarget`` condition before a preemption, an eviction (drain) or the taint
manager deletes it; Kueue sets ``Evicted`` on a Workload it takes back.
"""

from __future__ import annotations

from typing import Any

import pytest

from retool_operator import constants as c
from retool_operator.notice import GOING_TAINTS, attempt_pods, node_going, notice


def node(name: str, *, taints: list[dict[str, str]] | None = None, cordoned: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if cordoned:
        spec["unschedulable"] = True
    return {"metadata": {"name": name}, "spec": spec}


def ray_pod(name: str, node_name: str | None, *, attempt: int = 1, node_type: str | None = "worker", conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    labels = {c.LABEL_RUN: "r", c.LABEL_ROLE: c.COMPONENT_STAGE, c.LABEL_STAGE: "rl", c.LABEL_ATTEMPT: str(attempt)}
    if node_type:
        labels["ray.io/node-type"] = node_type
    spec = {"nodeName": node_name} if node_name else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": spec, "status": {"phase": "Running", "conditions": conditions or []}}


@pytest.mark.parametrize(
    ("going", "expected"),
    [
        (node("n", cordoned=True), "it is cordoned (spec.unschedulable)"),
        (node("n", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764670000", "effect": "NoSchedule"}]), "the cluster autoscaler is removing it"),
        (node("n", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]), "Karpenter is disrupting it"),
        (node("n", taints=[{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]), "GKE is terminating it"),
        (node("n", taints=[{"key": "aws-node-termination-handler/spot-itn", "value": "id", "effect": "NoSchedule"}]), "AWS announced its Spot interruption"),
        (node("n", taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]), None),  # the cordon's own taint: read as the cordon
        (node("n", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), None),  # a dedicated node, not a going one
        (node("n"), None),
        (None, None),  # gone already: the pod's own signs say the rest
    ],
)
def test_a_node_is_going_by_its_owners_taint_or_a_cordon(going: dict[str, Any] | None, expected: str | None) -> None:
    why = node_going(going)
    assert (why is None) == (expected is None) and (expected is None or why.startswith(expected)), why


def test_a_taint_names_who_takes_the_node_ahead_of_the_cordon_that_came_with_it() -> None:
    drained = node("n", cordoned=True, taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
    assert node_going(drained) == f"{GOING_TAINTS['ToBeDeletedByClusterAutoscaler']} (taint ToBeDeletedByClusterAutoscaler)"


def test_only_the_current_attempts_ray_pods_on_a_node_count() -> None:
    pods = [ray_pod("head", "n1", node_type="head"), ray_pod("w", "n2"), ray_pod("old", "n3", attempt=1), ray_pod("submitter", "n4", node_type=None), ray_pod("pending", None)]
    assert [p["metadata"]["name"] for p in attempt_pods(pods, "rl", 1)] == ["head", "w", "old"]
    assert attempt_pods(pods, "rl", 2) == []


def test_notice_names_the_node_then_a_disrupted_pod_then_kueues_eviction() -> None:
    pods = [ray_pod("head", "n1", node_type="head"), ray_pod("w", "n2")]
    nodes = {"n1": node("n1"), "n2": node("n2", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])}
    assert notice(pods, nodes, None) == "node n2 is going: Karpenter is disrupting it (taint karpenter.sh/disrupted)"
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
    evicted = [ray_pod("head", "n1", node_type="head", conditions=[disruption])]
    assert notice(evicted, {"n1": node("n1")}, None) == "pod head is being disrupted: EvictionByEvictionAPI Eviction API: evicting"
    workload = {"status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"}]}}
    assert notice(pods[:1], {"n1": node("n1")}, [workload]) == "Kueue is evicting the stage's workload: Preempted Preempted to accommodate a workload"
    quiet = [ray_pod("head", "n1", node_type="head", conditions=[{"type": "DisruptionTarget", "status": "False"}])]
    assert notice(quiet, {"n1": node("n1")}, [{"status": {"conditions": [{"type": "Evicted", "status": "False"}]}}]) is None
