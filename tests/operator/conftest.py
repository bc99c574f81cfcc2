"""Fixtures shared by the operator tests: a real local MLflow server (when the tracking component is installed)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from retool.embedded.servers import mlflow_server as local_mlflow

needs_tracking = pytest.mark.skipif(
    importlib.util.find_spec("retool.tracking") is None or shutil.which("mlflow", path=str(Path(sys.executable).parent)) is None,
    reason="retool.tracking or the mlflow CLI is not installed",
)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of an MLflow server with a sqlite backend and artifacts proxied into a temporary directory."""
    with local_mlflow(tmp_path_factory.mktemp("mlflow"), start_timeout_s=60) as server:
        yield server.base_url
