"""Bad values are refused before anything reaches a cluster, with a message naming the value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, HelmError, container, one, render


def render_with(chart: Path, tmp_path: Path, values: dict) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return render(chart, "-f", str(path))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"replicaCount": 2}, "additional properties 'replicaCount' not allowed", id="unknown top-level key"),
        pytest.param({"mlflow": {"enable": False}}, "at '/mlflow': additional properties 'enable' not allowed", id="typo in a nested key"),
        pytest.param({"operator": {"livenessPort": "8080"}}, "at '/operator/livenessPort': got string, want integer", id="port given as a string"),
        pytest.param({"operator": {"livenessPort": 70000}}, "at '/operator/livenessPort'", id="port out of range"),
        pytest.param({"webhook": {"failurePolicy": "Sometimes"}}, "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'", id="unknown failure policy"),
        pytest.param({"webhook": {"timeoutSeconds": 60}}, "at '/webhook/timeoutSeconds': maximum", id="webhook timeout above the API server's 30 s"),
        pytest.param({"webhook": {"certificates": {"source": "vault"}}}, "at '/webhook/certificates/source': value must be one of", id="unknown certificate source"),
        pytest.param({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array", id="namespaces as a string instead of a list"),
        pytest.param({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0'", id="namespace that is not a DNS label"),
        pytest.param({"mlflow": {"backend": {"type": "mysql"}}}, "at '/mlflow/backend/type': value must be one of 'sqlite', 'postgresql'", id="unsupported backend store"),
        pytest.param({"operator": {"resources": {"limits": {"cpu": "lots"}}}}, "at '/operator/resources/limits/cpu'", id="cpu that is not a quantity"),
        pytest.param({"mlflow": {"externalTrackingUri": "mlflow.example.com"}}, "at '/mlflow/externalTrackingUri'", id="tracking URI without a scheme"),
        pytest.param({"mlflow": {"artifacts": {"s3": {"uri": "bucket/prefix"}}}}, "at '/mlflow/artifacts/s3/uri'", id="artifact URI that is not s3"),
        pytest.param({"defaults": {"ascendNodeSelector": {"a,b": "c"}}}, "at '/defaults/ascendNodeSelector'", id="node selector key with a comma"),
        pytest.param({"defaults": {"resourceNames": {"ascend": "Ascend910"}}}, "at '/defaults/resourceNames/ascend'", id="resource name without a domain"),
        pytest.param({"mlflow": {"image": {"tag": "latest"}}}, "mlflow.image.tag: 'latest' is not allowed", id="latest MLflow image"),
        pytest.param({"defaults": {"images": {"sandbox": {"tag": "latest"}}}}, "defaults.images.sandbox.tag: 'latest' is not allowed", id="latest sandbox image"),
        pytest.param({"mlflow": {"backend": {"type": "postgresql"}}}, "needs mlflow.backend.postgresql.existingSecret", id="PostgreSQL without its Secret"),
        pytest.param({"mlflow": {"artifacts": {"type": "s3"}}}, "mlflow.artifacts.type=s3 needs mlflow.artifacts.s3.uri", id="S3 artifacts without a bucket"),
        pytest.param({"mlflow": {"externalTrackingUri": "https://m.example.com"}}, "only used with mlflow.enabled=false", id="external URI while installing a tracker"),
        pytest.param({"mlflow": {"ingress": {"enabled": True}}}, "needs at least one host in mlflow.ingress.hosts", id="Ingress without hosts"),
        pytest.param(
            {"mlflow": {"enabled": False, "ingress": {"enabled": True, "hosts": ["m.example.com"]}}},
            "mlflow.ingress.enabled=true needs mlflow.enabled=true",
            id="Ingress without a tracker",
        ),
        pytest.param({"webhook": {"certificates": {"source": "secret"}}}, "needs webhook.certificates.secretName", id="self-managed certificate without Secret and CA"),
        pytest.param({"webhook": {"enabled": False, "certificates": {"source": "secret"}}}, "has no effect with webhook.enabled=false", id="source for a disabled webhook"),
        pytest.param({"commonLabels": {"app.kubernetes.io/name": "x"}}, "commonLabels.app.kubernetes.io/name: the chart sets", id="common label overriding a standard one"),
        pytest.param({"defaults": {"cost": {"pricePerDeviceHour": -1}}}, "at '/defaults/cost/pricePerDeviceHour'", id="negative price"),
        pytest.param({"defaults": {"cost": {"currency": "usd"}}}, "at '/defaults/cost/currency'", id="currency that is not an ISO 4217 code"),
        pytest.param({"serviceAccount": {"create": False}}, "serviceAccount.name is required when serviceAccount.create is false", id="no ServiceAccount to run as"),
    ],
)
def test_bad_values_are_rejected_with_a_clear_message(chart: Path, tmp_path: Path, values: dict, message: str) -> None:
    with pytest.raises(HelmError) as err:
        render_with(chart, tmp_path, values)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("cpu", "memory"),
    [
        pytest.param(1, "1Gi", id="cpu as an integer"),
        pytest.param(0.5, "512Mi", id="cpu as a fraction"),
        pytest.param("500m", "1G", id="cpu in millicores"),
    ],
)
def test_quantities_accept_what_kubernetes_accepts(chart: Path, tmp_path: Path, cpu: object, memory: str) -> None:
    docs = render_with(chart, tmp_path, {"operator": {"resources": {"requests": {"cpu": cpu, "memory": memory}}}})
    requests = container(one(docs, "Deployment", "-operator"), "operator")["resources"]["requests"]
    assert (requests["cpu"], requests["memory"]) == (cpu, memory)


def test_global_registry_prefixes_every_retool_image(chart: Path, tmp_path: Path) -> None:
    docs = render_with(chart, tmp_path, {"global": {"imageRegistry": "registry.example.com/ml"}})
    config = one(docs, "ConfigMap", "-operator-config")["data"]
    assert config["RETOOL_OPERATOR_SANDBOX_IMAGE"] == "registry.example.com/ml/retool/sandbox:0.1.0"
    assert container(one(docs, "Deployment", "-operator"), "operator")["image"] == "registry.example.com/ml/retool/operator:0.1.0"


@pytest.mark.parametrize(
    ("cost", "price", "currency"), [({}, None, "USD"), ({"pricePerDeviceHour": 2.75, "currency": "EUR"}, 2.75, "EUR"), ({"pricePerDeviceHour": "3"}, 3.0, "USD")]
)
def test_the_default_price_reaches_the_operators_settings(
    chart: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cost: dict, price: float | None, currency: str
) -> None:
    from retool_operator.config import OperatorConfig

    for name, value in one(render_with(chart, tmp_path, {"defaults": {"cost": cost}}), "ConfigMap", "-operator-config")["data"].items():
        monkeypatch.setenv(name, value)  # as the Deployment's envFrom gives them
    settings = OperatorConfig()
    assert (settings.price_per_device_hour, settings.currency) == (price, currency)


def test_global_pull_secrets_reach_every_pod(chart: Path, tmp_path: Path) -> None:
    docs = render_with(chart, tmp_path, {"global": {"imagePullSecrets": ["regcred"]}})
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"] + [d["spec"] for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 4
    assert all(p["imagePullSecrets"] == [{"name": "regcred"}] for p in pods)


# Maps whose keys are the user's (labels, resource names, Kubernetes objects passed through).
FREE_FORM = {"$defs.stringMap", "$defs.resourceList", "$defs.affinity", "$defs.tolerations.items", "properties.operator.properties.extraEnv.items"}


def object_schemas(node: object, path: str = "") -> list[tuple[str, dict]]:
    out = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            out.append((path.lstrip("."), node))
        for key, value in node.items():
            out += object_schemas(value, f"{path}.{key}")
    return out


def test_the_schema_closes_every_object_to_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    objects = dict(object_schemas(schema))
    assert set(objects) >= FREE_FORM, "a free-form entry names no object of the schema"
    assert [p for p, s in objects.items() if s.get("additionalProperties", True) is True and p not in FREE_FORM] == []


def test_long_release_names_give_valid_object_names(chart: Path) -> None:
    """Every name stays a DNS label of at most 63 characters, with every optional object rendered."""
    release = "a-very-long-release-name-for-the-retool-platform"
    flags = ["webhook.certificates.source=certManager", "mlflow.ingress.enabled=true", "mlflow.ingress.hosts[0]=m.example.com"]
    docs = render(chart, *[a for f in flags for a in ("--set", f)], release=release)
    names = {d["metadata"]["name"] for d in docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration")}
    assert len(docs) > 12 and len(names) >= 7
    bad = [n for n in names if len(n) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n)]
    assert bad == []
