"""A real sandbox server per test module, started exactly as a pod starts it (python -m retool.sandbox)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.conftest import free_port, repo_env

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
"""Put in every test server's environment; no execution may ever print it."""


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen
    workers: int

    def readyz(self) -> dict:
        return httpx.get(f"{self.url}/readyz", timeout=10).json()

    def metric(self, name: str) -> float:
        """Sum of a Prometheus sample over its labels (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                key = line.split(" ")[0].split("{")[0]
                if key == name:
                    total += float(line.rsplit(" ", 1)[1])
        return total


def start_server(workers: int = 4, **env: str) -> RunningServer:
    port = free_port()
    environment = repo_env(RETOOL_SANDBOX_TEST_SECRET=SECRET, **env)
    process = subprocess.Popen(
        [sys.executable, "-m", "retool.sandbox", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "warning"],
        env=environment,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sandbox server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return RunningServer(url, process, workers)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("sandbox server did not become ready in 90 s")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


SERVER_UID_BASE = 61000
"""Execution uids of the ``server`` fixture: distinct from the default (60000) that sandbox servers
of other test packages use, so leftover-process checks see only this server's executions."""


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(workers=4, RETOOL_SANDBOX_UID_BASE=str(SERVER_UID_BASE))
    yield running
    stop_server(running)


def processes_of_uids(uids: range) -> list[int]:
    """Processes on this machine owned by any of ``uids`` (the execution uids of a root server)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid in uids:
                    found.append(int(name))
            except OSError:
                continue
    return found


def leftover_processes(uids: range) -> list[int]:
    """Execution processes beyond the one pre-forked, idle child each worker keeps ready.

    Slot i runs as uid ``uids[i]``; between requests its only process is that pre-forked child, so
    any second process of a uid is something an execution left behind.
    """
    by_uid: dict[int, list[int]] = {}
    for pid in processes_of_uids(uids):
        with contextlib.suppress(OSError):
            by_uid.setdefault(os.stat(f"/proc/{pid}").st_uid, []).append(pid)
    return sorted(pid for pids in by_uid.values() if len(pids) > 1 for pid in pids)
