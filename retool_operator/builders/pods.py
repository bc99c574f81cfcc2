"""The one pod path: every pod template the operator creates is assembled by ``pod_template``.

Stage Jobs, Ray heads, Ray workers, the Ray job submitter, the sandbox and the managed MLflow
tracker all get their pod template here, from their containers plus a ``PodSettings`` value
resolved by one function per role (``stage_pod_settings``, ``sandbox_pod_settings``,
``mlflow_pod_settings``). A setting added to a role's resolver reaches every pod of that role, and
one added to ``PodSettings`` reaches every pod the operator creates; ``tests/operator/test_pods.py``
walks every pod template of every child kind to hold that.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.pods import VOLUME_SOURCES
from retool_operator.constants import LABEL_POD_ROLE
from retool_operator.profiles import HardwareProfile

Obj = dict[str, Any]


@dataclass(frozen=True)
class PodSettings:
    """Everything that shapes a pod beyond its own containers and volumes.

    ``env``, ``env_from`` and ``volume_mounts`` are added to every container of the pod (after the
    container's own entries; a container's own variable of the same name wins); ``volumes`` after
    the pod's own. ``None`` and empty values are left out of the manifest.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Obj] = ()
    security_context: Mapping[str, Any] = field(default_factory=dict)
    container_security_context: Mapping[str, Any] = field(default_factory=dict)
    """Merged into every container's securityContext (the container's own keys win)."""
    service_account_name: str | None = None
    automount_service_account_token: bool | None = None
    image_pull_secrets: Sequence[str] = ()
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    runtime_class_name: str | None = None
    host_users: bool | None = None
    enable_service_links: bool | None = None
    restart_policy: str | None = None
    env: Sequence[Obj] = ()
    env_from: Sequence[Obj] = ()
    volumes: Sequence[Obj] = ()
    volume_mounts: Sequence[Obj] = ()


def _with_pod_env(container: Obj, settings: PodSettings) -> Obj:
    out = copy.deepcopy(container)
    if settings.container_security_context:
        out["securityContext"] = {**copy.deepcopy(dict(settings.container_security_context)), **out.get("securityContext", {})}
    if settings.env:
        own = {e["name"] for e in out.get("env", [])}
        out["env"] = [*out.get("env", []), *(copy.deepcopy(e) for e in settings.env if e["name"] not in own)]
    if settings.env_from:
        out["envFrom"] = [*out.get("envFrom", []), *copy.deepcopy(list(settings.env_from))]
    if settings.volume_mounts:
        out["volumeMounts"] = [*out.get("volumeMounts", []), *copy.deepcopy(list(settings.volume_mounts))]
    return out


def pod_template(settings: PodSettings, containers: Sequence[Obj], volumes: Sequence[Obj] = ()) -> Obj:
    """A ``PodTemplateSpec`` (metadata + spec) of ``containers`` with ``settings`` applied."""
    metadata: Obj = {"labels": dict(settings.labels)}
    if settings.annotations:
        metadata["annotations"] = dict(settings.annotations)
    spec: Obj = {}
    optional: list[tuple[str, Any]] = [
        ("serviceAccountName", settings.service_account_name),
        ("automountServiceAccountToken", settings.automount_service_account_token),
        ("enableServiceLinks", settings.enable_service_links),
        ("hostUsers", settings.host_users),
        ("runtimeClassName", settings.runtime_class_name),
        ("priorityClassName", settings.priority_class_name),
        ("schedulerName", settings.scheduler_name),
        ("restartPolicy", settings.restart_policy),
    ]
    spec.update((key, value) for key, value in optional if value is not None)
    if settings.security_context:
        spec["securityContext"] = copy.deepcopy(dict(settings.security_context))
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    spec["containers"] = [_with_pod_env(c, settings) for c in containers]
    all_volumes = [*copy.deepcopy(list(volumes)), *copy.deepcopy(list(settings.volumes))]
    if all_volumes:
        spec["volumes"] = all_volumes
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = copy.deepcopy(list(settings.tolerations))
    return {"metadata": metadata, "spec": spec}


# ---------------------------------------------------------------- per-run settings (spec.pods, spec.scheduling)


@dataclass(frozen=True)
class RunPodSettings:
    """A run's own pod settings, as manifest fragments (``spec.pods`` and ``spec.scheduling``)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    service_account_name: str | None = None
    image_pull_secrets: Sequence[str] = ()
    priority_class_name: str | None = None
    env: Sequence[Obj] = ()
    env_from: Sequence[Obj] = ()
    volumes: Sequence[Obj] = ()
    volume_mounts: Sequence[Obj] = ()

    @property
    def env_names(self) -> frozenset[str]:
        return frozenset(e["name"] for e in self.env)


def _volume(volume: Any) -> tuple[Obj, Obj]:
    """(pod volume, container mount) of one ``spec.pods.volumes`` entry."""
    data = volume.model_dump(by_alias=True, exclude_none=True, mode="json")
    source = {key: data[key] for key in VOLUME_SOURCES if key in data}
    mount: Obj = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.sub_path:
        mount["subPath"] = volume.sub_path
    if volume.read_only:
        mount["readOnly"] = True
    return {"name": volume.name, **source}, mount


def run_pod_settings(run: RetoolRun) -> RunPodSettings:
    """The run's pod settings; the rules (``retool.spec.pod_rules``) already refused clashes with ours."""
    pods, scheduling = run.spec.pods, run.spec.scheduling
    pairs = [_volume(v) for v in pods.volumes]
    return RunPodSettings(
        labels=dict(pods.labels),
        annotations=dict(pods.annotations),
        service_account_name=pods.service_account_name,
        image_pull_secrets=tuple(pods.image_pull_secrets),
        priority_class_name=scheduling.priority_class_name,
        env=tuple(e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in pods.env),
        env_from=tuple(e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in pods.env_from),
        volumes=tuple(volume for volume, _ in pairs),
        volume_mounts=tuple(mount for _, mount in pairs),
    )


# ---------------------------------------------------------------- per-role settings


def stage_security_context(profile: HardwareProfile) -> dict[str, Any]:
    """The pod securityContext of every stage pod: it can write a freshly provisioned claim.

    A new volume is root-owned; ``fsGroup`` makes the kubelet give it (and every file on it) the
    trainer image's group, group-writable, and ``OnRootMismatch`` skips that recursive walk when
    the volume's root already matches, so a claim holding a 65 GB model and checkpoints does not
    delay every pod start. Pods run as the image's non-root uid where the image has one (CUDA);
    the Ascend image runs as root (see images/trainer-ascend). seccomp: the runtime's default.
    """
    context: dict[str, Any] = {"fsGroup": profile.fs_group, "fsGroupChangePolicy": "OnRootMismatch"}
    if profile.run_as_user is not None:
        context.update(runAsUser=profile.run_as_user, runAsGroup=profile.fs_group, runAsNonRoot=True)
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
"""What Pod Security ``restricted`` asks of every container (pkg/security/podsecurity in Kubernetes
v1.36.3: allowPrivilegeEscalation false, capabilities drop ALL, runAsNonRoot, a RuntimeDefault or
Localhost seccomp profile)."""


def stage_container_security_context(profile: HardwareProfile) -> dict[str, Any]:
    """The containers' securityContext of every stage pod: Pod Security ``restricted`` where the image
    runs as a non-root uid (the CUDA trainer); nothing more for an image that runs as root (the Ascend
    trainer, whose CANN runtime expects root: such pods meet ``baseline``, see docs/operations.md).

    KubeRay copies the Ray container's securityContext into the init container it injects
    (common/pod.go, KubeRay v1.6.1), so the whole pod stays within the level.
    """
    return copy.deepcopy(RESTRICTED_CONTAINER) if profile.run_as_user is not None else {}


StageRole = str
TRAINER = "trainer"
"""Pods that run the stage's code and mount the run's claim: Job pods, Ray heads and workers."""
SUBMITTER = "submitter"
"""The Ray job submitter: trainer image, trainer nodes, but no claim, no run environment."""



def stage_pod_settings(
    profile: HardwareProfile,
    *,
    labels: Mapping[str, str],
    restart_policy: str | None = None,
    run: RunPodSettings | None = None,
    role: StageRole = TRAINER,
) -> PodSettings:
    """Every pod of a stage (Job pod, Ray head and workers, job submitter): on the trainer nodes.

    The submitter and batch stages run the trainer image too, so they need the same nodes
    (architecture, image pull secrets, taints) and the same user as the Ray pods: the submitter is
    placed here, in the one resolver, so it can never land on a node that cannot pull or run the
    trainer image. The run's identity (service
    account, pull secrets, priority, labels, annotations) reaches every stage pod; its environment
    and extra volumes only the pods that run the stage's code (``TRAINER``), so a Secret is exposed
    to no pod that does not need it and a ReadWriteOnce volume never pins the submitter.
    """
    run = run or RunPodSettings()
    trainer = role == TRAINER
    role_label = {} if trainer else {LABEL_POD_ROLE: role}  # the operator never waits for a submitter pod
    return PodSettings(
        labels={**run.labels, **labels, **role_label},
        annotations=dict(run.annotations),
        node_selector=profile.node_selector,
        tolerations=tuple(profile.tolerations),
        security_context=stage_security_context(profile),
        container_security_context=stage_container_security_context(profile),
        restart_policy=restart_policy,
        service_account_name=run.service_account_name,
        image_pull_secrets=tuple(run.image_pull_secrets),
        priority_class_name=run.priority_class_name,
        env=tuple(run.env) if trainer else (),
        env_from=tuple(run.env_from) if trainer else (),
        volumes=tuple(run.volumes) if trainer else (),
        volume_mounts=tuple(run.volume_mounts) if trainer else (),
    )


def sandbox_pod_settings(
    *,
    labels: Mapping[str, str],
    security_context: Mapping[str, Any],
    host_users: bool | None = None,
    runtime_class_name: str | None = None,
    run: RunPodSettings | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Obj] = (),
) -> PodSettings:
    """The sandbox replicas: no API credentials, no service links; the privileges of
    ``builders.sandbox_security`` (a non-root uid, or root of the pod's own user namespace) and the
    spec's RuntimeClass.

    Of the run's pod settings only what cannot hand untrusted code anything applies: image pull
    secrets (used by the kubelet), labels and annotations. Never the service account, the
    environment or the volumes: the sandbox runs model-written code.
    """
    run = run or RunPodSettings()
    return PodSettings(
        labels={**run.labels, **labels},
        annotations=dict(run.annotations),
        image_pull_secrets=tuple(run.image_pull_secrets),
        node_selector=dict(node_selector or {}),
        tolerations=tuple(tolerations),
        automount_service_account_token=False,
        enable_service_links=False,
        host_users=host_users,
        runtime_class_name=runtime_class_name,
        security_context=dict(security_context),
    )


def mlflow_pod_settings(*, labels: Mapping[str, str], fs_group: int) -> PodSettings:
    """The managed tracker: no API credentials; runs as the image's non-root uid (``fs_group``, which
    is also its group), its claim writable by it; Pod Security ``restricted``."""
    return PodSettings(
        labels=labels,
        automount_service_account_token=False,
        security_context={"runAsNonRoot": True, "runAsUser": fs_group, "runAsGroup": fs_group, "fsGroup": fs_group, "seccompProfile": {"type": "RuntimeDefault"}},
    )
