"""The rl and eval stages' program: verl's main_ppo Hydra program with our trainer swapped in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.recipe.render.command import hydra_overrides
from retool.recipe.render.stages import render_stage
from retool.recipe.verl_plugins import AGENT_LOOP_CONFIG, PPO_MAIN_MODULE
from retool.runtime.context import StageContext
from retool.spec.validate import parse_run
from tests.conftest import EXAMPLES, repo_env


@pytest.mark.parametrize("stage", ["rl", "eval"])
def test_the_rendered_command_composes_as_a_hydra_program_on_verls_config(stage: str) -> None:
    run = parse_run(yaml.safe_load(next(p for p in EXAMPLES if p.stem == "retoolrun-qwen32b-h200").read_text()))
    command = render_stage(run, stage, StageContext(run_name=run.metadata.name, namespace="default", sandbox_url="http://sandbox:8080"))
    assert command.argv[:3] == ("python3", "-m", PPO_MAIN_MODULE)
    # --cfg job: Hydra prints the composed config and exits without running (no Ray, no GPU).
    proc = subprocess.run(
        [sys.executable, "-m", PPO_MAIN_MODULE, *hydra_overrides(command.overrides), "--cfg", "job"], capture_output=True, text=True, timeout=300, env=repo_env()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = yaml.safe_load(proc.stdout)
    assert config["retool"]["reward_watch"] == {**run.spec.rl.reward_watch.model_dump(by_alias=False), "horizon": run.spec.rl.steps}
    assert config["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_config_path"] == AGENT_LOOP_CONFIG


def test_the_task_runner_builds_our_trainer_in_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer import main_ppo as verl_main_ppo

    from retool.recipe.verl_plugins.main_ppo import RetoolTaskRunner
    from retool.recipe.verl_plugins.trainer import RetoolPPOTrainer

    built = []
    monkeypatch.setattr(verl_main_ppo, "RayPPOTrainer", verl_main_ppo.RayPPOTrainer)  # restored after the test
    monkeypatch.setattr(verl_main_ppo.TaskRunner, "run", lambda self, config: built.append(verl_main_ppo.RayPPOTrainer))
    RetoolTaskRunner().run({})
    assert built == [RetoolPPOTrainer]


def test_the_agent_loop_config_registers_ours_under_verls_tool_agent_name() -> None:
    entries = yaml.safe_load(Path(AGENT_LOOP_CONFIG).read_text())
    assert entries == [{"name": "tool_agent", "_target_": "retool.recipe.verl_plugins.agent_loop.RetoolToolAgentLoop"}]
