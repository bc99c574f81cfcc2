"""Without namespaces (what a pod with all capabilities dropped gets): still isolated per uid and process tree.

The server is told isolation=none; it must say so in /readyz, and still time out, kill detached
processes and keep executions out of each other's way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from retool.sandbox.client import SandboxClient
from tests.sandbox.conftest import RunningServer, leftover_processes, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain_server() -> Iterator[RunningServer]:
    running = start_server(workers=2, RETOOL_SANDBOX_ISOLATION="none")
    yield running
    stop_server(running)


def test_readyz_says_what_is_missing(plain_server: RunningServer) -> None:
    isolation = plain_server.readyz()["isolation"]
    assert isolation["mode"] == "none" and isolation["network_isolated"] is False and isolation["pid_namespace"] is False
    assert isolation["privilege_drop"] is True
    assert any("namespaces disabled" in problem for problem in isolation["problems"])


@pytest.mark.parametrize(
    ("code", "status", "stdout"),
    [
        ("print(sum(range(5)))", "Finished", "10\n"),
        ("while True:\n    pass", "TimeLimitExceeded", ""),
        ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\nprint(1)", "Finished", "1\n"),
        ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "TimeLimitExceeded", ""),
    ],
    ids=["plain code runs", "infinite loop times out", "detached daemon", "fork bomb"],
)
async def test_executions_end_completely(plain_server: RunningServer, code: str, status: str, stdout: str) -> None:
    async with SandboxClient(plain_server.url) as client:
        response = await client.run_code(code, run_timeout=1.0, memory_limit_mb=256)
    assert response.run_result.status == status and response.run_result.stdout == stdout, response
    deadline = time.monotonic() + 5
    while leftover_processes(range(60000, 60002)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover_processes(range(60000, 60002)) == []
