"""Fixtures shared by the operator tests: a real local MLflow server (when the tracking component is installed)."""

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

from tests.conftest import free_port

needs_tracking = pytest.mark.skipif(
    importlib.util.find_spec("retool.tracking") is None or shutil.which("mlflow", path=str(Path(sys.executable).parent)) is None,
    reason="retool.tracking or the mlflow CLI is not installed",
)


@pytest.fixture(scope="session")
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
