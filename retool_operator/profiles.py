"""Hardware profiles: what a trainer pod needs on NVIDIA or Ascend nodes, or on CPU nodes for a rehearsal.

A profile maps ``spec.hardware`` plus the operator's config to the device resource, node
selector, tolerations, image, user, environment and Ray resources of the trainer pods. The
run's own nodeSelector and tolerations are merged over the profile's (the run wins on a key).

Ray learns a node's devices from the group's ``resources`` field (KubeRay 1.7), not from
``rayStartParams``: KubeRay maps only ``nvidia.com/gpu``-like resources and a few others to Ray
resources by itself, so Ascend NPUs are declared as the Ray resource ``NPU`` there, and GPUs as
``GPU`` the same way for parity. KubeRay refuses a group that sets both (``resources`` and any of
num-cpus/num-gpus/memory/resources in rayStartParams).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from retool.recipe.render.ascend import ASCEND_ENV as RECIPE_ASCEND_ENV
from retool.spec.model import HardwareSpec
from retool_operator.config import OperatorConfig

# The Ascend recipe's runtime settings (one definition, shared with the stage renderers), plus a
# longer HCCL connect timeout for clusters whose NPUs take minutes to join.
ASCEND_ENV: dict[str, str] = {**RECIPE_ASCEND_ENV, "HCCL_CONNECT_TIMEOUT": "1800"}
NVIDIA_ENV: dict[str, str] = {"NCCL_DEBUG": "WARN"}

# CPU and memory of a trainer pod when the run does not say (one 8-device node of the recipe).
DEFAULT_TRAINER_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "32", "memory": "256Gi"},
    "limits": {"cpu": "64", "memory": "512Gi"},
}
RAY_HEAD_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}

RAY_VERSION = "2.60.0"
"""The Ray of the trainer images (pinned in pyproject's ``train`` extra; a test holds them equal): the RayJobs' ``rayVersion``."""

TRAINER_UID = 1000
"""The CUDA trainer image's USER (images/trainer-cuda); its group owns what the stages write to the claim."""


@dataclass(frozen=True)
class HardwareProfile:
    """Everything accelerator-specific about a trainer pod, resolved from the spec and the config."""

    accelerator: str
    device_resource: str
    devices_per_node: int
    image: str
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ray_resources: dict[str, str] = field(default_factory=dict)
    """The Ray resources of one node (the worker/head group's ``resources`` field), e.g. {"NPU": "8"}."""
    ray_device_resource: str = "GPU"
    """The Ray resource name of one device: GPU, or NPU on Ascend."""
    run_as_user: int | None = None
    """The image's non-root uid (pods run as it, runAsNonRoot); None for an image that must run as root."""
    fs_group: int = TRAINER_UID
    """Group that owns the claim's files (fsGroup): writable by every stage pod, whatever its uid."""
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    shared_memory: str = "64Gi"

    def device_resources(self) -> dict[str, dict[str, str]]:
        """Pod resources: CPU/memory plus the devices in both requests and limits (extended resources must match); a CPU run has none."""
        requests = dict(self.resources.get("requests", {}))
        limits = dict(self.resources.get("limits", {}))
        if self.device_resource:
            requests[self.device_resource] = str(self.devices_per_node)
            limits[self.device_resource] = str(self.devices_per_node)
        return {"requests": requests, "limits": limits}


def _toleration(t: Any) -> dict[str, Any]:
    data = t.model_dump(by_alias=True, exclude_none=True)
    return data


def _merge_tolerations(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(base)
    for t in extra:
        if t not in out:
            out.append(t)
    return out


def trainer_image(config: OperatorConfig, accelerator: str, verl: str) -> str:
    """The operator's trainer image for an accelerator and a trainer line (``spec.trainer.verl``, docs/verl-lines.md)."""
    if accelerator == "ascend":
        return config.trainer_image_ascend_verl09 if verl == "0.9.1" else config.trainer_image_ascend
    return config.trainer_image_nvidia_verl09 if verl == "0.9.1" else config.trainer_image_nvidia


def hardware_profile(hardware: HardwareSpec, config: OperatorConfig, verl: str = "0.6.1") -> HardwareProfile:
    """The profile of a run's trainer pods (``verl``: the run's trainer line, which picks the default image)."""
    extra_tolerations = [_toleration(t) for t in hardware.tolerations]
    resources = (
        hardware.resources.model_dump(by_alias=True) if (hardware.resources.requests or hardware.resources.limits) else DEFAULT_TRAINER_RESOURCES
    )
    resources = {k: {rk: str(rv) for rk, rv in v.items()} for k, v in resources.items() if v}
    if hardware.accelerator == "cpu":
        # A rehearsal (docs/rehearsal.md): no device resource, selector or toleration of its own, and
        # the CUDA trainer image of the line (PyTorch's CUDA build runs on CPU). Its training processes
        # are declared to Ray as GPUs: verl 0.9.1 counts only GPU or NPU when it checks the cluster's room
        # (retool.recipe.verl_plugins.v0_9.cpu_platform), and Ray hands them out without touching a device.
        return HardwareProfile(
            accelerator="cpu",
            device_resource="",
            devices_per_node=hardware.devices_per_node,
            image=hardware.image or trainer_image(config, "nvidia", verl),
            node_selector=dict(hardware.node_selector),
            tolerations=extra_tolerations,
            env={},
            ray_resources={"GPU": str(hardware.devices_per_node)},
            ray_device_resource="GPU",
            run_as_user=TRAINER_UID,
            resources=resources,
            shared_memory=str(hardware.shared_memory),
        )
    if hardware.accelerator == "ascend":
        device = hardware.device_resource_name or config.ascend_resource_name
        selector = {**config.ascend_selector, **hardware.node_selector}
        tolerations = _merge_tolerations([{"key": device, "operator": "Exists", "effect": "NoSchedule"}], extra_tolerations)
        return HardwareProfile(
            accelerator="ascend",
            device_resource=device,
            devices_per_node=hardware.devices_per_node,
            image=hardware.image or trainer_image(config, "ascend", verl),
            node_selector=selector,
            tolerations=tolerations,
            env=dict(ASCEND_ENV),
            # KubeRay v1.7 maps only nvidia.com/gpu (and a few others) to Ray resources: declare NPUs.
            ray_resources={"NPU": str(hardware.devices_per_node)},
            ray_device_resource="NPU",
            # images/trainer-ascend runs as root (the driver's device files belong to a host-specific group).
            run_as_user=None,
            resources=resources,
            shared_memory=str(hardware.shared_memory),
        )
    device = hardware.device_resource_name or config.nvidia_resource_name
    selector = {"nvidia.com/gpu.product": hardware.product} if hardware.product else {}
    selector.update(hardware.node_selector)
    tolerations = _merge_tolerations([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], extra_tolerations)
    return HardwareProfile(
        accelerator="nvidia",
        device_resource=device,
        devices_per_node=hardware.devices_per_node,
        image=hardware.image or trainer_image(config, "nvidia", verl),
        node_selector=selector,
        tolerations=tolerations,
        env=dict(NVIDIA_ENV),
        ray_resources={"GPU": str(hardware.devices_per_node)},
        ray_device_resource="GPU",
        run_as_user=TRAINER_UID,
        resources=resources,
        shared_memory=str(hardware.shared_memory),
    )
