"""Every rendered stage of every example and variant, on the 0.9 line, against verl 0.9.1's own config.

As tests/render/test_verl_compose.py does for 0.6.1: Hydra composition in struct mode (an unknown
key fails), every override read back as exactly the rendered value, verl's start-up checks
(``validate_config``) on the PPO stages - and the reward guard: the function verl 0.9.1's own
``load_reward_manager`` builds from the composed config is ours, and is NOT when the reward keys are
rendered the 0.6 way (verl 0.9.1 composes those keys and silently ignores them).
"""

from __future__ import annotations

import functools

import pytest
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.recipe.render.command import hydra_overrides
from retool.recipe.verl_plugins import REWARD_FILE, v0_9
from tests.render.verl_config import compose_verl
from tests.verl09.lines import CASES, PPO_CASES, rendered

IDS = [f"{variant}-{stage}" for variant, stage in CASES]
PPO_IDS = [f"{variant}-{stage}" for variant, stage in PPO_CASES]


@functools.cache
def composed(variant: str, stage: str, line: str = "0.9.1") -> DictConfig:
    command = rendered(variant, stage, line)
    assert command.config_name is not None
    return compose_verl(command.config_name, hydra_overrides(command.overrides))


def _read_back(cfg: DictConfig, key: str):
    value = OmegaConf.select(cfg, key.lstrip("+"), throw_on_missing=True)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


@pytest.mark.parametrize(("variant", "stage"), CASES, ids=IDS)
def test_rendered_overrides_compose_on_verl_0_9_1_and_read_back_exactly(variant: str, stage: str) -> None:
    command, cfg = rendered(variant, stage), composed(variant, stage)
    assert command.config_name == (v0_9.SFT_CONFIG_NAME if stage == "sft" else "ppo_trainer")
    assert command.argv[-len(command.overrides) :] == hydra_overrides(command.overrides)
    for key, expected in command.overrides.items():
        got = _read_back(cfg, key)
        assert got == (list(expected) if isinstance(expected, tuple) else expected), key


@pytest.mark.parametrize(("variant", "stage"), PPO_CASES, ids=PPO_IDS)
def test_verl_0_9_1_start_up_checks_accept_the_ppo_stages(variant: str, stage: str, qwen_model: str) -> None:
    """``validate_config`` as ``main_ppo`` runs it; the model paths (on the run's PVC) point at a tiny Qwen3 config, which 0.9.1 reads for a critic."""
    command = rendered(variant, stage)
    paths = {key: qwen_model for key in ("actor_rollout_ref.model.path", "critic.model.path") if key in command.overrides}
    cfg = compose_verl("ppo_trainer", hydra_overrides({**command.overrides, **paths}))
    OmegaConf.resolve(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.use_v1 is False, "the 0.9 line runs verl's legacy trainer (docs/verl-lines.md)"
    assert cfg.reward.custom_reward_function.path == REWARD_FILE


@pytest.mark.parametrize(("variant", "stage"), PPO_CASES, ids=PPO_IDS)
def test_the_reward_guard_passes_on_the_0_9_render(variant: str, stage: str) -> None:
    command = rendered(variant, stage)
    result = check_reward_guard(composed(variant, stage), stage, expected_reward_kwargs(command.overrides))
    assert result.status == "passed", result.summary
    assert result.details["called"] == "retool.recipe.reward.score.compute_score"


def as_0_6_reward_keys(overrides: dict) -> dict:
    """The 0.9 render with only its reward keys written as the 0.6 line writes them (top-level ``custom_reward_function``)."""
    return {key.replace("reward.custom_reward_function.", "custom_reward_function."): value for key, value in overrides.items()}


@pytest.mark.parametrize(("variant", "stage"), PPO_CASES, ids=PPO_IDS)
def test_the_reward_guard_fails_when_the_reward_keys_are_rendered_the_0_6_way(variant: str, stage: str) -> None:
    """Such a command composes on verl 0.9.1 (its legacy_reward_impl keeps the keys) and verl would score with its default."""
    command = rendered(variant, stage)
    overrides = as_0_6_reward_keys(dict(command.overrides))
    assert "custom_reward_function.path" in overrides
    cfg = compose_verl("ppo_trainer", hydra_overrides(overrides))
    result = check_reward_guard(cfg, stage, expected_reward_kwargs(overrides))
    assert result.status == "failed"
    assert result.details["called"] == "verl.utils.reward_score.default_compute_score"
    assert "not ours" in result.summary


def test_the_reward_guard_fails_when_verl_would_drop_the_reward_kwargs() -> None:
    """tool_turn_shaping rendered under the 0.6 prefix composes on 0.9.1 and never reaches the reward."""
    command = rendered("qwen32b-tool-turn-shaping", "rl")
    overrides = {(k.replace("+reward.custom_reward_function.", "+custom_reward_function.")): v for k, v in command.overrides.items()}
    assert "+custom_reward_function.reward_kwargs.tool_turn_shaping" in overrides
    cfg = compose_verl("ppo_trainer", hydra_overrides(overrides))
    result = check_reward_guard(cfg, "rl", {"tool_turn_shaping": True})
    assert result.status == "failed"
    assert "reward_kwargs {}" in result.summary
