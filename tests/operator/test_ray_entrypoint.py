"""The one-node SFT driver sees its devices: the RayJob's entrypoint fields against a real local Ray.

One-node SFT runs torchrun inside the Ray job's driver. Ray gives a driver the devices it
requested through the accelerator's visibility variable (ASCEND_RT_VISIBLE_DEVICES for the NPU
resource, CUDA_VISIBLE_DEVICES for GPU); Ray before 2.53 cleared ASCEND_RT_VISIBLE_DEVICES for a
driver that requested none. The test renders the RayJob, submits a job the way KubeRay's
submitter does (``ray job submit --entrypoint-resources`` / ``--entrypoint-num-gpus``: the Job
Submission API), on a local Ray that declares 2 NPUs and 2 GPUs (CPU only: Ray assigns the IDs
without touching a device), and reads the variables the driver got.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from retool_operator import builders
from tests.conftest import free_port, repo_env
from tests.operator.helpers import CONFIG, run_of

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, sys, time
import ray
from ray.job_submission import JobSubmissionClient, JobStatus
port, temp, cases = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
ctx = ray.init(num_cpus=2, num_gpus=2, resources={"NPU": 2}, include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port, _temp_dir=temp)
client = JobSubmissionClient(f"http://{ctx.dashboard_url}")
probe = "python3 -c \"import os; print('SEEN=' + repr((os.environ.get('ASCEND_RT_VISIBLE_DEVICES'), os.environ.get('CUDA_VISIBLE_DEVICES'))))\""
out = {}
for name, kwargs in cases.items():
    job = client.submit_job(entrypoint=probe, **kwargs)
    deadline = time.monotonic() + 60
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED} and time.monotonic() < deadline:
        time.sleep(0.3)
    out[name] = [line for line in client.get_job_logs(job).splitlines() if line.startswith("SEEN=")]
ray.shutdown()
print("RESULT=" + json.dumps(out))
"""


def submit_kwargs(rayjob: dict) -> dict:
    """The RayJob's entrypoint fields as the Job Submission API takes them (what KubeRay passes on)."""
    spec = rayjob["spec"]
    kwargs: dict = {}
    if "entrypointResources" in spec:
        kwargs["entrypoint_resources"] = json.loads(spec["entrypointResources"])
    if "entrypointNumGpus" in spec:
        kwargs["entrypoint_num_gpus"] = spec["entrypointNumGpus"]
    return kwargs


def test_the_sft_driver_gets_its_npus_and_gpus() -> None:
    cases = {}
    for accelerator in ("ascend", "nvidia"):
        for stage in ("sft", "rl"):
            run = run_of(hardware={"accelerator": accelerator, "devicesPerNode": 2}, rl={"tensorParallel": 2, "sequenceParallel": 2}, sft={"sequenceParallel": 2})
            cases[f"{accelerator}-{stage}"] = submit_kwargs(builders.build_stage_rayjob(run, stage, 1, config=CONFIG, tracking=builders.Tracking()))
    assert cases["ascend-sft"] == {"entrypoint_resources": {"NPU": 2}} and cases["nvidia-sft"] == {"entrypoint_num_gpus": 2}
    temp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit in 107 bytes
    # Own process group: Ray's GCS, raylet and dashboard are the script's children, stopped with it.
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(free_port()), temp, json.dumps(cases)],
        env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT=")]
    assert proc.returncode == 0 and lines, stdout[-2000:] + stderr[-3000:]
    seen = {name: out[0].removeprefix("SEEN=") for name, out in json.loads(lines[0].removeprefix("RESULT=")).items()}
    assert seen["ascend-sft"] == "('0,1', None)"  # the NPUs it requested: torchrun's ranks see them
    assert seen["nvidia-sft"] == "(None, '0,1')"
    # rl/eval drivers request nothing (verl's workers hold the devices); Ray >= 2.53 leaves the variables alone.
    assert seen["ascend-rl"] == seen["nvidia-rl"] == "(None, None)"
