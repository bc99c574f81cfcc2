"""One reconciliation pass of one RetoolRun: read, decide (pure), apply, write status once.

Handlers call ``Reconciler.trigger``; passes of the same run are serialized and coalesced (a
burst of child events runs at most one extra pass), and passes of different runs run in parallel.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from retool.preflight.checks import WARNINGS_PREFIX
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, sandbox_name, stage_child_name
from retool.spec.status import MLflowStatus, ResumePoint, RetoolRunStatus, SaveRequest, StageStatus
from retool.spec.validate import document_warnings, parse_run
from retool.tracking.naming import RESUMED_FROM_TAG, SAVED_ON_NOTICE_TAG
from retool_operator import below, cluster_reuse, cost, immutability, logcontext, notice
from retool_operator import constants as c
from retool_operator.builders import (
    Tracking,
    build_claim,
    build_mlflow,
    build_sandbox,
    build_spec_configmap,
    build_stage_child,
    experiment_name,
    owned_by,
    run_claim,
    run_document,
    scheduling_problems,
    uses_sandbox,
)
from retool_operator.builders.stages import STAGE_CONTAINER, cluster_fingerprint
from retool_operator.claims import ClaimObservation, extra_claim_names
from retool_operator.config import OperatorConfig
from retool_operator.isolation import IsolationObservation
from retool_operator.kube import KINDS, ApiError, Kind, KubeClient
from retool_operator.kuberay_crd import RAYJOB_CRD, KubeRayCRD, kuberay_problems, read_crd
from retool_operator.profiles import hardware_profile
from retool_operator.queueing import ANNOTATION_SUSPENDED, SUSPENDED_BY, child_queue, queue_message
from retool_operator.readyz import IsolationReader
from retool_operator.reconcile import (
    MISSING_CONFIRM_SECONDS,
    Decision,
    Event,
    Observed,
    being_deleted,
    child_outcome,
    decide,
    holds_outcome,
    outcome_recorded,
    stalls_below,
)
from retool_operator.sandbox_gate import KUEUE_GATE, SandboxGate, sandbox_gate
from retool_operator.status import FINISHED_PHASES, dump, invalid_spec_status, load, phase_of, rfc3339, set_condition, status_to_write, with_refusals, with_spec_warnings
from retool_operator.tracking import ensure_parent_run, eval_results, log_cost, request_save, reward_suspect, same_tracker, stage_attempt_tags, tracking_target
from retool_operator.webhook import cluster_problems, spec_problems

log = logging.getLogger(__name__)

RUNS = KINDS[(c.RUN_API_VERSION, c.RUN_KIND)]
DEPLOYMENTS = KINDS[("apps/v1", "Deployment")]
PODS = KINDS[("v1", "Pod")]
NODES = KINDS[("v1", "Node")]
JOBS = KINDS[("batch/v1", "Job")]
RAYJOBS = KINDS[("ray.io/v1", "RayJob")]
RAYCLUSTERS = KINDS[("ray.io/v1", "RayCluster")]
HPAS = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
TERMINATED_POD_PHASES = frozenset({"Succeeded", "Failed"})
CLAIMS = KINDS[("v1", "PersistentVolumeClaim")]
CONFIGMAPS = KINDS[("v1", "ConfigMap")]
EVENTS = KINDS[("v1", "Event")]
CRDS = KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")]
WORKLOAD_VERSIONS = (KINDS[("kueue.x-k8s.io/v1beta2", "Workload")], KINDS[("kueue.x-k8s.io/v1beta1", "Workload")])
"""Kueue's Workload API, newest first: v1beta2 (storage version since Kueue 0.16, where v1beta1 is
deprecated: apis/kueue/v1beta1/workload_types.go, v0.19.0), v1beta1 for older releases."""
DEACTIVATED_BY = "retool-operator"
EventSink = Callable[[dict[str, Any], Event], None]


@dataclass
class _Stalls:
    """What ``_observe_start`` read about the pods of running stages this pass."""

    submitter_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    submitter_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    unschedulable: dict[str, str] = field(default_factory=dict)


def stage_kind(stage: str) -> Kind:
    return KINDS[("ray.io/v1", "RayJob")] if stage in RAY_STAGES else KINDS[("batch/v1", "Job")]


TERMINATION_MESSAGE_CHARS = 600
"""Of a failed stage container's termination message (kubelet keeps at most 4 KiB; the end says most)."""


def termination_message(pod: dict[str, Any], container: str) -> str:
    """The last part of ``container``'s termination message in ``pod``, on one line ('' when none)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        terminated = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated") or {}
        text = " ".join(str(terminated.get("message") or "").split())
        return text if len(text) <= TERMINATION_MESSAGE_CHARS else "..." + text[-TERMINATION_MESSAGE_CHARS:]
    return ""


def is_submitter_pod(pod_labels: dict[str, str], stage: str, child: str) -> bool:
    """A pod of a RayJob's submitter Job: our role label, or (pods made by an older operator) the Job
    controller's job-name label on a Ray stage's pod (the submitter Job is named after its RayJob;
    Ray head and worker pods belong to no Job)."""
    if pod_labels.get(c.LABEL_POD_ROLE) == "submitter":
        return True
    return stage in RAY_STAGES and pod_labels.get(c.JOB_NAME_LABEL) == child


def _valid_message(status: RetoolRunStatus) -> str | None:
    return next((cond.message for cond in status.conditions if cond.type == c.COND_VALID), None)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def refusal_text(verb: str, obj: dict[str, Any], err: ApiError) -> str:
    return f"{verb} {obj['kind']} {obj['metadata']['name']} refused: {err.reason}"


def active_pods(run_name: str, pods: list[dict[str, Any]]) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """(stage child name -> its pods that still run or are still terminating, the same for those
    that are Ray job submitter pods, and for those in phase Running), from the run's stage pods."""
    active: dict[str, list[str]] = {}
    submitters: dict[str, list[str]] = {}
    running: dict[str, list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        lbls = meta.get("labels") or {}
        stage, attempt = lbls.get(c.LABEL_STAGE), lbls.get(c.LABEL_ATTEMPT)
        phase = (pod.get("status") or {}).get("phase")
        if phase in TERMINATED_POD_PHASES or stage is None or not (attempt or "").isdigit():
            continue
        child = stage_child_name(run_name, stage, int(attempt))
        active.setdefault(child, []).append(meta.get("name", "?"))
        if is_submitter_pod(lbls, stage, child):
            submitters.setdefault(child, []).append(meta.get("name", "?"))
        elif phase == "Running" and not meta.get("deletionTimestamp"):
            running.setdefault(child, []).append(meta.get("name", "?"))
    return active, submitters, running


def _int_tag(tags: dict[str, str] | None, key: str) -> int | None:
    value = (tags or {}).get(key, "")
    return int(value) if value.isdigit() else None


def may_create(status: RetoolRunStatus, children: dict[str, dict[str, Any]]) -> bool:
    """Whether this pass may create a child (so the run's pods are worth listing): the current
    stage has not started, is due for a retry, or its child has just finished."""
    for entry in status.stages:
        if entry.state in ("Succeeded", "Skipped"):
            continue
        if entry.state == "Failed":
            return False
        if entry.attempt == 0 or entry.state == "Retrying":
            return True
        return child_outcome(entry.name, children.get(entry.job or "")).state in ("succeeded", "failed", "missing")
    return not status.stages


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning ``old`` into ``new`` at the top level (removed keys become null)."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    patch.update(new)
    return patch


RL_ENDED = frozenset({"Succeeded", "Failed", "Retrying", "Suspended"})
"""rl stage states after an attempt has ended: its reward watch has written its last verdict."""


class Reconciler:
    def __init__(
        self,
        client: KubeClient,
        config: OperatorConfig,
        *,
        post_event: EventSink,
        parent_factory: Callable[..., Any] | None = None,
        now: Callable[[], dt.datetime] = utcnow,
        isolation: IsolationReader | None = None,
    ):
        self.client = client
        self.config = config
        self.post_event = post_event
        self.now = now
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._again: set[tuple[str, str]] = set()
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._mlflow_down_since: dict[tuple[str, str], float] = {}
        self._parent_factory = parent_factory
        self.isolation = isolation or IsolationReader()
        self.passes = 0
        self._kuberay: KubeRayCRD | None = None
        self._events_read: dict[tuple[str, str, str], tuple[float, list[dict[str, Any]]]] = {}
        self._workload_kind: Kind = WORKLOAD_VERSIONS[0]
        self._unwell: dict[tuple[str, str], int] = {}
        """(namespace, run) -> passes in a row that a transient API error stopped (``_retry_delay``)."""
        self._finished: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._missing: dict[tuple[str, str], dict[str, float]] = {}
        """(namespace, run) -> child -> when (monotonic) a pass first found it gone (``MISSING_CONFIRM_SECONDS``)."""
        self._final_verdicts: set[tuple[str, int]] = set()
        """(parent MLflow run, rl attempt) whose reward watch was read after the attempt ended."""
        """(namespace, run) -> child name -> the last state a watch event showed of a finished child."""

    # ------------------------------------------------------------ scheduling

    async def trigger(self, namespace: str, name: str) -> None:
        """Run a pass now, or once more after the one in flight (bursts coalesce); waits for it."""
        key = (namespace, name)
        while True:
            task = self._running.get(key)
            if task is None:
                task = asyncio.ensure_future(self._pass_loop(key))
                self._running[key] = task
                await asyncio.shield(task)
                return
            self._again.add(key)
            await asyncio.shield(task)
            if key not in self._running:
                return

    async def _pass_loop(self, key: tuple[str, str]) -> None:
        with logcontext.about(*key):
            await self._passes(key)

    async def _passes(self, key: tuple[str, str]) -> None:
        try:
            while True:
                self._again.discard(key)
                try:
                    await self.reconcile(*key)
                except Exception as err:
                    delay = self._retry_delay(key, err)
                    if delay is None:
                        log.exception("reconciling %s/%s failed; the next event or resync retries", *key)
                    else:
                        log.warning("reconciling %s/%s: the API server is unwell (%s); the pass runs again in %.1f s", *key, err, delay)
                        self._requeue(key, delay)
                else:
                    self._unwell.pop(key, None)
                if key not in self._again:
                    return
        finally:
            self._running.pop(key, None)

    def _retry_delay(self, key: tuple[str, str], err: Exception) -> float | None:
        """When to run a pass again that the API server's state stopped (429 or 5xx past the client's
        back-off, a dropped connection, a timeout), else None. Doubles per failed pass of the run from
        1 s, at most the resync interval, and never before the server's ``Retry-After``: the pass is
        requeued, the run shows nothing (throttling is no refusal)."""
        if not (isinstance(err, ApiError) and err.transient) and not isinstance(err, aiohttp.ClientError | asyncio.TimeoutError):
            return None
        failures = self._unwell[key] = self._unwell.get(key, 0) + 1
        delay = min(float(2 ** (failures - 1)), max(self.config.resync_seconds, 1.0))
        retry_after = err.retry_after if isinstance(err, ApiError) else None
        return max(delay, retry_after or 0.0)

    def _requeue(self, key: tuple[str, str], delay: float) -> None:
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(max(delay, 0.05), lambda: asyncio.ensure_future(self.trigger(*key)))

    def shutdown(self) -> None:
        """Cancel pending retry timers (the operator is stopping; a restart re-derives them from status)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def note_child(self, namespace: str, child: dict[str, Any]) -> None:
        """Remember a stage child that a watch event showed finished (Complete, Failed, ...).

        KubeRay with ``DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true`` deletes the RayJob itself right after
        it turns Complete (``ttlSecondsAfterFinished`` 0; rayjob_controller.go v1.7.0), often before a
        pass can read it: the outcome the watch delivered (the MODIFIED or the DELETED event's last
        state) is what the pass uses when the child is gone, so a succeeded stage is never taken for
        one deleted behind the operator's back and rerun.
        """
        meta = child.get("metadata") or {}
        labels = meta.get("labels") or {}
        run, stage, name = labels.get(c.LABEL_RUN), labels.get(c.LABEL_STAGE), meta.get("name")
        if not (run and stage and name) or child_outcome(stage, child).state not in ("succeeded", "failed"):
            return
        kept = {"metadata": {"name": name, "labels": dict(labels)}, "spec": {"suspend": (child.get("spec") or {}).get("suspend")}, "status": child.get("status")}
        self._finished.setdefault((namespace, run), {})[name] = kept

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self._finished.pop(key, None)
        self._missing.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._mlflow_down_since.pop(key, None)
        self._unwell.pop(key, None)
        self.isolation.forget(namespace, name)
        self.client.forget(namespace, {sandbox_name(name), f"{name}-spec"})

    # ------------------------------------------------------------ one pass

    async def reconcile(self, namespace: str, name: str) -> Decision | None:
        self.passes += 1
        body = await self.client.get(RUNS, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(namespace, name)
            return None
        old_status = body.get("status") or {}
        current = load(old_status)
        meta = body.get("metadata") or {}
        problems = spec_problems(body)
        if not problems:  # the webhook's limits hold on clusters that run without it too
            problems = cluster_problems(body, self.config.sandbox_max_replicas)
        if not problems:
            parsed = parse_run({k: v for k, v in body.items() if k != "status"})
            problems = scheduling_problems(parsed, self.config) + kuberay_problems(parsed, await self._kuberay_crd(), self.config)
        accepted: dict[str, Any] | None = None
        if problems or immutability.needs_check(meta.get("generation"), current):
            accepted = await self._accepted(namespace, current, body)
        held, held_reason = problems, c.REASON_INVALID_SPEC
        if problems and accepted is None:
            new = invalid_spec_status(current, problems, now=self.now(), generation=meta.get("generation"))
            if await self._write_status(body, old_status, new):
                self.post_event(body, Event("Warning", c.REASON_INVALID_SPEC, new.message or "invalid spec"))
            return None
        document = {k: v for k, v in body.items() if k != "status"}
        if not problems and accepted is not None:
            normalized = {**body, "spec": run_document(parse_run(document))["spec"]}
            held, held_reason = immutability.refused_edits(accepted, normalized), c.REASON_IMMUTABLE_FIELD
        rescheduled = immutability.scheduling_change(accepted, body) if accepted is not None and not held else None
        if held:
            document = accepted or document  # act on the accepted spec; observe the running children with it
        run = parse_run(document)
        refusals: list[str] = []
        tracking, mlflow_status, wait = await self._tracking(run, current, refusals)
        await self._ensure_claim(run, current, refusals)
        observed, autoscaled = await self._observe(run, current, mlflow_status, tracking)
        results = await self._results(current, tracking)
        if results:
            observed = replace(observed, results=results)
        suspect = await self._reward_suspect(current, tracking)
        if suspect is not None:
            observed = replace(observed, reward_suspect=suspect)
        now = self.now()
        decision = decide(run, current, observed, now, sandbox_autoscaled=autoscaled)
        decision.status = self._with_cost(run, current, decision, observed, now)
        decision.status = await self._save_on_notice(decision, observed, tracking, now)
        if decision.status.cost is not None and tracking.parent_run_id and tracking.uri and cost.attempt_ended(current, decision.status):
            await log_cost(tracking.uri, tracking.parent_run_id, cost.figures(decision.status.cost))
        warnings = [str(w) for w in document_warnings(document)]
        decision.status = with_spec_warnings(decision.status, warnings, now=now, generation=meta.get("generation"))
        if warnings and not any(cond.reason == c.REASON_SPEC_WARNING for cond in current.conditions):
            decision.events.append(Event("Warning", c.REASON_SPEC_WARNING, "; ".join(warnings)))
        if self._eval_just_succeeded(current, decision.status) and tracking.parent_run_id and tracking.uri:
            decision.requeue_after = min(decision.requeue_after or 1.0, 1.0)  # next pass reads the results
        if wait is not None and decision.create:
            # MLflow is not answering yet: hold new stages for the grace period, retry soon.
            self._hold(decision, current)
            detail = wait
            unbound = await self._mlflow_claim_refusal(run)
            if unbound:
                refusals.append(unbound)
                wait = f"waiting for MLflow: {unbound}"
            short = below.short(wait)
            conds = decision.status.conditions
            for type_, value in ((c.COND_READY, False), (c.COND_RECONCILING, True)):
                conds = set_condition(conds, type_=type_, status=value, reason=c.REASON_MLFLOW_UNAVAILABLE, message=short, now=now, generation=meta.get("generation"))
            decision.status = decision.status.model_copy(update={"message": short, "conditions": conds})
            if current.message != short:
                decision.events.append(Event("Warning", c.REASON_MLFLOW_UNAVAILABLE, detail[:1024]))
            decision.requeue_after = self.config.mlflow_retry_seconds
        decision.status, stalls = stalls_below(decision.status, observed, now)
        refusals += stalls
        sandbox_refused = self._sandbox_refused(run, decision, observed)
        if sandbox_refused:
            refusals.append(sandbox_refused)
        if self._waiting_below(decision.status, observed) or observed.sandbox_refusal_settling:
            # Nothing changes on a Job whose pods its controller cannot create (no watch event reaches
            # the operator), nor on a Deployment whose fresh refusal may yet clear: read them again after
            # the read interval, not at the next resync.
            poll = max(below.EVENTS_AFTER_SECONDS, 1.0)
            decision.requeue_after = min(decision.requeue_after or poll, poll)
        if observed.claim is not None:
            failed = below.claim_refusal(observed.claim.claim.name, observed.claim.obj, observed.claim_events)
            cause = below.claim_failure(observed.claim.obj, observed.claim_events)
            if failed and cause:
                conds = set_condition(
                    decision.status.conditions,
                    type_=c.COND_STORAGE_READY,
                    status=False,
                    reason=cause[0],
                    message=failed,
                    now=now,
                    generation=meta.get("generation"),
                )
                decision.status = decision.status.model_copy(update={"conditions": conds})
        if held:
            self._hold(decision, current)
            decision.status = immutability.held_status(decision.status, held, reason=held_reason, now=now, generation=meta.get("generation"))
            if not any(cond.type == c.COND_VALID and cond.status == "False" and cond.message == _valid_message(decision.status) for cond in current.conditions):
                decision.events.append(Event("Warning", held_reason, decision.status.message or "spec edit not applied"))
        for obj in build_sandbox(run, config=self.config, replicas=decision.sandbox_replicas):
            await self._ensure(self._owned(obj, run), refusals)
        await self._act_on_clusters(run, decision, current, observed)
        for action in decision.create:
            child = build_stage_child(run, action.stage, action.attempt, config=self.config, tracking=tracking, on_cluster=action.on_cluster)
            try:
                if action.on_cluster is not None:
                    # The kept cluster's pods become the new attempt's (cost, notice, its start), as of now.
                    for pod in cluster_reuse.cluster_pods(observed.stage_pods, action.on_cluster):
                        await self.client.patch(PODS, namespace, pod["metadata"]["name"], cluster_reuse.handover_patch(action.attempt, rfc3339(now)))
                # The attempt's spec snapshot first (never patched afterwards), then the child that mounts it.
                await self.client.create(self._owned(build_spec_configmap(run, child["metadata"]["name"]), run))
                created = await self.client.create(self._owned(child, run))
            except ApiError as err:
                if not err.refused:
                    raise
                # Refused (quota, admission, a webhook): the stage stays as it was, so the status
                # never names a child that does not exist; the next pass tries again.
                refusals.append(refusal_text("create", child, err))
                self._revert_stage(decision, current, action.stage)
                continue
            log.info("%s/%s: %s %s %s", namespace, name, "created" if created else "found existing", child["kind"], child["metadata"]["name"])
        for action in decision.suspend:
            kind = stage_kind(action.stage)
            mark = SUSPENDED_BY if action.suspend else None  # only a child the operator suspended is resumed by it
            try:
                await self.client.patch(kind, namespace, action.name, {"metadata": {"annotations": {ANNOTATION_SUSPENDED: mark}}, "spec": {"suspend": action.suspend}})
            except ApiError as err:
                if not err.refused:
                    raise
                refusals.append(f"patch {kind.plural} {action.name} refused: {err.reason}")
        for wl in decision.workloads:
            mark = DEACTIVATED_BY if not wl.active else None  # only workloads we deactivated are reactivated
            try:
                await self.client.patch(self._workload_kind, namespace, wl.name, {"metadata": {"annotations": {c.ANNOTATION_DEACTIVATED: mark}}, "spec": {"active": wl.active}})
            except ApiError as err:
                if not err.refused:
                    raise
                refusals.append(f"patch workloads {wl.name} refused: {err.reason}")
        if refusals:
            decision.status = with_refusals(decision.status, refusals, previous=current.conditions, now=now, generation=meta.get("generation"))
            decision.events.append(Event("Warning", c.REASON_CHILD_REFUSED, "; ".join(refusals)))
            decision.requeue_after = min(decision.requeue_after or self.config.mlflow_retry_seconds, self.config.mlflow_retry_seconds)
        if rescheduled and current.observed_generation != meta.get("generation"):
            decision.events.append(Event("Normal", c.REASON_SCHEDULING_CHANGED, rescheduled))
        if await self._write_status(body, old_status, decision.status):
            for event in decision.events:
                self.post_event(body, event)
        for obj in observed.children.values():
            if being_deleted(obj) and holds_outcome(obj) and outcome_recorded(decision.status, obj):
                await self._release(namespace, obj)  # the status written above holds its outcome now
        if decision.requeue_after is not None:
            self._requeue((namespace, name), decision.requeue_after)
        return decision

    async def settle_deleted_child(self, namespace: str, child: dict[str, Any]) -> None:
        """A stage child being deleted while the operator's finalizer holds it: let it go once its run no
        longer needs it (the run is gone or going, or its status has moved past the child).

        Otherwise the pass its watch event triggers reads the outcome, records it and releases it. This is
        also how children held across an operator restart, or of a run deleted while the operator was
        down, are released: kopf hands every existing child to the event handler when it starts."""
        if not (being_deleted(child) and holds_outcome(child)):
            return
        run_name = ((child.get("metadata") or {}).get("labels") or {}).get(c.LABEL_RUN)
        run = await self.client.get(RUNS, namespace, run_name) if run_name else None
        if run is None or being_deleted(run) or outcome_recorded(load(run.get("status") or {}), child):
            await self._release(namespace, child)

    async def _release(self, namespace: str, child: dict[str, Any]) -> None:
        """Remove FINALIZER_OUTCOME alone. The merge patch carries the resourceVersion it was read at, so it
        cannot put back a finalizer another controller removed meanwhile (KubeRay's own): on a conflict the
        newer version's watch event brings the child back here."""
        meta = child.get("metadata") or {}
        stage = (meta.get("labels") or {}).get(c.LABEL_STAGE) or ""
        patch: dict[str, Any] = {"finalizers": [f for f in meta.get("finalizers") or [] if f != c.FINALIZER_OUTCOME]}
        if meta.get("resourceVersion"):
            patch["resourceVersion"] = meta["resourceVersion"]
        try:
            await self.client.patch(stage_kind(stage), namespace, meta["name"], {"metadata": patch})
        except ApiError as err:
            if err.status not in (404, 409):
                raise
            return
        log.info("%s/%s: released %s %s (its outcome is recorded)", namespace, (meta.get("labels") or {}).get(c.LABEL_RUN), stage_kind(stage).plural, meta["name"])

    async def _ensure(self, obj: dict[str, Any], refusals: list[str]) -> None:
        """Create-or-patch, a refusal recorded instead of raised (the pass goes on with the rest)."""
        try:
            await self.client.ensure(obj)
        except ApiError as err:
            if not err.refused:
                raise  # the API server is unwell, not refusing: the pass fails and is retried
            refusals.append(refusal_text("apply", obj, err))

    @staticmethod
    def _waiting_below(status: RetoolRunStatus, observed: Observed) -> bool:
        """A running stage's pods are not all up yet: the controllers below may be refusing or unable to place them (``below``)."""
        for entry in status.stages:
            if entry.state != "Running" or not entry.job:
                continue
            obj = observed.children.get(entry.job)
            kind = "RayJob" if entry.name in RAY_STAGES else "Job"
            if (kind == "Job" and below.job_without_pods(obj)) or below.pods_pending(kind, obj) or (kind == "RayJob" and below.wants_submitter(obj)):
                return True
        return False

    async def _mlflow_claim_refusal(self, run: RetoolRun) -> str | None:
        """Why the managed MLflow's claim has no volume (read only while MLflow does not answer), or None."""
        if not tracking_target(run, self.config).managed:
            return None
        namespace = run.metadata.namespace or "default"
        claim = await self.client.get(CLAIMS, namespace, c.MLFLOW_NAME)
        if claim is None or ((claim.get("status") or {}).get("phase") or "Pending") != "Pending" or not below.old_enough(claim, self.now()):
            return None
        return below.claim_refusal(c.MLFLOW_NAME, claim, await self._events(namespace, "PersistentVolumeClaim", c.MLFLOW_NAME))

    @staticmethod
    def _sandbox_refused(run: RetoolRun, decision: Decision, observed: Observed) -> str | None:
        """The sandbox's pods refused at creation (Pod Security, quota) while a stage needs it: a stall nothing below will resolve."""
        if not uses_sandbox(run) or not observed.sandbox_pods_refused or observed.sandbox_ready_replicas > 0 or decision.sandbox_replicas == 0:
            return None
        return f"the pods of the sandbox Deployment {sandbox_name(run.metadata.name)} are refused: {observed.sandbox_pods_refused}"

    @staticmethod
    def _hold(decision: Decision, before: RetoolRunStatus) -> None:
        """Create nothing this pass: the stages it would have started stay as they were."""
        if not decision.create:
            return
        held = {a.stage for a in decision.create}
        previous = {s.name: s for s in before.stages}
        stages = [previous.get(s.name, StageStatus(name=s.name)) if s.name in held else s for s in decision.status.stages]
        decision.status = decision.status.model_copy(update={"stages": stages, "phase": before.phase})
        decision.create = []
        decision.events[:] = [e for e in decision.events if e.reason not in (c.REASON_STAGE_STARTED, c.REASON_RETRY_STARTED)]

    async def _kuberay_crd(self) -> KubeRayCRD:
        """The installed KubeRay's RayJob CRD, read once per operator start (``kuberay_crd``)."""
        if self._kuberay is None:
            try:
                crd = await self.client.get(CRDS, None, RAYJOB_CRD)
            except ApiError as err:
                if not err.refused:
                    raise
                log.warning("cannot read the CRD %s (%s): the installed KubeRay version is not checked", RAYJOB_CRD, err.reason)
                crd = None
            self._kuberay = read_crd(crd)
        return self._kuberay

    async def _accepted(self, namespace: str, status: RetoolRunStatus, body: dict[str, Any]) -> dict[str, Any] | None:
        """The run as the operator last accepted it: the latest child's spec snapshot (None before any child)."""
        name = immutability.snapshot_name(status)
        if name is None:
            return None
        return immutability.accepted_document(await self.client.get(CONFIGMAPS, namespace, name), body)

    @staticmethod
    def _revert_stage(decision: Decision, before: RetoolRunStatus, stage: str) -> None:
        """Put ``stage`` back as it was before this pass (its create was refused)."""
        previous = {s.name: s for s in before.stages}
        stages = [previous.get(s.name, StageStatus(name=s.name)) if s.name == stage else s for s in decision.status.stages]
        decision.events[:] = [e for e in decision.events if e.reason not in (c.REASON_STAGE_STARTED, c.REASON_RETRY_STARTED)]
        decision.status = decision.status.model_copy(update={"stages": stages, "phase": phase_of(stages, suspended=decision.status.phase == "Suspended")})

    @staticmethod
    def _eval_just_succeeded(before: RetoolRunStatus, after: RetoolRunStatus) -> bool:
        was = next((s.state for s in before.stages if s.name == "eval"), None)
        now = next((s.state for s in after.stages if s.name == "eval"), None)
        return now == "Succeeded" and was != "Succeeded"

    async def _results(self, status: RetoolRunStatus, tracking: Tracking) -> dict[str, dict[str, float]]:
        """Eval results from MLflow once the eval stage has succeeded (read once, then kept in status)."""
        entry = next((s for s in status.stages if s.name == "eval"), None)
        if status.results or entry is None or entry.state != "Succeeded" or not (tracking.uri and tracking.parent_run_id):
            return {}
        return await eval_results(tracking.uri, tracking.parent_run_id, entry.attempt)

    async def _reward_suspect(self, status: RetoolRunStatus, tracking: Tracking) -> str | None:
        """The rl stage's reward-watch tag while it runs, and its last verdict once the attempt has ended.

        The trainer writes the tag from a background thread up to its last step, so the pass that
        sees the RayJob finish may read it before the last write lands (or not reach MLflow at all):
        after the attempt ends, every pass reads again until one read finds the tag. None when
        there is nothing to read (no rl yet, already read after the end, MLflow does not say).
        """
        entry = next((s for s in status.stages if s.name == "rl"), None)
        if entry is None or not (tracking.uri and tracking.parent_run_id):
            return None
        if entry.state == "Running":
            return await reward_suspect(tracking.uri, tracking.parent_run_id, entry.attempt)
        final = (tracking.parent_run_id, entry.attempt)
        if entry.state not in RL_ENDED or final in self._final_verdicts:
            return None
        verdict = await reward_suspect(tracking.uri, tracking.parent_run_id, entry.attempt)
        if verdict is not None:
            self._final_verdicts.add(final)
        return verdict

    def _with_cost(self, run: RetoolRun, current: RetoolRunStatus, decision: Decision, observed: Observed, now: dt.datetime) -> RetoolRunStatus:
        """``decision.status`` with its cost (``cost.account``); a finished run's cost is announced once, as an Event."""
        device = hardware_profile(run.spec.hardware, self.config, run.spec.trainer.verl).device_resource
        price = run.spec.cost.price_per_device_hour if run.spec.cost.price_per_device_hour is not None else self.config.price_per_device_hour
        currency = run.spec.cost.currency or self.config.currency
        spent = cost.account(decision.status, current.cost, observed.stage_pods, device_resource=device, now=now, price=price, currency=currency)
        status = decision.status.model_copy(update={"cost": spent})
        if spent is not None and status.phase in FINISHED_PHASES and current.phase not in FINISHED_PHASES:
            decision.events.append(Event("Normal", c.REASON_RUN_COST, f"run {status.phase.lower()}: {cost.ended_text(spent)}"))
        return status

    async def _save_on_notice(self, decision: Decision, observed: Observed, tracking: Tracking, now: dt.datetime) -> RetoolRunStatus:
        """The running rl attempt asked to save when its nodes are going, and what its trainer answered (docs/operations.md, "Save on notice")."""
        status = decision.status
        entry = next((s for s in status.stages if s.name == "rl" and s.state == "Running" and s.job), None)
        if entry is None or not (tracking.uri and tracking.parent_run_id):
            return status
        request = entry.save_request if entry.save_request is not None and entry.save_request.attempt == entry.attempt else None
        resumed = entry.resumed_from if entry.resumed_from is not None and entry.resumed_from.attempt == entry.attempt else None
        sign = notice.notice(notice.attempt_pods(observed.stage_pods, "rl", entry.attempt), observed.nodes, observed.workloads.get(entry.job or ""))
        if sign is not None and (request is None or not request.delivered):
            delivered = await request_save(tracking.uri, tracking.parent_run_id, entry.attempt, sign)
            if request is None:
                decision.events.append(Event("Warning", c.REASON_SAVE_REQUESTED, f"rl attempt {entry.attempt} asked to save at its next step boundary: {sign}"))
            request = SaveRequest(attempt=entry.attempt, reason=sign, requested_time=request.requested_time if request else rfc3339(now), delivered=delivered)
        if (request is not None and request.delivered and request.saved_step is None) or (entry.attempt > 1 and resumed is None):
            tags = await stage_attempt_tags(tracking.uri, tracking.parent_run_id, "rl", entry.attempt)
            saved, resumed_step = _int_tag(tags, SAVED_ON_NOTICE_TAG), _int_tag(tags, RESUMED_FROM_TAG)
            if request is not None and request.saved_step is None and saved is not None:
                request = request.model_copy(update={"saved_step": saved})
                decision.events.append(Event("Normal", c.REASON_SAVED_ON_NOTICE, f"rl attempt {entry.attempt} saved its checkpoint at step {saved} on request"))
            if resumed is None and resumed_step is not None:
                resumed = ResumePoint(attempt=entry.attempt, step=resumed_step)
                if resumed_step > 0:  # 0: the attempt started afresh (no checkpoint yet)
                    decision.events.append(Event("Normal", c.REASON_RESUMED_FROM_STEP, f"rl attempt {entry.attempt} resumed after step {resumed_step}"))
        stages = [s.model_copy(update={"save_request": request or s.save_request, "resumed_from": resumed or s.resumed_from}) if s is entry else s for s in status.stages]
        return status.model_copy(update={"stages": stages})

    def _owned(self, obj: dict[str, Any], run: RetoolRun) -> dict[str, Any]:
        uid = (run.metadata.model_extra or {}).get("uid")
        return owned_by(obj, run_name=run.metadata.name, run_uid=uid) if uid else obj

    async def _write_status(self, body: dict[str, Any], old: dict[str, Any], new: RetoolRunStatus) -> bool:
        data = status_to_write(old, dump(new), self.now())
        if data is None:
            return False
        meta = body["metadata"]
        await self.client.patch(RUNS, meta["namespace"], meta["name"], {"status": status_patch(old, data)}, subresource="status")
        return True

    async def _ensure_claim(self, run: RetoolRun, status: RetoolRunStatus, refusals: list[str]) -> None:
        """Create ``<run>-data`` before the first stage (never patched: a claim's spec is immutable).

        Owned by the run only with storage.retain: delete; otherwise it outlives the run.
        """
        claim = build_claim(run, self.config)
        if claim is None or any(s.attempt > 0 for s in status.stages):
            return
        if run_claim(run, self.config).owned_by_run:
            claim = self._owned(claim, run)
        try:
            created = await self.client.create(claim)
        except ApiError as err:
            if not err.refused:
                raise
            refusals.append(refusal_text("create", claim, err))
            return
        if created:
            log.info("%s/%s: created PersistentVolumeClaim %s", claim["metadata"]["namespace"], run.metadata.name, claim["metadata"]["name"])

    async def _observe(self, run: RetoolRun, status: RetoolRunStatus, mlflow: MLflowStatus | None, tracking: Tracking) -> tuple[Observed, bool]:
        """(what decide needs, whether an HPA manages the sandbox's replicas)."""
        namespace = run.metadata.namespace or "default"
        children: dict[str, dict[str, Any]] = {}
        child_events: dict[str, list[dict[str, Any]]] = {}
        workloads: dict[str, list[dict[str, Any]] | None] = {}
        stalls = _Stalls()
        finished = self._finished.get((namespace, run.metadata.name), {})
        current_jobs = {entry.job for entry in status.stages if entry.state in c.FOLLOWED_STATES and entry.job}
        for gone in set(finished) - current_jobs:
            finished.pop(gone, None)  # recorded in status by an earlier pass
        missing = self._missing.setdefault((namespace, run.metadata.name), {})
        for gone in set(missing) - current_jobs:
            missing.pop(gone, None)
        unconfirmed: set[str] = set()
        for entry in status.stages:
            if entry.state in c.FOLLOWED_STATES and entry.job:
                obj = await self.client.get(stage_kind(entry.name), namespace, entry.job) or finished.get(entry.job)
                if obj is None and time.monotonic() - missing.setdefault(entry.job, time.monotonic()) < MISSING_CONFIRM_SECONDS:
                    unconfirmed.add(entry.job)
                elif obj is not None:
                    missing.pop(entry.job, None)
                    children[entry.job] = obj
                    if entry.name not in RAY_STAGES and below.job_without_pods(obj) and below.old_enough(obj, self.now()):
                        child_events[entry.job] = await self._events(namespace, "Job", entry.job)
                    if entry.state == "Running":
                        await self._observe_start(namespace, run.metadata.name, entry, obj, stalls)
                    if child_queue(obj) or (obj.get("spec") or {}).get("suspend") or run.spec.suspend:
                        # Kueue may own it (queued, or managed without a queue name): its Workloads say.
                        workloads[entry.job] = await self._workloads(namespace, obj)
        active: dict[str, list[str]] = {}
        submitters: dict[str, list[str]] = {}
        running: dict[str, list[str]] = {}
        not_yet_running = any(s.state == "Running" and s.running_time is None for s in status.stages)
        stage_pods: list[dict[str, Any]] | None = None
        if may_create(status, children) or not_yet_running or current_jobs or (status.cost is not None and status.cost.pods):
            # Every pass while a stage is followed or the cost ledger holds a pod: the pods' times are what a run costs.
            stage_pods = await self.client.list(PODS, namespace, label_selector=f"{c.LABEL_RUN}={run.metadata.name},{c.LABEL_ROLE}={c.COMPONENT_STAGE}")
        if may_create(status, children) or not_yet_running:
            active, submitters, running = active_pods(run.metadata.name, stage_pods or [])
        nodes: dict[str, dict[str, Any] | None] = {}
        rl = next((s for s in status.stages if s.name == "rl" and s.state == "Running"), None)
        if rl is not None:
            for node in notice.nodes_of(notice.attempt_pods(stage_pods, "rl", rl.attempt)):
                nodes[node] = await self.client.get(NODES, "", node)
        ray_clusters, same_spec = await self._ray_clusters(run, status, children, stage_pods, nodes, tracking)
        ready, autoscaled, isolation, refused, settling = 0, False, None, None, False
        hpa_min: int | None = None
        spec_replicas: int | None = None
        gate: SandboxGate | None = None
        if uses_sandbox(run):
            deployment = await self.client.get(DEPLOYMENTS, namespace, sandbox_name(run.metadata.name))
            ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
            seen_at = self.now()
            refused = below.replica_failure(deployment, seen_at)
            settling = below.replicas_refusal_settling(deployment, seen_at)
            hpa = await self.client.get(HPAS, namespace, sandbox_name(run.metadata.name))
            autoscaled = hpa is not None
            hpa_min = int(((hpa or {}).get("spec") or {}).get("minReplicas") or 1) if hpa else None
            spec_replicas = ((deployment or {}).get("spec") or {}).get("replicas") if deployment else None
            isolation = await self._sandbox_isolation(namespace, run.metadata.name, deployment)
            gate = await self._sandbox_gate(namespace, run.metadata.name, deployment, ready_timeout_s=run.spec.sandbox.ready_timeout_seconds)
        claim: ClaimObservation | None = None
        claim_events: list[dict[str, Any]] | None = None
        extra_claims: dict[str, dict[str, Any] | None] = {}
        if not any(s.attempt > 0 for s in status.stages) or status.storage is None or status.storage.phase != "Bound":
            spec = run_claim(run, self.config)
            claim = ClaimObservation(spec, await self.client.get(CLAIMS, namespace, spec.name))
            if not any(s.attempt > 0 for s in status.stages):
                for extra, _ in extra_claim_names(run):
                    extra_claims[extra] = await self.client.get(CLAIMS, namespace, extra)
            first = not any(s.attempt > 0 for s in status.stages)  # before the first stage a settled claim is asked at once
            wait = below.CLAIM_SETTLE_SECONDS if first else below.EVENTS_AFTER_SECONDS
            if claim.obj is not None and ((claim.obj.get("status") or {}).get("phase") or "Pending") == "Pending" and below.old_enough(claim.obj, self.now(), wait):
                claim_events = await self._events(namespace, "PersistentVolumeClaim", spec.name)
        details = await self._failure_details(namespace, run.metadata.name, status, children)
        notes = await self._stage_notes(namespace, run.metadata.name, status, children)
        observed = Observed(
            children=children,
            active_pods=active,
            submitter_pods=submitters,
            running_pods=running,
            stage_pods=stage_pods,
            nodes=nodes,
            failure_details=details,
            stage_notes=notes,
            sandbox_ready_replicas=ready,
            sandbox_pods_refused=refused,
            sandbox_refusal_settling=settling,
            sandbox_spec_replicas=spec_replicas,
            sandbox_hpa_min_replicas=hpa_min,
            mlflow=mlflow,
            claim=claim,
            workloads=workloads,
            child_events=child_events,
            claim_events=claim_events,
            extra_claims=extra_claims,
            sandbox_isolation=isolation,
            sandbox_gate=gate,
            submitter_jobs=stalls.submitter_jobs,
            submitter_events=stalls.submitter_events,
            unschedulable=stalls.unschedulable,
            missing_unconfirmed=unconfirmed,
            ray_clusters=ray_clusters,
            same_cluster_spec=same_spec,
        )
        return observed, autoscaled

    async def _ray_clusters(
        self,
        run: RetoolRun,
        status: RetoolRunStatus,
        children: dict[str, dict[str, Any]],
        stage_pods: list[dict[str, Any]] | None,
        nodes: dict[str, dict[str, Any] | None],
        tracking: Tracking,
    ) -> tuple[dict[str, dict[str, Any] | None], dict[str, bool]]:
        """The Ray clusters ``cluster_reuse`` decides on: each one a stage keeps, and that of a running attempt
        whose job failed; whether the run still renders what each runs; and the nodes under their pods (added
        to ``nodes``)."""
        namespace = run.metadata.namespace or "default"
        clusters: dict[str, dict[str, Any] | None] = {}
        same: dict[str, bool] = {}
        for entry in status.stages:
            owner: dict[str, Any] | None = None
            if entry.ray_cluster is not None:
                name, owner_attempt = entry.ray_cluster.name, entry.ray_cluster.attempt - 1
                if cluster_reuse.kept_for(entry) is not None:
                    owner = await self.client.get(RAYJOBS, namespace, entry.ray_cluster.owner)
            elif entry.state == "Running" and entry.job and cluster_reuse.enabled(run, entry.name) and cluster_reuse.job_failed(children.get(entry.job)):
                owner, owner_attempt = children[entry.job], entry.attempt
                name = ((owner.get("status") or {}).get("rayClusterName")) or ""
            else:
                continue
            if not name:
                continue
            clusters[name] = await self.client.get(RAYCLUSTERS, namespace, name)
            if owner is not None and clusters[name] is not None:
                recorded = ((owner.get("metadata") or {}).get("annotations") or {}).get(cluster_reuse.ANNOTATION_FINGERPRINT)
                same[name] = recorded == cluster_fingerprint(run, entry.name, owner_attempt, config=self.config, tracking=tracking)
                for node in notice.nodes_of(cluster_reuse.cluster_pods(stage_pods, name)):
                    if node not in nodes:
                        nodes[node] = await self.client.get(NODES, "", node)
        return clusters, same

    async def _act_on_clusters(self, run: RetoolRun, decision: Decision, current: RetoolRunStatus, observed: Observed) -> None:
        """Keep failed attempts' clusters, delete the kept ones no attempt needs, stop the attempts spec.suspend
        ended on a kept cluster, and delete at once a cluster KubeRay would keep for the reuse window only
        (``cluster_reuse``)."""
        namespace = run.metadata.namespace or "default"
        for keep in decision.keep:
            try:
                await self.client.patch(RAYJOBS, namespace, keep.rayjob, cluster_reuse.keep_patch())
                log.info("%s/%s: kept Ray cluster %s of %s for the retry", namespace, run.metadata.name, keep.cluster, keep.rayjob)
            except ApiError as err:
                if not (err.refused or err.status == 404):
                    raise
                self._give_up(decision, keep.stage, f"its RayJob {keep.rayjob} could not be patched: {err.reason}")
        for kept in cluster_reuse.to_release(decision.status.stages):
            seen = observed.ray_clusters.get(kept.name, {})
            if seen is not None and not ((seen.get("metadata") or {}).get("deletionTimestamp")):
                await self.client.delete(RAYCLUSTERS, namespace, kept.name)
        for rayjob in decision.delete:
            await self.client.delete(RAYJOBS, namespace, rayjob)
        for cluster in cluster_reuse.ended_unkept(run, current.stages, decision.status.stages, observed.children):
            await self.client.delete(RAYCLUSTERS, namespace, cluster)

    @staticmethod
    def _give_up(decision: Decision, stage: str, why: str) -> None:
        stages = list(decision.status.stages)
        for i, entry in enumerate(stages):
            if entry.name == stage and entry.ray_cluster is not None:
                stages[i] = entry.model_copy(update={"ray_cluster": entry.ray_cluster.model_copy(update={"released": why})})
        decision.status = decision.status.model_copy(update={"stages": stages})

    async def _observe_start(self, namespace: str, run_name: str, entry: StageStatus, obj: dict[str, Any], stalls: _Stalls) -> None:
        """Whether a running stage's pods can start: KubeRay's submitter Job, and the scheduler's verdict on
        its pods, read only while they are not all up and the child is old enough (``below``)."""
        now, child = self.now(), entry.job or ""
        if not below.old_enough(obj, now):
            return
        kind = "RayJob" if entry.name in RAY_STAGES else "Job"
        if kind == "RayJob" and below.wants_submitter(obj):
            submitter = await self.client.get(JOBS, namespace, child)
            if submitter is not None:
                stalls.submitter_jobs[child] = submitter
                if below.job_without_pods(submitter) and below.old_enough(submitter, now):
                    stalls.submitter_events[child] = await self._events(namespace, "Job", child)
        if below.pods_pending(kind, obj):
            selector = f"{c.LABEL_RUN}={run_name},{c.LABEL_STAGE}={entry.name},{c.LABEL_ATTEMPT}={entry.attempt}"
            text = below.unschedulable(await self.client.list(PODS, namespace, label_selector=selector), now)
            if text:
                stalls.unschedulable[child] = text

    async def _events(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """The Events about one object (what its controller reported), read at most every
        ``below.EVENTS_AFTER_SECONDS`` per object (a claim many runs share is read once for all)."""
        key = (namespace, kind, name)
        cached = self._events_read.get(key)
        if cached is not None and time.monotonic() - cached[0] < below.EVENTS_AFTER_SECONDS:
            return cached[1]
        events = await self.client.list(EVENTS, namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}")
        if len(self._events_read) > 4096:
            self._events_read.clear()  # bounded: entries are only a read-rate limit
        self._events_read[key] = (time.monotonic(), events)
        return events

    async def _sandbox_isolation(self, namespace: str, run_name: str, deployment: dict[str, Any] | None) -> IsolationObservation | None:
        """The isolation the sandbox pods report in /readyz; None while the sandbox has no pods."""
        spec, st = (deployment or {}).get("spec") or {}, (deployment or {}).get("status") or {}
        if not int(st.get("replicas") or 0) and not int(spec.get("replicas") or 0):
            return None
        pods = await self.client.list(PODS, namespace, label_selector=f"{c.LABEL_RUN}={run_name},{c.LABEL_ROLE}={c.COMPONENT_SANDBOX}")
        if not pods:
            return None
        return IsolationObservation(await self.isolation.read(namespace, run_name, pods))

    async def _workloads(self, namespace: str, child: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The Kueue Workloads of a child (by its uid), None when the cluster serves no Workload API."""
        uid = (child.get("metadata") or {}).get("uid")
        if not uid:
            return []
        items: list[dict[str, Any]] | None = None
        for kind in sorted(WORKLOAD_VERSIONS, key=lambda k: k != self._workload_kind):  # the one that answered last first
            try:
                items = await self.client.list(kind, namespace, label_selector=f"{c.KUEUE_JOB_UID_LABEL}={uid}")
            except ApiError as err:
                if err.status == 404:
                    continue
                raise
            self._workload_kind = kind
            break
        if items is None:
            return None
        return [w for w in items if ((w.get("metadata") or {}).get("labels") or {}).get(c.KUEUE_JOB_UID_LABEL) == uid]

    async def _failure_details(self, namespace: str, run_name: str, status: RetoolRunStatus, children: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Failed Job name -> the termination message its stage container left (read only on a failure)."""
        details: dict[str, str] = {}
        for entry in status.stages:
            obj = children.get(entry.job or "")
            if obj is None or entry.name in RAY_STAGES or child_outcome(entry.name, obj).state != "failed":
                continue
            selector = f"{c.LABEL_RUN}={run_name},{c.LABEL_STAGE}={entry.name},{c.LABEL_ATTEMPT}={entry.attempt}"
            for pod in await self.client.list(PODS, namespace, label_selector=selector):
                message = termination_message(pod, STAGE_CONTAINER)
                if message:
                    details[entry.job or ""] = message
        return details

    async def _sandbox_gate(self, namespace: str, run_name: str, deployment: dict[str, Any] | None, *, ready_timeout_s: float) -> SandboxGate | None:
        """Whether the sandbox can serve a preflight; its pods (and Kueue's Workloads of gated ones) are read only while no replica is ready."""
        if deployment is None:
            return None
        if int(((deployment.get("status") or {}).get("readyReplicas")) or 0) >= 1 or not int((deployment.get("spec") or {}).get("replicas") or 0):
            return sandbox_gate(deployment, [])
        pods = await self.client.list(PODS, namespace, label_selector=f"{c.LABEL_RUN}={run_name},{c.LABEL_ROLE}={c.COMPONENT_SANDBOX}")
        kueue: dict[str, str] = {}
        for pod in pods:
            if KUEUE_GATE in [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]:
                kueue[(pod.get("metadata") or {}).get("name", "?")] = queue_message(child_queue(pod), await self._workloads(namespace, pod))
        return sandbox_gate(deployment, pods, now=self.now(), ready_timeout_s=ready_timeout_s, kueue=kueue)

    async def _stage_notes(self, namespace: str, run_name: str, status: RetoolRunStatus, children: dict[str, dict[str, Any]]) -> dict[str, str]:
        """The preflight Job that succeeded since the last pass -> its warnings (its container's termination message)."""
        notes: dict[str, str] = {}
        for entry in status.stages:
            obj = children.get(entry.job or "")
            if entry.name != "preflight" or entry.state == "Succeeded" or obj is None or child_outcome(entry.name, obj).state != "succeeded":
                continue
            selector = f"{c.LABEL_RUN}={run_name},{c.LABEL_STAGE}={entry.name},{c.LABEL_ATTEMPT}={entry.attempt}"
            for pod in await self.client.list(PODS, namespace, label_selector=selector):
                message = termination_message(pod, STAGE_CONTAINER)
                if message.startswith(WARNINGS_PREFIX):
                    notes[entry.job or ""] = message
        return notes

    async def _tracking(self, run: RetoolRun, status: RetoolRunStatus, refusals: list[str]) -> tuple[Tracking, MLflowStatus, str | None]:
        """(what stages get, status.mlflow, a reason to hold new stages or None)."""
        namespace = run.metadata.namespace or "default"
        target = tracking_target(run, self.config)
        if target.managed:  # cheap when unchanged: the client skips recently applied objects
            for obj in build_mlflow(namespace, config=self.config):
                await self._ensure(obj, refusals)
        known = status.mlflow
        experiment = experiment_name(run)
        if known is not None and known.run_id and same_tracker(known.url, target.uri):
            return Tracking(target.uri, experiment, known.run_id), known, None
        base = MLflowStatus(url=target.uri)
        if self._parent_factory is None:
            return Tracking(target.uri, experiment, None), base, None
        key = (namespace, run.metadata.name)
        try:
            parent = await ensure_parent_run(run, target.uri, self._parent_factory)
        except Exception as err:  # MLflow down, DNS, timeout: all mean "not yet"
            since = self._mlflow_down_since.setdefault(key, time.monotonic())
            waited = time.monotonic() - since
            log.warning("%s/%s: MLflow at %s not ready (%s); waited %.0fs", namespace, run.metadata.name, target.uri, err, waited)
            if waited < self.config.mlflow_grace_seconds:
                return Tracking(target.uri, experiment, None), base, f"waiting for MLflow at {target.uri}: {err}"
            return Tracking(target.uri, experiment, None), base, None
        self._mlflow_down_since.pop(key, None)
        mlflow = MLflowStatus(url=parent.url or target.uri, experiment_id=parent.experiment_id, run_id=parent.run_id)
        return Tracking(target.uri, experiment, parent.run_id), mlflow, None
