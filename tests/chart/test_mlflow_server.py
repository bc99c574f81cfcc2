"""The MLflow container's rendered command runs: the real mlflow server (the pinned version) on
127.0.0.1 with the chart's arguments and environment, the PVC replaced by a temporary directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.chart.helm import container, one
from tests.conftest import free_port

pytestmark = pytest.mark.slow
SERVICE_HOST = "retool-mlflow.retool-system.svc:5000"


def local_command(mlflow: dict, data: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The container's command with the volume mount and listen address mapped onto this machine."""
    assert mlflow["command"] == ["mlflow", "server"]
    args = []
    for arg in mlflow["args"]:
        if arg.startswith("--host="):
            arg = "--host=127.0.0.1"
        elif arg.startswith("--port="):
            arg = f"--port={port}"
        elif arg.startswith("--workers="):
            arg = "--workers=1"
        args.append(arg.replace("/mlflow/", f"{data}/"))
    env = {e["name"]: e["value"].replace("////mlflow/", f"///{data}/") for e in mlflow["env"] if "value" in e}
    env["HOME"] = str(data)
    return [sys.executable, "-m", "mlflow", "server", *args], env


@pytest.fixture(scope="module")
def server(rendered, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("mlflow-pvc")
    port = free_port()
    cmd, env = local_command(container(one(rendered("default"), "Deployment", "-mlflow"), "mlflow"), data, port)
    log = (data / "server.log").open("w")
    # Own process group: mlflow forks uvicorn workers, and teardown stops the whole group it started.
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, cwd=data, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (data / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not answer /health within 180 s:\n" + (data / "server.log").read_text()[-3000:])
        print(f"mlflow server ready in {time.monotonic() - started:.1f} s")
        yield url, data
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        pytest.param(SERVICE_HOST, 200, id="the Service name the operator and trainers use is accepted"),
        pytest.param("retool-mlflow:5000", 200, id="the short Service name is accepted"),
        pytest.param("attacker.example.com", 403, id="a foreign Host header is refused (DNS rebinding)"),
    ],
)
def test_host_header_check(server, host: str, status: int) -> None:
    url, _ = server
    r = httpx.get(f"{url}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, headers={"Host": host}, timeout=10)
    assert r.status_code == status, r.text[:300]


def test_runs_land_in_sqlite_and_artifacts_on_the_volume(server) -> None:
    url, data = server
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
