"""Sandbox replicas per pass: full size only while a stage that calls it runs (never while it waits in a
queue or after a preemption), and zero when nothing needs it even with an HPA (the HPA controller
stops scaling a target at zero: ``ScalingDisabled`` in pkg/controller/podautoscaler/horizontal.go,
Kubernetes v1.36.3)."""

from __future__ import annotations

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.reconcile import Observed, decide
from tests.operator.helpers import T0, rayjob_status, run_of

QUEUE = {"queueName": "team-a"}


def at_rl(state: str) -> RetoolRunStatus:
    done = [StageStatus(name=s, state="Succeeded", attempt=1, job=f"demo-{s}-1") for s in ("prepare", "sft", "merge")]
    return RetoolRunStatus(stages=[*done, StageStatus(name="rl", state=state, attempt=1, job="demo-rl-1")])


def rl_child(*, suspend: bool, deployment: str = "Running") -> dict:
    return {"metadata": {"uid": "u", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "spec": {"suspend": suspend}, **rayjob_status(deployment)}


FINISHED = RetoolRunStatus(stages=[StageStatus(name=s, state="Succeeded", attempt=1, job=f"demo-{s}-1") for s in ("prepare", "sft", "merge", "rl", "eval")])

CASES = [
    # id, status, child, autoscaled, hpa min, replicas now, expected
    ("rl running: full size", at_rl("Running"), rl_child(suspend=False), False, None, 0, 2),
    ("rl waiting for admission: zero", at_rl("Queued"), rl_child(suspend=True, deployment="Suspended"), False, None, 2, 0),
    ("rl preempted (was running, queue suspended it): zero", at_rl("Running"), rl_child(suspend=True, deployment="Suspending"), False, None, 2, 0),
    ("hpa, rl waiting for admission: zero, which also stops the hpa", at_rl("Queued"), rl_child(suspend=True, deployment="Suspended"), True, 3, 5, 0),
    ("hpa, run finished: zero", FINISHED, None, True, 3, 4, 0),
    ("hpa, rl running from zero: lifted to the hpa's minimum once", at_rl("Running"), rl_child(suspend=False), True, 3, 0, 3),
    ("hpa, rl running and scaled by the hpa: left to it", at_rl("Running"), rl_child(suspend=False), True, 3, 5, None),
]


@pytest.mark.parametrize(("status", "child", "autoscaled", "hpa_min", "now", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sandbox_replicas(status, child, autoscaled: bool, hpa_min, now, expected) -> None:
    run = run_of(scheduling=QUEUE)
    children = {"demo-rl-1": child} if child else {}
    observed = Observed(children=children, workloads={"demo-rl-1": []}, sandbox_spec_replicas=now, sandbox_hpa_min_replicas=hpa_min)
    decision = decide(run, status, observed, T0, sandbox_autoscaled=autoscaled)
    assert decision.sandbox_replicas == expected
