"""The decision function: (run, current status, observed children, now) -> next status and actions.

Pure and level-triggered: it never remembers anything between calls except what is in the status
and in the children, so running it twice, after a crash or after an operator restart gives the
same answer. Child names are deterministic (``<run>-<stage>-<attempt>``), so "create" on a child
that already exists is a no-op for the handler (409 = already there).

Attempts never overlap: a child (the next stage, or the next attempt of the same stage) is
created only once no pod of any earlier child of the run is still alive (``Observed.active_pods``).
A RayJob's cluster lingers for ``clusterGraceSeconds`` and its pods take their termination grace
period; a retry that started meanwhile would write the same checkpoint directory as the attempt
it replaces and wait for the same accelerators.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, STAGES, sandbox_url, stage_child_name
from retool.spec.status import Condition, MLflowStatus, RetoolRunStatus, SandboxIsolationStatus, SandboxStatus, StageStatus
from retool_operator import constants as c
from retool_operator.builders import desired_sandbox_replicas, queued, run_namespace, uses_sandbox
from retool_operator.claims import ClaimCheck, ClaimObservation, check_claim, storage_status
from retool_operator.isolation import IsolationObservation, isolation_condition
from retool_operator.status import current_stage, headline_score, parse_time, phase_of, pipeline_conditions, progress_of, rfc3339, set_condition

ChildState = Literal["missing", "running", "succeeded", "failed", "suspended"]


@dataclass(frozen=True)
class ChildOutcome:
    state: ChildState
    message: str = ""
    permanent: bool = False
    """A failure every further attempt would repeat (the child's own failure policy said so): no retries."""


JOB_FAILED_BY_POLICY = "PodFailurePolicy"
"""Reason of a Job's Failed condition when a ``podFailurePolicy`` FailJob rule matched (the preflight's
deterministic exit codes)."""


# KubeRay's terminal jobDeploymentStatus values: Complete and Failed end the RayJob, and
# ValidationFailed is where KubeRay leaves a RayJob whose spec it refuses (it never retries it).
RAYJOB_FAILED_STATES = frozenset({"Failed", "ValidationFailed"})
RELEASE_POLL_SECONDS = 5.0
"""How often a pass re-checks pods that must terminate before the next child is created."""


def rayjob_outcome(obj: dict[str, Any] | None) -> ChildOutcome:
    """KubeRay semantics: success is jobDeploymentStatus Complete AND jobStatus SUCCEEDED, nothing less."""
    if obj is None:
        return ChildOutcome("missing")
    st = obj.get("status") or {}
    deployment, job = st.get("jobDeploymentStatus"), st.get("jobStatus")
    detail = " ".join(x for x in (st.get("reason"), st.get("message")) if x)
    if deployment == "ValidationFailed":
        return ChildOutcome("failed", "KubeRay refused the RayJob (ValidationFailed)" + (f": {detail}" if detail else ""))
    if deployment == "Complete":
        if job == "SUCCEEDED":
            return ChildOutcome("succeeded", "RayJob completed with jobStatus SUCCEEDED")
        return ChildOutcome("failed", f"RayJob completed with jobStatus {job or 'unknown'}" + (f": {detail}" if detail else ""))
    if deployment == "Failed":
        return ChildOutcome("failed", "RayJob failed" + (f": {detail}" if detail else ""))
    if deployment in ("Suspended", "Suspending"):
        return ChildOutcome("suspended", f"RayJob {deployment.lower()}")
    return ChildOutcome("running", f"RayJob {deployment or 'submitted'}" + (f", job {job}" if job else ""))


def job_outcome(obj: dict[str, Any] | None) -> ChildOutcome:
    """batch/v1 Job: the Complete or Failed condition decides; Suspended while spec.suspend holds."""
    if obj is None:
        return ChildOutcome("missing")
    conditions = {cond.get("type"): cond for cond in (obj.get("status") or {}).get("conditions") or [] if cond.get("status") == "True"}
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return ChildOutcome("succeeded", "Job completed")
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is not None:
        detail = " ".join(x for x in (failed.get("reason"), failed.get("message")) if x)
        return ChildOutcome("failed", "Job failed" + (f": {detail}" if detail else ""), permanent=failed.get("reason") == JOB_FAILED_BY_POLICY)
    if "Suspended" in conditions:
        return ChildOutcome("suspended", "Job suspended")
    return ChildOutcome("running", "Job running")


def child_outcome(stage: str, obj: dict[str, Any] | None) -> ChildOutcome:
    return rayjob_outcome(obj) if stage in RAY_STAGES else job_outcome(obj)


def preempted_job(stage: str, obj: dict[str, Any] | None) -> bool:
    """A batch Job that failed because its queue suspended it (Kueue's preemption).

    The Job controller counts the pods it deletes on suspension as failed, so with backoffLimit 0 a
    preempted Job ends Failed while ``spec.suspend`` is true; it cannot resume, so the stage needs a
    new attempt, but the attempt did not fail. (A preempted RayJob just goes Suspended and resumes.)
    """
    return stage not in RAY_STAGES and obj is not None and bool((obj.get("spec") or {}).get("suspend"))


@dataclass(frozen=True)
class Observed:
    """What the handler read from the cluster for this pass."""

    children: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage child name -> object
    active_pods: dict[str, list[str]] = field(default_factory=dict)
    """Child name -> its pods that have not terminated (phase other than Succeeded/Failed)."""
    failure_details: dict[str, str] = field(default_factory=dict)
    """Failed Job name -> its stage container's termination message (the reason the stage gave, or its last log lines)."""
    sandbox_ready_replicas: int = 0
    sandbox_pods_refused: str | None = None
    """The message of the sandbox Deployment's ReplicaFailure condition (pods refused at creation), if True."""
    mlflow: MLflowStatus | None = None
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    claim: ClaimObservation | None = None  # None: not read this pass (no storage gate)
    workloads: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)
    """Kueue Workloads of a queued child, by child name; None when the cluster serves no Workload API."""
    sandbox_isolation: IsolationObservation | None = None
    """What the sandbox pods' /readyz said this pass; None when there were no pods to ask."""
    reward_suspect: str | None = None
    """The rl stage's reward watch: a message while suspect, "" once cleared; None when not read this pass."""


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


@dataclass
class Decision:
    status: RetoolRunStatus
    sandbox_replicas: int | None
    create: list[CreateChild] = field(default_factory=list)
    suspend: list[SetSuspend] = field(default_factory=list)
    workloads: list[SetWorkloadActive] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def enabled_stages(run: RetoolRun) -> dict[str, bool]:
    spec = run.spec
    return {"prepare": True, "preflight": spec.preflight.enabled, "sft": spec.sft.enabled, "merge": spec.sft.enabled, "rl": spec.rl.enabled, "eval": spec.eval.enabled}


def stage_output(run: RetoolRun, stage: str) -> str:
    """Where a stage leaves its result on the PVC (status.stages[].checkpoint)."""
    paths = run_paths(run)
    return {
        "prepare": paths.data,
        "preflight": paths.stage_files,
        "sft": paths.sft_checkpoints,
        "merge": paths.sft_merged,
        "rl": paths.rl_checkpoints,
        "eval": paths.eval_output,
    }[stage]


def _initial_stages(run: RetoolRun, existing: list[StageStatus]) -> list[StageStatus]:
    by_name = {s.name: s for s in existing}
    enabled = enabled_stages(run)
    out = []
    for name in STAGES:
        entry = by_name.get(name)
        if entry is None or (entry.state == "Skipped" and enabled[name]):
            entry = StageStatus(name=name, state="Pending" if enabled[name] else "Skipped")
        elif not enabled[name] and entry.state == "Pending":
            entry = StageStatus(name=name, state="Skipped")
        out.append(entry)
    return out


def backoff_seconds(run: RetoolRun, failed_attempt: int) -> int:
    """backoffSeconds before the first retry, doubled for each further one."""
    return run.spec.failure_policy.backoff_seconds * 2 ** (failed_attempt - 1)


CLAIM_RECHECK_SECONDS = 30.0
"""How soon a pass waiting for the run's claim looks again (claims are not watched)."""


def _queue_message(run: RetoolRun, workloads: list[dict[str, Any]] | None) -> str:
    """Why a queued child waits: Kueue's own words from its Workload when there is one."""
    queue = run.spec.scheduling.queue_name
    if workloads is None:
        return f"waiting for admission by Kueue queue {queue}, but the cluster serves no Kueue Workload API (is Kueue installed?)"
    for wl in workloads:
        if (wl.get("spec") or {}).get("active") is False and not _ours(wl):
            return f"Kueue workload {wl['metadata']['name']} is deactivated and will not be admitted until it is reactivated"
        for cond in (wl.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("QuotaReserved", "Admitted") and cond.get("status") == "False" and cond.get("message"):
                return f"waiting for admission by Kueue queue {queue}: {cond['message']}"
    return f"waiting for admission by Kueue queue {queue}"


def _ours(workload: dict[str, Any]) -> bool:
    return bool(((workload.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_DEACTIVATED))


def _queued_child(
    run: RetoolRun, entry: StageStatus, child: str, obj: dict[str, Any] | None, workloads: list[dict[str, Any]] | None
) -> tuple[StageStatus, list[SetWorkloadActive], list[Event], str | None]:
    """A running child of a queued run: Kueue owns its ``spec.suspend``; the operator only reads it.

    spec.suspend deactivates the child's Kueue Workload (Kueue then suspends the child and keeps it
    out of the queue) and resuming reactivates only Workloads the operator deactivated. A child
    suspended while the run is not is waiting for admission (Queued); one that had been running is
    preempted, which is counted, never a failure.
    """
    name = entry.name
    actions: list[SetWorkloadActive] = []
    events: list[Event] = []
    message: str | None = None
    if run.spec.suspend:
        actions = [SetWorkloadActive(name, wl["metadata"]["name"], False) for wl in workloads or [] if (wl.get("spec") or {}).get("active") is not False]
        if entry.state != "Suspended":
            message = f"stage {name} suspended (Kueue workload deactivated)"
            events.append(Event("Normal", c.REASON_SUSPENDED, f"{message} ({child})"))
        return entry.model_copy(update={"state": "Suspended", "message": "suspended by spec.suspend"}), actions, events, message
    actions = [SetWorkloadActive(name, wl["metadata"]["name"], True) for wl in workloads or [] if _ours(wl) and (wl.get("spec") or {}).get("active") is False]
    if bool(((obj or {}).get("spec") or {}).get("suspend")):
        update: dict[str, Any] = {"state": "Queued", "message": _queue_message(run, workloads)}
        if entry.state == "Running":
            update["preemptions"] = (entry.preemptions or 0) + 1
            message = f"stage {name} preempted by its queue; waiting for re-admission ({child})"
            events.append(Event("Warning", c.REASON_STAGE_PREEMPTED, message))
        return entry.model_copy(update=update), actions, events, message
    if entry.state in ("Queued", "Suspended"):
        message = f"stage {name} admitted by Kueue queue {run.spec.scheduling.queue_name} ({child})"
        events.append(Event("Normal", c.REASON_STAGE_ADMITTED, message))
    return entry.model_copy(update={"state": "Running", "message": f"attempt {entry.attempt} running"}), actions, events, message


def _blocking_pods(observed: Observed, child: str) -> dict[str, list[str]]:
    """Pods of other children of the run that are still alive (they must be gone before ``child`` is created)."""
    return {name: pods for name, pods in sorted(observed.active_pods.items()) if name != child and pods}


def _waiting_text(blocking: dict[str, list[str]]) -> str:
    parts = [f"{name} ({', '.join(pods[:3])}{', ...' if len(pods) > 3 else ''})" for name, pods in blocking.items()]
    return "waiting for the pods of " + "; ".join(parts) + " to terminate"


def _failed_attempt(
    run: RetoolRun, entry: StageStatus, reason: str, now: dt.datetime, *, permanent: bool = False
) -> tuple[StageStatus, str, Event, float | None]:
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


def _with_isolation(
    conditions: list[Condition],
    status: RetoolRunStatus,
    seen: IsolationObservation | None,
    events: list[Event],
    *,
    now: dt.datetime,
    generation: int | None,
) -> tuple[list[Condition], SandboxIsolationStatus | None]:
    """The SandboxIsolation condition and status.sandbox.isolation from this pass's /readyz reads
    (and a Warning Event when the condition turns False).

    While no replica can be read (scaled to zero, starting, unreachable) the last observation and
    its condition stay: after rl the status still says what isolation rl ran with. Until a first
    observation the condition is Unknown, with the read errors when there were any.
    """
    previous = status.sandbox.isolation if status.sandbox else None
    summary = seen.summary if seen else None
    before = next((cond for cond in conditions if cond.type == c.COND_SANDBOX_ISOLATION), None)
    if summary is None and before is not None and before.status != "Unknown":
        return conditions, previous
    cond = isolation_condition(summary, seen.errors if seen else [])
    conditions = set_condition(
        conditions, type_=c.COND_SANDBOX_ISOLATION, status=cond.status, reason=cond.reason, message=cond.message, now=now, generation=generation
    )
    if cond.status is False and (before is None or before.status != "False" or before.reason != cond.reason):
        events.append(Event("Warning", cond.reason, f"sandbox: {cond.message}"))
    return conditions, summary or previous


def with_reward_suspect(conditions: list[Condition], message: str, events: list[Event], *, now: dt.datetime, generation: int | None) -> list[Condition]:
    """RewardSuspect from the reward watch's state (a message, or "" once cleared), and a Warning Event when it is raised.

    A run whose watch never raised it has no such condition; once raised it stays, False after clearing.
    """
    before = next((cond for cond in conditions if cond.type == c.COND_REWARD_SUSPECT), None)
    suspect = bool(message)
    if not suspect and before is None:
        return conditions
    if suspect and (before is None or before.status != "True"):
        events.append(Event("Warning", c.REASON_REWARD_DISAGREES, f"reward suspect: {message}"))
    reason = c.REASON_REWARD_DISAGREES if suspect else c.REASON_REWARD_AGREES
    text = message if suspect else "the second verifier agrees with the reward again"
    return set_condition(conditions, type_=c.COND_REWARD_SUSPECT, status=suspect, reason=reason, message=text, now=now, generation=generation)


def decide(run: RetoolRun, status: RetoolRunStatus, observed: Observed, now: dt.datetime, *, sandbox_autoscaled: bool = False) -> Decision:
    """The next status and the actions that get the cluster there.

    ``sandbox_autoscaled``: an HPA manages the sandbox's replicas (the decision leaves them alone).
    """
    stamp = rfc3339(now)
    suspend = run.spec.suspend
    queue = queued(run)
    stages = _initial_stages(run, status.stages)
    create: list[CreateChild] = []
    suspend_actions: list[SetSuspend] = []
    workload_actions: list[SetWorkloadActive] = []
    events: list[Event] = []
    requeue: float | None = None
    message = status.message
    waiting: str | None = None
    # The claim is checked until the first stage starts: a multi-node run on a claim that cannot be
    # shared fails here, before anything requests an accelerator.
    claim_check: ClaimCheck | None = None
    if observed.claim is not None and not any(s.attempt > 0 for s in stages):
        claim_check = check_claim(run, observed.claim)
    first_created = "Queued" if queue else "Running"

    for i, entry in enumerate(stages):
        if entry.state in ("Succeeded", "Skipped"):
            continue
        if entry.state == "Failed":
            break
        name = entry.name
        if entry.attempt == 0:
            if suspend:
                break
            if claim_check is not None and claim_check.state != "ready":
                if claim_check.state == "failed":
                    stages[i] = entry.model_copy(update={"state": "Failed", "completion_time": stamp, "message": f"not started: {claim_check.message}"})
                    message = f"stage {name} not started: {claim_check.message}"
                    events.append(Event("Warning", claim_check.reason, claim_check.message))
                else:
                    stages[i] = entry.model_copy(update={"message": claim_check.message})
                    message = claim_check.message
                    requeue = CLAIM_RECHECK_SECONDS
                break
            child = stage_child_name(run.metadata.name, name, 1)
            blocking = _blocking_pods(observed, child)
            if blocking:
                waiting = _waiting_text(blocking)
                stages[i] = entry.model_copy(update={"message": f"attempt 1 {waiting}"})
                requeue = RELEASE_POLL_SECONDS
                break
            text = "attempt 1 created; " + _queue_message(run, []) if queue else "attempt 1 started"
            stages[i] = entry.model_copy(
                update={"state": first_created, "attempt": 1, "job": child, "start_time": stamp, "message": text, "checkpoint": stage_output(run, name)}
            )
            create.append(CreateChild(name, 1))
            message = f"stage {name} started ({child})"
            events.append(Event("Normal", c.REASON_STAGE_STARTED, message))
            break
        if entry.state == "Retrying":
            due = parse_time(entry.next_attempt_time) or now
            if suspend:
                break
            if now < due:
                requeue = (due - now).total_seconds()
                break
            attempt = entry.attempt + 1
            child = stage_child_name(run.metadata.name, name, attempt)
            blocking = _blocking_pods(observed, child)
            if blocking:
                waiting = _waiting_text(blocking)
                text = f"attempt {attempt} {waiting}"
                if entry.message != text:
                    events.append(Event("Normal", c.REASON_WAITING_FOR_PODS, f"stage {name}: {text}"))
                stages[i] = entry.model_copy(update={"message": text})
                requeue = RELEASE_POLL_SECONDS
                break
            text = f"attempt {attempt} created; " + _queue_message(run, []) if queue else f"attempt {attempt} started"
            stages[i] = entry.model_copy(update={"state": first_created, "attempt": attempt, "job": child, "next_attempt_time": None, "message": text})
            create.append(CreateChild(name, attempt))
            message = f"stage {name} retry: attempt {attempt} started ({child})" + (", resuming from its last checkpoint" if name == "rl" else "")
            events.append(Event("Normal", c.REASON_RETRY_STARTED, message))
            break
        # Running, Queued or Suspended: the child decides.
        child = entry.job or stage_child_name(run.metadata.name, name, entry.attempt)
        obj = observed.children.get(child)
        outcome = child_outcome(name, obj)
        if outcome.state == "missing":
            # The status names a child only after the API server accepted it (a refused create
            # leaves the stage as it was), so a missing one was deleted behind the operator's back.
            kind = "RayJob" if name in RAY_STAGES else "Job"
            stages[i], message, event, requeue = _failed_attempt(run, entry, f"its {kind} {child} was deleted outside the operator", now)
            events.append(event)
            break
        if outcome.state == "succeeded":
            stages[i] = entry.model_copy(update={"state": "Succeeded", "completion_time": stamp, "message": outcome.message})
            message = f"stage {name} succeeded"
            events.append(Event("Normal", c.REASON_STAGE_SUCCEEDED, f"{message} ({child})"))
            continue  # start the next stage in the same pass (once this one's pods are gone)
        if outcome.state == "failed" and queue and preempted_job(name, obj):
            attempt = entry.attempt + 1
            new_child = stage_child_name(run.metadata.name, name, attempt)
            text = f"attempt {entry.attempt} was preempted by its queue; attempt {attempt} waits for admission (no retry used)"
            stages[i] = entry.model_copy(
                update={
                    "state": "Queued",
                    "attempt": attempt,
                    "job": new_child,
                    "message": text,
                    "preemptions": (entry.preemptions or 0) + (1 if entry.state == "Running" else 0),
                    "preempted_attempts": (entry.preempted_attempts or 0) + 1,
                }
            )
            create.append(CreateChild(name, attempt))
            message = f"stage {name}: {text} ({new_child})"
            events.append(Event("Warning", c.REASON_STAGE_PREEMPTED, message))
            break
        if outcome.state == "failed":
            reason = outcome.message
            detail = observed.failure_details.get(child)
            if detail:
                reason = f"{reason}; {detail}"
            stages[i], message, event, requeue = _failed_attempt(run, entry, reason, now, permanent=outcome.permanent)
            events.append(event)
            break
        if queue:
            stages[i], actions, more, text = _queued_child(run, entry, child, obj, observed.workloads.get(child, []))
            workload_actions += actions
            events += more
            message = text or message
            break
        # running or suspended: make the child's suspension follow the spec.
        child_suspended = bool(((obj or {}).get("spec") or {}).get("suspend"))
        if child_suspended != suspend:
            suspend_actions.append(SetSuspend(name, child, suspend))
            events.append(Event("Normal", c.REASON_SUSPENDED if suspend else c.REASON_RESUMED, f"stage {name} {'suspended' if suspend else 'resumed'} ({child})"))
            message = f"stage {name} {'suspended' if suspend else 'resumed'}"
        stages[i] = stages[i].model_copy(update={"state": "Suspended" if suspend else "Running"})
        break

    phase = phase_of(stages, suspended=suspend)
    finished = phase in ("Succeeded", "Failed")
    generation = (run.metadata.model_extra or {}).get("generation")
    current = current_stage(stages)
    replicas = None if sandbox_autoscaled else desired_sandbox_replicas(run, stage=current.name if current else None, finished=finished)
    results = observed.results or status.results
    first_eval = run.spec.data.eval[0].name
    conditions = pipeline_conditions(
        status.conditions,
        stages,
        phase,
        waiting=waiting,
        sandbox=(replicas, observed.sandbox_ready_replicas) if uses_sandbox(run) else None,
        sandbox_refused=observed.sandbox_pods_refused,
        now=now,
        generation=generation,
    )
    isolation = None
    if uses_sandbox(run):
        conditions, isolation = _with_isolation(conditions, status, observed.sandbox_isolation, events, now=now, generation=generation)
    else:
        conditions = [cond for cond in conditions if cond.type != c.COND_SANDBOX_ISOLATION]
    if claim_check is not None:
        ready = claim_check.state == "ready"
        conditions = set_condition(
            conditions, type_=c.COND_STORAGE_READY, status=ready, reason=claim_check.reason, message=claim_check.message, now=now, generation=generation
        )
    if observed.reward_suspect is not None:
        conditions = with_reward_suspect(conditions, observed.reward_suspect, events, now=now, generation=generation)
    next_status = RetoolRunStatus(
        phase=phase,
        stage=(current.name if current else next((s.name for s in reversed(stages) if s.state == "Succeeded"), None)),
        progress=progress_of(stages),
        score=headline_score(results, first_eval, run.spec.eval.n),
        message=message,
        stages=stages,
        conditions=conditions,
        sandbox=SandboxStatus(
            replicas=replicas if replicas is not None else observed.sandbox_ready_replicas,
            ready_replicas=observed.sandbox_ready_replicas,
            url=sandbox_url(run.metadata.name, run_namespace(run)),
            isolation=isolation,
        )
        if uses_sandbox(run)
        else None,
        mlflow=observed.mlflow or status.mlflow,
        storage=storage_status(run, observed.claim) if observed.claim is not None else status.storage,
        results=results,
        observed_generation=generation,
    )
    if phase == "Succeeded" and status.phase != "Succeeded":
        events.append(Event("Normal", c.REASON_COMPLETED, "all stages succeeded"))
    return Decision(
        status=next_status, sandbox_replicas=replicas, create=create, suspend=suspend_actions, workloads=workload_actions, events=events, requeue_after=requeue
    )
