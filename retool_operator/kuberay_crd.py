"""What the installed KubeRay can run, read from its RayJob CRD once per operator start (pure check).

Every RayJob the operator renders names each group's Ray resources in the group's ``resources``
field (``{"NPU": "8"}`` on Ascend, ``{"GPU": "8"}`` on NVIDIA). KubeRay added that field in v1.5; an
older CRD's structural schema prunes it silently on admission, so Ray never learns of the NPUs (it
detects GPUs by itself, NPUs it does not) and an Ascend run waits forever while holding them. A run
that needs the field is refused with a clear message instead. Without a readable CRD (no KubeRay,
or no permission) nothing is refused here: creating a RayJob then fails visibly on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retool.spec.model import RetoolRun
from retool_operator.config import OperatorConfig
from retool_operator.profiles import hardware_profile

RAYJOB_CRD = "rayjobs.ray.io"
SELF_DETECTED = frozenset({"GPU", "CPU"})
"""Ray resources Ray detects from the container without being told (``ray start`` reads the GPU limit)."""


@dataclass(frozen=True)
class KubeRayCRD:
    found: bool
    group_resources: bool
    """Whether the head group's schema has ``resources`` (KubeRay >= 1.5)."""


def _keeps_field(node: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether a structural schema ``node`` keeps a field at ``path`` below it: declared there, or an
    object on the way preserves unknown fields (``x-kubernetes-preserve-unknown-fields``) and does not
    declare the next step (trimmed CRDs, e.g. applied without their large pod templates, do that high up)."""
    for step in path:
        props = node.get("properties") or {}
        if step not in props:
            return bool(node.get("x-kubernetes-preserve-unknown-fields"))
        node = props[step] or {}
    return True


def read_crd(crd: dict[str, Any] | None) -> KubeRayCRD:
    if not crd:
        return KubeRayCRD(found=False, group_resources=True)
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") != "v1":
            continue
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        return KubeRayCRD(found=True, group_resources=_keeps_field(schema, ("spec", "rayClusterSpec", "headGroupSpec", "resources")))
    return KubeRayCRD(found=True, group_resources=False)


def kuberay_problems(run: RetoolRun, crd: KubeRayCRD, config: OperatorConfig) -> list[str]:
    """Why the installed KubeRay cannot run ``run`` (empty when it can, or when the CRD is unknown)."""
    spec = run.spec
    uses_ray = spec.sft.enabled or spec.rl.enabled or spec.eval.enabled
    if not crd.found or crd.group_resources or not uses_ray:
        return []
    device = hardware_profile(spec.hardware, config).ray_device_resource
    if device in SELF_DETECTED:
        return []
    return [
        f"spec.hardware.accelerator: the KubeRay installed on this cluster (its RayJob CRD has no group 'resources' field: older than 1.5) "
        f"would silently drop the Ray resource {device}, and the run would wait forever holding its devices; upgrade KubeRay to 1.5 or later "
        "(the chart's kuberay-operator dependency installs 1.7) and its CRDs"
    ]
