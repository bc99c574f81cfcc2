"""The warm template: imports the math stack once, then forks workers on the server's request.

Started by the server as ``python -m retool.sandbox.template --control-fd N`` with a scrubbed
environment, so nothing secret is in the memory every execution inherits. Single-threaded (BLAS
thread pools pinned to one thread before numpy loads), which is what makes forking it safe. For each
worker it creates a socket pair, forks, and hands the server its end over the control socket
(SCM_RIGHTS). Each forked worker then sets up the strongest isolation the kernel allows (see
``worker``): the outcome travels to the server in the worker's hello and ends up in /readyz.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from typing import NoReturn

from retool.sandbox import isolation, logs, protocol
from retool.sandbox.worker import Worker, WorkerConfig

logger = logging.getLogger("retool.sandbox.template")

# Calls that trigger lazy imports and caches, so the first real execution does not pay for them
# (and, under a dropped uid, does not need to read the Python installation again).
WARMUP = """
import numpy as np, sympy as sp
x = sp.symbols('x')
sp.solve(x**2 - 5*x + 6, x); sp.simplify(sp.sin(x)**2 + sp.cos(x)**2); sp.factorint(360); sp.Rational(1, 3) + 1
sp.integrate(x**2, (x, 0, 1)); sp.expand((x + 1)**3); sp.nsimplify(0.5); sp.isprime(97); sp.latex(x**2)
np.linalg.solve(np.eye(3), np.ones(3)); np.linalg.det(np.eye(2)); np.linalg.eig(np.eye(2)); np.random.default_rng(0).random(3)
from scipy import optimize, integrate, special
optimize.brentq(lambda t: t - 1, 0, 2); integrate.quad(lambda t: t, 0, 1); special.comb(5, 2)
import math, fractions, itertools
math.comb(10, 3); fractions.Fraction(1, 3); list(itertools.permutations(range(3)))
"""


def load(modules: list[str]) -> list[str]:
    """Import the preload list; returns the problems (a missing optional module is not fatal)."""
    problems = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            problems.append(f"import {name}: {type(exc).__name__}: {exc}")
    try:
        exec(compile(WARMUP, "<warmup>", "exec"), {"__name__": "__warmup__"})
    except Exception as exc:
        problems.append(f"warm-up: {type(exc).__name__}: {exc}")
    return problems


def setup_isolation(config: WorkerConfig) -> tuple[isolation.IsolationReport, bool]:
    """Enter the namespaces this kernel allows; returns the report and whether a pid namespace was created.

    As root: new pid, network and mount namespaces directly, executions drop to uid ``uid_base +
    slot``. Not root: the same inside a new user namespace (identity-mapped, so files keep their
    owner); executions drop every capability. Either failing (no CAP_SYS_ADMIN, a seccomp profile
    that forbids unshare): no namespaces, and the report says what is missing.
    """
    root = os.geteuid() == 0
    run_uid = config.uid_base + config.slot if root else os.getuid()
    problems: list[str] = []
    mode = "none"
    if config.isolation == "auto":
        try:
            if root:
                isolation.unshare(isolation.CLONE_NEWPID | isolation.CLONE_NEWNET | isolation.CLONE_NEWNS)
                mode = "root-namespaces"
            else:
                uid, gid = os.getuid(), os.getgid()
                isolation.unshare(isolation.CLONE_NEWUSER | isolation.CLONE_NEWPID | isolation.CLONE_NEWNET | isolation.CLONE_NEWNS)
                isolation.write_id_maps(uid, gid)
                mode = "user-namespaces"
        except OSError as exc:
            problems.append(f"no namespaces ({exc}): no network isolation (rely on the NetworkPolicy), detached processes are tracked as descendants only")
    else:
        problems.append("namespaces disabled by configuration (isolation=none)")
    if not root:
        problems.append("not started as root: executions run as the server's uid")
    elif not readable_by_others(os.path.dirname(os.__file__)):
        problems.append("the Python installation is not readable by the execution uids: only preloaded modules can be imported")
    namespaces = mode != "none"
    report = isolation.IsolationReport(
        mode=mode,
        network_isolated=namespaces,
        pid_namespace=namespaces,
        private_tmp=namespaces,
        privilege_drop=root,
        run_uid=run_uid,
        problems=tuple(problems),
    )
    return report, namespaces


def readable_by_others(path: str) -> bool:
    """Whether a uid without privileges can reach and list ``path`` (every parent searchable)."""
    current = os.path.abspath(path)
    if not os.stat(current).st_mode & 0o004:
        return False
    while True:
        if not os.stat(current).st_mode & 0o001:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


def worker_main(sock: socket.socket, config: WorkerConfig) -> NoReturn:
    """In the forked process: isolate, then (with a pid namespace) fork the worker as its pid 1."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        isolation.die_with_parent()
        report, pid_namespace = setup_isolation(config)
        if pid_namespace:
            pid = os.fork()
            if pid != 0:  # stay as the worker's keeper: its exit ends us, our death (PDEATHSIG) ends it
                sock.close()
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            isolation.die_with_parent()
            uid = report.run_uid
            gid = uid if report.privilege_drop else os.getgid()
            isolation.setup_private_tmp(config.tmp_size_mb, uid, gid)
            if not isolation.mount_private_proc():
                report = _with_problem(report, "could not mount a private /proc: the execution can list (not signal) the server's processes")
            workdir = "/tmp"
        else:
            isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
            workdir = tempfile.mkdtemp(prefix=f"retool-sandbox-w{config.slot}-", dir=config.tmp_root)
            if report.privilege_drop:
                os.chown(workdir, report.run_uid, report.run_uid)
        os.chmod(workdir, 0o700)
        Worker(sock, config, report, workdir).serve()
    except BaseException:
        logger.exception("worker %d failed", config.slot)
        code = 1
    os._exit(code)


def _with_problem(report: isolation.IsolationReport, problem: str) -> isolation.IsolationReport:
    data = report.as_dict()
    data["problems"] = (*report.problems, problem)
    return isolation.IsolationReport(**data)


def serve(control: socket.socket) -> None:
    """Answer spawn requests until the server goes away."""
    while True:
        try:
            message, _ = protocol.recv(control)
        except protocol.ChannelClosedError:
            return
        if message.get("op") != "spawn":
            logger.error("unknown control message %r", message.get("op"))
            continue
        config = WorkerConfig.from_dict(message["config"])
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            control.close()
            ours.close()
            worker_main(theirs, config)
        theirs.close()
        protocol.send(control, {"type": "spawned", "slot": config.slot, "pid": pid}, fds=[ours.fileno()])
        ours.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="warm template of the sandbox (started by the server)")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--preload", default="", help="comma-separated modules")
    args = parser.parse_args(argv)
    logs.configure(logging.INFO)
    isolation.die_with_parent()
    isolation.set_dumpable(False)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers' keepers are reaped by the kernel
    control = socket.socket(fileno=args.control_fd)
    started = time.monotonic()
    problems = load([m for m in args.preload.split(",") if m])
    gc.collect()
    gc.freeze()  # executions then do not touch (and copy) the template's objects when they collect
    huge_mb = isolation.collapse_to_huge_pages()
    protocol.send(control, {"type": "ready", "load_seconds": time.monotonic() - started, "problems": problems, "huge_pages_mb": huge_mb})
    with contextlib.suppress(KeyboardInterrupt):
        serve(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
