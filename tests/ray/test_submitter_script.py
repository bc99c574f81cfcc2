"""KubeRay's submitter script, built from the rendered RayJob, run against a local Ray head in an image-like PATH.

KubeRay (not us) decides what the RayJob's submitter Job runs: ``/bin/bash -ce -- '<script>'``
built by ``BuildJobSubmitCommand`` (KubeRay v1.7.0 ``ray-operator/controllers/ray/common/job.go``,
constants in ``ray-operator/controllers/ray/utils/constant.go``; v1.6.1, the version the project
pins in ``upstream/versions.env``, the same files). ``retool_operator.kuberay_submitter`` is our
port. Here the script runs with a PATH holding only the programs the image contract says the
trainer image provides (``retool.runtime.image_contract``), and the head runs with the head
container's rendered environment: the job must be submitted with the rendered entrypoint, runtime
env and entrypoint resources, its driver (``python3 -m retool.stage sft``) must start, and the
script must follow its log to the end. With the pre-fix image (``python3`` only) the 1.7 script
never gets past its health loop: the test sees it hang, bounded, and no job submitted.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retool.runtime.image_contract import CONTRACTS
from retool_operator import builders
from retool_operator.kuberay_submitter import programs_called, submitter_container_args, submitter_env
from tests.conftest import REPO
from tests.operator.helpers import CONFIG, run_of
from tests.ray.head import ray_head

pytestmark = pytest.mark.slow

DEVICES = 2
HANG_SECONDS = 60
"""How long the pre-fix image may take to show its endless health loop (three rounds of it)."""
HEALTH_WAIT = b"Waiting for Ray Dashboard GCS to become healthy"


def image_path(tmp_path: Path, name: str, programs: list[str]) -> str:
    """A PATH directory with only ``programs``: Python ones run this environment's interpreter, the rest the host's."""
    bin_dir = tmp_path / name
    bin_dir.mkdir()
    venv_bin = Path(sys.executable).parent
    for program in programs:
        target = bin_dir / program
        if program in ("python", "python3"):
            target.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        elif program == "ray":
            target.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{venv_bin / "ray"}" "$@"\n')
        else:
            target.write_text(f'#!/bin/sh\nexec "{shutil.which(program)}" "$@"\n')
        target.chmod(0o755)
    return str(bin_dir)


def rendered(accelerator: str) -> dict:
    run = run_of(hardware={"accelerator": accelerator, "devicesPerNode": DEVICES}, rl={"tensorParallel": 2, "sequenceParallel": 2}, sft={"sequenceParallel": 2})
    return builders.build_stage_rayjob(run, "sft", 1, config=CONFIG, tracking=builders.Tracking())


def head_env(rayjob: dict, path: str) -> dict[str, str]:
    """The head container's rendered variables (plain values), this checkout importable, the image's PATH."""
    container = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return {**values, "PATH": path, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'operator'}", "HOME": os.environ.get("HOME", "/tmp")}


def submitter(rayjob: dict, url: str, job_id: str, path: str, version: tuple[int, int] = (1, 7)) -> subprocess.Popen:
    args = submitter_container_args(rayjob, dashboard_url=url.removeprefix("http://"), job_id=job_id, version=version)
    env = {**submitter_env(dashboard_url=url.removeprefix("http://"), job_id=job_id), "PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def health_loop(proc: subprocess.Popen, *, rounds: int, deadline_s: float) -> tuple[str, bool]:
    """Read the submitter's output (raw, off its pipe) until its health loop has said "Waiting for Ray
    Dashboard GCS to become healthy" ``rounds`` times, it ended, or ``deadline_s`` passed: (what it
    printed, whether it ended)."""
    assert proc.stdout is not None
    fd, printed, deadline = proc.stdout.fileno(), b"", time.monotonic() + deadline_s
    while printed.count(HEALTH_WAIT) < rounds and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            return printed.decode(errors="replace"), True
        printed += chunk
    return printed.decode(errors="replace"), proc.poll() is not None


def stored_job(gcs: str, job_id: str) -> dict:
    """What the job server stored for a submission (entrypoint, runtime env, entrypoint resources)."""
    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray._raylet import GcsClient
    from ray.dashboard.modules.job.common import JobInfoStorageClient

    raw = GcsClient(address=gcs).internal_kv_get(JobInfoStorageClient.JOB_DATA_KEY.format(job_id=job_id).encode(), KV_NAMESPACE_JOB)
    assert raw is not None, f"no job {job_id} was submitted"
    return json.loads(raw)


def test_the_contract_covers_every_program_the_submitter_calls() -> None:
    provided = {p.name for p in CONTRACTS["trainer-cuda"].programs}
    for accelerator in ("nvidia", "ascend"):
        for version in ((1, 6), (1, 7)):
            script = submitter_container_args(rendered(accelerator), dashboard_url="h:8265", job_id="j", version=version)[-1]
            assert set(programs_called(script)) <= provided, script
    assert "python" in programs_called(submitter_container_args(rendered("ascend"), dashboard_url="h:8265", job_id="j")[-1])


def test_kuberay_1_7_submitter_runs_the_rendered_job_in_the_image_and_hangs_in_the_pre_fix_image(tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    contract = [p.name for p in CONTRACTS["trainer-ascend"].programs]
    image = image_path(tmp_path, "image", contract)
    pre_fix = image_path(tmp_path, "pre-fix", [p for p in contract if p != "python"])
    ascend, nvidia = rendered("ascend"), rendered("nvidia")
    assert ascend["spec"]["entrypointResources"] == '{"NPU": 2}' and nvidia["spec"]["entrypointNumGpus"] == DEVICES
    with ray_head(tmp_path, resources={"NPU": DEVICES}, num_gpus=DEVICES, env=head_env(ascend, image)) as head:
        url = head.url
        client = None
        for name, rayjob in (("ascend-sft", ascend), ("nvidia-sft", nvidia)):
            proc = submitter(rayjob, url, name, image)
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-4000:]
            assert "Waiting for Ray Dashboard GCS" in out or "submitted successfully" in out, out[-4000:]
            # the driver ran the rendered entrypoint: retool.stage started and explained why it stopped
            # (the run's spec is mounted at /etc/retool/run.yaml in the pod, absent here)
            assert "cannot start stage sft" in out, out[-4000:]
            client = client or JobSubmissionClient(url)
            stored = stored_job(head.gcs, name)
            assert stored["entrypoint"] == rayjob["spec"]["entrypoint"]
            assert not stored.get("runtime_env")  # the rendered RayJob has no runtimeEnvYAML
            if name == "ascend-sft":
                assert stored["entrypoint_resources"] == {"NPU": DEVICES}
            else:
                assert stored["entrypoint_num_gpus"] == DEVICES
            info = client.get_job_info(name)
            assert info.status.value == "FAILED" and info.driver_exit_code == 2

        # The pre-fix image: `python: command not found` is "not healthy yet", forever.
        proc = submitter(ascend, url, "pre-fix", pre_fix)
        printed, ended = health_loop(proc, rounds=3, deadline_s=HANG_SECONDS)
        os.killpg(proc.pid, 9)
        out = printed + proc.communicate(timeout=30)[0]
        assert not ended and printed.count(HEALTH_WAIT.decode()) >= 3, f"ended: {ended}\n{out}"
        assert "pre-fix" not in {job.submission_id for job in client.list_jobs()}

        # KubeRay 1.6's K8sJobMode script had no health loop: the same image submitted fine then.
        proc = submitter(ascend, url, "pre-fix-kuberay-1-6", pre_fix, version=(1, 6))
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "cannot start stage sft" in out, out[-4000:]
