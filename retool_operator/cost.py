"""What a run has used: device-hours per stage and attempt, from its pods' real times (pure).

A device-hour is one device (the hardware profile's device resource: ``nvidia.com/gpu``, an
Ascend resource) held for one hour. A pod holds its devices from the moment the scheduler binds
it to a node (its ``PodScheduled`` condition turning True: the kubelet admits it and the devices
are allocated to it from then on) until its last container terminates (``finishedAt``); a pod
that is deleted while it runs holds them until it is gone. Those are the times the kubelet and
the scheduler write, not the operator's guesses.

Pods are short-lived records (KubeRay deletes a finished RayJob's cluster), so the figures are
kept in the run's status as a ledger, level-triggered like the rest of the status:

- ``cost.pods``: the stage pods holding devices that the API server still has, with their
  scheduled and end times;
- when a pass no longer finds a pod, its device-hours (to its end time, or to that pass when it
  vanished while running: at most one resync, 30 s by default, too many) are added to its
  attempt's ``settledDeviceHours`` and the pod leaves the ledger. The ledger is bounded by the
  pods that exist.

An attempt is *lost* when it did not give its stage its result: an attempt a later one replaced
(a failure, a preemption, a status-check timeout) and the last attempt of a failed stage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from retool.spec.status import AttemptCost, CostStatus, PodDeviceUse, RetoolRunStatus
from retool_operator import constants as c
from retool_operator.cluster_reuse import ANNOTATION_ATTEMPT_SINCE
from retool_operator.status import parse_time


def pod_devices(pod: dict[str, Any], device_resource: str) -> int:
    """Devices a pod requests: ``device_resource`` summed over its containers (requests, else limits:
    an extended resource's request defaults to its limit and must equal it)."""
    if not device_resource:
        return 0
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(device_resource, (resources.get("limits") or {}).get(device_resource))
        if value is not None and str(value).isdigit():
            total += int(str(value))
    return total


def scheduled_time(pod: dict[str, Any]) -> str | None:
    """When the scheduler bound the pod (its PodScheduled condition's last transition to True)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return cond.get("lastTransitionTime")
    return None


def end_time(pod: dict[str, Any]) -> str | None:
    """When the pod's last container terminated, once the pod is Succeeded or Failed (None before)."""
    st = pod.get("status") or {}
    if st.get("phase") not in ("Succeeded", "Failed"):
        return None
    finished = [
        (s.get("state") or {}).get("terminated", {}).get("finishedAt")
        for s in (st.get("containerStatuses") or [])
        if ((s.get("state") or {}).get("terminated") or {}).get("finishedAt")
    ]
    return max(finished, key=parse_time) if finished else None


def pod_use(pod: dict[str, Any], device_resource: str) -> PodDeviceUse | None:
    """The ledger entry of one stage pod; None for a pod without devices, not yet scheduled, or not a stage attempt's."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    stage, attempt = labels.get(c.LABEL_STAGE), labels.get(c.LABEL_ATTEMPT) or ""
    devices = pod_devices(pod, device_resource)
    scheduled = scheduled_time(pod)
    if not stage or not attempt.isdigit() or int(attempt) < 1 or devices < 1 or not scheduled or not meta.get("uid"):
        return None
    since = ((meta.get("annotations") or {}).get(ANNOTATION_ATTEMPT_SINCE)) or None
    return PodDeviceUse(
        name=meta.get("name", "?"), uid=meta["uid"], stage=stage, attempt=int(attempt), devices=devices, scheduled_time=scheduled, end_time=end_time(pod), since_time=since
    )


def hours(use: PodDeviceUse, until: dt.datetime) -> float:
    """Device-hours of one pod for its attempt: devices x (end, else ``until``, minus scheduled, or the time
    the attempt took the pod over when that is later)."""
    end = parse_time(use.end_time) if use.end_time else until
    start = max(parse_time(use.scheduled_time), parse_time(use.since_time)) if use.since_time else parse_time(use.scheduled_time)
    seconds = max(0.0, (end - start).total_seconds())
    return use.devices * seconds / 3600.0


def _lost(status: RetoolRunStatus, stage: str, attempt: int) -> bool:
    entry = next((s for s in status.stages if s.name == stage), None)
    if entry is None:
        return False
    return attempt < entry.attempt or (attempt == entry.attempt and entry.state == "Failed")


def account(
    status: RetoolRunStatus,
    previous: CostStatus | None,
    pods: Iterable[dict[str, Any]] | None,
    *,
    device_resource: str,
    now: dt.datetime,
    price: float | None = None,
    currency: str | None = None,
) -> CostStatus | None:
    """The run's cost after this pass: ``previous`` (the status's) with ``pods`` (every stage pod of the
    run the API server has now; None when they were not read this pass: the ledger is kept as it is).

    None while nothing has held a device and no price is set (a CPU run shows no cost section).
    """
    ledger = {use.uid: use for use in (previous.pods if previous else [])}
    settled: dict[tuple[str, int], float] = {(a.stage, a.attempt): a.settled_device_hours for a in (previous.attempts if previous else [])}
    if pods is not None:
        seen: dict[str, PodDeviceUse] = {}
        for pod in pods:
            use = pod_use(pod, device_resource)
            if use is not None:
                known = ledger.get(use.uid)
                if known is not None and known.attempt != use.attempt:
                    # Handed to a later attempt (a retry on the same Ray cluster): the earlier one is settled to the handover.
                    key = (known.stage, known.attempt)
                    settled[key] = settled.get(key, 0.0) + hours(known, parse_time(use.since_time) if use.since_time else now)
                    known = None
                # A pod's end, once seen, stays (a pod object is not rewritten after it terminates).
                seen[use.uid] = use if known is None or use.end_time else use.model_copy(update={"end_time": known.end_time})
        for uid, use in ledger.items():
            if uid not in seen:  # gone: settled to its end, or to now when it vanished while it ran
                key = (use.stage, use.attempt)
                settled[key] = settled.get(key, 0.0) + hours(use, now)
        ledger = seen
    live: dict[tuple[str, int], float] = {}
    for use in ledger.values():
        key = (use.stage, use.attempt)
        live[key] = live.get(key, 0.0) + hours(use, now)
    keys = sorted(set(settled) | set(live), key=lambda k: (_stage_order(status, k[0]), k[1]))
    if not keys and price is None:
        return None
    attempts = [
        AttemptCost(
            stage=stage,
            attempt=attempt,
            device_hours=round(settled.get((stage, attempt), 0.0) + live.get((stage, attempt), 0.0), 3),
            settled_device_hours=round(settled.get((stage, attempt), 0.0), 6),
            lost=_lost(status, stage, attempt),
        )
        for stage, attempt in keys
    ]
    total = sum(settled.values()) + sum(live.values())
    stages: dict[str, float] = {}
    for a in attempts:
        stages[a.stage] = round(stages.get(a.stage, 0.0) + a.device_hours, 3)
    per_point = total / (status.score * 100.0) if status.score and status.score > 0 else None
    return CostStatus(
        device_hours=round(total, 3),
        lost_device_hours=round(sum(a.device_hours for a in attempts if a.lost), 3),
        device_hours_per_point=round(per_point, 3) if per_point is not None else None,
        price_per_device_hour=price,
        currency=currency if price is not None else None,
        amount=round(total * price, 2) if price is not None else None,
        stages=stages,
        attempts=attempts,
        pods=sorted(ledger.values(), key=lambda u: (u.stage, u.attempt, u.name)),
    )


def _stage_order(status: RetoolRunStatus, stage: str) -> int:
    names = [s.name for s in status.stages]
    return names.index(stage) if stage in names else len(names)


def ended_text(cost: CostStatus | None) -> str:
    """One line for a finished run's event and log: the total, what was lost, the money when priced."""
    if cost is None:
        return ""
    text = f"{cost.device_hours:g} device-hours"
    if cost.lost_device_hours:
        text += f" ({cost.lost_device_hours:g} on lost attempts)"
    if cost.amount is not None:
        text += f", {cost.amount:.2f} {cost.currency or ''}".rstrip()
    if cost.device_hours_per_point is not None:
        text += f", {cost.device_hours_per_point:g} device-hours per eval point"
    return text


ENDED_STATES = ("Succeeded", "Failed", "Retrying")


def attempt_ended(old: RetoolRunStatus, new: RetoolRunStatus) -> bool:
    """Whether this pass ended a stage attempt (or the run): the moments the cost goes to MLflow."""

    def ended(status: RetoolRunStatus) -> set[tuple[str, int, str]]:
        return {(s.name, s.attempt, s.state) for s in status.stages if s.state in ENDED_STATES}

    return bool(ended(new) - ended(old))


def figures(cost: CostStatus) -> dict[str, float]:
    """The cost as MLflow metrics of the parent run (``cost/...``), for the UI and ``retool compare``."""
    out = {"cost/device_hours": cost.device_hours, "cost/lost_device_hours": cost.lost_device_hours}
    out.update({f"cost/{stage}_device_hours": value for stage, value in cost.stages.items()})
    if cost.device_hours_per_point is not None:
        out["cost/device_hours_per_point"] = cost.device_hours_per_point
    if cost.amount is not None:
        out["cost/amount"] = cost.amount
    return out
