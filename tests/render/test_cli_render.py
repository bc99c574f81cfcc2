"""``retool render``: what a user sees before applying a RetoolRun."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.cli import main
from tests.conftest import EXAMPLES, REPO, repo_env
from tests.render.cases import load_example


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_enabled_stage_of_every_example_is_shown(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from retool.recipe.render.stages import enabled_stages
    from retool.spec.validate import parse_run

    assert main(["render", str(example)]) == 0
    out = capsys.readouterr().out
    enabled = enabled_stages(parse_run(yaml.safe_load(example.read_text())))
    for stage in ("prepare", "sft", "merge", "rl", "eval"):
        assert (f"# ===== {stage}: " in out) == (stage in enabled), stage


def test_rl_command_shows_sandbox_mlflow_and_runtime_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--stage", "rl", str(REPO / "examples" / "retoolrun-qwen32b-h200.yaml")]) == 0
    out = capsys.readouterr().out
    assert "# ===== rl: RayJob qwen32b-h200-rl-1" in out
    assert "sandbox_url: http://qwen32b-h200-sandbox.retool.svc:8080" in out
    assert "trainer.project_name=retool/qwen32b-h200" in out
    assert "set at run time: MLflow tracking URI: <operator default>" in out
    assert "# ===== sft" not in out
    program = next(line for line in out.splitlines() if line.startswith("python3 -m verl.trainer.main_ppo"))
    assert shlex.split(program.rstrip("\\")) == ["python3", "-m", "verl.trainer.main_ppo"]


def test_ascend_example_shows_the_ascend_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--stage", "rl", str(REPO / "examples" / "retoolrun-qwen7b-ascend.yaml")]) == 0
    out = capsys.readouterr().out
    assert "export VLLM_ASCEND_ENABLE_NZ=0" in out and "trainer.device=npu" in out
    assert "engine profile: medium-ascend" in out


def test_spec_mlflow_server_is_shown_as_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = load_example("minimal")
    doc["spec"]["tracking"] = {"mlflow": {"trackingUri": "http://mlflow.example:5000"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "--stage", "sft", str(path)]) == 0
    out = capsys.readouterr().out
    assert "export MLFLOW_TRACKING_URI=http://mlflow.example:5000" in out
    assert "<operator default>" not in out


@pytest.mark.parametrize(
    ("change", "stage", "message"),
    [
        pytest.param(("rl", "miniBatchSize", 100), "rl", "spec.rl.batchSize", id="invalid-spec-names-the-field"),
        pytest.param(("sft", "enabled", False), "sft", "stage sft is disabled", id="disabled-stage"),
    ],
)
def test_problems_exit_1_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str, object], stage: str, message: str) -> None:
    doc = load_example("minimal")
    section, key, value = change
    doc["spec"].setdefault(section, {})[key] = value
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "--stage", stage, str(path)]) == 1
    assert message in capsys.readouterr().err


def test_disabled_stages_are_left_out_of_the_full_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = load_example("minimal")
    doc["spec"]["sft"] = {"enabled": False}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", str(path)]) == 0
    out = capsys.readouterr().out
    assert "stages prepare, preflight, rl, eval" in out and "# ===== merge" not in out


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(tmp_path / "absent.yaml")]) == 1
    assert "absent.yaml" in capsys.readouterr().err


def test_command_line_reads_stdin() -> None:
    text = (REPO / "examples" / "retoolrun-minimal.yaml").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "retool.cli", "render", "--stage", "merge", "-"], input=text, env=repo_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "python3 -m retool.runtime.cpu_only -m verl.model_merger merge --backend fsdp" in result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_manifests_view_prints_the_operators_objects_and_they_validate(example: Path, tmp_path: Path) -> None:
    """`retool render --manifests` (a subprocess, as a pull-request check would run it) against the
    Kubernetes and KubeRay schemas."""
    from tests.operator.test_manifests import kuberay_schemas, problems_of

    doc = yaml.safe_load(example.read_text())
    gang = ((doc["spec"].get("scheduling") or {}).get("gang") or {}).get("enabled")
    env = repo_env(RETOOL_OPERATOR_BATCH_SCHEDULER="volcano") if gang else repo_env()  # the operator's setting, as on the cluster
    result = subprocess.run([sys.executable, "-m", "retool.cli", "render", "--manifests", str(example)], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    kinds = [o["kind"] for o in objects]
    sandbox = {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"} if doc["spec"].get("recipe", "tool-integrated") == "tool-integrated" else set()
    assert kinds[:1] == ["ConfigMap"] and sandbox | {"RayJob", "Job"} <= set(kinds)
    assert ("PersistentVolumeClaim" in kinds) == ("claimName" not in (doc["spec"].get("storage") or {}).get("pvc", {}))
    assert problems_of(objects, kuberay_schemas(), tmp_path) == []


def test_manifests_view_of_one_stage_has_only_that_stage_child(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--manifests", "--stage", "rl", str(REPO / "examples/retoolrun-qwen32b-h200.yaml")]) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    stage_children = [o for o in objects if o["kind"] in ("Job", "RayJob")]
    assert [o["metadata"]["name"] for o in stage_children] == ["qwen32b-h200-rl-1"]


@pytest.mark.parametrize(
    ("example", "line"),
    [
        ("minimal", "# storage: claim minimal-data created by the operator: 2000Gi (from the model size), ReadWriteOnce, the operator's default class, kept when the run is deleted"),  # noqa: E501
        ("qwen32b-kueue", "# storage: claim qwen32b-kueue-data created by the operator: 2000Gi (from the model size), ReadWriteMany, cephfs, kept when the run is deleted"),
        ("smoke-qwen0.5b", "# storage: claim smoke-qwen0p5b-data created by the operator: 51Gi (from the model size), ReadWriteOnce, the operator's default class, deleted with the run"),  # noqa: E501
        ("qwen32b-h200", "# storage: existing claim retool-data, mounted at /data"),
    ],
)
def test_the_commands_view_shows_the_runs_claim(example: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(REPO / "examples" / f"retoolrun-{example}.yaml")]) == 0
    assert line in capsys.readouterr().out.splitlines()
