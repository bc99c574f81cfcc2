"""A real sandbox for the eval and data-check tests, started once per session on 127.0.0.1 (the demo test starts its own stack)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retool.embedded.process import ManagedServer
from retool.embedded.servers import sandbox_server


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    with sandbox_server(tmp_path_factory.mktemp("sandbox-logs"), workers=2) as server:
        yield server
