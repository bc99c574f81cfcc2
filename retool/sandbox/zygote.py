"""The zygote: the process every execution of a worker is forked from, which never holds a request.

A worker reads each request, writes its files, collects its output and builds its result: its heap
holds all of that, freed but not erased, when it forks the next execution, which could then read
the previous execution's code, stdin, files and output in its own memory. So the worker forks this
process once, before it has read any request, and asks it for every execution process: "fork one
with these pipes" (descriptors over SCM_RIGHTS; the setup holds paths and ids, never request data),
"kill them all", "wait for it", "reap everything". It never reads a job or a result.

The zygote is a child subreaper: whatever an execution starts and leaves (double forks, detached
sessions) is its descendant, so it can kill and reap all of it. With a pid namespace it ends them
with ``kill(-1)`` — every process of the namespace except the caller and pid 1 (the worker) — and
executions there cannot signal it (the seccomp filter protects its pid); without, it kills its
descendants. It dies with its worker, and every execution dies with it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from retool.sandbox import accounting, child, isolation, protocol

REAP_TIMEOUT_S = 5.0


@dataclass
class Exit:
    """How an execution's main process ended, as ``wait4`` on it says."""

    status: int
    cpu_seconds: float


class Zygote:
    """The worker's handle on its zygote (blocking calls over a Unix socket pair)."""

    def __init__(self, pid_namespace: bool, close_in_zygote: tuple[int, ...] = (), layers: dict[str, Any] | None = None) -> None:
        """``close_in_zygote``: the worker's descriptors the zygote has no business holding (its
        channel to the server: the server must see EOF the moment the worker dies). ``layers``:
        what every execution's setup holds but its directory (``child.main``'s ``setup`` without
        ``cwd``): the zygote gets it with its memory, prepares it once (``child.prepare``), and
        each fork request carries only the directory."""
        ours, theirs = socket.socketpair()
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            for fd in close_in_zygote:
                with contextlib.suppress(OSError):
                    os.close(fd)
            _serve(theirs, worker, pid_namespace, layers)
        theirs.close()
        self.sock = ours
        self.pid = pid
        # The zygote as /proc numbers it (differs from ``pid`` in a pid namespace whose /proc could
        # not be remounted): its only child now, before it forked anything.
        kids = accounting.children("self")
        self.proc_pid = kids[0] if len(kids) == 1 else pid

    def _call(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        try:
            protocol.send(self.sock, message, fds, protocol.MARSHAL)
            reply, _ = protocol.recv(self.sock, codec=protocol.MARSHAL)
        except OSError as exc:  # ChannelClosedError included: the zygote died
            raise ZygoteLostError(f"the zygote is gone: {exc}") from exc
        if "error" in reply:
            raise ZygoteLostError(f"the zygote failed: {reply['error']}")
        return reply

    def fork(self, cwd: str, go_r: int, out_w: int, err_w: int, ack_w: int, *, reap_first: bool = False) -> tuple[int, int, int]:
        """A new execution process in ``cwd``, waiting for its job: (pid, the zygote's resident KiB it
        starts from, processes of the last execution still alive). With ``reap_first`` the zygote
        first does what ``reap`` does, in the same round trip (each costs both processes CPU, the
        zygote's mostly copy-on-write faults: its pages are shared with the execution it just forked)."""
        reply = self._call({"op": "fork", "cwd": cwd, "reap": reap_first}, [go_r, out_w, err_w, ack_w])
        return reply["pid"], reply["baseline_kib"], reply["left"]

    def kill(self) -> None:
        """SIGKILL to every process of the execution (detached ones included); returns at once."""
        self._call({"op": "kill"})

    def wait(self, pid: int) -> Exit:
        """Wait for the execution's main process (after it exited or was killed), then SIGKILL
        whatever it left running (one round trip on the request's path, not two)."""
        reply = self._call({"op": "wait", "pid": pid})
        return Exit(reply["status"], reply["cpu"])

    def reap(self) -> int:
        """Kill and reap until no process of the execution is left, zombies included; returns how many
        were still alive after ``REAP_TIMEOUT_S`` (0 normally)."""
        return self._call({"op": "reap"})["left"]

    def processes(self) -> tuple[list[int], int]:
        """Every process of the current execution, as /proc numbers them, and how many tasks
        (processes and threads) they are together (``accounting.tree``)."""
        return accounting.tree(self.proc_pid)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


class ZygoteLostError(RuntimeError):
    """The zygote died or failed: the worker cannot fork clean executions any more."""


# ---- inside the zygote ------------------------------------------------------------------------
def _serve(sock: socket.socket, worker: int, pid_namespace: bool, layers: dict[str, Any] | None) -> NoReturn:
    code = 0
    prepared = functools.cache(lambda: child.prepare(layers))  # on the first fork, then for every one
    try:
        os.setsid()  # a process group of its own: no execution's group signal reaches it
        isolation.die_with_parent(worker)
        child.execution_signals()
        isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
        while True:
            try:
                message, fds = protocol.recv(sock, with_fds=4, codec=protocol.MARSHAL)
            except protocol.ChannelClosedError:
                break
            try:
                reply = _handle(message, fds, pid_namespace, layers, prepared)
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            protocol.send(sock, reply, codec=protocol.MARSHAL)
    except BaseException:
        code = 1
    _kill_all(pid_namespace)
    os._exit(code)


def _handle(message: dict[str, Any], fds: list[int], pid_namespace: bool, layers: dict[str, Any] | None, prepared: Callable[[], child.Prepared]) -> dict[str, Any]:
    op = message.get("op")
    if op == "fork":
        try:
            if len(fds) != 4:
                raise ValueError(f"fork needs 4 descriptors, got {len(fds)}")
            if layers is None:
                raise ValueError("this zygote was started without the executions' layers")
            left = _reap_all(pid_namespace) if message.get("reap") else 0
            layered = prepared()
            baseline = accounting.resident_kib("self")
            pid = layered.forker.fork()
            if pid == 0:
                child.main(*fds, {**layers, "cwd": message["cwd"]}, layered)  # never returns
        finally:
            for fd in fds:
                os.close(fd)
        return {"pid": pid, "baseline_kib": baseline, "left": left}
    for fd in fds:
        os.close(fd)
    if op == "kill":
        _kill_all(pid_namespace)
        return {"ok": True}
    if op == "wait":
        _, status, usage = os.wait4(int(message["pid"]), 0)
        _kill_all(pid_namespace)
        return {"status": status, "cpu": usage.ru_utime + usage.ru_stime}
    if op == "reap":
        return {"left": _reap_all(pid_namespace)}
    raise ValueError(f"unknown zygote operation {op!r}")


def _kill_all(pid_namespace: bool) -> None:
    if pid_namespace:  # everything in the namespace but us and pid 1 (the worker)
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        return
    for pid in accounting.descendants("self"):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _reap_all(pid_namespace: bool) -> int:
    """Kill and wait until this process has no child left: zombies count against RLIMIT_NPROC of the
    next execution, and a process still alive would see it."""
    deadline = time.monotonic() + REAP_TIMEOUT_S
    next_kill = 0.0
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        left = accounting.children("self")
        if not left:
            return 0
        if time.monotonic() > deadline:
            return len(left)
        if time.monotonic() > next_kill:
            _kill_all(pid_namespace)
            next_kill = time.monotonic() + 0.2
        time.sleep(0.002)
