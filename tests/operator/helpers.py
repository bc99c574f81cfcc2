"""RetoolRun documents and small builders shared by the operator tests."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from retool_operator.config import OperatorConfig

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
CONFIG = OperatorConfig(_env_file=None, mlflow_tracking_uri="", sandbox_image="retool/sandbox:test")
VOLCANO = OperatorConfig(_env_file=None, mlflow_tracking_uri="", sandbox_image="retool/sandbox:test", batch_scheduler="volcano")


def config_for(doc: dict[str, Any]) -> OperatorConfig:
    """The operator configuration a document needs: a batch scheduler for gang-scheduled runs."""
    gang = ((doc.get("spec") or {}).get("scheduling") or {}).get("gang") or {}
    return VOLCANO if gang.get("enabled") else CONFIG


def document(name: str = "demo", namespace: str = "ml", uid: str | None = "uid-1", **spec: Any) -> dict[str, Any]:
    """A small valid RetoolRun (one 8-device node) with ``spec`` sections merged over the defaults."""
    base: dict[str, Any] = {
        "storage": {"pvc": {"claimName": "retool-data"}},
        "sandbox": {"maxConcurrent": 32, "perReplicaConcurrency": 16},
        "failurePolicy": {"maxRetries": 2, "backoffSeconds": 10},
        # The stage-machine tables walk the training stages; tests/operator/test_preflight_stage.py
        # runs the preflight stage (on by default in the spec) through the same machine.
        "preflight": {"enabled": False},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": meta, "spec": copy.deepcopy(base)}


def run_of(**kwargs: Any) -> RetoolRun:
    return parse_run(document(**kwargs))


def rayjob_status(deployment: str, job: str | None = None, message: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"jobDeploymentStatus": deployment}
    if job:
        status["jobStatus"] = job
    if message:
        status["message"] = message
    return {"status": status}


def job_status(condition: str | None, reason: str | None = None) -> dict[str, Any]:
    if condition is None:
        return {"status": {"active": 1}}
    cond = {"type": condition, "status": "True"}
    if reason:
        cond["reason"] = reason
    return {"status": {"conditions": [cond]}}
