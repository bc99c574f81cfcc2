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


PLAIN_UID_BASE = 62000
"""Distinct from other servers' execution uids (see conftest.SERVER_UID_BASE)."""


@pytest.fixture(scope="module")
def plain_server() -> Iterator[RunningServer]:
    running = start_server(workers=2, RETOOL_SANDBOX_ISOLATION="none", RETOOL_SANDBOX_UID_BASE=str(PLAIN_UID_BASE))
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
    while leftover_processes(range(PLAIN_UID_BASE, PLAIN_UID_BASE + 2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover_processes(range(PLAIN_UID_BASE, PLAIN_UID_BASE + 2)) == []


@pytest.mark.parametrize(
    "target",
    ["-1", "os.getppid()", "-os.getpgid(os.getppid())", "1"],
    ids=["everything (-1)", "its worker", "the sandbox's process group", "pid 1 (the server in a container)"],
)
async def test_signals_to_the_sandbox_are_refused(plain_server: RunningServer, target: str) -> None:
    """Same-uid code could otherwise kill the server: the seccomp guard answers EPERM."""
    code = f"import os, signal\ntry:\n    os.kill({target}, signal.SIGKILL)\n    print('sent')\nexcept OSError as e:\n    print(type(e).__name__)\n"
    async with SandboxClient(plain_server.url) as client:
        response = await client.run_code(code, run_timeout=2.0)
        assert response.run_result.stdout == "PermissionError\n", response
        assert (await client.run_code("print('alive')")).run_result.stdout == "alive\n"
    assert plain_server.readyz()["worker_restarts"] == 0


async def test_code_may_still_signal_its_own_children(plain_server: RunningServer) -> None:
    code = "import os, signal, time\npid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\nos.kill(pid, signal.SIGKILL)\nprint(os.waitpid(pid, 0)[1])\n"
    async with SandboxClient(plain_server.url) as client:
        response = await client.run_code(code, run_timeout=5.0)
    assert response.run_result.stdout == "9\n", response
