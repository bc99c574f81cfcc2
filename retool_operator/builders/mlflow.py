"""The operator-managed MLflow tracker of a namespace: sqlite and artifacts on a claim.

No owner reference: the tracker outlives every run, so deleting a run keeps its history.
"""

from __future__ import annotations

from typing import Any

from retool_operator import constants as c
from retool_operator.builders.meta import object_meta
from retool_operator.builders.pods import mlflow_pod_settings, pod_template
from retool_operator.config import OperatorConfig

MLFLOW_FS_GROUP = 1000  # the MLflow image's group: the claim must be writable by it


def managed_mlflow_uri(namespace: str) -> str:
    return f"http://{c.MLFLOW_NAME}.{namespace}.svc:{c.MLFLOW_PORT}"


def mlflow_service_hosts(namespace: str) -> list[str]:
    """Every name the tracker's Service is reached by inside the cluster (short to fully qualified)."""
    name = c.MLFLOW_NAME
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def mlflow_allowed_hosts(namespace: str) -> str:
    """MLFLOW_SERVER_ALLOWED_HOSTS: the Service names (with any port) and localhost (port-forward).

    MLflow 3.x answers 403 "Invalid Host header" to any Host outside its allowed list (by default
    localhost and private IP addresses only), so stage pods reaching it as
    ``retool-mlflow.<namespace>.svc:5000`` would be refused. /health is exempt (kubelet probes).
    Same list as the chart's tracker (``retool.mlflow.allowedHosts``).
    """
    hosts = [*mlflow_service_hosts(namespace), "localhost", "127.0.0.1"]
    return ",".join(entry for host in hosts for entry in (host, f"{host}:*"))


def mlflow_cors_origins(namespace: str) -> str:
    """MLFLOW_SERVER_CORS_ALLOWED_ORIGINS: a browser on a page served under the Service names may write (localhost always may)."""
    return ",".join(f"http://{host}:{c.MLFLOW_PORT}" for host in mlflow_service_hosts(namespace))


def build_mlflow(namespace: str, *, config: OperatorConfig, storage: str = "20Gi") -> list[dict[str, Any]]:
    """PVC + Deployment + Service of the namespace's tracker."""
    lbls = {
        c.LABEL_NAME: "retool",
        c.LABEL_INSTANCE: c.MLFLOW_NAME,
        c.LABEL_COMPONENT: c.COMPONENT_MLFLOW,
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_ROLE: c.COMPONENT_MLFLOW,
    }
    selector = {c.LABEL_INSTANCE: c.MLFLOW_NAME, c.LABEL_ROLE: c.COMPONENT_MLFLOW}
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(c.MLFLOW_NAME, namespace, lbls),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
    }
    container = {
        "name": "mlflow",
        "image": config.mlflow_image,
        "command": [
            "mlflow", "server", "--host", "0.0.0.0", "--port", str(c.MLFLOW_PORT),
            "--backend-store-uri", "sqlite:////mlflow/mlflow.db",
            "--artifacts-destination", "/mlflow/artifacts", "--serve-artifacts",
        ],
        "env": [
            {"name": "MLFLOW_SERVER_ALLOWED_HOSTS", "value": mlflow_allowed_hosts(namespace)},
            {"name": "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS", "value": mlflow_cors_origins(namespace)},
            # MLflow's GenAI job runner (scorers, trace archival) is 8 more processes, ~1.3 GB; runs need none of it
            {"name": "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "value": "false"},
        ],
        "ports": [{"name": "http", "containerPort": c.MLFLOW_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": c.MLFLOW_PORT}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/health", "port": c.MLFLOW_PORT}, "initialDelaySeconds": 30, "periodSeconds": 20},
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "store", "mountPath": "/mlflow"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(c.MLFLOW_NAME, namespace, lbls),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # sqlite on a ReadWriteOnce claim: never two writers
            "selector": {"matchLabels": selector},
            "template": pod_template(
                mlflow_pod_settings(labels=lbls, fs_group=MLFLOW_FS_GROUP),
                [container],
                [{"name": "store", "persistentVolumeClaim": {"claimName": c.MLFLOW_NAME}}],
            ),
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(c.MLFLOW_NAME, namespace, lbls),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": c.MLFLOW_PORT, "targetPort": c.MLFLOW_PORT, "protocol": "TCP"}]},
    }
    return [pvc, deployment, service]
