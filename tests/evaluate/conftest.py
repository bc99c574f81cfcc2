"""Real servers for the eval, data-check and demo tests, started once per session on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retool.embedded.process import ManagedServer
from retool.embedded.servers import mlflow_server, sandbox_server


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    with sandbox_server(tmp_path_factory.mktemp("sandbox-logs"), workers=2) as server:
        yield server


@pytest.fixture(scope="session")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server
