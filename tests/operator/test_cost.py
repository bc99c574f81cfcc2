"""A run's device-hours from its pods' real times (retool_operator.cost), and when they are written.

The pods are shaped as the API server returns them: the scheduler's ``PodScheduled`` condition
(``lastTransitionTime`` when it bound the pod), the kubelet's ``containerStatuses[].state.terminated``
(``finishedAt``) once the pod is Succeeded or Failed, the device as an extended resource in both
requests and limits (equal, as the API server requires of extended resources).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from retool.spec.status import CostStatus, RetoolRunStatus, StageStatus
from retool_operator import constants as c
from retool_operator.cost import account, ended_text, pod_devices
from retool_operator.status import OBSERVED_HEARTBEAT_SECONDS, dump, rfc3339, status_to_write

GPU = "nvidia.com/gpu"
T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def pod(name: str, stage: str, attempt: int, *, devices: int = 8, scheduled: float | None = 0.0, finished: list[float] | None = None, phase: str | None = None) -> dict[str, Any]:
    """A stage pod: scheduled at minute ``scheduled``, its containers finished at ``finished`` minutes (terminated)."""
    containers = [{"name": "ray-worker", "resources": {"requests": {"cpu": "8", GPU: str(devices)}, "limits": {GPU: str(devices)}}}]
    if devices == 0:
        containers = [{"name": "submitter", "resources": {"requests": {"cpu": "1"}}}]
    status: dict[str, Any] = {"phase": phase or ("Succeeded" if finished else "Running" if scheduled is not None else "Pending"), "conditions": []}
    if scheduled is not None:
        status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(at(scheduled))})
    else:
        status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": rfc3339(at(0))})
    if finished:
        status["containerStatuses"] = [
            {"name": f"c{i}", "state": {"terminated": {"exitCode": 0, "finishedAt": rfc3339(at(m)), "startedAt": rfc3339(at(scheduled or 0))}}} for i, m in enumerate(finished)
        ]
    labels = {c.LABEL_RUN: "r", c.LABEL_ROLE: c.COMPONENT_STAGE, c.LABEL_STAGE: stage, c.LABEL_ATTEMPT: str(attempt)}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}, "spec": {"containers": containers}, "status": status}


def run_status(**states: tuple[str, int]) -> RetoolRunStatus:
    return RetoolRunStatus(stages=[StageStatus(name=name, state=state, attempt=attempt) for name, (state, attempt) in states.items()])


def test_a_pod_holds_its_devices_from_scheduled_to_its_last_container_end() -> None:
    cost = account(run_status(sft=("Running", 1)), None, [pod("head", "sft", 1, scheduled=0, finished=[30, 60], phase="Failed")], device_resource=GPU, now=at(90))
    assert cost is not None and cost.device_hours == 8.0  # 8 devices x 1 h, to the later container's end, not to now
    assert cost.pods[0].end_time == rfc3339(at(60))


def test_a_running_pod_counts_up_to_now_and_an_unscheduled_or_deviceless_pod_not_at_all() -> None:
    pods = [pod("worker", "rl", 1, scheduled=0), pod("waiting", "rl", 1, scheduled=None), pod("submitter", "rl", 1, devices=0)]
    cost = account(run_status(rl=("Running", 1)), None, pods, device_resource=GPU, now=at(45))
    assert cost is not None and cost.device_hours == 6.0 and [p.name for p in cost.pods] == ["worker"]


@pytest.mark.parametrize(
    ("pod_resources", "expected"),
    [
        ({"requests": {GPU: "4"}, "limits": {GPU: "4"}}, 4),
        ({"limits": {GPU: "2"}}, 2),  # an extended resource's request defaults to its limit
        ({"requests": {"cpu": "8"}}, 0),
        ({"requests": {"huawei.com/Ascend910": "8"}}, 0),  # another device than the profile's
    ],
)
def test_devices_are_the_profiles_resource_summed_over_containers(pod_resources: dict[str, Any], expected: int) -> None:
    two = {"spec": {"containers": [{"name": "a", "resources": pod_resources}, {"name": "b", "resources": pod_resources}]}}
    assert pod_devices(two, GPU) == 2 * expected
    assert pod_devices(two, "") == 0  # a CPU run's profile names no device


def test_a_pod_that_is_gone_is_settled_into_its_attempt_and_leaves_the_ledger() -> None:
    status = run_status(sft=("Running", 2))
    first = account(status, None, [pod("a1", "sft", 1, scheduled=0), pod("a1b", "sft", 1, scheduled=0, finished=[20])], device_resource=GPU, now=at(25))
    assert first is not None and {p.name for p in first.pods} == {"a1", "a1b"}
    # attempt 1's cluster deleted: a1 vanished while running (counted to this pass), a1b had ended at 20
    later = account(status, first, [pod("a2", "sft", 2, scheduled=40)], device_resource=GPU, now=at(45))
    assert later is not None and [p.name for p in later.pods] == ["a2"]
    one = next(a for a in later.attempts if a.attempt == 1)
    assert one.settled_device_hours == pytest.approx(8 * 45 / 60 + 8 * 20 / 60) and one.device_hours == pytest.approx(one.settled_device_hours, abs=1e-3)
    assert one.lost and not next(a for a in later.attempts if a.attempt == 2).lost
    assert later.lost_device_hours == pytest.approx(one.device_hours, abs=1e-3)
    assert later.device_hours == pytest.approx(one.device_hours + 8 * 5 / 60, abs=1e-3)
    # settled hours stay put in later passes, whatever the clock says
    again = account(status, later, [pod("a2", "sft", 2, scheduled=40)], device_resource=GPU, now=at(100))
    assert again is not None and next(a for a in again.attempts if a.attempt == 1).settled_device_hours == one.settled_device_hours


def test_pods_not_read_this_pass_keep_the_ledger_as_it_is() -> None:
    status = run_status(sft=("Running", 1))
    first = account(status, None, [pod("a1", "sft", 1, scheduled=0)], device_resource=GPU, now=at(10))
    kept = account(status, first, None, device_resource=GPU, now=at(20))
    assert kept is not None and [p.name for p in kept.pods] == ["a1"] and kept.attempts[0].settled_device_hours == 0


def test_the_last_attempt_of_a_failed_stage_is_lost_and_per_point_follows_the_score() -> None:
    status = run_status(sft=("Succeeded", 1), rl=("Failed", 2)).model_copy(update={"score": None})
    pods = [pod("s", "sft", 1, scheduled=0, finished=[60]), pod("r1", "rl", 1, scheduled=60, finished=[120]), pod("r2", "rl", 2, scheduled=120, finished=[150])]
    cost = account(status, None, pods, device_resource=GPU, now=at(200))
    assert cost is not None
    assert cost.stages == {"sft": 8.0, "rl": 12.0} and cost.lost_device_hours == 12.0 and cost.device_hours_per_point is None
    scored = account(status.model_copy(update={"score": 0.4}), None, pods, device_resource=GPU, now=at(200))
    assert scored is not None and scored.device_hours_per_point == pytest.approx(20.0 / 40)


def test_a_price_gives_money_and_no_price_gives_hours_only() -> None:
    pods = [pod("s", "sft", 1, scheduled=0, finished=[60])]
    priced = account(run_status(sft=("Succeeded", 1)), None, pods, device_resource=GPU, now=at(60), price=2.5, currency="EUR")
    assert priced is not None and (priced.amount, priced.currency) == (20.0, "EUR")
    assert ended_text(priced) == "8 device-hours, 20.00 EUR"
    plain = account(run_status(sft=("Succeeded", 1)), None, pods, device_resource=GPU, now=at(60), currency="EUR")
    assert plain is not None and plain.amount is None and plain.currency is None


def test_a_run_that_never_held_a_device_has_no_cost_section() -> None:
    assert account(run_status(prepare=("Running", 1)), None, [pod("p", "prepare", 1, devices=0)], device_resource=GPU, now=at(5)) is None


def _written(old_cost: CostStatus, new_cost: CostStatus, *, seconds_since: float) -> dict[str, Any] | None:
    status = run_status(rl=("Running", 1)).model_copy(update={"phase": "RL"})
    old = {**dump(status.model_copy(update={"cost": old_cost})), "observedAt": rfc3339(at(0))}
    return status_to_write(old, dump(status.model_copy(update={"cost": new_cost})), at(0) + dt.timedelta(seconds=seconds_since))


def test_the_clock_alone_writes_the_cost_only_at_the_heartbeat_and_a_pod_change_at_once() -> None:
    status = run_status(rl=("Running", 1))
    running = [pod("r", "rl", 1, scheduled=0)]
    before = account(status, None, running, device_resource=GPU, now=at(1))
    after = account(status, before, running, device_resource=GPU, now=at(2))
    assert before is not None and after is not None and after.device_hours > before.device_hours
    assert _written(before, after, seconds_since=60) is None
    assert _written(before, after, seconds_since=OBSERVED_HEARTBEAT_SECONDS + 1) is not None
    ended = account(status, before, [pod("r", "rl", 1, scheduled=0, finished=[2])], device_resource=GPU, now=at(2))
    assert ended is not None and _written(before, ended, seconds_since=60) is not None
