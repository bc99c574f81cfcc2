"""verl 0.9.1 line: a step whose sandbox went down mid-step trains only on the rest, and MLflow shows the masked share.

The 0.6 line's check (tests/turns/test_sandbox_failure_mask.py) on verl 0.9.1's own code: real rollouts
through our 0.9 agent loop against our real sandbox, stopped after the first five
(:mod:`tests.turns.masking_check`); the batch goes through the trainer's own probe
(:class:`retool.recipe.verl_plugins.v0_9.trainer.ExtractRewardProbe`, which ``fit`` calls as
``extract_reward``) with a real watcher writing to MLflow (sqlite), then verl 0.9.1's ``compute_advantage``
and ``compute_policy_loss_vanilla`` with the rendered rl stage's settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.config import omega_conf_to_dataclass

from retool.embedded.servers import sandbox_server
from retool.recipe.render.command import hydra_overrides
from retool.recipe.sandbox_failures import SandboxOutageError
from retool.recipe.verl_plugins.v0_9.trainer import ExtractRewardProbe, RetoolPPOTrainer
from retool.recipe.verl_plugins.watch import BatchWatcher
from tests.render.verl_config import compose_verl
from tests.turns.masking_check import (
    MASKED,
    PLAN,
    assert_masked_share_logged,
    assert_the_sandbox_failed_the_last_two,
    assert_trains_only_on_the_rest,
    mlflow_run,
    scored_batch,
)
from tests.turns.scenarios import PROMPT
from tests.verl09.lines import rendered
from tests.verl09.loop import run_loop

pytestmark = pytest.mark.slow


def rollouts_of_a_step_whose_sandbox_fails(model: str, tokenizer: Any, tmp_path: Path) -> list[Any]:
    outputs = []
    with sandbox_server(tmp_path, workers=1) as sandbox:
        for i, (_, turns, up) in enumerate(PLAN):
            if not up and sandbox.running:
                sandbox.stop()
            work = tmp_path / f"rollout-{i}"
            work.mkdir()
            output, _, _, _ = run_loop(model, sandbox.base_url, work, [t + tokenizer.eos_token for t in turns], prompt=PROMPT, retry_deadline_s=1.0)
            outputs.append(output)
    return outputs


def test_a_step_trains_only_on_trajectories_the_sandbox_did_not_fail_on_verl_091(qwen_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model)
    outputs = rollouts_of_a_step_whose_sandbox_fails(qwen_model, tokenizer, tmp_path)
    groups = assert_the_sandbox_failed_the_last_two(outputs)
    with mlflow_run(tmp_path, monkeypatch) as (client, run_id):
        command = rendered("smoke-qwen0.5b", "rl")
        config = compose_verl("ppo_trainer", hydra_overrides({**command.overrides, "trainer.logger": ["mlflow"], "+retool.reward_watch.share": 0.0}))
        trainer = RetoolPPOTrainer.__new__(RetoolPPOTrainer)  # the probe reads these attributes, set as __init__ sets them
        trainer.config, trainer.global_steps, trainer.validating = config, 4, False
        trainer.watcher = BatchWatcher.from_config(config, tokenizer)
        trainer.max_sandbox_failure_share = config.retool.sandbox_failures.max_share
        assert trainer.max_sandbox_failure_share == 0.25, "the rendered default"

        data, rewards = scored_batch(outputs, groups, tokenizer, DataProto)
        before = data.batch["response_mask"].clone()
        with pytest.raises(SandboxOutageError, match=r"step 4: 2 of 7 trajectories .*unavailable 2 calls.* 1 more .*42\.9% .*spec\.rl\.maxSandboxFailureShare 25\.0%"):
            ExtractRewardProbe(trainer)(data)
        assert data.batch["response_mask"].equal(before) and list(data.non_tensor_batch["uid"]) == groups

        trainer.max_sandbox_failure_share, trainer.global_steps = 0.5, 5
        scores, _ = ExtractRewardProbe(trainer)(data)
        assert scores.equal(data.batch["rm_scores"]), "verl's reward passes through unchanged"
        trainer.watcher.close()
        assert_masked_share_logged(client, run_id, steps=(4, 5))
    assert [bool(m) for m in (data.batch["response_mask"].sum(-1) == 0)] == MASKED

    algorithm = config.algorithm
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert_trains_only_on_the_rest(
        data,
        rewards,
        groups,
        lambda batch: compute_advantage(batch, adv_estimator=algorithm.adv_estimator, num_repeat=1, norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm),
        lambda old, new, adv, mask: compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode=actor.loss_agg_mode, config=actor)[0],
    )
