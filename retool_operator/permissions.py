"""The RBAC rules the operator needs: the chart renders its (Cluster)Role from this list.

The integration suite records every API request the operator makes against the emulator and
checks both directions: each request is covered here, and each rule here was requested by some
test (or is listed in ``NOT_REQUESTED`` with the reason it is needed anyway).
"""

from __future__ import annotations

from typing import TypedDict


class Rule(TypedDict):
    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]


RULES: list[Rule] = [
    # The RetoolRuns themselves: listed and watched by kopf, annotated with kopf's progress
    # (patch), status written by us (patch on the subresource).
    {"apiGroups": ["retool.dev"], "resources": ["retoolruns"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["retool.dev"], "resources": ["retoolruns/status"], "verbs": ["patch"]},
    # Owner references with blockOwnerDeletion: the OwnerReferencesPermissionEnforcement
    # admission plugin (on in OpenShift) requires update on the owner's finalizers subresource.
    {"apiGroups": ["retool.dev"], "resources": ["retoolruns/finalizers"], "verbs": ["update"]},
    # Children of a run (and the namespace's managed MLflow tracker): create-or-patch by name.
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["services", "persistentvolumeclaims"], "verbs": ["get", "create", "patch"]},
    # Spec snapshots: created with each child, read back for the immutability check, never patched.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch"]},
    # Stage children: watched by kopf (server-side label selector), read, created, suspended.
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "patch"]},
    # delete: an attempt on a kept Ray cluster that spec.suspend stops (KubeRay cannot suspend it).
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # Ray clusters kept for a retry on the same cluster: read (healthy?) and deleted once no attempt needs
    # them (KubeRay leaves a kept cluster and one a clusterSelector RayJob ran on).
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "delete"]},
    # Pods of a run's stages: a new attempt waits until the previous attempt's pods are gone; a kept
    # cluster's pods are labelled with the attempt that takes them over (patch).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    # An HPA named like the sandbox takes its replicas over.
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["get"]},
    # Kueue Workloads of queued children: read (admission, why a stage waits) and deactivated /
    # reactivated for spec.suspend (Kueue would undo a suspend set on the Job or RayJob itself).
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "patch"]},
    # Kubernetes Events on runs (kopf.event posts core/v1 Events).
    # create: the run's Events; list: why the Job controller, KubeRay's or the volume controller refuse a child's pods or claim.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
    # kopf's own discovery of the CRD it serves.
    # get: the RayJob CRD, read once at start (what the installed KubeRay can run).
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    # get: the PriorityClass a run names, read by the admission webhook to warn when the cluster lacks it.
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]},
    # get: the nodes under a running rl attempt, whose cordon or termination taint asks the trainer to save.
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]

NOT_REQUESTED: dict[tuple[str, str, str], str] = {
    ("retool.dev", "retoolruns/finalizers", "update"): "checked by the OwnerReferencesPermissionEnforcement admission plugin when a child names its run with blockOwnerDeletion",
}
"""Rules needed although the operator never sends that request (the tests compare the rest with the requests it does send)."""


def allows(group: str, resource: str, verb: str) -> bool:
    """Whether RULES grant ``verb`` on ``group``/``resource`` (resource may be ``plural/subresource``)."""
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in RULES)
