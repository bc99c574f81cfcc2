"""Who owns a stage child's ``spec.suspend``: Kueue or the operator (pure; one rule, one home).

The child decides, never the run's current spec: a child carries ``kueue.x-k8s.io/queue-name``
when the run named a queue at its creation, or when Kueue's defaulting webhook labelled it
(``ApplyDefaultLocalQueue``: a LocalQueue named ``default`` in the namespace,
pkg/controller/jobframework/defaults.go, Kueue v0.19.0); with ``manageJobsWithoutQueueName`` Kueue
manages an unlabelled child too (``ApplyDefaultForSuspend`` suspends it at creation) and makes a
Workload for it. Either way Kueue suspends and unsuspends the child, and its job reconciler starts
an admitted job that anyone else suspended, so the operator must not write ``suspend`` of such a
child: a run's ``spec.suspend`` deactivates the child's Workload instead (and resuming reactivates
only Workloads the operator deactivated). Editing ``queueName`` mid-run changes only the children
created afterwards.

A Workload Kueue deactivates itself (``waitForPodsReady``'s requeue limit:
``triggerDeactivation`` in pkg/controller/core/workload_controller.go, v0.19.0, sets
``spec.active: false`` with a ``DeactivationTarget`` condition, then evicts it with reason
``Deactivated``) is never admitted again unless someone reactivates it: the attempt ends, with
Kueue's words as the reason, so the run's retries and its Failed phase apply instead of a stage
that waits in Queued forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retool_operator import constants as c
from retool_operator.builders.scheduling import KUEUE_QUEUE_LABEL

ANNOTATION_SUSPENDED = "retool.dev/suspended-by"
"""On a child whose ``spec.suspend`` the operator set (spec.suspend of a run outside Kueue): only such
a child is resumed by the operator."""
SUSPENDED_BY = "retool-operator"


def child_queue(obj: dict[str, Any] | None) -> str | None:
    """The Kueue LocalQueue the child was handed to (its own label), or None."""
    return (((obj or {}).get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL) or None


def kueue_owns(obj: dict[str, Any] | None, workloads: list[dict[str, Any]] | None) -> bool:
    """Whether Kueue manages the child: it carries a queue label, or Kueue made a Workload for it."""
    return child_queue(obj) is not None or bool(workloads)


def suspended_by_operator(obj: dict[str, Any] | None) -> bool:
    return ((obj or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_SUSPENDED) == SUSPENDED_BY


def deactivated_by_operator(workload: dict[str, Any]) -> bool:
    return bool(((workload.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_DEACTIVATED))


@dataclass(frozen=True)
class Deactivation:
    workload: str
    reason: str
    message: str


def kueue_deactivation(workloads: list[dict[str, Any]] | None) -> Deactivation | None:
    """A Workload of the child that Kueue (not the operator) deactivated, with Kueue's reason."""
    for wl in workloads or []:
        if (wl.get("spec") or {}).get("active") is not False or deactivated_by_operator(wl):
            continue
        conditions = {cond.get("type"): cond for cond in (wl.get("status") or {}).get("conditions") or []}
        cause = conditions.get("DeactivationTarget") or conditions.get("Evicted") or {}
        reason = cause.get("reason") or "Deactivated"
        message = cause.get("message") or "the workload is deactivated"
        return Deactivation(wl["metadata"]["name"], reason, message)
    return None


EVICTION_CONDITIONS = frozenset({"Evicted", "Preempted"})
"""Workload conditions Kueue sets only on a Workload it had admitted and then took back (``SetEvictedCondition``,
``SetPreemptedCondition``, pkg/workload/workload.go, Kueue v0.19.0)."""


def was_evicted(workloads: list[dict[str, Any]] | None) -> bool:
    """Whether Kueue took an admission back from the child (a preemption), rather than holding it since its creation.

    A child Kueue captured at creation (the namespace's ``default`` LocalQueue, or
    ``manageJobsWithoutQueueName``) is suspended before it ever ran: its Workload has never been
    evicted, and that is no preemption. Without Kueue's Workload API (None) nothing can be told apart
    and the suspension of a running child counts as one.
    """
    if workloads is None:
        return True
    return any(cond.get("type") in EVICTION_CONDITIONS for wl in workloads for cond in (wl.get("status") or {}).get("conditions") or [])


def queue_message(queue: str | None, workloads: list[dict[str, Any]] | None) -> str:
    """Why a queued child waits: Kueue's own words from its Workload when there is one."""
    where = f"Kueue queue {queue}" if queue else "Kueue"
    if workloads is None:
        return f"waiting for admission by {where}, but the cluster serves no Kueue Workload API (is Kueue installed?)"
    for wl in workloads:
        for cond in (wl.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("QuotaReserved", "Admitted") and cond.get("status") == "False" and cond.get("message"):
                return f"waiting for admission by {where}: {cond['message']}"
    return f"waiting for admission by {where}"
