"""Every documented profile renders to objects a Kubernetes API server of each supported minor accepts."""

from __future__ import annotations

import copy
import functools
import re
from collections import Counter

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from tests.chart.helm import CHART, PROFILES_DIR
from tests.chart.profiles import PROFILES, profile_files

# Kinds kubernetes-validate has no schema for: cert-manager's CRDs (checked field by field in test_profiles.py).
CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
LABELS = ("name", "instance", "version", "managed-by", "component", "part-of")


def supported_versions() -> list[str]:
    """Every minor kubernetes-validate ships from the chart's kubeVersion lower bound up."""
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*1\.(\d+)\.0-0", constraint)
    assert match, f"kubeVersion {constraint!r}: the test understands only '>=1.N.0-0'"
    lowest = int(match.group(1))
    return sorted({v for v in kv.all_versions() if int(v.split(".")[1]) >= lowest}, key=lambda v: int(v.split(".")[1]))


VERSIONS = supported_versions()


def test_the_chart_claims_versions_that_can_be_checked() -> None:
    assert len(VERSIONS) >= 5, VERSIONS
    assert VERSIONS[0] == "1.29.0"


def test_every_profile_file_is_in_the_test_table() -> None:
    used = {v for p in PROFILES.values() for v in p.values}
    assert profile_files() == used, f"profiles in {PROFILES_DIR} and tests/chart/profiles.py differ"


@pytest.mark.parametrize("profile", PROFILES)
def test_objects_pass_strict_schema_of_every_supported_kubernetes(rendered, profile: str) -> None:
    docs = rendered(profile)
    problems = []
    for version in VERSIONS:
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                continue
            with_problem = _validate(doc, version)
            if with_problem:
                problems.append(with_problem)
    assert not problems, "\n".join(problems)


@functools.cache
def _validator(version: str, kind: str, api_version: str) -> jsonschema.Validator:
    """kubernetes-validate's strict schema for one kind, built once. Its own validate() re-reads
    the multi-megabyte definitions file on every call; this is the same lookup, cached."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = kv.schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError:
        raise kv.SchemaNotFoundError(version=version, kind=kind, api_version=api_version) from None
    definitions = kv.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _validate(doc: dict, version: str) -> str:
    try:
        validator = _validator(version, doc["kind"], doc["apiVersion"])
    except kv.SchemaNotFoundError:
        return f"{version} {doc['apiVersion']} {doc['kind']}: no schema (not a built-in kind and not a known CRD)"
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return ""
    return f"{version} {doc['kind']}/{doc['metadata']['name']} at {'.'.join(map(str, error.path))}: {error.message}"


def test_cached_validation_agrees_with_kubernetes_validate(rendered) -> None:
    """The cached lookup gives kubernetes-validate's own verdict, for a valid and an invalid object."""
    deployment = next(d for d in rendered("default") if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    assert kv.validate(deployment, VERSIONS[0], strict=True) and _validate(deployment, VERSIONS[0]) == ""
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[0], strict=True)
    assert "spec.replicas" in _validate(broken, VERSIONS[0])


def test_strict_validation_rejects_an_unknown_field(rendered) -> None:
    """The schema check above is not vacuous: one typo in a rendered Deployment fails it."""
    deployment = copy.deepcopy(next(d for d in rendered("default") if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    problem = _validate(deployment, VERSIONS[0])
    assert "livenessProbes" in problem and "containers.0" in problem, problem


@pytest.mark.parametrize("profile", PROFILES)
def test_no_two_objects_share_kind_namespace_and_name(rendered, profile: str) -> None:
    keys = Counter((d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in rendered(profile))
    assert [k for k, n in keys.items() if n > 1] == []


@pytest.mark.parametrize("profile", PROFILES)
def test_every_object_and_pod_template_carries_the_standard_labels(rendered, profile: str) -> None:
    missing = []
    for doc in rendered(profile):
        where = [("", doc["metadata"].get("labels", {}))]
        template = doc.get("spec", {}).get("template")
        if template:
            where.append((" pod template", template["metadata"].get("labels", {})))
        for suffix, labels in where:
            absent = [k for k in LABELS if f"app.kubernetes.io/{k}" not in labels]
            if absent:
                missing.append(f"{doc['kind']}/{doc['metadata']['name']}{suffix}: {absent}")
    assert not missing, missing


@pytest.mark.parametrize("profile", PROFILES)
def test_namespaced_objects_live_in_the_release_or_a_watched_namespace(rendered, profile: str) -> None:
    allowed = {"retool-system", *yaml.safe_load((PROFILES_DIR / "namespaced-values.yaml").read_text())["watchNamespaces"]}
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"}
    for doc in rendered(profile):
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"].get("namespace") in allowed, doc["metadata"]


@pytest.mark.parametrize("profile", PROFILES)
def test_services_select_the_pods_they_name(rendered, profile: str) -> None:
    docs = rendered(profile)
    pods = [(d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] == "Deployment"]
    for svc in (d for d in docs if d["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        matching = [spec for labels, spec in pods if selector.items() <= labels.items()]
        assert len(matching) == 1, f"Service {svc['metadata']['name']} selects {len(matching)} Deployments"
        ports = {p["name"] for c in matching[0]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {svc['metadata']['name']} targets missing port {port['targetPort']}"


def test_deployment_selectors_do_not_depend_on_values(rendered) -> None:
    """A Deployment's selector is immutable: any values change must keep it, or `helm upgrade` fails."""
    selectors: dict[str, set[str]] = {}
    for profile in PROFILES:
        for d in rendered(profile):
            if d["kind"] == "Deployment":
                selectors.setdefault(d["metadata"]["name"], set()).add(str(sorted(d["spec"]["selector"]["matchLabels"].items())))
    assert selectors and all(len(s) == 1 for s in selectors.values()), selectors
