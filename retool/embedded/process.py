"""A server run as a child process group: started, waited on until it answers, and stopped.

Servers such as ``mlflow server`` start children of their own (uvicorn workers, a job runner);
stopping only the parent would leave those running. Each server therefore gets its own session
(process group) and is stopped by signalling that group: SIGTERM first, SIGKILL after a grace
period, so nothing the command started outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """A child server exited or did not answer its readiness URL in time (the message quotes its log)."""


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 20000
"""Ports are picked from ``LOWEST_PICKED`` up to the kernel's ephemeral range, exclusive: above Ray's
default worker ports (10002-19999, ``ray start --min-worker-port/--max-worker-port``), which Ray
refuses to see given to any of its components ("is trying to use a port number ... that is used by
other components")."""
_pick = random.SystemRandom()  # never reseeded by a test runner: two processes do not pick in step


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections and of ``bind(port 0)``."""
    with contextlib.suppress(OSError, ValueError):
        low, high = (int(v) for v in EPHEMERAL_RANGE.read_text().split())
        return low, high
    return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing is bound to right now, for a server started next.

    Picked below the kernel's ephemeral range, at random: a port the kernel hands out itself (``bind``
    to port 0) is also what it hands every outgoing connection as its local port and every other
    ``bind(0)``, so in the seconds until the server binds it (a kube-apiserver waits for etcd first)
    a busy machine takes it again: "address already in use", a server that never starts. Below the
    range only another explicit pick can take it. The OS's pick where that range leaves no room."""
    low, _high = ephemeral_range()
    if low - LOWEST_PICKED >= 1000:
        for _ in range(100):
            port = _pick.randrange(LOWEST_PICKED, low)
            if _bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def session_cpu_seconds(session: int) -> float:
    """User + system CPU time of every live process in ``session`` (a server started with
    ``start_new_session`` and the workers it forked), from ``/proc/PID/stat``; 0 off Linux."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for _pid, fields in proc_stats():
        # after "(comm)": state, ppid, pgrp, session, ..., utime (11), stime (12), cutime (13), cstime (14)
        if len(fields) > 14 and int(fields[3]) == session:
            total += sum(int(f) for f in fields[11:15])
    return total / tick


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of ``/proc/PID/stat`` after its ``(comm)``) of every process; none off Linux.

    Processes end while the scan runs: a ``/proc/PID`` listed a moment ago may be gone, or answer
    ESRCH (``ProcessLookupError``) when read; such a process is skipped, never an error (a glob over
    ``/proc`` raised it from inside the directory walk, issue 50).
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended while we looked (ProcessLookupError is an OSError)
            continue
        yield int(entry), fields


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file, for error messages (empty when there is none)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ManagedServer:
    """One server child process. Use as a context manager, or call ``start`` and ``stop``."""

    name: str
    argv: Sequence[str]
    base_url: str
    ready_path: str
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    start_timeout_s: float = 120.0
    """CPU seconds the server's processes may spend before answering (a loaded machine gives them
    fewer per second of wall time, so a wall-clock limit trips on load, not on a broken server)."""
    start_wall_limit_s: float | None = None
    """Wall-clock backstop for a server that hangs without using CPU; default max(600, 5 x start_timeout_s)."""
    stop_grace_s: float = 10.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def ready_url(self) -> str:
        return self.base_url.rstrip("/") + self.ready_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> ManagedServer:
        """Start the process and block until ``ready_url`` answers 200 (or raise, leaving nothing running)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s: %s", self.name, " ".join(self.argv))
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("%s ready at %s (pid %s)", self.name, self.ready_url, self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        wall_limit = self.start_wall_limit_s or max(600.0, 5 * self.start_timeout_s)
        deadline = time.monotonic() + wall_limit
        last_error = "no answer yet"
        used = 0.0
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline and used < self.start_timeout_s:
                code = self._proc.poll()
                if code is not None:
                    raise ServerStartError(f"{self.name} exited with code {code} before it was ready; log {self.log_path}:\n{log_tail(self.log_path)}")
                try:
                    response = client.get(self.ready_url)
                    if response.status_code == 200:
                        return
                    last_error = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last_error = type(exc).__name__
                time.sleep(0.25)
                used = session_cpu_seconds(self._proc.pid)
        within = f"{self.start_timeout_s:.0f} CPU seconds" if used >= self.start_timeout_s else f"{wall_limit:.0f}s (it used {used:.1f} CPU seconds)"
        raise ServerStartError(f"{self.name} did not answer {self.ready_url} within {within} ({last_error}); log {self.log_path}:\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after the grace period. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0fs, killing it", self.name, self.stop_grace_s)
            # Children of the group (workers, job runners) may outlive the leader: kill what is left.
            _signal_group(pgid, signal.SIGKILL)
        proc.wait(timeout=self.stop_grace_s)
        logger.info("stopped %s (pid %s)", self.name, proc.pid)
        self._proc = None

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``.

    A zombie waits only for its parent to reap it and runs nothing, so it does not count. Read
    from /proc where there is one; elsewhere, whether the group can still be signalled.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for _pid, fields in proc_stats():
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state != "Z":
            return True
    return False

