"""What a pass asks of the cluster: create a child, set a suspend, (de)activate a Workload, post an Event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CreateChild:
    stage: str
    attempt: int
    on_cluster: str | None = None
    """The kept Ray cluster the attempt runs on (``cluster_reuse``); None: a child with a cluster of its own."""


@dataclass(frozen=True)
class KeepCluster:
    """Make KubeRay leave the failed attempt's Ray cluster up (``cluster_reuse.keep_patch`` on its RayJob)."""

    stage: str
    rayjob: str
    cluster: str


@dataclass(frozen=True)
class SetSuspend:
    stage: str
    name: str
    suspend: bool


@dataclass(frozen=True)
class SetWorkloadActive:
    """Deactivate (spec.suspend) or reactivate (resume) the Kueue Workload of a queued child."""

    stage: str
    name: str
    active: bool


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str

