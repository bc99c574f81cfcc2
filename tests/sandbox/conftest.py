"""A real sandbox server per test module, started exactly as a pod starts it (python -m retool.sandbox).

``start_server`` runs it as this (root) test process, ``start_server(kind=...)`` the way a Kubernetes
pod of that kind runs it (see ``podlike``): non-root without namespaces, non-root with user
namespaces, or root inside a user namespace (``hostUsers: false``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from retool.sandbox.accounting import descendants as descendants  # the product's walk; the suites import it from here
from tests.conftest import free_port, repo_env, sandbox_uid_base
from tests.sandbox import podlike

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
"""Put in every test server's environment; no execution may ever print it."""


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen
    workers: int
    pid: int = 0
    """The server's own pid (the launcher's when started plainly)."""
    kind: str = "root"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def readyz(self) -> dict:
        return self._get("/readyz").json()

    def _get(self, path: str) -> httpx.Response:
        """An idempotent GET, tried again (up to 3 times) when the server closed the connection unanswered:
        a server with a short idle timeout (1 s in test_server_limits) closes a fresh connection whose
        request the client, starved on a busy machine, sent later than that."""
        for attempt in range(3):
            try:
                return httpx.get(f"{self.url}{path}", timeout=10)
            except httpx.RemoteProtocolError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``httpx.request`` on this server, tried again (up to 3 times) only when the server itself counts an
        idle connection closed (``retool_sandbox_http_rejected_total{reason="idle_timeout"}``) across a
        disconnect: then it never read the request (see ``_get``). Any other disconnect fails the test."""
        for attempt in range(3):
            idle_before = self.metric("retool_sandbox_http_rejected_total", reason="idle_timeout")
            try:
                return httpx.request(method, f"{self.url}{path}", **kwargs)
            except httpx.RemoteProtocolError:
                if attempt == 2 or self.metric("retool_sandbox_http_rejected_total", reason="idle_timeout") == idle_before:
                    raise
        raise AssertionError("unreachable")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus sample over the series carrying ``labels`` (all of them when none; 0 when absent)."""
        text = self._get("/metrics").text
        wanted = {f'{key}="{value}"' for key, value in labels.items()}
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                series = line.rsplit(" ", 1)[0]
                key, _, rest = series.partition("{")
                if key == name and wanted <= set(rest.rstrip("}").split(",")):
                    total += float(line.rsplit(" ", 1)[1])
        return total


def can_start_pods() -> str | None:
    """Why pod-like servers cannot be started here (None when they can): they need root and util-linux."""
    if os.geteuid() != 0:
        return "pod-like sandbox servers are started from a root test process (as in CI)"
    missing = [tool for tool in ("unshare", "setpriv") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (util-linux)" if missing else None


def start_server(workers: int = 4, *, kind: str | None = None, uid: int = podlike.POD_UID, pid_namespace: bool = True, wait: str = "/readyz", **env: str) -> RunningServer:
    """Start a server and wait until ``wait`` answers 200; ``kind`` starts it as a pod of that kind."""
    if kind is not None and (reason := can_start_pods()):
        pytest.skip(reason)
    port = free_port()
    environment = repo_env(RETOOL_SANDBOX_TEST_SECRET=SECRET, **env)
    argv = [sys.executable, "-m", "retool.sandbox", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    if kind is not None:
        argv = podlike.command(kind, argv, uid=uid, pid_namespace=pid_namespace)
    process = subprocess.Popen(argv, env=environment, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sandbox server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}{wait}", timeout=2).status_code == 200:
                pid = process.pid if kind is None else server_pid(process.pid)
                return RunningServer(url, process, workers, pid, kind or "root")
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    kill_tree(process)
    raise RuntimeError("sandbox server did not become ready in 90 s")


def server_pid(launcher: int) -> int:
    """The host pid of the sandbox server among the launcher's descendants."""
    for pid in [launcher, *descendants(launcher)]:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[1:3] == [b"-m", b"retool.sandbox"]:
                return pid
    raise RuntimeError("no sandbox server under the launcher")


def kill_tree(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_server(server: RunningServer) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.pid or server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_tree(server.process)


SERVER_UID_BASE = sandbox_uid_base(1)
"""Execution uids of the ``server`` fixture: distinct from the default (60000) that sandbox servers
of other test packages use, so leftover-process checks see only this server's executions."""


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(workers=4, RETOOL_SANDBOX_UID_BASE=str(SERVER_UID_BASE))
    yield running
    stop_server(running)


def processes_of_uids(uids: Container[int], *, live: bool = False) -> list[int]:
    """Processes on this machine owned by any of ``uids`` (the execution uids of a server); ``live``
    leaves out zombies (dead, waiting only to be reaped)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid in uids and not (live and " Z " in Path(f"/proc/{name}/stat").read_text().split(")", 1)[1][:4]):
                    found.append(int(name))
            except (OSError, IndexError):
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
