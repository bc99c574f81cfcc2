"""Smaller behaviours the operator must match upstream on: canonical quantities, KubeRay's terminal
ValidationFailed, a claim whose driver ignores fsGroup, a tracker that moved mid-run."""

from __future__ import annotations

from typing import Any

import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.kube import is_subset
from retool_operator.reconcile import Observed, decide
from retool_operator.tracking import same_tracker
from tests.operator.helpers import T0, job_status, rayjob_status, run_of

SFT_RUNNING = RetoolRunStatus(
    stages=[StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"), StageStatus(name="sft", state="Running", attempt=1, job="demo-sft-1")]
)


def sft_of(status: RetoolRunStatus) -> StageStatus:
    return next(s for s in status.stages if s.name == "sft")


QUANTITIES = [
    # id, desired, as the API server returns it, unchanged
    ("millicores-canonicalised", {"resources": {"limits": {"cpu": "1000m"}}}, {"resources": {"limits": {"cpu": "1"}}}, True),
    ("mebibytes-canonicalised", {"resources": {"requests": {"memory": "20480Mi"}}}, {"resources": {"requests": {"memory": "20Gi"}}}, True),
    ("an-int-cpu-stored-as-string", {"resources": {"limits": {"cpu": 2}}}, {"resources": {"limits": {"cpu": "2"}}}, True),
    ("shm-size-limit", {"emptyDir": {"sizeLimit": "1024Mi"}}, {"emptyDir": {"sizeLimit": "1Gi"}}, True),
    ("a-real-change-is-a-change", {"resources": {"limits": {"cpu": "1500m"}}}, {"resources": {"limits": {"cpu": "1"}}}, False),
    ("env-values-are-not-quantities", {"env": [{"name": "X", "value": "1000m"}]}, {"env": [{"name": "X", "value": "1"}]}, False),
]


@pytest.mark.parametrize(("desired", "stored", "same"), [c[1:] for c in QUANTITIES], ids=[c[0] for c in QUANTITIES])
def test_quantities_are_compared_as_the_api_server_stores_them(desired: dict[str, Any], stored: dict[str, Any], same: bool) -> None:
    """k8s.io/apimachinery/pkg/api/resource (v0.36.1) returns quantities in canonical form; comparing
    strings re-patched the sandbox on every pass."""
    assert is_subset(desired, stored) is same


def test_kuberay_validation_failed_is_not_retried() -> None:
    """ValidationFailed is terminal in KubeRay (rayjob_controller.go v1.7.0): every attempt would repeat it."""
    run = run_of()  # maxRetries 2
    status = SFT_RUNNING
    refused = {"status": {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": "invalid RayJob spec"}}
    decision = decide(run, status, Observed(children={"demo-sft-1": refused}), T0)
    assert decision.status.phase == "Failed" and "not retried" in (sft_of(decision.status).message or "")


def test_a_write_denied_on_the_claim_names_the_fsgroup_problem() -> None:
    run = run_of()
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    detail = "PermissionError: [Errno 13] Permission denied: '/data/retool/ml/demo/data'"
    decision = decide(run, status, Observed(children={"demo-prepare-1": job_status("Failed", "BackoffLimitExceeded")}, failure_details={"demo-prepare-1": detail}), T0)
    message = decision.status.stages[0].message or ""
    assert "Permission denied" in message and "may ignore the pod's fsGroup" in message
    other = decide(run, status, Observed(children={"demo-prepare-1": job_status("Failed")}, failure_details={"demo-prepare-1": "ValueError: bad row"}), T0)
    assert "fsGroup" not in (other.status.stages[0].message or "")


@pytest.mark.parametrize(
    ("known", "uri", "same"),
    [
        ("http://mlflow.a:5000/#/experiments/1/runs/abc", "http://mlflow.a:5000", True),
        ("http://mlflow.a:5000", "http://mlflow.a:5000/", True),
        ("http://mlflow.a:5000/#/experiments/1/runs/abc", "http://mlflow.b:5000", False),
        ("http://mlflow.a:50001/#/experiments/1/runs/abc", "http://mlflow.a:5000", False),
    ],
    ids=["same-tracker", "trailing-slash", "moved-to-another-host", "port-prefix-is-not-the-same-tracker"],
)
def test_a_parent_run_is_reused_only_on_the_tracker_it_lives_on(known: str, uri: str, same: bool) -> None:
    assert same_tracker(known, uri) is same


def test_a_rayjob_still_running_is_not_a_failure() -> None:
    run = run_of()
    status = SFT_RUNNING
    decision = decide(run, status, Observed(children={"demo-sft-1": rayjob_status("Running", "RUNNING")}), T0)
    assert sft_of(decision.status).state == "Running"


def _claim(name: str, modes: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"accessModes": modes}, "status": {"phase": "Bound", "accessModes": modes}}


@pytest.mark.parametrize(
    ("modes", "read_only", "state", "fragment"),
    [
        (["ReadWriteOnce"], False, "Failed", "spec.pods.volumes) has access modes ReadWriteOnce, but hardware.nodes is 2"),
        (["ReadOnlyMany"], True, "Running", "prepare-1"),
        (["ReadOnlyMany"], False, "Failed", "needs ReadWriteMany"),
        (["ReadWriteMany"], False, "Running", "prepare-1"),
        (None, False, "Pending", "does not exist"),
    ],
    ids=["rwo-extra-claim-on-two-nodes-fails-first", "rox-read-only-is-shareable", "rox-mounted-writable-is-not", "rwx-is-fine", "missing-extra-claim-holds"],
)
def test_extra_claims_of_a_multi_node_run_must_be_shareable(modes: list[str] | None, read_only: bool, state: str, fragment: str) -> None:
    from retool_operator.builders import run_claim
    from retool_operator.claims import ClaimObservation
    from tests.operator.helpers import CONFIG

    volume = {"name": "hf", "mountPath": "/hf", "persistentVolumeClaim": {"claimName": "hf-cache", "readOnly": read_only}}
    run = run_of(hardware={"nodes": 2}, pods={"volumes": [volume]})
    main = ClaimObservation(run_claim(run, CONFIG), _claim("retool-data", ["ReadWriteMany"]))
    observed = Observed(claim=main, extra_claims={"hf-cache": _claim("hf-cache", modes) if modes else None})
    decision = decide(run, RetoolRunStatus(), observed, T0)
    prepare = decision.status.stages[0]
    assert prepare.state == state
    assert fragment in (prepare.message or "") + (prepare.job or "")
