"""What each documented profile changes: the operator's configuration, the webhook, MLflow, RBAC scope."""

from __future__ import annotations

import base64

import pytest

from tests.chart.helm import container, objects_of, one, operator_config

REL = "retool"
NS = "retool-system"
MLFLOW_URL = f"http://{REL}-mlflow.{NS}.svc:5000"


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def test_default_operator_configuration_follows_the_contract(rendered) -> None:
    assert operator_config(rendered("default")) == {
        "RETOOL_OPERATOR_TRAINER_IMAGE_NVIDIA": "retool/trainer-cuda:0.1.0",
        "RETOOL_OPERATOR_TRAINER_IMAGE_ASCEND": "retool/trainer-ascend:0.1.0",
        "RETOOL_OPERATOR_TRAINER_IMAGE_NVIDIA_VERL09": "retool/trainer-cuda-verl09:0.1.0",
        "RETOOL_OPERATOR_TRAINER_IMAGE_ASCEND_VERL09": "retool/trainer-ascend-verl09:0.1.0",
        "RETOOL_OPERATOR_SANDBOX_IMAGE": "retool/sandbox:0.1.0",
        "RETOOL_OPERATOR_MLFLOW_IMAGE": "ghcr.io/mlflow/mlflow:v3.17.2-full",
        "RETOOL_OPERATOR_MLFLOW_TRACKING_URI": MLFLOW_URL,
        "RETOOL_OPERATOR_NVIDIA_RESOURCE_NAME": "nvidia.com/gpu",
        "RETOOL_OPERATOR_ASCEND_RESOURCE_NAME": "huawei.com/Ascend910",
        "RETOOL_OPERATOR_ASCEND_NODE_SELECTOR": "accelerator=huawei-Ascend910",
        # auto: `helm template` assumes the helm client's Kubernetes version (1.35 for the pinned helm), >= 1.33.
        "RETOOL_OPERATOR_SANDBOX_USER_NAMESPACES": "true",
        "RETOOL_OPERATOR_SANDBOX_SYS_ADMIN": "true",
        "RETOOL_OPERATOR_OWN_NAMESPACE": NS,
        "RETOOL_OPERATOR_OWN_POD_SELECTOR": f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={REL},app.kubernetes.io/name=retool",
        "RETOOL_OPERATOR_METRICS_SCRAPER_NAMESPACES": "",
        "RETOOL_OPERATOR_DEFAULT_STORAGE_CLASS": "",
        "RETOOL_OPERATOR_BATCH_SCHEDULER": "",
        "RETOOL_OPERATOR_CURRENCY": "USD",
        "RETOOL_OPERATOR_NAMESPACES": "",
        "RETOOL_OPERATOR_WEBHOOK_ENABLED": "false",
        "RETOOL_OPERATOR_WEBHOOK_PORT": "9443",
        "RETOOL_OPERATOR_WEBHOOK_CERT_DIR": "/etc/retool/webhook",
        "RETOOL_OPERATOR_LIVENESS_PORT": "8080",
        "RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS": "256",
    }


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param("external-mlflow", {"RETOOL_OPERATOR_MLFLOW_TRACKING_URI": "https://mlflow.example.com"}, id="external MLflow becomes the default tracking URI"),
        pytest.param("postgres-s3", {"RETOOL_OPERATOR_MLFLOW_TRACKING_URI": MLFLOW_URL}, id="the chart's tracker stays the default with PostgreSQL and S3"),
        pytest.param(
            "ascend",
            {"RETOOL_OPERATOR_ASCEND_RESOURCE_NAME": "huawei.com/Ascend910B", "RETOOL_OPERATOR_ASCEND_NODE_SELECTOR": "accelerator=huawei-Ascend910B"},
            id="Ascend profile renames the NPU resource and node selector",
        ),
        pytest.param("namespaced", {"RETOOL_OPERATOR_NAMESPACES": "team-a,team-b", "RETOOL_OPERATOR_WEBHOOK_ENABLED": "true"}, id="namespaced mode lists the namespaces"),
        pytest.param("webhook-off", {"RETOOL_OPERATOR_WEBHOOK_ENABLED": "false"}, id="webhook off tells the operator to validate itself"),
        pytest.param("cert-manager", {"RETOOL_OPERATOR_WEBHOOK_ENABLED": "true"}, id="cert-manager profile enables the webhook"),
        pytest.param("webhook-secret", {"RETOOL_OPERATOR_WEBHOOK_ENABLED": "true"}, id="self-managed certificate enables the webhook"),
    ],
)
def test_profile_sets_operator_configuration(rendered, profile: str, expected: dict[str, str]) -> None:
    config = operator_config(rendered(profile))
    assert {k: config[k] for k in expected} == expected


def test_operator_deployment_is_one_recreated_restricted_replica_probed_on_healthz(rendered) -> None:
    deployment = one(rendered("default"), "Deployment", "-operator")
    spec = deployment["spec"]
    assert (spec["replicas"], spec["strategy"]["type"]) == (1, "Recreate")
    pod = spec["template"]["spec"]
    op = container(deployment, "operator")
    assert op["command"] == ["python", "-m", "retool_operator"]
    assert op["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in op["ports"]
    assert op["resources"]["limits"] and op["resources"]["requests"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert op["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert op["envFrom"] == [{"configMapRef": {"name": f"{REL}-operator-config"}}]
    assert len(spec["template"]["metadata"]["annotations"]["checksum/config"]) == 64


def test_changing_operator_configuration_changes_the_pod_template(rendered) -> None:
    """The checksum annotation makes `helm upgrade` restart the operator when its ConfigMap changes."""
    a = one(rendered("default"), "Deployment", "-operator")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = one(rendered("ascend"), "Deployment", "-operator")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert a != b


@pytest.mark.parametrize(
    ("profile", "mode"),
    [
        pytest.param("default", "off", id="no cert-manager and no Secret: webhook off"),
        pytest.param("default-in-cluster-with-cert-manager", "certManager", id="cert-manager API present: cert-manager"),
        pytest.param("cert-manager", "certManager", id="forced cert-manager with a ClusterIssuer"),
        pytest.param("webhook-secret", "secret", id="administrator's Secret and caBundle"),
        pytest.param("webhook-off", "off", id="disabled even with cert-manager present"),
    ],
)
def test_webhook_certificate_source(rendered, profile: str, mode: str) -> None:
    docs = rendered(profile)
    webhooks = objects_of(docs, "ValidatingWebhookConfiguration")
    deployment = one(docs, "Deployment", "-operator")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    if mode == "off":
        assert webhooks == [] and "webhook-tls" not in volumes
        assert [s["metadata"]["name"] for s in objects_of(docs, "Service") if s["metadata"]["name"].endswith("-webhook")] == []
        return
    (vwc,) = webhooks
    (hook,) = vwc["webhooks"]
    assert hook["clientConfig"]["service"] == {"name": f"{REL}-webhook", "namespace": NS, "path": "/validate-retoolrun", "port": 443}
    assert hook["rules"] == [{"apiGroups": ["retool.dev"], "apiVersions": ["v1alpha1"], "resources": ["retoolruns"], "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == ("Fail", "None", ["v1"])
    service = one(docs, "Service", "-webhook")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container(deployment, "operator")["ports"]
    mount = next(m for m in container(deployment, "operator")["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount["mountPath"] == "/etc/retool/webhook"
    assert [i["path"] for i in volumes["webhook-tls"]["secret"]["items"]] == ["tls.crt", "tls.key"]
    secret_name = volumes["webhook-tls"]["secret"]["secretName"]
    if mode == "certManager":
        cert = one(docs, "Certificate", "-webhook")
        assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{cert['metadata']['name']}"
        assert "caBundle" not in hook["clientConfig"]
        assert cert["spec"]["secretName"] == secret_name
        assert f"{REL}-webhook.{NS}.svc" in cert["spec"]["dnsNames"]
        issuers = objects_of(docs, "Issuer")
        if profile == "cert-manager":
            assert issuers == [] and cert["spec"]["issuerRef"] == {"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        else:
            assert cert["spec"]["issuerRef"]["name"] == issuers[0]["metadata"]["name"] and "selfSigned" in issuers[0]["spec"]
    else:
        assert secret_name == "retool-webhook-tls"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
        assert objects_of(docs, "Certificate") == []


def test_namespaced_mode_grants_roles_only_in_watched_namespaces(rendered) -> None:
    docs = rendered("namespaced")
    roles = {r["metadata"]["namespace"] for r in objects_of(docs, "Role")}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in objects_of(docs, "RoleBinding")}
    assert roles == {"team-a", "team-b"}
    assert bindings == {("team-a", f"{REL}-operator"), ("team-b", f"{REL}-operator")}
    for binding in objects_of(docs, "RoleBinding") + objects_of(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{REL}-operator", "namespace": NS}]
    namespaced_resources = {r for role in objects_of(docs, "Role") for rule in role["rules"] for r in rule["resources"]}
    for cluster_role in objects_of(docs, "ClusterRole"):
        granted = {r for rule in cluster_role["rules"] for r in rule["resources"]}
        assert not granted & namespaced_resources, f"{cluster_role['metadata']['name']} grants namespaced resources cluster-wide"
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"] == {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}


def test_cluster_mode_binds_one_cluster_role(rendered) -> None:
    docs = rendered("default")
    assert objects_of(docs, "Role") == [] and objects_of(docs, "RoleBinding") == []
    (role,) = objects_of(docs, "ClusterRole")
    (binding,) = objects_of(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}


def test_default_mlflow_is_sqlite_and_artifacts_on_a_kept_pvc(rendered) -> None:
    docs = rendered("default")
    deployment = one(docs, "Deployment", "-mlflow")
    mlflow = container(deployment, "mlflow")
    env = env_of(mlflow)
    assert mlflow["image"] == "ghcr.io/mlflow/mlflow:v3.17.2-full"
    assert env["MLFLOW_BACKEND_STORE_URI"]["value"] == "sqlite:////mlflow/mlflow.db"
    assert "--artifacts-destination=/mlflow/artifacts" in mlflow["args"]
    pvc = one(docs, "PersistentVolumeClaim", "-mlflow")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    claim = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    hosts = env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")
    assert {f"{REL}-mlflow.{NS}.svc:*", f"{REL}-mlflow:*"} <= set(hosts)


def test_postgres_s3_profile_reads_secrets_and_needs_no_pvc(rendered) -> None:
    docs = rendered("postgres-s3")
    mlflow = container(one(docs, "Deployment", "-mlflow"), "mlflow")
    env = env_of(mlflow)
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"] == {"secretKeyRef": {"name": "mlflow-postgres", "key": "uri"}}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {"secretKeyRef": {"name": "mlflow-s3", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "mlflow-s3", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env["MLFLOW_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
    assert "--artifacts-destination=s3://retool-mlflow/artifacts" in mlflow["args"]
    assert objects_of(docs, "PersistentVolumeClaim") == []
    assert "data" not in {m["name"] for m in mlflow["volumeMounts"]}
    ingress = one(docs, "Ingress", "-mlflow")
    assert ingress["spec"]["rules"][0]["host"] == "mlflow.example.com"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {"name": f"{REL}-mlflow", "port": {"name": "http"}}
    assert "mlflow.example.com:*" in env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")


def test_external_mlflow_profile_installs_no_tracker(rendered) -> None:
    docs = rendered("external-mlflow")
    names = [d["metadata"]["name"] for d in docs]
    assert not [n for n in names if "mlflow" in n]


@pytest.mark.parametrize("profile", ["default", "external-mlflow"])
def test_helm_test_pods_probe_the_operator_and_mlflow(rendered, profile: str) -> None:
    docs = rendered(profile)
    tests = {p["metadata"]["name"]: p for p in objects_of(docs, "Pod")}
    for pod in tests.values():
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert pod["spec"]["containers"][0]["image"] == "busybox:1.37.0"
    probe = " ".join(tests[f"{REL}-test-operator"]["spec"]["containers"][0]["command"])
    assert f"http://{REL}-operator.{NS}.svc:8080/healthz" in probe
    if profile == "default":
        script = " ".join(tests[f"{REL}-test-mlflow"]["spec"]["containers"][0]["command"])
        assert f"{MLFLOW_URL}/health" in script and f"{MLFLOW_URL}/api/2.0/mlflow/experiments/search" in script
    else:
        assert f"{REL}-test-mlflow" not in tests


def test_sandbox_metrics_reach_prometheus(chart, tmp_path) -> None:
    """The scraper's namespace reaches the operator (the sandbox NetworkPolicy admits it) and the
    PodMonitor selects the sandbox pods the operator labels, on the port they serve /metrics on."""
    import yaml

    from retool_operator import builders
    from retool_operator.config import OperatorConfig
    from tests.chart.helm import render
    from tests.operator.helpers import run_of

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"defaults": {"sandboxMetricsScraperNamespace": {"kubernetes.io/metadata.name": "monitoring"}}, "sandboxPodMonitor": {"enabled": True}}))
    docs = render(chart, "-f", str(values))
    data = operator_config(docs)
    assert data["RETOOL_OPERATOR_METRICS_SCRAPER_NAMESPACES"] == "kubernetes.io/metadata.name=monitoring"
    config = OperatorConfig(_env_file=None, metrics_scraper_namespaces=data["RETOOL_OPERATOR_METRICS_SCRAPER_NAMESPACES"])
    objects = builders.build_sandbox(run_of(), config=config, replicas=1)
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in [f for rule in policy["spec"]["ingress"] for f in rule["from"]]
    (monitor,) = objects_of(docs, "PodMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["port"] in ports
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
