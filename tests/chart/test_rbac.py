"""The chart grants exactly what the operator uses: its rules against retool_operator.permissions.RULES
(which tests/operator/test_integration.py compares, both ways, with the requests the operator makes)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from retool_operator.permissions import RULES
from tests.chart.helm import objects_of

Triple = tuple[str, str, str]
# Resources without a namespace: a Role cannot grant them.
CLUSTER_SCOPED = {"customresourcedefinitions", "priorityclasses", "nodes"}


def triples(rules: Iterable[dict]) -> set[Triple]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


OPERATOR = triples(RULES)
NAMESPACED = {t for t in OPERATOR if t[1] not in CLUSTER_SCOPED}


def test_the_operator_rules_are_not_empty_and_have_no_wildcards() -> None:
    assert {("retool.dev", "retoolruns", "watch"), ("ray.io", "rayjobs", "create")} <= OPERATOR
    assert not [t for t in OPERATOR if "*" in t]


def test_owner_references_with_block_owner_deletion_are_allowed() -> None:
    """OwnerReferencesPermissionEnforcement (OpenShift) refuses blockOwnerDeletion without update on the owner's finalizers."""
    assert ("retool.dev", "retoolruns/finalizers", "update") in NAMESPACED


def test_cluster_wide_mode_grants_exactly_the_operator_rules(rendered) -> None:
    (role,) = objects_of(rendered("default"), "ClusterRole")
    assert triples(role["rules"]) == OPERATOR


@pytest.mark.parametrize("namespace", ["team-a", "team-b"])
def test_namespaced_mode_grants_the_namespaced_rules_in_each_namespace(rendered, namespace: str) -> None:
    (role,) = [r for r in objects_of(rendered("namespaced"), "Role") if r["metadata"]["namespace"] == namespace]
    assert triples(role["rules"]) == NAMESPACED


def test_namespaced_mode_grants_only_the_cluster_scoped_reads_kopf_needs(rendered) -> None:
    (role,) = objects_of(rendered("namespaced"), "ClusterRole")
    assert triples(role["rules"]) == OPERATOR - NAMESPACED
    assert not [t for t in triples(role["rules"]) if t[2] not in ("get", "list", "watch")]


def test_rbac_can_be_left_to_the_administrator(chart) -> None:
    from tests.chart.helm import render

    docs = render(chart, "--set", "rbac.create=false")
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io")]
