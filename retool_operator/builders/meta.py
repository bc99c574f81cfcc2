"""Names, labels and owner references shared by every child builder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retool.spec.model import RetoolRun
from retool_operator import constants as c


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


def object_meta(name: str, namespace: str, lbls: dict[str, str]) -> dict[str, Any]:
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
