"""The decision function: (run, current status, observed children, now) -> next status and actions.

Pure and level-triggered: it never remembers anything between calls except what is in the status
and in the children, so running it twice, after a crash or after an operator restart gives the
same answer. Child names are deterministic (``<run>-<stage>-<attempt>``), so "create" on a child
that already exists is a no-op for the handler (409 = already there).

``decide`` walks the stages in order and asks one rule per stage: ``_next_attempt`` for a stage
that has not started or is due for a retry, ``_follow_child`` for one whose child exists. Each
concern has its own module, as KubeRay's controllers keep one reconcile step per concern:
``attempts`` (when the next attempt may start, what a failure leads to), ``queueing`` (who owns a
child's suspend: Kueue or the operator), ``sandbox_sizing`` (the sandbox's replicas),
``immutability`` (edits the operator must not act on; applied by the runner), ``claims`` and
``below`` (what the storage and the controllers below refuse).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, STAGES, sandbox_url, stage_child_name
from retool.spec.status import Condition, KeptCluster, MLflowStatus, RetoolRunStatus, SandboxIsolationStatus, SandboxStatus, StageStatus
from retool_operator import below, cluster_reuse
from retool_operator import constants as c
from retool_operator.actions import CreateChild, Event, KeepCluster, SetSuspend, SetWorkloadActive
from retool_operator.attempts import RELEASE_POLL_SECONDS, STATUS_CHECK_TIMEOUT, blocking_pods, claim_permission_hint, failed_attempt, status_check_timeout, waiting_text
from retool_operator.builders import queued, run_namespace, uses_sandbox
from retool_operator.claims import ClaimCheck, ClaimObservation, check_claim, check_extra_claims, storage_status
from retool_operator.isolation import IsolationObservation, isolation_condition
from retool_operator.queueing import (
    child_queue,
    deactivated_by_operator,
    kueue_deactivation,
    kueue_owns,
    queue_message,
    suspended_by_operator,
    was_evicted,
)
from retool_operator.sandbox_gate import REASON_PULL_FAILING, SandboxGate
from retool_operator.sandbox_sizing import sandbox_replicas
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


def rayjob_outcome(obj: dict[str, Any] | None) -> ChildOutcome:
    """KubeRay semantics: success is jobDeploymentStatus Complete AND jobStatus SUCCEEDED, nothing less."""
    if obj is None:
        return ChildOutcome("missing")
    st = obj.get("status") or {}
    deployment, job = st.get("jobDeploymentStatus"), st.get("jobStatus")
    detail = " ".join(x for x in (st.get("reason"), st.get("message")) if x)
    if deployment == "ValidationFailed":
        # KubeRay never retries a spec it refuses (ValidationFailed is terminal, rayjob_controller.go v1.7.0): neither do we.
        return ChildOutcome("failed", "KubeRay refused the RayJob (ValidationFailed)" + (f": {detail}" if detail else ""), permanent=True)
    if deployment == "Complete":
        if job == "SUCCEEDED":
            return ChildOutcome("succeeded", "RayJob completed with jobStatus SUCCEEDED")
        return ChildOutcome("failed", f"RayJob completed with jobStatus {job or 'unknown'}" + (f": {detail}" if detail else ""))
    if deployment == "Failed":
        return ChildOutcome("failed", "RayJob failed" + (f": {detail}" if detail else ""))
    if deployment in ("Suspended", "Suspending"):
        return ChildOutcome("suspended", f"RayJob {deployment.lower()}")
    return ChildOutcome("running", f"RayJob {deployment or 'submitted'}" + (f", job {job}" if job else ""))


def rayjob_detail(obj: dict[str, Any] | None) -> str:
    """KubeRay's message on a RayJob (its ``status.message``), or what it left instead."""
    st = (obj or {}).get("status") or {}
    return str(st.get("message") or st.get("reason") or "no message")


def status_check_timed_out(stage: str, obj: dict[str, Any] | None) -> bool:
    """A RayJob KubeRay failed because its Ray dashboard could not be polled (``attempts.STATUS_CHECK_TIMEOUT``)."""
    st = (obj or {}).get("status") or {}
    return stage in RAY_STAGES and st.get("jobDeploymentStatus") == "Failed" and st.get("reason") == STATUS_CHECK_TIMEOUT


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


def being_deleted(obj: dict[str, Any] | None) -> bool:
    """The API server has marked it for deletion (``deletionTimestamp``); finalizers may still hold it."""
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def holds_outcome(obj: dict[str, Any] | None) -> bool:
    """A stage child still held by the operator's finalizer (``constants.FINALIZER_OUTCOME``)."""
    return c.FINALIZER_OUTCOME in (((obj or {}).get("metadata") or {}).get("finalizers") or [])


def outcome_recorded(status: RetoolRunStatus, child: dict[str, Any]) -> bool:
    """Whether the run's status no longer needs ``child`` to learn an outcome: its stage has moved past it
    (finished, retried on a new child, or never named it). Only then may the finalizer go."""
    labels = (child.get("metadata") or {}).get("labels") or {}
    name = (child.get("metadata") or {}).get("name")
    entry = next((e for e in status.stages if e.name == labels.get(c.LABEL_STAGE)), None)
    return entry is None or entry.job != name or entry.state not in c.FOLLOWED_STATES


def child_outcome(stage: str, obj: dict[str, Any] | None) -> ChildOutcome:
    return rayjob_outcome(obj) if stage in RAY_STAGES else job_outcome(obj)


def preempted_job(stage: str, obj: dict[str, Any] | None) -> bool:
    """A batch Job that failed because its queue suspended it (Kueue's preemption).

    The Job controller counts the pods it deletes on suspension as failed, so with backoffLimit 0 a
    preempted Job ends Failed while ``spec.suspend`` is true; it cannot resume, so the stage needs a
    new attempt, but the attempt did not fail. (A preempted RayJob just goes Suspended and resumes.)
    """
    return stage not in RAY_STAGES and obj is not None and bool((obj.get("spec") or {}).get("suspend"))


MISSING_CONFIRM_SECONDS = 3.0
"""How long a child the API server no longer has waits for the watch to deliver its last state before it is
taken for deleted outside the operator. A pass's GET can run between KubeRay turning a RayJob Complete and
deleting it (``DELETE_RAYJOB_CR_AFTER_JOB_FINISHES``) and the watch delivering either event; the watch
delivers both in order (the DELETED event carries the final object), normally within milliseconds."""


@dataclass(frozen=True)
class Observed:
    """What the handler read from the cluster for this pass."""

    children: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage child name -> object
    active_pods: dict[str, list[str]] = field(default_factory=dict)
    """Child name -> its pods that have not terminated (phase other than Succeeded/Failed)."""
    submitter_pods: dict[str, list[str]] = field(default_factory=dict)
    """Child name -> those of its ``active_pods`` that are Ray job submitter pods (never waited for)."""
    running_pods: dict[str, list[str]] = field(default_factory=dict)
    """Child name -> those of its ``active_pods`` in phase Running (the stage has started)."""
    stage_pods: list[dict[str, Any]] | None = None
    """Every stage pod of the run the API server has (for ``cost``); None when not read this pass."""
    nodes: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """The nodes under the running rl attempt's Ray pods, by name (None: gone), for ``notice``."""
    failure_details: dict[str, str] = field(default_factory=dict)
    """Failed Job name -> its stage container's termination message (the reason the stage gave, or its last log lines)."""
    sandbox_gate: SandboxGate | None = None
    """Whether the sandbox can serve the preflight (``sandbox_gate``); None when not read this pass."""
    stage_notes: dict[str, str] = field(default_factory=dict)
    """Succeeded preflight Job name -> what its container left in its termination message (the preflight's warnings)."""
    sandbox_ready_replicas: int = 0
    sandbox_spec_replicas: int | None = None
    """The sandbox Deployment's ``spec.replicas`` as stored (None: no Deployment yet)."""
    sandbox_hpa_min_replicas: int | None = None
    """``minReplicas`` of the HPA on the sandbox, when there is one."""
    sandbox_pods_refused: str | None = None
    """The message of the sandbox Deployment's ReplicaFailure condition (pods refused at creation), if True
    for ``below.EVENTS_AFTER_SECONDS``."""
    sandbox_refusal_settling: bool = False
    """The sandbox Deployment's pods were refused moments ago: not shown yet, read again soon."""
    mlflow: MLflowStatus | None = None
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    claim: ClaimObservation | None = None  # None: not read this pass (no storage gate)
    extra_claims: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """The claims of ``spec.pods.volumes`` by name (None: absent), read with ``claim`` before the first stage."""
    workloads: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)
    """Kueue Workloads of a queued child, by child name; None when the cluster serves no Workload API."""
    child_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Events of a running Job that has no pod (read only then: why the Job controller creates none)."""
    claim_events: list[dict[str, Any]] | None = None
    """Events of the run's claim while it is Pending (why it is not provisioned)."""
    sandbox_isolation: IsolationObservation | None = None
    """What the sandbox pods' /readyz said this pass; None when there were no pods to ask."""
    reward_suspect: str | None = None
    """The rl stage's reward watch: a message while suspect, "" once cleared; None when not read this pass."""
    submitter_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """RayJob name -> KubeRay's submitter Job (read while the RayJob is Running and its job has not started)."""
    submitter_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """RayJob name -> the Events of its submitter Job while that Job has no pod."""
    missing_unconfirmed: set[str] = field(default_factory=set)
    """Children a read found gone less than ``MISSING_CONFIRM_SECONDS`` ago whose deletion no watch event has
    delivered yet: the watch may still bring their last state (KubeRay deletes a Complete RayJob within
    milliseconds), so they are not yet taken for deleted behind the operator's back."""
    unschedulable: dict[str, str] = field(default_factory=dict)
    """Running child name -> the scheduler's words for a pod of it it cannot place (``below.unschedulable``)."""
    ray_clusters: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """RayClusters by name (None: gone) read this pass: the kept ones, and that of a Ray attempt whose job
    failed (``cluster_reuse``)."""
    same_cluster_spec: dict[str, bool] = field(default_factory=dict)
    """RayCluster name -> whether the run still renders what it runs (``builders.stages.cluster_fingerprint``)."""


@dataclass
class Decision:
    status: RetoolRunStatus
    sandbox_replicas: int | None
    create: list[CreateChild] = field(default_factory=list)
    suspend: list[SetSuspend] = field(default_factory=list)
    workloads: list[SetWorkloadActive] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    keep: list[KeepCluster] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    """RayJobs to delete: an attempt on a kept cluster that spec.suspend stopped (KubeRay cannot suspend it)."""


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


CLAIM_RECHECK_SECONDS = 30.0
"""How soon a pass waiting for the run's claim looks again (claims are not watched)."""


def _queued_child(
    run: RetoolRun, entry: StageStatus, child: str, obj: dict[str, Any] | None, workloads: list[dict[str, Any]] | None
) -> tuple[StageStatus, list[SetWorkloadActive], list[Event], str | None]:
    """A running child Kueue manages (``queueing.kueue_owns``): Kueue owns its ``spec.suspend``; the operator only reads it.

    spec.suspend deactivates the child's Kueue Workload (Kueue then suspends the child and keeps it
    out of the queue) and resuming reactivates only Workloads the operator deactivated. A child
    suspended while the run is not is waiting for admission (Queued); one that had been running is
    preempted, which is counted, never a failure.
    """
    name = entry.name
    queue = child_queue(obj)
    actions: list[SetWorkloadActive] = []
    events: list[Event] = []
    message: str | None = None
    if run.spec.suspend:
        actions = [SetWorkloadActive(name, wl["metadata"]["name"], False) for wl in workloads or [] if (wl.get("spec") or {}).get("active") is not False]
        if entry.state != "Suspended":
            message = f"stage {name} suspended (Kueue workload deactivated)"
            events.append(Event("Normal", c.REASON_SUSPENDED, f"{message} ({child})"))
        return entry.model_copy(update={"state": "Suspended", "message": "suspended by spec.suspend"}), actions, events, message
    actions = [SetWorkloadActive(name, wl["metadata"]["name"], True) for wl in workloads or [] if deactivated_by_operator(wl) and (wl.get("spec") or {}).get("active") is False]
    if bool(((obj or {}).get("spec") or {}).get("suspend")):
        update: dict[str, Any] = {"state": "Queued", "message": queue_message(queue, workloads)}
        if entry.state == "Running" and was_evicted(workloads):
            update["preemptions"] = (entry.preemptions or 0) + 1
            message = f"stage {name} preempted by its queue; waiting for re-admission ({child})"
            events.append(Event("Warning", c.REASON_STAGE_PREEMPTED, message))
        return entry.model_copy(update=update), actions, events, message
    if entry.state in ("Queued", "Suspended"):
        message = f"stage {name} admitted by Kueue{f' queue {queue}' if queue else ''} ({child})"
        events.append(Event("Normal", c.REASON_STAGE_ADMITTED, message))
    return entry.model_copy(update={"state": "Running", "message": f"attempt {entry.attempt} running"}), actions, events, message


def _operator_suspension(
    run: RetoolRun, entry: StageStatus, child: str, obj: dict[str, Any] | None, workloads: list[dict[str, Any]] | None
) -> tuple[StageStatus, list[SetSuspend], list[Event], str | None]:
    """A running child outside Kueue: its ``spec.suspend`` follows the run's.

    The operator resumes only a child it suspended itself (its mark), or any suspended child on a
    cluster without Kueue's API: a child that something else suspended (Kueue's webhook suspends
    jobs at creation under ``manageJobsWithoutQueueName``, before its Workload exists) is left alone
    and shown as waiting, so the two controllers never take turns flipping it.
    """
    name, suspend = entry.name, run.spec.suspend
    child_suspended = bool(((obj or {}).get("spec") or {}).get("suspend"))
    if child_suspended == suspend:
        return entry.model_copy(update={"state": "Suspended" if suspend else "Running"}), [], [], None
    if not suspend and not suspended_by_operator(obj) and workloads is not None:
        text = f"{child} was suspended by another controller (not the operator); waiting for it to be resumed"
        return entry.model_copy(update={"state": "Queued", "message": text}), [], [], None
    event = Event("Normal", c.REASON_SUSPENDED if suspend else c.REASON_RESUMED, f"stage {name} {'suspended' if suspend else 'resumed'} ({child})")
    state = "Suspended" if suspend else "Running"
    return entry.model_copy(update={"state": state}), [SetSuspend(name, child, suspend)], [event], f"stage {name} {'suspended' if suspend else 'resumed'}"


SANDBOX_POLL_SECONDS = 5.0


def _sandbox_wait(run: RetoolRun, entry: StageStatus, observed: Observed, stamp: str) -> tuple[StageStatus, str, Event | None, float | None] | None:
    """The preflight waits for a ready sandbox replica (``retool_operator.sandbox_gate``): None when it may start.

    Returns (entry, run message, event when the message changed, requeue seconds)."""
    gate = observed.sandbox_gate
    if entry.name != "preflight" or not uses_sandbox(run) or gate is None or gate.state == "ready":
        return None
    if gate.state == "failed":
        text = f"not started: {gate.message}"
        failed = entry.model_copy(update={"state": "Failed", "completion_time": stamp, "message": text})
        return failed, f"stage {entry.name} {text}", Event("Warning", gate.reason, gate.message), None
    event = None
    if entry.message != gate.message:
        event = Event("Warning" if gate.reason == REASON_PULL_FAILING else "Normal", gate.reason, f"stage {entry.name}: {gate.message}")
    return entry.model_copy(update={"message": gate.message}), f"stage {entry.name} {gate.message}", event, SANDBOX_POLL_SECONDS


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
    conditions = set_condition(conditions, type_=c.COND_SANDBOX_ISOLATION, status=cond.status, reason=cond.reason, message=cond.message, now=now, generation=generation)
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


@dataclass
class Step:
    """What one stage's rule decided this pass (``decide`` folds the steps of the stages in order)."""

    entry: StageStatus
    message: str | None = None
    events: list[Event] = field(default_factory=list)
    create: list[CreateChild] = field(default_factory=list)
    suspend: list[SetSuspend] = field(default_factory=list)
    workloads: list[SetWorkloadActive] = field(default_factory=list)
    requeue: float | None = None
    waiting: str | None = None
    go_on: bool = False
    """The stage finished this pass: the next one may start in the same pass."""
    findings: tuple[str, str] | None = None
    """(reason, message) of the preflight's findings, when it finished this pass."""
    keep: list[KeepCluster] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)


def _cluster_health(run: RetoolRun, cluster: str, observed: Observed, since: str | None) -> str | None:
    """None when the Ray cluster ``cluster`` may run the next attempt (``cluster_reuse``), else why not; a pod made
    after ``since`` is a replacement."""
    if cluster not in observed.ray_clusters or observed.stage_pods is None:
        return "it was not read this pass"
    if observed.ray_clusters[cluster] is not None and not observed.same_cluster_spec.get(cluster, False):
        return "the run renders a different cluster now: an edit of its spec or an operator upgrade"
    return cluster_reuse.cluster_health(
        observed.ray_clusters[cluster],
        cluster_reuse.cluster_pods(observed.stage_pods, cluster),
        observed.nodes,
        expected_pods=run.spec.hardware.nodes,
        submitted=since,
    )


def _keep_for_retry(
    run: RetoolRun, entry: StageStatus, updated: StageStatus, obj: dict[str, Any] | None, observed: Observed, now: dt.datetime
) -> tuple[StageStatus, str, list[KeepCluster]]:
    """A Ray attempt failed and the stage retries: whether its cluster is kept for the next attempt
    (``cluster_reuse``). Returns the entry, a note for the messages, and the keep action."""
    if updated.state != "Retrying" or not cluster_reuse.enabled(run, entry.name) or not cluster_reuse.job_failed(obj):
        return updated, "", []
    following = entry.attempt + 1
    cluster = ((obj or {}).get("status") or {}).get("rayClusterName")
    why = "this attempt already ran on a kept one" if entry.ray_cluster is not None else None
    started = cluster_reuse.job_started(obj) or cluster_reuse.submitted_time(observed.stage_pods, entry.name, entry.attempt)
    why = why or (_cluster_health(run, cluster, observed, started) if cluster else "KubeRay names no cluster")
    if why is not None:
        note = f"; attempt {following} gets a fresh Ray cluster ({why})"
        return updated.model_copy(update={"message": (updated.message or "") + note}), note, []
    kept = KeptCluster(name=cluster, owner=entry.job or "", attempt=following, kept_time=rfc3339(now))
    note = f"; attempt {following} will run on the same Ray cluster {cluster} (the job failed; the cluster is healthy)"
    return updated.model_copy(update={"ray_cluster": kept, "message": (updated.message or "") + note}), note, [KeepCluster(entry.name, entry.job or "", cluster)]


def _next_attempt(run: RetoolRun, entry: StageStatus, observed: Observed, now: dt.datetime, claim_check: ClaimCheck | None) -> Step:
    """A stage not started yet, or due for a retry: the claim, the backoff and earlier pods permitting, its next child."""
    name, stamp, first = entry.name, rfc3339(now), entry.attempt == 0
    if run.spec.suspend:
        return Step(entry)
    if first and claim_check is not None and claim_check.state != "ready":
        if claim_check.state == "failed":
            failed = entry.model_copy(update={"state": "Failed", "completion_time": stamp, "message": f"not started: {claim_check.message}"})
            return Step(failed, f"stage {name} not started: {claim_check.message}", [Event("Warning", claim_check.reason, claim_check.message)])
        return Step(entry.model_copy(update={"message": claim_check.message}), claim_check.message, requeue=claim_check.recheck_seconds or CLAIM_RECHECK_SECONDS)
    if not first:
        due = parse_time(entry.next_attempt_time) or now
        if now < due:
            return Step(entry, requeue=(due - now).total_seconds())
    attempt = entry.attempt + 1
    child = stage_child_name(run.metadata.name, name, attempt)
    blocking = blocking_pods(observed.active_pods, observed.submitter_pods, child)
    kept, on_cluster, gave_up = cluster_reuse.kept_for(entry), None, []
    if kept is not None:
        why = _cluster_health(run, kept.name, observed, kept.kept_time)
        if why is None:
            on_cluster = kept.name
            handed = {(p.get("metadata") or {}).get("name") for p in cluster_reuse.cluster_pods(observed.stage_pods, kept.name)}
            blocking = {owner: left for owner, pods in blocking.items() if (left := [p for p in pods if p not in handed])}
        else:
            text = f"the Ray cluster {kept.name} kept for attempt {attempt} cannot run it ({why}): it is deleted and attempt {attempt} gets a fresh one"
            entry = entry.model_copy(update={"ray_cluster": kept.model_copy(update={"released": why}), "message": text})
            gave_up = [Event("Warning", c.REASON_CLUSTER_NOT_REUSED, f"stage {name}: {text}")]
            blocking = blocking or {kept.owner: [kept.name]}  # its pods are deleted next: wait for them
    if blocking:
        waiting = waiting_text(blocking)
        text = f"attempt {attempt} {waiting}"
        events = [] if first or entry.message == text else [Event("Normal", c.REASON_WAITING_FOR_PODS, f"stage {name}: {text}")]
        return Step(entry.model_copy(update={"message": text}), events=gave_up + events, requeue=RELEASE_POLL_SECONDS, waiting=waiting)
    sandbox_wait = _sandbox_wait(run, entry, observed, stamp)
    if sandbox_wait is not None:
        updated, message, sandbox_event, requeue = sandbox_wait
        return Step(updated, message, [sandbox_event] if sandbox_event else [], requeue=requeue)
    queue = queued(run)
    waits = queue_message(run.spec.scheduling.queue_name, []) if queue else "waiting for its pods"
    text = f"attempt {attempt} created; {waits}"
    update: dict[str, Any] = {"state": "Queued" if queue else "Running", "attempt": attempt, "job": child, "message": text, "running_time": None}
    # Created, not started: StageStarted is posted once a pod of the attempt runs (_pods_started), so a
    # stage queued behind another run's devices never reads as started.
    if first:
        update.update(start_time=stamp, checkpoint=stage_output(run, name))
        message = f"stage {name} {'queued' if queue else 'created'}: {waits} ({child})"
        event = Event("Normal", c.REASON_STAGE_CREATED, f"stage {name} attempt {attempt} created ({child})")
    else:
        update["next_attempt_time"] = None
        message = f"stage {name} retry: attempt {attempt} created ({child})" + (", resuming from its last checkpoint" if name == "rl" else "")
        if on_cluster is not None:
            message += f", on the Ray cluster {on_cluster} kept from attempt {entry.attempt}"
        event = Event("Normal", c.REASON_RETRY_STARTED, message)
    return Step(entry.model_copy(update=update), message, [event], create=[CreateChild(name, attempt, on_cluster=on_cluster)])


def _pods_started(step: Step, child: str, observed: Observed, now: dt.datetime) -> Step:
    """The first pass that sees a pod of the attempt running: ``running_time``, the StageStarted Event and the run's message."""
    entry = step.entry
    if entry.state != "Running" or entry.running_time is not None or not observed.running_pods.get(child):
        return step
    message = f"stage {entry.name} started: attempt {entry.attempt} running ({child})"
    updated = entry.model_copy(update={"running_time": rfc3339(now), "message": f"attempt {entry.attempt} running"})
    return replace(step, entry=updated, message=step.message or message, events=[*step.events, Event("Normal", c.REASON_STAGE_STARTED, message)])


def _follow_child(run: RetoolRun, entry: StageStatus, observed: Observed, now: dt.datetime) -> Step:
    """A stage whose child exists: its outcome, its queue (Kueue) or the run's spec.suspend decide."""
    name = entry.name
    child = entry.job or stage_child_name(run.metadata.name, name, entry.attempt)
    obj = observed.children.get(child)
    workloads = observed.workloads.get(child)
    kueue = kueue_owns(obj, workloads)
    outcome = child_outcome(name, obj)
    if outcome.state == "missing" and child in observed.missing_unconfirmed:
        return Step(entry, requeue=MISSING_CONFIRM_SECONDS)
    if outcome.state == "missing" or (being_deleted(obj) and outcome.state in ("running", "suspended")):
        # The status names a child only after the API server accepted it (a refused create
        # leaves the stage as it was), so a missing one was deleted behind the operator's back;
        # one being deleted before it finished (held by FINALIZER_OUTCOME) is going the same way.
        kind = "RayJob" if name in RAY_STAGES else "Job"
        how = "was deleted" if outcome.state == "missing" else "is being deleted"
        updated, message, event, requeue = failed_attempt(run, entry, f"its {kind} {child} {how} outside the operator", now)
        return Step(updated, message, [event], requeue=requeue)
    if outcome.state == "succeeded":
        message = f"stage {name} succeeded"
        note = observed.stage_notes.get(child)
        stage_message = f"{outcome.message}; {note}" if note and outcome.message else (note or outcome.message)
        updated = entry.model_copy(update={"state": "Succeeded", "completion_time": rfc3339(now), "message": stage_message})
        events = [Event("Normal", c.REASON_STAGE_SUCCEEDED, f"{message} ({child})")]
        if not note:
            return Step(updated, message, events, go_on=True)
        events.append(Event("Warning", c.REASON_PREFLIGHT_WARNINGS, f"stage {name}: {note}"))
        return Step(updated, message, events, go_on=True, findings=(c.REASON_PREFLIGHT_WARNINGS, note))
    if outcome.state == "failed" and kueue and preempted_job(name, obj):
        attempt = entry.attempt + 1
        new_child = stage_child_name(run.metadata.name, name, attempt)
        text = f"attempt {entry.attempt} was preempted by its queue; attempt {attempt} waits for admission (no retry used)"
        updated = entry.model_copy(
            update={
                "state": "Queued",
                "attempt": attempt,
                "job": new_child,
                "message": text,
                "preemptions": (entry.preemptions or 0) + (1 if entry.state == "Running" else 0),
                "preempted_attempts": (entry.preempted_attempts or 0) + 1,
            }
        )
        message = f"stage {name}: {text} ({new_child})"
        return Step(updated, message, [Event("Warning", c.REASON_STAGE_PREEMPTED, message)], create=[CreateChild(name, attempt)])
    lost = status_check_timeout(run, entry, rayjob_detail(obj), now) if outcome.state == "failed" and status_check_timed_out(name, obj) else None
    if lost is not None:
        updated, message, event, requeue = lost
        return Step(updated, message, [event], requeue=requeue)
    if outcome.state == "failed":
        reason = outcome.message
        detail = observed.failure_details.get(child)
        if detail:
            reason = f"{reason}; {detail}{claim_permission_hint(run, detail)}"
        updated, message, event, requeue = failed_attempt(run, entry, reason, now, permanent=outcome.permanent)
        updated, note, keep = _keep_for_retry(run, entry, updated, obj, observed, now)
        if note:
            message, event = message + note, replace(event, message=event.message + note)
        findings = (c.REASON_PREFLIGHT_FAILED, detail) if detail and name == "preflight" else None
        return Step(updated, message, [event], requeue=requeue, findings=findings, keep=keep)
    deactivation = kueue_deactivation(workloads) if kueue and not run.spec.suspend else None
    if deactivation is not None:
        reason = f"Kueue deactivated its workload {deactivation.workload} ({deactivation.reason}: {deactivation.message}); it will not be admitted again"
        updated, message, event, requeue = failed_attempt(run, entry, reason, now)
        return Step(updated, message, [event], requeue=requeue)
    kept = cluster_reuse.kept_for(entry)
    if run.spec.suspend and kept is not None and kept.attempt == entry.attempt and outcome.state == "running":
        # KubeRay cannot suspend a RayJob with a clusterSelector (ValidateRayJobSpec): the attempt ends instead.
        text = (
            f"attempt {entry.attempt} stopped by spec.suspend: it ran on the kept Ray cluster {kept.name}, which cannot be suspended; "
            f"resuming starts attempt {entry.attempt + 1} on a fresh cluster" + (" from the last checkpoint" if name == "rl" else "") + " (no retry used)"
        )
        update = {
            "state": "Retrying",
            "next_attempt_time": rfc3339(now),
            "message": text,
            "preempted_attempts": (entry.preempted_attempts or 0) + 1,
            "ray_cluster": kept.model_copy(update={"released": "spec.suspend"}),
        }
        message = f"stage {name} {text}"
        return Step(entry.model_copy(update=update), message, [Event("Normal", c.REASON_SUSPENDED, message)], delete=[child])
    if kueue:
        updated, actions, events, text = _queued_child(run, entry, child, obj, observed.workloads.get(child, []))
        return _pods_started(Step(updated, text, events, workloads=actions), child, observed, now)
    updated, patches, events, text = _operator_suspension(run, entry, child, obj, workloads)
    return _pods_started(Step(updated, text, events, suspend=patches), child, observed, now)


def decide(run: RetoolRun, status: RetoolRunStatus, observed: Observed, now: dt.datetime, *, sandbox_autoscaled: bool = False) -> Decision:
    """The next status and the actions that get the cluster there.

    ``sandbox_autoscaled``: an HPA manages the sandbox's replicas while a stage needs it (``sandbox_sizing``).
    """
    suspend = run.spec.suspend
    stages = _initial_stages(run, status.stages)
    create: list[CreateChild] = []
    suspend_actions: list[SetSuspend] = []
    workload_actions: list[SetWorkloadActive] = []
    events: list[Event] = []
    requeue: float | None = None
    message = status.message
    waiting: str | None = None
    findings: tuple[str, str] | None = None  # (reason, message) of the preflight's findings, when it finished this pass
    keep: list[KeepCluster] = []
    delete: list[str] = []
    # The claim is checked until the first stage starts: a multi-node run on a claim that cannot be
    # shared fails here, before anything requests an accelerator.
    claim_check: ClaimCheck | None = None
    if observed.claim is not None and not any(s.attempt > 0 for s in stages):
        claim_check = check_claim(run, observed.claim)
        if claim_check.state == "ready":
            claim_check = check_extra_claims(run, observed.extra_claims) or claim_check
        unbound = below.claim_failure(observed.claim.obj, observed.claim_events) if claim_check.state == "ready" else None
        if unbound is not None:
            # The volume controller says the claim gets no volume (no default StorageClass, no matching
            # PV, a provisioner's refusal): no stage starts on it; the cause is the run's message.
            text = below.claim_refusal(observed.claim.claim.name, observed.claim.obj, observed.claim_events) or unbound[1]
            claim_check = ClaimCheck("waiting", unbound[0], below.short(text))
        elif claim_check.state == "ready" and below.claim_settling(observed.claim.obj, now):
            name = observed.claim.claim.name
            text = f"waiting for the volume controller to look at PersistentVolumeClaim {name}"
            claim_check = ClaimCheck("waiting", c.REASON_CLAIM_PENDING, text, recheck_seconds=below.CLAIM_SETTLE_SECONDS)

    for i, entry in enumerate(stages):
        if entry.state in ("Succeeded", "Skipped"):
            continue
        if entry.state == "Failed":
            break
        # Not started or due for a retry: the next attempt; Running, Queued or Suspended: the child decides.
        starting = entry.attempt == 0 or entry.state == "Retrying"
        step = _next_attempt(run, entry, observed, now, claim_check) if starting else _follow_child(run, entry, observed, now)
        stages[i] = step.entry
        message = step.message or message
        events += step.events
        create += step.create
        suspend_actions += step.suspend
        workload_actions += step.workloads
        requeue = step.requeue if step.requeue is not None else requeue
        waiting = step.waiting or waiting
        findings = step.findings or findings
        keep += step.keep
        delete += step.delete
        if not step.go_on:
            break
    for i, entry in enumerate(stages):
        # A kept cluster no attempt needs is deleted by the runner each pass until a read finds it gone.
        kept = entry.ray_cluster
        if kept is not None and cluster_reuse.kept_for(entry) is None and kept.name in observed.ray_clusters and observed.ray_clusters[kept.name] is None:
            stages[i] = entry.model_copy(update={"ray_cluster": None})

    phase = phase_of(stages, suspended=suspend)
    finished = phase in ("Succeeded", "Failed")
    generation = (run.metadata.model_extra or {}).get("generation")
    current = current_stage(stages)
    replicas = sandbox_replicas(
        run,
        current,
        finished=finished,
        autoscaled=sandbox_autoscaled,
        hpa_min_replicas=observed.sandbox_hpa_min_replicas,
        replicas_now=observed.sandbox_spec_replicas,
    )
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
    if findings is not None:
        conditions = set_condition(conditions, type_=c.COND_PREFLIGHT_FINDINGS, status=True, reason=findings[0], message=findings[1][:1024], now=now, generation=generation)
    if claim_check is not None:
        ready = claim_check.state == "ready"
        conditions = set_condition(conditions, type_=c.COND_STORAGE_READY, status=ready, reason=claim_check.reason, message=claim_check.message, now=now, generation=generation)
    if observed.reward_suspect is not None:
        conditions = with_reward_suspect(conditions, observed.reward_suspect, events, now=now, generation=generation)
    next_status = RetoolRunStatus(
        phase=phase,
        stage=(current.name if current else next((s.name for s in reversed(stages) if s.state == "Succeeded"), None)),
        progress=progress_of(stages),
        score=headline_score(results, first_eval, run.spec.eval.samples_per_problem),
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
        status=next_status,
        sandbox_replicas=replicas,
        create=create,
        suspend=suspend_actions,
        workloads=workload_actions,
        events=events,
        requeue_after=requeue,
        keep=keep,
        delete=delete,
    )


def stalls_below(status: RetoolRunStatus, observed: Observed, now: dt.datetime) -> tuple[RetoolRunStatus, list[str]]:
    """What the controllers below refuse or cannot place for the running stage and the run's claim (``below``):
    the texts for Stalled=True and the Warning Event, and ``status`` with the stage's message saying it
    (short: the stage whose pods cannot start is never shown as "started").
    """
    out: list[str] = []
    stages = list(status.stages)
    for i, entry in enumerate(stages):
        if entry.state != "Running" or not entry.job:
            continue
        kind = "RayJob" if entry.name in RAY_STAGES else "Job"
        obj = observed.children.get(entry.job)
        found = [
            below.child_refusal(kind, entry.job, obj, observed.child_events.get(entry.job), now),
            below.submitter_refusal(entry.job, obj, observed.submitter_jobs.get(entry.job), observed.submitter_events.get(entry.job), now) if kind == "RayJob" else None,
            observed.unschedulable.get(entry.job),
        ]
        texts = [t for t in found if t]
        if texts:
            out += texts
            stages[i] = entry.model_copy(update={"message": below.short(f"{cannot_start(entry.attempt)}{texts[0]}")})
        elif (entry.message or "").startswith(cannot_start(entry.attempt)):
            # The stall cleared (the pod was placed, the quota freed): the stage and the run say so.
            cleared = f"attempt {entry.attempt} running"
            stages[i] = entry.model_copy(update={"message": cleared})
            if (status.message or "") not in ("", cleared):
                status = status.model_copy(update={"message": f"stage {entry.name}: {cleared}"})
    if observed.claim is not None:
        text = below.claim_refusal(observed.claim.claim.name, observed.claim.obj, observed.claim_events)
        if text:
            out.insert(0, text)  # the cause: pods that wait for an unbound claim say only that
    return status.model_copy(update={"stages": stages}), out


def cannot_start(attempt: int) -> str:
    """The start of a stage's message while its pods cannot start (``stalls_below``)."""
    return f"attempt {attempt} cannot start: "
