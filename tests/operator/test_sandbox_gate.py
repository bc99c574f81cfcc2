"""The preflight starts once the sandbox has a ready replica; the wait is bounded by spec.sandbox.readyTimeoutSeconds
from the oldest waiting replica's creation (and by Kubernetes' ProgressDeadlineExceeded when a rollout sets it), and
what keeps a replica from being ready - Kueue's gate with Kueue's reason, the scheduler, an image pull - is named
with its fix. The same on the real control plane: tests/e2e/test_stalls.py.

Waiting reasons are the kubelet's (Kubernetes v1.36 ``pkg/kubelet/images/types.go``); the progress
condition is the Deployment controller's (``pkg/controller/deployment/util/deployment_util.go``:
``Progressing`` False with reason ``ProgressDeadlineExceeded``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.reconcile import CreateChild, Observed, decide
from retool_operator.sandbox_gate import sandbox_gate
from tests.operator.helpers import T0, job_status, run_of
from tests.operator.test_preflight_stage import PREFLIGHT, TEXT_ONLY, stage

IMAGE = "registry.example/retool/sandbox:0.1.0"


def deployment(ready: int = 0, replicas: int = 1, progressing: tuple[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"replicas": replicas, "readyReplicas": ready}
    if progressing:
        status["conditions"] = [{"type": "Progressing", "status": progressing[0], "reason": progressing[1], "message": 'ReplicaSet "demo-sandbox-7f" has timed out progressing.'}]
    return {"spec": {"replicas": replicas}, "status": status}


def pod(waiting: str | None = None, message: str = "", scheduled: bool = True, created: str = "2026-01-01T00:00:00Z", **meta: Any) -> dict[str, Any]:
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}
    status: dict[str, Any] = {"conditions": [] if scheduled else [unschedulable]}
    if waiting:
        status["containerStatuses"] = [{"name": "sandbox", "image": IMAGE, "state": {"waiting": {"reason": waiting, "message": message}}}]
    return {"metadata": {"name": "demo-sandbox-7f-abcde", "creationTimestamp": created, **meta}, "status": status}


def gated() -> dict[str, Any]:
    """A pod Kueue's webhook gated (the gate in its spec, PodScheduled=False/SchedulingGated from the scheduler)."""
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "Scheduling is blocked due to non-empty scheduling gates"}
    spec = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    return {"metadata": {"name": "demo-sandbox-7f-abcde", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec, "status": {"conditions": [scheduled]}}


STALLED = deployment(progressing=("False", "ProgressDeadlineExceeded"))
BACK_OFF = f'Back-off pulling image "{IMAGE}"'
GATES = [
    ("a ready replica lets the preflight start", deployment(ready=1), [], "ready", "", ""),
    ("a first image pull in progress is waited for", deployment(), [pod("ContainerCreating")], "waiting", "WaitingForSandbox",
     "no replica ready yet (pod demo-sandbox-7f-abcde: ContainerCreating)"),
    ("an unschedulable pod is named while waiting", deployment(), [pod(scheduled=False)], "waiting", "WaitingForSandbox",
     "pod demo-sandbox-7f-abcde cannot be scheduled (Unschedulable: 0/3 nodes are available: 3 Insufficient cpu.)"),
    ("ImagePullBackOff is reported as such", deployment(), [pod("ImagePullBackOff", BACK_OFF)], "waiting", "SandboxImagePullFailing",
     f"pod demo-sandbox-7f-abcde cannot pull {IMAGE}: ImagePullBackOff: {BACK_OFF}"),
    ("ErrImagePull is reported as such", deployment(), [pod("ErrImagePull", "manifest unknown")], "waiting", "SandboxImagePullFailing",
     "ErrImagePull: manifest unknown"),
    ("past the progress deadline the wait ends with the pull failure", STALLED, [pod("ImagePullBackOff", "not found")], "failed", "SandboxNotProgressing",
     f"exceeded its progress deadline): pod demo-sandbox-7f-abcde cannot pull {IMAGE}: ImagePullBackOff: not found"),
    ("past the progress deadline without a pull failure", STALLED, [], "failed", "SandboxNotProgressing", "has timed out progressing"),
    ("still progressing: keep waiting", deployment(progressing=("True", "ReplicaSetUpdated")), [pod("ContainerCreating")], "waiting", "WaitingForSandbox",
     "ContainerCreating"),
]  # fmt: skip


@pytest.mark.parametrize(("dep", "pods", "state", "reason", "fragment"), [case[1:] for case in GATES], ids=[case[0] for case in GATES])
def test_sandbox_gate(dep: dict[str, Any], pods: list[dict[str, Any]], state: str, reason: str, fragment: str) -> None:
    gate = sandbox_gate(dep, pods)
    assert (gate.state, gate.reason) == (state, reason)
    assert fragment in gate.message, gate.message


NOW = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.UTC)  # 600 s after the pods' creation
KUEUE = {"demo-sandbox-7f-abcde": "waiting for admission by Kueue queue default: couldn't assign flavors to pod set main: insufficient quota for cpu"}
TIMED = [
    ("before the bound: waiting, with Kueue's reason", deployment(), [gated()], 601, "waiting", "WaitingForSandbox",
     "pod demo-sandbox-7f-abcde is held by Kueue: waiting for admission by Kueue queue default: couldn't assign flavors"),
    ("at the bound a Kueue-held replica fails, with Kueue's reason and the fix", deployment(), [gated()], 600, "failed", "SandboxNotProgressing",
     "not ready 600 s after its replica was created (spec.sandbox.readyTimeoutSeconds): pod demo-sandbox-7f-abcde is held by Kueue: waiting for admission by "
     "Kueue queue default: couldn't assign flavors to pod set main: insufficient quota for cpu. Fix: give the Kueue ClusterQueue"),
    ("at the bound an unschedulable replica fails, with the scheduler's words and the fix", deployment(), [pod(scheduled=False)], 600, "failed",
     "SandboxNotProgressing", "(Unschedulable: 0/3 nodes are available: 3 Insufficient cpu.). Fix: free or add nodes that fit spec.sandbox.resources"),
    ("at the bound a pull failure fails, with the fix", deployment(), [pod("ImagePullBackOff", BACK_OFF)], 600, "failed", "SandboxNotProgressing",
     "ImagePullBackOff: " + BACK_OFF + ". Fix: check spec.sandbox.image"),
    ("at the bound with nothing known", deployment(), [pod()], 600, "failed", "SandboxNotProgressing", "no replica became Ready (read the pod's events"),
    ("a replica being deleted is not waited for", deployment(), [pod(scheduled=False, deletionTimestamp="2026-01-01T00:09:00Z")], 600, "waiting",
     "WaitingForSandbox", "no replica ready yet"),
]  # fmt: skip


@pytest.mark.parametrize(("dep", "pods", "bound", "state", "reason", "fragment"), [case[1:] for case in TIMED], ids=[case[0] for case in TIMED])
def test_the_wait_is_bounded_from_the_replicas_creation_and_names_the_cause(
    dep: dict[str, Any], pods: list[dict[str, Any]], bound: float, state: str, reason: str, fragment: str
) -> None:
    gate = sandbox_gate(dep, pods, now=NOW, ready_timeout_s=bound, kueue=KUEUE)
    assert (gate.state, gate.reason) == (state, reason), gate.message
    assert fragment in gate.message, gate.message


def after_prepare() -> RetoolRunStatus:
    return RetoolRunStatus(stages=[StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1")])


def test_the_preflight_waits_for_the_sandbox_and_starts_when_a_replica_is_ready() -> None:
    run = run_of(preflight=PREFLIGHT)
    children = {"demo-prepare-1": job_status("Complete")}
    pulling = sandbox_gate(deployment(), [pod("ImagePullBackOff", "back-off")])
    waiting = decide(run, after_prepare(), Observed(children=children, sandbox_gate=pulling), T0)
    assert waiting.create == [] and waiting.sandbox_replicas == 1, "the sandbox is scaled up while the preflight waits"
    assert stage(waiting.status, "preflight").state == "Pending" and "ImagePullBackOff" in (stage(waiting.status, "preflight").message or "")
    assert [e.reason for e in waiting.events] == ["SandboxImagePullFailing"] and waiting.requeue_after == 5.0
    again = decide(run, waiting.status, Observed(children=children, sandbox_gate=pulling), T0)
    assert again.events == [], "one Event per change of what the sandbox does"
    ready = decide(run, waiting.status, Observed(children=children, sandbox_gate=sandbox_gate(deployment(ready=1), [])), T0)
    assert ready.create == [CreateChild("preflight", 1)]


def test_a_sandbox_past_its_progress_deadline_fails_the_preflight_before_it_starts() -> None:
    run = run_of(preflight=PREFLIGHT)
    gate = sandbox_gate(deployment(progressing=("False", "ProgressDeadlineExceeded")), [pod("ErrImagePull", "unauthorized")])
    decision = decide(run, after_prepare(), Observed(children={"demo-prepare-1": job_status("Complete")}, sandbox_gate=gate), T0)
    entry = stage(decision.status, "preflight")
    assert (entry.state, decision.status.phase, decision.create) == ("Failed", "Failed", [])
    assert (entry.message or "").startswith("not started: the sandbox never became ready") and "ErrImagePull: unauthorized" in (entry.message or "")
    assert [e.reason for e in decision.events] == ["SandboxNotProgressing"]


def test_a_text_only_run_has_no_sandbox_to_wait_for() -> None:
    run = run_of(preflight=PREFLIGHT, **TEXT_ONLY)
    decision = decide(run, after_prepare(), Observed(children={"demo-prepare-1": job_status("Complete")}, sandbox_gate=sandbox_gate(None, [])), T0)
    assert decision.create == [CreateChild("preflight", 1)]
