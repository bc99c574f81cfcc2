"""Run a RetoolRun's stages on this machine as the operator runs them on a cluster: the stage pods' own command.

Each stage attempt is what the operator's Job or RayJob runs in its pod: ``python3 -m retool.stage
STAGE`` with the stage context in the environment (``retool.runtime.context.StageContext``: run,
attempt, sandbox URL, MLflow parent run), the run's spec as its file, and the run's claim at
``storage.pvc.mountPath``. The stages render their verl commands themselves, so what runs is exactly
what ``retool render`` shows and a cluster would run.

As local processes, not through a local Ray head and KubeRay's submitter: a one-node RayJob runs
this same entrypoint on its head, whose Ray the driver joins; here the rl and eval drivers start
Ray themselves (``ray.init`` without ``RAY_ADDRESS``), declaring the node's training slots through
``RAY_OVERRIDE_RESOURCES`` where KubeRay declares them in the group's ``resources``. The
submitter's own script against a real Ray head is tested on its own (tests/ray); a head with its
dashboard per stage would cost ~20 s and ~1 GB more per stage on a 2-core machine.

An attempt is a pod: every process it starts carries its mark in the environment
(:data:`POD_MARK`, inherited by the torchrun ranks and Ray's processes alike, though both leave the
attempt's session: torchrun starts its ranks with ``start_new_session``). :func:`run_attempt` ends
it as the kubelet ends a deleted pod, SIGTERM to every marked process, then SIGKILL to what is left
after a grace period, and returns only when none is left, so the next attempt never starts beside
the last one's ranks (two attempts never write one checkpoint directory). The same mark gives the
attempt's memory: all its processes at once, as a pod's cgroup would count them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import retool
from retool.embedded.process import proc_stats
from retool.runtime.context import StageContext

STEP_LINE = re.compile(r"(?<![\w/])step:(\d+) - ")
"""verl's console logger: ``step:N - key:value - ...`` (SFT and PPO trainers), also right after a tqdm bar
on the same line (``...1.07s/it]step:4 - ...``); not ``global_step:`` or ``timing_s/step:``."""
GRACE_SECONDS = 30.0
"""The pod's termination grace period (SIGTERM, then SIGKILL)."""


@dataclass(frozen=True)
class Machine:
    """What a stage pod's node would give: its Python environment and the training slots Ray declares."""

    python: Path
    """The interpreter of the trainer image (``python3`` in the rendered commands)."""
    devices: int = 1
    cpus: int = 16
    """Ray's logical CPUs: each verl actor asks for one to be scheduled; a pod declares its CPU limit."""
    threads: int | None = None
    """torch's threads per process (``OMP_NUM_THREADS``); None: torch's default, one per core. Ray gives its
    workers one already, torchrun a single rank none. Where other work shares the cores (the rehearsal beside
    the rest of ``make test``), 1: a rank's second thread then waits on the first at every op, and SFT ran
    ~7x slower than on the quiet machine (measured; docs/rehearsal.md)."""

    def env(self) -> dict[str, str]:
        """``python3``/``torchrun`` from the trainer environment, this checkout's ``retool`` first, and the node's Ray resources."""
        path = f"{self.python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        source = str(Path(retool.__file__).resolve().parents[1])
        return {
            "PATH": path,
            "PYTHONPATH": source,
            "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": self.cpus, "GPU": self.devices}),
            # Ray's memory monitor kills workers when the *host* passes 95 % of its memory; in a pod it reads
            # the pod's cgroup, here the whole machine, which other work shares: during a `make test` with the
            # rest of the suite beside it, it killed the rehearsal's RL workers (~3 GB of the machine's ~22).
            # The kernel's OOM killer still bounds memory.
            "RAY_memory_monitor_refresh_ms": "0",
            **({"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)} if self.threads else {}),
        }


@dataclass
class Attempt:
    stage: str
    attempt: int
    status: int
    seconds: float
    log: Path
    steps: list[int] = field(default_factory=list)
    stopped: bool = False
    """Ended by :func:`run_attempt`'s ``stop_when`` (a node lost mid-stage), not by itself."""
    peak_rss_mb: float = 0.0
    """The most resident memory the attempt's processes held at once (sampled every 0.5 s): what its pod would need."""


POD_MARK = "RETOOL_REHEARSAL_POD"
"""The environment variable that marks every process of one attempt (its value: the attempt's own id)."""


def _live() -> dict[int, str]:
    """Every process that has not ended (zombies run nothing): pid -> its start time (``/proc/PID/stat`` field
    22). With the pid, the start time names one process, never a later one that reuses the pid."""
    return {pid: fields[19] for pid, fields in proc_stats() if fields[0] not in ("Z", "X")}


def pod_processes(mark: str, live: dict[int, str] | None = None) -> list[int]:
    """The live processes (``live``: one scan of them, else a new one) whose environment carries ``POD_MARK=mark``."""
    needle = f"{POD_MARK}={mark}".encode()
    found = []
    for pid in _live() if live is None else live:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(pid)
        except OSError:  # ended while we looked
            continue
    return found


def pod_rss_mb(mark: str) -> float:
    """Resident memory of every process of the attempt, in MiB."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pod_processes(mark):
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            total += int(statm.read().split()[1]) * page
    return total / 2**20


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_pod(process: subprocess.Popen, mark: str, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every process of the attempt, SIGKILL what is left after ``grace``, and wait until none is left.

    A process that is exiting has already given up its memory, environment included, so the mark no
    longer finds it while the kernel still tears it down; every process the mark ever found is therefore
    waited for by its pid and start time until it is gone or a zombie.
    """
    seen: dict[int, str] = {}

    def left() -> list[int]:
        live = _live()
        for pid in pod_processes(mark, live):
            seen.setdefault(pid, live[pid])
        return [pid for pid, started in seen.items() if live.get(pid) == started]

    _signal_all([process.pid, *left()], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(pod_processes(mark), signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    if left():
        raise RuntimeError(f"processes {left()} of the attempt outlived SIGKILL for 60 s")


def _follow(log: Path, done: threading.Event, on_line: Callable[[str], None]) -> None:
    """Call ``on_line`` for each line the attempt writes to its log, until ``done``."""
    while not log.exists() and not done.is_set():
        time.sleep(0.1)
    with contextlib.suppress(FileNotFoundError), log.open("r", encoding="utf-8", errors="replace") as stream:
        buffer = ""
        while True:
            chunk = stream.read()
            if chunk:
                buffer += chunk
                *lines, buffer = re.split(r"[\r\n]", buffer)
                for line in lines:
                    on_line(line)
            elif done.is_set():
                break
            else:
                time.sleep(0.2)


def run_attempt(
    stage: str,
    ctx: StageContext,
    spec_file: Path,
    machine: Machine,
    log_dir: Path,
    *,
    on_step: Callable[[int], None] | None = None,
    stop_when: Callable[[], bool] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Attempt:
    """One attempt of ``stage``: the stage pod's command, its output in ``log_dir/<stage>-<attempt>.log``.

    ``stop_when``: polled while it runs; when true, the attempt is ended as a deleted pod is.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{stage}-{ctx.attempt}.log"
    mark = uuid.uuid4().hex
    env = {**os.environ, **machine.env(), **ctx.to_env(), **dict(extra_env or {}), POD_MARK: mark}
    for stale in ("RAY_ADDRESS", "MLFLOW_RUN_ID", "VIRTUAL_ENV"):
        env.pop(stale, None)
    argv = [str(machine.python), "-m", "retool.stage", stage, "--spec", str(spec_file)]
    steps: list[int] = []

    def on_line(line: str) -> None:
        match = STEP_LINE.search(line)
        if match:
            step = int(match.group(1))
            if not steps or steps[-1] != step:
                steps.append(step)
                if on_step is not None:
                    on_step(step)

    started = time.monotonic()
    done = threading.Event()
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=spec_file.parent, start_new_session=True)
    follower = threading.Thread(target=_follow, args=(log, done, on_line), daemon=True)
    follower.start()
    stopped = False
    peak = 0.0
    try:
        while process.poll() is None:
            peak = max(peak, pod_rss_mb(mark))
            if stop_when is not None and stop_when():
                stopped = True
                break
            time.sleep(0.5)
    finally:
        end_pod(process, mark)
        done.set()
        follower.join(timeout=10)
    return Attempt(stage, ctx.attempt, process.returncode, round(time.monotonic() - started, 1), log, steps, stopped, round(peak))


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    started = time.monotonic()
    yield lambda: round(time.monotonic() - started, 1)
