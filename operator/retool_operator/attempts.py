"""Attempts and pods (pure): when the next attempt of a stage may start, and what a failed one leads to.

Attempts never overlap: a child (the next stage, or the next attempt of the same stage) is created
only once no pod of any earlier child of the run is still alive. A RayJob's cluster lingers for
``clusterGraceSeconds`` and its pods take their termination grace period; a retry that started
meanwhile would write the same checkpoint directory as the attempt it replaces and wait for the
same accelerators. A failed attempt is retried with doubling backoff while the failure policy
allows, never when the child's own policy says every attempt would fail the same way.
"""

from __future__ import annotations

import datetime as dt

from retool.spec.model import RetoolRun
from retool.spec.status import StageStatus
from retool_operator import constants as c
from retool_operator.actions import Event
from retool_operator.status import rfc3339

RELEASE_POLL_SECONDS = 5.0
"""How often a pass re-checks pods that must terminate before the next child is created."""


def backoff_seconds(run: RetoolRun, failed_attempt: int) -> int:
    """backoffSeconds before the first retry, doubled for each further one."""
    return run.spec.failure_policy.backoff_seconds * 2 ** (failed_attempt - 1)


def blocking_pods(active: dict[str, list[str]], submitters: dict[str, list[str]], child: str) -> dict[str, list[str]]:
    """Pods of other children of the run that are still alive (they must be gone before ``child`` is created).

    A Ray job submitter pod never blocks: when a child is created every earlier RayJob is terminal,
    and KubeRay keeps a terminal RayJob's submitter Job (rayjob_controller.go v1.7.0, "We don't need
    to delete the submitter Kubernetes Job"). Its pod may still run (a hung ``ray job logs
    --follow``, or a replacement pod waiting forever for the deleted head's GCS); it holds no
    accelerator and writes no checkpoint, so waiting for it could only hang the next attempt.
    """
    out: dict[str, list[str]] = {}
    for name, pods in sorted(active.items()):
        left = [p for p in pods if p not in set(submitters.get(name, ()))]
        if name != child and left:
            out[name] = left
    return out


def waiting_text(blocking: dict[str, list[str]]) -> str:
    parts = [f"{name} ({', '.join(pods[:3])}{', ...' if len(pods) > 3 else ''})" for name, pods in blocking.items()]
    return "waiting for the pods of " + "; ".join(parts) + " to terminate"


PERMISSION_DENIED = ("Permission denied", "EACCES", "[Errno 13]")


def claim_permission_hint(run: RetoolRun, detail: str) -> str:
    """A hint when a stage could not write the run's claim: ``fsGroup`` is a no-op on many ReadWriteMany
    drivers (NFS, most CSI file drivers without ``fsGroupPolicy: File``), so the volume keeps its
    owner and the trainer's uid cannot write it."""
    if not any(marker in detail for marker in PERMISSION_DENIED):
        return ""
    mount = run.spec.storage.pvc.mount_path
    return (
        f" (a write under {mount} was denied: the claim's volume driver may ignore the pod's fsGroup, as many ReadWriteMany drivers do; "
        "make the volume writable by the trainer image's group, e.g. chgrp/chmod g+w its root once, or use a storage class whose CSI driver applies fsGroup)"
    )


def failed_attempt(run: RetoolRun, entry: StageStatus, reason: str, now: dt.datetime, *, permanent: bool = False) -> tuple[StageStatus, str, Event, float | None]:
    """A failed attempt: Retrying with backoff while retries are left, else Failed; a permanent
    failure (one every attempt would repeat) fails the stage at once."""
    name = entry.name
    failed_attempts = entry.attempt - (entry.preempted_attempts or 0)  # attempts a queue preempted use no retry
    retries_left = run.spec.failure_policy.max_retries - (failed_attempts - 1)
    if permanent:
        text = f"attempt {entry.attempt} failed: {reason}; not retried (it would fail the same way)"
        updated = entry.model_copy(update={"state": "Failed", "completion_time": rfc3339(now), "message": text})
        return updated, f"stage {name} failed: {text}", Event("Warning", c.REASON_STAGE_FAILED, f"stage {name} failed: {text}"), None
    if retries_left > 0:
        wait = backoff_seconds(run, failed_attempts)
        due = now + dt.timedelta(seconds=wait)
        text = f"attempt {entry.attempt} failed: {reason}; retrying in {wait}s ({retries_left} retr{'y' if retries_left == 1 else 'ies'} left)"
        updated = entry.model_copy(update={"state": "Retrying", "next_attempt_time": rfc3339(due), "message": text})
        return updated, f"stage {name} {text}", Event("Warning", c.REASON_STAGE_RETRYING, f"stage {name} {text}"), float(wait)
    text = f"attempt {entry.attempt} failed: {reason}; no retries left (maxRetries {run.spec.failure_policy.max_retries})"
    updated = entry.model_copy(update={"state": "Failed", "completion_time": rfc3339(now), "message": text})
    return updated, f"stage {name} failed: {text}", Event("Warning", c.REASON_STAGE_FAILED, f"stage {name} failed: {text}"), None
