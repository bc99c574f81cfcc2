"""Tracking: which MLflow a run uses (pure), and the parent run against a real local MLflow server.
"""

from __future__ import annotations

import re

import pytest

from retool.tracking import TrackingError
from retool_operator.config import OperatorConfig
from retool_operator.tracking import TrackingTarget, ensure_parent_run, parent_run_factory, tracking_target
from tests.conftest import free_port
from tests.operator.helpers import run_of


@pytest.mark.parametrize(
    ("spec_uri", "default_uri", "expected"),
    [
        ("http://mlflow.team:5000", "http://chart-mlflow:5000", TrackingTarget("http://mlflow.team:5000", managed=False)),
        (None, "http://chart-mlflow:5000", TrackingTarget("http://chart-mlflow:5000", managed=False)),
        (None, "", TrackingTarget("http://retool-mlflow.ml.svc:5000", managed=True)),
    ],
    ids=["spec-uri-wins", "chart-default-next", "else-the-namespaces-managed-tracker"],
)
def test_tracking_target(spec_uri: str | None, default_uri: str, expected: TrackingTarget) -> None:
    tracking = {"mlflow": {"trackingUri": spec_uri}} if spec_uri else {}
    run = run_of(tracking=tracking)
    config = OperatorConfig(_env_file=None, mlflow_tracking_uri=default_uri)
    assert tracking_target(run, config) == expected


@pytest.mark.slow
async def test_parent_run_is_created_once_and_found_again(mlflow_server: str) -> None:
    factory = parent_run_factory()
    assert factory is not None
    run = run_of(name="tracked", uid="uid-tracked")
    first = await ensure_parent_run(run, mlflow_server, factory, timeout=90)
    again = await ensure_parent_run(run, mlflow_server, factory, timeout=90)
    assert first.run_id == again.run_id and first.experiment_id == again.experiment_id
    assert first.url and mlflow_server in first.url


async def test_unreachable_mlflow_raises_for_the_caller_to_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TrackingError naming the server and what failed: the reconciler waits and says why."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    factory = parent_run_factory()
    assert factory is not None
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackingError, match=re.escape(f"MLflow at {uri} is unreachable (connection refused): finding experiment 'ml/demo' failed") + "$"):
        await ensure_parent_run(run_of(), uri, factory, timeout=5)
