"""Admission warnings that need a look at the cluster: a PriorityClass the run names but the cluster lacks.

The API server's Priority admission plugin refuses a pod whose ``priorityClassName`` names no
PriorityClass (plugin/pkg/admission/priority/admission.go: "no PriorityClass with name ... was
found"), so such a run would be admitted and then wait with every stage pod refused. The webhook
says so when the run is applied: kubectl prints it as ``Warning:``. A warning, not a refusal: the
class may be created later (a GitOps sync applies the run and the class in either order).

One GET with a short bound: admission must answer within the webhook's timeout, and a read that
fails (RBAC, a slow API server) costs the warning, never the admission.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from retool_operator.kube import KINDS, KubeClient

log = logging.getLogger(__name__)

PRIORITY_CLASSES = KINDS[("scheduling.k8s.io/v1", "PriorityClass")]
READ_TIMEOUT_SECONDS = 2.0


def named_priority_class(document: Mapping[str, Any]) -> str | None:
    spec = document.get("spec") if isinstance(document.get("spec"), Mapping) else {}
    scheduling = spec.get("scheduling") if isinstance(spec.get("scheduling"), Mapping) else {}
    name = scheduling.get("priorityClassName")
    return name if isinstance(name, str) and name else None


def missing_priority_class_warning(name: str) -> str:
    return (
        f"spec.scheduling.priorityClassName: the cluster has no PriorityClass {name!r}; the API server refuses every pod that names one it lacks, "
        "so each stage will wait with its pods refused until it exists (kubectl get priorityclasses lists those there are)"
    )


async def priority_class_warnings(client: KubeClient, document: Mapping[str, Any], *, timeout: float = READ_TIMEOUT_SECONDS) -> list[str]:
    """[the warning] when the run names a PriorityClass the cluster does not have; [] otherwise or when the read fails."""
    name = named_priority_class(document)
    if name is None:
        return []
    try:
        found = await asyncio.wait_for(client.get(PRIORITY_CLASSES, "", name), timeout=timeout)
    except Exception as err:  # the warning is a courtesy; admission never waits on or fails over it
        log.warning("PriorityClass %s not readable for the admission warning: %s", name, err)
        return []
    return [] if found is not None else [missing_priority_class_warning(name)]
