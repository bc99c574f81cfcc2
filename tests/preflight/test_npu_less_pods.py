"""Every Ascend pod without an NPU runs without importing torch_npu: prepare, preflight, merge and the
stage entrypoint itself, each started with the command and environment the operator renders.

An Ascend pod that requests no NPU gets no driver from the Ascend runtime, so ``import torch_npu``
fails (``libascend_hal.so``). ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` stops only torch's own autoload;
transformers and accelerate still import torch_npu whenever it is installed. The stand-in torch_npu
(``tests/stage/test_cpu_stages.py``: a package plus a dist-info with torch's backend entry point,
that raises that ImportError and records each attempt) is installed for every command here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from retool.preflight.report import REPORT_JSON
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from retool_operator import builders
from tests.operator.helpers import CONFIG
from tests.preflight.conftest import PreparedRun
from tests.preflight.sources import local_run, write_run
from tests.render.cases import load_example
from tests.stage.test_cpu_stages import failing_npu_backend, with_backend  # noqa: F401 (the fixture)
from tests.staging.conftest import tiny_model_files

pytestmark = pytest.mark.slow


def job_pod(document: dict, stage: str, spec_file: Path, site: Path, marker: Path, *, sandbox_url: str = "", extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The operator's batch Job for ``stage``: its container command (the spec file where the pod mounts it) and plain env."""
    run = parse_run(document)
    job = builders.build_stage_job(run, stage, 1, config=CONFIG, tracking=builders.Tracking())
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = [sys.executable if word == "python3" else str(spec_file) if word == "/etc/retool/run.yaml" else word for word in container["command"]]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["RETOOL_SANDBOX_URL"] = sandbox_url
    assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"  # the operator's, kept: it alone does not keep torch_npu out
    return subprocess.run([*command, *extra], env=with_backend(site, marker, **env), capture_output=True, text=True, timeout=900, check=False)


def test_the_stand_in_breaks_the_preflight_run_directly_even_without_torch_autoload(failing_npu_backend: tuple[Path, Path]) -> None:  # noqa: F811
    """The failure the operator's commands avoid: what the preflight Job ran before."""
    site, marker = failing_npu_backend
    env = with_backend(site, marker, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    result = subprocess.run([sys.executable, "-c", "import retool.preflight.runner"], env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode != 0 and "libascend_hal.so" in result.stderr
    assert marker.exists()


def test_the_prepare_job_prepares_data_and_stages_the_model_without_torch_npu(tmp_path: Path, failing_npu_backend: tuple[Path, Path]) -> None:  # noqa: F811
    site, marker = failing_npu_backend
    model = tmp_path / "model"
    tiny_model_files(model)
    document = local_run(load_example("qwen7b-ascend"), tmp_path / "run")
    document["spec"]["model"]["base"] = str(model)
    spec_file = write_run(document, tmp_path / "run.yaml")
    result = job_pod(document, "prepare", spec_file, site, marker)
    assert result.returncode == 0, result.stderr[-3000:]
    assert Path(run_paths(parse_run(document)).rl_train).is_file()
    assert not marker.exists(), "torch_npu was imported: " + result.stderr[-2000:]


def test_the_preflight_job_passes_on_ascend_without_torch_npu(
    prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, sandbox: str, tmp_path: Path, failing_npu_backend: tuple[Path, Path]  # noqa: F811
) -> None:
    site, marker = failing_npu_backend
    prepared = prepare("qwen7b-ascend")
    document = yaml.safe_load(prepared.spec_file.read_text())
    document["spec"]["model"]["base"] = str(Path(shutil.copytree(qwen_tokenizer, tmp_path / "model")))
    document["spec"]["eval"]["samplesPerProblem"] = 4
    spec_file = write_run(document, tmp_path / "run.yaml")
    result = job_pod(document, "preflight", spec_file, site, marker, sandbox_url=sandbox)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (Path(run_paths(parse_run(document)).stage_files) / "preflight-1" / REPORT_JSON).is_file()
    assert not marker.exists(), "torch_npu was imported: " + result.stderr[-2000:]


@pytest.mark.parametrize("stage", ["prepare", "preflight", "merge"])
def test_the_stage_entrypoint_of_every_npu_less_job_renders_without_torch_npu(stage: str, tmp_path: Path, failing_npu_backend: tuple[Path, Path]) -> None:  # noqa: F811
    """``retool.stage`` itself, as the Job starts it (``--dry-run``: render and resolve, run nothing)."""
    site, marker = failing_npu_backend
    document = load_example("qwen7b-ascend")
    document["spec"].setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(tmp_path / "pvc")
    if stage == "merge":
        from tests.render.test_checkpoints import SFT_SHARD, make_tree

        make_tree(Path(run_paths(parse_run(document)).sft_checkpoints), {10: SFT_SHARD}, "10")
    spec_file = write_run(document, tmp_path / "run.yaml")
    result = job_pod(document, stage, spec_file, site, marker, extra=("--dry-run",))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "-m retool.runtime.cpu_only -m" in result.stdout, "the rendered command runs through the CPU-only launcher too"
    assert not marker.exists(), "torch_npu was imported: " + result.stderr[-2000:]
