"""The operator-managed MLflow tracker answers stage pods that reach it by its Service name.

The real MLflow server (the pinned 3.x) is started with exactly the command and environment of
the Deployment ``build_mlflow`` renders, only the volume and the listen address mapped onto this
machine, and called with the Host headers pods send. MLflow 3.x refuses a Host outside its
allowed list with 403 "Invalid Host header" (default: localhost and private IPs only).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from retool.embedded.process import ManagedServer
from retool_operator.builders import build_mlflow
from tests.deployed_mlflow import deployed_mlflow, job_runner_processes
from tests.operator.helpers import CONFIG

pytestmark = pytest.mark.slow
NS = "ml"


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    (deployment,) = [o for o in build_mlflow(NS, config=CONFIG) if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    with deployed_mlflow(container, tmp_path_factory.mktemp("managed-mlflow")) as running:
        yield running


@pytest.fixture
def managed(tracker: ManagedServer) -> str:
    return tracker.base_url


@pytest.mark.parametrize(
    ("host", "status"),
    [
        pytest.param(f"retool-mlflow.{NS}.svc:5000", 200, id="the Service DNS name stage pods use (the tracking URI)"),
        pytest.param("retool-mlflow:5000", 200, id="the short Service name"),
        pytest.param(f"retool-mlflow.{NS}.svc.cluster.local:5000", 200, id="the fully qualified Service name"),
        pytest.param("localhost:5000", 200, id="kubectl port-forward"),
        pytest.param("attacker.example.com", 403, id="a foreign Host is still refused (DNS rebinding)"),
    ],
)
def test_host_header(managed: str, host: str, status: int) -> None:
    r = httpx.get(f"{managed}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, headers={"Host": host}, timeout=10)
    assert r.status_code == status, r.text[:300]


def test_probes_pass_whatever_host_the_kubelet_sends(managed: str) -> None:
    assert httpx.get(f"{managed}/health", headers={"Host": "10.244.3.17:5000"}, timeout=10).status_code == 200


def test_a_stage_can_write_through_the_service_name_and_a_browser_there_too(managed: str) -> None:
    host = f"retool-mlflow.{NS}.svc:5000"
    r = httpx.post(f"{managed}/api/2.0/mlflow/experiments/create", json={"name": "managed-test"}, headers={"Host": host}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    browser = {"Host": host, "Origin": f"http://{host}"}
    r = httpx.post(f"{managed}/api/2.0/mlflow/experiments/create", json={"name": "managed-ui"}, headers=browser, timeout=10)
    assert r.status_code == 200, r.text[:300]
    r = httpx.post(f"{managed}/api/2.0/mlflow/experiments/create", json={"name": "cross-site"}, headers={"Host": host, "Origin": "http://evil.example.com"}, timeout=10)
    assert r.status_code == 403


def test_the_tracker_runs_no_genai_job_runner(tracker: ManagedServer) -> None:
    """MLflow's default starts a job runner and 7 huey consumers, ~1.3 GB (measured) the runs never use."""
    assert job_runner_processes(tracker) == []
