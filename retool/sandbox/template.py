"""The warm template: imports the math stack once, then forks workers on the server's request.

Started by the server as ``python -m retool.sandbox.template --control-fd N`` with a scrubbed
environment, so nothing secret is in the memory every execution inherits. Single-threaded (BLAS
thread pools pinned to one thread before numpy loads), which is what makes forking it safe. For each
worker it creates a socket pair, forks, and hands the server its end over the control socket
(SCM_RIGHTS). At start it probes, each in a throw-away process, what isolation this kernel and these
privileges allow (``probe``); the server decides the replica's plan from that (``layers``) and every
worker applies the plan exactly or exits.
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
import time
from typing import Any, NoReturn

from retool.sandbox import accounting, child, forking, isolation, landlock, layers, logs, protocol, seccomp
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


def probe(settings: dict[str, Any]) -> layers.Probes:
    """What this process's privileges and kernel allow, each namespace mode tried in a throw-away child."""
    caps = isolation.effective_capabilities()
    root = os.geteuid() == 0
    uid_switch = root and caps >= isolation.UID_SWITCH_CAPS
    mode, private_proc, errors = None, False, []
    if settings.get("namespaces", "auto") == "auto":
        candidates = (["root-namespaces"] if uid_switch and isolation.CAP_SYS_ADMIN in caps else []) + ["user-namespaces"]
        for candidate in candidates:
            ok, proc, error = _try_namespaces(candidate)
            if ok:
                mode, private_proc = candidate, proc
                break
            errors.append(f"{candidate}: {error}")
    return layers.Probes(
        euid=os.geteuid(),
        uid_switch=uid_switch,
        namespaces=mode,
        private_proc=private_proc,
        namespace_error="; ".join(errors) or None,
        landlock_abi=landlock.kernel_abi(),
        seccomp_error=seccomp.probe(),
        host_userns=in_initial_user_namespace(),
        native_setup_error=child.native_setup_error(),
    )


IDENTITY_UID_MAP = ["0", "0", "4294967295"]


def in_initial_user_namespace() -> bool:
    """Whether this process is in the node's own user namespace: only there does the uid map cover
    every uid one to one (a pod's user namespace maps 65536 ids onto an unprivileged range)."""
    try:
        with open("/proc/self/uid_map") as handle:
            lines = [line.split() for line in handle.read().splitlines() if line.strip()]
    except OSError:
        return False
    return lines == [IDENTITY_UID_MAP]


def _try_namespaces(mode: str) -> tuple[bool, bool, str]:
    """Set up ``mode`` completely in a throw-away child: (worked, private /proc mounted, error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        message = "ok"
        try:
            enter_namespaces(mode)
            inner = os.fork()  # the pid namespace applies to children
            if inner == 0:
                try:
                    isolation.setup_private_tmp(1, os.getuid(), os.getgid())
                    proc = isolation.mount_private_proc()
                    os.write(write_end, b"ok proc" if proc else b"ok")
                    os._exit(0)
                except BaseException as exc:
                    os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:500])
                    os._exit(1)
            os.waitpid(inner, 0)
            os._exit(0)
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}"
        os.write(write_end, message.encode()[:500])
        os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        reply = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    if reply.startswith("ok"):
        return True, reply == "ok proc", ""
    return False, False, reply or "the probe died"


def enter_namespaces(mode: str) -> None:
    """New pid, network and mount namespaces (inside a new user namespace for ``user-namespaces``)."""
    flags = isolation.CLONE_NEWPID | isolation.CLONE_NEWNET | isolation.CLONE_NEWNS
    if mode == "user-namespaces":
        isolation.enter_user_namespace(flags)
    else:
        isolation.unshare(flags)


def worker_main(sock: socket.socket, config: WorkerConfig, template_pid: int) -> NoReturn:
    """In the forked process: apply the replica's plan exactly, or report why not and exit.

    With namespaces the process forks the worker proper as pid 1 of the new pid namespace and stays
    as its keeper (its exit ends us, our death ends it). Any failure here is fatal: a worker never
    serves with less isolation than the plan says (the pool restarts it with backoff).
    """
    code = 0
    try:
        # No Python handler at all: pid 1 of a pid namespace then ignores every signal sent from
        # inside it (an execution cannot interrupt its worker), and none of the template's applies.
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        isolation.die_with_parent(template_pid)
        plan = config.plan
        if plan.namespaces is not None:
            enter_namespaces(plan.namespaces)
            alive_r, alive_w = os.pipe()  # pid 1 cannot see its parent's pid: EOF here means the keeper died
            pid = os.fork()
            if pid != 0:
                sock.close()
                os.close(alive_r)
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            os.close(alive_w)
            isolation.die_with_parent()
            if _closed(alive_r):
                os._exit(1)
            os.close(alive_r)
            uid = config.uid_base + config.slot if plan.uid_per_execution else os.getuid()
            gid = uid if plan.uid_per_execution else os.getgid()
            isolation.setup_private_tmp(config.tmp_size_mb, uid, gid, config.max_scratch_files)
            if plan.private_proc and not isolation.mount_private_proc():
                raise OSError("could not mount the private /proc the plan requires")
        else:
            isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
        Worker(sock, config).serve()
    except BaseException as exc:
        logger.exception("worker %d failed", config.slot)
        with contextlib.suppress(Exception):
            protocol.send(sock, {"type": "fatal", "slot": config.slot, "error": f"{type(exc).__name__}: {exc}"})
        code = 1
    os._exit(code)


def _closed(fd: int) -> bool:
    """Whether every writer of the pipe ``fd`` is gone (read end at EOF)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return False


class Keepers:
    """The template's children that are workers; anything else it finds among them is an orphan.

    The template is a child subreaper: when a worker dies with an execution still running (no pid
    namespace to end it), that execution's processes are reparented here. The SIGCHLD handler reaps
    what died and kills such orphans with everything they started, so no execution outlives its
    worker and no zombie piles up.
    """

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.ended: list[tuple[int, int]] = []  # logged outside the handler (logging is not reentrant)

    def on_sigchld(self, _signum: int, _frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.pids:
                self.pids.discard(pid)
                self.ended.append((pid, status))
        for orphan in accounting.children(os.getpid()):
            if orphan not in self.pids:
                for pid in [orphan, *accounting.descendants(orphan)]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)


def end_everything(_signum: int, _frame: object) -> None:
    """The server is gone (parent-death signal) or stopping us: no worker or execution survives it.

    Executions of workers without a pid namespace can have detached themselves (setsid, double
    fork); as their subreaper we still see them. Kill every descendant until none is left, then exit.
    """
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        pids = accounting.descendants("self")
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        time.sleep(0.005)
    os._exit(0)


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def serve(control: socket.socket, keepers: Keepers) -> None:
    """Answer spawn requests until the server goes away."""
    template_pid = os.getpid()
    while True:
        try:
            message, _ = protocol.recv(control)
        except protocol.ChannelClosedError:  # the server is gone: take everything with us
            end_everything(signal.SIGTERM, None)
        while keepers.ended:
            pid, status = keepers.ended.pop(0)
            logger.info("worker process %d ended: %s", pid, _describe_status(status))
        if message.get("op") != "spawn":
            logger.error("unknown control message %r", message.get("op"))
            continue
        config = WorkerConfig.from_dict(message["config"])
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        # No SIGCHLD between the fork and the bookkeeping: the handler would take the new worker for an orphan.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            control.close()
            ours.close()
            worker_main(theirs, config, template_pid)
        keepers.pids.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        theirs.close()
        protocol.send(control, {"type": "spawned", "slot": config.slot, "pid": pid}, fds=[ours.fileno()])
        ours.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="warm template of the sandbox (started by the server)")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--preload", default="", help="comma-separated modules")
    parser.add_argument("--namespaces", default="auto", choices=("auto", "off"))
    args = parser.parse_args(argv)
    logs.configure(logging.INFO)
    signal.signal(signal.SIGTERM, end_everything)
    isolation.die_with_parent(os.getppid(), signal.SIGTERM)  # so that it can take everything with it
    isolation.set_dumpable(False)
    control = socket.socket(fileno=args.control_fd)
    started = time.monotonic()
    probes = probe({"namespaces": args.namespaces})
    problems = load([m for m in args.preload.split(",") if m])
    if not _readable_by_others(os.path.dirname(os.__file__)):
        problems.append("the Python installation is not readable by other uids: executions with their own uid can import only preloaded modules")
    gc.collect()
    forking.locate()  # before the freeze hides it (its workers' zygotes fork with it)
    gc.freeze()  # executions then do not touch (and copy) the template's objects when they collect
    huge_mb = isolation.collapse_to_huge_pages()
    keepers = Keepers()
    isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, keepers.on_sigchld)
    protocol.send(
        control,
        {"type": "ready", "load_seconds": time.monotonic() - started, "problems": problems, "huge_pages_mb": huge_mb, "probes": probes.as_dict()},
    )
    with contextlib.suppress(KeyboardInterrupt):
        serve(control, keepers)
    return 0


def _readable_by_others(path: str) -> bool:
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


if __name__ == "__main__":
    sys.exit(main())
