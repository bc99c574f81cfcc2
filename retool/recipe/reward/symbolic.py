"""A small pool of symbolic-equivalence worker processes with a hard deadline per comparison.

verl calls the reward from a thread pool (``loop.run_in_executor``), so neither ``signal.alarm``
nor math-verify's own signal-based timeouts can be used in the caller, and sympy can block inside
one C call for minutes. Each comparison therefore runs in a child process (see
:mod:`retool.recipe.reward.symbolic_worker`: a warm zygote and the executor it forks) whose executor is
killed at the deadline and re-forked from the zygote in milliseconds; a whole worker is replaced
(seconds of imports, while the others serve) only if its zygote dies.

The pool's own trouble never decides a verdict: a worker found dead (killed while idle, its pipe
broken, an executor that died mid-comparison) is replaced and the comparison retried on another
one, up to ``MAX_ATTEMPTS``; only running out of time means "not equivalent". The count of busy
workers is restored in ``finally`` whatever happens, so a failure cannot leak a slot.

Thread-safe: each worker serves one caller at a time.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("symbolic_worker.py")

MAX_ATTEMPTS = 3
"""Workers one comparison may try when the previous one turned out dead (not when it ran out of time)."""


class _WorkerFailedError(Exception):
    """The worker failed, not the comparison: try again (on another worker unless this one is still ``usable``)."""

    def __init__(self, what: str, *, usable: bool = False) -> None:
        super().__init__(what)
        self.usable = usable


class _TimedOutError(Exception):
    """The comparison outlived its deadline: the answer counts as not equivalent."""


class _StillWarmingError(Exception):
    """No executor announced itself before the wait deadline, but the worker is alive (importing)."""


def _decode(line: bytes) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Worker:
    """One child process and the bytes read from it that do not yet form a line."""

    def __init__(self) -> None:
        # -I: the script's folder is not put on sys.path (its sibling modules would shadow others).
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # inherited: an import failure in the worker must be visible in the trainer's log
            close_fds=True,
        )
        self._buffer = b""
        self.ready = False
        self.executor_pid: int | None = None

    def read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None if none came before ``deadline`` or it died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = max(deadline - time.monotonic(), 0.0)  # 0: poll once without waiting
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def wait_ready(self, deadline: float) -> bool:
        """Whether an executor is ready for a request, waiting for its announcement until ``deadline``.

        Lines other than the announcement (a reply the killed executor wrote just before the kill)
        are skipped.
        """
        while not self.ready:
            line = self.read_line(deadline)
            if line is None:
                return False
            announcement = _decode(line)
            if announcement.get("ready") is True:
                self.ready = True
                self.executor_pid = announcement.get("pid") if isinstance(announcement.get("pid"), int) else None
        return True

    def kill_executor(self) -> bool:
        """Kill the executor busy with a late request; the zygote forks a warm one. False if that is not possible."""
        self.ready = False
        if self.executor_pid is None or self.proc.poll() is not None:
            return False
        # ProcessLookupError: it finished at the last moment; the zygote announces a new one either way
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.executor_pid, signal.SIGKILL)
        self.executor_pid = None
        return True

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: dict) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # ValueError: the pipe was already closed
            return False
        return True

    def kill(self) -> None:
        """Kill the executor and the zygote (the executor would otherwise notice only on its next read).

        Never raises: closing a pipe to a dead process can fail (a BrokenPipeError while flushing
        what a failed send left buffered), and nothing about that should reach the caller.
        """
        if self.executor_pid is not None and self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.executor_pid, signal.SIGKILL)
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("symbolic worker %d did not exit after SIGKILL", self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()


class SymbolicPool:
    """``size`` warm workers; :meth:`compare` returns True/False, or None when it ran out of time.

    ``timeout_s`` of a comparison starts when a warm worker receives it: that is the hard limit on
    sympy. Waiting for a free or warming worker (concurrent callers queue; the first call waits
    for the interpreter to import sympy and math-verify) is bounded separately by ``wait_s``.
    """

    def __init__(self, size: int = 2, wait_s: float = 60.0) -> None:
        if size < 1:
            raise ValueError(f"SymbolicPool size must be >= 1, got {size}")
        self.size = size
        self.wait_s = wait_s
        self._idle: list[_Worker] = []
        self._busy = 0
        self._closed = False
        self._cond = threading.Condition()
        self.kills = 0  # workers killed at a deadline: a figure for the benchmark and the logs
        self._request_ids = itertools.count(1)  # next() is atomic: callers on many threads get distinct ids

    def start(self) -> None:
        """Start every worker now, without waiting: each imports sympy and math-verify and runs its warm-up
        in its own process while the caller goes on (the reward manager's start, long before the first
        rollout is scored), so no comparison pays the cold start."""
        with self._cond:
            if self._closed:
                raise RuntimeError("SymbolicPool is closed")
            while len(self._idle) + self._busy < self.size:
                self._idle.append(_Worker())

    def ready_workers(self) -> int:
        """Idle workers whose executor has announced itself (polls their pipes; never waits)."""
        with self._cond:
            now = time.monotonic()
            return sum(1 for worker in self._idle if worker.wait_ready(now))

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            if self._closed:
                raise RuntimeError("SymbolicPool is closed")
            while True:
                # a worker that died while idle (OOM killer, a stray signal) is replaced before it is handed out
                for dead in [w for w in self._idle if not w.alive]:
                    self._idle.remove(dead)
                    dead.kill()
                    logger.warning("symbolic worker %d died while idle (exit code %s); replacing it", dead.proc.pid, dead.proc.returncode)
                while len(self._idle) + self._busy < self.size:
                    self._idle.append(_Worker())
                if self._idle:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            # prefer a worker that is already warm (a zero deadline only polls its pipe)
            now = time.monotonic()
            self._idle.sort(key=lambda w: w.wait_ready(now))
            worker = self._idle.pop()
            self._busy += 1
            return worker

    def _release(self, worker: _Worker, *, healthy: bool) -> None:
        try:
            if not healthy or self._closed:
                worker.kill()
        finally:
            with self._cond:
                self._busy -= 1
                if healthy and not self._closed:
                    self._idle.append(worker)
                elif not self._closed:
                    try:
                        self._idle.append(_Worker())  # start the replacement now; it warms while others serve
                    except OSError as exc:  # _acquire starts one later
                        logger.error("could not start a replacement symbolic worker: %s", exc)
                self._cond.notify()

    def compare(self, pred: str, truth: str, timeout_s: float) -> bool | None:
        """True/False, or None when the comparison ran out of time (or no worker could be had at all).

        A retry after an executor died mid-comparison gets what is left of ``timeout_s``, so the
        hard limit holds across attempts; a retry after a worker failed before it started gets all of it.
        """
        wait_deadline = time.monotonic() + self.wait_s
        budget = timeout_s
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                worker = self._acquire(wait_deadline)
            except OSError as exc:
                logger.error("could not start a symbolic worker: %s", exc)
                return None
            if worker is None:
                logger.warning("no symbolic worker free within %.1fs", self.wait_s)
                return None
            healthy = False
            started = [0.0]
            try:
                verdict = self._ask(worker, pred, truth, budget, wait_deadline, started)
                healthy = True
                return verdict
            except _WorkerFailedError as trouble:
                healthy = trouble.usable
                if started[0]:
                    budget -= time.monotonic() - started[0]
                logger.warning("symbolic worker %d failed (%s); %s", worker.proc.pid, trouble, "retrying" if attempt < MAX_ATTEMPTS and budget > 0 else "giving up")
                if budget <= 0:
                    return None
            except _TimedOutError:
                healthy = worker.kill_executor()
                self.kills += 1
                logger.info("symbolic comparison passed its %.3fs deadline; executor of worker %d killed", timeout_s, worker.proc.pid)
                return None
            except _StillWarmingError:
                healthy = True  # still importing: keep it for a later call
                logger.warning("symbolic worker not ready within %.1fs", self.wait_s)
                return None
            finally:
                self._release(worker, healthy=healthy)
        return None

    def _ask(self, worker: _Worker, pred: str, truth: str, timeout_s: float, wait_deadline: float, started: list[float]) -> bool | None:
        """One comparison on one worker (None: its own timer ran out); raises _WorkerFailedError when the worker, not the comparison, failed."""
        if not worker.wait_ready(wait_deadline):
            if worker.alive:
                raise _StillWarmingError
            raise _WorkerFailedError(f"exited with code {worker.proc.returncode} before it was ready (see its stderr)")
        started[0] = time.monotonic()
        deadline = started[0] + timeout_s
        request_id = next(self._request_ids)
        # the worker's own interval timer fires first, so a slow pure-Python case ends without a kill;
        # the deadline (CLOCK_MONOTONIC, one clock for every process) lets an executor forked after a
        # kill skip this request if the killed one never read it
        if not worker.send({"id": request_id, "pred": pred, "truth": truth, "timeout_s": timeout_s * 0.8, "deadline": deadline}):
            started[0] = 0.0
            raise _WorkerFailedError("its input pipe is broken")
        while True:
            line = worker.read_line(deadline)
            if line is None:
                if not worker.alive:
                    raise _WorkerFailedError(f"exited with code {worker.proc.returncode} during a comparison")
                raise _TimedOutError
            reply = _decode(line)
            if reply.get("ready") is True or reply.get("id") == request_id:
                break
            # the answer to an earlier request (written just before its executor was killed, or
            # skipped by the next one as past its deadline): not this comparison's
            logger.debug("symbolic worker %d: skipping a reply to request %s", worker.proc.pid, reply.get("id"))
        if reply.get("ready") is True:
            # the executor died (a crash, its CPU or memory limit, a stray kill) and the zygote announced the next one
            worker.ready = True
            worker.executor_pid = reply.get("pid") if isinstance(reply.get("pid"), int) else None
            raise _WorkerFailedError("its executor died during a comparison", usable=True)
        if "eq" not in reply:
            raise _WorkerFailedError(f"it answered {line[:80]!r}")
        if reply.get("error") == "timeout":
            # the executor's own timer ended a slow pure-Python step: out of time all the same, no kill needed
            return None
        if reply.get("error"):
            logger.debug("symbolic comparison failed: %s", reply["error"])
        return bool(reply["eq"])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_default_pool: SymbolicPool | None = None
_default_pool_pid = 0
_default_lock = threading.Lock()


def default_pool() -> SymbolicPool:
    """The process-wide pool, created on first use (and again in a forked child).

    Size from RETOOL_SYMBOLIC_WORKERS, default min(4, CPUs): few answers reach the symbolic stage,
    and each worker holds ~100 MB. A child forked after the pool started (a process-pool reward
    manager) gets its own pool: talking to the parent's workers through inherited pipes would
    interleave both processes' requests.
    """
    global _default_pool, _default_pool_pid
    with _default_lock:
        if _default_pool is None or _default_pool_pid != os.getpid():
            size = int(os.environ.get("RETOOL_SYMBOLIC_WORKERS", str(min(4, os.cpu_count() or 1))))
            _default_pool = SymbolicPool(size=size)
            _default_pool_pid = os.getpid()
            atexit.register(_close_if_owner, _default_pool, _default_pool_pid)
        return _default_pool


def warm_default_pool() -> None:
    """Start the process-wide pool's workers now (see :meth:`SymbolicPool.start`); a failure is logged, never raised.

    Called when verl loads the reward (:mod:`retool.recipe.verl_plugins.reward`): the first symbolic
    comparison in a fresh process otherwise waits seconds for imports (6.3 s measured, issue 29).
    """
    try:
        default_pool().start()
    except Exception:  # the reward still works cold: the first comparison starts the workers itself
        logger.warning("could not start the symbolic workers ahead of the first comparison", exc_info=True)


def _close_if_owner(pool: SymbolicPool, pid: int) -> None:
    if os.getpid() == pid:
        pool.close()
