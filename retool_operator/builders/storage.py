"""The run's storage: its claim (an existing one, or ``<run>-data`` created by the operator, sized
by ``retool.runtime.claim``) and how stage pods mount it with the spec ConfigMap and the shared memory.

Stages hand data, checkpoints and models to each other only through the claim, at paths that are a
pure function of the run (``retool.runtime.paths``), so every stage pod mounts it the same way.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from retool.runtime.claim import claim_name, default_access_modes, default_claim_size
from retool.runtime.context import SPEC_MOUNT_PATH
from retool.spec.model import RetoolRun
from retool.spec.names import SHM_PATH
from retool_operator import constants as c
from retool_operator.builders.meta import labels, object_meta, run_namespace
from retool_operator.builders.run_spec import spec_configmap_name
from retool_operator.config import OperatorConfig
from retool_operator.profiles import HardwareProfile


@dataclass(frozen=True)
class Claim:
    """The run's claim as the operator resolves it from the spec and its configuration."""

    name: str
    managed: bool
    """Created by the operator (``<run>-data``); False for an existing claim named by the spec."""
    owned_by_run: bool
    """Garbage-collected with the run (storage.retain: delete); never for an existing claim."""
    size: str | None = None
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] = ()


def run_claim(run: RetoolRun, config: OperatorConfig) -> Claim:
    storage = run.spec.storage
    pvc = storage.pvc
    if pvc.claim_name is not None:
        return Claim(name=pvc.claim_name, managed=False, owned_by_run=False)
    return Claim(
        name=claim_name(run),
        managed=True,
        owned_by_run=storage.retain == "delete",
        size=str(pvc.size) if pvc.size is not None else default_claim_size(run.spec),
        storage_class_name=pvc.storage_class_name or config.default_storage_class or None,
        access_modes=default_access_modes(run.spec),
    )


def build_claim(run: RetoolRun, config: OperatorConfig) -> dict[str, Any] | None:
    """The PersistentVolumeClaim the operator creates, or None when the spec names an existing one.

    Created once and never patched (a claim's spec is immutable but for growing its size).
    """
    claim = run_claim(run, config)
    if not claim.managed:
        return None
    spec: dict[str, Any] = {"accessModes": list(claim.access_modes), "resources": {"requests": {"storage": claim.size}}}
    if claim.storage_class_name:
        spec["storageClassName"] = claim.storage_class_name
    meta = object_meta(claim.name, run_namespace(run), labels(run.metadata.name, c.COMPONENT_STORAGE))
    meta["annotations"] = {c.ANNOTATION_RETAIN: run.spec.storage.retain}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def stage_volumes(run: RetoolRun, profile: HardwareProfile, *, child_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of a pod of the child ``child_name``: its spec snapshot read-only, the claim, an in-memory /dev/shm."""
    pvc = run.spec.storage.pvc
    volumes = [
        {"name": c.SPEC_VOLUME, "configMap": {"name": spec_configmap_name(child_name)}},
        {"name": c.DATA_VOLUME, "persistentVolumeClaim": {"claimName": claim_name(run)}},
        {"name": c.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": profile.shared_memory}},
    ]
    # The whole claim at mountPath: the stages' paths (retool.runtime.paths) already carry
    # subPath (<mountPath>/<subPath>/<namespace>/<name>), so mounting the subPath as well would
    # put every file under <subPath>/<subPath>/.
    data_mount: dict[str, Any] = {"name": c.DATA_VOLUME, "mountPath": pvc.mount_path}
    mounts = [
        {"name": c.SPEC_VOLUME, "mountPath": posixpath.dirname(SPEC_MOUNT_PATH), "readOnly": True},
        data_mount,
        {"name": c.SHM_VOLUME, "mountPath": SHM_PATH},
    ]
    return volumes, mounts
