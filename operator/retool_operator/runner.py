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
from dataclasses import replace
from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, sandbox_name, stage_child_name
from retool.spec.status import MLflowStatus, RetoolRunStatus, StageStatus
from retool.spec.validate import document_warnings, parse_run
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
    queued,
    run_claim,
    scheduling_problems,
    uses_sandbox,
)
from retool_operator.builders.stages import STAGE_CONTAINER
from retool_operator.claims import ClaimObservation
from retool_operator.config import OperatorConfig
from retool_operator.isolation import IsolationObservation
from retool_operator.kube import KINDS, ApiError, Kind, KubeClient
from retool_operator.readyz import IsolationReader
from retool_operator.reconcile import Decision, Event, Observed, child_outcome, decide
from retool_operator.status import dump, invalid_spec_status, load, phase_of, replica_failure, with_refusals, with_spec_warnings
from retool_operator.tracking import ensure_parent_run, eval_results, reward_suspect, tracking_target
from retool_operator.webhook import cluster_problems, spec_problems

log = logging.getLogger(__name__)

RUNS = KINDS[(c.RUN_API_VERSION, c.RUN_KIND)]
DEPLOYMENTS = KINDS[("apps/v1", "Deployment")]
PODS = KINDS[("v1", "Pod")]
HPAS = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
TERMINATED_POD_PHASES = frozenset({"Succeeded", "Failed"})
CLAIMS = KINDS[("v1", "PersistentVolumeClaim")]
WORKLOADS = KINDS[("kueue.x-k8s.io/v1beta1", "Workload")]
DEACTIVATED_BY = "retool-operator"
EventSink = Callable[[dict[str, Any], Event], None]


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


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def refusal_text(verb: str, obj: dict[str, Any], err: ApiError) -> str:
    return f"{verb} {obj['kind']} {obj['metadata']['name']} refused: {err.reason}"


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
        try:
            while True:
                self._again.discard(key)
                try:
                    await self.reconcile(*key)
                except Exception:
                    log.exception("reconciling %s/%s failed; the next event or resync retries", *key)
                if key not in self._again:
                    return
        finally:
            self._running.pop(key, None)

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

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._mlflow_down_since.pop(key, None)
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
            problems = scheduling_problems(parse_run({k: v for k, v in body.items() if k != "status"}), self.config)
        if problems:
            new = invalid_spec_status(current, problems, now=self.now(), generation=meta.get("generation"))
            if await self._write_status(body, old_status, new):
                self.post_event(body, Event("Warning", c.REASON_INVALID_SPEC, new.message or "invalid spec"))
            return None
        document = {k: v for k, v in body.items() if k != "status"}
        run = parse_run(document)
        refusals: list[str] = []
        tracking, mlflow_status, wait = await self._tracking(run, current, refusals)
        await self._ensure(self._owned(build_spec_configmap(run), run), refusals)
        await self._ensure_claim(run, current, refusals)
        observed, autoscaled = await self._observe(run, current, mlflow_status)
        results = await self._results(current, tracking)
        if results:
            observed = replace(observed, results=results)
        suspect = await self._reward_suspect(current, tracking)
        if suspect is not None:
            observed = replace(observed, reward_suspect=suspect)
        now = self.now()
        decision = decide(run, current, observed, now, sandbox_autoscaled=autoscaled)
        warnings = [str(w) for w in document_warnings(document)]
        decision.status = with_spec_warnings(decision.status, warnings, now=now, generation=meta.get("generation"))
        if warnings and not any(cond.reason == c.REASON_SPEC_WARNING for cond in current.conditions):
            decision.events.append(Event("Warning", c.REASON_SPEC_WARNING, "; ".join(warnings)))
        if self._eval_just_succeeded(current, decision.status) and tracking.parent_run_id and tracking.uri:
            decision.requeue_after = min(decision.requeue_after or 1.0, 1.0)  # next pass reads the results
        if wait is not None and decision.create:
            # MLflow is not answering yet: hold new stages for the grace period, retry soon.
            held = {a.stage for a in decision.create}
            before = {s.name: s for s in current.stages}
            stages = [before.get(s.name, StageStatus(name=s.name)) if s.name in held else s for s in decision.status.stages]
            decision.status = decision.status.model_copy(update={"stages": stages, "phase": current.phase, "message": wait})
            decision.create, decision.events = [], []
            decision.requeue_after = self.config.mlflow_retry_seconds
        for obj in build_sandbox(run, config=self.config, replicas=decision.sandbox_replicas):
            await self._ensure(self._owned(obj, run), refusals)
        for action in decision.create:
            child = build_stage_child(run, action.stage, action.attempt, config=self.config, tracking=tracking)
            try:
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
            try:
                await self.client.patch(kind, namespace, action.name, {"spec": {"suspend": action.suspend}})
            except ApiError as err:
                if not err.refused:
                    raise
                refusals.append(f"patch {kind.plural} {action.name} refused: {err.reason}")
        for wl in decision.workloads:
            mark = DEACTIVATED_BY if not wl.active else None  # only workloads we deactivated are reactivated
            try:
                await self.client.patch(WORKLOADS, namespace, wl.name, {"metadata": {"annotations": {c.ANNOTATION_DEACTIVATED: mark}}, "spec": {"active": wl.active}})
            except ApiError as err:
                if not err.refused:
                    raise
                refusals.append(f"patch {WORKLOADS.plural} {wl.name} refused: {err.reason}")
        if refusals:
            decision.status = with_refusals(decision.status, refusals, previous=current.conditions, now=now, generation=meta.get("generation"))
            decision.events.append(Event("Warning", c.REASON_CHILD_REFUSED, "; ".join(refusals)))
            decision.requeue_after = min(decision.requeue_after or self.config.mlflow_retry_seconds, self.config.mlflow_retry_seconds)
        if await self._write_status(body, old_status, decision.status):
            for event in decision.events:
                self.post_event(body, event)
        if decision.requeue_after is not None:
            self._requeue((namespace, name), decision.requeue_after)
        return decision

    async def _ensure(self, obj: dict[str, Any], refusals: list[str]) -> None:
        """Create-or-patch, a refusal recorded instead of raised (the pass goes on with the rest)."""
        try:
            await self.client.ensure(obj)
        except ApiError as err:
            if not err.refused:
                raise  # the API server is unwell, not refusing: the pass fails and is retried
            refusals.append(refusal_text("apply", obj, err))

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
        """The rl stage's reward-watch tag while it runs (None when it is not running or MLflow does not say)."""
        entry = next((s for s in status.stages if s.name == "rl"), None)
        if entry is None or entry.state != "Running" or not (tracking.uri and tracking.parent_run_id):
            return None
        return await reward_suspect(tracking.uri, tracking.parent_run_id, entry.attempt)

    def _owned(self, obj: dict[str, Any], run: RetoolRun) -> dict[str, Any]:
        uid = (run.metadata.model_extra or {}).get("uid")
        return owned_by(obj, run_name=run.metadata.name, run_uid=uid) if uid else obj

    async def _write_status(self, body: dict[str, Any], old: dict[str, Any], new: RetoolRunStatus) -> bool:
        data = dump(new)
        if data == old:
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

    async def _observe(self, run: RetoolRun, status: RetoolRunStatus, mlflow: MLflowStatus | None) -> tuple[Observed, bool]:
        """(what decide needs, whether an HPA manages the sandbox's replicas)."""
        namespace = run.metadata.namespace or "default"
        children: dict[str, dict[str, Any]] = {}
        workloads: dict[str, list[dict[str, Any]] | None] = {}
        for entry in status.stages:
            if entry.state in ("Running", "Queued", "Suspended") and entry.job:
                obj = await self.client.get(stage_kind(entry.name), namespace, entry.job)
                if obj is not None:
                    children[entry.job] = obj
                    if queued(run):
                        workloads[entry.job] = await self._workloads(namespace, obj)
        active: dict[str, list[str]] = {}
        if may_create(status, children):
            active = await self._active_pods(namespace, run.metadata.name)
        ready, autoscaled, isolation, refused = 0, False, None, None
        if uses_sandbox(run):
            deployment = await self.client.get(DEPLOYMENTS, namespace, sandbox_name(run.metadata.name))
            ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
            refused = replica_failure(deployment)
            autoscaled = await self.client.get(HPAS, namespace, sandbox_name(run.metadata.name)) is not None
            isolation = await self._sandbox_isolation(namespace, run.metadata.name, deployment)
        claim: ClaimObservation | None = None
        if not any(s.attempt > 0 for s in status.stages) or status.storage is None or status.storage.phase != "Bound":
            spec = run_claim(run, self.config)
            claim = ClaimObservation(spec, await self.client.get(CLAIMS, namespace, spec.name))
        details = await self._failure_details(namespace, run.metadata.name, status, children)
        observed = Observed(
            children=children,
            active_pods=active,
            failure_details=details,
            sandbox_ready_replicas=ready,
            sandbox_pods_refused=refused,
            mlflow=mlflow,
            claim=claim,
            workloads=workloads,
            sandbox_isolation=isolation,
        )
        return observed, autoscaled

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
        try:
            items = await self.client.list(WORKLOADS, namespace, label_selector=f"{c.KUEUE_JOB_UID_LABEL}={uid}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return [w for w in items if ((w.get("metadata") or {}).get("labels") or {}).get(c.KUEUE_JOB_UID_LABEL) == uid]

    async def _failure_details(
        self, namespace: str, run_name: str, status: RetoolRunStatus, children: dict[str, dict[str, Any]]
    ) -> dict[str, str]:
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

    async def _active_pods(self, namespace: str, run_name: str) -> dict[str, list[str]]:
        """Stage child name -> its pods that still run or are still terminating."""
        selector = f"{c.LABEL_RUN}={run_name},{c.LABEL_ROLE}={c.COMPONENT_STAGE}"
        active: dict[str, list[str]] = {}
        for pod in await self.client.list(PODS, namespace, label_selector=selector):
            meta = pod.get("metadata") or {}
            lbls = meta.get("labels") or {}
            stage, attempt = lbls.get(c.LABEL_STAGE), lbls.get(c.LABEL_ATTEMPT)
            if (pod.get("status") or {}).get("phase") in TERMINATED_POD_PHASES or stage is None or not (attempt or "").isdigit():
                continue
            active.setdefault(stage_child_name(run_name, stage, int(attempt)), []).append(meta.get("name", "?"))
        return active

    async def _tracking(self, run: RetoolRun, status: RetoolRunStatus, refusals: list[str]) -> tuple[Tracking, MLflowStatus, str | None]:
        """(what stages get, status.mlflow, a reason to hold new stages or None)."""
        namespace = run.metadata.namespace or "default"
        target = tracking_target(run, self.config)
        if target.managed:  # cheap when unchanged: the client skips recently applied objects
            for obj in build_mlflow(namespace, config=self.config):
                await self._ensure(obj, refusals)
        known = status.mlflow
        experiment = experiment_name(run)
        if known is not None and known.run_id:
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

