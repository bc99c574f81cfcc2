# ruff: noqa: F811  (the test takes test_integration's `cluster` fixture, imported below)
"""The operator-managed MLflow whose claim cannot bind (no default StorageClass): the run names the claim,
not a connection error, and says no stage started (emulated API server; the Event is the PV controller's
*Normal* FailedBinding, pv_controller.go, Kubernetes v1.36.3)."""

from __future__ import annotations

from typing import Any

import pytest

from retool_operator import below, runner
from retool_operator.config import OperatorConfig
from retool_operator.kube import KINDS
from tests.operator.emulator import JOBS, eventually, running_operator
from tests.operator.test_integration import NS, Cluster, cluster, spec_doc  # noqa: F401  (the fixture)

NO_CLASS = "no persistent volumes available for this claim and no storage class is set"
CONNECTION = "HTTPConnectionPool(host='retool-mlflow." + "x" * 300 + "'): Max retries exceeded"


async def test_an_unbound_mlflow_claim_is_the_runs_reason_not_the_connection_error(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError(CONNECTION)

    monkeypatch.setattr(runner, "ensure_parent_run", unreachable)
    monkeypatch.setattr(below, "EVENTS_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(below, "CLAIM_SETTLE_SECONDS", 0.0)
    config = OperatorConfig(_env_file=None, resync_seconds=0.3, mlflow_parent_runs=True, mlflow_retry_seconds=0.3, mlflow_tracking_uri="")
    async with running_operator(config):
        await cluster.api.create(spec_doc("notrack"))
        await cluster.child(KINDS[("v1", "PersistentVolumeClaim")], "retool-mlflow")
        await cluster.api.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "retool-mlflow.failedbinding", "namespace": NS},
                "involvedObject": {"kind": "PersistentVolumeClaim", "name": "retool-mlflow", "namespace": NS},
                "reason": "FailedBinding",
                "message": NO_CLASS,
                "type": "Normal",
                "lastTimestamp": "2026-01-01T00:00:00Z",
            }
        )

        async def named() -> dict[str, Any] | None:
            status = await cluster.status("notrack")
            return status if "retool-mlflow cannot bind" in (status.get("message") or "") else None

        status = await eventually(named, what="the MLflow claim as the run's reason")
    assert len(status["message"]) <= 200 and "Max retries" not in status["message"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Ready"]["reason"], conds["Stalled"]["status"]) == ("ChildRefused", "True")
    assert "started" not in conds["Ready"]["message"] and "started" not in conds["Reconciling"]["message"]
    assert await cluster.api.get(JOBS, NS, "notrack-prepare-1") is None
