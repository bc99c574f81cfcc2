"""The chart installed with `helm install` into a real API server: the CRD served with its printer columns,
RBAC enforced by the real authorizer on the chart's ServiceAccount, the admission webhook called by the
API server with the certificate the chart registered."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import RELEASE, RELEASE_NAMESPACE, Cluster, eventually, run_manifest


def test_the_crd_is_served_and_kubectl_prints_its_columns(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("columns", namespace)).returncode == 0
    eventually("the operator's first status", lambda: kube.run_status("columns", namespace).get("phase"))
    out = kube.kubectl("get", "rr", "-n", namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "PHASE", "STAGE", "PROGRESS", "AIME", "DEVICE-H", "AGE", "OBSERVED", "MESSAGE"]
    row = out[1].split()
    status = kube.run_status("columns", namespace)
    assert row[:3] == ["columns", status["phase"], status["stage"]]
    explained = kube.kubectl("explain", "retoolrun.spec.hardware.accelerator").stdout
    assert "nvidia" in explained and "ascend" in explained


@pytest.mark.parametrize(
    ("verb", "resource", "where", "allowed"),
    [
        ("create", "rayjobs.ray.io", "run", True),
        ("create", "jobs.batch", "run", True),
        ("patch", "retoolruns.retool.dev --subresource=status", "run", True),
        ("create", "events", "run", True),
        ("delete", "nodes", "cluster", False),
        ("get", "secrets", "kube-system", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "cluster", False),
        ("impersonate", "users", "cluster", False),
    ],
    ids=lambda v: str(v),
)
def test_the_api_server_authorizes_the_operator_by_the_charts_rbac(
    kube: Cluster, shared_namespace: str, verb: str, resource: str, where: str, allowed: bool
) -> None:
    """`kubectl auth can-i` as the chart's ServiceAccount (its token from the TokenRequest API): the
    answer is the real RBAC authorizer's over the chart's (Cluster)Roles."""
    scope = {"run": ["-n", shared_namespace], "cluster": [], "kube-system": ["-n", "kube-system"]}[where]
    proc = kube.kubectl("auth", "can-i", verb, *resource.split(), *scope, kubeconfig=kube.release["token_kubeconfig"], check=False)
    assert proc.stdout.strip() == ("yes" if allowed else "no"), proc.stderr


def test_the_operator_identity_is_the_charts_service_account(kube: Cluster) -> None:
    who = json.loads(kube.kubectl("auth", "whoami", "-o", "json", kubeconfig=kube.release["token_kubeconfig"]).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{RELEASE_NAMESPACE}:{kube.release['service_account']}"


def test_the_api_server_calls_the_webhook_and_refuses_what_it_refuses(kube: Cluster, namespace: str) -> None:
    """Gang scheduling without a batch scheduler passes the CRD schema; only the webhook refuses it."""
    hooks = kube.plane.get_json("validatingwebhookconfiguration", f"{RELEASE}-{RELEASE_NAMESPACE}")
    assert hooks["webhooks"][0]["clientConfig"]["url"].endswith("/validate-retoolrun")
    bad = run_manifest("gang", namespace, scheduling={"gang": {"enabled": True}})
    proc = kube.apply(bad)
    assert proc.returncode != 0
    assert 'admission webhook "validate.retoolruns.retool.dev" denied the request' in proc.stderr, proc.stderr
    assert "gang" in proc.stderr
    assert kube.get("retoolrun", "gang", namespace) is None
    # the same document without the bad field is admitted: the refusal was the webhook's rule, not the schema's
    assert kube.apply(run_manifest("gang", namespace)).returncode == 0
