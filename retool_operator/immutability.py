"""What the operator does with an edit it must not act on (pure; the webhook's rule, enforced without it).

The admission webhook refuses edits to the inputs of stages that already started
(``webhook.update_problems``), but the chart runs without it where no certificate source exists, and
an edit can also make the spec invalid. The operator then keeps acting on the spec it last accepted,
which is the snapshot of the latest child (``builders.run_spec``): running children are observed as
before (their success, failure, preemption and suspension still reach the status), nothing new is
created, and the status says why (SpecValid=False, Stalled=True, a Warning Event) until the edit is
reverted. A run none of whose stages started has no accepted spec: an invalid one ends in Failed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import yaml

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator import constants as c
from retool_operator.builders.run_spec import spec_configmap_name
from retool_operator.status import set_condition
from retool_operator.webhook import update_problems


def needs_check(generation: int | None, status: RetoolRunStatus) -> bool:
    """Whether a pass compares the spec with the accepted one: the spec changed since the status was
    written, or an edit is still held (a held edit keeps observedGeneration moving, so look again)."""
    if generation is not None and generation != status.observed_generation:
        return True
    return any(cond.type == c.COND_VALID and cond.status == "False" for cond in status.conditions)


def latest_child(status: RetoolRunStatus) -> str | None:
    """The child whose snapshot holds the spec the operator last acted on (the latest one created)."""
    latest: StageStatus | None = None
    for entry in status.stages:
        if entry.job and entry.attempt > 0:
            latest = entry
    return latest.job if latest else None


def snapshot_name(status: RetoolRunStatus) -> str | None:
    child = latest_child(status)
    return spec_configmap_name(child) if child else None


def accepted_document(configmap: Mapping[str, Any] | None, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The accepted run: the snapshot's spec with the live object's metadata (uid, generation)."""
    text = ((configmap or {}).get("data") or {}).get(c.SPEC_KEY)
    if not text:
        return None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        return None
    return {**{k: v for k, v in body.items() if k not in ("spec", "status")}, "spec": doc["spec"]}


def refused_edits(accepted: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """The edits of ``body`` to inputs of stages that started (per its status), against ``accepted``."""
    return update_problems({"spec": accepted.get("spec"), "status": body.get("status") or {}}, body)


def held_status(status: RetoolRunStatus, problems: list[str], *, reason: str, now: dt.datetime, generation: int | None) -> RetoolRunStatus:
    """``status`` (computed from the accepted spec) with the held edit: SpecValid=False and Stalled=True naming it."""
    message = "spec edit not applied: " + "; ".join(problems) + "; running stages go on with the spec they started with, nothing new starts until it is reverted"
    message = message[:4000]
    conds = set_condition(status.conditions, type_=c.COND_VALID, status=False, reason=reason, message=message, now=now, generation=generation)
    conds = set_condition(conds, type_=c.COND_STALLED, status=True, reason=reason, message=message, now=now, generation=generation)
    conds = set_condition(conds, type_=c.COND_READY, status=False, reason=reason, message=message, now=now, generation=generation)
    conds = set_condition(conds, type_=c.COND_RECONCILING, status=False, reason=reason, message="", now=now, generation=generation)
    return status.model_copy(update={"conditions": conds, "message": message[:1024]})


def scheduling_change(accepted: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    """What an edit of ``spec.scheduling`` after a child exists does, in one line; None when it did not change.

    ``spec.scheduling`` is not frozen (a queue can be renamed or a priority raised while a run waits),
    but a child keeps the queue label, priority and gang settings it was created with: Kueue's
    webhook refuses a change of ``kueue.x-k8s.io/queue-name`` on a job that is not suspended
    (``ValidateJobOnUpdate``, pkg/controller/jobframework/validation.go, Kueue v0.19.0), and the
    operator never patches a child's scheduling. So the edit reaches only the children created
    afterwards (the next stage, the next attempt), and the run says so in an Event.
    """
    before = (accepted.get("spec") or {}).get("scheduling") or {}
    after = (body.get("spec") or {}).get("scheduling") or {}
    if before == after:
        return None
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    fields = ", ".join(f"spec.scheduling.{k}" for k in changed)
    return f"{fields} changed after a stage started: the existing child keeps what it was created with; the next stage or attempt uses the new value"
