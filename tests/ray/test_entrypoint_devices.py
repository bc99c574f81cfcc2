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
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ray.head import RayHead, ray_head

NPUS = 2
PROBE = "import os; print('VISIBLE=' + repr(os.environ.get('ASCEND_RT_VISIBLE_DEVICES')))"
PINNED_RAY = "2.60.0"


def driver_sees(head: RayHead, **submit: object) -> str:
    """Submit the probe as KubeRay's submitter does (its own submission id, asked about before each retry),
    wait for Ray's verdict, and return what the driver printed.

    A dropped connection (requests' ConnectionError is an OSError, not the builtin ConnectionError) is
    retried for up to 180 s: the job API restarts when its health check fails on a busy machine.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    deadline = time.monotonic() + 180
    client = JobSubmissionClient(head.url)
    submission_id = f"probe-{uuid.uuid4().hex[:12]}"

    def ask(call: Callable[[], Any]) -> Any:
        while True:
            try:
                return call()
            except (OSError, RuntimeError) as err:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the job API kept failing: {err}\n{head.report()}") from err
                head.wait_for_jobs_api(timeout_s=max(1.0, deadline - time.monotonic()))

    def known() -> bool:
        return any(job.submission_id == submission_id for job in client.list_jobs())

    while not ask(known):
        with contextlib.suppress(OSError, RuntimeError):  # dropped, or refused; asked again above
            client.submit_job(entrypoint=f'python -c "{PROBE}"', submission_id=submission_id, **submit)
        if time.monotonic() > deadline:
            pytest.fail(f"the probe was never accepted\n{head.report()}")
    while (status := ask(lambda: client.get_job_status(submission_id))) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < deadline, f"job {submission_id} still {status}"
        time.sleep(0.5)
    logs = ask(lambda: client.get_job_logs(submission_id))
    assert status == JobStatus.SUCCEEDED, logs
    return next(line.removeprefix("VISIBLE=") for line in logs.splitlines() if line.startswith("VISIBLE="))


def test_the_pinned_ray_is_the_one_tested() -> None:
    assert importlib.metadata.version("ray") == PINNED_RAY


@pytest.mark.slow
def test_a_driver_with_entrypoint_npus_sees_exactly_those_npus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with ray_head(tmp_path, resources={"NPU": NPUS}) as head:
        # what the operator must render for sft on Ascend: entrypointResources '{"NPU": devicesPerNode}'
        assert driver_sees(head, entrypoint_resources={"NPU": NPUS}) == repr(",".join(str(i) for i in range(NPUS)))
        # without it, Ray >= 2.53 leaves the pod's variable alone (unset here: every device visible);
        # Ray < 2.53 set it to '' (no device), the blocker this pins against
        assert driver_sees(head) == "None"
