"""Who owns a child's ``spec.suspend`` is read from the child, never from the run's current spec.

Kueue v0.19.0 manages a Job or RayJob that carries ``kueue.x-k8s.io/queue-name`` (set by the
operator from ``spec.scheduling.queueName``, or by Kueue's defaulting webhook when the namespace has
a LocalQueue named ``default``: ``ApplyDefaultLocalQueue``, pkg/controller/jobframework/defaults.go)
and, with ``manageJobsWithoutQueueName``, an unlabelled one too (``ApplyDefaultForSuspend`` suspends
it at creation; its reconciler makes a Workload for it). Its job reconciler re-starts an admitted job
that anyone else suspends, so writing ``suspend`` of such a child starts a fight.
"""

from __future__ import annotations

from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.queueing import ANNOTATION_SUSPENDED
from retool_operator.reconcile import Observed, SetSuspend, SetWorkloadActive, decide
from tests.operator.helpers import T0, rayjob_status, run_of

CHILD = "demo-sft-1"
WORKLOAD = "rayjob-demo-sft-1-abcde"


def sft(state: str) -> RetoolRunStatus:
    return RetoolRunStatus(
        stages=[StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"), StageStatus(name="sft", state=state, attempt=1, job=CHILD)]
    )


def rayjob(*, suspend: bool, queue: str | None = None, ours: bool = False, running: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": "uid-child", "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}}
    if ours:
        meta["annotations"] = {ANNOTATION_SUSPENDED: "retool-operator"}
    return {"metadata": meta, "spec": {"suspend": suspend}, **rayjob_status("Running" if running else "Suspended", "RUNNING" if running else None)}


def workload() -> dict[str, Any]:
    return {"metadata": {"name": WORKLOAD, "labels": {"kueue.x-k8s.io/job-uid": "uid-child"}}, "spec": {"active": True}}


CASES = [
    # id, run's scheduling, run's suspend, stage state, child, workloads, expected state, suspend patches, workload actions
    (
        "kueue's default LocalQueue labelled the child of a run without queueName: suspend is left to Kueue",
        {},
        False,
        "Running",
        rayjob(suspend=True, queue="default", running=False),
        [workload()],
        "Queued",
        [],
        [],
    ),
    (
        "manageJobsWithoutQueueName: an unlabelled child with a Workload is Kueue's",
        {},
        False,
        "Running",
        rayjob(suspend=True, running=False),
        [workload()],
        "Queued",
        [],
        [],
    ),
    (
        "queueName removed mid-run: the child Kueue holds stays held",
        {},
        False,
        "Queued",
        rayjob(suspend=True, queue="team-a", running=False),
        [workload()],
        "Queued",
        [],
        [],
    ),
    (
        "queueName added mid-run, then spec.suspend: the unqueued child is suspended by the operator",
        {"queueName": "team-a"},
        True,
        "Running",
        rayjob(suspend=False),
        [],
        "Suspended",
        [SetSuspend("sft", CHILD, True)],
        [],
    ),
    (
        "spec.suspend of a child Kueue admitted without a queue name deactivates its Workload",
        {},
        True,
        "Running",
        rayjob(suspend=False),
        [workload()],
        "Suspended",
        [],
        [SetWorkloadActive("sft", WORKLOAD, False)],
    ),
    (
        "a child something else suspended (no Workload yet) is not resumed",
        {},
        False,
        "Running",
        rayjob(suspend=True, running=False),
        [],
        "Queued",
        [],
        [],
    ),
    ("a child the operator suspended is resumed", {}, False, "Suspended", rayjob(suspend=True, ours=True, running=False), [], "Running", [SetSuspend("sft", CHILD, False)], []),
    (
        "no Kueue API on the cluster: a suspended child is resumed",
        {},
        False,
        "Suspended",
        rayjob(suspend=True, running=False),
        None,
        "Running",
        [SetSuspend("sft", CHILD, False)],
        [],
    ),
]


@pytest.mark.parametrize(
    ("scheduling", "suspend", "state", "obj", "workloads", "expected", "patches", "actions"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_child_says_who_owns_its_suspend(scheduling, suspend, state, obj, workloads, expected, patches, actions) -> None:
    run = run_of(scheduling=scheduling, suspend=suspend)
    decision = decide(run, sft(state), Observed(children={CHILD: obj}, workloads={CHILD: workloads}), T0)
    entry = next(s for s in decision.status.stages if s.name == "sft")
    assert (entry.state, decision.suspend, decision.workloads) == (expected, patches, actions)
    assert decision.create == []


def test_the_queue_message_names_the_childs_own_queue() -> None:
    run = run_of()  # no queueName in the spec: Kueue's default LocalQueue took the child
    decision = decide(run, sft("Running"), Observed(children={CHILD: rayjob(suspend=True, queue="default", running=False)}, workloads={CHILD: []}), T0)
    entry = next(s for s in decision.status.stages if s.name == "sft")
    assert "Kueue queue default" in (entry.message or "")
