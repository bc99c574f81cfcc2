"""What runs inside an execution process, forked from a worker before its job arrives.

The worker forks the next child while it is idle (the fork of an interpreter holding numpy, sympy
and scipy costs milliseconds; this takes it off the request's path). The child detaches into its own
session, closes every inherited descriptor, and blocks until the worker sends the job over a pipe.
Then it applies the limits, drops privileges, runs the code in a fresh ``__main__`` and reports how
it ended on a status pipe before exiting, so the worker can answer without waiting for the kernel to
tear the process down.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import json
import linecache
import os
import resource
import signal
import sys
import time
import traceback
import types
from typing import Any, NoReturn

from retool.sandbox import isolation
from retool.sandbox.outcome import Limits, rlimits

CODE_FILENAME = "main.py"
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _close_other_fds(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _baseline_vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _exit_code_of(exc: SystemExit) -> int:
    """What ``python main.py`` would exit with after ``sys.exit(value)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


def main(go_fd: int, stdout_fd: int, stderr_fd: int, status_fd: int, setup: dict[str, Any]) -> NoReturn:
    """Entry of a freshly forked child; never returns.

    Everything that does not depend on the request (detaching, dropping privileges, a clean
    environment, fresh stdio, reseeding numpy) happens before the job arrives, off its latency.
    """
    exit_code = 70
    try:
        os.setsid()
        isolation.die_with_parent()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _close_other_fds({go_fd, stdout_fd, stderr_fd, status_fd})
        baseline_vm = _baseline_vm_bytes()
        _settle(setup, stdout_fd, stderr_fd)
        job = json.loads(_read_all(go_fd))
        os.close(go_fd)
        job["t_go"] = time.monotonic()
        exit_code = _run(job, baseline_vm, status_fd)
    except BaseException:  # the harness itself failed: say so on stderr (fd 2 once settled), the worker reports it
        with contextlib.suppress(OSError):
            os.write(2, traceback.format_exc().encode(errors="replace"))
    os._exit(exit_code)


def _settle(setup: dict[str, Any], stdout_fd: int, stderr_fd: int) -> None:
    cwd = setup["cwd"]
    os.chdir(cwd)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    if setup["drop"] == "uid":
        os.setgroups([])
        os.setgid(setup["gid"])
        os.setuid(setup["uid"])
    elif setup["drop"] == "caps":
        isolation.drop_capabilities()
    isolation.no_new_privs()
    os.environ.clear()
    os.environ.update(SAFE_ENV, HOME=cwd, TMPDIR=cwd, PWD=cwd)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.argv = [CODE_FILENAME]
    sys.path[0] = cwd
    if "numpy" in sys.modules:  # a fork copies numpy's global random state: reseed like a fresh interpreter
        sys.modules["numpy"].random.seed(int.from_bytes(os.urandom(4), "little"))


def _apply(job: dict[str, Any], baseline_vm: int) -> None:
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, (job.get("stdin") or "").encode())
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    os.dup2(stdin_fd, 0)
    os.close(stdin_fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    limits = Limits(**job["limits"])
    for res, (soft, hard) in rlimits(limits, baseline_vm, job.get("processes_in_use", 0)).items():
        resource.setrlimit(res, (soft, hard))


def _run(job: dict[str, Any], baseline_vm: int, status_fd: int) -> int:
    _apply(job, baseline_vm)
    t_prepared = time.monotonic()
    code = job["code"]
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __file__=CODE_FILENAME)
    sys.modules["__main__"] = module
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    memory_error = False
    try:
        exec(compile(code, CODE_FILENAME, "exec"), module.__dict__)
        exit_code = 0
    except SystemExit as exc:
        exit_code = _exit_code_of(exc)
    except BaseException as exc:
        memory_error = isinstance(exc, MemoryError)
        # Drop the harness frame: the traceback reads like ``python main.py``'s.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        exit_code = 1
    t_ran = time.monotonic()
    try:
        import threading

        threading._shutdown()  # wait for non-daemon threads, as the interpreter does at exit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os.close(1)
    os.close(2)
    usage_self = resource.getrusage(resource.RUSAGE_SELF)
    usage_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage_self.ru_utime + usage_self.ru_stime + usage_children.ru_utime + usage_children.ru_stime
    phases = {"go": job["t_go"], "prepared": t_prepared, "ran": t_ran, "done": time.monotonic()}
    record = json.dumps({"exit_code": exit_code, "memory_error": memory_error, "cpu": cpu, "phases": phases}).encode()
    os.write(status_fd, record)  # one write under PIPE_BUF: atomic
    os.close(status_fd)  # EOF now, not after the kernel has torn the process down
    return exit_code
