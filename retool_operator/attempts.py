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
    # attempts a queue preempted, and those KubeRay lost track of (``status_check_timeout``), use no retry
    failed_attempts = entry.attempt - (entry.preempted_attempts or 0) - (entry.status_check_timeouts or 0)
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


STATUS_CHECK_TIMEOUT = "JobStatusCheckTimeoutExceeded"
"""KubeRay >= 1.7 fails a RayJob whose Ray dashboard could not be polled for
``RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS`` (default 300): ``checkJobStatusCheckTimeoutAndUpdateStatusIfNeeded``
in ray-operator/controllers/ray/rayjob_controller.go (v1.7.0, ray-project/kuberay PR #4916) sets
jobDeploymentStatus Failed, this reason, and a message "Job status checks have been failing since ...";
the constant is ``rayv1.JobStatusCheckTimeoutExceeded`` in ray-operator/apis/ray/v1/rayjob_types.go. KubeRay
itself never retries such a RayJob (its backoffLimit skips it: "not eligible for retry")."""
MAX_STATUS_CHECK_TIMEOUTS = 3
"""Status-check timeouts one stage may have without using a retry: a dashboard that can never be polled
(a NetworkPolicy, a head that cannot serve it) must not hold accelerators forever."""


def status_check_timeout(run: RetoolRun, entry: StageStatus, detail: str, now: dt.datetime) -> tuple[StageStatus, str, Event, float] | None:
    """A RayJob KubeRay failed because it could not poll the Ray dashboard (``STATUS_CHECK_TIMEOUT``):
    nobody knows whether the training failed, so the stage goes Retrying on a fresh Ray cluster (the
    next attempt resumes from the last checkpoint: resume_mode auto in the sft and rl recipes) after
    the first-retry backoff, using no retry; None once the stage has had ``MAX_STATUS_CHECK_TIMEOUTS``
    (the failure is then counted as any other)."""
    seen = entry.status_check_timeouts or 0
    if seen >= MAX_STATUS_CHECK_TIMEOUTS:
        return None
    wait = backoff_seconds(run, 1)
    due = now + dt.timedelta(seconds=wait)
    text = (
        f"attempt {entry.attempt}: KubeRay could not poll its Ray job's status and gave up ({STATUS_CHECK_TIMEOUT}: {detail}); "
        f"this is not counted as a training failure: retrying on a fresh Ray cluster in {wait}s, resuming from the last checkpoint "
        f"(no retry used; {seen + 1} of {MAX_STATUS_CHECK_TIMEOUTS} such retries)"
    )
    updated = entry.model_copy(update={"state": "Retrying", "next_attempt_time": rfc3339(due), "message": text, "status_check_timeouts": seen + 1})
    message = f"stage {entry.name} {text}"
    return updated, message, Event("Warning", c.REASON_STATUS_CHECK_TIMEOUT, message), float(wait)
