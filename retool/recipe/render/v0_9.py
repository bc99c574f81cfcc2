"""The 0.9 trainer line's rendering: a stage command of the 0.6 renderers, moved onto verl 0.9.1.

The renderers (``sft``, ``ppo``) compute one override set from the spec - the recipe's numbers are
the same on both lines; this adapter changes only what verl 0.9.1 names or runs differently
(read from its source and Hydra configs, PyPI ``verl==0.9.1``):

- sft: ``verl.trainer.fsdp_sft_trainer`` is gone; ``verl.trainer.sft_trainer`` runs on the
  ``sft_trainer_engine`` config, where the model, engine and data keys moved (:data:`SFT_KEYS`).
  Multi-turn is the only mode (``data.multiturn.enable`` is gone); micro-batches stay fixed-size
  (``data.use_dynamic_bsz=false``: 0.9.1's default packs by a token budget of 8192, shorter than
  a ReTool trajectory). ``data.ignore_input_ids_mismatch=true``: like 0.6.1, 0.9.1's
  ``MultiTurnSFTDataset`` trains on each message rendered alone, concatenated; unlike 0.6.1 its
  ``sanity_check`` raises when that differs from the whole conversation's rendering
  (``verl/utils/dataset/multiturn_sft_dataset.py``), which Qwen3's template does for every ReTool
  trajectory (the ``<think></think>`` it adds to the last assistant turn only). With the key, 0.9.1
  trains what 0.6.1 trains; the preflight's ``sft-data`` check reports the difference as a warning
  on both lines (found by the 0.9 line's preflight, issue 32).
- rl/eval: the reward keys live under ``reward.`` (verl 0.9.1 no longer migrates the top-level
  ``custom_reward_function.*`` in ``main_ppo``: rendered the 0.6 way, verl would silently score
  with its default scorer; the reward guard, ``retool.preflight.reward_guard``, catches exactly
  that); the critic's FSDP offload keys moved to ``critic.fsdp``; ``trainer.use_v1=false`` (the legacy trainer: why, docs/verl-lines.md); our ``main_ppo``
  and agent loop of :mod:`retool.recipe.verl_plugins.v0_9`.

Pure like every renderer: no verl import.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from retool.recipe.render.command import RenderError, StageCommand, hydra_overrides
from retool.recipe.render.common import PPO_MODULE, SFT_MODULE
from retool.recipe.verl_plugins import AGENT_LOOP_CONFIG, v0_9

LINE = "0.9.1"

SFT_KEYS: dict[str, str | None] = {
    "model.partial_pretrain": "model.path",
    "model.strategy": "engine.strategy",
    "model.fsdp_config.cpu_offload": "engine.optimizer_offload",
    "model.fsdp_config.offload_params": "engine.param_offload",
    "ulysses_sequence_parallel_size": "engine.ulysses_sequence_parallel_size",
    "use_remove_padding": "model.use_remove_padding",
    "data.multiturn.messages_key": "data.messages_key",
    "data.multiturn.tools_key": "data.tools_key",
    "data.multiturn.enable": None,
}
"""0.6.1 ``fsdp_sft_trainer`` key -> verl 0.9.1 ``sft_trainer_engine`` key (None: gone, multi-turn is the only mode)."""

SFT_ADDED: dict[str, Any] = {
    "data.use_dynamic_bsz": False,
    # Each message tokenized in its conversation, as 0.6.1 did (verl_plugins/v0_9/sft_dataset.py) ...
    "data.custom_cls.path": v0_9.SFT_DATASET_CLASS_PATH,
    "data.custom_cls.name": v0_9.SFT_DATASET_CLASS_NAME,
    # ... and, as 0.6.1 did, that concatenation trained where the whole conversation renders otherwise
    # (Qwen3: a turn with empty reasoning gets <think></think> only as the last turn); docs/verl-lines.md.
    "data.ignore_input_ids_mismatch": True,
}

PPO_KEYS: dict[str, str | None] = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    # The critic's FSDP settings are an engine config of its own (critic/dp_critic.yaml: ../engine@fsdp).
    "critic.model.fsdp_config.param_offload": "critic.fsdp.param_offload",
    "critic.model.fsdp_config.optimizer_offload": "critic.fsdp.optimizer_offload",
}
"""0.6.1 ``ppo_trainer`` key -> verl 0.9.1 ``ppo_trainer`` key."""
REWARD_KWARGS_06 = "+custom_reward_function.reward_kwargs."
REWARD_KWARGS_09 = "+reward.custom_reward_function.reward_kwargs."
"""verl 0.9.1's ``get_custom_reward_fn`` reads ``reward.custom_reward_function.reward_kwargs`` (not in its schema: ``+``)."""
AGENT_LOOP_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
PPO_ADDED: dict[str, Any] = {"trainer.use_v1": False}


def _rekey(overrides: dict[str, Any], keys: dict[str, str | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in keys:
            if keys[key] is not None:
                out[keys[key]] = value
        else:
            out[key] = value
    return out


def sft_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    return {**_rekey(overrides, SFT_KEYS), **SFT_ADDED}


def ppo_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    out = _rekey(overrides, PPO_KEYS)
    out = {(REWARD_KWARGS_09 + k.removeprefix(REWARD_KWARGS_06) if k.startswith(REWARD_KWARGS_06) else k): v for k, v in out.items()}
    if out.get(AGENT_LOOP_KEY) == AGENT_LOOP_CONFIG:
        out[AGENT_LOOP_KEY] = v0_9.AGENT_LOOP_CONFIG
    return {**out, **PPO_ADDED}


def _with_program(command: StageCommand, old_module: str, new_module: str, overrides: dict[str, Any], config_name: str) -> StageCommand:
    """``command`` running ``new_module`` with ``overrides`` (the Hydra overrides end its argv)."""
    old = hydra_overrides(command.overrides)
    head = command.argv[: len(command.argv) - len(old)]
    if command.argv[len(head) :] != old or old_module not in head:
        raise RenderError(f"the {command.stage} command does not end with its overrides after {old_module}: cannot move it to verl {v0_9.VERL_VERSION}")
    head = tuple(new_module if arg == old_module else arg for arg in head)
    return replace(command, argv=(*head, *hydra_overrides(overrides)), overrides=overrides, config_name=config_name)


def adapt(command: StageCommand) -> StageCommand:
    """The 0.6-rendered ``command`` as the 0.9 line runs it (prepare, merge and preflight are the same)."""
    if command.stage == "sft":
        return _with_program(command, SFT_MODULE, v0_9.SFT_MODULE, sft_overrides(dict(command.overrides)), v0_9.SFT_CONFIG_NAME)
    if command.stage in ("rl", "eval"):
        return _with_program(command, PPO_MODULE, v0_9.PPO_MAIN_MODULE, ppo_overrides(dict(command.overrides)), command.config_name or "ppo_trainer")
    return command
