"""The decision function: (run, current status, observed children, now) -> next status and actions.

Pure and level-triggered: it never remembers anything between calls except what is in the status
and in the children, so running it twice, after a crash or after an operator restart gives the
same answer. Child names are deterministic (``<run>-<stage>-<attempt>``), so "create" on a child
that already exists is a no-op for the handler (409 = already there).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, STAGES, sandbox_url, stage_child_name
from retool.spec.status import MLflowStatus, RetoolRunStatus, SandboxStatus, StageStatus
from retool_operator import constants as c
from retool_operator.builders import desired_sandbox_replicas, run_namespace
from retool_operator.status import current_stage, headline_score, parse_time, phase_of, progress_of, rfc3339, set_condition

ChildState = Literal["missing", "running", "succeeded", "failed", "suspended"]


@dataclass(frozen=True)
class ChildOutcome:
    state: ChildState
    message: str = ""


def rayjob_outcome(obj: dict[str, Any] | None) -> ChildOutcome:
    """KubeRay semantics: success is jobDeploymentStatus Complete AND jobStatus SUCCEEDED, nothing less."""
    if obj is None:
        return ChildOutcome("missing")
    st = obj.get("status") or {}
    deployment, job = st.get("jobDeploymentStatus"), st.get("jobStatus")
    detail = " ".join(x for x in (st.get("reason"), st.get("message")) if x)
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
        return ChildOutcome("failed", "Job failed" + (f": {detail}" if detail else ""))
    if "Suspended" in conditions:
        return ChildOutcome("suspended", "Job suspended")
    return ChildOutcome("running", "Job running")


def child_outcome(stage: str, obj: dict[str, Any] | None) -> ChildOutcome:
    return rayjob_outcome(obj) if stage in RAY_STAGES else job_outcome(obj)


@dataclass(frozen=True)
class Observed:
    """What the handler read from the cluster for this pass."""

    children: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage child name -> object
    sandbox_ready_replicas: int = 0
    mlflow: MLflowStatus | None = None
    results: dict[str, dict[str, float]] = field(default_factory=dict)


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
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: RetoolRunStatus
    sandbox_replicas: int
    create: list[CreateChild] = field(default_factory=list)
    suspend: list[SetSuspend] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def enabled_stages(run: RetoolRun) -> dict[str, bool]:
    spec = run.spec
    return {"prepare": True, "sft": spec.sft.enabled, "merge": spec.sft.enabled, "rl": spec.rl.enabled, "eval": spec.eval.enabled}


def stage_output(run: RetoolRun, stage: str) -> str:
    """Where a stage leaves its result on the PVC (status.stages[].checkpoint)."""
    paths = run_paths(run)
    return {
        "prepare": paths.data,
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


def decide(run: RetoolRun, status: RetoolRunStatus, observed: Observed, now: dt.datetime) -> Decision:
    """The next status and the actions that get the cluster there."""
    stamp = rfc3339(now)
    suspend = run.spec.suspend
    stages = _initial_stages(run, status.stages)
    create: list[CreateChild] = []
    suspend_actions: list[SetSuspend] = []
    events: list[Event] = []
    requeue: float | None = None
    message = status.message

    for i, entry in enumerate(stages):
        if entry.state in ("Succeeded", "Skipped"):
            continue
        if entry.state == "Failed":
            break
        name = entry.name
        if entry.attempt == 0:
            if suspend:
                break
            child = stage_child_name(run.metadata.name, name, 1)
            stages[i] = entry.model_copy(
                update={"state": "Running", "attempt": 1, "job": child, "start_time": stamp, "message": "attempt 1 started", "checkpoint": stage_output(run, name)}
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
            stages[i] = entry.model_copy(update={"state": "Running", "attempt": attempt, "job": child, "next_attempt_time": None, "message": f"attempt {attempt} started"})
            create.append(CreateChild(name, attempt))
            message = f"stage {name} retry: attempt {attempt} started ({child})" + (", resuming from its last checkpoint" if name == "rl" else "")
            events.append(Event("Normal", c.REASON_RETRY_STARTED, message))
            break
        # Running or Suspended: the child decides.
        child = entry.job or stage_child_name(run.metadata.name, name, entry.attempt)
        obj = observed.children.get(child)
        outcome = child_outcome(name, obj)
        if outcome.state == "missing":
            # Created earlier (or the create raced this status), or deleted by hand: (re)create it.
            create.append(CreateChild(name, entry.attempt))
            stages[i] = entry.model_copy(update={"state": "Suspended" if suspend else "Running"})
            break
        if outcome.state == "succeeded":
            stages[i] = entry.model_copy(update={"state": "Succeeded", "completion_time": stamp, "message": outcome.message})
            message = f"stage {name} succeeded"
            events.append(Event("Normal", c.REASON_STAGE_SUCCEEDED, f"{message} ({child})"))
            continue  # start the next stage in the same pass
        if outcome.state == "failed":
            retries_left = run.spec.failure_policy.max_retries - (entry.attempt - 1)
            if retries_left > 0:
                wait = backoff_seconds(run, entry.attempt)
                due = now + dt.timedelta(seconds=wait)
                text = f"attempt {entry.attempt} failed: {outcome.message}; retrying in {wait}s ({retries_left} retr{'y' if retries_left == 1 else 'ies'} left)"
                stages[i] = entry.model_copy(update={"state": "Retrying", "next_attempt_time": rfc3339(due), "message": text})
                message = f"stage {name} {text}"
                events.append(Event("Warning", c.REASON_STAGE_RETRYING, message))
                requeue = float(wait)
            else:
                text = f"attempt {entry.attempt} failed: {outcome.message}; no retries left (maxRetries {run.spec.failure_policy.max_retries})"
                stages[i] = entry.model_copy(update={"state": "Failed", "completion_time": stamp, "message": text})
                message = f"stage {name} failed: {text}"
                events.append(Event("Warning", c.REASON_STAGE_FAILED, message))
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
    replicas = desired_sandbox_replicas(run, finished=finished)
    generation = (run.metadata.model_extra or {}).get("generation")
    current = current_stage(stages)
    results = observed.results or status.results
    first_eval = run.spec.data.eval[0].name
    next_status = RetoolRunStatus(
        phase=phase,
        stage=(current.name if current else next((s.name for s in reversed(stages) if s.state == "Succeeded"), None)),
        progress=progress_of(stages),
        score=headline_score(results, first_eval, run.spec.eval.n),
        message=message,
        stages=stages,
        conditions=_conditions(status, stages, phase, replicas, observed.sandbox_ready_replicas, now, generation),
        sandbox=SandboxStatus(
            replicas=replicas, ready_replicas=observed.sandbox_ready_replicas, url=sandbox_url(run.metadata.name, run_namespace(run))
        ),
        mlflow=observed.mlflow or status.mlflow,
        results=results,
        observed_generation=generation,
    )
    if phase == "Succeeded" and status.phase != "Succeeded":
        events.append(Event("Normal", c.REASON_COMPLETED, "all stages succeeded"))
    return Decision(status=next_status, sandbox_replicas=replicas, create=create, suspend=suspend_actions, events=events, requeue_after=requeue)


def _conditions(
    status: RetoolRunStatus, stages: list[StageStatus], phase: str, replicas: int, ready: int, now: dt.datetime, generation: int | None
) -> list:
    current = current_stage(stages)
    detail = (current.message or "") if current else "all stages succeeded"
    def put(conds: list, type_: str, ok: bool, reason: str, message: str) -> list:
        return set_condition(conds, type_=type_, status=ok, reason=reason, message=message, now=now, generation=generation)

    conds = put(status.conditions, c.COND_VALID, True, c.REASON_VALID_SPEC, "spec accepted")
    failed = phase == "Failed"
    conds = put(conds, c.COND_FAILED, failed, c.REASON_STAGE_FAILED if failed else c.REASON_STAGE_RUNNING, detail if failed else "")
    done = phase == "Succeeded"
    conds = put(conds, c.COND_SUCCEEDED, done, c.REASON_COMPLETED if done else c.REASON_PENDING, detail if done else "")
    suspended = phase == "Suspended"
    conds = put(conds, c.COND_SUSPENDED, suspended, c.REASON_SUSPENDED if suspended else c.REASON_NOT_SUSPENDED, "spec.suspend is true" if suspended else "")
    retrying = current is not None and current.state == "Retrying"
    ready_ok = not failed and not suspended and not retrying
    if failed:
        reason = c.REASON_STAGE_FAILED
    elif suspended:
        reason = c.REASON_SUSPENDED
    elif retrying:
        reason = c.REASON_STAGE_RETRYING
    elif done:
        reason = c.REASON_COMPLETED
    elif current is not None and current.attempt == 0:
        reason = c.REASON_PENDING
    else:
        reason = c.REASON_STAGE_RUNNING
    conds = put(conds, c.COND_READY, ready_ok, reason, detail)
    if replicas == 0:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_SCALED_DOWN, False, "scaled to zero (suspended or finished)"
    elif ready >= replicas:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_READY, True, f"{ready}/{replicas} replicas ready"
    else:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_NOT_READY, False, f"{ready}/{replicas} replicas ready"
    return put(conds, c.COND_SANDBOX_READY, sandbox_ok, sandbox_reason, text)
