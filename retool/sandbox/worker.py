"""A worker: one execution at a time, supervised from a warm process forked from the template.

The worker talks to the server over a Unix socket and applies the replica's isolation plan (see
``layers``). With namespaces it is pid 1 of its own pid namespace, in a network namespace without
interfaces and a mount namespace whose /tmp (also /var/tmp and /dev/shm) is a size-limited tmpfs of
its own: killing every process of an execution is ``kill(-1)``. Without, it is a child subreaper,
every execution gets a fresh directory with an unguessable name under the replica's scratch root,
and Landlock (where the kernel has it) confines the execution to that directory.

Each execution runs in a process the worker forked before the request arrived (see ``child``): it
applies every request-independent layer while idle and acknowledges on a pipe it then closes. How
the execution ended comes only from ``wait4`` on that process — nothing the code can write to any
descriptor changes its status. While it runs, the worker watches the memory of all its processes
together and the size of its directory, and ends it when either goes over its limit.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import itertools
import logging
import os
import secrets
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retool.sandbox import accounting, cgroups, child, isolation, landlock, protocol, scratch
from retool.sandbox.layers import Plan
from retool.sandbox.outcome import Limits, checked_relative_path, limit_note, render_output, signal_note
from retool.sandbox.zygote import Zygote, ZygoteLostError

logger = logging.getLogger(__name__)

SETUP_MEMORY_MB = 256
"""The cgroup memory limit of a pre-forked process until its job (and its memory limit) arrives."""

CHILD_SETUP_TIMEOUT_S = 30.0
"""How long a pre-forked process may take to acknowledge its setup before the worker gives up."""
WATCH_INTERVAL_S = 0.01
"""How often a running execution's memory and directory are measured (not before it has run this long)."""
DRAIN_TIMEOUT_S = 1.0
PIPE_BYTES = 256 << 10
"""Capacity of an execution's stdout/stderr pipes: output up to this size never makes it wait for
the worker, so the worker reads it on its 10 ms ticks and at exit instead of waking on every write
(a wake-up right before the execution's exit would put the worker ahead of the exit on a busy CPU)."""
F_SETPIPE_SZ = 1031
"""After the execution ended and its leftovers were killed: how long to wait for the pipes to close."""
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys/devices/system/cpu")


class HarnessError(RuntimeError):
    """The worker cannot run executions as its plan says (a pre-forked process failed its setup)."""


@dataclass
class Prepared:
    """A forked child waiting for its job, and the worker's ends of its pipes."""

    pid: int
    go_w: int
    out_r: int
    err_r: int
    ack_r: int
    pidfd: int
    workdir: str
    baseline_kib: int
    quiet: bool = False
    """The pipes are big enough to be read on ticks only."""
    group: cgroups.Execution | None = None
    """Its own memory and pids cgroups (joined at the fork, off the request's path), when the replica has them."""

    def close(self, *names: str) -> None:
        """Close the named pipe ends (all four by default) that are still open; -1 marks one closed.

        Every path out of an execution ends with ``close()``, so no descriptor outlives its request,
        whatever failed on the way (issue 49: a harness error left three pipes open per request,
        until the uid's pipe budget was gone)."""
        for name in names or ("go_w", "out_r", "err_r", "ack_r"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                with contextlib.suppress(OSError):
                    os.close(fd)


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
    max_scratch_files: int
    tmp_root: str
    uid_base: int
    plan: Plan
    cgroup_failure: str = "refuse"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerConfig:
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["plan"] = Plan.from_dict(data["plan"])
        return cls(**values)


class Worker:
    def __init__(self, sock: socket.socket, config: WorkerConfig) -> None:
        self.sock = sock
        self.config = config
        self.plan = config.plan
        self.pid_namespace = self.plan.namespaces is not None
        if self.plan.uid_per_execution:
            self.drop, self.uid = "uid", config.uid_base + config.slot
            self.gid = self.uid
        else:
            self.drop = "caps" if self.plan.namespaces == "user-namespaces" else "none"
            self.uid, self.gid = os.getuid(), os.getgid()
        self.root_fd = -1
        if not self.pid_namespace:  # executions get fresh directories in the replica's scratch root
            self.root_fd = os.open(config.tmp_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        keep_out = [config.tmp_root] if not self.pid_namespace else []
        candidates = [*SYSTEM_READ_PATHS, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
        self.read_paths = landlock.read_paths(candidates, keep_out) if self.plan.landlock_abi else ()
        self.broken = False
        self.cgroups = cgroups.Subtree(self.plan.cgroup_version, tuple(Path(d) for d in self.plan.cgroup_dirs)) if self.plan.cgroup_version else None
        self._cgroup_names = (f"w{config.slot}-{secrets.token_hex(4)}-{n}" for n in itertools.count(1))
        self.layers = {
            "drop": self.drop,
            "uid": self.uid,
            "gid": self.gid,
            "landlock_abi": self.plan.landlock_abi,
            "read_paths": list(self.read_paths),
            "seccomp": self.plan.seccomp,
            "signals_scoped": self.plan.signals_scoped,
            "deny_chmod": self.plan.deny_chmod,
            # Dumpable lets the worker read its smaps (the memory watch); siblings cannot use it
            # where Landlock, namespaces or distinct uids keep them apart.
            "dumpable": self.plan.landlock_abi >= 1 or self.plan.namespaces is not None or self.plan.uid_per_execution,
            # Same-uid executions in a pid namespace could otherwise signal the zygote (their parent).
            "protect_parent": self.pid_namespace and self.drop != "uid",
            "native_setup": self.plan.native_setup,
        }
        """Every execution's setup but its directory: the zygote holds it (``Zygote(layers=...)``)."""
        self.zygote: Zygote | None = None
        self.uid_processes = accounting.UidProcesses(os.getuid())
        self.warm_stack = accounting.start_stack("self")  # the zygote's and its executions' too (forks)

    # ---- lifecycle -------------------------------------------------------------------------
    def serve(self) -> None:
        # Before the first request is read: the zygote's memory never holds one (see ``zygote``).
        self.zygote = Zygote(self.pid_namespace, close_in_zygote=(self.sock.fileno(),), layers=self.layers)
        try:
            self._serve()
        finally:
            self.zygote.close()

    def _serve(self) -> None:
        protocol.send(self.sock, {"type": "hello", "slot": self.config.slot})
        prepared = self._prefork()
        while not self.broken:
            try:
                job, _ = protocol.recv(self.sock)
            except protocol.ChannelClosedError:  # the server is gone: leave nothing behind
                self._kill_leftovers(prepared.pid)
                return
            try:
                result = self._execute(prepared, job)
            except (HarnessError, ZygoteLostError) as exc:
                logger.error("worker %d cannot run executions: %s", self.config.slot, exc)
                result = {"type": "result", "sandbox_error": str(exc)}
                self.broken = True
            except Exception as exc:  # a harness failure is the sandbox's, not the code's
                logger.exception("execution failed inside the worker")
                result = {"type": "result", "sandbox_error": f"{type(exc).__name__}: {exc}"}
            prepared.close()  # whatever the path out of the execution, none of its pipes stays open
            if prepared.pid:  # not waited for (a harness failure): end it now
                self._kill_leftovers(prepared.pid)
            if job.get("fetch_files") and "sandbox_error" not in result:
                result["files"] = self._fetch(prepared.workdir, job["fetch_files"])
            protocol.send(self.sock, result)
            following = self._after(prepared)
            if following is not None:
                prepared = following

    def _after(self, finished: Prepared) -> Prepared | None:
        """Reap and clean after an execution, and pre-fork the next one (None: this worker is broken).

        Where nothing has to happen between the reap and the next fork (no cgroups of the finished
        execution to remove first, so a worker never has two; no private /tmp to empty: the next
        execution gets a directory of its own), one zygote round trip reaps every process the
        execution left and forks the next one (``Zygote.fork(reap_first=True)``): reaped before
        the fork as before, in one message instead of two, and the finished execution's directory
        is removed after. Otherwise: reap, remove its cgroups, empty its directory, then fork.
        Whatever goes wrong here breaks this worker (the pool replaces it and sweeps its
        directory), never the next execution.
        """
        following = None
        try:
            os.close(finished.pidfd)
            assert self.zygote is not None
            if finished.pid:  # not waited for (a harness failure)
                self.zygote.kill()
                self.zygote.wait(finished.pid)
                finished.pid = 0
            if not self.broken and finished.group is None and not self.pid_namespace:
                following = self._prefork(reap_first=True)
            elif self.zygote.reap():
                logger.warning("processes of the last execution still alive after 5 s")
            if finished.group is not None:  # after the answer: off the request's path
                try:
                    finished.group.remove()
                except cgroups.CgroupError as exc:
                    logger.warning("execution cgroup left behind (removed when the replica stops): %s", exc)
            self._clean(finished.workdir)
            if following is None and not self.broken:
                following = self._prefork()
        except Exception:
            logger.exception("worker %d could not clean up after an execution: retiring", self.config.slot)
            self.broken = True
        return None if self.broken else following

    def _new_workdir(self) -> str:
        if self.pid_namespace:
            return "/tmp"  # the worker's private tmpfs, emptied after every execution
        name = f"x{secrets.token_hex(16)}"
        os.mkdir(name, 0o700, dir_fd=self.root_fd)
        if self.drop == "uid":
            os.chown(name, self.uid, self.gid, dir_fd=self.root_fd)
        return os.path.join(self.config.tmp_root, name)

    def _prefork(self, reap_first: bool = False) -> Prepared:
        """Fork the next execution (after reaping the last one's processes, with ``reap_first``)."""
        workdir = self._new_workdir()
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ack_r, ack_w = os.pipe()
        assert self.zygote is not None
        try:
            pid, baseline, left = self.zygote.fork(workdir, go_r, out_w, err_w, ack_w, reap_first=reap_first)
        finally:
            for fd in (go_r, out_w, err_w, ack_w):
                os.close(fd)
        if left:
            logger.warning("processes of the last execution still alive after 5 s")
        for fd in (out_r, err_r, ack_r):
            os.set_blocking(fd, False)
        quiet = _enlarge_pipe(out_r) and _enlarge_pipe(err_r)
        # Joined now, while it waits for a job (it runs none of a request's code before); the job's
        # memory limit is written when the job arrives.
        group = self._join_cgroup(pid, self._cgroup_bytes(SETUP_MEMORY_MB, baseline), self.config.max_processes)
        return Prepared(pid, go_w, out_r, err_r, ack_r, os.pidfd_open(pid), workdir, baseline, quiet, group)

    # ---- one execution ---------------------------------------------------------------------
    def _execute(self, prepared: Prepared, job: dict[str, Any]) -> dict[str, Any]:
        ack_r, prepared.ack_r = prepared.ack_r, -1
        wait_for_setup(ack_r)  # closes it
        try:
            self._write_files(prepared.workdir, job.get("files") or {})
        except (OSError, ValueError) as exc:  # the pipes are closed by the caller, as on every path out
            return {"type": "result", "sandbox_error": f"could not write the request's files: {getattr(exc, 'strerror', None) or exc}"}
        limits = Limits(
            run_timeout_s=float(job["run_timeout"]),
            memory_limit_mb=int(job["memory_limit_mb"]),
            max_processes=self.config.max_processes,
            max_file_size_mb=self.config.max_file_size_mb,
            max_open_files=self.config.max_open_files,
        )
        go = {"code": job["code"], "stdin": job.get("stdin"), "limits": limits.__dict__, "processes_in_use": self._processes_in_use(job)}
        # The kernel's limits first: the process is in its own memory and pids cgroup (``_prefork``);
        # the watch below stays as a second layer.
        group = prepared.group
        cgroup_missing = self.cgroups is not None and group is None
        if cgroup_missing and self.config.cgroup_failure == "refuse":
            prepared.close()
            return {
                "type": "result",
                "cgroup_missing": True,
                "sandbox_error": "this execution's memory and pids cgroup could not be made on this replica; refused (cgroup_failure=refuse)",
            }
        cgroup_limit = self._cgroup_bytes(limits.memory_limit_mb, prepared.baseline_kib)
        if group is not None:
            try:
                group.set_memory(cgroup_limit)
            except cgroups.CgroupError as exc:
                logger.warning("the execution's cgroup keeps its setup limit: %s", exc)
        start = time.monotonic()
        _write_all(prepared.go_w, protocol.MARSHAL.dumps(go))  # read before any of the job's code runs
        prepared.close("go_w")
        deadline = start + limits.run_timeout_s
        out, err = Capture(self.config.output_limit_bytes), Capture(self.config.output_limit_bytes)
        open_fds = {prepared.out_r: out, prepared.err_r: err}
        memory = accounting.MemoryWatch(limit_kib=limits.memory_limit_mb * 1024, baseline_kib=prepared.baseline_kib, inspect=self._inspect, warm_stack=self.warm_stack)
        watch_disk = not self.pid_namespace
        next_watch = start + WATCH_INTERVAL_S
        disk_every = WATCH_INTERVAL_S
        exited, timed_out = False, False
        killed_for: tuple[str, int] | None = None  # (limit, amount: bytes; tasks for "processes")
        poller = select.poll()
        for fd in (prepared.pidfd,) if prepared.quiet else (prepared.out_r, prepared.err_r, prepared.pidfd):
            poller.register(fd, select.POLLIN)
        while not exited and killed_for is None:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= next_watch:
                if group is not None and group.oom_kills():
                    killed_for = ("memory-cgroup", cgroup_limit)
                    break
                pids, tasks = self._execution_pids()
                if tasks > limits.max_processes:  # its own, whatever the shared uid's count lets it start
                    killed_for = ("processes", tasks)
                    break
                over = memory.over(pids, now)
                if over is not None:
                    killed_for = ("memory", over * 1024)
                    break
                if watch_disk:
                    measured = time.monotonic()
                    used, entries = accounting.directory_usage(prepared.workdir, self.config.max_scratch_files)
                    used += self._inspect(functools.partial(accounting.unlinked_open_bytes, pids))
                    if used > self.config.tmp_size_mb << 20 or entries > self.config.max_scratch_files:
                        killed_for = ("disk", used)
                        break
                    disk_every = max(WATCH_INTERVAL_S, 10 * (time.monotonic() - measured))
                next_watch = time.monotonic() + max(WATCH_INTERVAL_S, disk_every if watch_disk else 0)
            timeout_ms = max(1, int(min(deadline, next_watch) * 1000 - time.monotonic() * 1000))
            ready = {fd for fd, _event in poller.poll(timeout_ms)}
            exited = prepared.pidfd in ready
            for fd in list(open_fds):
                if prepared.quiet or fd in ready:
                    data, eof = _read_available(fd)
                    open_fds[fd].add(data)
                    if eof:
                        if not prepared.quiet:
                            poller.unregister(fd)
                        del open_fds[fd]
        if watch_disk and killed_for is None and not timed_out:
            # The last state counts too: files made faster than one measurement takes (thousands in a
            # fraction of a second) must not pass the limit because the execution ended in between.
            used, entries = accounting.directory_usage(prepared.workdir, self.config.max_scratch_files)
            if used > self.config.tmp_size_mb << 20 or entries > self.config.max_scratch_files:
                killed_for = ("disk", used)
        elapsed = time.monotonic() - start
        phases = {"ended": elapsed}
        if not exited:
            self._kill_leftovers(prepared.pid)
        # The status comes from the kernel alone (wait4, in the zygote): nothing the code wrote
        # anywhere can change it.
        assert self.zygote is not None
        ended = self.zygote.wait(prepared.pid)  # and whatever it left running is killed with it
        wait_status, cpu = ended.status, ended.cpu_seconds
        if group is not None and killed_for is None and not timed_out and group.oom_kills():
            killed_for = ("memory-cgroup", cgroup_limit)  # the kernel ended a process of it at the limit
        phases["reaped"] = time.monotonic() - start
        prepared.pid = 0
        phases["leftovers_killed"] = time.monotonic() - start
        self._drain(open_fds)
        phases["drained"] = time.monotonic() - start
        prepared.close("out_r", "err_r")
        exit_code: int | None = None
        term_signal: int | None = None
        if timed_out:
            term_signal = signal.SIGKILL
        elif os.WIFSIGNALED(wait_status):
            term_signal = os.WTERMSIG(wait_status)
        else:
            exit_code = os.WEXITSTATUS(wait_status)
        stderr = render_output(bytes(err.kept), err.total, err.limit)
        if killed_for is not None and killed_for[0] == "memory-cgroup":
            note = f"Killed: the program's processes reached memory_limit_MB={limits.memory_limit_mb} (the kernel's memory cgroup of the execution stopped them)"
        else:
            note = limit_note(*killed_for, limits, self.config.tmp_size_mb, memory.pipes_kib * 1024) if killed_for else signal_note(term_signal, timed_out)
        if note:
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + note + "\n"
        memory_error = (killed_for is not None and killed_for[0] in ("memory", "memory-cgroup")) or (exit_code == 1 and b"MemoryError" in bytes(err.kept[-300:]))
        return {
            "type": "result",
            "exit_code": exit_code,
            "signal": term_signal,
            "timed_out": timed_out,
            "memory_error": memory_error,
            "limit_exceeded": ("memory" if killed_for[0] == "memory-cgroup" else killed_for[0]) if killed_for else None,
            "stdout": render_output(bytes(out.kept), out.total, out.limit),
            "stderr": stderr,
            "execution_time": elapsed,
            "cpu_time": cpu,
            "output_truncated": out.total > len(out.kept) or err.total > len(err.kept),
            "phases": {name: round(seconds * 1000, 2) for name, seconds in phases.items()},
            "cgroup_missing": cgroup_missing,
        }

    def _cgroup_bytes(self, memory_mb: int, baseline_kib: int) -> int:
        """An execution's cgroup limit: its memory limit, the warm interpreter's pages it copies on
        write (the watch's baseline), and, with a private /tmp, that tmpfs's pages (bounded by the
        scratch quota itself)."""
        scratch_mb = self.config.tmp_size_mb if self.plan.private_tmp else 0
        return ((memory_mb + scratch_mb) << 20) + baseline_kib * 1024

    def _join_cgroup(self, pid: int, memory_bytes: int, pids_max: int) -> cgroups.Execution | None:
        """The execution's own cgroups, with ``pid`` in them; None without the layer or when the kernel
        refused this once (logged: the watch still limits the execution)."""
        if self.cgroups is None:
            return None
        try:
            group = self.cgroups.execution(next(self._cgroup_names), memory_bytes, pids_max)
        except cgroups.CgroupError as exc:
            logger.warning("no cgroup for this execution: %s", exc)
            return None
        try:
            group.attach(pid)
        except cgroups.CgroupError as exc:
            logger.warning("no cgroup for this execution: %s", exc)
            with contextlib.suppress(cgroups.CgroupError):
                group.remove()
            return None
        return group

    def _inspect(self, read: Callable[[], int]) -> int:
        """Read the execution's /proc files as its own uid when it has one (no CAP_SYS_PTRACE needed)."""
        if self.drop == "uid":
            return isolation.as_fs_identity(self.uid, self.gid, read)
        return read()

    def _processes_in_use(self, job: dict[str, Any]) -> int:
        """RLIMIT_NPROC counts every process of the uid: add the ones that are not this execution's.

        Where executions share the replica's uid and its view of the processes, the server counts
        them once per dispatch (``Plan.replica_counts_processes``): counted here, each of the 16
        workers listed /proc and looked up every pid the others had started since its last count,
        a sixth of a worker's CPU per request (bench/RESULTS.md)."""
        if self.drop == "uid":
            return 0
        if self.plan.replica_counts_processes:
            return int(job["processes_in_use"])
        if self.plan.namespaces == "user-namespaces":
            return len(accounting.descendants("self")) + 1  # the uid's count is global: best effort (zygote included)
        return self.uid_processes.count()  # a pid namespace without a uid switch: its own processes

    def _drain(self, open_fds: dict[int, Capture]) -> None:
        """Read what the pipes still hold; every writer is dead, so EOF comes at once."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while open_fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_fds), [], [], max(0.0, deadline - time.monotonic()))
            for fd in ready:
                data, eof = _read_available(fd)
                open_fds[fd].add(data)
                if eof:
                    del open_fds[fd]

    def _write_files(self, workdir: str, files: dict[str, str | None]) -> None:
        for raw_path, content in files.items():
            path = os.path.join(workdir, checked_relative_path(raw_path))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(content or ""))
            if self.drop == "uid":
                _chown_up_to(path, workdir, self.uid, self.gid)

    def _fetch(self, workdir: str, paths: list[str]) -> dict[str, str]:
        """Files the request asked back; symlinks, anything outside the directory and bad names are skipped.

        Each path is opened one component at a time from the directory's own descriptor, every component
        with O_NOFOLLOW (``scratch.open_beneath``): a process that outlived its execution may swap a directory for a
        symlink while this runs (issue 49), and a check of the path followed by an open of it would then read
        whatever the symlink names. (openat2's RESOLVE_BENEATH does the same in one call, but the kernels
        the chart supports include ones without it.)"""
        fetched: dict[str, str] = {}
        budget = self.config.max_fetch_bytes
        for raw_path in paths:
            try:
                fd = scratch.open_beneath(workdir, checked_relative_path(raw_path))
            except (OSError, ValueError):  # UnicodeEncodeError is a ValueError
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
    def _execution_pids(self) -> tuple[list[int], int]:
        """Every process of the running execution (all are the zygote's descendants), /proc numbering,
        and their tasks (processes and threads) together."""
        assert self.zygote is not None
        return self.zygote.processes()

    def _kill_leftovers(self, pid: int) -> None:
        """Kill the execution and everything it started, including detached processes."""
        if self.zygote is not None:
            with contextlib.suppress(ZygoteLostError):  # gone: its executions died with it (parent-death signal)
                self.zygote.kill()

    def _clean(self, workdir: str) -> None:
        """Remove what the execution left; a private /tmp that cannot be emptied breaks the worker
        (the next execution would see it), a directory of the shared root is left to the pool."""
        if self.pid_namespace:
            left = scratch.empty_directory(os.open("/", os.O_PATH | os.O_DIRECTORY), "tmp", remove_self=False, close_parent=True)
            if left:
                logger.error("worker %d could not empty its /tmp (%d entries left): retiring", self.config.slot, left)
                self.broken = True
            return
        left = scratch.empty_directory(self.root_fd, os.path.basename(workdir))
        if left:
            logger.warning("worker %d left %d entries of an execution's directory for the pool to sweep", self.config.slot, left)


def wait_for_setup(ack_r: int, timeout_s: float = CHILD_SETUP_TIMEOUT_S) -> None:
    """The pre-forked process applied every layer (it says ``k``, then closes the pipe), or it failed:
    HarnessError with the report it wrote on the same pipe (``child.SETUP_FAILED``): its last line
    (the step and why, e.g. ``FileNotFoundError: [Errno 2] chdir to the execution directory: ...``)
    and where it was raised.
    Closes ``ack_r``."""
    try:
        ready, _, _ = select.select([ack_r], [], [], timeout_s)
        data = b""
        while ready:  # until EOF: a failed setup writes its report, then exits
            chunk, eof = _read_available(ack_r)
            data += chunk
            if data == b"k" or eof or len(data) > 2 * child.SETUP_REPORT_BYTES:
                break
            ready, _, _ = select.select([ack_r], [], [], timeout_s)
    finally:
        os.close(ack_r)
    if data == b"k":
        return
    if not data:
        why = "it exited without a word" if ready else f"no answer in {timeout_s:g} s"
    elif data.startswith(child.SETUP_FAILED):
        lines = [line.strip() for line in data[1:].decode(errors="replace").strip().splitlines()]
        where = next((line for line in reversed(lines) if line.startswith("File ")), None)
        why = (lines[-1] + (f" ({where})" if where else "")) if lines else "no detail"
    else:
        why = f"unexpected acknowledgement {data[:40]!r}"
    raise HarnessError(f"the execution process failed its isolation setup: {why[-2000:]}")


def _enlarge_pipe(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # over the per-user pipe budget: keep the default size and wake on output
        return False
    return True


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


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _chown_up_to(path: str, root: str, uid: int, gid: int) -> None:
    while path.startswith(root) and path != root:
        os.chown(path, uid, gid)
        path = os.path.dirname(path)
