"""A local Ray head of the pinned version (``ray start --head --block``), as KubeRay starts one in the head pod."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port


@dataclass(frozen=True)
class RayHead:
    url: str
    """The dashboard (job server): what KubeRay's submitter talks to."""
    gcs: str
    """The GCS address, for reading what the job server stored."""
    logs: Path | None = None
    """The head's log folder (the dashboard's and its modules' logs), for a failing test's message."""
    process: HeadProcess | None = field(default=None, compare=False, repr=False)
    """The ``ray start`` process behind it, when this test started it (``ray_head``)."""

    def ensure_running(self) -> str:
        """Start the head again if it exited, as the kubelet restarts a head pod's container; why it had exited
        (``ray start``'s own report), or ``""`` when it was running. ``ray start --block`` ends the whole head
        when any of its processes exits (``ray/scripts/scripts.py`` 2.60), so a head that lost its dashboard or
        raylet on a starved machine refuses every connection until then."""
        if self.process is None or self.process.alive():
            return ""
        report = f"the Ray head had exited ({self.process.returncode()}); started again.\n{self.report()}"
        self.start()
        return report

    def start(self, attempts: int = 3) -> None:
        """Start the head and wait until it is up (``wait_until_up``), again when it exits while starting.
        ``ray start`` gives its raylet a fixed 30 s to register with the GCS (``raylet_start_wait_time_s``,
        ``ray/_private/node.py`` 2.60), and the raylet registers only once its agents, Python processes, are
        up: on a starved 2-core machine that can take longer, and the whole head then exits."""
        assert self.process is not None, "a head this test did not start cannot be started"
        failures = []
        for _ in range(attempts):
            self.process.start()
            try:
                self.wait_until_up()
                return
            except HeadExitedError as exited:
                failures.append(str(exited))
        raise HeadExitedError(f"the Ray head exited while starting, {attempts} times:\n" + "\n".join(failures))

    def wait_until_up(self, timeout_s: float = 180) -> None:
        """Poll until ``ray start`` says the runtime started and the job API answers. The job API alone is not
        enough: the dashboard answers seconds before the raylet has registered (7.0 s against 9.5 s on a quiet
        machine here), and a head whose raylet never registers exits."""
        self._poll(lambda: (self.process is None or self.process.started()) and self.jobs_api_answers(), "up", timeout_s, interval_s=0.5)

    def jobs_api_answers(self) -> bool:
        """Whether the job API answers (200 on ``/api/jobs/``). Ray 2.60 serves ``/api/version`` itself but the job
        API from its JobHead module, a subprocess the dashboard proxies to and restarts when its health check
        fails (``ray/dashboard/subprocesses/handle.py``): on a busy machine the job API answers later."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/jobs/", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    def wait_for_jobs_api(self, timeout_s: float = 180) -> None:
        """Poll until the job API answers again (its module restarting); fail with the report, at once if the
        head exited."""
        self._poll(self.jobs_api_answers, "answering on its job API", timeout_s, interval_s=1)

    def _poll(self, ready: Callable[[], bool], what: str, timeout_s: float, interval_s: float) -> None:
        """Poll ``ready`` until it holds: HeadExitedError at once if the head exits, TimeoutError after
        ``timeout_s``, each with the report."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.process is not None and not self.process.alive():
                raise HeadExitedError(f"the Ray head exited ({self.process.returncode()}) before it was {what}\n{self.report()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head was not {what} within {timeout_s:.0f} s\n{self.report()}")
            time.sleep(interval_s)

    def report(self) -> str:
        """For a failing test's message: ``ray start``'s output (which process exited, if one did) and the
        dashboard's logs."""
        output = self.process.output_tail() if self.process is not None else ""
        return (f"--- ray start's output\n{output}\n" if output else "") + self.log_tail()

    def log_tail(self, name: str = "dashboard", lines: int = 40) -> str:
        """The last ``lines`` of each log file whose name starts with ``name`` (none when the head has no log folder)."""
        if self.logs is None or not self.logs.is_dir():
            return ""
        tails = []
        for path in sorted(self.logs.glob(f"{name}*.log")):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(tails)


class HeadExitedError(RuntimeError):
    """The head's ``ray start`` process ended (the report says which of its processes went first)."""


class HeadProcess:
    """``ray start --head --block`` with fixed arguments, startable again on the same ports and temp dir; its
    output (one file, appended to on each start) is ``ray start``'s own account of its processes."""

    def __init__(self, args: list[str], env: Mapping[str, str], output: Path) -> None:
        self.args, self.env, self.output = args, dict(env), output
        self.popen: subprocess.Popen | None = None
        self._offset = 0

    def start(self) -> None:
        self.kill()  # what is left of an exited head (its group) before its ports are taken again
        self._offset = self.output.stat().st_size if self.output.is_file() else 0
        with open(self.output, "ab") as log:
            self.popen = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def _this_start(self) -> str:
        if not self.output.is_file():
            return ""
        with open(self.output, "rb") as out:
            out.seek(self._offset)
            return out.read().decode("utf-8", errors="replace")

    def started(self) -> bool:
        """Whether ``ray start`` has printed that its runtime started: its raylet registered with the GCS."""
        return "Ray runtime started." in self._this_start()

    def output_tail(self, lines: int = 60) -> str:
        """This start's output: its report of which process exited with what code first (``ray start`` follows it
        with that process's own log tail, which can be long), then its last ``lines``."""
        text = self._this_start().splitlines()
        exits = [i for i, line in enumerate(text) if "exited unexpectedly" in line or "timed out during startup" in line]
        head = [*text[exits[0] : exits[0] + 8], "[...]"] if exits and exits[0] < len(text) - lines else []
        return "\n".join(head + text[-lines:])

    def kill(self) -> None:
        # SIGKILL at once: on SIGTERM ``ray start --block`` stops its processes one by one with their
        # grace periods and took 32-60 s here (Ray 2.60); a test head has nothing to save. Its
        # processes share its group or die with their parent (Ray's fate sharing), and a job driver's
        # own session is killed by Ray's watcher once the supervisor is gone.
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


TEST_HEAD_HEALTH_CHECKS = {"RAY_health_check_failure_threshold": "40"}
"""The GCS takes a node for dead after this many missed health checks, 3 s apart (Ray's default: 5, so 15 s),
and then its raylet exits and ``ray start --block`` ends the head. A test head shares a 2-core machine with
the rest of the suite and a training run: 2 minutes, so starvation is not taken for death."""


@contextlib.contextmanager
def ray_head(
    tmp_path: Path, *, resources: Mapping[str, int] | None = None, num_gpus: int = 0, env: Mapping[str, str] | None = None, dashboard_port: int | None = None
) -> Iterator[RayHead]:
    """A head on 127.0.0.1 with its own ports and temp dir; yields its addresses once it is up (``RayHead.start``).

    ``env`` is the head container's environment (the driver inherits it); default: this process's.
    GPUs are declared, not used: Ray hands out their IDs without touching a device.
    ``dashboard_port``: a fixed dashboard port (what a head Service names), else a free one.
    """
    dashboard, gcs = dashboard_port or free_port(), free_port()
    temp = Path("/tmp") / f"rt-{os.getpid()}-{dashboard}"  # short: Ray's socket paths must fit 107 bytes
    head_env = {**(os.environ if env is None else env), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **TEST_HEAD_HEALTH_CHECKS}
    args = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2", f"--num-gpus={num_gpus}",
        f"--resources={json.dumps(dict(resources or {}))}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}", f"--ray-client-server-port={free_port()}", f"--temp-dir={temp}",
    ]  # fmt: skip
    process = HeadProcess(args, head_env, tmp_path / "ray.log")
    try:
        ray = RayHead(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", temp / "session_latest" / "logs", process)
        ray.start()
        yield ray
    finally:
        process.kill()
        shutil.rmtree(temp, ignore_errors=True)
