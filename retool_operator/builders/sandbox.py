"""The run's code sandbox: Deployment (replicas = ceil(maxConcurrent / perReplicaConcurrency)),
Service, NetworkPolicy (no egress; ingress only from this run's stage pods and the metrics
scraper) and PDB.

The sandbox costs 128 CPUs for the 32B example but only the stages that call it need it: it has
replicas while rl or eval is the current stage (``SANDBOX_STAGES``; one while preflight checks it) and none
before (prepare, sft, merge), after, or while suspended. When an HPA named like the sandbox manages it, the
Deployment is applied without ``replicas`` so the two never fight over the field.

A text-only run (``spec.recipe: text-only``) has no code interpreter and therefore no sandbox:
``build_sandbox`` returns nothing for it and its replicas are zero.
"""

from __future__ import annotations

from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.names import SANDBOX_PORT, sandbox_name
from retool.spec.rules import sandbox_replicas
from retool_operator import constants as c
from retool_operator.builders.meta import labels, object_meta, run_namespace, selector_labels
from retool_operator.builders.pods import pod_template, run_pod_settings, sandbox_pod_settings
from retool_operator.builders.sandbox_security import sandbox_security
from retool_operator.config import OperatorConfig

SANDBOX_STAGES = frozenset({"preflight", "rl", "eval"})
"""The stages whose rollouts call the sandbox (preflight: a few scripted rollouts, one replica)."""
PREFLIGHT_REPLICAS = 1
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Every namespace carries its own name under this label (the API server sets it, Kubernetes >= 1.22)."""


def uses_sandbox(run: RetoolRun) -> bool:
    """Whether the run's stages call a code sandbox (every recipe but text-only)."""
    return run.spec.recipe != "text-only"


def desired_sandbox_replicas(run: RetoolRun, *, stage: str | None = "rl", finished: bool = False) -> int:
    """ceil(maxConcurrent / perReplicaConcurrency) while ``stage`` (the current one) calls the
    sandbox; zero before and after those stages, while suspended, once the run is over, and for a
    run without a sandbox."""
    if run.spec.suspend or finished or not uses_sandbox(run) or stage not in SANDBOX_STAGES:
        return 0
    if stage == "preflight":
        return PREFLIGHT_REPLICAS
    return sandbox_replicas(run.spec)


def _quantities(resources: Any) -> dict[str, dict[str, str]]:
    data = resources.model_dump(by_alias=True)
    return {k: {rk: str(rv) for rk, rv in v.items()} for k, v in data.items() if v}


def sandbox_env(run: RetoolRun) -> list[dict[str, Any]]:
    """The server's settings (``retool.sandbox.settings``, RETOOL_SANDBOX_*) that come from the spec.

    The per-execution limits become the server's defaults and caps, so a client cannot ask for more
    than the replica is sized for; ``isolation: strict`` becomes REQUIRE_ISOLATION (a replica whose
    isolation is not strong stays not-ready and runs nothing); the RuntimeClass is passed on so
    /readyz says what the replica runs under.
    """
    sandbox = run.spec.sandbox
    env: list[dict[str, Any]] = [
        {"name": "RETOOL_SANDBOX_DEFAULT_MEMORY_LIMIT_MB", "value": str(sandbox.memory_limit_mb)},
        {"name": "RETOOL_SANDBOX_MAX_MEMORY_LIMIT_MB", "value": str(sandbox.memory_limit_mb)},
        {"name": "RETOOL_SANDBOX_MAX_RUN_TIMEOUT_S", "value": str(sandbox.timeout_seconds)},
        {"name": "RETOOL_SANDBOX_TMP_ROOT", "value": "/tmp"},
        {"name": "RETOOL_SANDBOX_REQUIRE_ISOLATION", "value": "true" if sandbox.isolation == "strict" else "false"},
    ]
    if sandbox.runtime_class_name:
        env.append({"name": "RETOOL_SANDBOX_RUNTIME_CLASS", "value": sandbox.runtime_class_name})
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return env


def build_sandbox_deployment(run: RetoolRun, *, config: OperatorConfig, replicas: int | None) -> dict[str, Any]:
    """The Deployment; ``replicas=None`` leaves the field to an HPA (absent from create and patches)."""
    name = sandbox_name(run.metadata.name)
    sandbox = run.spec.sandbox
    security = sandbox_security(user_namespaces=config.sandbox_user_namespaces, sys_admin=config.sandbox_sys_admin)
    lbls = labels(run.metadata.name, c.COMPONENT_SANDBOX)
    probe = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    container = {
        "name": "sandbox",
        "image": sandbox.image or config.sandbox_image,
        "command": ["retool", "sandbox", "serve", "--host", "0.0.0.0", "--port", str(SANDBOX_PORT), "--workers", str(sandbox.per_replica_concurrency)],
        "ports": [{"name": "http", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "env": sandbox_env(run),
        "resources": _quantities(sandbox.resources),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": SANDBOX_PORT}, "initialDelaySeconds": 2, **probe},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": SANDBOX_PORT}, "initialDelaySeconds": 10, **probe},
        "securityContext": security.container,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    settings = sandbox_pod_settings(
        labels=lbls,
        security_context=security.pod,
        host_users=security.host_users,
        runtime_class_name=sandbox.runtime_class_name,
        run=run_pod_settings(run),
        node_selector=sandbox.node_selector,
        tolerations=[t.model_dump(by_alias=True, exclude_none=True) for t in sandbox.tolerations],
    )
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, run_namespace(run), lbls),
        "spec": {
            **spec,
            "selector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
            "template": pod_template(settings, [container], [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}]),
        },
    }


def build_sandbox_service(run: RetoolRun) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX),
            "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": SANDBOX_PORT, "protocol": "TCP"}],
        },
    }


def build_sandbox_network_policy(
    run: RetoolRun, *, scraper_namespaces: dict[str, str] | None = None, operator_pods: tuple[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """No egress at all; ingress only from this run's stage pods (Ray head, workers, Jobs) and,
    when ``scraper_namespaces`` (namespace labels) is given, from the metrics scraper there, and,
    when ``operator_pods`` (namespace, pod labels) is given, from the operator's own pods, which read
    each replica's /readyz for the run's status (``retool_operator.isolation``).

    The operator's rule names its namespace by ``kubernetes.io/metadata.name`` (set by the API
    server on every namespace) and its pods by their labels in one peer, so both must match: no
    other pod of the operator's namespace, and no pod with those labels elsewhere, gets in.

    Egress is denied by listing "Egress" in policyTypes with no egress rule. ``egress: []`` would
    say the same, but the API server drops empty lists when it stores an object, so the stored
    policy never contains the desired one and every resync would patch it again.
    """
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_STAGE)}}],
            "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}],
        }
    ]
    if scraper_namespaces:
        # /metrics is served on the same port as the API: the scraper may reach that port only.
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(scraper_namespaces)}}], "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]})
    if operator_pods:
        namespace, pod_labels = operator_pods
        peer = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}, "podSelector": {"matchLabels": dict(pod_labels)}}
        ingress.append({"from": [peer], "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
        },
    }


def build_sandbox_pdb(run: RetoolRun) -> dict[str, Any]:
    """Voluntary disruptions (drains) take one replica at a time, so rollouts keep most capacity."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)}},
    }


def build_sandbox(run: RetoolRun, *, config: OperatorConfig, replicas: int | None) -> list[dict[str, Any]]:
    """The sandbox set, in apply order (nothing for a run without a sandbox)."""
    if not uses_sandbox(run):
        return []
    return [
        build_sandbox_service(run),
        build_sandbox_network_policy(run, scraper_namespaces=config.metrics_scraper_selector, operator_pods=config.own_pods),
        build_sandbox_pdb(run),
        build_sandbox_deployment(run, config=config, replicas=replicas),
    ]
