"""The RBAC rules the operator needs: the chart renders its (Cluster)Role from this list.

A test records every API request the operator makes against the emulator during the integration
suite and asserts each (group, resource, verb) is covered here.
"""

from __future__ import annotations

from typing import TypedDict


class Rule(TypedDict):
    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]


RULES: list[Rule] = [
    # The RetoolRuns themselves: watched by kopf, annotated with kopf's progress, status written by us.
    {"apiGroups": ["retool.dev"], "resources": ["retoolruns"], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": ["retool.dev"], "resources": ["retoolruns/status"], "verbs": ["get", "patch", "update"]},
    # Children of a run (and the namespace's managed MLflow tracker).
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    {"apiGroups": [""], "resources": ["services", "configmaps", "persistentvolumeclaims"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
    # Kubernetes Events on runs (stage started, retry, failure).
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # kopf's own discovery of the CRD and, cluster-wide, of namespaces.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]


def allows(group: str, resource: str, verb: str) -> bool:
    """Whether RULES grant ``verb`` on ``group``/``resource`` (resource may be ``plural/subresource``)."""
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in RULES)
