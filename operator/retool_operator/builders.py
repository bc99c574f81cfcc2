"""Pure builders: a RetoolRun (plus everything else they need, as arguments) -> child manifests.

No environment reads and no API calls here: handlers resolve the config, the tracking URI and the
parent MLflow run first and pass them in, so ``retool render`` and the tests see exactly what the
operator applies. Owner references are added by ``owned_by`` (handlers) because they need the
run's uid, which a file on disk does not have.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

import yaml

from retool.runtime.context import SPEC_MOUNT_PATH, StageContext
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, SANDBOX_PORT, sandbox_name, sandbox_url, stage_child_name
from retool.spec.rules import sandbox_replicas
from retool_operator import constants as c
from retool_operator.config import OperatorConfig
from retool_operator.profiles import HardwareProfile, hardware_profile

SANDBOX_RUN_AS_USER = 65532
STAGE_CONTAINER = "stage"
RAY_HEAD_CONTAINER = "ray-head"
RAY_WORKER_CONTAINER = "ray-worker"
RAY_WORKER_GROUP = "trainers"

# Batch stages (no accelerators): data preparation streams, the merge holds one model in memory.
JOB_RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "prepare": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}},
    "merge": {"requests": {"cpu": "8", "memory": "96Gi"}, "limits": {"cpu": "16", "memory": "192Gi"}},
}


@dataclass(frozen=True)
class Tracking:
    """Where the run is tracked: resolved by the handlers (spec, chart default or managed tracker)."""

    uri: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None


def run_namespace(run: RetoolRun) -> str:
    return run.metadata.namespace or "default"


def experiment_name(run: RetoolRun) -> str:
    """spec.tracking.mlflow.experiment, else ``<namespace>/<name>``."""
    return run.spec.tracking.mlflow.experiment or f"{run_namespace(run)}/{run.metadata.name}"


def labels(run_name: str, component: str, stage: str | None = None) -> dict[str, str]:
    out = {
        c.LABEL_NAME: "retool",
        c.LABEL_INSTANCE: run_name,
        c.LABEL_COMPONENT: component if stage is None else f"{component}-{stage}",
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_RUN: run_name,
        c.LABEL_ROLE: component,
    }
    if stage is not None:
        out[c.LABEL_STAGE] = stage
    return out


def selector_labels(run_name: str, component: str) -> dict[str, str]:
    """The stable subset used in selectors (never changes for the life of the run)."""
    return {c.LABEL_RUN: run_name, c.LABEL_ROLE: component}


def _meta(name: str, namespace: str, lbls: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": lbls}


def owned_by(obj: dict[str, Any], *, run_name: str, run_uid: str) -> dict[str, Any]:
    """``obj`` with a controller owner reference to its RetoolRun (garbage-collected with it)."""
    ref = {
        "apiVersion": c.RUN_API_VERSION,
        "kind": c.RUN_KIND,
        "name": run_name,
        "uid": run_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = dict(obj["metadata"])
    meta["ownerReferences"] = [ref]
    return {**obj, "metadata": meta}


# ---------------------------------------------------------------- the run's spec ConfigMap


def spec_configmap_name(run_name: str) -> str:
    return f"{run_name}-spec"


def run_document(run: RetoolRun) -> dict[str, Any]:
    """The run as the stages read it: every default filled in, no status, no server metadata."""
    return {
        "apiVersion": c.RUN_API_VERSION,
        "kind": c.RUN_KIND,
        "metadata": {"name": run.metadata.name, "namespace": run_namespace(run)},
        "spec": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def build_spec_configmap(run: RetoolRun) -> dict[str, Any]:
    """ConfigMap ``<run>-spec`` mounted at /etc/retool in every stage pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec_configmap_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SPEC)),
        "data": {c.SPEC_KEY: yaml.safe_dump(run_document(run), sort_keys=False)},
    }


# ---------------------------------------------------------------- sandbox


def desired_sandbox_replicas(run: RetoolRun, *, finished: bool = False) -> int:
    """ceil(maxConcurrent / perReplicaConcurrency); zero while suspended or once the run is over."""
    if run.spec.suspend or finished:
        return 0
    return sandbox_replicas(run.spec)


def _quantities(resources: Any) -> dict[str, dict[str, str]]:
    data = resources.model_dump(by_alias=True)
    return {k: {rk: str(rv) for rk, rv in v.items()} for k, v in data.items() if v}


def build_sandbox_deployment(run: RetoolRun, *, config: OperatorConfig, replicas: int) -> dict[str, Any]:
    name = sandbox_name(run.metadata.name)
    sandbox = run.spec.sandbox
    lbls = labels(run.metadata.name, c.COMPONENT_SANDBOX)
    probe = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    container = {
        "name": "sandbox",
        "image": sandbox.image or config.sandbox_image,
        "command": ["retool", "sandbox", "serve", "--host", "0.0.0.0", "--port", str(SANDBOX_PORT), "--workers", str(sandbox.per_replica_concurrency)],
        "ports": [{"name": "http", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "env": [
            {"name": "RETOOL_SANDBOX_TIMEOUT", "value": str(sandbox.timeout_seconds)},
            {"name": "RETOOL_SANDBOX_MEMORY_LIMIT_MB", "value": str(sandbox.memory_limit_mb)},
            {"name": "RETOOL_SANDBOX_CONCURRENCY", "value": str(sandbox.per_replica_concurrency)},
            {"name": "TMPDIR", "value": "/tmp"},
        ],
        "resources": _quantities(sandbox.resources),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": SANDBOX_PORT}, "initialDelaySeconds": 2, **probe},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": SANDBOX_PORT}, "initialDelaySeconds": 10, **probe},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_RUN_AS_USER,
            "runAsGroup": SANDBOX_RUN_AS_USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, run_namespace(run), lbls),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
            "template": {
                "metadata": {"labels": lbls},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": SANDBOX_RUN_AS_USER,
                        "fsGroup": SANDBOX_RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}],
                },
            },
        },
    }


def build_sandbox_service(run: RetoolRun) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX),
            "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": SANDBOX_PORT, "protocol": "TCP"}],
        },
    }


def build_sandbox_network_policy(run: RetoolRun) -> dict[str, Any]:
    """No egress at all; ingress only from this run's stage pods (Ray head, workers, Jobs)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_STAGE)}}],
                    "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}],
                }
            ],
            "egress": [],
        },
    }


def build_sandbox_pdb(run: RetoolRun) -> dict[str, Any]:
    """Voluntary disruptions (drains) take one replica at a time, so rollouts keep most capacity."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(sandbox_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SANDBOX)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(run.metadata.name, c.COMPONENT_SANDBOX)}},
    }


def build_sandbox(run: RetoolRun, *, config: OperatorConfig, replicas: int) -> list[dict[str, Any]]:
    """The sandbox set, in apply order."""
    return [
        build_sandbox_service(run),
        build_sandbox_network_policy(run),
        build_sandbox_pdb(run),
        build_sandbox_deployment(run, config=config, replicas=replicas),
    ]


# ---------------------------------------------------------------- stages


def stage_command(stage: str) -> list[str]:
    """What every stage container runs; ``retool.stage`` renders the verl command from the spec."""
    return ["python", "-m", "retool.stage", stage, "--spec", SPEC_MOUNT_PATH]


def _stage_env(run: RetoolRun, *, attempt: int, image: str, tracking: Tracking, profile_env: dict[str, str]) -> list[dict[str, Any]]:
    context = StageContext(
        run_name=run.metadata.name,
        namespace=run_namespace(run),
        sandbox_url=sandbox_url(run.metadata.name, run_namespace(run)),
        attempt=attempt,
        run_uid=run.metadata.model_extra.get("uid") if run.metadata.model_extra else None,
        image=image,
        mlflow_tracking_uri=tracking.uri,
        mlflow_experiment=tracking.experiment or experiment_name(run),
        mlflow_parent_run_id=tracking.parent_run_id,
    )
    env = [{"name": k, "value": v} for k, v in {**profile_env, "PYTHONUNBUFFERED": "1", **context.to_env()}.items()]
    s3 = run.spec.storage.s3
    if s3 is not None:
        if s3.endpoint:
            env.append({"name": "AWS_ENDPOINT_URL", "value": s3.endpoint})
        if s3.region:
            env.append({"name": "AWS_DEFAULT_REGION", "value": s3.region})
        if s3.secret_ref is not None:
            for var, key in (("AWS_ACCESS_KEY_ID", s3.secret_ref.access_key_id_key), ("AWS_SECRET_ACCESS_KEY", s3.secret_ref.secret_access_key_key)):
                env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": s3.secret_ref.name, "key": key}}})
    return env


def _volumes(run: RetoolRun, profile: HardwareProfile) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pvc = run.spec.storage.pvc
    assert pvc is not None  # parse_run guarantees it
    volumes = [
        {"name": c.SPEC_VOLUME, "configMap": {"name": spec_configmap_name(run.metadata.name)}},
        {"name": c.DATA_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name}},
        {"name": c.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": profile.shared_memory}},
    ]
    data_mount: dict[str, Any] = {"name": c.DATA_VOLUME, "mountPath": pvc.mount_path}
    if pvc.sub_path:
        data_mount["subPath"] = pvc.sub_path
    mounts = [
        {"name": c.SPEC_VOLUME, "mountPath": posixpath.dirname(SPEC_MOUNT_PATH), "readOnly": True},
        data_mount,
        {"name": c.SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    return volumes, mounts


def _pod_spec(profile: HardwareProfile, container: dict[str, Any], volumes: list[dict[str, Any]], *, restart: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if profile.node_selector:
        spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        spec["tolerations"] = [dict(t) for t in profile.tolerations]
    if restart:
        spec["restartPolicy"] = restart
    return spec


def build_stage_job(run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking) -> dict[str, Any]:
    """A batch stage (prepare, merge): one pod, no accelerator, on the trainer nodes (same image, same arch)."""
    profile = hardware_profile(run.spec.hardware, config)
    name = stage_child_name(run.metadata.name, stage, attempt)
    lbls = {**labels(run.metadata.name, c.COMPONENT_STAGE, stage), c.LABEL_ATTEMPT: str(attempt)}
    volumes, mounts = _volumes(run, profile)
    container = {
        "name": STAGE_CONTAINER,
        "image": profile.image,
        "command": stage_command(stage),
        "env": _stage_env(run, attempt=attempt, image=profile.image, tracking=tracking, profile_env={}),
        "resources": JOB_RESOURCES[stage],
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "backoffLimit": 0,  # the operator retries with a new attempt, so attempts stay countable
        "ttlSecondsAfterFinished": run.spec.failure_policy.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": lbls}, "spec": _pod_spec(profile, container, volumes, restart="Never")},
    }
    if run.spec.failure_policy.stage_deadline_seconds:
        spec["activeDeadlineSeconds"] = run.spec.failure_policy.stage_deadline_seconds
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, run_namespace(run), lbls), "spec": spec}


def _ray_container(name: str, profile: HardwareProfile, env: list[dict[str, Any]], mounts: list[dict[str, Any]], head: bool) -> dict[str, Any]:
    ports = [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": 8265}, {"name": "client", "containerPort": 10001}] if head else []
    container: dict[str, Any] = {
        "name": name,
        "image": profile.image,
        "env": env,
        "resources": profile.device_resources(),
        "volumeMounts": mounts,
    }
    if ports:
        container["ports"] = ports
    return container


def build_stage_rayjob(run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking) -> dict[str, Any]:
    """A Ray stage (sft, rl, eval): a RayJob whose cluster is head + nodes-1 workers, all trainer nodes.

    The head is a trainer node too (one-node runs have only the head). The entrypoint runs on the
    head as the Ray driver and inherits its environment (sandbox URL, MLflow, attempt).
    """
    profile = hardware_profile(run.spec.hardware, config)
    name = stage_child_name(run.metadata.name, stage, attempt)
    lbls = {**labels(run.metadata.name, c.COMPONENT_STAGE, stage), c.LABEL_ATTEMPT: str(attempt)}
    volumes, mounts = _volumes(run, profile)
    env = _stage_env(run, attempt=attempt, image=profile.image, tracking=tracking, profile_env=profile.env)
    head_params = {"dashboard-host": "0.0.0.0", **profile.ray_start_params}
    cluster: dict[str, Any] = {
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": {"metadata": {"labels": lbls}, "spec": _pod_spec(profile, _ray_container(RAY_HEAD_CONTAINER, profile, env, mounts, True), volumes)},
        },
    }
    workers = run.spec.hardware.nodes - 1
    if workers > 0:
        cluster["workerGroupSpecs"] = [
            {
                "groupName": RAY_WORKER_GROUP,
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": dict(profile.ray_start_params),
                "template": {"metadata": {"labels": lbls}, "spec": _pod_spec(profile, _ray_container(RAY_WORKER_CONTAINER, profile, env, mounts, False), volumes)},
            }
        ]
    spec: dict[str, Any] = {
        "entrypoint": " ".join(stage_command(stage)),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": run.spec.failure_policy.ttl_seconds_after_finished,
        "backoffLimit": 0,
        "submitterPodTemplate": {
            "metadata": {"labels": lbls},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "ray-job-submitter",
                        "image": profile.image,
                        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
                    }
                ],
            },
        },
        "rayClusterSpec": cluster,
    }
    if run.spec.failure_policy.stage_deadline_seconds:
        spec["activeDeadlineSeconds"] = run.spec.failure_policy.stage_deadline_seconds
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _meta(name, run_namespace(run), lbls), "spec": spec}


def build_stage_child(run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking) -> dict[str, Any]:
    """The Job or RayJob of one attempt of a stage."""
    if stage in RAY_STAGES:
        return build_stage_rayjob(run, stage, attempt, config=config, tracking=tracking)
    return build_stage_job(run, stage, attempt, config=config, tracking=tracking)


# ---------------------------------------------------------------- managed MLflow (per namespace, not owned by runs)


def managed_mlflow_uri(namespace: str) -> str:
    return f"http://{c.MLFLOW_NAME}.{namespace}.svc:{c.MLFLOW_PORT}"


def build_mlflow(namespace: str, *, config: OperatorConfig, storage: str = "20Gi") -> list[dict[str, Any]]:
    """PVC + Deployment + Service of the namespace's tracker: sqlite and artifacts on the PVC.

    No owner reference: the tracker outlives every run, so deleting a run keeps its history.
    """
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
        "metadata": _meta(c.MLFLOW_NAME, namespace, lbls),
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
        "metadata": _meta(c.MLFLOW_NAME, namespace, lbls),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # sqlite on a ReadWriteOnce claim: never two writers
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": lbls},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "store", "persistentVolumeClaim": {"claimName": c.MLFLOW_NAME}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(c.MLFLOW_NAME, namespace, lbls),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": c.MLFLOW_PORT, "targetPort": c.MLFLOW_PORT, "protocol": "TCP"}]},
    }
    return [pvc, deployment, service]
