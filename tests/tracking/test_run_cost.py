"""The operator's cost figures on the parent MLflow run (``retool.tracking.log_run_cost``), against a real MLflow server."""

from __future__ import annotations

import asyncio
import uuid

from mlflow.tracking import MlflowClient

from retool.spec.status import RetoolRunStatus, StageStatus
from retool.tracking import ensure_parent_run
from retool_operator import cost
from retool_operator.tracking import log_cost
from tests.operator.test_cost import GPU, at, pod


def test_each_ended_attempt_logs_the_cost_on_the_parent_run_and_the_last_value_is_the_total(mlflow_server) -> None:
    parent = ensure_parent_run(mlflow_server.uri, experiment="retool/cost", namespace="team", name="costly", uid=str(uuid.uuid4()), spec_params={})
    before = RetoolRunStatus(stages=[StageStatus(name="sft", state="Running", attempt=1)])
    failed = RetoolRunStatus(stages=[StageStatus(name="sft", state="Retrying", attempt=1)])
    assert cost.attempt_ended(before, failed) and not cost.attempt_ended(failed, failed)
    first = cost.account(failed, None, [pod("h", "sft", 1, scheduled=0, finished=[30])], device_resource=GPU, now=at(31), price=2.0, currency="USD")
    assert first is not None
    assert asyncio.run(log_cost(mlflow_server.uri, parent.run_id, cost.figures(first)))
    done = RetoolRunStatus(stages=[StageStatus(name="sft", state="Succeeded", attempt=2)], score=0.5)
    second = cost.account(done, first, [pod("h2", "sft", 2, scheduled=40, finished=[100])], device_resource=GPU, now=at(101), price=2.0, currency="USD")
    assert second is not None
    assert asyncio.run(log_cost(mlflow_server.uri, parent.run_id, cost.figures(second)))
    client = MlflowClient(mlflow_server.uri)
    metrics = client.get_run(parent.run_id).data.metrics
    assert metrics["cost/device_hours"] == 12.0 and metrics["cost/lost_device_hours"] == 4.0 and metrics["cost/sft_device_hours"] == 12.0
    assert metrics["cost/amount"] == 24.0 and metrics["cost/device_hours_per_point"] == 0.24
    assert [m.value for m in client.get_metric_history(parent.run_id, "cost/device_hours")] == [4.0, 12.0]


def test_an_unreachable_tracker_costs_the_pass_nothing() -> None:
    assert asyncio.run(log_cost("http://127.0.0.1:9", "0" * 32, {"cost/device_hours": 1.0}, timeout=20)) is False
