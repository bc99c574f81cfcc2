"""Pure status helpers: conditions in the metav1.Condition shape, phase, progress, invalid-spec status.

The reconciler builds the whole next status with these and the handler writes it only when it
differs from the current one (one patch per pass, as Kubeflow Trainer does).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from retool.spec.status import PHASE_OF_STAGE, Condition, RetoolRunStatus, StageStatus
from retool_operator import constants as c

FINISHED_STAGE_STATES = frozenset({"Succeeded", "Skipped"})
STARTED_STAGE_STATES = frozenset({"Running", "Retrying", "Succeeded", "Failed", "Suspended"})


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def set_condition(
    conditions: list[Condition], *, type_: str, status: bool | None, reason: str, message: str, now: dt.datetime, generation: int | None
) -> list[Condition]:
    """``conditions`` with ``type_`` set (``status`` None: Unknown); lastTransitionTime moves only when the status flips."""
    value = "Unknown" if status is None else "True" if status else "False"
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        since = cond.last_transition_time if cond.status == value else rfc3339(now)
        out.append(Condition(type=type_, status=value, reason=reason, message=message, last_transition_time=since, observed_generation=generation))
    if not found:
        out.append(Condition(type=type_, status=value, reason=reason, message=message, last_transition_time=rfc3339(now), observed_generation=generation))
    return out


def current_stage(stages: list[StageStatus]) -> StageStatus | None:
    """The first stage that is not finished (Failed counts as current), else None."""
    return next((s for s in stages if s.state not in FINISHED_STAGE_STATES), None)


def phase_of(stages: list[StageStatus], *, suspended: bool) -> str:
    if any(s.state == "Failed" for s in stages):
        return "Failed"
    stage = current_stage(stages)
    if stage is None:
        return "Succeeded"
    if suspended:
        return "Suspended"
    if stage.attempt == 0 and not any(s.state == "Succeeded" for s in stages):
        return "Pending"  # nothing started yet (a later stage waiting for pods keeps its own phase)
    return PHASE_OF_STAGE[stage.name]


def progress_of(stages: list[StageStatus]) -> str | None:
    """``rl 4/5`` (the stage's position among the enabled stages), plus the attempt on a retry."""
    enabled = [s for s in stages if s.state != "Skipped"]
    stage = current_stage(stages)
    if stage is None:
        return f"done {len(enabled)}/{len(enabled)}" if enabled else None
    index = next(i for i, s in enumerate(enabled, start=1) if s.name == stage.name)
    text = f"{stage.name} {index}/{len(enabled)}"
    if stage.attempt > 1:
        text += f" (attempt {stage.attempt})"
    return text


def pipeline_conditions(
    previous: list[Condition],
    stages: list[StageStatus],
    phase: str,
    *,
    waiting: str | None,
    sandbox: tuple[int | None, int] | None,
    sandbox_refused: str | None = None,
    now: dt.datetime,
    generation: int | None,
) -> list[Condition]:
    """Every condition of a valid run, from its stages (kstatus Ready/Reconciling/Stalled and the rest).

    ``waiting``: why the next child is held back (earlier pods still terminating), if it is.
    ``sandbox``: (desired replicas or None when an HPA owns them, ready replicas); None for a run
    without a sandbox (text-only), which then has no SandboxReady condition. ``sandbox_refused``: the
    message of the Deployment's ReplicaFailure condition, shown while replicas are missing.
    """
    current = current_stage(stages)
    detail = (current.message or "") if current else "all stages succeeded"

    def put(conds: list[Condition], type_: str, ok: bool, reason: str, message: str) -> list[Condition]:
        return set_condition(conds, type_=type_, status=ok, reason=reason, message=message, now=now, generation=generation)

    failed, done, suspended = phase == "Failed", phase == "Succeeded", phase == "Suspended"
    retrying = current is not None and current.state == "Retrying"
    if failed:
        reason = c.REASON_STAGE_FAILED
    elif suspended:
        reason = c.REASON_SUSPENDED
    elif done:
        reason = c.REASON_COMPLETED
    elif waiting is not None:
        reason = c.REASON_WAITING_FOR_PODS
    elif retrying:
        reason = c.REASON_STAGE_RETRYING
    elif current is not None and current.attempt == 0 and phase == "Pending":
        reason = c.REASON_PENDING
    elif current is not None and current.state == "Queued":
        reason = c.REASON_QUEUED
    else:
        reason = c.REASON_STAGE_RUNNING
    conds = put(previous, c.COND_VALID, True, c.REASON_VALID_SPEC, "spec accepted")
    conds = put(conds, c.COND_READY, done, reason, detail)
    progressing = not (failed or done or suspended)
    conds = put(conds, c.COND_RECONCILING, progressing, reason if progressing else c.REASON_FINISHED, detail if progressing else "")
    conds = put(conds, c.COND_STALLED, failed, c.REASON_STAGE_FAILED if failed else c.REASON_NOT_STALLED, detail if failed else "")
    conds = put(conds, c.COND_FAILED, failed, c.REASON_STAGE_FAILED if failed else c.REASON_STAGE_RUNNING, detail if failed else "")
    conds = put(conds, c.COND_SUCCEEDED, done, c.REASON_COMPLETED if done else c.REASON_PENDING, detail if done else "")
    conds = put(conds, c.COND_SUSPENDED, suspended, c.REASON_SUSPENDED if suspended else c.REASON_NOT_SUSPENDED, "spec.suspend is true" if suspended else "")
    if sandbox is None:
        return [cond for cond in conds if cond.type != c.COND_SANDBOX_READY]
    replicas, ready = sandbox
    if replicas is None:
        sandbox_ok, sandbox_reason, text = ready > 0, c.REASON_SANDBOX_READY if ready else c.REASON_SANDBOX_NOT_READY, f"{ready} replicas ready (replicas managed by an HPA)"
    elif replicas == 0:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_SCALED_DOWN, False, "scaled to zero: no stage that calls it (rl, eval) is running"
    elif ready >= replicas:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_READY, True, f"{ready}/{replicas} replicas ready"
    else:
        sandbox_reason, sandbox_ok, text = c.REASON_SANDBOX_NOT_READY, False, f"{ready}/{replicas} replicas ready"
    if sandbox_refused and not sandbox_ok and replicas != 0:
        sandbox_reason, text = c.REASON_SANDBOX_PODS_REFUSED, f"{text}; its pods are refused: {sandbox_refused}"[:1024]
    return put(conds, c.COND_SANDBOX_READY, sandbox_ok, sandbox_reason, text)


def with_refusals(status: RetoolRunStatus, refusals: list[str], *, previous: list[Condition], now: dt.datetime, generation: int | None) -> RetoolRunStatus:
    """``status`` with the API server's refusals of this pass: Stalled=True and Ready=False, naming them.

    A refused create or patch (quota, admission webhook, policy) is retried on every pass; the
    conditions say so until the API server accepts it, so ``kubectl describe`` and kstatus-based
    tools (Flux, Argo CD) show why the run does not move. Transition times are kept relative to
    ``previous`` (the stored conditions), so a refusal that persists writes no new status.
    """
    if not refusals:
        return status
    message = "; ".join(refusals)[:4000]
    conds = list(status.conditions)
    # Stalled and Reconciling are never both True (kstatus reads the first True one it meets).
    for type_, value, text in ((c.COND_STALLED, True, message), (c.COND_READY, False, message), (c.COND_RECONCILING, False, "")):
        before = [cond for cond in previous if cond.type == type_]
        (cond,) = set_condition(before, type_=type_, status=value, reason=c.REASON_CHILD_REFUSED, message=text, now=now, generation=generation)
        conds = [cond if x.type == type_ else x for x in conds] if any(x.type == type_ for x in conds) else [*conds, cond]
    return status.model_copy(update={"conditions": conds, "message": short_message(message)})


SHORT_MESSAGE_CHARS = 200
"""``status.message`` (the ``kubectl get rr`` column) is cut here; the conditions and the Event keep the full text."""


def short_message(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= SHORT_MESSAGE_CHARS else line[: SHORT_MESSAGE_CHARS - 1] + "…"


def with_spec_warnings(status: RetoolRunStatus, warnings: list[str], *, now: dt.datetime, generation: int | None) -> RetoolRunStatus:
    """The SpecValid condition's message carries what was accepted but looks wrong."""
    if not warnings:
        return status
    message = "spec accepted with warnings: " + "; ".join(warnings)
    conds = set_condition(status.conditions, type_=c.COND_VALID, status=True, reason=c.REASON_SPEC_WARNING, message=message, now=now, generation=generation)
    return status.model_copy(update={"conditions": conds})


def headline_score(results: dict[str, dict[str, float]], first_eval_set: str, n: int) -> float | None:
    """mean@n of the first eval set: the AIME printer column."""
    metrics = results.get(first_eval_set) or {}
    value = metrics.get(f"mean@{n}")
    return None if value is None else float(value)


def dump(status: RetoolRunStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase, unset optionals omitted)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


OBSERVED_HEARTBEAT_SECONDS = 300.0
"""How often an unchanged status of an unfinished run is written anyway, to refresh ``observedAt``:
often enough that a stale status is told apart within minutes, rarely enough to cost nothing
(one status write per run per 5 minutes, where the resync reads it every 30 s)."""
FINISHED_PHASES = ("Succeeded", "Failed")


LIVE_COST_FIGURES = ("deviceHours", "lostDeviceHours", "deviceHoursPerPoint", "amount", "stages")
"""The figures of ``status.cost`` that grow with the clock while a pod runs (``retool_operator.cost``): a
change in them alone does not make a pass write the status. They are written with any other change and
at the heartbeat, so they are as of ``observedAt``."""


def _without_clock(status: dict[str, Any]) -> dict[str, Any]:
    """The status as compared for a write: no ``observedAt``, no cost figure that only the clock moved."""
    kept = {k: v for k, v in status.items() if k != "observedAt"}
    cost = kept.get("cost")
    if cost:
        kept["cost"] = {k: v for k, v in cost.items() if k not in LIVE_COST_FIGURES}
        kept["cost"]["attempts"] = [{k: v for k, v in a.items() if k != "deviceHours"} for a in cost.get("attempts") or []]
    return kept


def status_to_write(old: dict[str, Any], new: dict[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    """``new`` stamped with ``observedAt``, or None when nothing needs writing.

    Written when anything but ``observedAt`` and the clock's cost figures changed, or when an unfinished run's ``observedAt`` is
    missing or older than ``OBSERVED_HEARTBEAT_SECONDS``; a finished run's status is left alone.
    """
    changed = _without_clock(new) != _without_clock(old)
    if not changed:
        if new.get("phase") in FINISHED_PHASES:
            return None
        seen = old.get("observedAt")
        if seen and (now - dt.datetime.fromisoformat(str(seen).replace("Z", "+00:00"))).total_seconds() < OBSERVED_HEARTBEAT_SECONDS:
            return None
    return {**new, "observedAt": rfc3339(now)}


def load(data: dict[str, Any] | None) -> RetoolRunStatus:
    """The current status; unknown or malformed fields (e.g. from an older operator) are dropped."""
    data = dict(data or {})
    known = {f.alias or name for name, f in RetoolRunStatus.model_fields.items()}
    data = {k: v for k, v in data.items() if k in known}
    try:
        return RetoolRunStatus.model_validate(data)
    except ValueError:
        return RetoolRunStatus()


def invalid_spec_status(previous: RetoolRunStatus, problems: list[str], *, now: dt.datetime, generation: int | None) -> RetoolRunStatus:
    """Phase Failed with every problem in the message and a SpecValid=False condition."""
    message = "invalid spec: " + "; ".join(problems)
    conditions = set_condition(
        previous.conditions, type_=c.COND_VALID, status=False, reason=c.REASON_INVALID_SPEC, message=message, now=now, generation=generation
    )
    conditions = set_condition(conditions, type_=c.COND_FAILED, status=True, reason=c.REASON_INVALID_SPEC, message=message, now=now, generation=generation)
    conditions = set_condition(conditions, type_=c.COND_READY, status=False, reason=c.REASON_INVALID_SPEC, message=message, now=now, generation=generation)
    conditions = set_condition(conditions, type_=c.COND_STALLED, status=True, reason=c.REASON_INVALID_SPEC, message=message, now=now, generation=generation)
    conditions = set_condition(conditions, type_=c.COND_RECONCILING, status=False, reason=c.REASON_INVALID_SPEC, message="", now=now, generation=generation)
    return previous.model_copy(update={"phase": "Failed", "message": message, "conditions": conditions, "observed_generation": generation})
