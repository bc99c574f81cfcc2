"""Edits of a run whose stages started: refused by the webhook, held by the operator without it, never
seen by a stage that already started; and updates that are not edits are always admitted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool.spec.validate import parse_run
from retool_operator import immutability
from retool_operator.builders import build_spec_configmap, run_document
from retool_operator.config import OperatorConfig
from retool_operator.webhook import review
from tests.operator.helpers import document

RL_STARTED = {"stages": [{"name": "prepare", "state": "Succeeded"}, {"name": "sft", "state": "Skipped"}, {"name": "merge", "state": "Skipped"}]}


def old_with(rl_state: str) -> dict[str, Any]:
    """A run without SFT (so only rl reads ``hardware``) whose rl stage is in ``rl_state``."""
    doc = document(sft={"enabled": False})
    doc["status"] = copy.deepcopy(RL_STARTED)
    doc["status"]["stages"].append({"name": "rl", "state": rl_state, "attempt": 1, "job": "demo-rl-1"})
    return doc


def edited(old: dict[str, Any], section: str, values: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    new["spec"][section] = {**new["spec"].get(section, {}), **values}
    return new


@pytest.mark.parametrize("state", ["Queued", "Running", "Suspended", "Retrying"])
@pytest.mark.parametrize(("section", "values"), [("hardware", {"nodes": 2}), ("rl", {"steps": 10})], ids=["hardware-nodes", "rl-steps"])
def test_the_webhook_refuses_edits_to_inputs_of_a_stage_whose_child_exists(state: str, section: str, values: dict[str, Any]) -> None:
    """Queued is a started stage too: created and waiting for admission, or preempted (the resumed
    child would run the new spec on a cluster sized for the old one)."""
    old = old_with(state)
    problems = review("UPDATE", edited(old, section, values), old, max_sandbox_replicas=64)
    assert any(p.startswith(f"spec.{section}: cannot change after stage rl started") for p in problems)


SMALLER = OperatorConfig(_env_file=None, mlflow_tracking_uri="", sandbox_max_replicas=1)
VOLCANO = OperatorConfig(_env_file=None, mlflow_tracking_uri="", batch_scheduler="volcano")


@pytest.mark.parametrize(
    ("change", "config"),
    [
        (lambda d: d["metadata"].update(finalizers=[]), SMALLER),
        (lambda d: d["metadata"].setdefault("annotations", {}).update({"kopf.retool.dev/last": "x"}), VOLCANO),
        (lambda d: d["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[]), SMALLER),
    ],
    ids=[
        "finalizer-removal-after-the-replica-limit-was-lowered",
        "annotation-update-after-a-batch-scheduler-was-set",
        "any-update-of-a-run-being-deleted",
    ],
)
def test_updates_that_leave_the_spec_alone_are_admitted_under_any_later_settings(change, config: OperatorConfig) -> None:
    old = document(scheduling={"queueName": "team-a"}, sandbox={"maxConcurrent": 64, "perReplicaConcurrency": 16})
    old["metadata"]["finalizers"] = ["kopf.retool.dev/finalizer"]
    assert review("UPDATE", old, None, config)  # the run would not be admitted today...
    new = copy.deepcopy(old)
    change(new)
    assert review("UPDATE", new, old, config) == []  # ...yet it can still be updated and deleted


def test_a_spec_edit_is_still_judged_against_the_current_settings() -> None:
    old = document(sandbox={"maxConcurrent": 32, "perReplicaConcurrency": 16})
    new = edited(old, "sandbox", {"maxConcurrent": 64})
    assert review("UPDATE", new, old, SMALLER)


# ---------------------------------------------------------------- the operator's own check


def status_of(doc: dict[str, Any]) -> RetoolRunStatus:
    return RetoolRunStatus.model_validate(doc["status"])


def test_the_accepted_spec_is_the_latest_childs_snapshot() -> None:
    old = old_with("Running")
    run = parse_run({k: v for k, v in old.items() if k != "status"})
    assert immutability.snapshot_name(status_of(old)) == "demo-rl-1-spec"
    accepted = immutability.accepted_document(build_spec_configmap(run, "demo-rl-1"), {**old, "metadata": {**old["metadata"], "generation": 3}})
    assert accepted is not None and accepted["metadata"]["generation"] == 3 and accepted["spec"] == run_document(run)["spec"]


@pytest.mark.parametrize(
    ("section", "values", "refused"),
    [("rl", {"steps": 10}, ["spec.rl"]), ("hardware", {"nodes": 2}, ["spec.hardware"]), ("sandbox", {"maxConcurrent": 64}, [])],
    ids=["rl-edit-held", "hardware-edit-held", "sandbox-edit-applied"],
)
def test_the_operator_holds_edits_to_started_stages_without_the_webhook(section: str, values: dict[str, Any], refused: list[str]) -> None:
    old = old_with("Queued")
    run = parse_run({k: v for k, v in old.items() if k != "status"})
    accepted = immutability.accepted_document(build_spec_configmap(run, "demo-rl-1"), old)
    assert accepted is not None
    new = edited(old, section, values)
    normalized = {**new, "spec": run_document(parse_run({k: v for k, v in new.items() if k != "status"}))["spec"]}
    problems = immutability.refused_edits(accepted, normalized)
    assert [p.split(":")[0] for p in problems] == refused


def test_a_held_edit_is_looked_at_again_until_it_is_reverted() -> None:
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")], observed_generation=2)
    assert immutability.needs_check(3, status) and not immutability.needs_check(2, status)
    import datetime as dt

    held = immutability.held_status(status, ["spec.model: cannot change"], reason="ImmutableFieldChanged", now=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), generation=2)
    assert immutability.needs_check(2, held)
    conds = {c.type: (c.status, c.reason) for c in held.conditions}
    assert conds["SpecValid"] == ("False", "ImmutableFieldChanged") and conds["Stalled"] == ("True", "ImmutableFieldChanged")


def test_a_scheduling_edit_after_a_stage_started_is_explained() -> None:
    """spec.scheduling is not frozen; the run says the existing child keeps its queue (Kueue refuses relabelling it)."""
    from retool_operator.immutability import scheduling_change

    accepted = {"spec": {"scheduling": {"queueName": "team-a"}}}
    assert scheduling_change(accepted, {"spec": {"scheduling": {"queueName": "team-a"}}}) is None
    text = scheduling_change(accepted, {"spec": {"scheduling": {"queueName": "team-b", "priorityClassName": "high"}}})
    assert text is not None and text.startswith("spec.scheduling.priorityClassName, spec.scheduling.queueName changed after a stage started")
    assert "existing child keeps" in text
