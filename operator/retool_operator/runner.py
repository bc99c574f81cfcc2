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
from retool.spec.names import RAY_STAGES, sandbox_name
from retool.spec.status import MLflowStatus, RetoolRunStatus, StageStatus
from retool.spec.validate import parse_run
from retool_operator import constants as c
from retool_operator.builders import Tracking, build_mlflow, build_sandbox, build_spec_configmap, build_stage_child, experiment_name, owned_by
from retool_operator.config import OperatorConfig
from retool_operator.kube import KINDS, Kind, KubeClient
from retool_operator.reconcile import Decision, Event, Observed, decide
from retool_operator.status import dump, invalid_spec_status, load
from retool_operator.tracking import ensure_parent_run, eval_results, tracking_target
from retool_operator.webhook import spec_problems

log = logging.getLogger(__name__)

RUNS = KINDS[(c.RUN_API_VERSION, c.RUN_KIND)]
DEPLOYMENTS = KINDS[("apps/v1", "Deployment")]
EventSink = Callable[[dict[str, Any], Event], None]


def stage_kind(stage: str) -> Kind:
    return KINDS[("ray.io/v1", "RayJob")] if stage in RAY_STAGES else KINDS[("batch/v1", "Job")]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


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
        if problems:
            new = invalid_spec_status(current, problems, now=self.now(), generation=meta.get("generation"))
            if await self._write_status(body, old_status, new):
                self.post_event(body, Event("Warning", c.REASON_INVALID_SPEC, new.message or "invalid spec"))
            return None
        run = parse_run({k: v for k, v in body.items() if k != "status"})
        tracking, mlflow_status, wait = await self._tracking(run, current)
        await self.client.ensure(self._owned(build_spec_configmap(run), run))
        observed = await self._observe(run, current, mlflow_status)
        results = await self._results(current, tracking)
        if results:
            observed = replace(observed, results=results)
        decision = decide(run, current, observed, self.now())
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
            await self.client.ensure(self._owned(obj, run))
        for action in decision.create:
            child = build_stage_child(run, action.stage, action.attempt, config=self.config, tracking=tracking)
            created = await self.client.create(self._owned(child, run))
            log.info("%s/%s: %s %s %s", namespace, name, "created" if created else "found existing", child["kind"], child["metadata"]["name"])
        for action in decision.suspend:
            kind = stage_kind(action.stage)
            await self.client.patch(kind, namespace, action.name, {"spec": {"suspend": action.suspend}})
        if await self._write_status(body, old_status, decision.status):
            for event in decision.events:
                self.post_event(body, event)
        if decision.requeue_after is not None:
            self._requeue((namespace, name), decision.requeue_after)
        return decision

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

    async def _observe(self, run: RetoolRun, status: RetoolRunStatus, mlflow: MLflowStatus | None) -> Observed:
        namespace = run.metadata.namespace or "default"
        children: dict[str, dict[str, Any]] = {}
        for entry in status.stages:
            if entry.state in ("Running", "Suspended") and entry.job:
                obj = await self.client.get(stage_kind(entry.name), namespace, entry.job)
                if obj is not None:
                    children[entry.job] = obj
        deployment = await self.client.get(DEPLOYMENTS, namespace, sandbox_name(run.metadata.name))
        ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        return Observed(children=children, sandbox_ready_replicas=ready, mlflow=mlflow)

    async def _tracking(self, run: RetoolRun, status: RetoolRunStatus) -> tuple[Tracking, MLflowStatus, str | None]:
        """(what stages get, status.mlflow, a reason to hold new stages or None)."""
        namespace = run.metadata.namespace or "default"
        target = tracking_target(run, self.config)
        if target.managed:  # cheap when unchanged: the client skips recently applied objects
            for obj in build_mlflow(namespace, config=self.config):
                await self.client.ensure(obj)
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

