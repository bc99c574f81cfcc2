"""What a pass asks of the cluster: create a child, set a suspend, (de)activate a Workload, post an Event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CreateChild:
    stage: str
    attempt: int


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

