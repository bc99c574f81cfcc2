"""Tracking: which MLflow a run uses (pure), and the parent run against a real local MLflow server.

The parent-run tests need ``retool.tracking`` (the tracking component) and the ``mlflow`` CLI;
they are skipped where either is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from retool_operator.config import OperatorConfig
from retool_operator.tracking import TrackingTarget, ensure_parent_run, parent_run_factory, tracking_target

from tests.conftest import free_port
from tests.operator.helpers import CONFIG, run_of


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


needs_tracking = pytest.mark.skipif(
    importlib.util.find_spec("retool.tracking") is None or shutil.which("mlflow", path=str(Path(sys.executable).parent)) is None,
    reason="retool.tracking or the mlflow CLI is not installed",
)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    mlflow = str(Path(sys.executable).parent / "mlflow")
    proc = subprocess.Popen(
        [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("mlflow server did not start within 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_tracking
@pytest.mark.slow
async def test_parent_run_is_created_once_and_found_again(mlflow_server: str) -> None:
    factory = parent_run_factory()
    assert factory is not None
    run = run_of(name="tracked", uid="uid-tracked")
    first = await ensure_parent_run(run, mlflow_server, factory, timeout=90)
    again = await ensure_parent_run(run, mlflow_server, factory, timeout=90)
    assert first.run_id == again.run_id and first.experiment_id == again.experiment_id
    assert first.url and mlflow_server in first.url


@needs_tracking
async def test_unreachable_mlflow_raises_for_the_caller_to_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    factory = parent_run_factory()
    assert factory is not None
    with pytest.raises(Exception):  # noqa: B017 - any failure means "not yet" to the reconciler
        await ensure_parent_run(run_of(), f"http://127.0.0.1:{free_port()}", factory, timeout=5)


def test_unit_config_is_not_the_managed_default() -> None:
    assert CONFIG.mlflow_tracking_uri == ""
