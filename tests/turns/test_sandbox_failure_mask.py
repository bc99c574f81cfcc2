"""verl 0.6.1 line: a step whose sandbox went down mid-step trains only on the rest, and MLflow shows the masked share.

Real rollouts through our agent loop (verl 0.6.1's ``ToolAgentLoop``) against our real sandbox, stopped
after the first five (see :mod:`tests.turns.masking_check` for the step's plan); the scored batch goes
through the trainer's own probe (:class:`retool.recipe.verl_plugins.trainer.ScoringProbe`, which verl's
``compute_reward`` calls) with a real watcher writing to MLflow (sqlite), then verl's ``compute_advantage``
and ``compute_policy_loss_vanilla`` with the rendered rl stage's settings. The same check runs on
verl 0.9.1 in tests/verl09/test_sandbox_failure_mask.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retool.embedded.servers import sandbox_server
from retool.recipe.render.command import hydra_overrides
from retool.recipe.render.stages import render_stage
from retool.recipe.sandbox_failures import SandboxOutageError
from tests.render.cases import context_of, run_of
from tests.render.verl_config import compose_verl
from tests.turns.harness import ScriptedModel, loop_config, run_agent_loop, write_tool_config
from tests.turns.masking_check import (
    MASKED,
    PLAN,
    assert_masked_share_logged,
    assert_the_sandbox_failed_the_last_two,
    assert_trains_only_on_the_rest,
    mlflow_run,
    scored_batch,
)
from tests.turns.scenarios import PROMPT, Turn

pytestmark = pytest.mark.slow


def rl_config() -> Any:
    run = run_of("smoke-qwen0.5b")
    command = render_stage(run, "rl", context_of(run))
    return compose_verl(command.config_name, hydra_overrides({**command.overrides, "trainer.logger": ["mlflow"], "+retool.reward_watch.share": 0.0}))


def rollouts_of_a_step_whose_sandbox_fails(tokenizer: Any, tmp_path: Path) -> list[Any]:
    outputs = []
    with sandbox_server(tmp_path, workers=1) as sandbox:
        config = loop_config(write_tool_config(tmp_path / "tools.yaml", sandbox.base_url, retry_deadline_s=1.0))
        for _, turns, up in PLAN:
            if not up and sandbox.running:
                sandbox.stop()
            outputs.append(run_agent_loop(tokenizer, config, ScriptedModel(tokenizer, [Turn(t) for t in turns]), PROMPT).output)
    return outputs


def test_a_step_trains_only_on_trajectories_the_sandbox_did_not_fail(qwen_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import hf_tokenizer

    from retool.recipe.verl_plugins.trainer import RetoolPPOTrainer, ScoringProbe
    from retool.recipe.verl_plugins.watch import BatchWatcher

    tokenizer = hf_tokenizer(qwen_tokenizer)
    outputs = rollouts_of_a_step_whose_sandbox_fails(tokenizer, tmp_path)
    groups = assert_the_sandbox_failed_the_last_two(outputs)
    with mlflow_run(tmp_path, monkeypatch) as (client, run_id):
        config = rl_config()
        trainer = RetoolPPOTrainer.__new__(RetoolPPOTrainer)  # the probe reads these attributes, set as __init__ sets them
        trainer.config, trainer.global_steps = config, 4
        trainer.watcher = BatchWatcher.from_config(config, tokenizer)
        trainer.max_sandbox_failure_share = config.retool.sandbox_failures.max_share
        assert trainer.max_sandbox_failure_share == 0.25, "the rendered default"

        # Three of seven (43 %) would be left out: above the default bound the step fails, naming it, and changes nothing.
        data, rewards = scored_batch(outputs, groups, tokenizer, DataProto)
        before = data.batch["response_mask"].clone()
        probe = ScoringProbe(lambda batch, return_dict=False: {"reward_tensor": batch.batch["rm_scores"], "reward_extra_info": {}}, trainer, validate=False)
        with pytest.raises(SandboxOutageError, match=r"step 4: 2 of 7 trajectories .*unavailable 2 calls.* 1 more .*42\.9% .*spec\.rl\.maxSandboxFailureShare 25\.0%"):
            probe(data, return_dict=True)
        assert data.batch["response_mask"].equal(before) and list(data.non_tensor_batch["uid"]) == groups

        trainer.max_sandbox_failure_share, trainer.global_steps = 0.5, 5
        result = probe(data, return_dict=True)
        assert result["reward_tensor"] is data.batch["rm_scores"], "the reward passes through unchanged"
        trainer.watcher.close()
        assert_masked_share_logged(client, run_id, steps=(4, 5))
    assert [bool(m) for m in (data.batch["response_mask"].sum(-1) == 0)] == MASKED

    algorithm = config.algorithm
    actor = config.actor_rollout_ref.actor
    assert_trains_only_on_the_rest(
        data,
        rewards,
        groups,
        lambda batch: compute_advantage(batch, adv_estimator=algorithm.adv_estimator, num_repeat=1, norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm),
        lambda old, new, adv, mask: compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode=actor.loss_agg_mode, config=actor)[0],
    )
