"""A worker: one execution at a time, supervised from a warm process forked from the template.

The worker talks to the server over a Unix socket. Where the kernel allows it the worker is pid 1 of
its own pid namespace, in a network namespace without interfaces and a mount namespace with a private,
size-limited /tmp: then killing every process of an execution (even ones that started a new session or
double-forked) is ``kill(-1)``, code cannot signal the worker (pid 1 ignores signals from inside its
namespace), cannot see the server, and cannot reach any network. Without namespaces the worker falls
back to its own subreaper tree and process groups, and reports that in its hello.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from retool.sandbox import child, isolation, protocol
from retool.sandbox.outcome import Limits, checked_relative_path, render_output, signal_note

logger = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A forked child waiting for its job, and the worker's ends of its pipes."""

    pid: int
    go_w: int
    out_r: int
    err_r: int
    status_r: int
    pidfd: int


@dataclass
class Capture:
    limit: int
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]


@dataclass(frozen=True)
class WorkerConfig:
    slot: int
    output_limit_bytes: int
    max_processes: int
    max_file_size_mb: int
    max_open_files: int
    max_fetch_bytes: int
    tmp_size_mb: int
    tmp_root: str
    isolation: str
    uid_base: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerConfig:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


class Worker:
    def __init__(self, sock: socket.socket, config: WorkerConfig, report: isolation.IsolationReport, workdir: str) -> None:
        self.sock = sock
        self.config = config
        self.report = report
        self.workdir = workdir
        self.pid_namespace = report.pid_namespace
        self.drop = "uid" if report.privilege_drop else ("caps" if report.mode == "user-namespaces" else "none")
        self.uid = report.run_uid
        self.gid = report.run_uid if report.privilege_drop else os.getgid()

    # ---- lifecycle -------------------------------------------------------------------------
    def serve(self) -> None:
        protocol.send(self.sock, {"type": "hello", "slot": self.config.slot, "isolation": self.report.as_dict()})
        prepared = self._prefork()
        while True:
            try:
                job, _ = protocol.recv(self.sock)
            except protocol.ChannelClosedError:
                return
            try:
                result = self._execute(prepared, job)
            except Exception as exc:  # a harness failure is the sandbox's, not the code's
                logger.exception("execution failed inside the worker")
                result = {"type": "result", "sandbox_error": f"{type(exc).__name__}: {exc}"}
            self._kill_leftovers(prepared.pid)
            if job.get("fetch_files") and "sandbox_error" not in result:
                result["files"] = self._fetch(job["fetch_files"])
            protocol.send(self.sock, result)
            self._reap(prepared)
            self._clean_workdir()
            prepared = self._prefork()

    def _prefork(self) -> Prepared:
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child.main(go_r, out_w, err_w, status_w, {"cwd": self.workdir, "drop": self.drop, "uid": self.uid, "gid": self.gid})
        for fd in (go_r, out_w, err_w, status_w):
            os.close(fd)
        for fd in (out_r, err_r, status_r):
            os.set_blocking(fd, False)
        return Prepared(pid, go_w, out_r, err_r, status_r, os.pidfd_open(pid))

    # ---- one execution ---------------------------------------------------------------------
    def _execute(self, prepared: Prepared, job: dict[str, Any]) -> dict[str, Any]:
        self._write_files(job.get("files") or {})
        limits = Limits(
            run_timeout_s=float(job["run_timeout"]),
            memory_limit_mb=int(job["memory_limit_mb"]),
            max_processes=self.config.max_processes,
            max_file_size_mb=self.config.max_file_size_mb,
            max_open_files=self.config.max_open_files,
        )
        go = {
            "code": job["code"],
            "stdin": job.get("stdin"),
            "limits": limits.__dict__,
            "processes_in_use": 0 if self.drop == "uid" else _processes_of_uid(os.getuid()),
        }
        start = time.monotonic()
        self.last_start = start
        _write_all(prepared.go_w, json.dumps(go).encode())
        os.close(prepared.go_w)
        deadline = start + limits.run_timeout_s
        out, err = Capture(self.config.output_limit_bytes), Capture(self.config.output_limit_bytes)
        status = bytearray()
        record: dict[str, Any] | None = None
        open_fds = {prepared.out_r: out, prepared.err_r: err}
        exited, timed_out = False, False
        poller = select.poll()
        for fd in (prepared.out_r, prepared.err_r, prepared.status_r, prepared.pidfd):
            poller.register(fd, select.POLLIN)
        while record is None and not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _event in poller.poll(max(1, int(remaining * 1000))):
                if fd == prepared.pidfd:
                    exited = True
                    continue
                data, eof = _read_available(fd)
                if fd == prepared.status_r:
                    status += data
                    record = _parse_record(status) if status else None
                    if eof:
                        poller.unregister(fd)
                elif fd in open_fds:
                    open_fds[fd].add(data)
                    if eof:
                        poller.unregister(fd)
                        del open_fds[fd]
        elapsed = time.monotonic() - start
        if record is None and exited:  # the status may have been written just before the exit
            status += _read_available(prepared.status_r)[0]
            record = _parse_record(status)
        exit_code: int | None
        term_signal: int | None = None
        cpu: float | None
        if record is not None and not timed_out:
            exit_code, cpu = int(record["exit_code"]), float(record["cpu"])
        else:
            if not exited:
                self._kill_leftovers(prepared.pid)
            _, wait_status, usage = os.wait4(prepared.pid, 0)
            prepared.pid = 0  # reaped
            cpu = usage.ru_utime + usage.ru_stime
            if os.WIFSIGNALED(wait_status):
                exit_code, term_signal = None, os.WTERMSIG(wait_status)
            else:
                exit_code = os.WEXITSTATUS(wait_status)
            if timed_out:
                exit_code, term_signal = None, signal.SIGKILL
        for fd, capture in open_fds.items():
            capture.add(_read_available(fd)[0])
        for fd in (prepared.out_r, prepared.err_r, prepared.status_r):
            os.close(fd)
        stderr = render_output(bytes(err.kept), err.total, err.limit)
        note = signal_note(term_signal, timed_out)
        if note:
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + note + "\n"
        return {
            "type": "result",
            "exit_code": exit_code,
            "signal": term_signal,
            "timed_out": timed_out,
            "memory_error": bool(record and record.get("memory_error") is True),
            "stdout": render_output(bytes(out.kept), out.total, out.limit),
            "stderr": stderr,
            "execution_time": elapsed,
            "cpu_time": cpu,
            "output_truncated": out.total > len(out.kept) or err.total > len(err.kept),
            "phases": {k: round((v - start) * 1000, 2) for k, v in (record or {}).get("phases", {}).items() if isinstance(v, float)},
        }

    def _write_files(self, files: dict[str, str | None]) -> None:
        for raw_path, content in files.items():
            path = os.path.join(self.workdir, checked_relative_path(raw_path))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(content or ""))
            if self.drop == "uid":
                _chown_up_to(path, self.workdir, self.uid, self.gid)

    def _fetch(self, paths: list[str]) -> dict[str, str]:
        """Files the request asked back; symlinks and anything outside the directory are refused."""
        fetched: dict[str, str] = {}
        budget = self.config.max_fetch_bytes
        root = os.path.realpath(self.workdir)
        for raw_path in paths:
            try:
                relative = checked_relative_path(raw_path)
            except ValueError:
                continue
            full = os.path.join(root, relative)
            if os.path.realpath(full) != full:
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                if not os.path.isfile(f"/proc/self/fd/{fd}") or os.fstat(fd).st_size > budget:
                    continue
                data = f.read(budget + 1)
            if len(data) > budget:
                continue
            budget -= len(data)
            fetched[raw_path] = base64.b64encode(data).decode()
        return fetched

    # ---- cleanup ---------------------------------------------------------------------------
    def _kill_leftovers(self, pid: int) -> None:
        """Kill the execution and everything it started, including detached processes."""
        if self.pid_namespace:
            with contextlib.suppress(ProcessLookupError):  # as pid 1 of the namespace: every other process in it
                os.kill(-1, signal.SIGKILL)
            return
        for target in _descendants(os.getpid()):
            _signal(target, signal.SIGKILL)
        if pid:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if self.drop == "uid":
            _kill_all_of_uid(self.uid)

    def _reap(self, prepared: Prepared) -> None:
        os.close(prepared.pidfd)
        if prepared.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(prepared.pid, 0)
        if self.pid_namespace:  # every other process of the namespace got SIGKILL: wait for all
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return
        # Without a pid namespace: orphans come back to us (subreaper). Wait until every process of
        # the execution is gone, zombies included (they count against RLIMIT_NPROC of the next one).
        deadline = time.monotonic() + 5.0
        next_kill = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            remaining = _processes_of_uid(self.uid) if self.drop == "uid" else len(_descendants(os.getpid()))
            if not remaining:
                return
            if time.monotonic() > next_kill:
                self._kill_leftovers(0)
                next_kill = time.monotonic() + 0.2
            time.sleep(0.002)
        logger.warning("processes of the last execution still alive after 5 s")

    def _clean_workdir(self) -> None:
        for name in os.listdir(self.workdir):
            path = os.path.join(self.workdir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=_force_remove)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            return  # the child died before reading its job; its exit status tells the rest
        view = view[written:]


def _read_available(fd: int) -> tuple[bytes, bool]:
    """What can be read without blocking, and whether the writers are all gone (EOF)."""
    chunks = []
    eof = False
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            eof = True
            break
        chunks.append(chunk)
    return b"".join(chunks), eof


def _parse_record(data: bytes) -> dict[str, Any] | None:
    """The child's status record; None when absent or mangled (the code may write to the pipe itself)."""
    try:
        record = json.loads(data)
        int(record["exit_code"])
        float(record["cpu"])
    except (ValueError, TypeError, KeyError):
        return None
    return record if isinstance(record, dict) else None


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (via /proc/<pid>/task/*/children), deepest last."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            frontier.extend(kids)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _kill_all_of_uid(uid: int) -> None:
    """Kill every process of an execution uid (root mode without pid namespace): fork, become it, kill(-1)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _processes_of_uid(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _chown_up_to(path: str, root: str, uid: int, gid: int) -> None:
    while path.startswith(root) and path != root:
        os.chown(path, uid, gid)
        path = os.path.dirname(path)


def _force_remove(func: Any, path: str, _exc_info: Any) -> None:
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass
