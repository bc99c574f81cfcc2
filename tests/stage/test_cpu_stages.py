"""prepare and merge never load an accelerator backend (Ascend nodes give them no NPU, so no driver).

torch loads every ``torch.backends`` entry point on ``import torch`` (torch_npu registers one),
and transformers, accelerate and verl import ``torch_npu`` whenever it is installed. The test
installs a stand-in torch_npu into a temporary site directory, exactly as a wheel would (a
package plus a dist-info with the entry point), that fails the way torch_npu fails without the
driver library, and records every attempt to import it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.recipe.render.stages import render_stage
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from tests.conftest import repo_env
from tests.render.cases import context_of, load_example
from tests.render.test_checkpoints import SFT_SHARD, make_tree

FAILING_BACKEND = '''
import os
with open(os.environ["FAKE_NPU_MARKER"], "a") as marker:
    marker.write("torch_npu imported\\n")
raise ImportError("libascend_hal.so: cannot open shared object file: No such file or directory")
'''


@pytest.fixture
def failing_npu_backend(tmp_path: Path) -> tuple[Path, Path]:
    """(site directory holding a torch_npu that cannot load, the file each import attempt is written to)."""
    site = tmp_path / "site"
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text(FAILING_BACKEND)
    dist_info = site / "torch_npu-2.7.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")
    (dist_info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return site, tmp_path / "npu-imports.log"


def with_backend(site: Path, marker: Path, **env: str) -> dict[str, str]:
    environ = repo_env(FAKE_NPU_MARKER=str(marker), **env)
    environ["PYTHONPATH"] = f"{site}:{environ['PYTHONPATH']}"
    environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    environ.update(env)
    return environ


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180, check=False)


def test_the_stand_in_backend_breaks_import_torch_as_torch_npu_does_without_a_driver(failing_npu_backend: tuple[Path, Path]) -> None:
    site, marker = failing_npu_backend
    result = python("import torch", with_backend(site, marker))
    assert result.returncode != 0 and "Failed to load the backend extension: torch_npu" in result.stderr
    assert marker.read_text() == "torch_npu imported\n"


@pytest.mark.slow
def test_prepare_imports_torch_datasets_and_staging_without_loading_the_backend(failing_npu_backend: tuple[Path, Path]) -> None:
    site, marker = failing_npu_backend
    run = parse_run(load_example("qwen7b-ascend"))
    env = render_stage(run, "prepare", context_of(run)).env
    assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    result = python("import datasets, torch, retool.data.run, retool.staging.hub, huggingface_hub; print(torch.__version__)", with_backend(site, marker, **env))
    assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists(), "torch_npu was imported"


@pytest.mark.slow
def test_merge_stage_runs_verls_merger_without_touching_torch_npu(tmp_path: Path, failing_npu_backend: tuple[Path, Path]) -> None:
    """The real stage entrypoint on an Ascend run: verl's merger starts and reads the checkpoint
    (whose shards are stand-ins, so it then fails on them), and torch_npu is never imported."""
    site, marker = failing_npu_backend
    doc = load_example("qwen7b-ascend")
    doc["spec"].setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(tmp_path / "pvc")
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(doc))
    run = parse_run(doc)
    make_tree(Path(run_paths(run).sft_checkpoints), {10: SFT_SHARD}, "10")
    env = with_backend(site, marker, **context_of(run).to_env())
    result = subprocess.run([sys.executable, "-m", "retool.stage", "merge", "--spec", str(spec)], env=env, capture_output=True, text=True, timeout=240, check=False)
    assert "verl.model_merger exited with status" in result.stderr and "global_step_10" in result.stderr, result.stderr[-3000:]
    assert "backend extension" not in result.stderr and "libascend_hal" not in result.stderr
    assert not marker.exists(), "torch_npu was imported"
