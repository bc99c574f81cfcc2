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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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

    def jobs_api_answers(self) -> bool:
        """Whether the job API answers (200 on ``/api/jobs/``). Ray 2.60 serves ``/api/version`` itself but the job
        API from its JobHead module, a subprocess the dashboard proxies to and restarts when its health check
        fails (``ray/dashboard/subprocesses/handle.py``): on a busy machine the job API answers later."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/jobs/", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    def wait_for_jobs_api(self, timeout_s: float = 180, process: subprocess.Popen | None = None) -> None:
        """Poll until the job API answers; fail naming the dashboard's log tail (or the head's exit)."""
        deadline = time.monotonic() + timeout_s
        while not self.jobs_api_answers():
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the Ray head exited ({process.returncode}) before its job API answered\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head's job API did not answer within {timeout_s:.0f} s\n{self.log_tail()}")
            time.sleep(1)

    def log_tail(self, name: str = "dashboard", lines: int = 40) -> str:
        """The last ``lines`` of each log file whose name starts with ``name`` (none when the head has no log folder)."""
        if self.logs is None or not self.logs.is_dir():
            return ""
        tails = []
        for path in sorted(self.logs.glob(f"{name}*.log")):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(tails)


@contextlib.contextmanager
def ray_head(
    tmp_path: Path, *, resources: Mapping[str, int] | None = None, num_gpus: int = 0, env: Mapping[str, str] | None = None, dashboard_port: int | None = None
) -> Iterator[RayHead]:
    """A head on 127.0.0.1 with its own ports and temp dir; yields its addresses once its job API answers.

    ``env`` is the head container's environment (the driver inherits it); default: this process's.
    GPUs are declared, not used: Ray hands out their IDs without touching a device.
    ``dashboard_port``: a fixed dashboard port (what a head Service names), else a free one.
    """
    dashboard, gcs = dashboard_port or free_port(), free_port()
    temp = Path("/tmp") / f"rt-{os.getpid()}-{dashboard}"  # short: Ray's socket paths must fit 107 bytes
    head_env = {**(os.environ if env is None else env), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    args = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2", f"--num-gpus={num_gpus}",
        f"--resources={json.dumps(dict(resources or {}))}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}", f"--ray-client-server-port={free_port()}", f"--temp-dir={temp}",
    ]  # fmt: skip
    with open(tmp_path / "ray.log", "wb") as log:
        head = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=head_env, start_new_session=True)
    try:
        ray = RayHead(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", temp / "session_latest" / "logs")
        ray.wait_for_jobs_api(process=head)  # what KubeRay's submitter waits for too (its health loop)
        yield ray
    finally:
        # SIGKILL at once: on SIGTERM ``ray start --block`` stops its processes one by one with their
        # grace periods and took 32-60 s here (Ray 2.60); a test head has nothing to save. Its
        # processes share its group or die with their parent (Ray's fate sharing), and a job driver's
        # own session is killed by Ray's watcher once the supervisor is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)
