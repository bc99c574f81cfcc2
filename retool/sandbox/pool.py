"""The execution engine as the server sees it: a fixed pool of warm workers and a bounded queue.

No web framework here, so it can be tested and benchmarked alone. ``run`` either hands the job to an
idle worker, waits in a bounded FIFO for one, or refuses at once (``PoolOverloaded``: the server
answers 429) — a caller never hangs on a full replica. Dead or stuck workers are replaced from the
template in the background, with exponential backoff when a slot keeps failing (a worker that cannot
isolate itself dies at once: it must not become a tight restart loop); a dead template is restarted.

At start the template reports what isolation this kernel and these privileges allow; the pool turns
that into the replica's plan (``layers.decide``), sends it to every worker, and publishes it. With
``require_isolation`` a replica whose plan is not strong stays not-ready and runs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from retool.sandbox import accounting, cgroups, layers, protocol, scratch
from retool.sandbox.metrics import SandboxMetrics
from retool.sandbox.settings import SandboxSettings

logger = logging.getLogger(__name__)

RESULT_GRACE_S = 10.0
"""How long past its run_timeout a worker may take to answer before it is declared stuck."""

BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}


class PoolOverloaded(Exception):  # noqa: N818 (reads as a state, like asyncio.QueueFull)
    """Every worker is busy and the queue is full: refuse now, the client retries later."""


class PoolUnavailable(Exception):  # noqa: N818
    """The pool is closed, cannot start workers, or refuses to run code without strong isolation."""


class JobTooLarge(ValueError):  # noqa: N818 (reads as a state, like PoolOverloaded)
    """The job cannot be handed to a worker whole (answered 413, never sent)."""


COUNT_MAX_AGE_S = 0.01
"""How old the replica's process count handed to an execution may be (``Plan.replica_counts_processes``).
At 16 concurrent executions, listing /proc for every dispatch cost the server ~0.1 ms per request;
within 10 ms the count moves by what the replica's running executions start or end in that time,
as it does anyway while the execution runs (the limit is the replica's, see docs/sandbox.md)."""

RESTART_BASE_S = 0.05
RESTART_CAP_S = 30.0
HEALTHY_AFTER_S = 60.0
"""A worker that lived this long before dying starts its slot's backoff afresh."""


def restart_delay(failures: int) -> float:
    """Wait before replacing a slot's worker after ``failures`` consecutive failures (0: none yet)."""
    if failures <= 1:
        return 0.0 if failures <= 0 else RESTART_BASE_S
    return min(RESTART_CAP_S, RESTART_BASE_S * 2 ** (failures - 1))


@dataclass(frozen=True)
class Job:
    code: str
    run_timeout: float
    memory_limit_mb: int
    stdin: str | None = None
    files: dict[str, str | None] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)

    def message(self, processes_in_use: int | None = None) -> dict[str, Any]:
        """What the worker gets; ``processes_in_use``: the replica's processes of the uid executions
        share (``Plan.replica_counts_processes``), None where the worker decides it."""
        return {
            "type": "job",
            "code": self.code,
            "run_timeout": self.run_timeout,
            "memory_limit_mb": self.memory_limit_mb,
            "stdin": self.stdin,
            "files": self.files,
            "fetch_files": self.fetch_files,
            "processes_in_use": processes_in_use,
        }

    def encoded_bound(self) -> int:
        """At least the size of ``protocol.encode(self.message(n))``, without encoding it: JSON
        escapes a character to at most 12 bytes (``\\ud83d\\ude00``: two \\u escapes for one
        code point outside the BMP), and the rest of the message is under 1 KiB."""
        chars = len(self.code) + len(self.stdin or "")
        chars += sum(len(path) + len(content or "") for path, content in self.files.items()) + sum(len(path) for path in self.fetch_files)
        return 12 * chars + 16 * (len(self.files) + len(self.fetch_files)) + 1024


@dataclass
class WorkerHandle:
    slot: int
    keeper_pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pidfd: int = -1
    busy: bool = False
    dead: bool = False
    started: float = field(default_factory=time.monotonic)


def template_env(settings: SandboxSettings) -> dict[str, str]:
    """The template's whole environment: what pass_env allows, plus single-threaded BLAS. No secrets."""
    env = {name: os.environ[name] for name in settings.pass_env if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The template must import this package wherever the server found it (editable installs, tests).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(BLAS_ENV, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", HOME=settings.tmp_root)
    return env


def worker_config(settings: SandboxSettings, slot: int, plan: layers.Plan, tmp_root: str | None = None) -> dict[str, Any]:
    return {
        "slot": slot,
        "output_limit_bytes": settings.output_limit_bytes,
        "max_processes": settings.max_processes,
        "max_file_size_mb": settings.max_file_size_mb,
        "max_open_files": settings.max_open_files,
        "max_fetch_bytes": settings.max_fetch_bytes,
        "tmp_size_mb": settings.tmp_size_mb,
        "max_scratch_files": settings.max_scratch_files,
        "tmp_root": tmp_root or settings.tmp_root,
        "uid_base": settings.uid_base,
        "cgroup_failure": settings.cgroup_failure,
        "plan": plan.as_dict(),
    }


class ExecutionPool:
    def __init__(self, settings: SandboxSettings, metrics: SandboxMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or SandboxMetrics()
        self.queue_size = settings.effective_queue_size
        self._idle: asyncio.Queue[WorkerHandle] = asyncio.Queue()
        self._workers: dict[int, WorkerHandle] = {}
        self._busy = 0
        self._waiting = 0
        self._closed = False
        self._control: socket.socket | None = None
        self._template: subprocess.Popen | None = None
        self._template_info: dict[str, Any] = {}
        self._control_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self.plan: layers.Plan | None = None
        self._uid_processes: accounting.UidProcesses | None = None
        """The replica's processes of the uid its executions share (``Plan.replica_counts_processes``)."""
        self.isolation: dict[str, Any] = {}
        self.restarts = 0
        self.cgroup_failures = 0  # executions whose cgroup could not be made (refused or run without)
        self.draining = False
        self._failures: dict[int, int] = {}  # consecutive failures of each slot
        self._running_since: dict[int, float] = {}  # wall-clock start of each running execution, by slot
        self._started_at = time.time()
        self._sweep_pending = False
        self._sweeping = False
        self._tmp_root: str | None = None  # this replica's directory for per-execution dirs (no mount namespace)
        self._slot_dirs: dict[int, str] = {}  # each worker's own directory in it, swept when the worker goes
        self._cgroups: cgroups.Subtree | None = None  # where executions' cgroups are made, when the replica may
        self._no_worker_since: float | None = None  # monotonic time the last live worker went, while none is back

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the template and every worker; returns when all are warm."""
        self._tmp_root = tempfile.mkdtemp(prefix="retool-sandbox-", dir=self.settings.tmp_root)
        await self._start_template()
        probes = layers.Probes.from_dict(self._template_info["probes"])
        settings = self.settings
        self.plan = layers.decide(
            probes,
            namespaces=settings.namespaces,
            landlock_max_abi=settings.landlock_max_abi,
            seccomp=settings.seccomp,
            runtime_class=settings.runtime_class,
            native_setup=settings.native_setup,
        )
        self.plan = self._with_cgroups(self.plan)
        self._uid_processes = accounting.UidProcesses(os.getuid()) if self.plan.replica_counts_processes else None
        self.isolation = layers.describe(self.plan)
        self.metrics.publish_isolation(self.isolation)
        # Execution uids must reach their own directory inside, never list it; with a shared uid the
        # directory is not even listable by its owner (and without Landlock, chmod is refused).
        os.chmod(self._tmp_root, 0o711 if self.plan.uid_per_execution else 0o311)
        for problem in self.plan.problems:
            logger.warning("isolation: %s", problem)
        if self.refusing:
            logger.error("isolation is not strong and RETOOL_SANDBOX_REQUIRE_ISOLATION is set: this replica will not run code")
        results = await asyncio.gather(*(self._spawn(slot) for slot in range(self.settings.workers)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            logger.error("%d of %d workers failed to start: %s", len(failures), len(results), failures[0])
            for slot, result in enumerate(results):
                if isinstance(result, BaseException):
                    self._background(self._replace(slot))
        if not self._workers:
            raise PoolUnavailable(f"no worker could start: {failures[0] if failures else 'unknown'}")

    def _with_cgroups(self, plan: layers.Plan) -> layers.Plan:
        """The plan with per-execution cgroups where this replica can make them (``retool.sandbox.cgroups``).

        Not inside a user namespace: its root does not own the cgroupfs unless a runtime delegated it,
        and the workers (which make each execution's cgroups) run there."""
        if self.settings.cgroups == "off":
            return replace(plan, cgroup_note="turned off by configuration (RETOOL_SANDBOX_CGROUPS=off)")
        if plan.namespaces == "user-namespaces":
            return replace(plan, cgroup_note="the workers run in a user namespace, which does not own the cgroup filesystem")
        try:
            layout = cgroups.locate(Path("/proc/self/cgroup").read_text())
            if layout is None:
                return replace(plan, cgroup_note="no memory and pids cgroup controllers for this process")
            subtree = cgroups.Subtree.prepare(layout, os.getpid())
            try:
                subtree.probe()
            except cgroups.CgroupError:
                subtree.remove()
                raise
        except (cgroups.CgroupError, OSError) as err:
            logger.info("no cgroup per execution: %s", err)
            return replace(plan, cgroup_note=f"cannot write the cgroup subtree: {err}")
        self._cgroups = subtree
        logger.info("a memory and pids cgroup per execution (cgroup v%d) under %s", subtree.version, ", ".join(map(str, subtree.dirs)))
        return replace(plan, cgroup_version=subtree.version, cgroup_dirs=tuple(map(str, subtree.dirs)))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for worker in list(self._workers.values()):
            self._kill(worker)
        self._workers.clear()
        if self._control is not None:
            self._control.close()
        if self._template is not None and self._template.poll() is None:
            self._template.terminate()  # it kills every process left under it, detached ones included
            try:
                await asyncio.wait_for(asyncio.to_thread(self._template.wait), timeout=5)
            except asyncio.TimeoutError:
                self._template.kill()
                await asyncio.to_thread(self._template.wait)
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove)
        if self._tmp_root is not None:
            with contextlib.suppress(OSError):
                os.chmod(self._tmp_root, 0o700)
            await asyncio.to_thread(scratch.remove_path, self._tmp_root)

    async def _start_template(self) -> None:
        if self._template is not None and self._template.poll() is None:
            self._template.kill()
            await asyncio.to_thread(self._template.wait)
        if self._control is not None:
            self._control.close()
        ours, theirs = socket.socketpair()
        command = [
            sys.executable, "-m", "retool.sandbox.template", "--control-fd", str(theirs.fileno()),
            "--preload", ",".join(self.settings.preload), "--namespaces", self.settings.namespaces,
        ]  # fmt: skip
        self._template = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=template_env(self.settings), stdin=subprocess.DEVNULL)
        theirs.close()
        ours.settimeout(self.settings.worker_start_timeout_s)
        try:
            ready, _ = await asyncio.to_thread(protocol.recv, ours)
        except (OSError, protocol.ChannelClosedError) as exc:
            ours.close()
            raise PoolUnavailable(f"the template interpreter did not start: {exc}") from exc
        ours.settimeout(None)
        self._control = ours
        self._template_info = {
            "pid": self._template.pid,
            "load_seconds": round(ready["load_seconds"], 3),
            "huge_pages_mb": ready.get("huge_pages_mb", 0),
            "problems": ready["problems"],
            "probes": ready["probes"],
        }
        for problem in ready["problems"]:
            logger.warning("template: %s", problem)
        logger.info("template ready in %.2fs (pid %d)", ready["load_seconds"], self._template.pid)

    def _fresh_slot_dir(self, slot: int) -> str | None:
        """The directory a new worker of ``slot`` makes its executions' directories in. What the
        slot's previous worker left there (it died mid-execution, or could not clean) goes first."""
        old = self._slot_dirs.pop(slot, None)
        if old is not None and scratch.remove_path(old):
            logger.warning("could not remove everything the previous worker %d left in %s", slot, old)
        if self._tmp_root is None or self.plan is None or self.plan.private_tmp:
            return None
        path = os.path.join(self._tmp_root, f"w{slot}-{secrets.token_hex(16)}")
        os.mkdir(path)
        os.chmod(path, 0o711 if self.plan.uid_per_execution else 0o311)
        self._slot_dirs[slot] = path
        return path

    async def _spawn(self, slot: int) -> WorkerHandle:
        async with self._control_lock:
            tmp_root = await asyncio.to_thread(self._fresh_slot_dir, slot)
            try:
                reply, fds = await asyncio.to_thread(self._request_spawn, slot, tmp_root)
            except (OSError, protocol.ChannelClosedError):
                if self._closed:
                    raise
                logger.warning("template gone; restarting it")
                await self._start_template()
                reply, fds = await asyncio.to_thread(self._request_spawn, slot, tmp_root)
        sock = socket.socket(fileno=fds[0])
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            hello = await asyncio.wait_for(protocol.read_message(reader), timeout=self.settings.worker_start_timeout_s)
        except (asyncio.TimeoutError, protocol.ChannelClosedError) as exc:
            writer.close()
            _signal(reply["pid"], signal.SIGKILL)
            raise PoolUnavailable(f"worker {slot} did not start: {exc!r}") from exc
        if hello.get("type") == "fatal":
            writer.close()
            _signal(reply["pid"], signal.SIGKILL)
            raise PoolUnavailable(f"worker {slot} could not apply the isolation plan: {hello.get('error')}")
        worker = WorkerHandle(slot, reply["pid"], reader, writer)
        if self._closed:
            self._kill(worker)
            raise PoolUnavailable("pool closed")
        # Notice a worker dying while idle (killed, OOM), so no request is ever handed to a dead one.
        try:
            worker.pidfd = os.pidfd_open(worker.keeper_pid)
        except OSError:  # already gone
            self._kill(worker)
            raise PoolUnavailable(f"worker {slot} died while starting") from None
        asyncio.get_running_loop().add_reader(worker.pidfd, self._on_exit, worker)
        self._workers[slot] = worker
        self._no_worker_since = None
        self.metrics.live_workers.set(len(self._workers))
        self._idle.put_nowait(worker)
        return worker

    def _request_spawn(self, slot: int, tmp_root: str | None) -> tuple[dict[str, Any], list[int]]:
        if self._control is None:
            raise protocol.ChannelClosedError("no template")
        assert self.plan is not None
        protocol.send(self._control, {"op": "spawn", "config": worker_config(self.settings, slot, self.plan, tmp_root or self._tmp_root)})
        reply, fds = protocol.recv(self._control, with_fds=1)
        if not fds:
            raise protocol.ChannelClosedError("template sent no worker socket")
        return reply, fds

    async def _replace(self, slot: int) -> None:
        """Start a new worker in ``slot``, backing off while the slot keeps failing."""
        while not self._closed:
            delay = restart_delay(self._failures.get(slot, 0))
            if delay:
                logger.warning("slot %d failed %d times in a row: next worker in %.2fs", slot, self._failures[slot], delay)
                await asyncio.sleep(delay)
            try:
                await self._spawn(slot)
                return
            except Exception as exc:
                self._failures[slot] = self._failures.get(slot, 0) + 1
                logger.error("could not replace worker %d: %s", slot, exc)

    def _on_exit(self, worker: WorkerHandle) -> None:
        if not worker.dead and not worker.busy:  # a busy one is retired by the request that sees it die
            self._retire(worker, "died while idle")
        elif worker.pidfd >= 0:
            asyncio.get_running_loop().remove_reader(worker.pidfd)

    def _retire(self, worker: WorkerHandle, reason: str) -> None:
        if worker.dead:
            return
        worker.dead = True
        healthy = time.monotonic() - worker.started > HEALTHY_AFTER_S
        self._failures[worker.slot] = 1 if healthy else self._failures.get(worker.slot, 0) + 1
        logger.warning("worker %d retired: %s", worker.slot, reason)
        self._kill(worker)
        if self._workers.get(worker.slot) is worker:
            del self._workers[worker.slot]
        if not self._workers and self._no_worker_since is None:
            self._no_worker_since = time.monotonic()
        self.metrics.live_workers.set(len(self._workers))
        self.metrics.worker_restarts.inc()
        self.restarts += 1
        if not self._closed:
            self._background(self._replace(worker.slot))

    def _kill(self, worker: WorkerHandle) -> None:
        worker.writer.close()
        _signal(worker.keeper_pid, signal.SIGKILL)
        if worker.pidfd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = -1

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- running jobs ------------------------------------------------------------------------
    async def run(self, job: Job) -> dict[str, Any]:
        """Run ``job`` on a worker; the worker's result message (``worker_died`` set if it died)."""
        if self._closed or self.draining:
            raise PoolUnavailable("the sandbox is shutting down")
        if self.refusing:
            raise PoolUnavailable(f"isolation is not strong ({self.isolation.get('summary')}) and this replica requires it")
        if job.encoded_bound() > protocol.MAX_MESSAGE and len(encoded := protocol.encode(job.message())) > protocol.MAX_MESSAGE:
            raise JobTooLarge(f"the job is {len(encoded)} bytes encoded, over the {protocol.MAX_MESSAGE} a worker accepts")
        if self._idle.empty() and self._waiting >= self.queue_size:
            raise PoolOverloaded(f"all {self.settings.workers} workers busy and {self._waiting} requests queued")
        self._waiting += 1
        self.metrics.queue_depth.set(self._waiting)
        try:
            worker = await self._idle.get()
            while worker.dead:  # died while queued as idle: its replacement is on the way
                worker = await self._idle.get()
            worker.busy = True
        finally:
            self._waiting -= 1
            self.metrics.queue_depth.set(self._waiting)
        # Shielded: if the caller goes away the execution still finishes and the worker comes back.
        return await asyncio.shield(self._execute(worker, job))

    async def _execute(self, worker: WorkerHandle, job: Job) -> dict[str, Any]:
        try:
            # At dispatch, not when queued: a queued job's count would be as old as its wait.
            in_use = self._uid_processes.count(COUNT_MAX_AGE_S) if self._uid_processes is not None else None
            message = protocol.encode(job.message(in_use))
        except BaseException:  # nothing was sent: the worker goes back as it came
            worker.busy = False
            self._idle.put_nowait(worker)
            raise
        self._busy += 1
        self.metrics.busy_workers.set(self._busy)
        started = time.monotonic()
        self._running_since[worker.slot] = time.time()
        try:
            worker.writer.write(message)
            await worker.writer.drain()
            result = await asyncio.wait_for(protocol.read_message(worker.reader), timeout=job.run_timeout + RESULT_GRACE_S)
        except (protocol.ChannelClosedError, ConnectionError, asyncio.TimeoutError) as exc:
            self._retire(worker, f"during an execution: {exc!r}")
            return {"type": "result", "worker_died": True, "execution_time": time.monotonic() - started}
        finally:
            self._running_since.pop(worker.slot, None)
            self._busy -= 1
            self.metrics.busy_workers.set(self._busy)
            worker.busy = False
            self._request_sweep()
        if result.get("cgroup_missing"):
            self.cgroup_failures += 1
            self.metrics.cgroup_failures.labels("refused" if result.get("sandbox_error") else "ran").inc()
        if not result.get("sandbox_error"):
            self._failures.pop(worker.slot, None)
        if worker.dead:  # exited right after answering
            return result
        self._idle.put_nowait(worker)
        return result

    # ---- shared scratch ----------------------------------------------------------------------
    def _request_sweep(self) -> None:
        """Without a private /tmp or Landlock, executions can leave files in the shared scratch dirs."""
        if self.plan is None or not self.plan.needs_sweep or self._closed:
            return
        self._sweep_pending = True
        if not self._sweeping:
            self._sweeping = True
            self._background(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        try:
            while self._sweep_pending and not self._closed:
                self._sweep_pending = False
                assert self.plan is not None
                if self.plan.uid_per_execution:  # those uids are only ever executions'
                    uids = {self.settings.uid_base + slot for slot in range(self.settings.workers)}
                    uids -= {self.settings.uid_base + slot for slot in self._running_since}
                    before = float("inf")
                else:  # shared uid: only what appeared since this replica started, before any running execution did
                    uids = {os.getuid()}
                    before = min(self._running_since.values(), default=time.time())
                    if before <= self._started_at:
                        continue
                removed = await asyncio.to_thread(accounting.sweep, accounting.SCRATCH_DIRS, uids, before, [self._tmp_root or ""], self._started_at)
                if removed:
                    logger.info("swept %d leftovers from the shared scratch directories", len(removed), extra={"paths": removed[:10]})
        finally:
            self._sweeping = False

    # ---- state -------------------------------------------------------------------------------
    @property
    def refusing(self) -> bool:
        """Strict mode without strong isolation: run nothing, never become ready."""
        return self.settings.require_isolation and not self.isolation.get("strong", False)

    @property
    def ready(self) -> bool:
        return not self._closed and not self.draining and not self.refusing and bool(self._workers)

    def workerless_for(self) -> float:
        """Seconds since the replica last had a live worker (0 while it has one, or never had one yet)."""
        return 0.0 if self._no_worker_since is None or self._closed else time.monotonic() - self._no_worker_since

    def snapshot(self) -> dict[str, Any]:
        return {
            "draining": self.draining,
            "workers": self.settings.workers,
            "live_workers": len(self._workers),
            "busy_workers": self._busy,
            "queue_depth": self._waiting,
            "queue_size": self.queue_size,
            "worker_restarts": self.restarts,
            "cgroup_failures": self.cgroup_failures,
            "template": self._template_info,
            "isolation": self._isolation_now(),
        }

    def _isolation_now(self) -> dict[str, Any]:
        """The isolation report, with the cgroup layer's failures among its problems once there are
        any (the operator copies the problems into the run's status.sandbox.isolation)."""
        if not self.cgroup_failures or not self.isolation:
            return self.isolation
        what = "refused" if self.settings.cgroup_failure == "refuse" else "run with the memory watch only"
        problem = f"the cgroup layer is degraded: {self.cgroup_failures} executions' cgroups could not be made ({what})"
        return {**self.isolation, "problems": [*self.isolation.get("problems", []), problem]}


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
