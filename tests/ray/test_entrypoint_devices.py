"""What a RayJob driver sees of the NPUs, on a local Ray cluster of the pinned Ray version.

The one-node SFT runs torchrun inside the RayJob's driver (the entrypoint). Ray before 2.53
cleared ``ASCEND_RT_VISIBLE_DEVICES`` for a driver that reserved no resources (only CUDA was
exempt), so every rank saw no NPU. The entrypoint reserves the node's NPUs through the RayJob's
``entrypointResources`` (``'{"NPU": <devicesPerNode>}'``): Ray then sets the variable to exactly
the reserved devices, whatever its version. This test submits drivers through Ray's job server
(what KubeRay's submitter does) to a head that declares ``NPU`` as the operator's rayStartParams
do, and reads the variable from inside each driver.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

NPUS = 2
PROBE = "import os; print('VISIBLE=' + repr(os.environ.get('ASCEND_RT_VISIBLE_DEVICES')))"
PINNED_RAY = "2.60.0"


@contextlib.contextmanager
def ray_head(tmp_path: Path) -> Iterator[str]:
    """``ray start --head --block`` on 127.0.0.1 with its own ports and temp dir; yields the job server URL."""
    dashboard = free_port()
    temp = Path("/tmp") / f"rt-{os.getpid()}-{dashboard}"  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    args = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={free_port()}", "--num-cpus=2", f'--resources={{"NPU": {NPUS}}}',
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}", f"--ray-client-server-port={free_port()}", f"--temp-dir={temp}",
    ]  # fmt: skip
    with open(tmp_path / "ray.log", "wb") as log:
        head = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def driver_sees(url: str, **submit: object) -> str:
    from ray.job_submission import JobStatus, JobSubmissionClient

    deadline = time.monotonic() + 180
    client = None
    job_id = None
    while job_id is None:
        try:
            client = client or JobSubmissionClient(url)
            job_id = client.submit_job(entrypoint=f'python -c "{PROBE}"', **submit)
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    while (status := client.get_job_status(job_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(0.5)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs
    return next(line.removeprefix("VISIBLE=") for line in logs.splitlines() if line.startswith("VISIBLE="))


def test_the_pinned_ray_is_the_one_tested() -> None:
    assert importlib.metadata.version("ray") == PINNED_RAY


@pytest.mark.slow
def test_a_driver_with_entrypoint_npus_sees_exactly_those_npus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with ray_head(tmp_path) as url:
        # what the operator must render for sft on Ascend: entrypointResources '{"NPU": devicesPerNode}'
        assert driver_sees(url, entrypoint_resources={"NPU": NPUS}) == repr(",".join(str(i) for i in range(NPUS)))
        # without it, Ray >= 2.53 leaves the pod's variable alone (unset here: every device visible);
        # Ray < 2.53 set it to '' (no device), the blocker this pins against
        assert driver_sees(url) == "None"
