"""The child of one attempt of a stage: a batch Job (prepare, merge) or a KubeRay RayJob (sft, rl, eval).

Lifecycle of a RayJob (KubeRay 1.7): the job is submitted by a submitter Job (``K8sJobMode``) on
the trainer nodes, which follows the driver's log (``ray job logs --follow``), so the stage's log
outlives its cluster. ``shutdownAfterJobFinishes`` deletes the Ray cluster (and frees its
accelerators) ``failurePolicy.clusterGraceSeconds`` after the job ends, success or failure; the
RayJob record and the submitter Job stay with the run. Why not ``deletionStrategy.deletionRules``:
KubeRay refuses rules together with ``shutdownAfterJobFinishes``, and refuses to suspend a RayJob
without ``shutdownAfterJobFinishes`` (spec.suspend and Kueue both suspend), and its legacy
``onSuccess``/``onFailure`` policies act only on a terminal ``jobStatus``, so a RayJob that fails
before its job reports one (a deadline, a submitter that cannot reach the head) would keep its
cluster. Why not ``SidecarMode``/``HTTPMode``: no separate submitter pod, but the driver's log then
lives only in the head pod and is deleted with the cluster.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from retool.preflight.checks import PERMANENT_EXIT_CODES
from retool.recipe.render.common import CPU_ONLY_MODULE
from retool.recipe.render.profiles import model_size_billions
from retool.runtime.context import ENV_ATTEMPT, ENV_HF_TOKEN, SPEC_MOUNT_PATH, StageContext
from retool.runtime.paths import cache_env, run_paths
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, sandbox_url, stage_child_name
from retool_operator import cluster_reuse
from retool_operator import constants as c
from retool_operator.builders.meta import Tracking, experiment_name, labels, object_meta, run_namespace
from retool_operator.builders.pods import SUBMITTER, RunPodSettings, pod_template, run_pod_settings, stage_pod_settings
from retool_operator.builders.run_spec import run_document
from retool_operator.builders.sandbox import uses_sandbox
from retool_operator.builders.scheduling import queued, scheduling_labels
from retool_operator.builders.storage import stage_volumes
from retool_operator.config import OperatorConfig
from retool_operator.profiles import RAY_VERSION, HardwareProfile, hardware_profile

STAGE_CONTAINER = "stage"
RAY_HEAD_CONTAINER = "ray-head"
RAY_WORKER_CONTAINER = "ray-worker"
RAY_SUBMITTER_CONTAINER = "ray-job-submitter"
RAY_WORKER_GROUP = "trainers"
PYTHON = "python3"
"""The trainer images' interpreter: the vLLM base images install ``python3`` only."""

# Batch stages (no accelerators): data preparation streams; the merge's memory follows the model
# (``merge_resources``), these are its CPUs and its memory when the model size is unknown.
JOB_RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "prepare": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}},
    "merge": {"requests": {"cpu": "8", "memory": "192Gi"}, "limits": {"cpu": "16", "memory": "192Gi"}},
    # verl's dataloaders and one tokenizer on CPU: 1.3 GiB peak measured on the 32B example's data.
    "preflight": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}},
}
MERGE_BYTES_PER_PARAM = 6
"""verl's FSDP merger holds every rank's fp32 shard (4 bytes a parameter) and the bf16 copy it writes (2)."""
MERGE_HEADROOM = 1.2
MERGE_FIXED_GIB = 8
"""Python, torch, the tokenizer and safetensors' write buffers on top of the tensors."""
MERGE_MIN_GIB = 16
TORCH_AUTOLOAD_OFF = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
"""Ascend: pods without an NPU get no driver from the Ascend runtime; torch_npu must not autoload."""
SUBMITTER_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
SUBMITTER_GRACE_SECONDS = 300
"""How long the submitter pod may outlive the stage deadline: KubeRay's job-status check-failure
timeout (``recordJobStatusCheckFailure``, 300 s in rayjob_controller.go v1.7.0), after which the
RayJob is Failed anyway."""


def submitter_settings(run: RetoolRun) -> tuple[dict[str, Any], int | None]:
    """(``spec.submitterConfig``, the submitter pod's ``activeDeadlineSeconds`` or None).

    KubeRay's submitter Job defaults to ``backoffLimit: 2`` (``createNewK8sJob``, rayjob_controller.go
    v1.6.1 and v1.7.0) and is kept when the RayJob ends ("We don't need to delete the submitter
    Kubernetes Job"); a replacement pod started after the cluster is deleted loops forever waiting
    for the gone head's GCS (common/job.go v1.7.0 ``until ... GCS healthy``). The operator retries
    with a new attempt of its own, so the submitter gets no retries of its own (0), and with a stage
    deadline its pod is bounded by it (plus KubeRay's status-check grace).
    """
    deadline = run.spec.failure_policy.stage_deadline_seconds
    return {"backoffLimit": 0}, (deadline + SUBMITTER_GRACE_SECONDS if deadline else None)


def stage_command(stage: str, *, cpu_only: bool = False) -> list[str]:
    """What every stage container runs; ``retool.stage`` renders the verl command from the spec.

    ``cpu_only``: the batch Jobs (prepare, preflight, merge) get no accelerator, and on Ascend no
    NPU driver: the entrypoint runs through ``retool.runtime.cpu_only`` so that nothing it imports
    (transformers, accelerate, mlflow's integrations) loads torch_npu, which fails there without
    ``libascend_hal.so``. The commands it renders for these stages go through the same launcher.
    """
    launcher = [PYTHON, "-m", CPU_ONLY_MODULE] if cpu_only else [PYTHON]
    return [*launcher, "-m", "retool.stage", stage, "--spec", SPEC_MOUNT_PATH]


def merge_memory_gib(size_billions: float) -> int:
    """Memory of the merge Job for a model of ``size_billions`` parameters (32B -> 223 GiB).

    Peak = parameters x 6 bytes (fp32 shards + bf16 copy; 179 GiB for 32B), x 1.2 headroom, plus
    8 GiB for the process itself, rounded up to a whole GiB, never under 16 GiB.
    """
    peak = size_billions * 1e9 * MERGE_BYTES_PER_PARAM / 2**30
    return max(MERGE_MIN_GIB, math.ceil(peak * MERGE_HEADROOM + MERGE_FIXED_GIB))


def merge_resources(run: RetoolRun) -> dict[str, dict[str, str]]:
    """The merge Job's resources: memory requested = limit (the scheduler must find that much free)."""
    size = model_size_billions(run.spec)
    if size is None:
        return JOB_RESOURCES["merge"]
    memory = f"{merge_memory_gib(size)}Gi"
    cpu = JOB_RESOURCES["merge"]
    return {"requests": {**cpu["requests"], "memory": memory}, "limits": {**cpu["limits"], "memory": memory}}


def job_resources(run: RetoolRun, stage: str) -> dict[str, dict[str, str]]:
    return merge_resources(run) if stage == "merge" else JOB_RESOURCES[stage]


def stage_labels(run: RetoolRun, stage: str, attempt: int) -> dict[str, str]:
    return {**labels(run.metadata.name, c.COMPONENT_STAGE, stage), c.LABEL_ATTEMPT: str(attempt)}


def _child_meta(run: RetoolRun, name: str, lbls: dict[str, str], *, config: OperatorConfig, ray: bool) -> dict[str, Any]:
    """The child's metadata: the stage labels plus those that hand it to the cluster's scheduling."""
    return object_meta(name, run_namespace(run), {**lbls, **scheduling_labels(run, config, child_name=name, ray=ray)})


def _stage_env(
    run: RetoolRun, stage: str, *, attempt: int, image: str, tracking: Tracking, profile_env: dict[str, str], pods: RunPodSettings
) -> list[dict[str, Any]]:
    """The stage context, the caches on the PVC (every process of the pod, Ray workers included),
    S3 credentials by reference and, for prepare (which stages the model), the hub token by reference."""
    # The run's own variables (spec.pods.env, added to every container by pod_template) win over the
    # profile's defaults such as NCCL_DEBUG; the stage context cannot be overridden (the rules refuse it).
    profile_env = {k: v for k, v in profile_env.items() if k not in pods.env_names}
    context = StageContext(
        run_name=run.metadata.name,
        namespace=run_namespace(run),
        # A run without a sandbox (text-only) gets no URL: its stages, the preflight included, call none.
        sandbox_url=sandbox_url(run.metadata.name, run_namespace(run)) if uses_sandbox(run) else "",
        attempt=attempt,
        run_uid=run.metadata.model_extra.get("uid") if run.metadata.model_extra else None,
        image=image,
        mlflow_tracking_uri=tracking.uri,
        mlflow_experiment=tracking.experiment or experiment_name(run),
        mlflow_parent_run_id=tracking.parent_run_id,
    )
    values = {**profile_env, "PYTHONUNBUFFERED": "1", **cache_env(run_paths(run)), **context.to_env()}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    token = run.spec.model.token_secret_ref
    if stage == "prepare" and token is not None:
        env.append({"name": ENV_HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
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


def preflight_failure_policy() -> dict[str, Any]:
    """Fail the preflight Job at once on a check that would fail the same way on every attempt.

    The Job's Failed condition then has reason ``PodFailurePolicy``, which the operator reads as
    a permanent failure (no retries); a sandbox still starting (its own exit code) fails the
    attempt normally, so the run's retries apply.
    """
    return {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": STAGE_CONTAINER, "operator": "In", "values": list(PERMANENT_EXIT_CODES)}},
        ]
    }


def build_stage_job(run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking) -> dict[str, Any]:
    """A batch stage (prepare, preflight, merge): one pod, no accelerator, on the trainer nodes (same image, same arch)."""
    profile = hardware_profile(run.spec.hardware, config, run.spec.trainer.verl)
    name = stage_child_name(run.metadata.name, stage, attempt)
    lbls = stage_labels(run, stage, attempt)
    volumes, mounts = stage_volumes(run, profile, child_name=name)
    job_env = TORCH_AUTOLOAD_OFF if profile.accelerator == "ascend" else {}
    pods = run_pod_settings(run)
    container = {
        "name": STAGE_CONTAINER,
        "image": profile.image,
        "command": stage_command(stage, cpu_only=True),
        "env": _stage_env(run, stage, attempt=attempt, image=profile.image, tracking=tracking, profile_env=job_env, pods=pods),
        "resources": job_resources(run, stage),
        "volumeMounts": mounts,
        # The last lines of the log become the container's termination message on a failure, so
        # the operator can put the reason into the run's status (the preflight writes its own).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # No ttlSecondsAfterFinished: a finished Job holds nothing but its pod's log, which stays
    # readable until the run is deleted (like the RayJob and its submitter's log).
    spec: dict[str, Any] = {
        "backoffLimit": 0,  # the operator retries with a new attempt, so attempts stay countable
        "template": pod_template(stage_pod_settings(profile, labels=lbls, restart_policy="Never", run=pods), [container], volumes),
    }
    if queued(run):
        spec["suspend"] = True  # Kueue unsuspends it on admission
    if stage == "preflight":
        spec["podFailurePolicy"] = preflight_failure_policy()
    if run.spec.failure_policy.stage_deadline_seconds:
        spec["activeDeadlineSeconds"] = run.spec.failure_policy.stage_deadline_seconds
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _child_meta(run, name, lbls, config=config, ray=False), "spec": spec}


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


def driver_uses_devices(run: RetoolRun, stage: str) -> bool:
    """Whether the stage's Ray driver itself computes on the devices (rather than Ray actors).

    One-node SFT runs torchrun inside the driver; multi-node SFT (``retool.runtime.ray_torchrun``)
    and rl/eval (verl's workers) reserve the devices for Ray actors, so a driver holding them
    would leave the actors unschedulable.
    """
    return stage == "sft" and run.spec.hardware.nodes == 1


def entrypoint_devices(run: RetoolRun, stage: str, profile: HardwareProfile) -> dict[str, Any]:
    """The RayJob's entrypoint resource fields: the devices of the one node, for a driver that uses them.

    Ray before 2.53 clears ASCEND_RT_VISIBLE_DEVICES for a job driver that requested no NPU (only
    CUDA was exempt), so every torchrun rank would see no NPU; with the NPUs requested, Ray sets
    the variable to the driver's devices. GPUs are requested the same way (CUDA_VISIBLE_DEVICES),
    through ``entrypointNumGpus``: Ray refuses GPU inside ``entrypoint_resources``.
    """
    if not driver_uses_devices(run, stage):
        return {}
    devices = run.spec.hardware.devices_per_node
    if profile.ray_device_resource == "GPU":
        return {"entrypointNumGpus": devices}
    return {"entrypointResources": json.dumps({profile.ray_device_resource: devices})}


def build_stage_rayjob(
    run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking, on_cluster: str | None = None
) -> dict[str, Any]:
    """A Ray stage (sft, rl, eval): a RayJob whose cluster is head + nodes-1 workers, all trainer nodes.

    The head is a trainer node too (one-node runs have only the head). The entrypoint runs on the
    head as the Ray driver and inherits its environment (sandbox URL, MLflow, attempt).

    ``on_cluster``: a retry on the cluster an earlier attempt kept (``cluster_reuse``): a clusterSelector
    instead of a cluster spec, and the attempt number given to the driver on its command line (the pods'
    environment is the earlier attempt's; only ``retool.stage`` in the driver reads it, and
    ``cluster_fingerprint`` equal means the rest is the same).
    """
    profile = hardware_profile(run.spec.hardware, config, run.spec.trainer.verl)
    name = stage_child_name(run.metadata.name, stage, attempt)
    lbls = stage_labels(run, stage, attempt)
    volumes, mounts = stage_volumes(run, profile, child_name=name)
    run_pods = run_pod_settings(run)
    env = _stage_env(run, stage, attempt=attempt, image=profile.image, tracking=tracking, profile_env=profile.env, pods=run_pods)
    pods = stage_pod_settings(profile, labels=lbls, run=run_pods)
    cluster: dict[str, Any] = {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0"},
            "resources": dict(profile.ray_resources),
            "template": pod_template(pods, [_ray_container(RAY_HEAD_CONTAINER, profile, env, mounts, True)], volumes),
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
                "rayStartParams": {},
                "resources": dict(profile.ray_resources),
                "template": pod_template(pods, [_ray_container(RAY_WORKER_CONTAINER, profile, env, mounts, False)], volumes),
            }
        ]
    submitter = {"name": RAY_SUBMITTER_CONTAINER, "image": profile.image, "resources": SUBMITTER_RESOURCES}
    submitter_config, submitter_deadline = submitter_settings(run)
    submitter_template = pod_template(stage_pod_settings(profile, labels=lbls, restart_policy="Never", run=run_pods, role=SUBMITTER), [submitter])
    if submitter_deadline is not None:
        submitter_template["spec"]["activeDeadlineSeconds"] = submitter_deadline
    spec: dict[str, Any] = {
        "entrypoint": " ".join(stage_command(stage)),
        **entrypoint_devices(run, stage, profile),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": cluster_reuse.cluster_ttl(run, stage),
        "backoffLimit": 0,
        "submitterPodTemplate": submitter_template,
        "submitterConfig": submitter_config,
        "rayClusterSpec": cluster,
    }
    if on_cluster is not None:
        del spec["rayClusterSpec"], spec["ttlSecondsAfterFinished"]
        spec.update(entrypoint=f"{ENV_ATTEMPT}={attempt} {spec['entrypoint']}", shutdownAfterJobFinishes=False, clusterSelector={c.RAY_CLUSTER_LABEL: on_cluster})
    elif queued(run):
        spec["suspend"] = True  # Kueue unsuspends it on admission (shutdownAfterJobFinishes is required for that)
    if run.spec.failure_policy.stage_deadline_seconds:
        spec["activeDeadlineSeconds"] = run.spec.failure_policy.stage_deadline_seconds
    # Held until the run's status records the outcome (constants.FINALIZER_OUTCOME): KubeRay may delete it once finished.
    meta = {**_child_meta(run, name, lbls, config=config, ray=True), "finalizers": [c.FINALIZER_OUTCOME]}
    if on_cluster is None:
        meta["annotations"] = {**(meta.get("annotations") or {}), cluster_reuse.ANNOTATION_FINGERPRINT: _fingerprint(cluster, run)}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": spec}


def _fingerprint(cluster_spec: dict[str, Any], run: RetoolRun) -> str:
    return hashlib.sha256(json.dumps({"cluster": cluster_spec, "run": run_document(run)}, sort_keys=True).encode()).hexdigest()[:32]


def cluster_fingerprint(run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking) -> str:
    """What the cluster of ``attempt`` would run if the run made it now: its cluster spec (image, devices,
    environment, volumes) and the spec snapshot its pods mount. A kept cluster serves the next attempt only
    while the run still renders the same (``cluster_reuse``): an edit or an operator upgrade in between gets a
    fresh one."""
    rayjob = build_stage_rayjob(run, stage, attempt, config=config, tracking=tracking)
    return rayjob["metadata"]["annotations"][cluster_reuse.ANNOTATION_FINGERPRINT]


def build_stage_child(
    run: RetoolRun, stage: str, attempt: int, *, config: OperatorConfig, tracking: Tracking, on_cluster: str | None = None
) -> dict[str, Any]:
    """The Job or RayJob of one attempt of a stage (``on_cluster``: the kept Ray cluster it runs on)."""
    if stage in RAY_STAGES:
        return build_stage_rayjob(run, stage, attempt, config=config, tracking=tracking, on_cluster=on_cluster)
    return build_stage_job(run, stage, attempt, config=config, tracking=tracking)
