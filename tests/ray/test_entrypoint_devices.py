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

import importlib.metadata
import time
from pathlib import Path

import pytest

from tests.ray.head import ray_head

NPUS = 2
PROBE = "import os; print('VISIBLE=' + repr(os.environ.get('ASCEND_RT_VISIBLE_DEVICES')))"
PINNED_RAY = "2.60.0"


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
    with ray_head(tmp_path, resources={"NPU": NPUS}) as head:
        url = head.url
        # what the operator must render for sft on Ascend: entrypointResources '{"NPU": devicesPerNode}'
        assert driver_sees(url, entrypoint_resources={"NPU": NPUS}) == repr(",".join(str(i) for i in range(NPUS)))
        # without it, Ray >= 2.53 leaves the pod's variable alone (unset here: every device visible);
        # Ray < 2.53 set it to '' (no device), the blocker this pins against
        assert driver_sees(url) == "None"
