"""Pure checks of the run's claim as the API server has it: can the first stage start on it?

Read before the first stage (and only then: a running run is never failed over a read of its
claim). A multi-node run needs ReadWriteMany — the Ray workers on other nodes read what the head
writes — and a claim that cannot give it fails the run at once, before any accelerator is
requested, instead of leaving worker pods stuck on a volume that cannot attach twice. The access
modes are the bound volume's (``status.accessModes``) once the claim is bound, else the requested
ones (a claim of a WaitForFirstConsumer class stays Pending until its first pod, so Bound cannot be
waited for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from retool.spec.model import RetoolRun
from retool.spec.status import StorageStatus
from retool_operator import constants as c
from retool_operator.builders.storage import Claim

RWX = "ReadWriteMany"


@dataclass(frozen=True)
class ClaimObservation:
    """The run's claim as resolved from the spec and config, and as read from the API (None: absent)."""

    claim: Claim
    obj: dict[str, Any] | None


@dataclass(frozen=True)
class ClaimCheck:
    state: Literal["ready", "waiting", "failed"]
    reason: str
    message: str
    recheck_seconds: float | None = None
    """How soon a waiting check looks again (None: the default claim recheck)."""


def access_modes(obj: dict[str, Any]) -> list[str]:
    """The bound volume's access modes, else the claim's requested ones."""
    status = obj.get("status") or {}
    return list(status.get("accessModes") or (obj.get("spec") or {}).get("accessModes") or [])


def check_claim(run: RetoolRun, seen: ClaimObservation) -> ClaimCheck:
    name, nodes = seen.claim.name, run.spec.hardware.nodes
    if seen.obj is None:
        if seen.claim.managed:
            return ClaimCheck("waiting", c.REASON_CLAIM_PENDING, f"creating PersistentVolumeClaim {name}")
        return ClaimCheck(
            "waiting",
            c.REASON_CLAIM_NOT_FOUND,
            f"PersistentVolumeClaim {name} (spec.storage.pvc.claimName) does not exist in the run's namespace; create it, "
            "or leave claimName unset to have the operator create one",
        )
    if (seen.obj.get("metadata") or {}).get("deletionTimestamp"):
        return ClaimCheck("waiting", c.REASON_CLAIM_NOT_FOUND, f"PersistentVolumeClaim {name} is being deleted")
    modes = access_modes(seen.obj)
    if nodes > 1 and RWX not in modes:
        return ClaimCheck(
            "failed",
            c.REASON_CLAIM_NOT_SHARED,
            f"PersistentVolumeClaim {name} has access modes {', '.join(modes) or 'none'}, but hardware.nodes is {nodes}: pods on every node "
            f"mount it at once (the Ray workers read what the head writes), which needs {RWX}. Use a claim of a {RWX} storage class "
            "(NFS, CephFS, Lustre, a cloud file store), or leave claimName unset and set storage.pvc.storageClassName to one",
        )
    phase = (seen.obj.get("status") or {}).get("phase")
    return ClaimCheck("ready", c.REASON_CLAIM_READY, f"PersistentVolumeClaim {name} ({', '.join(modes)}{', ' + phase if phase else ''})")


def storage_status(run: RetoolRun, seen: ClaimObservation) -> StorageStatus:
    """status.storage: the claim as requested, and as the API server reports it once it exists."""
    claim, obj = seen.claim, seen.obj or {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    size = (status.get("capacity") or {}).get("storage") or ((spec.get("resources") or {}).get("requests") or {}).get("storage") or claim.size
    return StorageStatus(
        claim_name=claim.name,
        managed=claim.managed,
        retain=run.spec.storage.retain if claim.managed else None,
        size=str(size) if size is not None else None,
        storage_class_name=spec.get("storageClassName") or claim.storage_class_name,
        access_modes=access_modes(obj) if obj else list(claim.access_modes),
        phase=status.get("phase"),
    )


def extra_claim_names(run: RetoolRun) -> list[tuple[str, bool]]:
    """(claim name, mounted read-only) of every ``spec.pods.volumes`` entry backed by a claim."""
    out = []
    for volume in run.spec.pods.volumes:
        source = volume.persistent_volume_claim
        if source is not None:
            out.append((source.claim_name, bool(source.read_only or volume.read_only)))
    return out


def check_extra_claims(run: RetoolRun, claims: dict[str, dict[str, Any] | None]) -> ClaimCheck | None:
    """The first problem of the run's extra claims (``spec.pods.volumes``), or None when they can be mounted.

    They are mounted in every trainer pod, so a multi-node run needs each of them shareable across
    nodes: ReadWriteMany, or ReadOnlyMany for a read-only mount. A missing claim holds the run.
    """
    nodes = run.spec.hardware.nodes
    for name, read_only in extra_claim_names(run):
        obj = claims.get(name)
        if obj is None:
            return ClaimCheck("waiting", c.REASON_CLAIM_NOT_FOUND, f"PersistentVolumeClaim {name} (spec.pods.volumes) does not exist in the run's namespace")
        modes = access_modes(obj)
        shared = {RWX, "ReadOnlyMany"} if read_only else {RWX}
        if nodes > 1 and not shared & set(modes):
            need = f"{RWX} or ReadOnlyMany" if read_only else RWX
            return ClaimCheck(
                "failed",
                c.REASON_CLAIM_NOT_SHARED,
                f"PersistentVolumeClaim {name} (spec.pods.volumes) has access modes {', '.join(modes) or 'none'}, but hardware.nodes is {nodes}: "
                f"every trainer pod mounts it, on every node, which needs {need}",
            )
    return None
