"""The stage entrypoint: context from the environment, resolution, files, execution, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.recipe.render.command import StageCommand
from retool.recipe.render.common import attempt_dir
from retool.recipe.render.stages import render_stage
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from retool.stage import EXIT_SETUP_FAILED, resolve, run_steps, write_files
from tests.conftest import repo_env
from tests.render.cases import context_of, load_example
from tests.render.test_checkpoints import RL_SHARD, SFT_SHARD, make_tree


def spec_on(tmp_path: Path, example: str = "qwen32b-h200") -> tuple[Path, dict]:
    """The example with its PVC 'mounted' under tmp_path, written as the operator mounts it."""
    doc = load_example(example)
    doc["spec"]["storage"]["pvc"]["mountPath"] = str(tmp_path / "pvc")
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    return spec_file, doc


def stage_env(doc: dict, **extra: str) -> dict[str, str]:
    run = parse_run(doc)
    return repo_env(**{**context_of(run).to_env(), **extra})


def run_stage(*args: str, env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retool.stage", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_steps_run_in_order_with_the_command_environment(capfd: pytest.CaptureFixture[str]) -> None:
    command = StageCommand(
        stage="eval",
        pre=(("python3", "-c", "import os; print('pre', os.environ['RETOOL_TEST'])"),),
        argv=("python3", "-c", "import os; print('main', os.environ['RETOOL_TEST'], os.environ['BASE'])"),
        env={"RETOOL_TEST": "from-command"},
    )
    assert run_steps(command, {"BASE": "from-pod", "PATH": "/usr/bin:/bin"}) == 0
    assert capfd.readouterr().out.splitlines() == ["pre from-command", "main from-command from-pod"]


@pytest.mark.parametrize(
    ("pre_status", "main_status", "expected", "ran_main"),
    [
        pytest.param(0, 3, 3, True, id="main-status-is-the-exit-status"),
        pytest.param(4, 0, 4, False, id="failed-pre-step-stops-the-stage"),
    ],
)
def test_exit_status_is_the_commands(capfd: pytest.CaptureFixture[str], pre_status: int, main_status: int, expected: int, ran_main: bool) -> None:
    command = StageCommand(
        stage="eval",
        pre=(("python3", "-c", f"raise SystemExit({pre_status})"),),
        argv=("python3", "-c", f"print('main ran'); raise SystemExit({main_status})"),
    )
    assert run_steps(command, {}) == expected
    assert ("main ran" in capfd.readouterr().out) is ran_main


def test_a_signal_death_is_reported_as_128_plus_signal() -> None:
    command = StageCommand(stage="rl", argv=("python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert run_steps(command, {}) == 128 + 9


def test_files_and_the_rendered_command_are_written(tmp_path: Path) -> None:
    _, doc = spec_on(tmp_path)
    run = parse_run(doc)
    ctx = context_of(run, attempt=2)
    command = render_stage(run, "rl", ctx)
    record = attempt_dir(run_paths(run), "rl", ctx.attempt)
    write_files(command, record)
    [(tool_path, content)] = command.files.items()
    assert Path(tool_path).read_text() == content and tool_path.startswith(str(tmp_path / "pvc"))
    assert Path(record, "command.sh").read_text().endswith(command.shell() + "\n")
    assert json.loads(Path(record, "command.json").read_text())["argv"] == list(command.argv)


def test_resolve_fills_in_the_latest_rl_step(tmp_path: Path) -> None:
    _, doc = spec_on(tmp_path)
    run = parse_run(doc)
    make_tree(Path(run_paths(run).rl_checkpoints), {30: RL_SHARD, 60: RL_SHARD}, "60")
    command = resolve(render_stage(run, "eval", context_of(run)))
    [merge] = command.pre
    assert merge[merge.index("--local_dir") + 1] == f"{run_paths(run).rl_checkpoints}/global_step_60/actor"


def test_merge_stage_end_to_end_runs_verls_merger_on_the_latest_checkpoint(tmp_path: Path) -> None:
    """The real entrypoint and the real merger: the shards are fake, so the merger fails, and the
    stage must report that failure as its exit status after recording the resolved command."""
    spec_file, doc = spec_on(tmp_path)
    run = parse_run(doc)
    make_tree(Path(run_paths(run).sft_checkpoints), {5: SFT_SHARD, 10: SFT_SHARD}, "10")
    result = run_stage("merge", "--spec", str(spec_file), env=stage_env(doc))
    assert result.returncode not in (0, EXIT_SETUP_FAILED), result.stderr[-2000:]
    recorded = json.loads(Path(attempt_dir(run_paths(run), "merge", 1), "command.json").read_text())
    local_dir = recorded["argv"][recorded["argv"].index("--local_dir") + 1]
    assert local_dir == f"{run_paths(run).sft_checkpoints}/global_step_10"
    assert "verl.model_merger exited with status" in result.stderr
    # verl itself ran and read the resolved directory (and found no real shards there)
    assert "global_step_10" in result.stderr and "No module named" not in result.stderr


@pytest.mark.parametrize(
    ("stage", "env_drop", "prepare_tree", "message"),
    [
        pytest.param("merge", (), False, "has not saved any", id="merge-before-sft-saved-anything"),
        pytest.param("eval", (), False, "has not saved any", id="eval-before-rl-saved-anything"),
        pytest.param("rl", ("RETOOL_SANDBOX_URL",), False, "RETOOL_SANDBOX_URL", id="operator-env-missing"),
    ],
)
def test_setup_failures_exit_2_with_the_reason_and_run_nothing(tmp_path: Path, stage: str, env_drop: tuple[str, ...], prepare_tree: bool, message: str) -> None:
    spec_file, doc = spec_on(tmp_path)
    env = stage_env(doc)
    for key in env_drop:
        env.pop(key)
    result = run_stage(stage, "--spec", str(spec_file), env=env)
    assert result.returncode == EXIT_SETUP_FAILED
    assert message in result.stderr
    assert not (tmp_path / "pvc").exists(), "nothing is written when the stage cannot start"


def test_invalid_spec_exits_2_naming_the_field(tmp_path: Path) -> None:
    spec_file, doc = spec_on(tmp_path)
    doc["spec"]["rl"]["miniBatchSize"] = 100
    spec_file.write_text(yaml.safe_dump(doc))
    result = run_stage("rl", "--spec", str(spec_file), env=stage_env(load_example("qwen32b-h200")))
    assert result.returncode == EXIT_SETUP_FAILED
    assert "spec.rl.batchSize: 512 must be divisible by rl.miniBatchSize (100)" in result.stderr


def test_dry_run_prints_the_resolved_command_and_writes_nothing(tmp_path: Path) -> None:
    spec_file, doc = spec_on(tmp_path)
    run = parse_run(doc)
    make_tree(Path(run_paths(run).rl_checkpoints), {90: RL_SHARD}, "90")
    result = run_stage("eval", "--spec", str(spec_file), "--dry-run", env=stage_env(doc, RETOOL_ATTEMPT="2"))
    assert result.returncode == 0, result.stderr
    assert "global_step_90/actor" in result.stdout
    assert "trainer.experiment_name=qwen32b-h200-eval-2" in result.stdout
    assert not Path(run_paths(run).stage_files).exists()


def test_context_round_trips_through_the_environment() -> None:
    ctx = StageContext(run_name="r", namespace="n", sandbox_url="http://r-sandbox.n.svc:8080", attempt=3, mlflow_tracking_uri="http://m:5000")
    assert StageContext.from_env(ctx.to_env()) == ctx
