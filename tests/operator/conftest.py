"""Fixtures shared by the operator tests: a real local MLflow server.

``retool.tracking`` and the ``mlflow`` CLI come with the dev install (``retool[train]``): a test
that needs them fails when they are missing, it is never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retool.embedded.servers import mlflow_server as local_mlflow


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of an MLflow server with a sqlite backend and artifacts proxied into a temporary directory."""
    with local_mlflow(tmp_path_factory.mktemp("mlflow"), start_timeout_s=60) as server:
        yield server.base_url
