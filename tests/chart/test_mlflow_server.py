"""The MLflow container's rendered command runs: the real mlflow server (the pinned version) on
127.0.0.1 with the chart's arguments and environment, the PVC replaced by a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retool.embedded.process import ManagedServer
from tests.chart.helm import container, one, render
from tests.deployed_mlflow import deployed_mlflow, job_runner_processes

pytestmark = pytest.mark.slow
SERVICE_HOST = "retool-mlflow.retool-system.svc:5000"


@pytest.fixture(scope="module")
def server(rendered, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, ManagedServer]]:
    data = tmp_path_factory.mktemp("mlflow-pvc")
    mlflow = container(one(rendered("default"), "Deployment", "-mlflow"), "mlflow")
    assert mlflow["command"] == ["mlflow", "server"], "the chart passes the server's options as args"
    with deployed_mlflow(mlflow, data) as running:
        yield running.base_url, data, running


@pytest.mark.parametrize(
    ("host", "status"),
    [
        pytest.param(SERVICE_HOST, 200, id="the Service name the operator and trainers use is accepted"),
        pytest.param("retool-mlflow:5000", 200, id="the short Service name is accepted"),
        pytest.param("attacker.example.com", 403, id="a foreign Host header is refused (DNS rebinding)"),
    ],
)
def test_host_header_check(server, host: str, status: int) -> None:
    url, _, _ = server
    r = httpx.get(f"{url}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, headers={"Host": host}, timeout=10)
    assert r.status_code == status, r.text[:300]


def test_runs_land_in_sqlite_and_artifacts_on_the_volume(server) -> None:
    url, data, _ = server
    headers = {"Host": SERVICE_HOST}
    exp = httpx.post(f"{url}/api/2.0/mlflow/experiments/create", json={"name": "chart-test"}, headers=headers, timeout=10).json()["experiment_id"]
    run = httpx.post(f"{url}/api/2.0/mlflow/runs/create", json={"experiment_id": exp}, headers=headers, timeout=10).json()["run"]["info"]
    artifact_uri = run["artifact_uri"]
    assert artifact_uri.startswith("mlflow-artifacts:/"), "artifacts must be proxied by the server, not written by clients to a local path"
    path = artifact_uri.removeprefix("mlflow-artifacts:/").lstrip("/")
    put = httpx.put(f"{url}/api/2.0/mlflow-artifacts/artifacts/{path}/hello.txt", content=b"hi", headers=headers, timeout=10)
    assert put.status_code == 200, put.text[:300]
    assert (data / "mlflow.db").is_file()
    assert [p.read_bytes() for p in (data / "artifacts").rglob("hello.txt")] == [b"hi"]


def test_the_tracker_runs_no_genai_job_runner(server) -> None:
    """MLflow's default starts a job runner and 7 huey consumers, ~1.3 GB of the pod's 2Gi limit (measured)."""
    _, _, running = server
    assert job_runner_processes(running) == []


def test_the_job_runner_can_be_turned_on(chart: Path) -> None:
    deployment = one(render(chart, "--set", "mlflow.jobExecution=true"), "Deployment", "-mlflow")
    env = {e["name"]: e.get("value") for e in container(deployment, "mlflow")["env"]}
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"
