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
    conditions: list[Condition], *, type_: str, status: bool, reason: str, message: str, now: dt.datetime, generation: int | None
) -> list[Condition]:
    """``conditions`` with ``type_`` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
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
    if stage.attempt == 0:
        return "Pending"
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


def headline_score(results: dict[str, dict[str, float]], first_eval_set: str, n: int) -> float | None:
    """mean@n of the first eval set: the AIME printer column."""
    metrics = results.get(first_eval_set) or {}
    value = metrics.get(f"mean@{n}")
    return None if value is None else float(value)


def dump(status: RetoolRunStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase, unset optionals omitted)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


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
    return previous.model_copy(update={"phase": "Failed", "message": message, "conditions": conditions, "observed_generation": generation})
